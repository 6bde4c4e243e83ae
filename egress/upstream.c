/* Upstream mode: each request of a client connection, forwarded with libcurl.
 *
 * Why libcurl: the upstream is a real API over the internet, so the hard parts are TLS
 * (verification, SNI, session reuse, the system CA store or a private CA), connection
 * reuse, chunked decoding and the many ways a remote server can misbehave. libcurl does
 * all of them, is in every distribution, and hands the response over piece by piece as it
 * arrives, which is what streaming needs. Our own code only reads the client's side.
 *
 * Streaming, both ways, with no buffering of our own:
 *  - the request body is handed to libcurl from its read callback as the client sends it
 *    (Content-Length, or chunked decoded and re-chunked by libcurl);
 *  - the response head is written to the client as soon as libcurl has read it, and each
 *    piece of body libcurl hands to the write callback is written to the client at once,
 *    in a chunk of its own when the upstream gave no length. An SSE token the upstream
 *    flushes reaches the client in the same moment.
 * A slow client holds up its own upstream transfer only (the write callback waits, TCP
 * pushes back), never anyone else's.
 *
 * Each connection thread drives its transfer through a multi handle of its own, so that
 * the wait for the upstream also wakes on the forwarder's stop eventfd (curl_multi_poll's
 * extra descriptors) and on the client hanging up (the upstream then stops generating).
 * The multi handle keeps the upstream connection open between the requests of one
 * client connection: keep-alive on both sides. DNS answers and TLS sessions are shared by
 * all connections of the forwarder. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <curl/curl.h>

#include "egress/internal.h"
#include "common/banned.h"

_Static_assert(CURL_LOCK_DATA_LAST <= 8, "share_lock has a mutex per lock_data");

#define CHUNK_LINE_MAX 4096
#define TRAILER_MAX 8192

enum chunk_state { CH_SIZE = 0, CH_DATA, CH_CRLF, CH_TRAILER, CH_DONE };

struct up {
	CURLM *multi;
	CURL *easy;
	struct egr_conn *c;
	const struct egr_req *req;
	struct curl_slist *hdrs;
	struct buf url;
	char errbuf[CURL_ERROR_SIZE];

	/* the request body */
	bool has_body;
	uint64_t body_left; /* Content-Length mode: still to read */
	enum chunk_state ch;
	uint64_t chunk_left;
	size_t trailer_bytes;
	uint64_t body_seen;
	bool body_done;
	int body_status;      /* 400, 403, 413 or 431: the body was refused ... */
	const char *body_why; /* ... with this message (static), or NULL for the default */
	bool check_body;      /* EGR_CHECK_BODY and a body: read as it goes (body.c) */
	struct egr_body check;
	int client_err; /* -errno: the client went away or stalled */

	/* the response */
	struct buf rlines; /* the upstream's header lines of the head being read */
	int status;
	char reason[64];
	bool head_sent;	    /* composed (in pending until written) */
	bool head_written;  /* ... and written to the client */
	struct buf pending; /* the head, written with the first piece of body or before
			       the next wait, whichever comes first: one write less */
	bool chunked_out;   /* we chunk the body to the client */
	bool close_delim;   /* an HTTP/1.0 client: the body ends when we close */
	bool no_body;
	bool close_after; /* close the client connection after this response */
	bool watch_client;
	bool stopped;
	bool hold_body; /* a 429's body, held until it is read (rl below) */
	uint64_t down;
	struct egr_answer ans; /* the answer's usage and echoed secrets (answer.c) */
	struct buf masked;     /* a piece of the answer with its secrets masked */
	/* The subscription's limits this answer announced (ratelimit.c); a 429's body is
	 * held (up to LIMIT_BODY_MAX) until it is read, so that the state is kept before the
	 * run can see the refusal and end. */
	struct egr_ratelimit rl;
	struct buf held_body;
};

#define LIMIT_BODY_MAX ((size_t)64 * 1024)

/* ---- the request body ---------------------------------------------------------------- */

static int fill(struct up *u)
{
	ssize_t n = egr_conn_fill(u->c, 65536);

	if (n > 0)
		return 0;
	u->client_err = n == 0 ? -ECONNRESET : (int)n;
	return -1;
}

static ssize_t read_plain(struct up *u, char *dst, size_t max)
{
	struct egr_conn *c = u->c;
	size_t n;

	if (!u->body_left) {
		u->body_done = true;
		return 0;
	}
	if (!c->in.len) {
		/* Nothing buffered: straight from the socket into libcurl's buffer, never
		 * past the body's end (what follows is the next request). */
		size_t want = max < u->body_left ? max : (size_t)u->body_left;

		for (;;) {
			ssize_t r = recv(c->fd, dst, want, MSG_DONTWAIT);
			int w;

			if (r > 0) {
				n = (size_t)r;
				goto got;
			}
			if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
				u->client_err = r == 0 ? -ECONNRESET : -errno;
				return -1;
			}
			if (errno == EAGAIN &&
			    (w = egr_conn_wait(c, c->fd, POLLIN, egr_conn_until(c)))) {
				u->client_err = w;
				return -1;
			}
		}
	}
	n = c->in.len < max ? c->in.len : max;
	if (n > u->body_left)
		n = (size_t)u->body_left;
	memcpy(dst, c->in.data, n);
	buf_consume(&c->in, n);
