/* libFuzzer target for the egress forwarder's request parsing (egress/http.c through
 * egress/internal.h): the request head, the path's canonical-form and allow-list checks,
 * and the CONNECT authority check. The client of the forwarder is the hostile command in
 * the sandbox, so every byte of these is the attacker's.
 *
 * The input is what a client sends: it is cut after its first "\r\n\r\n" as the
 * forwarder cuts it (one is appended when there is none) and parsed. Besides the
 * sanitizers, these must hold, or the target aborts:
 *  - the status is 0 or one the header names (400, 417, 431, 501, 505);
 *  - a head that parses is one the forwarder can trust: the method a token, the target
 *    free of controls, spaces and '#', the path ending at '?' or the end, HTTP/1.0 or 1.1,
 *    never both Content-Length and chunked, chunked only in 1.1, every header name a
 *    token and every value free of CR, LF, NUL, DEL and outer whitespace;
 *  - it parses the same when written out again (no field that two readings see two ways);
 *  - a path called canonical gives no other path however an upstream normalises it:
 *    percent-decoded, it still has no "." or ".." segment, no empty segment but a last
 *    one, no backslash, ';' or NUL, and decoding adds no '/';
 *  - an allowed request is an entry's method and exactly its path, or a path under a
 *    prefix entry's; a path listed for other methods only gets 405, any other 403;
 *  - an authority that egr_host_port_valid() calls a name and not an IP is one libc
 *    cannot read as an address (a raw IP must never pass as a listed name), and its port
 *    is 1-65535 in plain digits.
 * What follows the head's blank line is a body, read as the forwarder reads bodies and
 * answers (egress/jscan.c, body.c, answer.c), whole and in pieces of 1-13 bytes:
 *  - the streaming JSON reader, the body check, the usage count and the echo mask come
 *    to the same result however the bytes are cut;
 *  - a text the reader calls one JSON value, jansson reads too (when it is UTF-8, and but
 *    for numbers jansson cannot hold and \u escapes of lone surrogates, which the reader
 *    lets through unread); below the reader's depth limit and without a NUL byte (where
 *    jansson ends the text), the converse holds too;
 *  - a body the check lets through names, by jansson's reading, only an allowed model
 *    and no "background" but false or null;
 *  - a masked answer is as long as the answer and holds no copy of the secret.
 * The head's headers are read as an answer's too, for the subscription limits they may
 * announce (egress/ratelimit.c), and the body as a 429's:
 *  - whatever is sent, the state read is in range: a known status, utilizations -1 (not
 *    said) or 0-1, resets 0 or plausible epoch seconds, window lengths under a year, a
 *    claim of [a-z0-9_] only;
 *  - a header it says it read is one of the names it knows.
 * Chunked body decoding lives in egress/upstream.c (static, driven by a connection) and
 * is not reached from here; unit_egress covers it over a socket.
 *
 *   fuzz_egress -max_total_time=20 -dict=tests/fuzz/egress.dict corpus-egress/ */
#include <arpa/inet.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "egress/internal.h"
#include "common/banned.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)              \
	do {                     \
		if (!(cond))     \
			abort(); \
	} while (0)

static bool is_ows(char ch)
{
	return ch == ' ' || ch == '\t';
}

