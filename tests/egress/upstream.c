/* The test upstream of upstream.h. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "tests/egress/upstream.h"
#include "common/banned.h"

#define MAX_CONNS 256

struct tu_conn {
	struct tu_server *s;
	int fd;
	SSL *ssl;
	pthread_t thread;
	bool used;
	_Atomic bool done; /* the thread has finished: join it to reuse the slot */
	struct buf in;
};

struct tu_server {
	int lfd;
	uint16_t port;
	SSL_CTX *ctx;
	pthread_t acceptor;
	pthread_mutex_t lock;
	_Atomic bool stopping;
	unsigned n_conns, n_requests;
	struct buf last_head;
	uint64_t last_body;
	struct tu_conn conns[MAX_CONNS];
};

static ssize_t io_read(struct tu_conn *c, char *p, size_t n)
{
	if (c->ssl) {
		int r = SSL_read(c->ssl, p, (int)n);

		return r > 0 ? r : (SSL_get_error(c->ssl, r) == SSL_ERROR_ZERO_RETURN ? 0 : -1);
	}
	for (;;) {
		ssize_t r = read(c->fd, p, n);

		if (r >= 0 || errno != EINTR)
			return r;
	}
}

static int io_write(struct tu_conn *c, const void *p, size_t n)
{
	const char *q = p;

	while (n) {
		ssize_t w;

		if (c->ssl) {
			int r = SSL_write(c->ssl, q, (int)n);

			w = r > 0 ? r : -1;
		} else {
			w = send(c->fd, q, n, MSG_NOSIGNAL);
			if (w < 0 && errno == EINTR)
				continue;
		}
		if (w <= 0)
			return -1;
		q += w;
		n -= (size_t)w;
	}
	return 0;
}