got:
	u->body_left -= n;
	u->body_seen += n;
	if (!u->body_left)
		u->body_done = true;
	return (ssize_t)n;
}

static int hexdigit(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

/* A chunk-size line (RFC 9112 7.1): hex digits, then nothing, or extensions after ';'. */
static int chunk_size(const char *line, size_t len, uint64_t *size)
{
	size_t i = 0;

	*size = 0;
	for (; i < len && hexdigit(line[i]) >= 0; i++) {
		if (i >= 15)
			return -1;
		*size = *size * 16 + (uint64_t)hexdigit(line[i]);
	}
	if (!i)
		return -1;
	while (i < len && (line[i] == ' ' || line[i] == '\t'))
		i++;
	if (i < len && line[i] != ';')
		return -1;
	for (; i < len; i++)
		if ((unsigned char)line[i] < 0x20 && line[i] != '\t')
			return -1;
	return 0;
}

static ssize_t body_refused(struct up *u, int status)
{
	u->body_status = status;
	return -1;
}

/* The body check (EGR_CHECK_BODY) sees each piece before libcurl does, and the body's end
 * before its last piece goes: a refused body never reaches the upstream whole. */
static int check_piece(struct up *u, const char *p, size_t n)
{
	if (!u->check_body)
		return 0;
	if (egr_body_feed(&u->check, p, n) || (u->body_done && egr_body_finish(&u->check))) {
		u->body_status = u->check.status;
		u->body_why = u->check.why;
		return -1;
	}
	return 0;
}

/* Decode the chunked body into dst: bytes (0 at its end), or -1. */
static ssize_t read_chunked(struct up *u, char *dst, size_t max)
{
	struct egr_conn *c = u->c;
	size_t out = 0;

	for (;;) {
		const char *eol;
		size_t ll;

		if (u->ch == CH_DONE) {
			u->body_done = true;
			return (ssize_t)out;
		}
		if (u->ch == CH_DATA) {
			size_t n;

			if (!c->in.len) {
				if (out)
					return (ssize_t)out;
				if (fill(u))
					return -1;
				continue;
			}
			n = c->in.len < max - out ? c->in.len : max - out;
			if (n > u->chunk_left)
				n = (size_t)u->chunk_left;
			memcpy(dst + out, c->in.data, n);
			buf_consume(&c->in, n);
			out += n;
			u->chunk_left -= n;
			if (!u->chunk_left)
				u->ch = CH_CRLF;
			if (out == max)
				return (ssize_t)out;
			continue;
		}
		/* A line: the chunk size, the CRLF after the data, or a trailer. */
		eol = memmem(c->in.data, c->in.len, "\r\n", 2);
		if (!eol) {
			if (c->in.len > CHUNK_LINE_MAX)
				return body_refused(u, 400);
			if (out)
				return (ssize_t)out;
			if (fill(u))
				return -1;
			continue;
		}
		ll = (size_t)(eol - c->in.data);
		if (u->ch == CH_CRLF) {
			if (ll)
				return body_refused(u, 400);
			u->ch = CH_SIZE;
		} else if (u->ch == CH_SIZE) {
			uint64_t size;

			if (chunk_size(c->in.data, ll, &size))
				return body_refused(u, 400);
			if (size > u->c->f->lim.max_body_bytes - u->body_seen)
				return body_refused(u, 413);
			u->body_seen += size;
			u->chunk_left = size;
			u->ch = size ? CH_DATA : CH_TRAILER;
		} else { /* CH_TRAILER: not forwarded */
			u->trailer_bytes += ll + 2;
			if (u->trailer_bytes > TRAILER_MAX)
				return body_refused(u, 431);
			if (!ll)
				u->ch = CH_DONE;
		}
		buf_consume(&c->in, ll + 2);
	}
}

static size_t on_read(char *dst, size_t size, size_t nitems, void *ud)
{
	struct up *u = ud;
	ssize_t n = u->req->chunked ? read_chunked(u, dst, size * nitems)
				    : read_plain(u, dst, size * nitems);

	if (n < 0 || check_piece(u, dst, (size_t)n))
		return CURL_READFUNC_ABORT;
	atomic_fetch_add(&u->c->f->bytes_up, (uint64_t)n);
	return (size_t)n;
}

/* ---- the response -------------------------------------------------------------------- */

static bool hop_by_hop_response(const char *name, size_t len, const char *connection)
{
	static const char *const fixed[] = { "connection",	 "keep-alive",
					     "proxy-connection", "te",
					     "trailer",		 "transfer-encoding",
					     "upgrade",		 "proxy-authenticate",
					     "content-length" };

	for (size_t i = 0; i < ARRAY_SIZE(fixed); i++)
		if (strlen(fixed[i]) == len && !strncasecmp(name, fixed[i], len))
			return true;
	return connection && egr_list_has(connection, name, len);
}

/* One header line of rlines: name and trimmed value (pointers into a copy). */
struct hline {
	const char *name;
	size_t name_len;
	const char *value;
	size_t value_len;
	const char *raw;
	size_t raw_len;
};

/* Iterate the header lines in rlines; false at the end. */
static bool next_hline(const struct buf *b, size_t *pos, struct hline *h)
{
	while (*pos < b->len) {
		const char *line = b->data + *pos, *nl = memchr(line, '\n', b->len - *pos);
		size_t len = nl ? (size_t)(nl - line) : b->len - *pos;
		const char *colon;

		*pos += len + (nl ? 1 : 0);
		if (len && line[len - 1] == '\r')
			len--;
		colon = memchr(line, ':', len);
		/* A continuation line (obs-fold) or no colon: dropped. */
		if (!len || line[0] == ' ' || line[0] == '\t' || !colon ||
		    !egr_is_token(line, (size_t)(colon - line)))
			continue;
		h->raw = line;
		h->raw_len = len;
		h->name = line;
		h->name_len = (size_t)(colon - line);
		h->value = colon + 1;
		h->value_len = len - h->name_len - 1;
		while (h->value_len && (*h->value == ' ' || *h->value == '\t')) {
			h->value++;
			h->value_len--;
		}
		while (h->value_len &&
		       (h->value[h->value_len - 1] == ' ' || h->value[h->value_len - 1] == '\t'))
			h->value_len--;
		return true;
	}
	return false;
}

static bool hline_is(const struct hline *h, const char *name)
{
	return strlen(name) == h->name_len && !strncasecmp(h->name, name, h->name_len);
}

/* Write what is pending (the head) to the client: 0, or -1 (the client is gone). */
static int flush_pending(struct up *u)
{
	int ret;

	if (!u->pending.len)
		return 0;
	ret = egr_conn_write(u->c, u->c->fd, u->pending.data, u->pending.len);
	buf_reset(&u->pending);
	u->head_written = true;
	if (ret)
		u->client_err = ret;
	return ret ? -1 : 0;
}

/* What the head's framing and answer checks need from the upstream's header lines. */
struct head_facts {
	struct buf conn_hdr; /* the Connection header's names, comma-separated */
	const char *cl, *ctype;
	size_t cl_len, ctype_len;
	bool te, encoded;
};

static void head_scan(struct up *u, struct head_facts *f)
{
	struct hline h;
	size_t pos = 0;

	/* The upstream's own Connection header names more hop-by-hop headers. */
	while (next_hline(&u->rlines, &pos, &h)) {
		if (hline_is(&h, "connection")) {
			buf_add(&f->conn_hdr, h.value, h.value_len);
			buf_addch(&f->conn_hdr, ',');
		} else if (hline_is(&h, "content-length") && !f->cl) {
			f->cl = h.value;
			f->cl_len = h.value_len;
		} else if (hline_is(&h, "transfer-encoding")) {
			f->te = true;
		} else if (hline_is(&h, "content-type") && !f->ctype) {
			f->ctype = h.value;
			f->ctype_len = h.value_len;
		} else if (hline_is(&h, "content-encoding")) {
			f->encoded |= h.value_len != 8 || strncasecmp(h.value, "identity", 8);
		}
	}
}

/* The upstream's header lines the client may see: no hop-by-hop one, no echo. */
static void head_copy(struct up *u, const struct head_facts *f, struct buf *out)
{
	struct hline h;
	size_t pos = 0;

	while (next_hline(&u->rlines, &pos, &h))
		if (!hop_by_hop_response(h.name, h.name_len,
					 f->conn_hdr.len ? f->conn_hdr.data : NULL) &&
		    !egr_echo_in(u->c->f, h.raw, h.raw_len)) {
			buf_add(out, h.raw, h.raw_len);
			buf_adds(out, "\r\n");
		}
}

/* How the body is delimited for the client, and whether its connection is kept. */
static void head_framing(struct up *u, const struct head_facts *f, struct buf *out)
{
	if (f->cl && !f->te) {
		buf_adds(out, "Content-Length: ");
		buf_add(out, f->cl, f->cl_len);
		buf_adds(out, "\r\n");
	} else if (!u->no_body) {
		if (u->req->minor == 1) {
			buf_adds(out, "Transfer-Encoding: chunked\r\n");
			u->chunked_out = true;
		} else {
			u->close_delim = true;
		}
	}
	/* Keep the client connection only if its request was read to the end (an upstream
	 * may answer before the body is all sent) and nothing asks to close it. */
	if (u->close_delim || !u->req->keep_alive || (u->has_body && !u->body_done))
		u->close_after = true;
	if (u->close_after)
		buf_adds(out, "Connection: close\r\n");
	else if (u->req->minor == 0)
		buf_adds(out, "Connection: keep-alive\r\n");
	if (!u->close_after)
		buf_addf(out, "Keep-Alive: timeout=%llu\r\n",
			 (unsigned long long)(u->c->f->lim.idle_ms / 1000));
}

/* What the head says of the subscription's limits: told at once (before the client has
 * the head), but for a 429, whose body may say more (limits_told at its end). */
static void head_limits(struct up *u)
{
	struct egr_forwarder *f = u->c->f;
	int64_t now_s = wall_ms() / 1000;
	struct hline h;
	size_t pos = 0;

	egr_rl_init(&u->rl, u->status);
	u->hold_body = false;
	buf_reset(&u->held_body);
	if (!f->on_limits)
		return;
	while (next_hline(&u->rlines, &pos, &h))
		(void)egr_rl_header(&u->rl, h.name, h.name_len, h.value, h.value_len, now_s);
	if (u->status == 429) {
		u->hold_body = !u->no_body;
		return;
	}
	egr_rl_finish(&u->rl);
	if (u->rl.any)
		f->on_limits(f->limits_ctx, &u->rl);
}

/* Compose the response head for the client (once), into u->pending. */
static void send_head(struct up *u)
{
	struct egr_conn *c = u->c;
	struct buf *out = &u->pending;
	struct head_facts f = { .conn_hdr = BUF_INIT };

	u->head_sent = true;
	head_scan(u, &f);
	egr_answer_begin(&u->ans, c->f, f.ctype, f.ctype_len, f.encoded);
	/* An echo of the credential in the reason phrase: the standard one instead. */
	if (egr_echo_in(c->f, u->reason, strlen(u->reason)))
		u->reason[0] = '\0';
	u->no_body = !strcasecmp(u->req->method, "HEAD") || u->status / 100 == 1 ||
		     u->status == 204 || u->status == 304;
	head_limits(u);
	buf_addf(out, "HTTP/1.1 %d %s\r\n", u->status,
		 u->reason[0] ? u->reason : egr_reason(u->status));
	head_copy(u, &f, out);
	head_framing(u, &f, out);
	buf_adds(out, "\r\n");
	buf_release(&f.conn_hdr);
}

static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
	struct up *u = ud;
	size_t len = size * n;

	if (u->head_sent)
		return len; /* trailers: not forwarded */
	if (len >= 12 && !memcmp(p, "HTTP/", 5)) {
		/* "HTTP/1.1 200 OK": a new head (after an interim 1xx, the final one). */
		const char *sp = memchr(p, ' ', len), *r;
		size_t rl;

		buf_reset(&u->rlines);
		u->status = 0;
		u->reason[0] = '\0';
		if (!sp || (size_t)(sp - p) + 4 > len)
			return 0;
		for (int i = 1; i <= 3; i++) {
			if (sp[i] < '0' || sp[i] > '9')
				return 0;
			u->status = u->status * 10 + (sp[i] - '0');
		}
		r = sp + 4;
		while (r < p + len && *r == ' ')
			r++;
		rl = (size_t)(p + len - r);
		while (rl && (r[rl - 1] == '\r' || r[rl - 1] == '\n' || r[rl - 1] == ' '))
			rl--;
		if (rl < sizeof(u->reason)) {
			bool printable = true;

			for (size_t i = 0; i < rl; i++)
				printable &= r[i] >= 0x20 && r[i] < 0x7f;
			if (printable) {
				memcpy(u->reason, r, rl);
				u->reason[rl] = '\0';
			}
		}
		return len;
	}
	if (len <= 2 && (p[0] == '\r' || p[0] == '\n')) {
		if (u->status < 200) {
			/* An interim response (100 Continue): not the answer. */
			u->status = 0;
			buf_reset(&u->rlines);
			return len;
		}
		send_head(u);
		return len;
	}
	buf_add(&u->rlines, p, len);
	return len;
}

