/* libFuzzer target for the request path of olp-fcgi without I/O: the bytes are a chat
 * request body for fcgi_chat_parse; a valid one is flattened and encoded as a completion
 * and as stream chunks; a refused one is encoded as an error. Every JSON produced must
 * parse back (abort otherwise, so the fuzzer reports it). The same bytes, cut at the first
 * space into method and URI, are routed, and fed to the command text reader, whose deltas
 * must add up to the input. As a response header value, they must be refused exactly when
 * they hold a control character.
 *
 *   fuzz_chat -max_total_time=20 corpus/ */
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "fcgi/fcgi.h"
#include "providers/providers.h"
#include "common/banned.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void must_parse(const struct buf *b)
{
	json_t *v = json_loadb(b->data, b->len, JSON_ALLOW_NUL, NULL);

	if (!v)
		abort();
	json_decref(v);
}

/* Each "data: X\n\n" event's X must be JSON (or [DONE]). */
static void must_parse_sse(const struct buf *b)
{
	const char *p = b->data, *end = b->data + b->len;

	while (p < end) {
		const char *nl;
		json_t *v;

		if ((size_t)(end - p) < 6 || memcmp(p, "data: ", 6))
			abort();
		p += 6;
		nl = memchr(p, '\n', (size_t)(end - p));
		if (!nl || nl + 1 >= end || nl[1] != '\n')
			abort();
		if ((size_t)(nl - p) != 6 || memcmp(p, "[DONE]", 6)) {
			v = json_loadb(p, (size_t)(nl - p), JSON_ALLOW_NUL, NULL);
			if (!v)
				abort();
			json_decref(v);
		}
		p = nl + 2;
	}
}

/* What a valid request's response_format, images and tools become (issue 16): the
 * formatted messages, the content blocks and the tool call encodings must all be JSON. */
static void fuzz_extras(const struct fcgi_chat_request *req, const struct fcgi_completion *m)
{
	json_t *msgs = prov_format_messages(req->messages, req->format, req->json_schema);
	json_t *blocks = json_array();
	struct fcgi_tool_call calls[4];
	struct buf out = BUF_INIT;
	const json_t *t;
	size_t i, n = 0;
	char *dump;

	if (!msgs || !blocks)
		abort();
	prov_flatten_blocks(msgs, blocks);
	dump = json_dumps(blocks, JSON_COMPACT | JSON_ENCODE_ANY);
	if (!dump)
		abort();
	free(dump);
	json_array_foreach(req->tools, i, t) {
		if (n == 4)
			break;
		calls[n++] = (struct fcgi_tool_call){
			.id = "call_1",
			.name = json_string_value(
				json_object_get(json_object_get(t, "function"), "name")),
			.args = "{}",
			.args_len = 2,
		};
		if (!calls[n - 1].name)
			abort(); /* fcgi_chat_parse let a tool without a name through */
	}
	fcgi_completion_json_calls(&out, m, "", 0, calls, n, "tool_calls", NULL);
	must_parse(&out);
	buf_reset(&out);
	for (i = 0; i < n; i++)
		fcgi_sse_tool_call(&out, m, !i, (unsigned)i, calls[i].id, calls[i].name, "{", 1);
	if (n)
		must_parse_sse(&out);
	buf_release(&out);
	json_decref(blocks);
	json_decref(msgs);
}

static void fuzz_parse(const char *body, size_t size)
{
	struct fcgi_chat_request req;
	struct fcgi_error err;
	struct buf prompt = BUF_INIT, out = BUF_INIT;
	struct fcgi_completion m;
	struct prov_usage u = {
		.present = true, .prompt_tokens = 1, .completion_tokens = 2, .total_tokens = 3
	};

	if (fcgi_chat_parse(body, size, &req, &err)) {
		/* 400, or 413 for an image above the cap. */
		if (!err.type ||
		    !((err.status == 400 && !strcmp(err.type, "invalid_request_error")) ||
		      (err.status == 413 && !strcmp(err.type, "request_too_large"))))
			abort();
		fcgi_error_json(&err, &out);
		must_parse(&out);
		buf_release(&out);
		return;
	}
	if (!req.model || !*req.model || !json_is_array(req.messages) ||
	    !json_array_size(req.messages))
		abort();
	prov_flatten_messages(req.messages, &prompt);
	fcgi_completion_init(&m, req.model);
	fcgi_completion_json(&out, &m, prompt.data, prompt.len, "stop",
			     req.include_usage ? &u : NULL);
	must_parse(&out);
	buf_reset(&out);
	fcgi_sse_chunk(&out, &m, "assistant", prompt.data, prompt.len, NULL);
	fcgi_sse_chunk(&out, &m, NULL, NULL, 0, "stop");
	fcgi_sse_usage(&out, &m, &u);
	fcgi_sse_done(&out);
	must_parse_sse(&out);
	fuzz_extras(&req, &m);
	buf_release(&out);
	buf_release(&prompt);
	fcgi_chat_release(&req);
}

