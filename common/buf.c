/* The growable byte buffer; invariants are in common.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "common/banned.h"

char buf_empty[1];

void buf_init(struct buf *b)
{
	b->data = buf_empty;
	b->len = 0;
	b->cap = 0;
}

void buf_release(struct buf *b)
{
	if (b->cap)
		free(b->data);
	buf_init(b);
}

void buf_grow(struct buf *b, size_t extra)
{
	size_t need;
	char *p;

	/* No buffer can be that large: the same policy as out of memory. */
	if (extra > SIZE_MAX - b->len - 1)
		abort();
	need = b->len + extra + 1;
	if (need <= b->cap)
		return;
	if (need < 64)
		need = 64;
	if (need < b->cap + b->cap / 2)
		need = b->cap + b->cap / 2;
	p = xrealloc(b->cap ? b->data : NULL, need);
	if (!b->cap)
		p[0] = '\0';
	b->data = p;
	b->cap = need;
}

void buf_add_grow(struct buf *b, const void *data, size_t len)
{
	if (!len)
		return;
	if (len >= b->cap - b->len) /* no room (cap 0 included) */
		buf_grow(b, len);
	memcpy(b->data + b->len, data, len);
	b->len += len;
	b->data[b->len] = '\0';
}

void buf_addch(struct buf *b, char c)
{
	if (b->len + 1 >= b->cap)
		buf_grow(b, 1);
	b->data[b->len++] = c;
	b->data[b->len] = '\0';
}

void buf_vaddf(struct buf *b, const char *fmt, va_list ap)
{
	va_list cp;
	int n;

	va_copy(cp, ap);
	n = vsnprintf(b->data + b->len, b->cap ? b->cap - b->len : 0, fmt, cp);
	va_end(cp);
	if (n < 0)
		return;
	if ((size_t)n >= (b->cap ? b->cap - b->len : 0)) {
		buf_grow(b, (size_t)n);
		n = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
		if (n < 0) {
			b->data[b->len] = '\0';
			return;
		}
	}
	b->len += (size_t)n;
}

void buf_addf(struct buf *b, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	buf_vaddf(b, fmt, ap);
	va_end(ap);
}

void buf_add_uint(struct buf *b, uint64_t v)
{
	char d[20];
	size_t n = 0;

	do
		d[sizeof(d) - ++n] = (char)('0' + v % 10);
	while ((v /= 10));
	buf_add(b, d + sizeof(d) - n, n);
}

void buf_add_int(struct buf *b, int64_t v)
{
	if (v < 0) {
		buf_addch(b, '-');
		buf_add_uint(b, -(uint64_t)v); /* INT64_MIN too */
		return;
	}
	buf_add_uint(b, (uint64_t)v);
}

void buf_reset(struct buf *b)
{
	b->len = 0;
	if (b->cap)
		b->data[0] = '\0';
}

void buf_consume(struct buf *b, size_t n)
{
	if (n >= b->len) {
		buf_reset(b);
		return;
	}
	memmove(b->data, b->data + n, b->len - n);
	b->len -= n;
	b->data[b->len] = '\0';
}

char *buf_detach(struct buf *b, size_t *len)
{
	char *p;

	if (!b->cap)
		buf_grow(b, 0);
	p = b->data;
	if (len)
		*len = b->len;
	buf_init(b);
	return p;
}

void buf_commit(struct buf *b, size_t n)
{
	b->len += n;
	b->data[b->len] = '\0';
}

ssize_t buf_read_once(struct buf *b, int fd, size_t hint)
{
	ssize_t n;

	buf_grow(b, hint);
	do
		n = read(fd, buf_tail(b), hint);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	buf_commit(b, (size_t)n);
	return n;
}

int buf_read_file(struct buf *b, const char *path, size_t max)
{
	size_t start = b->len;
	int fd, ret = 0;
	ssize_t n;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return -errno;
	for (;;) {
		n = buf_read_once(b, fd, 65536);
		if (n < 0) {
			ret = (int)n;
			break;
		}
		if (n == 0)
			break;
		if (b->len - start > max) {
			ret = -EFBIG;
			break;
		}
	}
	close(fd);
	return ret;
}