/* Write a piece of the answer's body (after the head, if it is still pending), in a chunk
 * of its own when we chunk (never an empty one, which would end the answer): 0 or
 * -errno. */
static int write_piece(struct up *u, const char *p, size_t len)
{
	struct egr_conn *c = u->c;
	char hex[24];
	struct iovec iov[4] = { { .iov_base = u->pending.data, .iov_len = u->pending.len },
				{ .iov_base = hex },
				{ .iov_base = (void *)p, .iov_len = len },
				{ .iov_base = (void *)"\r\n", .iov_len = 2 } };
	int ret;

	if (!len && !u->pending.len)
		return 0;
	iov[1].iov_len =
		u->chunked_out && len ? (size_t)snprintf(hex, sizeof(hex), "%zx\r\n", len) : 0;
	if (!u->chunked_out || !len)
		iov[3].iov_len = 0;
	ret = egr_conn_writev(c, c->fd, iov, 4);
	buf_reset(&u->pending);
	u->head_written = true;
	if (ret)
		return ret;
	u->down += len;
	atomic_fetch_add(&c->f->bytes_down, len);
	return 0;
}

/* A piece of the answer to the client: counted first (whatever the run saw, the count
 * saw first), its secrets masked. 0 or -errno. */
static int deliver(struct up *u, const char *p, size_t len)
{
	if (!len)
		return 0;
	egr_answer_feed(&u->ans, p, len);
	if (u->c->f->secrets.n) {
		egr_echo_mask(&u->ans, p, len, &u->masked);
		return write_piece(u, u->masked.data, u->masked.len);
	}
	return write_piece(u, p, len);
}

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
	struct up *u = ud;
	size_t len = size * n;
	int ret;

	if (!u->head_sent) {
		if (u->status < 200)
			return 0;
		send_head(u);
	}
	if (u->no_body || !len)
		return len;
	if (u->hold_body) {
		if (u->held_body.len + len <= LIMIT_BODY_MAX) {
			buf_add(&u->held_body, p, len);
			return len;
		}
		/* Too long for a limit's refusal: passed on, and read for its head only. */
		u->hold_body = false;
		ret = deliver(u, u->held_body.data, u->held_body.len);
		if (!ret)
			ret = deliver(u, p, len);
	} else {
		ret = deliver(u, p, len);
	}
	if (ret) {
		u->client_err = ret;
		return 0;
	}
	return len;
}

