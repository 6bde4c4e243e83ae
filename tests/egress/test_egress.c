/* CUnit suite for egress/: the forwarder, through its public header, against the test
 * upstream (upstream.h) on 127.0.0.1, over HTTP and over HTTPS with a CA made for the run
 * with the openssl command. The client side is a raw socket, so that what the forwarder
 * writes is seen byte for byte (framing, chunk timing, connection handling).
 *
 * The forwarder listens on a plain 127.0.0.1 socket here: forwarding does not depend on
 * where the listener lives (tests/sandbox/test_netns.c covers the namespace). */
#include "tests/support/cunit.h"
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "common/common.h"
#include "egress/egress.h"
#include "tests/egress/upstream.h"
#include "tests/support/support.h"
#include "common/banned.h"

static char tmpdir[] = "/tmp/olp-egress-test-XXXXXX";
static char ca_path[256], cert_path[256], key_path[256];
static struct tu_server *up_plain, *up_tls;
static bool have_tls;

/* ---- the client side ----------------------------------------------------------------- */

struct tc {
	int fd;
	struct buf in;
};

struct tc_resp {
	int status;
	struct buf head;
	struct buf body;
	bool chunked;
	bool complete;
	int n_chunks;
	uint64_t chunk_ms[64]; /* when each chunk had arrived whole (mono_ms) */
};

static int tc_open(struct tc *t, uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct timeval tv = { .tv_sec = 10 };

	buf_init(&t->in);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	t->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (t->fd < 0)
		return -errno;
	(void)setsockopt(t->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(t->fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		int e = -errno;

		close(t->fd);
		t->fd = -1;
		return e;
	}
	return 0;
}

static void tc_close(struct tc *t)
{
	if (t->fd >= 0)
		close(t->fd);
	t->fd = -1;
	buf_release(&t->in);
}

static int tc_send(struct tc *t, const char *s)
{
	return write_all(t->fd, s, strlen(s));
}

/* At least n bytes in t->in: 0, or -1 at EOF / timeout. */
static int tc_need(struct tc *t, size_t n)
{
	while (t->in.len < n) {
		ssize_t r = buf_read_once(&t->in, t->fd, 65536);

		if (r <= 0)
			return -1;
	}
	return 0;
}

static void resp_init(struct tc_resp *r)
{
	memset(r, 0, sizeof(*r));
	buf_init(&r->head);
	buf_init(&r->body);
}

static void resp_release(struct tc_resp *r)
{
	buf_release(&r->head);
	buf_release(&r->body);
}

static const char *resp_header(const struct tc_resp *r, const char *name, char *out, size_t n)
{
	const char *p = r->head.data;
	size_t nl = strlen(name);

	while ((p = strstr(p, "\r\n"))) {
		p += 2;
		if (!strncasecmp(p, name, nl) && p[nl] == ':') {
			const char *v = p + nl + 1, *e = strstr(v, "\r\n");

			while (*v == ' ')
				v++;
			snprintf(out, n, "%.*s", (int)(e - v), v);
			return out;
		}
	}
	return NULL;
}

/* Read one response. 0 when complete; -1 when the connection ended first (what had come
 * is in r). */
static int tc_response(struct tc *t, struct tc_resp *r, bool head_only)
{
	char v[64];
	char *e;

	resp_init(r);
	while (!(e = memmem(t->in.data, t->in.len, "\r\n\r\n", 4)))
		if (tc_need(t, t->in.len + 1))
			return -1;
	buf_add(&r->head, t->in.data, (size_t)(e - t->in.data) + 4);
	buf_consume(&t->in, (size_t)(e - t->in.data) + 4);
	if (sscanf(r->head.data, "HTTP/1.%*d %d", &r->status) != 1)
		return -1;
	if (head_only || r->status == 204 || r->status == 304 || r->status / 100 == 1) {
		r->complete = true;
		return 0;
	}
	if (resp_header(r, "transfer-encoding", v, sizeof(v))) {
		r->chunked = true;
		for (;;) {
			char *eol;
			unsigned long size;

			while (!(eol = memmem(t->in.data, t->in.len, "\r\n", 2)))
				if (tc_need(t, t->in.len + 1))
					return -1;
			size = strtoul(t->in.data, NULL, 16);
			buf_consume(&t->in, (size_t)(eol - t->in.data) + 2);
			if (tc_need(t, size + 2))
				return -1;
			if (!size)
				break;
			buf_add(&r->body, t->in.data, size);
			buf_consume(&t->in, size + 2);
			if (r->n_chunks < 64)
				r->chunk_ms[r->n_chunks++] = mono_ms();
		}
		buf_consume(&t->in, 2);
		r->complete = true;
		return 0;
	}
	if (resp_header(r, "content-length", v, sizeof(v))) {
		size_t n = strtoul(v, NULL, 10);

		if (tc_need(t, n))
			return -1;
		buf_add(&r->body, t->in.data, n);
		buf_consume(&t->in, n);
		r->complete = true;
		return 0;
	}
	/* Until the end of the connection. */
	while (buf_read_once(&t->in, t->fd, 65536) > 0)
		;
	buf_add(&r->body, t->in.data, t->in.len);
	buf_reset(&t->in);
	r->complete = true;
	return 0;
}

/* One request on a new connection; the response in r. */
static int one_request(uint16_t port, const char *req, struct tc_resp *r)
{
	struct tc t;
	int ret;

	resp_init(r);
	if (tc_open(&t, port))
		return -1;
	ret = tc_send(&t, req) ? -1 : tc_response(&t, r, !strncmp(req, "HEAD ", 5));
	tc_close(&t);
	return ret;
}

/* Whether the connection is closed by the other end within ms. */
static bool closed_within(struct tc *t, int ms)
{
	struct pollfd p = { .fd = t->fd, .events = POLLIN };
	char c;

	if (poll(&p, 1, ms) != 1)
		return false;
	return recv(t->fd, &c, 1, MSG_DONTWAIT) <= 0;
}

/* The listener refuses connections within ms: a connection thread can see the
 * deadline before the acceptor thread wakes and closes the listener. */
static bool refused_within(uint16_t port, int ms)
{
	uint64_t until = mono_ms() + (uint64_t)ms;
	struct tc t;

	for (;;) {
		int r = tc_open(&t, port);

		tc_close(&t);
		if (r == -ECONNREFUSED)
			return true;
		if (mono_ms() >= until)
			return false;
		(void)poll(NULL, 0, 10);
	}
}

/* ---- the forwarder ------------------------------------------------------------------- */

static int listener(uint16_t *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t al = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 64) ||
	    getsockname(fd, (struct sockaddr *)&a, &al)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	*port = ntohs(a.sin_port);
	return fd;
}

static struct egr_forwarder *fwd(const struct egr_route *r, const struct egr_limits *l,
				 uint16_t *port)
{
	int fd = listener(port);

	return fd < 0 ? NULL : egr_start(fd, r, l);
}

static char upstream_url[64], upstream_tls_url[64];

static struct egr_route plain_route(void)
{
	return (struct egr_route){ .mode = EGR_MODE_UPSTREAM,
				   .request_id = "test-egress",
				   .upstream = upstream_url,
				   .flags = EGR_ANY_PATH };
}

/* ---- upstream mode --------------------------------------------------------------------- */

