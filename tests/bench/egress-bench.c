/* egress-bench: the forwarder (egress/) measured against going to the upstream directly,
 * side by side in one run (egress-bench.sh runs it and says what the goals are).
 *
 *  (a) overhead per request: keep-alive connections, one direct to the test upstream and
 *      one through the forwarder, requests alternating between them; medians and the
 *      difference. A small GET and a 32 KiB POST (a typical prompt), and a new connection
 *      per request.
 *  (b) streaming: an SSE stream whose events the upstream stamps with the time it wrote
 *      them; for each event, when it reached the client, directly and through the
 *      forwarder. Gap distortion = how much each gap between two events changed on the
 *      way.
 *  (c) throughput: a large body through upstream mode (libcurl) and through a CONNECT
 *      tunnel, in MB/s, next to the same body read directly.
 *
 * Everything runs in this process on 127.0.0.1 (the upstream, the forwarder, the client),
 * so that the clocks agree; on a 2-core machine the three share the cores, as the worker,
 * the run and the upstream of a real host would not. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"
#include "egress/egress.h"
#include "tests/egress/upstream.h"
#include "tests/bench/stats.h"
#include "common/banned.h"

struct conn {
	int fd;
	struct buf in;
};

static int conn_open(struct conn *c, uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	int one = 1;

	buf_init(&c->in);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&a, sizeof(a)))
		return -1;
	(void)setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return 0;
}

static void conn_close(struct conn *c)
{
	close(c->fd);
	buf_release(&c->in);
}

static int need(struct conn *c, size_t n)
{
	while (c->in.len < n)
		if (buf_read_once(&c->in, c->fd, 1 << 20) <= 0)
			return -1;
	return 0;
}

/* Per chunk of a chunked body: called with the chunk and when it had arrived. */
typedef void (*chunk_fn)(void *ctx, const char *data, size_t len, uint64_t at_ns);

/* Read one response, discarding its body: body bytes, or -1. */
static int64_t response(struct conn *c, chunk_fn fn, void *ctx)
{
	char *e;
	int64_t total = 0;
	const char *clh;
	bool cl, te;
	uint64_t length = 0;

	while (!(e = memmem(c->in.data, c->in.len, "\r\n\r\n", 4)))
		if (need(c, c->in.len + 1))
			return -1;
	*e = '\0';
	clh = strcasestr(c->in.data, "\r\ncontent-length:");
	cl = clh != NULL;
	if (cl)
		length = strtoull(clh + 17, NULL, 10);
	te = strcasestr(c->in.data, "\r\ntransfer-encoding: chunked") != NULL;
	buf_consume(&c->in, (size_t)(e - c->in.data) + 4);
	if (te) {
		for (;;) {
			char *eol;
			size_t size;

			while (!(eol = memmem(c->in.data, c->in.len, "\r\n", 2)))
				if (need(c, c->in.len + 1))
					return -1;
			size = strtoul(c->in.data, NULL, 16);
			buf_consume(&c->in, (size_t)(eol - c->in.data) + 2);
			if (need(c, size + 2))
				return -1;
			if (fn && size)
				fn(ctx, c->in.data, size, mono_ns());
			buf_consume(&c->in, size + 2);
			total += (int64_t)size;
			if (!size)
				return total;
		}
	}
	if (cl) {
		uint64_t n = length;

		total = (int64_t)n;
		while (n) {
			size_t take;

			if (!c->in.len && need(c, 1))
				return -1;
			take = c->in.len < n ? c->in.len : (size_t)n;
			buf_consume(&c->in, take);
			n -= take;
		}
		return total;
	}
	return -1;
}

static int listener(uint16_t *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t al = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 128) ||
	    getsockname(fd, (struct sockaddr *)&a, &al))
		return -1;
	*port = ntohs(a.sin_port);
	return fd;
}

/* ---- (a) overhead --------------------------------------------------------------------- */