/* The end of a 429 answer: what its head and held body say of the limits is kept, then
 * the body goes to the client. 0 or -errno. */
static int limits_told(struct up *u)
{
	struct egr_forwarder *f = u->c->f;

	if (!f->on_limits || u->status != 429)
		return 0;
	if (u->hold_body)
		(void)egr_rl_body(&u->rl, u->held_body.data, u->held_body.len, wall_ms() / 1000);
	egr_rl_finish(&u->rl);
	if (u->rl.any)
		f->on_limits(f->limits_ctx, &u->rl);
	if (!u->hold_body)
		return 0;
	u->hold_body = false;
	return deliver(u, u->held_body.data, u->held_body.len);
}

/* ---- one request --------------------------------------------------------------------- */

static bool name_in(const struct strv *list, const char *name)
{
	for (size_t i = 0; i < list->n; i++)
		if (!strcasecmp(list->v[i], name))
			return true;
	return false;
}

static void add_header(struct up *u, const char *line)
{
	struct curl_slist *n = curl_slist_append(u->hdrs, line);

	if (!n)
		abort();
	u->hdrs = n;
}

/* The request headers libcurl sends: the client's, minus hop-by-hop, overriding
 * (egr_req_dropped) and the placeholder credentials, plus the route's; and none of
 * libcurl's own defaults. Accept-Encoding is always identity: a compressed answer could
 * not be read for its usage (answer.c) nor its echoes masked. */