static void test_plain_get(void)
{
	struct egr_route r = plain_route();
	struct egr_stats st;
	struct tc_resp resp;
	uint16_t port;
	struct egr_forwarder *f = fwd(&r, NULL, &port);

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL(
		one_request(port, "GET /echo?x=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 200);
	CU_ASSERT_PTR_NOT_NULL(strstr(resp.body.data, "method=GET\npath=/echo?x=1\n"));
	/* The upstream's own Host, not the one the client named. */
	CU_ASSERT_PTR_NOT_NULL(strcasestr(resp.body.data, "\r\nhost: 127.0.0.1:"));
	/* None of libcurl's defaults added. */
	CU_ASSERT_PTR_NULL(strcasestr(resp.body.data, "accept:"));
	CU_ASSERT_PTR_NULL(strcasestr(resp.body.data, "user-agent:"));
	resp_release(&resp);
	/* HEAD: the head only, the upstream's length kept. */
	CU_ASSERT_EQUAL(one_request(port, "HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n", &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 200);
	resp_release(&resp);
	/* Statuses pass through, with their bodies (401 and 429 are what providers map). */
	CU_ASSERT_EQUAL(one_request(port, "GET /status/429 HTTP/1.1\r\nHost: x\r\n\r\n", &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 429);
	CU_ASSERT_PTR_NOT_NULL(strstr(resp.body.data, "\"type\":\"test\""));
	resp_release(&resp);
	CU_ASSERT_EQUAL(one_request(port, "GET /status/204 HTTP/1.1\r\nHost: x\r\n\r\n", &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 204);
	resp_release(&resp);
	egr_stop(f, &st);
	CU_ASSERT_EQUAL(st.conns, 4);
	CU_ASSERT_EQUAL(st.requests, 4);
	CU_ASSERT_EQUAL(st.refused, 0);
}

static void test_request_bodies(void)
{
	struct egr_route r = plain_route();
	struct tc_resp resp;
	struct buf req = BUF_INIT, head = BUF_INIT;
	uint64_t body_len = 0;
	uint16_t port;
	struct egr_forwarder *f = fwd(&r, NULL, &port);
	struct tc t;

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	/* Content-Length, larger than any buffer on the way. */
	buf_addf(&req, "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
		       "Content-Length: 300000\r\n\r\n");
	for (int i = 0; i < 300000; i++)
		buf_addch(&req, (char)('a' + i % 26));
	CU_ASSERT_EQUAL(one_request(port, req.data, &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 200);
	CU_ASSERT_PTR_NOT_NULL(
		strstr(resp.body.data, "method=POST\npath=/v1/messages\nbody=300000\n"));
	CU_ASSERT_PTR_NOT_NULL(strcasestr(resp.body.data, "content-type: application/json"));
	resp_release(&resp);
	/* Chunked, sent in pieces with pauses. */
	CU_ASSERT_EQUAL_FATAL(tc_open(&t, port), 0);
	CU_ASSERT_EQUAL(tc_send(&t,
				"PUT /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
				"5\r\nhello\r\n"),
			0);
	(void)poll(NULL, 0, 50);
	CU_ASSERT_EQUAL(tc_send(&t, "6;ext=1\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n"), 0);
	CU_ASSERT_EQUAL(tc_response(&t, &resp, false), 0);
	CU_ASSERT_EQUAL(resp.status, 200);
	CU_ASSERT_PTR_NOT_NULL(strstr(resp.body.data, "method=PUT\npath=/up\nbody=11\n"));
	tu_last(up_plain, &head, &body_len);
	CU_ASSERT_EQUAL(body_len, 11);
	CU_ASSERT_PTR_NULL(strcasestr(head.data, "x-trailer"));
	resp_release(&resp);
	/* Expect: 100-continue is answered by the forwarder itself. */
	CU_ASSERT_EQUAL(tc_send(&t, "POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
				    "Expect: 100-continue\r\n\r\n"),
			0);
	CU_ASSERT_EQUAL(tc_response(&t, &resp, false), 0);
	CU_ASSERT_EQUAL(resp.status, 100);
	resp_release(&resp);
	CU_ASSERT_EQUAL(tc_send(&t, "abc"), 0);
	CU_ASSERT_EQUAL(tc_response(&t, &resp, false), 0);
	CU_ASSERT_EQUAL(resp.status, 200);
	CU_ASSERT_PTR_NOT_NULL(strstr(resp.body.data, "body=3\n"));
	CU_ASSERT_PTR_NULL(strcasestr(resp.body.data, "expect:"));
	resp_release(&resp);
	tc_close(&t);
	buf_release(&req);
	buf_release(&head);
	egr_stop(f, NULL);
}

static void test_credentials(void)
{
	const struct egr_header set[] = { { "x-api-key", "sk-real-123" },
					  { "anthropic-version", "2023-06-01" } };
	struct egr_route r = plain_route();
	struct tc_resp resp;
	struct buf head = BUF_INIT;
	uint16_t port;
	struct egr_forwarder *f;
	const char *p;

	r.set_headers = set;
	r.n_set_headers = ARRAY_SIZE(set);
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL(
		one_request(port,
			    "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:1\r\n"
			    "Authorization: Bearer placeholder-XYZ\r\n"
			    "X-API-Key: placeholder-XYZ\r\n"
			    "anthropic-version: 1999-01-01\r\n"
			    "anthropic-beta: tools-1\r\n"
			    "Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n"
			    "TE: trailers\r\nProxy-Authorization: Basic eA==\r\nUpgrade: h2c\r\n"
			    "Content-Length: 2\r\n\r\n{}",
			    &resp),
		0);
	CU_ASSERT_EQUAL(resp.status, 200);
	tu_last(up_plain, &head, NULL);
	/* The placeholder is gone, the real key is there once, the set header replaced the
	 * client's. */
	CU_ASSERT_PTR_NULL(strstr(head.data, "placeholder"));
	CU_ASSERT_PTR_NULL(strcasestr(head.data, "authorization"));
	p = strstr(head.data, "x-api-key: sk-real-123\r\n");
	CU_ASSERT_PTR_NOT_NULL(p);
	CU_ASSERT(p && !strcasestr(p + 1, "x-api-key"));
	CU_ASSERT_PTR_NOT_NULL(strstr(head.data, "anthropic-version: 2023-06-01\r\n"));
	CU_ASSERT_PTR_NULL(strstr(head.data, "1999-01-01"));
	CU_ASSERT_PTR_NOT_NULL(strcasestr(head.data, "anthropic-beta: tools-1\r\n"));
	/* Hop-by-hop headers, and those the client's Connection header named, stay here. */
	CU_ASSERT_PTR_NULL(strcasestr(head.data, "x-hop"));
	CU_ASSERT_PTR_NULL(strcasestr(head.data, "keep-alive"));
	CU_ASSERT_PTR_NULL(strcasestr(head.data, "\r\nte:"));
	CU_ASSERT_PTR_NULL(strcasestr(head.data, "upgrade"));
	CU_ASSERT_PTR_NULL(strcasestr(head.data, "host: 127.0.0.1:1\r\n"));
	/* libcurl added no Content-Type of its own to the POST. */
	CU_ASSERT_PTR_NULL(strcasestr(head.data, "x-www-form-urlencoded"));
	/* The client never sees the real key. */
	CU_ASSERT_PTR_NULL(strstr(resp.head.data, "sk-real"));
	resp_release(&resp);
	buf_release(&head);
	egr_stop(f, NULL);
}

static void check_status(uint16_t port, const char *path, int want)
{
	struct tc_resp resp;
	char req[512];

	snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
	CU_ASSERT_EQUAL(one_request(port, req, &resp), 0);
	if (resp.status != want)
		fprintf(stderr, "\n  %s: %d, wanted %d ", path, resp.status, want);
	CU_ASSERT_EQUAL(resp.status, want);
	if (want >= 400) {
		CU_ASSERT_PTR_NOT_NULL(
			strstr(resp.body.data, "{\"type\":\"error\",\"error\":{\"type\":"));
		CU_ASSERT_PTR_NOT_NULL(
			strcasestr(resp.head.data, "content-type: application/json"));
	}
	resp_release(&resp);
}

static void check_method(uint16_t port, const char *method, const char *path, int want)
{
	struct tc_resp resp;
	char req[512];

	snprintf(req, sizeof(req), "%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", method,
		 path);
	CU_ASSERT_EQUAL(one_request(port, req, &resp), 0);
	if (resp.status != want)
		fprintf(stderr, "\n  %s %s: %d, wanted %d ", method, path, resp.status, want);
	CU_ASSERT_EQUAL(resp.status, want);
	if (want >= 400)
		CU_ASSERT_PTR_NOT_NULL(
			strstr(resp.body.data, "{\"type\":\"error\",\"error\":{\"type\":"));
	resp_release(&resp);
}

/* Exact paths with their methods (issue 22): "/v1/messages" let every path below it and
 * every method through; now a sibling API, another method, TRACE and CONNECT are refused
 * before anything reaches the upstream. */
static void test_allow_paths(void)
{
	const char *const allow[] = { "GET /v1/messages", "POST /v1/messages", "GET /v1/models/*",
				      NULL };
	struct egr_route r = plain_route();
	struct egr_stats st;
	unsigned before = tu_requests(up_plain);
	uint16_t port;
	struct egr_forwarder *f;

	r.allow_paths = allow;
	r.flags = 0;
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	check_status(port, "/v1/messages", 200);
	check_status(port, "/v1/messages?beta=true", 200);
	check_method(port, "POST", "/v1/messages?beta=true", 200);
	check_status(port, "/v1/models/claude", 200);
	check_status(port, "/v1/models/a/b", 200);
	CU_ASSERT_EQUAL(tu_requests(up_plain), before + 5);
	/* Below an exact path: another API (the batches of the whole workspace). */
	check_status(port, "/v1/messages/batches", 403);
	check_status(port, "/v1/messages/count_tokens", 403);
	check_method(port, "POST", "/v1/messages/batches", 403);
	check_status(port, "/v1/messagesX", 403);
	check_status(port, "/v1/models", 403);
	check_status(port, "/admin", 403);
	check_status(port, "/", 403);
	/* A listed path with a method it is not listed for. */
	check_method(port, "DELETE", "/v1/messages", 405);
	check_method(port, "PUT", "/v1/messages", 405);
	check_method(port, "post", "/v1/messages", 405);
	check_method(port, "POST", "/v1/models/x", 405);
	/* Never, listed or not: TRACE reflects the request, credential included. */
	check_method(port, "TRACE", "/v1/messages", 405);
	check_method(port, "TRACK", "/v1/messages", 405);
	check_status(port, "/v1/messages/../../admin", 400);
	check_status(port, "/v1/messages/%2e%2e/admin", 400);
	check_status(port, "/v1/messages%2f..%2fadmin", 400);
	check_status(port, "/v1//messages", 400);
	check_status(port, "/v1/messages/./x", 400);
	check_status(port, "/v1/messages;/../admin", 400);
	check_status(port, "http://evil.example/v1/messages", 400);
	/* Nothing refused reached the upstream. */
	CU_ASSERT_EQUAL(tu_requests(up_plain), before + 5);
	egr_stop(f, &st);
	CU_ASSERT_EQUAL(st.refused, 20);
	/* With no list, nothing at all; with EGR_ANY_PATH, still never TRACE. */
	r.allow_paths = NULL;
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	check_status(port, "/v1/messages", 403);
	egr_stop(f, NULL);
	r.flags = EGR_ANY_PATH;
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	check_method(port, "DELETE", "/anything", 200);
	check_method(port, "TRACE", "/anything", 405);
	check_method(port, "TRACK", "/anything", 405);
	egr_stop(f, NULL);
	CU_ASSERT_EQUAL(tu_requests(up_plain), before + 6);
}

/* Headers that would make a server or a proxy on the way act on another method, URL or
 * client than the one checked never leave (issue 22). */
static void test_override_headers(void)
{
	static const char *const gone[] = {
		"x-http-method-override",
		"x-http-method",
		"x-method-override",
		"x-original-url",
		"x-rewrite-url",
		"x-forwarded-for",
		"x-forwarded-host",
		"forwarded",
		"proxy-foo",
		"x-real-ip",
		"keep-alive",
		"\r\nte:",
		"trailer",
		"upgrade",
		"x-hop",
		"gzip",
	};
	const char *const allow[] = { "POST /v1/messages", NULL };
	struct egr_route r = plain_route();
	struct tc_resp resp;
	struct buf head = BUF_INIT;
	uint16_t port;
	struct egr_forwarder *f;

	r.allow_paths = allow;
	r.flags = 0;
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL(
		one_request(port,
			    "POST /v1/messages HTTP/1.1\r\nHost: x\r\n"
			    "X-HTTP-Method-Override: DELETE\r\nX-HTTP-Method: DELETE\r\n"
			    "X-Method-Override: DELETE\r\nX-Original-URL: /v1/files\r\n"
			    "X-Rewrite-URL: /v1/files\r\nX-Forwarded-For: 10.0.0.1\r\n"
			    "X-Forwarded-Host: evil.example\r\nForwarded: for=10.0.0.1\r\n"
			    "Proxy-Foo: 1\r\nX-Real-IP: 10.0.0.1\r\nKeep-Alive: timeout=5\r\n"
			    "TE: trailers\r\nTrailer: X-T\r\nUpgrade: h2c\r\n"
			    "Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\n"
			    "Accept-Encoding: gzip\r\nX-Kept: yes\r\n"
			    "Content-Length: 2\r\n\r\n{}",
			    &resp),
		0);
	CU_ASSERT_EQUAL(resp.status, 200);
	tu_last(up_plain, &head, NULL);
	for (size_t i = 0; i < ARRAY_SIZE(gone); i++) {
		if (strcasestr(head.data, gone[i]))
			fprintf(stderr, "\n  %s reached the upstream ", gone[i]);
		CU_ASSERT_PTR_NULL(strcasestr(head.data, gone[i]));
	}
	CU_ASSERT_PTR_NOT_NULL(strcasestr(head.data, "x-kept: yes\r\n"));
	/* The answer must be readable for its usage: never compressed. */
	CU_ASSERT_PTR_NOT_NULL(strcasestr(head.data, "accept-encoding: identity\r\n"));
	resp_release(&resp);
	buf_release(&head);
	egr_stop(f, NULL);
}

/* One POST of body to port; the status. */
static int post_json(uint16_t port, const char *path, const char *extra, const char *body)
{
	struct tc_resp resp;
	struct buf req = BUF_INIT;
	int status;

	buf_addf(&req,
		 "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s"
		 "Content-Length: %zu\r\n\r\n%s",
		 path, extra, strlen(body), body);
	status = one_request(port, req.data, &resp) ? -1 : resp.status;
	if (status >= 400)
		CU_ASSERT_PTR_NOT_NULL(
			strstr(resp.body.data, "{\"type\":\"error\",\"error\":{\"type\":"));
	resp_release(&resp);
	buf_release(&req);
	return status;
}

/* EGR_CHECK_BODY (issue 22): from a secretless run, a body with another model, a
 * background or stored response, or no JSON object at all is refused; the upstream never
 * gets it whole (the test upstream counts only requests it read to the end). */
static void test_body_check(void)
{
	static const struct {
		const char *body;
		int want;
	} cases[] = {
		{ "{\"model\":\"claude-run\",\"max_tokens\":5,\"messages\":[]}", 200 },
		{ " {\"stream\":true, \"model\" : \"claude-run\", \"store\":false, "
		  "\"background\":null}\n",
		  200 },
		{ "{\"model\":\"claude-haiku-9-1\",\"x\":{\"model\":\"claude-run\"}}", 200 },
		{ "{\"model\":\"claude-other\",\"messages\":[]}", 403 },
		{ "{\"x\":{\"model\":\"claude-run\"},\"model\":\"gpt-5\"}", 403 },
		{ "{\"model\":\"claude-run\",\"model\":\"claude-other\"}", 403 },
		{ "{\"Model\":\"claude-other\",\"model\":\"claude-run\"}", 403 },
		{ "{\"mo\\u0064el\":\"claude-other\",\"model\":\"claude-run\"}", 400 },
		{ "{\"model\":5}", 403 },
		{ "{\"messages\":[]}", 403 },
		{ "{\"model\":\"claude-run\",\"background\":true}", 403 },
		{ "{\"model\":\"claude-run\",\"store\":true}", 403 },
		{ "{\"model\":\"claude-run\",\"previous_response_id\":\"resp_1\"}", 403 },
		{ "{\"model\":\"claude-run\",\"conversation\":\"conv_1\"}", 403 },
		{ "{\"model\":\"claude-run\",\"prompt\":{\"id\":\"pmpt_1\"}}", 403 },
		{ "{\"model\":\"claude-run\",\"prompt\":\"a text prompt\"}", 200 },
		{ "[{\"model\":\"claude-run\"}]", 400 },
		{ "{\"model\":\"claude-run\"} {\"model\":\"x\"}", 400 },
		{ "{\"model\":\"claude-run\",}", 400 },
		{ "{\"model\":\"claude-run\" /* c */}", 400 },
		{ "{'model':'claude-run'}", 400 },
		{ "{\"model\":\"claude-run\",\"n\":NaN}", 400 },
		/* Numbers as RFC 8259 writes them, not any run of their characters. */
		{ "{\"model\":\"claude-run\",\"n\":[0,-0.5,1e9,2E+3,-4.25e-1]}", 200 },
		{ "{\"model\":\"claude-run\",\"n\":-}", 400 },
		{ "{\"model\":\"claude-run\",\"n\":1-2}", 400 },
		{ "{\"model\":\"claude-run\",\"n\":01}", 400 },
		{ "{\"model\":\"claude-run\",\"n\":1.}", 400 },
		{ "{\"model\":\"claude-run\",\"n\":.5}", 400 },
		{ "{\"model\":\"claude-run\",\"n\":1e}", 400 },
		{ "{\"model\":\"claude-run\",\"n\":1e+}", 400 },
		{ "{\"model\":\"claude-run\",\"n\":+1}", 400 },
		{ "{\"model\":\"claude-run\",\"n\":1.2.3}", 400 },
		{ "{\"model\":\"claude-run\",\"n\":[1E5e5]}", 400 },
		{ "-", 400 },
		{ "{\"model\":\"claude-run\"", 400 },
		{ "model=claude-run", 400 },
	};
	const char *const allow[] = { "POST /v1/messages", NULL };
	const char *const models[] = { "claude-run", "claude-haiku-*", NULL },
			  *const no_models[] = { NULL };
	struct egr_route r = plain_route();
	struct buf big = BUF_INIT;
	struct tc_resp resp;
	struct tc t;
	uint16_t port;
	struct egr_forwarder *f;
	unsigned before;

	r.allow_paths = allow;
	r.models = models;
	r.flags = EGR_CHECK_BODY;
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		int st;

		before = tu_requests(up_plain);
		st = post_json(port, "/v1/messages", "", cases[i].body);
		if (st != cases[i].want)
			fprintf(stderr, "\n  body %zu: %d, wanted %d ", i, st, cases[i].want);
		CU_ASSERT_EQUAL(st, cases[i].want);
		CU_ASSERT_EQUAL(tu_requests(up_plain), before + (cases[i].want == 200));
	}
	/* A compressed body could hold anything. */
	before = tu_requests(up_plain);
	CU_ASSERT_EQUAL(post_json(port, "/v1/messages", "Content-Encoding: gzip\r\n",
				  "{\"model\":\"claude-run\"}"),
			415);
	/* A large body streams through checked; the refusal comes at its very end. */
	buf_adds(&big, "{\"messages\":[");
	for (int i = 0; i < 20000; i++)
		buf_addf(&big, "%s{\"role\":\"user\",\"content\":\"%d\"}", i ? "," : "", i);
	buf_adds(&big, "],\"model\":\"claude-run\"}");
	CU_ASSERT_EQUAL(post_json(port, "/v1/messages", "", big.data), 200);
	big.data[big.len - 3] = 'X';
	CU_ASSERT_EQUAL(post_json(port, "/v1/messages", "", big.data), 403);
	CU_ASSERT_EQUAL(tu_requests(up_plain), before + 1);
	/* Chunked: the other model in the second chunk, the background in the last. */
	CU_ASSERT_EQUAL_FATAL(tc_open(&t, port), 0);
	CU_ASSERT_EQUAL(tc_send(&t, "POST /v1/messages HTTP/1.1\r\nHost: x\r\n"
				    "Transfer-Encoding: chunked\r\n\r\n"
				    "a\r\n{\"model\":\"\r\n"
				    "d\r\nclaude-other\"\r\n1\r\n}\r\n0\r\n\r\n"),
			0);
	CU_ASSERT_EQUAL(tc_response(&t, &resp, false), 0);
	CU_ASSERT_EQUAL(resp.status, 403);
	CU_ASSERT_PTR_NOT_NULL(strstr(resp.body.data, "not the run's model"));
	resp_release(&resp);
	tc_close(&t);
	CU_ASSERT_EQUAL_FATAL(tc_open(&t, port), 0);
	CU_ASSERT_EQUAL(tc_send(&t, "POST /v1/messages HTTP/1.1\r\nHost: x\r\n"
				    "Transfer-Encoding: chunked\r\n\r\n"
				    "16\r\n{\"model\":\"claude-run\",\r\n"
				    "12\r\n\"background\":true}\r\n0\r\n\r\n"),
			0);
	CU_ASSERT_EQUAL(tc_response(&t, &resp, false), 0);
	CU_ASSERT_EQUAL(resp.status, 403);
	CU_ASSERT_PTR_NOT_NULL(strstr(resp.body.data, "background"));
	resp_release(&resp);
	tc_close(&t);
	CU_ASSERT_EQUAL(tu_requests(up_plain), before + 1);
	buf_release(&big);
	egr_stop(f, NULL);
	/* A list of models given empty allows none (fail closed); no list allows any. */
	r.models = no_models;
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL(post_json(port, "/v1/messages", "", "{\"model\":\"claude-run\"}"), 403);
	egr_stop(f, NULL);
	r.models = NULL;
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL(post_json(port, "/v1/messages", "", "{\"model\":\"other\"}"), 200);
	egr_stop(f, NULL);
}

/* The answers of three APIs, as SSE and JSON, through /reflect (the request's body is the
 * answer). A string that looks like a usage object in the text is not one. */
#define ANTHROPIC_SSE                                                                              \
	"event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\","     \
	"\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\r\n"  \
	"\r\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":"       \
	"{\"type\":\"text_delta\",\"text\":\"\\\"usage\\\":{\\\"input_tokens\\\":999}\"}}\n\n"     \
	"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":6}}" \
	"\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
#define RESPONSES_SSE                                                                             \
	"event: response.created\ndata: "                                                         \
	"{\"type\":\"response.created\",\"response\":{\"id\":\"r\","                              \
	"\"usage\":null}}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\","  \
	"\"response\":{\"id\":\"r\",\"output\":[{\"content\":[{\"text\":\"hi\"}]}],\"usage\":{"   \
	"\"input_tokens\":20,\"input_tokens_details\":{\"cached_tokens\":4},\"output_tokens\":7," \
	"\"total_tokens\":27}}}\n\n"
#define CHAT_JSON                                                                           \
	"{\"object\":\"chat.completion\",\"choices\":[{\"message\":{\"content\":\"hi\"}}]," \
	"\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}"

static void reflect(uint16_t port, const char *path, const char *answer)
{
	struct tc_resp resp;
	struct buf req = BUF_INIT;

	buf_addf(&req, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s", path,
		 strlen(answer), answer);
	CU_ASSERT_EQUAL(one_request(port, req.data, &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 200);
	/* Passed on unchanged. */
	CU_ASSERT_EQUAL(resp.body.len, strlen(answer));
	CU_ASSERT(resp.body.len == strlen(answer) &&
		  !memcmp(resp.body.data, answer, resp.body.len));
	resp_release(&resp);
	buf_release(&req);
}

/* Every answer's usage is counted as it goes by (issue 22): the ledger no longer depends
 * on the run's CLI reporting what the run spent. */
static void test_usage(void)
{
	struct egr_route r = plain_route();
	struct egr_usage mid;
	struct egr_stats st;
	uint16_t port;
	struct egr_forwarder *f = fwd(&r, NULL, &port);

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	/* In pieces of 7 bytes: the events are split anywhere. */
	reflect(port, "/reflect?sse=1&piece=7", ANTHROPIC_SSE);
	egr_usage_get(f, &mid);
	CU_ASSERT_EQUAL(mid.answers, 1);
	CU_ASSERT_EQUAL(mid.input_tokens, 15);
	CU_ASSERT_EQUAL(mid.output_tokens, 6);
	CU_ASSERT_EQUAL(mid.cached_tokens, 5);
	reflect(port, "/reflect?sse=1", RESPONSES_SSE);
	reflect(port, "/reflect?piece=5", CHAT_JSON);
	/* Not JSON, or no usage: nothing. */
	reflect(port, "/reflect?sse=1", "data: [DONE]\n\ndata: {\"usage\":\n\n");
	reflect(port, "/reflect", "{\"usage\":\"many\"}");
	egr_stop(f, &st);
	CU_ASSERT_EQUAL(st.usage.answers, 3);
	CU_ASSERT_EQUAL(st.usage.input_tokens, 15 + 20 + 3);
	CU_ASSERT_EQUAL(st.usage.output_tokens, 6 + 7 + 2);
	CU_ASSERT_EQUAL(st.usage.cached_tokens, 5 + 4);
}

/* An answer that calls a tool of the route's stop prefix: streamed (in pieces of 7
 * bytes, split anywhere), a text block first, then the call. */
#define TOOL_SSE(name)                                                                             \
	"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\"}}\n\n"  \
	"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"         \
	"\"content_block\":{\"type\":\"text\",\"text\":\"\\\"name\\\":\\\"mcp__olp__x\\\"\"}}\n\n" \
	"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,"         \
	"\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"" name "\","       \
	"\"input\":{}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":"     \
	"{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":6}}\n\n"

/* route.stop_after_tool (ADR 0019): once an answer called one of the client's tools, the
 * CLI's next request (it would ask the model again) never reaches the upstream; another
 * tool (claude's own), a name in the text, or no call leaves the run's requests alone. */
static void test_stop_after_tool(void)
{
	struct egr_route r = plain_route();
	const char *others[] = { TOOL_SSE("ToolSearch"), TOOL_SSE("mcp__olp__"),
				 TOOL_SSE("mcp__other__x") };
	struct egr_stats st;
	struct egr_forwarder *f;
	uint16_t port;
	unsigned before;

	r.stop_after_tool = "mcp__olp__";
	for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
		f = fwd(&r, NULL, &port);
		CU_ASSERT_PTR_NOT_NULL_FATAL(f);
		reflect(port, "/reflect?sse=1&piece=7", others[i]);
		CU_ASSERT_EQUAL(post_json(port, "/v1/messages", "", "{\"model\":\"m\"}"), 200);
		egr_stop(f, NULL);
	}
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	reflect(port, "/reflect?sse=1&piece=7", TOOL_SSE("mcp__olp__get_weather"));
	before = tu_requests(up_plain);
	CU_ASSERT_EQUAL(post_json(port, "/v1/messages", "", "{\"model\":\"m\"}"), 403);
	CU_ASSERT_EQUAL(post_json(port, "/v1/messages?beta=true", "", "{}"), 403);
	CU_ASSERT_EQUAL(tu_requests(up_plain), before);
	egr_stop(f, &st);
	CU_ASSERT_EQUAL(st.refused, 2);
	CU_ASSERT_EQUAL(st.usage.output_tokens, 6); /* the answer was still read for its usage */
	/* Without the prefix, the same answer stops nothing. */
	r.stop_after_tool = NULL;
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	reflect(port, "/reflect?sse=1", TOOL_SSE("mcp__olp__get_weather"));
	CU_ASSERT_EQUAL(post_json(port, "/v1/messages", "", "{\"model\":\"m\"}"), 200);
	egr_stop(f, NULL);
}

/* A reflecting upstream (issue 22: the injected key came back into the run): the headers
 * that hold the credential are dropped, and every copy in a body is masked, also when a
 * copy is split between two pieces of the answer. */
static void test_echo(void)
{
	const char *key = "sk-ant-api03-REALabcdef0123456789";
	const struct egr_header set[] = { { "x-api-key", key },
					  { "authorization",
					    "Bearer sk-proj-REAL9876543210fedcba" },
					  { "anthropic-version", "2023-06-01" } };
	struct egr_route r = plain_route();
	struct tc_resp resp;
	uint16_t port;
	struct egr_forwarder *f;

	r.set_headers = set;
	r.n_set_headers = ARRAY_SIZE(set);
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	for (int piece = 0; piece <= 7; piece += 7) {
		char req[128];

		snprintf(req, sizeof(req), "GET /echo%s HTTP/1.1\r\nHost: x\r\n\r\n",
			 piece ? "?piece=7" : "");
		CU_ASSERT_EQUAL(one_request(port, req, &resp), 0);
		CU_ASSERT_EQUAL(resp.status, 200);
		CU_ASSERT_PTR_NOT_NULL(strstr(resp.body.data, "method=GET"));
		CU_ASSERT_PTR_NULL(strstr(resp.body.data, "REAL"));
		CU_ASSERT_PTR_NOT_NULL(
			strstr(resp.body.data, "x-api-key: *********************************\r\n"));
		CU_ASSERT_PTR_NOT_NULL(strstr(resp.body.data, "authorization: Bearer "
							      "****************************\r\n"));
		/* A short value is no secret: left alone. */
		CU_ASSERT_PTR_NOT_NULL(strstr(resp.body.data, "anthropic-version: 2023-06-01"));
		resp_release(&resp);
	}
	/* An answer header that echoes it is dropped. */
	CU_ASSERT_EQUAL(one_request(port,
				    "POST /reflect HTTP/1.1\r\nHost: x\r\n"
				    "Content-Length: 2\r\n\r\n{}",
				    &resp),
			0);
	CU_ASSERT_EQUAL(resp.status, 200);
	CU_ASSERT_PTR_NULL(strstr(resp.head.data, "REAL"));
	CU_ASSERT_PTR_NULL(strcasestr(resp.head.data, "x-echo"));
	CU_ASSERT_STRING_EQUAL(resp.body.data, "{}");
	resp_release(&resp);
	egr_stop(f, NULL);
}

static void test_body_cap(void)
{
	struct egr_route r = plain_route();
	struct egr_limits l = { .max_body_bytes = 1000 };
	struct tc_resp resp;
	struct buf req = BUF_INIT;
	unsigned before = tu_requests(up_plain);
	uint16_t port;
	struct egr_forwarder *f = fwd(&r, &l, &port);

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	/* Announced too large: refused before anything is sent on. */
	CU_ASSERT_EQUAL(one_request(port,
				    "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n",
				    &resp),
			0);
	CU_ASSERT_EQUAL(resp.status, 413);
	CU_ASSERT_PTR_NOT_NULL(strstr(resp.body.data, "request_too_large"));
	resp_release(&resp);
	CU_ASSERT_EQUAL(tu_requests(up_plain), before);
	/* Chunked, growing past the cap. */
	buf_adds(&req, "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n258\r\n");
	for (int i = 0; i < 600; i++)
		buf_addch(&req, 'a');
	buf_adds(&req, "\r\n258\r\n");
	for (int i = 0; i < 600; i++)
		buf_addch(&req, 'a');
	buf_adds(&req, "\r\n0\r\n\r\n");
	CU_ASSERT_EQUAL(one_request(port, req.data, &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 413);
	resp_release(&resp);
	/* Exactly the cap: fine. */
	buf_reset(&req);
	buf_adds(&req, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n");
	for (int i = 0; i < 1000; i++)
		buf_addch(&req, 'a');
	CU_ASSERT_EQUAL(one_request(port, req.data, &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 200);
	CU_ASSERT_PTR_NOT_NULL(strstr(resp.body.data, "body=1000\n"));
	resp_release(&resp);
	buf_release(&req);
	egr_stop(f, NULL);
}

static void test_keep_alive(void)
{
	struct egr_route r = plain_route();
	struct tc_resp resp;
	unsigned conns = tu_connections(up_plain);
	char v[64];
	uint16_t port;
	struct egr_forwarder *f = fwd(&r, NULL, &port);
	struct tc t;

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL_FATAL(tc_open(&t, port), 0);
	for (int i = 0; i < 3; i++) {
		CU_ASSERT_EQUAL(tc_send(&t, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"), 0);
		CU_ASSERT_EQUAL(tc_response(&t, &resp, false), 0);
		CU_ASSERT_EQUAL(resp.status, 200);
		CU_ASSERT_PTR_NULL(resp_header(&resp, "connection", v, sizeof(v)));
		CU_ASSERT_PTR_NOT_NULL(resp_header(&resp, "keep-alive", v, sizeof(v)));
		resp_release(&resp);
	}
	/* Two requests in one write (pipelined): answered in order. */
	CU_ASSERT_EQUAL(
		tc_send(&t, "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"),
		0);
	CU_ASSERT_EQUAL(tc_response(&t, &resp, false), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(resp.body.data, "path=/a\n"));
	resp_release(&resp);
	CU_ASSERT_EQUAL(tc_response(&t, &resp, false), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(resp.body.data, "path=/b\n"));
	resp_release(&resp);
	/* One client connection, one upstream connection: libcurl kept it too. */
	CU_ASSERT_EQUAL(tu_connections(up_plain), conns + 1);
	/* Connection: close is honoured. */
	CU_ASSERT_EQUAL(tc_send(&t, "GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
			0);
	CU_ASSERT_EQUAL(tc_response(&t, &resp, false), 0);
	CU_ASSERT_PTR_NOT_NULL(resp_header(&resp, "connection", v, sizeof(v)));
	CU_ASSERT_STRING_EQUAL(v, "close");
	CU_ASSERT_TRUE(closed_within(&t, 2000));
	resp_release(&resp);
	tc_close(&t);
	/* HTTP/1.0 without keep-alive: closed after the answer. */
	CU_ASSERT_EQUAL_FATAL(tc_open(&t, port), 0);
	CU_ASSERT_EQUAL(tc_send(&t, "GET /echo HTTP/1.0\r\n\r\n"), 0);
	CU_ASSERT_EQUAL(tc_response(&t, &resp, false), 0);
	CU_ASSERT_EQUAL(resp.status, 200);
	CU_ASSERT_TRUE(closed_within(&t, 2000));
	resp_release(&resp);
	tc_close(&t);
	egr_stop(f, NULL);
}

/* A chunk the upstream sends after a pause reaches the client before the upstream's end,
 * with the upstream's pauses between chunks. */
static void check_stream(uint16_t port, const char *path)
{
	struct tc_resp resp;
	char req[256];
	uint64_t t0;
	struct tc t;

	snprintf(req, sizeof(req),
		 "GET %s HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n", path);
	CU_ASSERT_EQUAL_FATAL(tc_open(&t, port), 0);
	t0 = mono_ms();
	CU_ASSERT_EQUAL(tc_send(&t, req), 0);
	CU_ASSERT_EQUAL(tc_response(&t, &resp, false), 0);
	CU_ASSERT_EQUAL(resp.status, 200);
	CU_ASSERT_TRUE(resp.chunked);
	CU_ASSERT_STRING_EQUAL(resp.body.data, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\n");
	CU_ASSERT_EQUAL(resp.n_chunks, 4);
	if (resp.n_chunks == 4) {
		/* The first event at once, not after the upstream's end (3 x 250 ms), and
		 * the events spread over the upstream's time: a buffering forwarder
		 * delivers all four together at ~750 ms. Lower bounds only, so that a
		 * loaded machine cannot fail it. */
		uint64_t first = resp.chunk_ms[0] - t0,
			 spread = resp.chunk_ms[3] - resp.chunk_ms[0];

		CU_ASSERT(first < 500);
		CU_ASSERT(spread >= 400);
		if (first >= 500 || spread < 400)
			fprintf(stderr, "\n  first event after %llu ms, spread %llu ms ",
				(unsigned long long)first, (unsigned long long)spread);
	}
	resp_release(&resp);
	/* The connection stays usable: a response without a length is chunked to us. */
	CU_ASSERT_EQUAL(tc_send(&t, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"), 0);
	CU_ASSERT_EQUAL(tc_response(&t, &resp, false), 0);
	CU_ASSERT_EQUAL(resp.status, 200);
	resp_release(&resp);
	tc_close(&t);
}

static void test_streaming(void)
{
	struct egr_route r = plain_route();
	uint16_t port;
	struct egr_forwarder *f = fwd(&r, NULL, &port);

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	check_stream(port, "/stream?n=4&gap=250");
	/* An upstream that sends no length and closes at the end (HTTP/1.0 style). */
	check_stream(port, "/stream?n=4&gap=250&close=1");
	/* An HTTP/1.0 client cannot take chunks: the body as it comes, then the close. */
	{
		struct tc_resp resp;
		struct tc t;
		char v[64];

		CU_ASSERT_EQUAL_FATAL(tc_open(&t, port), 0);
		CU_ASSERT_EQUAL(tc_send(&t, "GET /stream?n=3&gap=50 HTTP/1.0\r\n\r\n"), 0);
		CU_ASSERT_EQUAL(tc_response(&t, &resp, false), 0);
		CU_ASSERT_EQUAL(resp.status, 200);
		CU_ASSERT_FALSE(resp.chunked);
		CU_ASSERT_PTR_NULL(resp_header(&resp, "content-length", v, sizeof(v)));
		CU_ASSERT_STRING_EQUAL(resp.body.data, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
		resp_release(&resp);
		tc_close(&t);
	}
	egr_stop(f, NULL);
}

/* Several clients at once, each with its own keep-alive connection, requests and a
 * stream interleaved: every answer whole and in order. */
#define N_CLIENTS 6
static uint16_t conc_port;

static void *conc_client(void *arg)
{
	intptr_t id = (intptr_t)arg, bad = 0;
	struct tc_resp resp;
	char req[128], want[64];
	struct tc t;

	if (tc_open(&t, conc_port))
		return (void *)1;
	for (int i = 0; i < 20 && !bad; i++) {
		snprintf(req, sizeof(req), "GET /c%ld/%d HTTP/1.1\r\nHost: x\r\n\r\n", (long)id, i);
		snprintf(want, sizeof(want), "path=/c%ld/%d\n", (long)id, i);
		if (i == 10)
			snprintf(req, sizeof(req),
				 "GET /stream?n=3&gap=30 HTTP/1.1\r\nHost: x\r\n\r\n");
		bad = tc_send(&t, req) || tc_response(&t, &resp, false) || resp.status != 200 ||
		      (i != 10 && !strstr(resp.body.data, want)) ||
		      (i == 10 && strcmp(resp.body.data, "data: 0\n\ndata: 1\n\ndata: 2\n\n"));
		resp_release(&resp);
	}
	tc_close(&t);
	return (void *)bad;
}

static void test_concurrent(void)
{
	struct egr_route r = plain_route();
	struct egr_stats st;
	pthread_t th[N_CLIENTS];
	struct egr_forwarder *f = fwd(&r, NULL, &conc_port);

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	for (intptr_t i = 0; i < N_CLIENTS; i++)
		CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, conc_client, (void *)i), 0);
	for (int i = 0; i < N_CLIENTS; i++) {
		void *bad;

		pthread_join(th[i], &bad);
		CU_ASSERT_PTR_NULL(bad);
	}
	egr_stop(f, &st);
	CU_ASSERT_EQUAL(st.conns, N_CLIENTS);
	CU_ASSERT_EQUAL(st.requests, (uint64_t)N_CLIENTS * 20);
}

static void test_https(void)
{
	struct egr_route r = { .mode = EGR_MODE_UPSTREAM,
			       .upstream = upstream_tls_url,
			       .flags = EGR_ANY_PATH };
	struct tc_resp resp;
	uint16_t port;
	struct egr_forwarder *f;

	if (!have_tls) {
		CU_FAIL("no test CA (the openssl command failed): HTTPS untested");
		return;
	}
	/* Against the test CA: works, streaming included. */
	r.ca_file = ca_path;
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL(one_request(port, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 200);
	CU_ASSERT_PTR_NOT_NULL(strstr(resp.body.data, "path=/echo\n"));
	resp_release(&resp);
	check_stream(port, "/stream?n=4&gap=250");
	egr_stop(f, NULL);
	/* Against the system store, which does not know the test CA: refused, 502. */
	r.ca_file = NULL;
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL(one_request(port, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 502);
	resp_release(&resp);
	egr_stop(f, NULL);
}

static void test_unreachable(void)
{
	struct egr_route r = { .mode = EGR_MODE_UPSTREAM, .flags = EGR_ANY_PATH };
	struct egr_stats st;
	struct tc_resp resp;
	char url[64];
	uint16_t port, dead = 0;
	int fd = listener(&dead), fds;
	struct egr_forwarder *f;

	close(fd); /* nothing listens there now */
	snprintf(url, sizeof(url), "http://127.0.0.1:%u", dead);
	r.upstream = url;
	fds = ts_count_fds();
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL(one_request(port, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 502);
	CU_ASSERT_PTR_NOT_NULL(strstr(resp.body.data, "\"type\":\"api_error\""));
	resp_release(&resp);
	egr_stop(f, &st);
	CU_ASSERT_EQUAL(st.upstream_errors, 1);
	/* Nothing left open: listener, eventfd, client and upstream sockets. */
	CU_ASSERT_EQUAL(ts_count_fds(), fds);
}

static void test_malformed(void)
{
	struct egr_route r = plain_route();
	struct egr_limits l = { .max_header_bytes = 4096 };
	struct buf big = BUF_INIT;
	struct tc_resp resp;
	unsigned before = tu_requests(up_plain);
	uint16_t port;
	struct egr_forwarder *f = fwd(&r, &l, &port);
	static const struct {
		const char *req;
		int status;
	} cases[] = {
		{ "GET /echo HTTP/1.1\r\nHost: x\r\n Folded: y\r\n\r\n", 400 },
		{ "GET /echo HTTP/1.1\r\nHost : x\r\n\r\n", 400 },
		{ "POST /echo HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
		  400 },
		{ "POST /echo HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501 },
		{ "POST /echo HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
		  400 },
		{ "POST /echo HTTP/1.1\r\nContent-Length: -3\r\n\r\n", 400 },
		{ "GET /echo HTTP/2.0\r\n\r\n", 505 },
		{ "GET /echo\r\n\r\n", 400 },
		{ "GET /echo HTTP/1.1\r\nX: a\001b\r\n\r\n", 400 },
		{ "GET /echo HTTP/1.1\r\nExpect: something\r\n\r\n", 417 },
		{ "CONNECT example.com:443 HTTP/1.1\r\n\r\n", 405 },
		{ "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400 },
	};

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		CU_ASSERT_EQUAL(one_request(port, cases[i].req, &resp), 0);
		if (resp.status != cases[i].status)
			fprintf(stderr, "\n  case %zu: %d, wanted %d ", i, resp.status,
				cases[i].status);
		CU_ASSERT_EQUAL(resp.status, cases[i].status);
		resp_release(&resp);
	}
	/* A head over the cap: 431. */
	buf_adds(&big, "GET /echo HTTP/1.1\r\n");
	for (int i = 0; i < 100; i++)
		buf_addf(&big, "X-Filler-%d: %0100d\r\n", i, 0);
	buf_adds(&big, "\r\n");
	CU_ASSERT_EQUAL(one_request(port, big.data, &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 431);
	resp_release(&resp);
	buf_release(&big);
	CU_ASSERT_EQUAL(tu_requests(up_plain), before);
	egr_stop(f, NULL);
}

static void test_max_conns(void)
{
	struct egr_route r = plain_route();
	struct egr_limits l = { .max_conns = 2 };
	struct tc a, b, c;
	struct tc_resp resp;
	uint16_t port;
	struct egr_forwarder *f = fwd(&r, &l, &port);

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL_FATAL(tc_open(&a, port), 0);
	CU_ASSERT_EQUAL_FATAL(tc_open(&b, port), 0);
	(void)poll(NULL, 0, 100); /* both accepted */
	CU_ASSERT_EQUAL_FATAL(tc_open(&c, port), 0);
	CU_ASSERT_EQUAL(tc_response(&c, &resp, false), 0);
	CU_ASSERT_EQUAL(resp.status, 503);
	resp_release(&resp);
	tc_close(&c);
	/* One ends: room again. */
	tc_close(&a);
	(void)poll(NULL, 0, 100);
	CU_ASSERT_EQUAL(one_request(port, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 200);
	resp_release(&resp);
	tc_close(&b);
	egr_stop(f, NULL);
}

/* ---- connect mode ------------------------------------------------------------------- */

static void test_connect(void)
{
	char allowed[64], upper[64], req[256];
	const char *hosts[] = { allowed, "api.anthropic.com:443", NULL };
	struct egr_route r = { .mode = EGR_MODE_CONNECT,
			       .request_id = "test-connect",
			       .allow_hosts = hosts,
			       .flags = EGR_ALLOW_LOCAL_TARGETS };
	struct egr_stats st;
	struct tc_resp resp;
	uint16_t port;
	struct egr_forwarder *f;
	struct tc t;

	snprintf(allowed, sizeof(allowed), "localhost:%u", tu_port(up_plain));
	snprintf(upper, sizeof(upper), "LocalHost:%u", tu_port(up_plain));
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	/* Allowed (the name compared without case): the tunnel carries HTTP both ways. */
	for (int i = 0; i < 2; i++) {
		CU_ASSERT_EQUAL_FATAL(tc_open(&t, port), 0);
		snprintf(req, sizeof(req), "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n",
			 i ? upper : allowed, allowed);
		CU_ASSERT_EQUAL(tc_send(&t, req), 0);
		CU_ASSERT_EQUAL(tc_response(&t, &resp, true), 0);
		CU_ASSERT_EQUAL(resp.status, 200);
		resp_release(&resp);
		CU_ASSERT_EQUAL(tc_send(&t, "GET /through HTTP/1.1\r\nHost: x\r\n\r\n"), 0);
		CU_ASSERT_EQUAL(tc_response(&t, &resp, false), 0);
		CU_ASSERT_EQUAL(resp.status, 200);
		CU_ASSERT_PTR_NOT_NULL(strstr(resp.body.data, "path=/through\n"));
		resp_release(&resp);
		tc_close(&t);
	}
	/* A raw IP (even of the allowed host), an unlisted host, another port: 403. */
	snprintf(req, sizeof(req), "CONNECT 127.0.0.1:%u HTTP/1.1\r\n\r\n", tu_port(up_plain));
	CU_ASSERT_EQUAL(one_request(port, req, &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 403);
	resp_release(&resp);
	snprintf(req, sizeof(req), "CONNECT 2130706433:%u HTTP/1.1\r\n\r\n", tu_port(up_plain));
	CU_ASSERT_EQUAL(one_request(port, req, &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 403);
	resp_release(&resp);
	snprintf(req, sizeof(req), "CONNECT [::1]:%u HTTP/1.1\r\n\r\n", tu_port(up_plain));
	CU_ASSERT_EQUAL(one_request(port, req, &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 403);
	resp_release(&resp);
	CU_ASSERT_EQUAL(one_request(port, "CONNECT evil.example:443 HTTP/1.1\r\n\r\n", &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 403);
	resp_release(&resp);
	CU_ASSERT_EQUAL(one_request(port, "CONNECT localhost:1 HTTP/1.1\r\n\r\n", &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 403);
	resp_release(&resp);
	/* Plain proxy requests are no way around it. */
	CU_ASSERT_EQUAL(one_request(port, "GET http://localhost/ HTTP/1.1\r\n\r\n", &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 405);
	resp_release(&resp);
	egr_stop(f, &st);
	CU_ASSERT_EQUAL(st.requests, 2);
	CU_ASSERT_EQUAL(st.refused, 6);

	/* Without EGR_ALLOW_LOCAL_TARGETS a listed name that resolves to this machine
	 * reaches nothing. */
	r.flags = 0;
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	snprintf(req, sizeof(req), "CONNECT %s HTTP/1.1\r\n\r\n", allowed);
	CU_ASSERT_EQUAL(one_request(port, req, &resp), 0);
	CU_ASSERT_EQUAL(resp.status, 403);
	resp_release(&resp);
	egr_stop(f, NULL);
}

static size_t curl_sink(char *p, size_t size, size_t n, void *ud)
{
	buf_add(ud, p, size * n);
	return size * n;
}

/* A real TLS client (libcurl, as HTTPS_PROXY users do) through the tunnel. */
static void test_connect_tls(void)
{
	char allowed[64], proxy[64], url[96];
	const char *hosts[] = { allowed, NULL };
	struct egr_route r = { .mode = EGR_MODE_CONNECT,
			       .allow_hosts = hosts,
			       .flags = EGR_ALLOW_LOCAL_TARGETS };
	struct buf body = BUF_INIT;
	long code = 0;
	uint16_t port;
	struct egr_forwarder *f;
	CURL *e;

	if (!have_tls) {
		CU_FAIL("no test CA: TLS through CONNECT untested");
		return;
	}
	snprintf(allowed, sizeof(allowed), "localhost:%u", tu_port(up_tls));
	f = fwd(&r, NULL, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	snprintf(proxy, sizeof(proxy), "http://127.0.0.1:%u", port);
	snprintf(url, sizeof(url), "https://localhost:%u/tls-through", tu_port(up_tls));
	e = curl_easy_init();
	CU_ASSERT_PTR_NOT_NULL_FATAL(e);
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_PROXY, proxy);
	curl_easy_setopt(e, CURLOPT_HTTPPROXYTUNNEL, 1L);
	curl_easy_setopt(e, CURLOPT_CAINFO, ca_path);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, curl_sink);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, &body);
	curl_easy_setopt(e, CURLOPT_TIMEOUT, 10L);
	CU_ASSERT_EQUAL(curl_easy_perform(e), CURLE_OK);
	curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
	CU_ASSERT_EQUAL(code, 200);
	CU_ASSERT_PTR_NOT_NULL(strstr(body.data, "path=/tls-through\n"));
	curl_easy_cleanup(e);
	buf_release(&body);
	egr_stop(f, NULL);
}

/* ---- deadline and stop ------------------------------------------------------------ */

static void test_deadline(void)
{
	char allowed[64], req[128];
	const char *hosts[] = { allowed, NULL };
	struct egr_route r = plain_route();
	struct egr_route rc = { .mode = EGR_MODE_CONNECT,
				.allow_hosts = hosts,
				.flags = EGR_ALLOW_LOCAL_TARGETS };
	struct egr_limits l = { .deadline_ms = mono_ms() + 700 };
	struct tc_resp resp;
	uint64_t t0 = mono_ms(), t1;
	uint16_t port, cport;
	struct egr_forwarder *f = fwd(&r, &l, &port), *fc;
	struct tc t, idle, tun;

	snprintf(allowed, sizeof(allowed), "localhost:%u", tu_port(up_plain));
	fc = fwd(&rc, &l, &cport);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(fc);
	/* An idle keep-alive connection, a tunnel, and a stream that would last 2 s. */
	CU_ASSERT_EQUAL_FATAL(tc_open(&idle, port), 0);
	CU_ASSERT_EQUAL_FATAL(tc_open(&tun, cport), 0);
	snprintf(req, sizeof(req), "CONNECT %s HTTP/1.1\r\n\r\n", allowed);
	CU_ASSERT_EQUAL(tc_send(&tun, req), 0);
	CU_ASSERT_EQUAL(tc_response(&tun, &resp, true), 0);
	CU_ASSERT_EQUAL(resp.status, 200);
	resp_release(&resp);
	CU_ASSERT_EQUAL_FATAL(tc_open(&t, port), 0);
	CU_ASSERT_EQUAL(tc_send(&t, "GET /stream?n=20&gap=100 HTTP/1.1\r\nHost: x\r\n\r\n"), 0);
	/* Cut at the deadline: some events came, never the end. */
	CU_ASSERT_EQUAL(tc_response(&t, &resp, false), -1);
	t1 = mono_ms();
	CU_ASSERT(resp.n_chunks >= 3 && resp.n_chunks < 20);
	CU_ASSERT(t1 - t0 >= 600 && t1 - t0 < 1900);
	if (resp.n_chunks < 3 || resp.n_chunks >= 20 || t1 - t0 < 600 || t1 - t0 >= 1900)
		fprintf(stderr, "\n  %d events, cut after %llu ms ", resp.n_chunks,
			(unsigned long long)(t1 - t0));
	resp_release(&resp);
	CU_ASSERT_TRUE(closed_within(&idle, 500));
	CU_ASSERT_TRUE(closed_within(&tun, 500));
	/* The listener is closed too: nothing more gets in. */
	tc_close(&t);
	CU_ASSERT_TRUE(refused_within(port, 500));
	tc_close(&idle);
	tc_close(&tun);
	t0 = mono_ms();
	egr_stop(f, NULL);
	egr_stop(fc, NULL);
	/* Everything ended at the deadline already: nothing to wait for. */
	CU_ASSERT(mono_ms() - t0 < 1000);
}

static void test_stop_is_prompt(void)
{
	struct egr_route r = plain_route();
	uint64_t t0;
	uint16_t port;
	struct egr_forwarder *f = fwd(&r, NULL, &port);
	struct tc hang, idle, partial;

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	/* One waiting for an upstream that never answers, one idle, one mid-head. */
	CU_ASSERT_EQUAL_FATAL(tc_open(&hang, port), 0);
	CU_ASSERT_EQUAL(tc_send(&hang, "GET /hang HTTP/1.1\r\nHost: x\r\n\r\n"), 0);
	CU_ASSERT_EQUAL_FATAL(tc_open(&idle, port), 0);
	CU_ASSERT_EQUAL_FATAL(tc_open(&partial, port), 0);
	CU_ASSERT_EQUAL(tc_send(&partial, "POST /x HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"), 0);
	(void)poll(NULL, 0, 200);
	t0 = mono_ms();
	egr_stop(f, NULL);
	/* The upstream never answers: without the stop signal this would not end. */
	CU_ASSERT(mono_ms() - t0 < 1000);
	CU_ASSERT_TRUE(closed_within(&hang, 1000));
	CU_ASSERT_TRUE(closed_within(&idle, 1000));
	CU_ASSERT_TRUE(closed_within(&partial, 1000));
	tc_close(&hang);
	tc_close(&idle);
	tc_close(&partial);
}

/* ---- the route and the logs --------------------------------------------------------- */

static void test_route_check(void)
{
	/* An address is listed on purpose (test_connect_addrs.c has the details). */
	const char *ip_hosts[] = { "1.2.3.4:443", NULL }, *short_ip[] = { "127.1:80", NULL },
		   *no_port[] = { "api.example.com", NULL }, *bad_port[] = { "a.example:0", NULL },
		   *v6[] = { "[::1]:443", NULL }, *ok_hosts[] = { "api.example.com:443", NULL },
		   *any_ip[] = { "0.0.0.0:443", NULL }, *v6_no_port[] = { "[::1]", NULL },
		   *bad_path[] = { "POST /v1/../admin", NULL },
		   *ok_path[] = { "POST /v1/messages", "GET /v1/models/*", NULL },
		   *no_method[] = { "/v1/messages", NULL }, *trace[] = { "TRACE /v1/x", NULL },
		   *connect[] = { "CONNECT /v1/x", NULL }, *mid_star[] = { "GET /v1/*/x", NULL },
		   *query[] = { "POST /v1/messages?beta=true", NULL },
		   *empty_model[] = { "", NULL };
	/* A port is digits only (found by fuzz_egress). */
	const char *signed_port[] = { "a.example:+443", NULL };
	const struct egr_header crlf[] = { { "x-api-key", "a\r\nx-evil: 1" } },
				bad_name[] = { { "x api key", "v" } };
	struct {
		struct egr_route r;
		int ok;
	} cases[] = {
		{ { .mode = EGR_MODE_UPSTREAM, .upstream = "https://api.example.com" }, 1 },
		{ { .mode = EGR_MODE_UPSTREAM, .upstream = "http://127.0.0.1:8080/base/" }, 1 },
		{ { .mode = EGR_MODE_UPSTREAM,
		    .upstream = "https://a.example",
		    .allow_paths = ok_path },
		  1 },
		{ { .mode = EGR_MODE_UPSTREAM, .upstream = NULL }, 0 },
		{ { .mode = EGR_MODE_UPSTREAM, .upstream = "ftp://a.example" }, 0 },
		{ { .mode = EGR_MODE_UPSTREAM, .upstream = "https://user:pw@a.example" }, 0 },
		{ { .mode = EGR_MODE_UPSTREAM, .upstream = "https://a.example/?q=1" }, 0 },
		{ { .mode = EGR_MODE_UPSTREAM, .upstream = "not a url" }, 0 },
		{ { .mode = EGR_MODE_UPSTREAM,
		    .upstream = "https://a.example",
		    .set_headers = crlf,
		    .n_set_headers = 1 },
		  0 },
		{ { .mode = EGR_MODE_UPSTREAM,
		    .upstream = "https://a.example",
		    .set_headers = bad_name,
		    .n_set_headers = 1 },
		  0 },
		{ { .mode = EGR_MODE_UPSTREAM,
		    .upstream = "https://a.example",
		    .allow_paths = bad_path },
		  0 },
		{ { .mode = EGR_MODE_UPSTREAM, .upstream = "https://a", .allow_paths = no_method },
		  0 },
		{ { .mode = EGR_MODE_UPSTREAM, .upstream = "https://a", .allow_paths = trace }, 0 },
		{ { .mode = EGR_MODE_UPSTREAM, .upstream = "https://a", .allow_paths = connect },
		  0 },
		{ { .mode = EGR_MODE_UPSTREAM, .upstream = "https://a", .allow_paths = mid_star },
		  0 },
		{ { .mode = EGR_MODE_UPSTREAM, .upstream = "https://a", .allow_paths = query }, 0 },
		{ { .mode = EGR_MODE_UPSTREAM, .upstream = "https://a", .models = empty_model },
		  0 },
		{ { .mode = EGR_MODE_CONNECT, .allow_hosts = ok_hosts }, 1 },
		{ { .mode = EGR_MODE_CONNECT, .allow_hosts = NULL }, 0 },
		{ { .mode = EGR_MODE_CONNECT, .allow_hosts = ip_hosts }, 1 },
		{ { .mode = EGR_MODE_CONNECT, .allow_hosts = short_ip }, 0 },
		{ { .mode = EGR_MODE_CONNECT, .allow_hosts = no_port }, 0 },
		{ { .mode = EGR_MODE_CONNECT, .allow_hosts = bad_port }, 0 },
		{ { .mode = EGR_MODE_CONNECT, .allow_hosts = v6 }, 1 },
		{ { .mode = EGR_MODE_CONNECT, .allow_hosts = any_ip }, 0 },
		{ { .mode = EGR_MODE_CONNECT, .allow_hosts = v6_no_port }, 0 },
		{ { .mode = EGR_MODE_CONNECT, .allow_hosts = signed_port }, 0 },
	};

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		const char *why = NULL;
		int rc = egr_route_check(&cases[i].r, &why);

		if ((rc == 0) != cases[i].ok)
			fprintf(stderr, "\n  case %zu: %d (%s) ", i, rc, why ? why : "");
		CU_ASSERT_EQUAL(rc == 0, cases[i].ok);
		if (!cases[i].ok) {
			CU_ASSERT_EQUAL(rc, -EINVAL);
			CU_ASSERT_PTR_NOT_NULL(why);
		}
	}
	/* egr_start refuses the same, and closes the listener it was given. */
	{
		uint16_t port;
		int fd = listener(&port);

		errno = 0;
		CU_ASSERT_PTR_NULL(egr_start(fd, &cases[4].r, NULL));
		CU_ASSERT_EQUAL(errno, EINVAL);
		CU_ASSERT_EQUAL(fcntl(fd, F_GETFD), -1);
	}
}

struct logged {
	struct egr_forwarder *f;
	uint16_t port;
};

/* Two requests, then the stop: every line the forwarder's threads log is in by then. */
static void logged_request(void *arg)
{
	struct logged *l = arg;
	struct tc_resp resp;
	uint16_t port = l->port;

	(void)one_request(
		port,
		"POST /v1/messages?key=query-secret HTTP/1.1\r\nHost: x\r\n"
		"x-api-key: placeholder-SECRET\r\nAuthorization: Bearer olp-token-SECRET\r\n"
		"Content-Length: 13\r\n\r\nprompt-SECRET",
		&resp);
	resp_release(&resp);
	(void)one_request(port, "GET /denied?key=query-secret HTTP/1.1\r\nHost: x\r\n\r\n", &resp);
	resp_release(&resp);
	egr_stop(l->f, NULL);
}

static void test_no_secrets_logged(void)
{
	const struct egr_header set[] = { { "x-api-key", "sk-real-SECRET" } };
	const char *const allow[] = { "POST /v1/messages", NULL };
	struct egr_route r = plain_route();
	struct buf log = BUF_INIT;
	char path[300];
	struct logged l;

	r.set_headers = set;
	r.n_set_headers = 1;
	r.allow_paths = allow;
	r.flags = 0;
	l.f = fwd(&r, NULL, &l.port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(l.f);
	snprintf(path, sizeof(path), "%s/log", tmpdir);
	log_set_level(LOG_LVL_DEBUG);
	CU_ASSERT_EQUAL(ts_capture_stderr(path, logged_request, &l), 0);
	log_set_level(LOG_LVL_ERROR);
	CU_ASSERT_EQUAL(buf_read_file(&log, path, 1 << 20), 0);
	/* Something was logged: the request (debug) and the refusal (warn), with the id. */
	CU_ASSERT_PTR_NOT_NULL(strstr(log.data, "/v1/messages"));
	CU_ASSERT_PTR_NOT_NULL(strstr(log.data, "/denied"));
	CU_ASSERT_PTR_NOT_NULL(strstr(log.data, "\"request_id\":\"test-egress\""));
	/* But no header value, body or query. */
	CU_ASSERT_PTR_NULL(strstr(log.data, "SECRET"));
	CU_ASSERT_PTR_NULL(strstr(log.data, "query-secret"));
	buf_release(&log);
}

/* ---- main ---------------------------------------------------------------------------- */

/* The test CA and a certificate for localhost and 127.0.0.1 it signs. */
static bool make_ca(void)
{
	struct buf cmd = BUF_INIT;
	int rc;

	snprintf(ca_path, sizeof(ca_path), "%s/ca.pem", tmpdir);
	snprintf(cert_path, sizeof(cert_path), "%s/server.pem", tmpdir);
	snprintf(key_path, sizeof(key_path), "%s/server.key", tmpdir);
	buf_addf(&cmd,
		 "set -e; cd '%s'; exec >openssl.log 2>&1; "
		 "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
		 "-keyout ca.key -out ca.pem -days 2 -subj /CN=olp-egress-test-ca "
		 "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign; "
		 "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
		 "-keyout server.key -out server.csr -subj /CN=localhost; "
		 "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n"
		 "basicConstraints=CA:FALSE\\nextendedKeyUsage=serverAuth\\n' > ext.cnf; "
		 "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
		 "-out server.pem -days 2 -extfile ext.cnf",
		 tmpdir);
	rc = system(cmd.data);
	buf_release(&cmd);
	if (rc != 0)
		fprintf(stderr, "openssl failed (see %s/openssl.log)\n", tmpdir);
	return rc == 0;
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "plain request and response", test_plain_get },
		{ "request bodies: length, chunked, 100-continue", test_request_bodies },
		{ "placeholder dropped, credential set", test_credentials },
		{ "allowed paths", test_allow_paths },
		{ "overriding and hop-by-hop headers dropped", test_override_headers },
		{ "request bodies checked", test_body_check },
		{ "usage counted from the answers", test_usage },
		{ "no request after the client's tool call", test_stop_after_tool },
		{ "the credential never echoed back", test_echo },
		{ "body cap", test_body_cap },
		{ "keep-alive and pipelining", test_keep_alive },
		{ "streaming keeps the upstream's timing", test_streaming },
		{ "concurrent clients", test_concurrent },
		{ "https with a private CA", test_https },
		{ "upstream unreachable", test_unreachable },
		{ "malformed requests", test_malformed },
		{ "connection limit", test_max_conns },
		{ "CONNECT: listed names only", test_connect },
		{ "CONNECT: TLS through the tunnel", test_connect_tls },
		{ "deadline closes everything", test_deadline },
		{ "stop is prompt", test_stop_is_prompt },
		{ "route validation", test_route_check },
		{ "no secret in the logs", test_no_secrets_logged },
		{ NULL, NULL },
	};
	int fails;

	(void)signal(SIGPIPE, SIG_IGN);
	log_set_program("test_egress");
	/* Refusals are logged as warnings by design; the suite checks them itself. */
	log_set_level(LOG_LVL_ERROR);
	if (!mkdtemp(tmpdir) || egr_global_init())
		return 1;
	have_tls = make_ca();
	up_plain = tu_start(NULL, NULL);
	up_tls = have_tls ? tu_start(cert_path, key_path) : NULL;
	if (!up_plain || (have_tls && !up_tls)) {
		fprintf(stderr, "cannot start the test upstreams\n");
		return 1;
	}
	snprintf(upstream_url, sizeof(upstream_url), "http://127.0.0.1:%u", tu_port(up_plain));
	if (up_tls)
		snprintf(upstream_tls_url, sizeof(upstream_tls_url), "https://localhost:%u",
			 tu_port(up_tls));
	fails = ts_cunit_run("egress", tests);
	tu_stop(up_plain);
	if (up_tls)
		tu_stop(up_tls);
	{
		struct buf cmd = BUF_INIT;

		buf_addf(&cmd, "rm -rf '%s'", tmpdir);
		(void)!system(cmd.data);
		buf_release(&cmd);
	}
	return ts_exit_status(fails);
}