static void overhead(const char *what, uint16_t direct, uint16_t via, const struct buf *req,
		     size_t n, bool fresh)
{
	uint64_t *d = calloc(n, sizeof(*d)), *f = calloc(n, sizeof(*f)),
		 *diff = calloc(n, sizeof(*diff));
	struct conn cd, cf;

	if (!d || !f || !diff)
		abort();
	if (!fresh && (conn_open(&cd, direct) || conn_open(&cf, via))) {
		fprintf(stderr, "connect failed\n");
		exit(1);
	}
	for (size_t i = 0; i < n + 50; i++) {
		for (int side = 0; side < 2; side++) {
			/* Alternate which goes first, so that neither always follows the other. */
			bool to_fwd = (side == 0) == (i % 2 == 0);
			struct conn *c = to_fwd ? &cf : &cd, fc;
			uint64_t t0 = mono_ns();

			if (fresh) {
				c = &fc;
				if (conn_open(c, to_fwd ? via : direct))
					exit(1);
			}
			if (write_all(c->fd, req->data, req->len) || response(c, NULL, NULL) < 0) {
				fprintf(stderr, "request failed\n");
				exit(1);
			}
			if (fresh)
				conn_close(c);
			if (i >= 50) /* the first 50 warm up */
				(to_fwd ? f : d)[i - 50] = mono_ns() - t0;
		}
		if (i >= 50)
			diff[i - 50] = f[i - 50] > d[i - 50] ? f[i - 50] - d[i - 50] : 0;
	}
	if (!fresh) {
		conn_close(&cd);
		conn_close(&cf);
	}
	{
		double md = bench_quantile(d, n, 0.5) / 1e3, mf = bench_quantile(f, n, 0.5) / 1e3;

		printf("  %-34s direct %7.1f us   via forwarder %7.1f us   +%6.1f us (x%.2f)   "
		       "p90 %6.1f / %6.1f us   median of pairwise diff +%.1f us\n",
		       what, md, mf, mf - md, mf / md, bench_quantile(d, n, 0.9) / 1e3,
		       bench_quantile(f, n, 0.9) / 1e3, bench_quantile(diff, n, 0.5) / 1e3);
	}
	free(d);
	free(f);
	free(diff);
}

/* ---- (b) streaming --------------------------------------------------------------------- */

struct stamps {
	size_t n;
	uint64_t sent[1024], arrived[1024];
};

static void on_event(void *ctx, const char *data, size_t len, uint64_t at)
{
	struct stamps *s = ctx;
	const char *t = memmem(data, len, " t=", 3);

	/* One event per chunk is what the upstream writes; each is stamped. */
	for (; t && s->n < 1024; t = memmem(t + 3, len - (size_t)(t + 3 - data), " t=", 3)) {
		s->sent[s->n] = strtoull(t + 3, NULL, 10);
		s->arrived[s->n++] = at;
	}
}

/* Delivery latency and gap distortion of every event of s, appended to lat and dist. */
static void stream_collect(const struct stamps *s, uint64_t *lat, size_t *nl, uint64_t *dist,
			   size_t *nd)
{
	for (size_t i = 0; i < s->n; i++) {
		lat[(*nl)++] = s->arrived[i] - s->sent[i];
		if (i) {
			int64_t g_in = (int64_t)(s->sent[i] - s->sent[i - 1]),
				g_out = (int64_t)(s->arrived[i] - s->arrived[i - 1]);

			dist[(*nd)++] = (uint64_t)(g_out > g_in ? g_out - g_in : g_in - g_out);
		}
	}
}