static void build_headers(struct up *u)
{
	struct egr_forwarder *f = u->c->f;
	const struct egr_req *r = u->req;
	struct buf line = BUF_INIT;
	bool accept = false, ctype = false;

	for (size_t i = 0; i < r->nh; i++) {
		const struct egr_hdr *h = &r->h[i];

		if (egr_req_dropped(r, h->name) || name_in(&f->drop, h->name) ||
		    name_in(&f->set_names, h->name) || !strcasecmp(h->name, "accept-encoding"))
			continue;
		accept |= !strcasecmp(h->name, "accept");
		ctype |= !strcasecmp(h->name, "content-type");
		buf_reset(&line);
		if (h->value[0])
			buf_addf(&line, "%s: %s", h->name, h->value);
		else
			buf_addf(&line, "%s;", h->name);
		add_header(u, line.data);
	}
	for (size_t i = 0; i < f->set_lines.n; i++)
		add_header(u, f->set_lines.v[i]);
	/* "Name:" removes a header libcurl would add by itself. */
	if (!accept)
		add_header(u, "Accept:");
	if (!ctype)
		add_header(u, "Content-Type:");
	add_header(u, "Expect:");
	add_header(u, "Accept-Encoding: identity");
	if (r->chunked)
		add_header(u, "Transfer-Encoding: chunked");
	buf_release(&line);
}

