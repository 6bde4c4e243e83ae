/* Logging, JSON string escaping and small helpers shared by every module. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "common/banned.h"

static enum log_level log_min = LOG_LVL_INFO;
static const char *const level_names[] = { "debug", "info", "warn", "error" };
static const char *log_prog = "olp";

void log_set_level(enum log_level min)
{
	log_min = min;
}

bool log_enabled(enum log_level lvl)
{
	return lvl >= log_min;
}

void log_set_program(const char *name)
{
	log_prog = name;
}

/* End line with '}' and a newline and write it: one write(2), so that lines from many
 * threads and processes never interleave. */
static void line_write(struct buf *line)
{
	buf_add(line, "}\n", 2);
	(void)write_all(STDERR_FILENO, line->data, line->len);
}

void log_line(const char *json)
{
	struct buf b = BUF_INIT;

	buf_adds(&b, json);
	buf_addch(&b, '\n');
	(void)write_all(STDERR_FILENO, b.data, b.len);
	buf_release(&b);
}

/* The process id as every line gives it, read once per process (a system call per line
 * otherwise): a forked child reads its own (log_pid_reset, run by pthread_atfork). */
static char log_pid[24];
static pthread_once_t log_pid_once = PTHREAD_ONCE_INIT;

/* Async-signal-safe (it also runs in a child between fork and exec): no printf. */
static void log_pid_reset(void)
{
	char d[sizeof(log_pid)];
	unsigned long v = (unsigned long)getpid();
	size_t n = 0, i;

	do
		d[n++] = (char)('0' + v % 10);
	while ((v /= 10) && n < sizeof(d) - 1);
	for (i = 0; i < n; i++)
		log_pid[i] = d[n - 1 - i];
	log_pid[n] = '\0';
}

static void log_pid_init(void)
{
	log_pid_reset();
	(void)pthread_atfork(NULL, NULL, log_pid_reset);
}

/* The members every line starts with: ts, level, prog, pid. */
static void line_head(struct buf *line, enum log_level lvl)
{
	char when[WALL_ISO_MAX];

	pthread_once(&log_pid_once, log_pid_init);
	wall_iso_now(when);
	buf_grow(line, 256); /* a request's line, at once */
	buf_adds(line, "{\"ts\":\"");
	buf_adds(line, when);
	buf_adds(line, "\",\"level\":\"");
	buf_adds(line, level_names[lvl]);
	buf_adds(line, "\",\"prog\":");
	buf_add_json_str(line, log_prog, strlen(log_prog));
	buf_adds(line, ",\"pid\":");
	buf_adds(line, log_pid);
}

void log_event(const char *event, const char *rid, const char *fields)
{
	struct buf line = BUF_INIT;

	line_head(&line, LOG_LVL_INFO);
	buf_adds(&line, ",\"event\":");
	buf_add_json_str(&line, event, strlen(event));
	if (rid) {
		buf_adds(&line, ",\"request_id\":");
		buf_add_json_str(&line, rid, strlen(rid));
	}
	buf_adds(&line, fields);
	line_write(&line);
	buf_release(&line);
}

void log_msg(enum log_level lvl, int with_errno, const char *rid, const char *fmt, ...)
{
	int saved = errno;
	struct buf msg = BUF_INIT, line = BUF_INIT;
	va_list ap;

	if (lvl < log_min)
		return;
	va_start(ap, fmt);
	buf_vaddf(&msg, fmt, ap);
	va_end(ap);
	if (with_errno)
		buf_addf(&msg, ": %s", strerror(saved));

	line_head(&line, lvl);
	if (rid) {
		buf_adds(&line, ",\"request_id\":");
		buf_add_json_str(&line, rid, strlen(rid));
	}
	buf_adds(&line, ",\"msg\":");
	buf_add_json_str(&line, msg.data, msg.len);
	line_write(&line);
	buf_release(&msg);
	buf_release(&line);
	errno = saved;
}