static int io_printf(struct tu_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int io_printf(struct tu_conn *c, const char *fmt, ...)
{
	struct buf b = BUF_INIT;
	va_list ap;
	int ret;

	va_start(ap, fmt);
	buf_vaddf(&b, fmt, ap);
	va_end(ap);
	ret = io_write(c, b.data, b.len);
	buf_release(&b);
	return ret;
}

/* Make sure c->in holds at least n bytes: 0, or -1 at EOF or error. */
static int need(struct tu_conn *c, size_t n)
{
	while (c->in.len < n) {
		ssize_t r;

		buf_grow(&c->in, 65536);
		r = io_read(c, buf_tail(&c->in), 65536);
		if (r <= 0)
			return -1;
		buf_commit(&c->in, (size_t)r);
	}
	return 0;
}

/* A line (CRLF) from c->in into line (without CRLF): 0 or -1. */
static int read_line(struct tu_conn *c, struct buf *line)
{
	for (;;) {
		char *e = memmem(c->in.data, c->in.len, "\r\n", 2);

		if (e) {
			buf_reset(line);
			buf_add(line, c->in.data, (size_t)(e - c->in.data));
			buf_consume(&c->in, (size_t)(e - c->in.data) + 2);
			return 0;
		}
		if (need(c, c->in.len + 1))
			return -1;
	}
}

static const char *header(const char *head, const char *name, char *out, size_t n)
{
	const char *p = head;
	size_t nl = strlen(name);

	while ((p = strstr(p, "\r\n"))) {
		p += 2;
		if (!strncasecmp(p, name, nl) && p[nl] == ':') {
			const char *v = p + nl + 1, *e = strstr(v, "\r\n");

			while (*v == ' ')
				v++;
			snprintf(out, n, "%.*s", (int)(e ? e - v : (long)strlen(v)), v);
			return out;
		}
	}
	return NULL;
}

static long query_num(const char *path, const char *key, long dflt)
{
	char k[32];
	const char *q = strchr(path, '?');

	snprintf(k, sizeof(k), "%s=", key);
	while (q) {
		q++;
		if (!strncmp(q, k, strlen(k)))
			return strtol(q + strlen(k), NULL, 10);
		q = strchr(q, '&');
	}
	return dflt;
}

static void sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* Read one request body (kept in keep, up to 1 MiB): its length, or -1. */
static int64_t read_body(struct tu_conn *c, const char *head, struct buf *keep)
{
	char v[64];
	int64_t total = 0;

	if (header(head, "transfer-encoding", v, sizeof(v))) {
		struct buf line = BUF_INIT;

		for (;;) {
			uint64_t size;

			if (read_line(c, &line)) {
				total = -1;
				break;
			}
			size = strtoull(line.data, NULL, 16);
			if (!size) {
				/* trailers up to the empty line */
				while (!read_line(c, &line) && line.len)
					;
				break;
			}
			if (need(c, size + 2)) {
				total = -1;
				break;
			}
			if (keep->len + size <= (1 << 20))
				buf_add(keep, c->in.data, size);
			buf_consume(&c->in, size + 2);
			total += (int64_t)size;
		}
		buf_release(&line);
		return total;
	}
	if (header(head, "content-length", v, sizeof(v))) {
		uint64_t n = strtoull(v, NULL, 10);

		while (n) {
			size_t take;

			if (need(c, 1))
				return -1;
			take = c->in.len < n ? c->in.len : (size_t)n;
			if (keep->len + take <= (1 << 20))
				buf_add(keep, c->in.data, take);
			buf_consume(&c->in, take);
			n -= take;
			total += (int64_t)take;
		}
	}
	return total;
}

/* body as a chunked answer, in pieces of piece bytes (0: one) a few ms apart. */
static int write_pieces(struct tu_conn *c, const char *body, size_t len, long piece)
{
	size_t step = piece > 0 ? (size_t)piece : len;

	for (size_t off = 0; off < len; off += step) {
		size_t n = len - off < step ? len - off : step;

		if (off)
			sleep_ms(2);
		if (io_printf(c, "%zx\r\n", n) || io_write(c, body + off, n) ||
		    io_write(c, "\r\n", 2))
			return -1;
	}
	return io_write(c, "0\r\n\r\n", 5);
}

static int respond(struct tu_conn *c, const char *method, const char *path, const char *head,
		   int64_t body, const struct buf *kept, bool *close_after)
{
	if (!strncmp(path, "/reflect", 8)) {
		char v[512];
		bool sse = query_num(path, "sse", 0);

		/* The request's own x-api-key, echoed in a header of the answer. */
		if (io_printf(c,
			      "HTTP/1.1 200 OK\r\nContent-Type: %s\r\n%s%s%s"
			      "Transfer-Encoding: chunked\r\n\r\n",
			      sse ? "text/event-stream" : "application/json",
			      header(head, "x-api-key", v, sizeof(v)) ? "X-Echo: key=" : "",
			      header(head, "x-api-key", v, sizeof(v)) ? v : "",
			      header(head, "x-api-key", v, sizeof(v)) ? "\r\n" : ""))
			return -1;
		return write_pieces(c, kept->data, kept->len, query_num(path, "piece", 0));
	}
	if (!strncmp(path, "/stream", 7)) {
		long n = query_num(path, "n", 3), gap = query_num(path, "gap", 100);
		bool close = query_num(path, "close", 0);

		if (io_printf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n%s\r\n",
			      close ? "Connection: close\r\n" : "Transfer-Encoding: chunked\r\n"))
			return -1;
		for (long i = 0; i < n; i++) {
			char ev[64];
			int l;

			if (i)
				sleep_ms(gap);
			/* With ts=1 each event carries when it was sent (mono_ns), for the
			 * benchmark to measure each event's delivery. */
			if (query_num(path, "ts", 0))
				l = snprintf(ev, sizeof(ev), "data: %ld t=%llu\n\n", i,
					     (unsigned long long)mono_ns());
			else
				l = snprintf(ev, sizeof(ev), "data: %ld\n\n", i);
			if (close ? io_write(c, ev, (size_t)l)
				  : io_printf(c, "%x\r\n%s\r\n", l, ev))
				return -1;
		}
		if (close) {
			*close_after = true;
			return 0;
		}
		return io_write(c, "0\r\n\r\n", 5);
	}
	if (!strncmp(path, "/big", 4)) {
		long n = query_num(path, "bytes", 1000);
		static char chunk[65536];

		memset(chunk, 'x', sizeof(chunk));
		if (io_printf(c, "HTTP/1.1 200 OK\r\nContent-Length: %ld\r\n\r\n", n))
			return -1;
		while (n > 0) {
			size_t k = n < (long)sizeof(chunk) ? (size_t)n : sizeof(chunk);

			if (io_write(c, chunk, k))
				return -1;
			n -= (long)k;
		}
		return 0;
	}
	if (!strncmp(path, "/status/", 8)) {
		int st = atoi(path + 8);
		const char *json = "{\"error\":{\"type\":\"test\",\"message\":\"status\"}}";

		if (st == 204 || st == 304)
			return io_printf(c, "HTTP/1.1 %d X\r\n\r\n", st);
		return io_printf(c,
				 "HTTP/1.1 %d Test\r\nContent-Type: application/json\r\n"
				 "Content-Length: %zu\r\n\r\n%s",
				 st, strlen(json), json);
	}
	if (!strncmp(path, "/limits/anthropic", 17)) {
		/* A subscription's answer (tests/egress/test_ratelimit.c): ?rejected=1 is a 429. */
		bool rej = query_num(path, "rejected", 0);
		const char *json = "{\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\"}}";

		return io_printf(c,
				 "HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
				 "anthropic-ratelimit-unified-status: %s\r\n"
				 "anthropic-ratelimit-unified-reset: 4102444800\r\n"
				 "anthropic-ratelimit-unified-representative-claim: five_hour\r\n"
				 "anthropic-ratelimit-unified-5h-status: %s\r\n"
				 "anthropic-ratelimit-unified-5h-utilization: %s\r\n"
				 "anthropic-ratelimit-unified-5h-reset: 4102444800\r\n"
				 "anthropic-ratelimit-unified-7d-utilization: 0.25\r\n"
				 "anthropic-ratelimit-unified-7d-reset: 4102999999\r\n"
				 "Content-Length: %zu\r\n\r\n%s",
				 rej ? 429 : 200, rej ? "rejected" : "allowed",
				 rej ? "rejected" : "allowed", rej ? "1.0" : "0.42", strlen(json),
				 json);
	}
	if (!strncmp(path, "/limits/codex429", 16)) {
		const char *json = "{\"error\":{\"type\":\"usage_limit_reached\",\"message\":\"x\","
				   "\"resets_in_seconds\":3600}}";

		return io_printf(
			c,
			"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
			"x-codex-primary-used-percent: 100\r\n"
			"x-codex-primary-window-minutes: 300\r\n"
			"x-codex-secondary-used-percent: 12.5\r\n"
			"Content-Length: %zu\r\n\r\n%s",
			strlen(json), json);
	}
	if (!strncmp(path, "/hang", 5)) {
		while (!c->s->stopping)
			sleep_ms(20);
		return -1;
	}
	{
		struct buf b = BUF_INIT;
		int ret;

		buf_addf(&b, "method=%s\npath=%s\nbody=%lld\n%s", method, path, (long long)body,
			 head);
		if (query_num(path, "piece", 0)) {
			ret = io_printf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
					   "Transfer-Encoding: chunked\r\n\r\n") ||
			      write_pieces(c, b.data, b.len, query_num(path, "piece", 0));
			buf_release(&b);
			return ret;
		}
		ret = io_printf(c,
				"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
				"%zu\r\n\r\n",
				b.len);
		if (!ret && strcmp(method, "HEAD"))
			ret = io_write(c, b.data, b.len);
		buf_release(&b);
		return ret;
	}
}

