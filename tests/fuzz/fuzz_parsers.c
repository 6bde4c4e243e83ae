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
#include "providers/providers.h"
#include "tests/support/recorder.h"
#include "common/banned.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const kinds[] = { "claude",	"codex",       "vibe",
				     "command", "command-sse", "command-ndjson" };
#define NKINDS (sizeof(kinds) / sizeof(kinds[0]))

/* The command modes are the provider's configuration: a command provider in that mode
 * (made once) and its parser, as prov_run makes it; the other parsers come from
 * prov_parser_new. */
static const struct prov_provider *command_in(const char *mode)
{
	static struct prov_provider *sse, *ndjson;
	struct prov_provider **pv = strcmp(mode, "sse") ? &ndjson : &sse;

	if (!*pv) {
		json_t *entry = json_pack("{s:s,s:[s],s:s}", "type", "command", "argv",
					  "/usr/bin/cat", "output", mode);

		*pv = entry ? prov_provider_from_json("fuzz", entry, NULL) : NULL;
		json_decref(entry);
		if (!*pv)
			abort();
	}
	return *pv;
}

static struct prov_parser *fparser_new(size_t kind)
{
	struct prov_parser *ps =
		kind < 4 ? prov_parser_new(kinds[kind])
			 : prov_parser_for(command_in(kind == 4 ? "sse" : "ndjson"));

	if (!ps)
		abort();
	return ps;
}

/* Feed out[0..len) in pieces (lens == NULL: whole). */
static void run(size_t kind, const char *out, size_t len, const uint8_t *lens, size_t nlens,
		struct ts_rec *r, int *stops)
{
	struct prov_sink sink = ts_rec_sink(r);
	struct prov_parser *ps;
	size_t off = 0, i = 0;
	int ret;

	ts_rec_init(r);
	*stops = 0;
	ps = fparser_new(kind);
	while (off < len) {
		size_t n = lens ? lens[i++ % nlens] : len;

		if (n > len - off)
			n = len - off;
		ret = prov_parser_feed(ps, out + off, n, &sink);
		if (ret < 0)
			abort(); /* the sink never aborts */
		if (ret > 0)
			(*stops)++;
		off += n;
	}
	if (prov_parser_finish(ps, &sink) < 0)
		abort();
	prov_parser_free(ps);
	/* An empty delta, or an event without its data, is a bug whatever the input. */
	if (r->malformed)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ts_rec whole, split;
	const uint8_t *lens;
	size_t kind, nlens, any = 0;
	int whole_stops, split_stops;

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

	run(kind, (const char *)data, size, NULL, 0, &whole, &whole_stops);
	run(kind, (const char *)data, size, lens, nlens, &split, &split_stops);
	if (whole.text.len != split.text.len ||
	    memcmp(whole.text.data, split.text.data, whole.text.len) ||
	    strcmp(whole.events.data, split.events.data) || (whole_stops > 0) != (split_stops > 0))
		abort();
	if (kind == 3 && (whole.text.len != size || memcmp(whole.text.data, data, size)))
		abort();
	ts_rec_release(&whole);
	ts_rec_release(&split);
	return 0;
}