static double stream_report(const char *what, uint64_t *lat, size_t nl, uint64_t *dist, size_t nd)
{
	size_t over = 0;

	for (size_t i = 0; i < nd; i++)
		over += dist[i] > 2000000;
	printf("  %-14s %zu events: delivery median %6.1f us, p99 %7.1f us;  gap distortion "
	       "median %6.1f us, p99 %7.1f us, max %7.1f us, %zu over 2 ms\n",
	       what, nl, bench_quantile(lat, nl, 0.5) / 1e3, bench_quantile(lat, nl, 0.99) / 1e3,
	       bench_quantile(dist, nd, 0.5) / 1e3, bench_quantile(dist, nd, 0.99) / 1e3,
	       bench_quantile(dist, nd, 1.0) / 1e3, over);
	return bench_quantile(dist, nd, 0.99) / 1e6;
}

struct stream_job {
	uint16_t port;
	const char *req;
	struct stamps st;
	int ok;
};

static void *stream_one(void *arg)
{
	struct stream_job *j = arg;
	struct conn c;

	j->st.n = 0;
	j->ok = !conn_open(&c, j->port) && !write_all(c.fd, j->req, strlen(j->req)) &&
		response(&c, on_event, &j->st) >= 0;
	conn_close(&c);
	return NULL;
}

/* The direct and the forwarded stream at the same time, rounds times: both see the same
 * machine at the same moment. */
static void streaming(uint16_t direct, uint16_t via, int events, int gap, int rounds)
{
	char req[128];
	struct stream_job *j = calloc(2, sizeof(*j));
	size_t cap = (size_t)rounds * 1024, nl[2] = { 0 }, nd[2] = { 0 };
	uint64_t *lat[2], *dist[2];
	double p99d, p99f;

	if (!j)
		abort();
	for (int k = 0; k < 2; k++) {
		lat[k] = calloc(cap, sizeof(uint64_t));
		dist[k] = calloc(cap, sizeof(uint64_t));
		if (!lat[k] || !dist[k])
			abort();
	}
	snprintf(req, sizeof(req), "GET /stream?n=%d&gap=%d&ts=1 HTTP/1.1\r\nHost: x\r\n\r\n",
		 events > 1024 ? 1024 : events, gap);
	j[0] = (struct stream_job){ .port = direct, .req = req };
	j[1] = (struct stream_job){ .port = via, .req = req };
	for (int r = 0; r < rounds; r++) {
		pthread_t t[2];

		for (int k = 0; k < 2; k++)
			if (pthread_create(&t[k], NULL, stream_one, &j[k]))
				exit(1);
		for (int k = 0; k < 2; k++) {
			pthread_join(t[k], NULL);
			if (!j[k].ok)
				exit(1);
			stream_collect(&j[k].st, lat[k], &nl[k], dist[k], &nd[k]);
		}
	}
	p99d = stream_report("direct", lat[0], nl[0], dist[0], nd[0]);
	p99f = stream_report("via forwarder", lat[1], nl[1], dist[1], nd[1]);
	printf("  => p99 gap distortion %.2f ms through the forwarder, %.2f ms direct (goal: "
	       "within 2 ms)\n",
	       p99f, p99d);
	for (int k = 0; k < 2; k++) {
		free(lat[k]);
		free(dist[k]);
	}
	free(j);
}

/* ---- (c) throughput ------------------------------------------------------------------- */

static double transfer(uint16_t port, const char *connect_to, uint64_t bytes)
{
	char req[256];
	struct conn c;
	uint64_t t0;

	if (conn_open(&c, port))
		exit(1);
	if (connect_to) {
		snprintf(req, sizeof(req), "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", connect_to,
			 connect_to);
		if (write_all(c.fd, req, strlen(req)) || need(&c, 4))
			exit(1);
		while (!memmem(c.in.data, c.in.len, "\r\n\r\n", 4))
			if (need(&c, c.in.len + 1))
				exit(1);
		buf_reset(&c.in);
	}
	snprintf(req, sizeof(req), "GET /big?bytes=%llu HTTP/1.1\r\nHost: x\r\n\r\n",
		 (unsigned long long)bytes);
	t0 = mono_ns();
	if (write_all(c.fd, req, strlen(req)) || response(&c, NULL, NULL) != (int64_t)bytes) {
		fprintf(stderr, "transfer failed\n");
		exit(1);
	}
	conn_close(&c);
	return (double)bytes / 1048576.0 / ((double)(mono_ns() - t0) / 1e9);
}