static void *conn_main(void *arg)
{
	struct tu_conn *c = arg;
	struct buf head = BUF_INIT, kept = BUF_INIT;
	int one = 1;

	(void)setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (c->s->ctx) {
		c->ssl = SSL_new(c->s->ctx);
		SSL_set_fd(c->ssl, c->fd);
		if (SSL_accept(c->ssl) <= 0)
			goto out;
	}
	for (;;) {
		char method[16], path[2048], v[64];
		bool close_after = false;
		int64_t body;
		char *e;

		while (!(e = memmem(c->in.data, c->in.len, "\r\n\r\n", 4)))
			if (need(c, c->in.len + 1))
				goto out;
		buf_reset(&head);
		buf_add(&head, c->in.data, (size_t)(e - c->in.data) + 4);
		buf_consume(&c->in, (size_t)(e - c->in.data) + 4);
		if (sscanf(head.data, "%15s %2047s", method, path) != 2)
			goto out;
		buf_reset(&kept);
		body = read_body(c, head.data, &kept);
		if (body < 0)
			goto out;
		pthread_mutex_lock(&c->s->lock);
		c->s->n_requests++;
		buf_reset(&c->s->last_head);
		buf_add(&c->s->last_head, head.data, head.len);
		c->s->last_body = (uint64_t)body;
		pthread_mutex_unlock(&c->s->lock);
		if (respond(c, method, path, head.data, body, &kept, &close_after) || close_after)
			goto out;
		if (header(head.data, "connection", v, sizeof(v)) && !strcasecmp(v, "close"))
			goto out;
	}
out:
	if (c->ssl) {
		SSL_shutdown(c->ssl);
		SSL_free(c->ssl);
		c->ssl = NULL;
	}
	shutdown(c->fd, SHUT_RDWR);
	buf_release(&head);
	buf_release(&kept);
	c->done = true;
	return NULL;
}