static void set_options(struct up *u)
{
	struct egr_forwarder *f = u->c->f;
	const struct egr_req *r = u->req;
	CURL *e = u->easy;
	uint64_t d = f->lim.deadline_ms, now = mono_ms();

	curl_easy_reset(e);
	buf_reset(&u->url);
	buf_adds(&u->url, f->base);
	buf_adds(&u->url, r->target);
	curl_easy_setopt(e, CURLOPT_URL, u->url.data);
	curl_easy_setopt(e, CURLOPT_SHARE, f->curl_share);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
	curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L);
	/* No proxy from the worker's environment: the route says where traffic goes. */
	curl_easy_setopt(e, CURLOPT_PROXY, "");
	curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
	curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
	if (f->ca_file)
		curl_easy_setopt(e, CURLOPT_CAINFO, f->ca_file);
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)f->lim.connect_timeout_ms);
	if (d)
		curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(d > now ? d - now : 1));
	curl_easy_setopt(e, CURLOPT_HTTP_CONTENT_DECODING, 0L);
	curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 65536L);
	curl_easy_setopt(e, CURLOPT_UPLOAD_BUFFERSIZE, 65536L);
	curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, u->errbuf);
	curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(e, CURLOPT_HEADERDATA, u);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, u);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, u->hdrs);
	curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r->method);
	if (u->has_body) {
		curl_easy_setopt(e, CURLOPT_POST, 1L);
		curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(e, CURLOPT_READDATA, u);
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE,
				 r->chunked ? (curl_off_t)-1 : (curl_off_t)r->length);
	} else if (!strcmp(r->method, "HEAD")) {
		curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
	} else if (r->has_length) {
		/* "Content-Length: 0" (a POST without body): sent as such. */
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, "");
	} else {
		curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
	}
}

/* Drive the transfer; its result. */
static CURLcode perform(struct up *u)
{
	struct egr_conn *c = u->c;
	CURLcode res = CURLE_OK;
	CURLMsg *m;
	int running = 1, left;

	if (curl_multi_add_handle(u->multi, u->easy))
		return CURLE_OUT_OF_MEMORY;
	u->watch_client = true;
	while (running) {
		struct curl_waitfd w[2] = { { .fd = c->f->stop_fd, .events = CURL_WAIT_POLLIN },
					    { .fd = c->fd, .events = CURL_WAIT_POLLIN } };
		/* The client's socket is watched for a hang-up once its request is all read
		 * (before that, its bytes are the body). */
		unsigned nw = u->watch_client && (!u->has_body || u->body_done) ? 2 : 1;

		if (curl_multi_perform(u->multi, &running) || !running)
			break;
		/* A head that came alone goes out before we wait for more. */
		if (flush_pending(u))
			break;
		if (curl_multi_poll(u->multi, w, nw, 1000, NULL))
			break;
		if (w[0].revents) {
			u->stopped = true;
			break;
		}
		if (nw == 2 && w[1].revents) {
			char ch;
			ssize_t n = recv(c->fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);

			if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
				u->client_err = n == 0 ? -ECONNRESET : -errno;
				break;
			}
			if (n > 0)
				u->watch_client = false; /* a pipelined request: read later */
		}
	}
	while ((m = curl_multi_info_read(u->multi, &left)))
		if (m->msg == CURLMSG_DONE)
			res = m->data.result;
	if (running && res == CURLE_OK)
		res = CURLE_ABORTED_BY_CALLBACK;
	curl_multi_remove_handle(u->multi, u->easy);
	return res;
}

static bool refuse(struct egr_conn *c, const struct egr_req *r, int status, const char *type,
		   const char *msg)
{
	log_warnx(c->f->rid, "%s: refused %.16s %.*s: %d %s", c->tag, r->method ? r->method : "-",
		  r->target ? (int)(r->path_len < 256 ? r->path_len : 256) : 1,
		  r->target ? r->target : "-", status, msg);
	egr_conn_error(c, status, type, msg);
	return false;
}

/* Whether the route lets r through; refused (answered, logged) if not. */
static bool admit(struct egr_conn *c, const struct egr_req *r)
{
	struct egr_forwarder *f = c->f;
	const char *cenc = egr_req_header(r, "content-encoding");
	int st;

	if (egr_method_never(r->method))
		return refuse(c, r, 405, "invalid_request_error",
			      "OLP egress: TRACE, TRACK and CONNECT are never forwarded");
	if (r->target[0] != '/')
		return refuse(c, r, 400, "invalid_request_error",
			      "OLP egress: the request target must be a path");
	if (!egr_path_canonical(r->target, r->path_len))
		return refuse(c, r, 400, "invalid_request_error",
			      "OLP egress: the path is not in canonical form");
	st = f->flags & EGR_ANY_PATH
		     ? 0
		     : egr_allow_match(f->allow, f->n_allow, r->method, r->target, r->path_len);
	if (st == 405)
		return refuse(c, r, 405, "permission_error",
			      "OLP egress: this method is not allowed on this path for this "
			      "provider");
	if (st)
		return refuse(c, r, 403, "permission_error",
			      "OLP egress: this path is not allowed for this provider");
	if (r->has_length && r->length > f->lim.max_body_bytes)
		return refuse(c, r, 413, "request_too_large",
			      "OLP egress: the request body is too large");
	if (atomic_load(&f->tool_called) && !strcmp(r->method, "POST"))
		return refuse(c, r, 403, "permission_error",
			      "OLP egress: the run ended at the client's tool call");
	/* A compressed body could not be checked (body.c). */
	if ((f->flags & EGR_CHECK_BODY) && cenc && strcasecmp(cenc, "identity"))
		return refuse(c, r, 415, "invalid_request_error",
			      "OLP egress: a compressed request body is not allowed");
	return true;
}