int main(int argc, char **argv)
{
	int requests = argc > 1 ? atoi(argv[1]) : 2000, events = argc > 2 ? atoi(argv[2]) : 100,
	    gap = argc > 3 ? atoi(argv[3]) : 20, mb = argc > 4 ? atoi(argv[4]) : 512,
	    rounds = argc > 5 ? atoi(argv[5]) : 3;
	struct tu_server *up;
	struct egr_forwarder *fu, *fc;
	struct buf get = BUF_INIT, post = BUF_INIT;
	char allowed[64];
	const char *hosts[] = { allowed, NULL };
	uint16_t pu, pc;
	int lu, lc;

	(void)signal(SIGPIPE, SIG_IGN);
	(void)setvbuf(stdout, NULL, _IOLBF, 0);
	log_set_level(LOG_LVL_ERROR);
	up = tu_start(NULL, NULL);
	if (!up || egr_global_init())
		return 1;
	snprintf(allowed, sizeof(allowed), "localhost:%u", tu_port(up));
	{
		char url[64];
		const struct egr_header set[] = { { "x-api-key", "sk-bench" } };
		struct egr_route ru = { .mode = EGR_MODE_UPSTREAM,
					.upstream = url,
					.set_headers = set,
					.n_set_headers = 1,
					.flags = EGR_ANY_PATH },
				 rc = { .mode = EGR_MODE_CONNECT,
					.allow_hosts = hosts,
					.flags = EGR_ALLOW_LOCAL_TARGETS };

		snprintf(url, sizeof(url), "http://127.0.0.1:%u", tu_port(up));
		lu = listener(&pu);
		lc = listener(&pc);
		fu = egr_start(lu, &ru, NULL);
		fc = egr_start(lc, &rc, NULL);
		if (!fu || !fc)
			return 1;
	}
	buf_adds(&get, "GET /status/200 HTTP/1.1\r\nHost: x\r\nx-api-key: placeholder\r\n\r\n");
	buf_adds(&post,
		 "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
		 "x-api-key: placeholder\r\nContent-Length: 32768\r\n\r\n");
	for (int i = 0; i < 32768; i++)
		buf_addch(&post, (char)('a' + i % 26));

	printf("(a) overhead per request, %d requests each way, alternating\n", requests);
	overhead("GET, keep-alive", tu_port(up), pu, &get, (size_t)requests, false);
	overhead("POST 32 KiB, keep-alive", tu_port(up), pu, &post, (size_t)requests, false);
	overhead("GET, new connection each", tu_port(up), pu, &get, (size_t)requests / 4, true);
	printf("(b) streaming: %d events %d ms apart, direct and through the forwarder at once, "
	       "%d rounds\n",
	       events, gap, rounds);
	streaming(tu_port(up), pu, events, gap, rounds);
	printf("(c) throughput, %d MiB, best of %d\n", mb, rounds);
	{
		double best[3] = { 0 };

		for (int r = 0; r < rounds; r++) {
			double v[3] = { transfer(tu_port(up), NULL, (uint64_t)mb << 20),
					transfer(pu, NULL, (uint64_t)mb << 20),
					transfer(pc, allowed, (uint64_t)mb << 20) };

			for (int i = 0; i < 3; i++)
				best[i] = v[i] > best[i] ? v[i] : best[i];
		}
		printf("  direct %.0f MB/s   upstream mode %.0f MB/s   CONNECT relay %.0f MB/s "
		       "(goal >= 200)\n",
		       best[0], best[1], best[2]);
	}
	egr_stop(fu, NULL);
	egr_stop(fc, NULL);
	tu_stop(up);
	buf_release(&get);
	buf_release(&post);
	return 0;
}
