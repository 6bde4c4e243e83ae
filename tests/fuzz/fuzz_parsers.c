/* libFuzzer target for the provider stream parsers (a provider's stdout → events): claude,
 * codex, vibe, and the command provider in its three output modes (text, sse, ndjson).
 *
 * Input layout: byte 0 picks the parser, byte 1 the number (1-8) of piece-length bytes
 * that follow; the rest is the provider's output. The output is fed once whole and once
 * in pieces whose lengths cycle through those bytes (0 = an empty read): both feeds must
 * produce the same events (deltas compared as one concatenated text), every delta must be
 * non-empty, and for command text mode the deltas must add up to the input. Anything else
 * aborts, so the fuzzer reports it.
 *
 *   fuzz_parsers -max_total_time=20 corpus-parsers/ */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "providers/internal.h"
#include "providers/providers.h"
#include "sandbox/sandbox.h"
#include "common/banned.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const kinds[] = { "claude",	"codex",       "vibe",
				     "command", "command-sse", "command-ndjson" };
#define NKINDS (sizeof(kinds) / sizeof(kinds[0]))

struct rec {
	struct buf text;
	struct buf events;
	int stops;
};

static int rec_emit(void *ctx, const struct prov_event *ev)
{
	struct rec *r = ctx;

	switch (ev->kind) {
	case PROV_EV_DELTA:
		if (!ev->len || !ev->text)
			abort();
		buf_add(&r->text, ev->text, ev->len);
		buf_addf(&r->events, "D");
		break;
	case PROV_EV_USAGE:
		if (!ev->usage)
			abort();
		buf_addf(&r->events, "<U %lld %lld %lld %lld>", (long long)ev->usage->prompt_tokens,
			 (long long)ev->usage->completion_tokens,
			 (long long)ev->usage->total_tokens, (long long)ev->usage->cached_tokens);
		break;
	case PROV_EV_FINISH:
		if (!ev->finish_reason)
			abort();
		buf_addf(&r->events, "<F %s>", ev->finish_reason);
		break;
	case PROV_EV_ERROR:
		if (!ev->failure)
			abort();
		buf_addf(&r->events, "<E %d %d %s>", (int)ev->failure->err,
			 ev->failure->upstream_status,
			 ev->failure->message ? ev->failure->message : "");
		break;
	}
	return 0;
}

/* Deltas may be cut differently by different splits: collapse runs of "D". */
static void collapse(struct buf *events)
{
	size_t w = 0;

	for (size_t i = 0; i < events->len; i++)
		if (events->data[i] != 'D' || !w || events->data[w - 1] != 'D')
			events->data[w++] = events->data[i];
	events->len = w;
	events->data[w] = '\0';
}

/* The command modes are the provider's configuration, chosen through its plan (as
 * prov_run does); the other parsers come from the public constructor. */
struct fparser {
	struct prov_parser *ps; /* public parsers */
	void *st;		/* command sse/ndjson */
	struct prov_plan plan;
	struct prov_provider pv;
};

static void fparser_new(struct fparser *fp, size_t kind)
{
	memset(fp, 0, sizeof(*fp));
	if (kind < 4) {
		fp->ps = prov_parser_new(kinds[kind]);
		if (!fp->ps)
			abort();
		return;
	}
	{
		json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", "x");
		struct prov_request req = { .messages = msgs, .model_name = "m" };
		struct prov_outcome out;

		memset(&out, 0, sizeof(out));
		fp->pv.name = "fuzz";
		fp->pv.type = "command";
		fp->pv.ops = &prov_command_ops;
		fp->pv.conf = json_pack("{s:[s],s:s}", "argv", "/usr/bin/cat", "output",
					kind == 4 ? "sse" : "ndjson");
		buf_init(&fp->plan.stdin_data);
		fp->plan.policy = sbx_policy_new();
		if (!msgs || !fp->pv.conf || !fp->plan.policy ||
		    prov_command_ops.plan(&fp->pv, &req, &fp->plan, &out))
			abort();
		json_decref(msgs);
		fp->st = prov_command_ops.parser_new(&fp->pv);
		if (!fp->st)
			abort();
	}
}

static int fparser_feed(struct fparser *fp, const char *d, size_t n, const struct prov_sink *s)
{
	return fp->ps ? prov_parser_feed(fp->ps, d, n, s)
		      : prov_command_ops.parser_feed(fp->st, d, n, s);
}

static int fparser_finish(struct fparser *fp, const struct prov_sink *s)
{
	return fp->ps ? prov_parser_finish(fp->ps, s) : prov_command_ops.parser_finish(fp->st, s);
}

static void fparser_free(struct fparser *fp)
{
	if (fp->ps) {
		prov_parser_free(fp->ps);
		return;
	}
	prov_command_ops.parser_free(fp->st);
	prov_plan_release(&fp->plan);
	json_decref(fp->pv.conf);
}

/* Feed out[0..len) in pieces (lens == NULL: whole). */
static void run(size_t kind, const char *out, size_t len, const uint8_t *lens, size_t nlens,
		struct rec *r)
{
	struct prov_sink sink = { .emit = rec_emit, .ctx = r };
	struct fparser fp;
	size_t off = 0, i = 0;
	int ret;

	buf_init(&r->text);
	buf_init(&r->events);
	r->stops = 0;
	fparser_new(&fp, kind);
	while (off < len) {
		size_t n = lens ? lens[i++ % nlens] : len;

		if (n > len - off)
			n = len - off;
		ret = fparser_feed(&fp, out + off, n, &sink);
		if (ret < 0)
			abort(); /* the sink never aborts */
		if (ret > 0)
			r->stops++;
		off += n;
	}
	if (fparser_finish(&fp, &sink) < 0)
		abort();
	fparser_free(&fp);
	collapse(&r->events);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct rec whole, split;
	const uint8_t *lens;
	size_t kind, nlens, any = 0;

	if (size < 2)
		return 0;
#ifdef FUZZ_KIND
	/* A target of its own for one parser: the first byte no longer chooses. */
	kind = FUZZ_KIND;
#else
	kind = data[0] % NKINDS;
#endif
	nlens = (size_t)(data[1] % 8) + 1;
	if (size < 2 + nlens)
		return 0;
	lens = data + 2;
	for (size_t i = 0; i < nlens; i++)
		any |= lens[i];
	if (!any)
		return 0; /* only empty reads: no progress */
	data += 2 + nlens;
	size -= 2 + nlens;

	run(kind, (const char *)data, size, NULL, 0, &whole);
	run(kind, (const char *)data, size, lens, nlens, &split);
	if (whole.text.len != split.text.len ||
	    memcmp(whole.text.data, split.text.data, whole.text.len) ||
	    strcmp(whole.events.data, split.events.data) || (whole.stops > 0) != (split.stops > 0))
		abort();
	if (kind == 3 && (whole.text.len != size || memcmp(whole.text.data, data, size)))
		abort();
	buf_release(&whole.text);
	buf_release(&whole.events);
	buf_release(&split.text);
	buf_release(&split.events);
	return 0;
}