/* Per request state; the handles and buffers stay. */
static void up_begin(struct up *u, const struct egr_req *r)
{
	curl_slist_free_all(u->hdrs);
	u->hdrs = NULL;
	buf_reset(&u->rlines);
	u->req = r;
	u->has_body = r->chunked || (r->has_length && r->length > 0);
	u->body_left = r->has_length ? r->length : 0;
	u->ch = CH_SIZE;
	u->chunk_left = u->body_seen = u->down = 0;
	u->trailer_bytes = 0;
	u->body_done = !u->has_body;
	u->body_status = u->client_err = u->status = 0;
	u->body_why = NULL;
	u->hold_body = false;
	u->check_body = u->has_body && (u->c->f->flags & EGR_CHECK_BODY);
	if (u->check_body)
		egr_body_begin(&u->check, u->c->f->check_models ? &u->c->f->models : NULL);
	egr_answer_begin(&u->ans, u->c->f, NULL, 0, true);
	u->head_sent = u->head_written = u->chunked_out = u->close_delim = u->no_body =
		u->close_after = false;
	buf_reset(&u->pending);
	u->stopped = false;
	u->errbuf[0] = '\0';
}

#define PATH_FMT_ARGS(r) (int)((r)->path_len < 256 ? (r)->path_len : 256), (r)->target

/* The request failed before any of the answer reached the client: it still gets a proper
 * error, unless it is gone or the run is over. */
static void fail_before_head(struct egr_conn *c, struct up *u, const struct egr_req *r,
			     CURLcode res)
{
	struct egr_forwarder *f = c->f;

	if (u->client_err)
		return; /* gone or stalled: nobody to answer */
	if (u->body_status == 413) {
		refuse(c, r, 413, "request_too_large", "OLP egress: the request body is too large");
		return;
	}
	if (u->body_status) {
		refuse(c, r, u->body_status,
		       u->body_status == 403 ? "permission_error" : "invalid_request_error",
		       u->body_why ? u->body_why : "OLP egress: malformed chunked request body");
		return;
	}
	if (u->stopped && !(f->lim.deadline_ms && mono_ms() >= f->lim.deadline_ms))
		return; /* egr_stop(): the run is over */
	if (u->stopped || res == CURLE_OPERATION_TIMEDOUT) {
		log_warnx(f->rid, "%s: %s %.*s: the run's deadline passed", c->tag, r->method,
			  PATH_FMT_ARGS(r));
		egr_conn_error(c, 504, "api_error", "OLP egress: the run's deadline passed");
		return;
	}
	log_warnx(f->rid, "%s: %s %.*s: upstream failed: %s", c->tag, r->method, PATH_FMT_ARGS(r),
		  u->errbuf[0] ? u->errbuf : curl_easy_strerror(res));
	egr_conn_error(c, 502, "api_error", "OLP egress: the upstream could not be reached");
}

/* The request failed after the answer had begun: it is cut (no final chunk), so the client
 * sees it incomplete rather than short. */
static void fail_after_head(struct egr_conn *c, struct up *u, const struct egr_req *r, CURLcode res)
{
	struct egr_forwarder *f = c->f;

	if (u->stopped || res == CURLE_OPERATION_TIMEDOUT) {
		log_info(f->rid, "%s: %s %.*s: cut after %llu bytes: %s", c->tag, r->method,
			 PATH_FMT_ARGS(r), (unsigned long long)u->down,
			 f->lim.deadline_ms && mono_ms() >= f->lim.deadline_ms
				 ? "the run's deadline passed"
				 : "the forwarder stopped");
	} else if (!u->client_err) {
		atomic_fetch_add(&f->n_upstream_errors, 1);
		log_warnx(f->rid, "%s: %s %.*s: cut after %llu bytes: %s", c->tag, r->method,
			  PATH_FMT_ARGS(r), (unsigned long long)u->down,
			  u->errbuf[0] ? u->errbuf : curl_easy_strerror(res));
	}
}

