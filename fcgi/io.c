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

/* The FastCGI record (the FastCGI 1.0 specification, 3.3) that carries the answer. */
#define FCGI_VERSION_1 1
#define FCGI_STDOUT 6
#define FCGI_MAX_CONTENT 0xffff
/* Under this, what a request wrote (io->queued: with the kernel's bookkeeping per write,
 * ~600 bytes) is below the smallest send buffer Linux gives a socket (SOCK_MIN_SNDBUF,
 * 4.5 KiB, unix or TCP): 24 more bytes cannot block. One write of up to 2 KiB. */
#define FCGI_FINISH_NOWAIT_BYTES 3072

/* The answer as FCGI_STDOUT records, written here rather than with FCGX_PutStr: libfcgi
 * writes with a blocking write(2) that waits for the web server to read, past any
 * deadline. Its own stdout stream stays empty, so that FCGX_Finish_r still writes the end
 * of the stream and of the request after ours. 0 or -errno (-ETIMEDOUT: the deadline). */
static int fcgx_write(struct fcgi_io *io, const char *data, size_t len)
{
	struct buf rec = BUF_INIT;
	int id = io->fcgx->requestId, ret = 0;

	while (len && !ret) {
		size_t n = len > FCGI_MAX_CONTENT ? FCGI_MAX_CONTENT : len;
		/* Version, type, request id and content length (big-endian), no padding. */
		unsigned char head[8] = { FCGI_VERSION_1, FCGI_STDOUT, id >> 8, id, n >> 8, n };

		buf_reset(&rec);
		buf_add(&rec, head, sizeof(head));
		buf_add(&rec, data, n);
		ret = write_all_until(io->fcgx->ipcFd, rec.data, rec.len, io->deadline);
		if (!ret)
			io->queued += rec.len + 1024;
		data += n;
		len -= n;
	}
	buf_release(&rec);
	return ret;
}

int fcgi_io_write(struct fcgi_io *io, const char *data, size_t len)
{
	int ret;

	if (io->failed || io->finished)
		return -1;
	/* Pushed to the web server now: SSE must not wait in a buffer. */
	if (io->fcgx)
		ret = fcgx_write(io, data, len);
	else
		ret = write_all_until(STDOUT_FILENO, data, len, io->deadline);
	if (ret) {
		io->failed = true;
		io->stalled = ret == -ETIMEDOUT;
		return -1;
	}
	return 0;
}

void fcgi_io_finish(struct fcgi_io *io)
{
	if (io->finished)
		return;
	io->finished = true;
	io->hangup_fd = -1;
	if (!io->fcgx) {
		close(STDOUT_FILENO); /* CGI: end of the response for the web server */
		return;
	}
	/* FCGX_Finish_r ends the request with a blocking write(2) of 24 bytes (two
	 * records): call it only once the socket has room for them, by the deadline
	 * (POLLOUT: at most a quarter of a unix socket's send buffer in use, or TCP's
	 * minimum write space free). A connection of this request alone that took at most
	 * FCGI_FINISH_NOWAIT_BYTES has room without asking (a poll(2) per request saved). */
	if (!io->failed && (io->fcgx->keepConnection || io->queued > FCGI_FINISH_NOWAIT_BYTES) &&
	    wait_writable(io->fcgx->ipcFd, io->deadline) == -ETIMEDOUT)
		io->failed = io->stalled = true;
	/* Drop the client: the web server sees our connection end before the end of the
	 * request (maybe in the middle of a record), and aborts the response instead of
	 * completing it. libfcgi's writes then fail at once. */
	if (io->failed)
		shutdown(io->fcgx->ipcFd, SHUT_RDWR);
	FCGX_Finish_r(io->fcgx); /* END_REQUEST; frees the params and closes the link */
}
