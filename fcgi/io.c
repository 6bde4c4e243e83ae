/* One request's I/O: FastCGI records with a write deadline, or CGI's stdin/stdout
 * (worker.h says what the fcgi_io_* calls promise). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fcgi/worker.h"
#include "common/banned.h"

const char *fcgi_io_param(struct fcgi_io *io, const char *name)
{
	if (io->finished)
		return NULL;
	if (io->fcgx)
		return FCGX_GetParam(name, io->envp);
	/* Plain CGI: the request is the environment. getenv on a serving thread is safe
	 * because nothing changes the environment once the worker serves (fcgi/main.c). */
	return getenv(name);
}

ssize_t fcgi_io_read(struct fcgi_io *io, char *dst, size_t n)
{
	if (n > (1 << 20))
		n = 1 << 20;
	if (io->fcgx) {
		int got = FCGX_GetStr(dst, (int)n, io->fcgx->in);

		return got < 0 ? -1 : got;
	}
	for (;;) {
		ssize_t got = read(STDIN_FILENO, dst, n);

		if (got < 0 && errno == EINTR)
			continue;
		return got;
	}
}

void fcgi_io_set_deadline(struct fcgi_io *io, uint64_t deadline_ms)
{
	io->deadline = deadline_ms;
}

/* The FastCGI records (the FastCGI 1.0 specification, 3.3 and 5.5) of the answer and of
 * the end of the request. */
#define FCGI_VERSION_1 1
#define FCGI_END_REQUEST 3
#define FCGI_STDOUT 6
#define FCGI_MAX_CONTENT 0xffff

/* data as FCGI_STDOUT records (version, type, request id and content length, big-endian,
 * no padding) appended to rec. */
static void add_stdout_records(struct buf *rec, int id, const char *data, size_t len)
{
	while (len) {
		size_t n = len > FCGI_MAX_CONTENT ? FCGI_MAX_CONTENT : len;
		unsigned char head[8] = { FCGI_VERSION_1, FCGI_STDOUT, id >> 8, id, n >> 8, n };

		buf_add(rec, head, sizeof(head));
		buf_add(rec, data, n);
		data += n;
		len -= n;
	}
}

/* The answer as FCGI_STDOUT records, written here rather than with FCGX_PutStr: libfcgi
 * writes with a blocking write(2) that waits for the web server to read, past any
 * deadline. Its own stdout stream stays empty, so that FCGX_Finish_r (if it ends the
 * request: finish_by_libfcgi) still writes the end of the stream and of the request after
 * ours. 0 or -errno (-ETIMEDOUT: the deadline). */
static int fcgx_write(struct fcgi_io *io, const char *data, size_t len)
{
	struct buf rec = BUF_INIT;
	int ret = 0;

	while (len && !ret) {
		size_t n = len > FCGI_MAX_CONTENT ? FCGI_MAX_CONTENT : len;

		buf_reset(&rec);
		add_stdout_records(&rec, io->fcgx->requestId, data, n);
		ret = write_all_until(io->fcgx->ipcFd, rec.data, rec.len, io->deadline);
		data += n;
		len -= n;
	}
	buf_release(&rec);
	return ret;
}

/* Write what fcgi_io_write_last holds, if anything. */
static int flush_held(struct fcgi_io *io)
{
	int ret = 0;

	if (io->held.len)
		ret = io->fcgx ? fcgx_write(io, io->held.data, io->held.len)
			       : write_all_until(STDOUT_FILENO, io->held.data, io->held.len,
						 io->deadline);
	buf_release(&io->held);
	return ret;
}

static int io_failed(struct fcgi_io *io, int ret)
{
	io->failed = true;
	io->stalled = ret == -ETIMEDOUT;
	return -1;
}

int fcgi_io_write(struct fcgi_io *io, const char *data, size_t len)
{
	int ret;

	if (io->failed || io->finished)
		return -1;
	/* Pushed to the web server now: SSE must not wait in a buffer. */
	ret = flush_held(io);
	if (!ret)
		ret = io->fcgx ? fcgx_write(io, data, len)
			       : write_all_until(STDOUT_FILENO, data, len, io->deadline);
	return ret ? io_failed(io, ret) : 0;
}

int fcgi_io_write_last(struct fcgi_io *io, struct buf *b)
{
	int ret;

	if (io->failed || io->finished) {
		buf_release(b);
		return -1;
	}
	ret = flush_held(io);
	io->held = *b; /* taken: written with the end of the request */
	buf_init(b);
	return ret ? io_failed(io, ret) : 0;
}

/* Whether the web server's connection is a unix socket (asked once: every connection
 * comes from the same listening socket). */