/* Length of the valid UTF-8 sequence at s (at most n bytes), or 0 when invalid. */
static size_t utf8_seq_len(const unsigned char *s, size_t n)
{
	size_t len, i;
	uint32_t cp;

	if (s[0] < 0x80)
		return 1;
	if ((s[0] & 0xe0) == 0xc0) {
		len = 2;
		cp = s[0] & 0x1f;
	} else if ((s[0] & 0xf0) == 0xe0) {
		len = 3;
		cp = s[0] & 0x0f;
	} else if ((s[0] & 0xf8) == 0xf0) {
		len = 4;
		cp = s[0] & 0x07;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	for (i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	/* Overlong forms, surrogates and values past U+10FFFF are not valid UTF-8. */
	if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
	    (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
		return 0;
	return len;
}

bool utf8_valid(const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0, n;

	while (i < len) {
		n = utf8_seq_len(p + i, len - i);
		if (!n)
			return false;
		i += n;
	}
	return true;
}

/* Whether c stands for itself in a JSON string: printable ASCII but '"' and '\\'. */
static inline bool json_plain(unsigned char c)
{
	return (unsigned char)(c - 0x20) < 0x60 && c != '"' && c != '\\';
}

/* How many bytes from p (at most len) are json_plain. Eight at a time while none of the
 * eight can be other (a control character, a byte >= 0x80, '"' or '\\': the classic
 * "has a byte less than / equal to" tests, which may flag a plain byte above a flagged
 * one, never miss one), then byte by byte: an answer's strings are mostly plain. */
static size_t json_plain_run(const unsigned char *p, size_t len)
{
	const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
	size_t i = 0;

	for (; i + 8 <= len; i += 8) {
		uint64_t w, q, bs;

		memcpy(&w, p + i, 8);
		q = w ^ (ones * '"');
		bs = w ^ (ones * '\\');
		if (((w - ones * 0x20) | w | ((q - ones) & ~q) | ((bs - ones) & ~bs)) & high)
			break;
	}
	while (i < len && json_plain(p[i]))
		i++;
	return i;
}

void buf_add_json_str(struct buf *b, const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0, run;

	buf_grow(b, len + 2);
	buf_addch(b, '"');
	while (i < len) {
		unsigned char c = p[i];

		if (json_plain(c)) {
			run = json_plain_run(p + i, len - i);
			buf_add(b, p + i, run);
			i += run;
			continue;
		}
		switch (c) {
		case '"': buf_adds(b, "\\\""); break;
		case '\\': buf_adds(b, "\\\\"); break;
		case '\n': buf_adds(b, "\\n"); break;
		case '\r': buf_adds(b, "\\r"); break;
		case '\t': buf_adds(b, "\\t"); break;
		default:
			if (c < 0x20) {
				buf_addf(b, "\\u%04x", c);
			} else {
				size_t n = utf8_seq_len(p + i, len - i);

				if (!n) {
					buf_adds(b, "\\ufffd");
					n = 1;
				} else {
					buf_add(b, p + i, n);
				}
				i += n;
				continue;
			}
		}
		i++;
	}
	buf_addch(b, '"');
}

uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

struct timespec clock_after_ms(clockid_t clk, uint64_t ms)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	ts.tv_sec += (time_t)(ms / 1000);
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	return ts;
}

void wall_iso_now(char out[WALL_ISO_MAX])
{
	/* The part up to the second, made again only when the second changes. */
	static _Thread_local char head[24];
	static _Thread_local time_t head_sec = -1;
	struct timespec ts;
	long ms;

	clock_gettime(CLOCK_REALTIME, &ts);
	if (ts.tv_sec != head_sec) {
		struct tm tm;

		gmtime_r(&ts.tv_sec, &tm);
		if (strftime(head, sizeof(head), "%Y-%m-%dT%H:%M:%S", &tm) != 19)
			memcpy(head, "0000-00-00T00:00:00", 20); /* a year past 9999 */
		head_sec = ts.tv_sec;
	}
	ms = ts.tv_nsec / 1000000;
	memcpy(out, head, 19);
	out[19] = '.';
	out[20] = (char)('0' + ms / 100);
	out[21] = (char)('0' + ms / 10 % 10);
	out[22] = (char)('0' + ms % 10);
	out[23] = 'Z';
	out[24] = '\0';
}

int64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	ssize_t n;

	while (len) {
		n = write(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int write_control_file(const char *path, const char *text)
{
	size_t len = strlen(text);
	int fd = open(path, O_WRONLY | O_CLOEXEC), ret = 0;
	ssize_t n;

	if (fd < 0)
		return -errno;
	do
		n = write(fd, text, len);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		ret = -errno;
	else if ((size_t)n != len)
		ret = -EIO;
	close(fd);
	return ret;
}

int wait_writable(int fd, uint64_t deadline_ms)
{
	struct pollfd pfd = { .fd = fd, .events = POLLOUT };

	for (;;) {
		uint64_t now = mono_ms(), left = deadline_ms > now ? deadline_ms - now : 0;
		int timeout = !deadline_ms ? -1 : left > INT_MAX ? INT_MAX : (int)left;
		int n = poll(&pfd, 1, timeout);

		if (n > 0)
			return 0;
		if (n < 0 && errno != EINTR)
			return -errno;
		if (n == 0 && timeout == 0)
			return -ETIMEDOUT;
	}
}

int write_all_until(int fd, const void *buf, size_t len, uint64_t deadline_ms)
{
	const char *p = buf;
	bool sock = true;
	int flags = -1, ret = 0;

	while (len) {
		ssize_t n =
			sock ? send(fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL) : write(fd, p, len);

		if (n >= 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (errno == ENOTSOCK && sock) {
			sock = false;
			flags = fcntl(fd, F_GETFL);
			if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
				ret = -errno;
				break;
			}
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK) {
			ret = -errno;
			break;
		}
		ret = wait_writable(fd, deadline_ms);
		if (ret)
			break;
	}
	if (flags >= 0 && !(flags & O_NONBLOCK))
		(void)fcntl(fd, F_SETFL, flags);
	return ret;
}

void random_hex(char *out, size_t nbytes)
{
	static const char hex[] = "0123456789abcdef";
	unsigned char raw[64];
	size_t i;

	if (nbytes > sizeof(raw))
		nbytes = sizeof(raw);
	if (getrandom(raw, nbytes, 0) != (ssize_t)nbytes)
		abort();
	for (i = 0; i < nbytes; i++) {
		out[2 * i] = hex[raw[i] >> 4];
		out[2 * i + 1] = hex[raw[i] & 15];
	}
	out[2 * nbytes] = '\0';
}

void unique_hex16(char out[17])
{
	static const char hex[] = "0123456789abcdef";
	static _Thread_local uint64_t state;
	static _Thread_local bool seeded;
	uint64_t z;

	if (!seeded) {
		if (getrandom(&state, sizeof(state), 0) != (ssize_t)sizeof(state))
			abort();
		seeded = true;
	}
	/* splitmix64 (Steele, Lea, Flood 2014): a bijection of a counter that steps by an odd
	 * constant, so one thread's ids repeat only after 2^64 of them; threads and
	 * processes start from independent random points. */
	z = (state += UINT64_C(0x9e3779b97f4a7c15));
	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	z ^= z >> 31;
	for (int i = 15; i >= 0; i--, z >>= 4)
		out[i] = hex[z & 15];
	out[16] = '\0';
}

int parse_u64(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (!s || !*s)
		return -EINVAL;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -EINVAL;
		if (v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
			return -ERANGE;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*out = v;
	return 0;
}

char *path_join(const char *dir, const char *name)
{
	struct buf b = BUF_INIT;

	buf_addf(&b, "%s/%s", dir, name);
	return buf_detach(&b, NULL);
}

int path_join_buf(char *out, size_t n, const char *dir, const char *name)
{
	int len = snprintf(out, n, "%s/%s", dir, name);

	return len < 0 || (size_t)len >= n ? -ENAMETOOLONG : 0;
}