static int hexval(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

/* The path as an upstream that percent-decodes it once would see it; false if an escape
 * is not two hex digits or decodes to a byte that makes another path. */
static bool decode_path(const char *path, size_t len, char *out, size_t *olen)
{
	size_t o = 0;

	for (size_t i = 0; i < len; i++) {
		int hi, lo, ch;

		if (path[i] != '%') {
			out[o++] = path[i];
			continue;
		}
		if (i + 2 >= len)
			return false; /* not two hex digits */
		hi = hexval(path[i + 1]);
		lo = hexval(path[i + 2]);
		if (hi < 0 || lo < 0)
			return false;
		ch = hi * 16 + lo;
		if (ch == '/' || ch == '%' || ch == 0)
			return false;
		out[o++] = (char)ch;
		i += 2;
	}
	*olen = o;
	return true;
}

/* Whether path[0..len) reads as the same path after dot-segment removal and slash
 * merging, whatever the reader decodes first. */
static bool stays_itself(const char *path, size_t len)
{
	size_t seg = 1;

	if (!len || path[0] != '/')
		return false;
	for (size_t i = 1; i <= len; i++) {
		if (i < len && path[i] != '/') {
			if (path[i] == '\\' || path[i] == ';' || path[i] == '\0')
				return false;
			continue;
		}
		if (i - seg == 0 && i != len)
			return false; /* "//" */
		if ((i - seg == 1 && path[seg] == '.') ||
		    (i - seg == 2 && path[seg] == '.' && path[seg + 1] == '.'))
			return false;
		seg = i + 1;
	}
	return true;
}

static void check_path(const char *path, size_t len)
{
	static const struct egr_allow allow[] = {
		{ .method = "POST", .path = "/v1/messages", .len = 12 },
		{ .method = "GET", .path = "/v1/models/", .len = 11, .prefix = true },
		{ .method = "POST", .path = "/api", .len = 4 },
	};
	char *dec;
	size_t dlen;
	bool canon = egr_path_canonical(path, len);

	if (canon) {
		CHECK(stays_itself(path, len));
		dec = malloc(len + 1);
		if (!dec)
			abort();
		CHECK(decode_path(path, len, dec, &dlen));
		CHECK(stays_itself(dec, dlen));
		free(dec);
	}
	if (!len || path[0] != '/')
		return;
	{
		int st = egr_allow_match(allow, ARRAY_SIZE(allow), "POST", path, len);
		bool exact = false, under = false;

		for (size_t i = 0; i < ARRAY_SIZE(allow); i++) {
			exact |= !allow[i].prefix && len == allow[i].len &&
				 !memcmp(path, allow[i].path, len);
			under |= allow[i].prefix && len >= allow[i].len &&
				 !memcmp(path, allow[i].path, allow[i].len);
		}
		/* POST is allowed exactly on "/v1/messages" and "/api"; any other path that
		 * is listed at all is listed for GET only (405); the rest is 403. */
		CHECK(st == 0 || st == 403 || st == 405);
		CHECK((st == 0) == exact);
		CHECK((st == 405) == (under && !exact));
	}
}

/* CONNECT's authority, as connect.c checks it before anything else. */
static void check_authority(const char *hp)
{
	bool ip;
	const char *colon;
	char host[256];
	struct in_addr a4;
	struct in6_addr a6;
	size_t hl;

	if (!egr_host_port_valid(hp, &ip))
		return;
	colon = strrchr(hp, ':');
	CHECK(colon && colon != hp);
	for (const char *p = colon + 1; *p; p++)
		CHECK(*p >= '0' && *p <= '9');
	CHECK(colon[1] && colon[1] != '0' && strlen(colon + 1) <= 5 && atoi(colon + 1) <= 65535);
	if (ip)
		return;
	hl = (size_t)(colon - hp);
	if (hl >= sizeof(host))
		return; /* too long for a name anyway: getaddrinfo refuses it */
	memcpy(host, hp, hl);
	host[hl] = '\0';
	CHECK(!inet_aton(host, &a4));
	CHECK(inet_pton(AF_INET6, host, &a6) != 1);
}

static void check_parsed(const struct egr_req *r)
{
	size_t tl;

	CHECK(r->method && egr_is_token(r->method, strlen(r->method)));
	CHECK(r->target && *r->target);
	tl = strlen(r->target);
	for (size_t i = 0; i < tl; i++)
		CHECK((unsigned char)r->target[i] > 0x20 && (unsigned char)r->target[i] < 0x7f &&
		      r->target[i] != '#');
	CHECK(r->path_len <= tl);
	CHECK(r->target[r->path_len] == '\0' || r->target[r->path_len] == '?');
	CHECK(!memchr(r->target, '?', r->path_len));
	CHECK(r->minor == 0 || r->minor == 1);
	CHECK(!(r->chunked && r->has_length));
	CHECK(!r->chunked || r->minor == 1);
	CHECK(r->nh <= EGR_MAX_HEADERS);
	for (size_t i = 0; i < r->nh; i++) {
		const char *v = r->h[i].value;
		size_t vl = strlen(v);

		CHECK(egr_is_token(r->h[i].name, strlen(r->h[i].name)));
		for (size_t j = 0; j < vl; j++)
			CHECK(((unsigned char)v[j] >= 0x20 || v[j] == '\t') && v[j] != 0x7f);
		CHECK(!vl || (!is_ows(v[0]) && !is_ows(v[vl - 1])));
		/* The first header of a name is the one the forwarder acts on. */
		for (size_t j = 0; j < r->nh; j++)
			if (!strcasecmp(r->h[j].name, r->h[i].name)) {
				CHECK(egr_req_header(r, r->h[i].name) == r->h[j].value);
				break;
			}
		(void)egr_req_hop_by_hop(r, r->h[i].name);
	}
	if (r->has_length) {
		const char *cl = egr_req_header(r, "content-length");

		CHECK(cl && strtoull(cl, NULL, 10) == r->length);
	}
}

/* The head written out again from the parse must parse to the same request. */
static void check_roundtrip(const struct egr_req *r)
{
	struct buf b = BUF_INIT;
	struct egr_req again;

	buf_addf(&b, "%s %s HTTP/1.%d\r\n", r->method, r->target, r->minor);
	for (size_t i = 0; i < r->nh; i++)
		buf_addf(&b, "%s: %s\r\n", r->h[i].name, r->h[i].value);
	buf_adds(&b, "\r\n");
	CHECK(egr_req_parse(&again, b.data, b.len) == 0);
	CHECK(!strcmp(again.method, r->method) && !strcmp(again.target, r->target));
	CHECK(again.path_len == r->path_len && again.minor == r->minor && again.nh == r->nh);
	CHECK(again.has_length == r->has_length && again.length == r->length);
	CHECK(again.chunked == r->chunked && again.keep_alive == r->keep_alive &&
	      again.expect_continue == r->expect_continue);
	for (size_t i = 0; i < r->nh; i++)
		CHECK(!strcmp(again.h[i].name, r->h[i].name) &&
		      !strcmp(again.h[i].value, r->h[i].value));
	egr_req_release(&again);
	buf_release(&b);
}

/* ---- bodies and answers --------------------------------------------------------------- */

#define SECRET "sk-fuzz-secret-0123456789"

/* The length of the next piece: the rest when step is 0, else 1-13 bytes. */
static size_t piece(size_t left, unsigned step, size_t i)
{
	size_t k = step ? 1 + (i * step) % 13 : left;

	return k < left ? k : left;
}

/* The reader alone, with no callbacks: 0 when the text is exactly one JSON value. */
static int jscan_verdict(const char *d, size_t n, unsigned step)
{
	struct egr_jscan *s = calloc(1, sizeof(*s));
	int ret = 0;

	if (!s)
		abort();
	for (size_t off = 0, i = 0, k; off < n && !ret; off += k, i++) {
		k = piece(n - off, step, i);
		ret = egr_jscan_feed(s, d + off, k);
	}
	if (!ret)
		ret = egr_jscan_finish(s);
	free(s);
	return ret;
}

/* The body check: 0 (let through) or its status (400 or 403). */
static int body_verdict(const char *d, size_t n, unsigned step, const struct strv *models)
{
	struct egr_body *b = calloc(1, sizeof(*b));
	int ret = 0;

	if (!b)
		abort();
	egr_body_begin(b, models);
	for (size_t off = 0, i = 0, k; off < n && !ret; off += k, i++) {
		k = piece(n - off, step, i);
		ret = egr_body_feed(b, d + off, k);
	}
	if (!ret)
		ret = egr_body_finish(b);
	ret = ret ? b->status : 0;
	free(b);
	return ret;
}

/* Where jansson and the reader may differ on purpose (see the top of this file). */
static bool jansson_differs_on_purpose(const char *d, size_t n, const json_error_t *e)
{
	return !utf8_valid(d, n) || json_error_code(e) == json_error_numeric_overflow ||
	       strstr(e->text, "invalid Unicode") != NULL;
}

/* What the check let through, read by jansson: the model allowed, no background. */
static void check_let_through(const char *d, size_t n, const struct strv *models)
{
	json_t *root = json_loadb(d, n, JSON_ALLOW_NUL, NULL);
	const char *key;
	json_t *v;

	if (!root)
		return;
	CHECK(json_is_object(root));
	json_object_foreach(root, key, v) {
		if (!strcasecmp(key, "model"))
			CHECK(json_is_string(v) && egr_model_allowed(models, json_string_value(v),
								     json_string_length(v)));
		if (!strcasecmp(key, "background"))
			CHECK(json_is_false(v) || json_is_null(v));
	}
	json_decref(root);
}

static void check_body(const char *d, size_t n, unsigned step)
{
	struct strv models = STRV_INIT;
	json_error_t e;
	json_t *j;
	int whole, st;

	whole = jscan_verdict(d, n, 0);
	CHECK(jscan_verdict(d, n, step) == whole);
	j = json_loadb(d, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
	if (!whole && !j)
		CHECK(jansson_differs_on_purpose(d, n, &e));
	/* jansson ends its text at a NUL byte; the reader refuses one outside a string. */
	if (whole && j && n < EGR_JSCAN_DEPTH && !memchr(d, '\0', n))
		abort(); /* jansson read a value the reader refused */
	json_decref(j);

	strv_push(&models, "claude-run");
	strv_push(&models, "claude-haiku-*");
	st = body_verdict(d, n, 0, &models);
	CHECK(st == 0 || st == 400 || st == 403);
	CHECK(body_verdict(d, n, step, &models) == st);
	if (!st)
		check_let_through(d, n, &models);
	strv_release(&models);
}

/* One answer read as SSE or JSON in pieces: the counts it adds to f, and the masked text
 * in out. */
static void answer_read(struct egr_forwarder *f, const char *d, size_t n, unsigned step, bool sse,
			struct buf *out)
{
	struct egr_answer a;
	struct buf piece_out = BUF_INIT;
	const char *ctype = sse ? "text/event-stream" : "application/json";

	memset(&a, 0, sizeof(a));
	buf_init(&a.held);
	egr_answer_begin(&a, f, ctype, strlen(ctype), false);
	buf_reset(out);
	for (size_t off = 0, i = 0, k; off < n; off += k, i++) {
		k = piece(n - off, step, i);
		egr_answer_feed(&a, d + off, k);
		egr_echo_mask(&a, d + off, k, &piece_out);
		buf_add(out, piece_out.data, piece_out.len);
	}
	egr_answer_end(&a);
	buf_add(out, a.held.data, a.held.len);
	egr_answer_release(&a);
	buf_release(&piece_out);
}

static void check_answer(const char *d, size_t n, unsigned step)
{
	struct egr_forwarder *f[2];
	struct buf out[2] = { BUF_INIT, BUF_INIT };

	for (int sse = 0; sse < 2; sse++) {
		for (int i = 0; i < 2; i++) {
			f[i] = calloc(1, sizeof(*f[i]));
			if (!f[i])
				abort();
			strv_push(&f[i]->secrets, SECRET);
			f[i]->stop_tool = (char *)"mcp__olp__"; /* not freed: no egr_stop here */
			answer_read(f[i], d, n, i ? step : 0, sse, &out[i]);
		}
		CHECK(atomic_load(&f[0]->n_answers) == atomic_load(&f[1]->n_answers));
		CHECK(atomic_load(&f[0]->tok_in) == atomic_load(&f[1]->tok_in));
		CHECK(atomic_load(&f[0]->tok_out) == atomic_load(&f[1]->tok_out));
		CHECK(atomic_load(&f[0]->tok_cached) == atomic_load(&f[1]->tok_cached));
		/* Whether the answer called a stop tool does not depend on its pieces. */
		CHECK(atomic_load(&f[0]->tool_called) == atomic_load(&f[1]->tool_called));
		for (int i = 0; i < 2; i++) {
			CHECK(out[i].len == n);
			CHECK(!memmem(out[i].data, out[i].len, SECRET, strlen(SECRET)));
			if (!memmem(d, n, SECRET, strlen(SECRET)))
				CHECK(!memcmp(out[i].data, d, n));
			strv_release(&f[i]->secrets);
			free(f[i]);
		}
	}
	buf_release(&out[0]);
	buf_release(&out[1]);
}

/* ---- the subscription limits an answer announces -------------------------------------- */

#define NOW_S 1800000000LL

static void check_rl_state(const struct egr_ratelimit *rl)
{
	CHECK(rl->status >= EGR_RL_UNKNOWN && rl->status <= EGR_RL_REJECTED);
	CHECK(rl->reset_s == 0 || (rl->reset_s >= 1000000000LL && rl->reset_s <= 99999999999LL) ||
	      (rl->reset_s >= NOW_S && rl->reset_s <= NOW_S + 366LL * 86400));
	CHECK(strnlen(rl->claim, sizeof(rl->claim)) < sizeof(rl->claim));
	for (const char *c = rl->claim; *c; c++)
		CHECK((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_');
	for (size_t i = 0; i < EGR_RL_NWIN; i++) {
		const struct egr_rl_win *w = &rl->win[i];

		CHECK(w->utilization == -1 || (w->utilization >= 0 && w->utilization <= 1));
		CHECK(w->status >= EGR_RL_UNKNOWN && w->status <= EGR_RL_REJECTED);
		CHECK(w->minutes <= 366u * 1440);
		CHECK(w->reset_s == 0 || w->reset_s >= 1000000000LL);
		CHECK(w->seen || (w->utilization == -1 && !w->reset_s && !w->minutes));
	}
}

static void check_limits(const struct egr_req *r, const char *body, size_t blen)
{
	struct egr_ratelimit rl;

	egr_rl_init(&rl, 429);
	for (size_t i = 0; i < r->nh; i++) {
		const char *n = r->h[i].name;

		if (egr_rl_header(&rl, n, strlen(n), r->h[i].value, strlen(r->h[i].value), NOW_S))
			CHECK(!strncasecmp(n, "anthropic-ratelimit-unified-", 28) ||
			      !strncasecmp(n, "x-codex-primary-", 16) ||
			      !strncasecmp(n, "x-codex-secondary-", 18));
		check_rl_state(&rl);
	}
	if (body)
		(void)egr_rl_body(&rl, body, blen, NOW_S);
	egr_rl_finish(&rl);
	check_rl_state(&rl);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct buf in = BUF_INIT;
	struct egr_req r;
	const char *end;
	size_t hl;
	int st;

	/* As egr_conn_read_head: the head is everything up to the first blank line. */
	buf_add(&in, data, size);
	buf_adds(&in, "\r\n\r\n");
	end = memmem(in.data, in.len, "\r\n\r\n", 4);
	hl = (size_t)(end - in.data) + 4;
	st = egr_req_parse(&r, in.data, hl);
	CHECK(st == 0 || st == 400 || st == 417 || st == 431 || st == 501 || st == 505);
	if (!st) {
		check_parsed(&r);
		check_roundtrip(&r);
		check_path(r.target, r.path_len);
		check_authority(r.target);
		end = memmem(data, size, "\r\n\r\n", 4);
		check_limits(&r, end ? end + 4 : NULL,
			     end ? size - (size_t)(end + 4 - (const char *)data) : 0);
	}
	egr_req_release(&r);

	/* The raw bytes too (up to a NUL or CR/LF) as a path and an authority: the checks
	 * must hold for any string, not only for targets the head parser lets through. */
	hl = strcspn(in.data, "\r\n");
	check_path(in.data, hl);
	in.data[hl] = '\0';
	check_authority(in.data);
	buf_release(&in);

	/* The bytes after the head's blank line, when there is one, as a body and an answer;
	 * the input's length picks how they are cut. */
	end = memmem(data, size, "\r\n\r\n", 4);
	if (end) {
		const char *body = end + 4;
		size_t blen = size - (size_t)(body - (const char *)data);
		unsigned step = 1 + (unsigned)(size % 11);

		check_body(body, blen, step);
		check_answer(body, blen, step);
	}
	return 0;
}
