/* What the forwarder reads in the upstream's answers as they stream to the client: the
 * tokens the upstream says it used (egr_usage_get), and copies of the credential it adds.
 *
 * Usage: the ledger counted what the run's CLI reported, so a run that called the API
 * itself (curl, from a CLI that runs commands) spent the owner's tokens unseen. The
 * upstream's own count of every answer the forwarder passed is summed here and handed to
 * the provider layer, which bills the larger of the two. The shapes read (egress.h) are
 * told apart by their keys, not by who the provider is. A run cannot forge a count: it
 * writes requests, and the "usage" members of an answer are the upstream's.
 *
 * Echo: an upstream that reflects its request (a debugging endpoint, an error that quotes
 * a header) would hand the credential back to the run. Response headers that hold one are
 * dropped (upstream.c); in bodies each copy is overwritten with '*' as the bytes go by,
 * the bytes that may be the start of a copy held back until the next piece shows whether
 * they are (the length of the answer stays). The limit: only exact copies are found; an
 * upstream that encodes what it echoes (base64, JSON escapes of the credential's
 * characters) is not. */
#include <string.h>

#include <jansson.h>

#include "egress/internal.h"
#include "common/banned.h"

#define TOKENS_MAX 1000000000LL

static int64_t count(const json_t *u, const char *key)
{
	const json_t *v = json_object_get(u, key);
	json_int_t n = json_is_integer(v) ? json_integer_value(v) : 0;

	return n < 0 ? 0 : n > TOKENS_MAX ? TOKENS_MAX : (int64_t)n;
}

static int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

/* Add what this usage object says beyond what the answer counted already. */
static void add_usage(struct egr_answer *a, const json_t *u)
{
	struct egr_forwarder *f = a->f;
	const json_t *details = json_object_get(u, "input_tokens_details");
	int64_t in, out, cached;

	if (!json_is_object(u))
		return;
	if (!details)
		details = json_object_get(u, "prompt_tokens_details");
	cached = count(u, "cache_read_input_tokens") + count(details, "cached_tokens");
	in = min64(count(u, "input_tokens") + count(u, "cache_read_input_tokens") +
			   count(u, "cache_creation_input_tokens") + count(u, "prompt_tokens"),
		   TOKENS_MAX);
	out = min64(count(u, "output_tokens") + count(u, "completion_tokens"), TOKENS_MAX);
	cached = min64(cached, in);
	if (!a->counted) {
		a->counted = true;
		atomic_fetch_add(&f->n_answers, 1);
	}
	if (in > a->in) {
		atomic_fetch_add(&f->tok_in, in - a->in);
		a->in = in;
	}
	if (out > a->out) {
		atomic_fetch_add(&f->tok_out, out - a->out);
		a->out = out;
	}
	if (cached > a->cached) {
		atomic_fetch_add(&f->tok_cached, cached - a->cached);
		a->cached = cached;
	}
}

/* A content block's name (content_block_start's "content_block"), when the route stops
 * after a tool call. */
static bool is_block_name(const struct egr_answer *a, const struct egr_jscan *s, unsigned depth)
{
	return a->f->stop_tool && depth == 2 && !strcmp(s->key[0], "content_block") &&
	       !strcmp(s->key[1], "name");
}

/* A "usage" member at the top, or in "message" (Anthropic's message_start) or
 * "response" (the Responses API's events); a content block's name. */
static int want(void *ctx, const struct egr_jscan *s, unsigned depth)
{
	if (depth == 1)
		return !strcmp(s->key[0], "usage");
	return is_block_name(ctx, s, depth) ||
	       (!strcmp(s->key[1], "usage") &&
		(!strcmp(s->key[0], "message") || !strcmp(s->key[0], "response")));
}

/* A tool of the stop prefix was called: the run ends there (route.stop_after_tool). Said
 * as soon as the block starts, long before the CLI has the answer and could act on it. */
static void block_named(struct egr_answer *a, const json_t *name)
{
	const char *n = json_string_value(name), *p = a->f->stop_tool;

	if (n && !strncmp(n, p, strlen(p)) && n[strlen(p)])
		atomic_store(&a->f->tool_called, 1);
}