/* The worker's routes (fcgi/handler.c), without their handlers. */
static const struct fcgi_route routes[] = {
	{ "POST", "/v1/chat/completions", "chat", NULL, 0 },
	{ "GET", "/v1/models", "models", NULL, 0 },
	{ "GET", "/health", "health", NULL, 0 },
	{ "GET", "/health/live", "health_live", NULL, 0 },
	{ "GET", "/v1/usage", "usage", NULL, 0 },
	{ "GET", "/dashboard", "dashboard", NULL, 0 },
	{ "GET", "/metrics", "metrics", NULL, 0 },
};

static void fuzz_route(const char *s, size_t size)
{
	struct buf method = BUF_INIT, uri = BUF_INIT, path = BUF_INIT;
	const char *sp = memchr(s, ' ', size);
	const struct fcgi_route *row = NULL;
	size_t mlen = sp ? (size_t)(sp - s) : size;
	enum fcgi_route_result r;

	buf_add(&method, s, mlen);
	if (sp)
		buf_add(&uri, sp + 1, size - mlen - 1);
	/* As a CGI variable would be: up to the first NUL. */
	r = fcgi_route_match(routes, ARRAY_SIZE(routes), method.data, uri.data, "/v1/models",
			     (size & 1) ? "/api" : "", &path, &row);
	if (r != FCGI_ROUTE_NOT_FOUND && !row)
		abort();
	r = fcgi_route_match(routes, ARRAY_SIZE(routes), method.data, NULL, uri.data, "/api/",
			     &path, &row);
	if (path.data[path.len] != '\0')
		abort();
	(void)r;
	buf_release(&method);
	buf_release(&uri);
	buf_release(&path);
}

static int collect(void *ctx, const struct prov_event *ev)
{
	if (ev->kind == PROV_EV_DELTA)
		buf_add(ctx, ev->text, ev->len);
	return 0;
}

static void fuzz_text(const char *s, size_t size)
{
	struct prov_parser *ps = prov_parser_new("command");
	struct buf all = BUF_INIT;
	struct prov_sink sink = { .emit = collect, .ctx = &all };
	size_t at = 0, step = size ? (size_t)(unsigned char)s[0] % 7 + 1 : 1;

	if (!ps)
		abort();
	while (at < size) {
		size_t n = size - at < step ? size - at : step;

		if (prov_parser_feed(ps, s + at, n, &sink))
			abort();
		at += n;
	}
	if (prov_parser_finish(ps, &sink))
		abort();
	if (all.len != size || (size && memcmp(all.data, s, size)))
		abort();
	prov_parser_free(ps);
	buf_release(&all);
}

/* The bytes as a header value (up to the first NUL, as a C string): fcgi_header_add takes
 * it exactly when it holds no control character, and then appends exactly one line. */
static void fuzz_header(const char *s, size_t size)
{
#define PREV "A: b\r\n" /* a header already there, which a refused one leaves alone */
	struct buf v = BUF_INIT, h = BUF_INIT;
	bool clean = true;

	buf_add(&v, s, size);
	for (size_t i = 0; i < strlen(v.data); i++) {
		unsigned char c = (unsigned char)v.data[i];

		if ((c < 0x20 && c != '\t') || c >= 0x7f)
			clean = false;
	}
	buf_adds(&h, PREV);
	if (fcgi_header_add(&h, "X-OLP-Model-Used", v.data) != (clean ? 0 : -EINVAL))
		abort();
	if (!clean && strcmp(h.data, PREV))
		abort();
	if (clean && (h.len != strlen(PREV) + strlen("X-OLP-Model-Used: ") + strlen(v.data) + 2 ||
		      strstr(h.data + strlen(PREV), "\r\n") != h.data + h.len - 2))
		abort();
	buf_release(&v);
	buf_release(&h);
#undef PREV
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *s = (const char *)data;

	fuzz_parse(s, size);
	fuzz_route(s, size);
	fuzz_text(s, size);
	fuzz_header(s, size);
	return 0;
}
