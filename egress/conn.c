/* One client connection's waits and I/O, for the modes (connect.c, upstream.c) below the
 * forwarder's threads (forwarder.c) and above nothing but the request parser (http.c).
 *
 * Every wait is a poll(2) on two descriptors: the one the connection waits for (the
 * client's socket or the upstream's) and the forwarder's stop eventfd, which, written once
 * and never read, stays readable after egr_stop() and so ends every wait at once. Each
 * wait gives up at the connection's deadline or after the idle limit (egr_conn_until). */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "egress/internal.h"
#include "common/banned.h"

#define READ_HINT 16384

uint64_t egr_conn_until(const struct egr_conn *c)
{
	uint64_t t = mono_ms() + c->f->lim.idle_ms, d = c->f->lim.deadline_ms;

	return d && d < t ? d : t;
}

int egr_conn_wait(struct egr_conn *c, int fd, short events, uint64_t until_ms)
{
	struct pollfd p[2] = { { .fd = fd, .events = events },
			       { .fd = c->f->stop_fd, .events = POLLIN } };

	for (;;) {
		uint64_t now = mono_ms(), left = until_ms > now ? until_ms - now : 0;
		int timeout = !until_ms ? -1 : left > INT_MAX ? INT_MAX : (int)left, n;

		n = poll(p, 2, timeout);
		if (n < 0 && errno != EINTR)
			return -errno;
		if (n > 0 && p[1].revents)
			return -ECANCELED;
		if (n > 0)
			return 0; /* ready, or failed: the next read or write says how */
		if (n == 0 && timeout == 0)
			return -ETIMEDOUT;
	}
}

ssize_t egr_conn_fill(struct egr_conn *c, size_t hint)
{
	uint64_t until = egr_conn_until(c);

	for (;;) {
		ssize_t n = buf_read_once(&c->in, c->fd, hint);
		int w;

		if (n >= 0)
			return n;
		if (n != -EAGAIN && n != -EINTR)
			return n;
		if ((w = egr_conn_wait(c, c->fd, POLLIN, until)))
			return w;
	}
}

int egr_conn_writev(struct egr_conn *c, int fd, struct iovec *iov, int n)
{
	uint64_t until = egr_conn_until(c);

	while (n > 0) {
		struct msghdr m = { .msg_iov = iov, .msg_iovlen = (size_t)n };
		ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
		int ret;

		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				return -errno;
			if ((ret = egr_conn_wait(c, fd, POLLOUT, until)))
				return ret;
			continue;
		}
		while (n > 0 && (size_t)w >= iov->iov_len) {
			w -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if (n > 0) {
			iov->iov_base = (char *)iov->iov_base + w;
			iov->iov_len -= (size_t)w;
		}
	}
	return 0;
}

int egr_conn_write(struct egr_conn *c, int fd, const void *data, size_t len)
{
	struct iovec iov = { .iov_base = (void *)data, .iov_len = len };

	return egr_conn_writev(c, fd, &iov, 1);
}

int egr_conn_read_head(struct egr_conn *c, struct egr_req *r)
{
	size_t max = c->f->lim.max_header_bytes, scanned = 0;

	memset(r, 0, sizeof(*r));
	for (;;) {
		size_t from = scanned > 3 ? scanned - 3 : 0;
		const char *e = c->in.len > from
					? memmem(c->in.data + from, c->in.len - from, "\r\n\r\n", 4)
					: NULL;
		ssize_t n;

		if (e) {
			size_t hl = (size_t)(e - c->in.data) + 4;
			int ret;

			if (hl > max)
				return 431;
			ret = egr_req_parse(r, c->in.data, hl);
			buf_consume(&c->in, hl);
			return ret;
		}
		scanned = c->in.len;
		if (c->in.len > max)
			return 431;
		n = egr_conn_fill(c, READ_HINT);
		if (n == 0)
			return c->in.len ? -ECONNRESET : -ENODATA;
		if (n < 0)
			return (int)n;
	}
}

void egr_conn_error(struct egr_conn *c, int status, const char *type, const char *msg)
{
	struct buf body = BUF_INIT, head = BUF_INIT;
	struct iovec iov[2];

	buf_adds(&body, "{\"type\":\"error\",\"error\":{\"type\":");
	buf_add_json_str(&body, type, strlen(type));
	buf_adds(&body, ",\"message\":");
	buf_add_json_str(&body, msg, strlen(msg));
	buf_adds(&body, "}}");
	buf_addf(&head,
		 "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
		 "Connection: close\r\n\r\n",
		 status, egr_reason(status), body.len);
	iov[0] = (struct iovec){ .iov_base = head.data, .iov_len = head.len };
	iov[1] = (struct iovec){ .iov_base = body.data, .iov_len = body.len };
	(void)egr_conn_writev(c, c->fd, iov, 2);
	if (status == 502 || status == 504)
		atomic_fetch_add(&c->f->n_upstream_errors, 1);
	else
		atomic_fetch_add(&c->f->n_refused, 1);
	buf_release(&head);
	buf_release(&body);
}