static bool conn_is_unix(int fd)
{
	static int is_unix = -1; /* not asked yet; threads that race store the same answer */
	int v = __atomic_load_n(&is_unix, __ATOMIC_RELAXED);

	if (v < 0) {
		struct sockaddr_storage ss = { 0 };
		socklen_t sl = sizeof(ss);

		v = getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 && ss.ss_family == AF_UNIX;
		__atomic_store_n(&is_unix, v, __ATOMIC_RELAXED);
	}
	return v;
}

/* Close the finished request's connection. libfcgi's close lingers: shutdown(SHUT_WR),
 * then a poll(2) of up to 2 s and reads until the web server closes its end, so that TCP
 * does not answer the web server's unread bytes with a reset that would discard the
 * answer. On a unix socket with nothing unread there is no reset to fear (the answer
 * already sits in the web server's receive queue, and stays readable after our close):
 * a plain close(2), without waiting for the web server (three system calls and a sleep
 * and a wake-up of the thread per request saved), unless io->linger asks to wait. */
static void fcgx_close(struct fcgi_io *io)
{
	FCGX_Request *req = io->fcgx;
	char c;
	ssize_t n;

	if (io->linger || !conn_is_unix(req->ipcFd)) {
		FCGX_Free(req, 1);
		return;
	}
	n = recv(req->ipcFd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
	if (n > 0) { /* the web server sent more than was read: libfcgi's close */
		FCGX_Free(req, 1);
		return;
	}
	FCGX_Free(req, 0); /* the params and streams; the connection is ours to close */
	close(req->ipcFd);
	req->ipcFd = -1; /* libfcgi's "no connection": the next FCGX_Accept_r accepts */
}

/* End the request as libfcgi does, with its blocking write(2) of 24 bytes (two records)
 * for a connection kept for more requests: called only once the socket has room for
 * them, by the deadline (POLLOUT: at most a quarter of a unix socket's send buffer in
 * use, or TCP's minimum write space free). */
static void finish_by_libfcgi(struct fcgi_io *io)
{
	int ret = io->failed ? 0 : flush_held(io);

	buf_release(&io->held);
	if (ret)
		(void)io_failed(io, ret);
	if (!io->failed && wait_writable(io->fcgx->ipcFd, io->deadline) == -ETIMEDOUT)
		io->failed = io->stalled = true;
	if (io->failed)
		shutdown(io->fcgx->ipcFd, SHUT_RDWR);
	FCGX_Finish_r(io->fcgx); /* END_REQUEST; frees the params */
}

/* The rest of the answer (what fcgi_io_write_last holds), the end of the stdout stream and
 * FCGI_END_REQUEST (application status 0, FCGI_REQUEST_COMPLETE): one write by the
 * deadline, where libfcgi's FCGX_Finish_r would make a second, blocking one. */
static int write_end(struct fcgi_io *io)
{
	struct buf rec = BUF_INIT;
	int id = io->fcgx->requestId, ret;
	const unsigned char end[24] = { FCGI_VERSION_1, FCGI_STDOUT,	  id >> 8, id, 0, 0, 0, 0,
					FCGI_VERSION_1, FCGI_END_REQUEST, id >> 8, id, 0, 8 };

	buf_grow(&rec, io->held.len + 32);
	add_stdout_records(&rec, id, io->held.data, io->held.len);
	buf_add(&rec, end, sizeof(end));
	buf_release(&io->held);
	ret = write_all_until(io->fcgx->ipcFd, rec.data, rec.len, io->deadline);
	buf_release(&rec);
	return ret;
}

void fcgi_io_finish(struct fcgi_io *io)
{
	int ret;

	if (io->finished)
		return;
	io->hangup_fd = -1;
	if (!io->fcgx) {
		if (!io->failed && (ret = flush_held(io)))
			(void)io_failed(io, ret);
		buf_release(&io->held);
		io->finished = true;
		close(STDOUT_FILENO); /* CGI: end of the response for the web server */
		return;
	}
	if (io->fcgx->keepConnection) {
		finish_by_libfcgi(io);
		io->finished = true;
		return;
	}
	if (!io->failed && (ret = write_end(io)))
		(void)io_failed(io, ret);
	buf_release(&io->held);
	io->finished = true;
	/* Drop the client: the web server sees our connection end before the end of the
	 * request (maybe in the middle of a record), and aborts the response instead of
	 * completing it. */
	if (io->failed) {
		shutdown(io->fcgx->ipcFd, SHUT_RDWR);
		FCGX_Free(io->fcgx, 1);
		return;
	}
	fcgx_close(io);
}