/* Serve one request; whether the connection may carry another. */
static bool serve_one(struct egr_conn *c, struct up *u, const struct egr_req *r)
{
	struct egr_forwarder *f = c->f;
	uint64_t t0 = mono_ms();
	CURLcode res;

	if (!admit(c, r))
		return false;
	up_begin(u, r);
	if (r->expect_continue && u->has_body &&
	    egr_conn_write(c, c->fd, "HTTP/1.1 100 Continue\r\n\r\n", 25))
		return false;
	build_headers(u);
	set_options(u);
	atomic_fetch_add(&f->n_requests, 1);
	res = perform(u);
	if (res != CURLE_OK && !u->head_written) {
		/* The head never left: the client can still get a proper error instead. */
		u->head_sent = false;
		buf_reset(&u->pending);
	}
	if (!u->head_sent) {
		fail_before_head(c, u, r, res);
		return false;
	}
	if (res == CURLE_OK && limits_told(u)) {
		u->client_err = -EPIPE;
		return false;
	}
	egr_answer_end(&u->ans);
	if (res != CURLE_OK) {
		fail_after_head(c, u, r, res);
		return false;
	}
	/* The answer is whole: what was held back as maybe the start of a secret was not. */
	if (u->ans.held.len && write_piece(u, u->ans.held.data, u->ans.held.len))
		return false;
	if (u->chunked_out)
		buf_adds(&u->pending, "0\r\n\r\n");
	if (flush_pending(u))
		return false;
	log_debug(f->rid, "%s: %s %.*s: %d, %llu bytes in %llu ms", c->tag, r->method,
		  PATH_FMT_ARGS(r), u->status, (unsigned long long)u->down,
		  (unsigned long long)(mono_ms() - t0));
	return !u->close_after;
}

void egr_upstream_serve(struct egr_conn *c)
{
	struct up *u = xcalloc(1, sizeof(*u));

	c->mode_state = u;
	u->c = c;
	buf_init(&u->url);
	buf_init(&u->rlines);
	buf_init(&u->pending);
	buf_init(&u->masked);
	buf_init(&u->held_body);
	buf_init(&u->ans.held);
	u->multi = curl_multi_init();
	u->easy = curl_easy_init();
	if (!u->multi || !u->easy) {
		log_warnx(c->f->rid, "%s: libcurl could not start", c->tag);
		egr_conn_error(c, 502, "api_error", "OLP egress: out of resources");
		return;
	}
	for (;;) {
		struct egr_req r;
		int st = egr_conn_read_head(c, &r);
		bool keep;

		if (st < 0) {
			egr_req_release(&r);
			break; /* closed, stalled, stopped: nothing to answer */
		}
		if (st > 0) {
			refuse(c, &r, st, st == 431 ? "request_too_large" : "invalid_request_error",
			       st == 431 ? "OLP egress: the request head is too large"
					 : "OLP egress: malformed request");
			egr_req_release(&r);
			break;
		}
		keep = serve_one(c, u, &r);
		u->req = NULL;
		egr_req_release(&r);
		if (!keep)
			break;
	}
}

void egr_upstream_conn_release(struct egr_conn *c)
{
	struct up *u = c->mode_state;

	if (!u)
		return;
	if (u->easy)
		curl_easy_cleanup(u->easy);
	if (u->multi)
		curl_multi_cleanup(u->multi);
	curl_slist_free_all(u->hdrs);
	buf_release(&u->url);
	buf_release(&u->rlines);
	buf_release(&u->pending);
	buf_release(&u->masked);
	buf_release(&u->held_body);
	egr_answer_release(&u->ans);
	free(u);
	c->mode_state = NULL;
}

/* ---- the forwarder's share ------------------------------------------------------------ */

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *ud)
{
	struct egr_forwarder *f = ud;

	(void)h;
	(void)access;
	pthread_mutex_lock(&f->share_lock[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *ud)
{
	struct egr_forwarder *f = ud;

	(void)h;
	pthread_mutex_unlock(&f->share_lock[data]);
}

int egr_upstream_init(struct egr_forwarder *f)
{
	CURLSH *sh = curl_share_init();

	if (!sh)
		return -ENOMEM;
	for (size_t i = 0; i < ARRAY_SIZE(f->share_lock); i++)
		pthread_mutex_init(&f->share_lock[i], NULL);
	curl_share_setopt(sh, CURLSHOPT_LOCKFUNC, share_lock);
	curl_share_setopt(sh, CURLSHOPT_UNLOCKFUNC, share_unlock);
	curl_share_setopt(sh, CURLSHOPT_USERDATA, f);
	/* Not CURL_LOCK_DATA_CONNECT: libcurl does not support one connection cache used
	 * by several threads at once. Each client connection keeps its own. */
	curl_share_setopt(sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
	curl_share_setopt(sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
	f->curl_share = sh;
	return 0;
}

void egr_upstream_release(struct egr_forwarder *f)
{
	if (!f->curl_share)
		return;
	curl_share_cleanup(f->curl_share);
	f->curl_share = NULL;
	for (size_t i = 0; i < ARRAY_SIZE(f->share_lock); i++)
		pthread_mutex_destroy(&f->share_lock[i]);
}