static int got(void *ctx, const struct egr_jscan *s, unsigned depth, const char *raw, size_t len,
	       bool whole)
{
	struct egr_answer *a = ctx;
	json_t *u;

	if (!whole)
		return 0;
	u = json_loadb(raw, len, JSON_DECODE_ANY, NULL);
	if (u && is_block_name(a, s, depth))
		block_named(a, u);
	else if (u)
		add_usage(a, u);
	json_decref(u);
	return 0;
}

static void scan_reset(struct egr_answer *a)
{
	memset(&a->js, 0, sizeof(a->js));
	a->js.want = want;
	a->js.got = got;
	a->js.ctx = a;
}

void egr_answer_begin(struct egr_answer *a, struct egr_forwarder *f, const char *ctype,
		      size_t ctype_len, bool encoded)
{
	struct buf held = a->held;

	memset(a, 0, sizeof(*a));
	a->held = held;
	buf_reset(&a->held);
	a->f = f;
	a->sse = ctype && ctype_len >= 17 && !strncasecmp(ctype, "text/event-stream", 17);
	/* A compressed answer cannot be read as it goes by (the forwarder asks for none). */
	a->off = encoded;
	scan_reset(a);
}

/* SSE (WHATWG "server-sent events"): the data lines of one event are one JSON text,
 * joined by newlines; the event ends at an empty line. Other lines are skipped. */
static void sse_feed(struct egr_answer *a, const char *p, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		char c = p[i];
		bool crlf = a->cr && c == '\n';

		a->cr = c == '\r';
		if (crlf)
			continue; /* the CR ended the line already */
		if (c == '\n' || c == '\r') {
			if (!a->line_pos && a->in_event) { /* an empty line: the event's end */
				(void)egr_jscan_finish(&a->js);
				scan_reset(a);
				a->in_event = false;
			} else if (a->data_line) {
				(void)egr_jscan_feed(&a->js, "\n", 1);
			}
			a->line_pos = 0;
			a->data_line = false;
			continue;
		}
		if (a->line_pos < sizeof(a->prefix)) {
			a->prefix[a->line_pos++] = c;
			if (a->line_pos == sizeof(a->prefix) && !memcmp(a->prefix, "data:", 5)) {
				a->data_line = true;
				a->in_event = true;
			}
			continue;
		}
		if (a->line_pos < UINT32_MAX)
			a->line_pos++;
		if (a->data_line)
			(void)egr_jscan_feed(&a->js, &c, 1);
	}
}

void egr_answer_feed(struct egr_answer *a, const char *data, size_t len)
{
	if (a->off || !len)
		return;
	if (a->sse)
		sse_feed(a, data, len);
	else
		(void)egr_jscan_feed(&a->js, data, len);
}

void egr_answer_end(struct egr_answer *a)
{
	if (!a->off && a->sse && a->in_event)
		(void)egr_jscan_finish(&a->js);
	a->off = true;
}

void egr_answer_release(struct egr_answer *a)
{
	buf_release(&a->held);
}

/* ---- echo ------------------------------------------------------------------------------ */

bool egr_echo_in(const struct egr_forwarder *f, const char *value, size_t len)
{
	for (char *const *s = f->secrets.v; s && *s; s++)
		if (memmem(value, len, *s, strlen(*s)))
			return true;
	return false;
}

/* The longest tail of data (shorter than secret) that secret starts with. */
static size_t partial_tail(const char *data, size_t len, const char *secret, size_t sl)
{
	for (size_t k = sl - 1 < len ? sl - 1 : len; k > 0; k--)
		if (!memcmp(data + len - k, secret, k))
			return k;
	return 0;
}

void egr_echo_mask(struct egr_answer *a, const char *data, size_t len, struct buf *out)
{
	size_t hold = 0;

	buf_reset(out);
	buf_add(out, a->held.data, a->held.len);
	buf_add(out, data, len);
	buf_reset(&a->held);
	for (char *const *s = a->f->secrets.v; s && *s; s++) {
		size_t sl = strlen(*s), k;
		char *p = out->data;

		while ((p = memmem(p, out->len - (size_t)(p - out->data), *s, sl))) {
			memset(p, '*', sl);
			p += sl;
		}
		k = partial_tail(out->data, out->len, *s, sl);
		if (k > hold)
			hold = k;
	}
	if (hold) {
		buf_add(&a->held, out->data + out->len - hold, hold);
		out->len -= hold;
		out->data[out->len] = '\0';
	}
}