static void *acceptor_main(void *arg)
{
	struct tu_server *s = arg;

	for (;;) {
		int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
		struct tu_conn *c = NULL;

		if (fd < 0) {
			if (s->stopping)
				return NULL;
			continue;
		}
		pthread_mutex_lock(&s->lock);
		for (int i = 0; i < MAX_CONNS && !c; i++) {
			struct tu_conn *o = &s->conns[i];

			if (o->used && o->done) {
				pthread_join(o->thread, NULL);
				close(o->fd);
				buf_release(&o->in);
				o->used = false;
			}
			if (!o->used)
				c = o;
		}
		if (c) {
			*c = (struct tu_conn){ .s = s, .fd = fd, .used = true };
			buf_init(&c->in);
			s->n_conns++;
		}
		pthread_mutex_unlock(&s->lock);
		if (!c || pthread_create(&c->thread, NULL, conn_main, c)) {
			close(fd);
			if (c)
				c->used = false;
		}
	}
}

struct tu_server *tu_start(const char *cert, const char *key)
{
	struct tu_server *s = calloc(1, sizeof(*s));
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t al = sizeof(a);

	if (!s)
		return NULL;
	pthread_mutex_init(&s->lock, NULL);
	buf_init(&s->last_head);
	if (cert) {
		s->ctx = SSL_CTX_new(TLS_server_method());
		if (!s->ctx || SSL_CTX_use_certificate_chain_file(s->ctx, cert) != 1 ||
		    SSL_CTX_use_PrivateKey_file(s->ctx, key, SSL_FILETYPE_PEM) != 1) {
			ERR_print_errors_fp(stderr);
			free(s);
			return NULL;
		}
	}
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&a, sizeof(a)) || listen(s->lfd, 128) ||
	    getsockname(s->lfd, (struct sockaddr *)&a, &al) ||
	    pthread_create(&s->acceptor, NULL, acceptor_main, s)) {
		free(s);
		return NULL;
	}
	s->port = ntohs(a.sin_port);
	return s;
}

uint16_t tu_port(const struct tu_server *s)
{
	return s->port;
}

unsigned tu_connections(struct tu_server *s)
{
	unsigned n;

	pthread_mutex_lock(&s->lock);
	n = s->n_conns;
	pthread_mutex_unlock(&s->lock);
	return n;
}

unsigned tu_requests(struct tu_server *s)
{
	unsigned n;

	pthread_mutex_lock(&s->lock);
	n = s->n_requests;
	pthread_mutex_unlock(&s->lock);
	return n;
}

void tu_last(struct tu_server *s, struct buf *head, uint64_t *body_len)
{
	pthread_mutex_lock(&s->lock);
	buf_reset(head);
	buf_add(head, s->last_head.data, s->last_head.len);
	if (body_len)
		*body_len = s->last_body;
	pthread_mutex_unlock(&s->lock);
}

void tu_stop(struct tu_server *s)
{
	s->stopping = true;
	shutdown(s->lfd, SHUT_RDWR);
	pthread_join(s->acceptor, NULL);
	close(s->lfd);
	for (int i = 0; i < MAX_CONNS; i++) {
		struct tu_conn *c = &s->conns[i];

		if (!c->used)
			continue;
		shutdown(c->fd, SHUT_RDWR);
		pthread_join(c->thread, NULL);
		close(c->fd);
		buf_release(&c->in);
	}
	if (s->ctx)
		SSL_CTX_free(s->ctx);
	buf_release(&s->last_head);
	free(s);
}
