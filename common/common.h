/* common: the few helpers every module shares — a growable byte buffer, allocation that
 * aborts and a string vector, JSON-lines logging, and small fd/path/time utilities.
 * Nothing here knows of HTTP, keys or providers.
 *
 * Names: each family is named after what it works on — buf_ (struct buf), strv_ (struct
 * strv), x (the allocators), log_ (stderr lines), path_, parse_, mono_ (the monotonic
 * clock), wall_ (the wall clock), write_/wait_ (a descriptor) — and every function's
 * contract is here; the CUnit suite (tests/common) checks each through this header.
 *
 * Out of memory: allocation failure aborts, everywhere in the tree (see xmalloc below), so
 * no function here returns -ENOMEM. */
#ifndef OLP_COMMON_H
#define OLP_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

/* ---- struct buf: a growable byte buffer -------------------------------------------
 * Invariants (after buf_init and until buf_release):
 *  - b->data is never NULL (it points at a shared empty string until the first growth);
 *  - b->data[b->len] == '\0', so the contents can be used as a C string when they
 *    hold no NUL byte;
 *  - b->len < b->cap whenever b->cap != 0.
 * Allocation failure aborts: a worker cannot answer anything useful without memory. */
struct buf {
	char *data;
	size_t len;
	size_t cap;
};

#define BUF_INIT                                      \
	{                                             \
		.data = buf_empty, .len = 0, .cap = 0 \
	}
/* The shared empty string of every unallocated buffer: never written (cap == 0 guards it). */
extern char buf_empty[];

void buf_init(struct buf *b);
void buf_release(struct buf *b);
/* Make room for at least extra more bytes (plus the terminating NUL). A size past SIZE_MAX
 * aborts, as running out of memory does. */
void buf_grow(struct buf *b, size_t extra);
/* buf_add's path when b has no room for len more bytes (or len is 0). */
void buf_add_grow(struct buf *b, const void *data, size_t len);
/* Append len bytes. Inline: a request's answer and log lines are built from a hundred
 * pieces, most of them literals whose length (buf_adds) and copy the compiler then knows. */
static inline void buf_add(struct buf *b, const void *data, size_t len)
{
	if (len && len < b->cap - b->len) {
		memcpy(b->data + b->len, data, len);
		b->len += len;
		b->data[b->len] = '\0';
		return;
	}
	buf_add_grow(b, data, len);
}
static inline void buf_adds(struct buf *b, const char *s)
{
	buf_add(b, s, strlen(s));
}
void buf_addch(struct buf *b, char c);
void buf_addf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_vaddf(struct buf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/* v in decimal, as "%llu" / "%lld" would write it, without printf's cost (a request's
 * JSON and log lines hold several). */
void buf_add_uint(struct buf *b, uint64_t v);
void buf_add_int(struct buf *b, int64_t v);
void buf_reset(struct buf *b);
/* Drop the first n bytes (n <= len). */
void buf_consume(struct buf *b, size_t n);
/* Hand the contents to the caller (free() them); b is left initialised and empty. */
char *buf_detach(struct buf *b, size_t *len);
/* Reading from a descriptor goes prepare → read(2) into buf_tail() → commit. */
static inline char *buf_tail(struct buf *b)
{
	return b->data + b->len;
}
void buf_commit(struct buf *b, size_t n);
/* One read(2) of up to hint bytes (hint > 0) appended to b, retried on EINTR: returns bytes
 * read, 0 at EOF, -errno. */
ssize_t buf_read_once(struct buf *b, int fd, size_t hint);
/* Append the whole file at path (at most max bytes) to b: 0, or -errno (-EFBIG when
 * larger). On failure b may hold part of the file after its old contents. */
int buf_read_file(struct buf *b, const char *path, size_t max);

/* ---- memory and string vectors ----------------------------------------------------
 * One out-of-memory policy for the whole tree: allocation failure aborts, as struct buf
 * does (a worker can answer nothing useful without memory, and a half-built request is
 * worse than a restarted worker). So nothing returns -ENOMEM; code that used to check
 * for it calls these instead. A size of 0 still gives a distinct pointer to free(). */
void *xmalloc(size_t n);
void *xcalloc(size_t nmemb, size_t size);
void *xrealloc(void *p, size_t n);
/* realloc to nmemb * size bytes, aborting on overflow as on failure. */
void *xreallocarray(void *p, size_t nmemb, size_t size);
char *xstrdup(const char *s);
/* A copy of at most the first n bytes of s, NUL-terminated. */
char *xstrndup(const char *s, size_t n);

/* struct strv: a growable vector of owned C strings, for argv, envp and lists.
 * Invariants (after STRV_INIT / strv_init and until strv_release):
 *  - v->v is NULL while v->n == 0 and nothing was pushed; after the first push it is
 *    NULL-terminated (v->v[v->n] == NULL), so it can be passed to execve as is;
 *  - every element is a heap copy owned by the vector. */
struct strv {
	char **v;
	size_t n;
	size_t cap;
};

#define STRV_INIT                           \
	{                                   \
		.v = NULL, .n = 0, .cap = 0 \
	}

/* Same as STRV_INIT; a zeroed struct strv is initialised too. */
void strv_init(struct strv *v);
/* Free every element and the array; v is left initialised and empty. */
void strv_release(struct strv *v);
/* Append a copy of s. */
void strv_push(struct strv *v, const char *s);
void strv_pushf(struct strv *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append s itself: the vector takes ownership of it. */
void strv_push_take(struct strv *v, char *s);
/* For an environment vector ("NAME=value"): replace NAME's entry, or append one.
 * -EINVAL when name is empty or holds '='. */
int strv_setenv(struct strv *v, const char *name, const char *value);
/* The index of the first element equal to s, or -1. */
ssize_t strv_find(const struct strv *v, const char *s);
/* Hand the NULL-terminated array to the caller (free each element, then the array);
 * v is left initialised and empty. Never NULL: an empty vector gives { NULL }. */
char **strv_detach(struct strv *v, size_t *n);

/* ---- logging ------------------------------------------------------------------------
 * One JSON object per line on stderr (lighttpd puts a FastCGI worker's stderr in its
 * error log). The _x variants leave errno out; the others append strerror(errno).
 * Never pass a key, a token, a hash or prompt text to these. */
enum log_level { LOG_LVL_DEBUG, LOG_LVL_INFO, LOG_LVL_WARN, LOG_LVL_ERROR };

/* Set once at start-up, before any thread logs (neither is synchronised). Lines below min
 * are dropped (default: info). name goes in every line's "prog" (default "olp") and is
 * borrowed: it must outlive all logging. */
void log_set_level(enum log_level min);
void log_set_program(const char *name);
/* Whether a line of level lvl is written (lvl >= the level set). */
bool log_enabled(enum log_level lvl);
void log_msg(enum log_level lvl, int with_errno, const char *rid, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
#define log_info(rid, ...) log_msg(LOG_LVL_INFO, 0, rid, __VA_ARGS__)
#define log_warn(rid, ...) log_msg(LOG_LVL_WARN, 1, rid, __VA_ARGS__)
#define log_warnx(rid, ...) log_msg(LOG_LVL_WARN, 0, rid, __VA_ARGS__)
#define log_err(rid, ...) log_msg(LOG_LVL_ERROR, 1, rid, __VA_ARGS__)
#define log_errx(rid, ...) log_msg(LOG_LVL_ERROR, 0, rid, __VA_ARGS__)
#define log_debug(rid, ...) log_msg(LOG_LVL_DEBUG, 0, rid, __VA_ARGS__)
/* Write one already-formed line (a JSON object, no newline) atomically to stderr. */
void log_line(const char *json);
/* A machine-read event line: {"ts","level":"info","prog","pid","event","request_id"<fields>}
 * where fields is "" or a JSON member list starting with a comma (",\"status\":200"). */
void log_event(const char *event, const char *rid, const char *fields);

/* ---- JSON string escaping ---------------------------------------------------------
 * Append s (len bytes, UTF-8) to b as a JSON string literal, quotes included. Invalid
 * UTF-8 becomes U+FFFD so that the output is always valid JSON. */
void buf_add_json_str(struct buf *b, const char *s, size_t len);
/* Whether s (len bytes) is valid UTF-8: no overlong forms, surrogates or values past
 * U+10FFFF (what jansson accepts in a string). */
bool utf8_valid(const char *s, size_t len);

/* ---- small utilities ------------------------------------------------------------- */
/* Monotonic clock in nanoseconds / milliseconds. */
uint64_t mono_ns(void);
static inline uint64_t mono_ms(void)
{
	return mono_ns() / 1000000u;
}
/* The wall clock (CLOCK_REALTIME) in milliseconds since the epoch: for timestamps that are
 * stored or shown, never for a wait or a duration (it can jump). */
int64_t wall_ms(void);
/* The time ms milliseconds from now on clock clk, for pthread_cond_timedwait (whose
 * condition variable was made with that clock: CLOCK_REALTIME unless set). */
struct timespec clock_after_ms(clockid_t clk, uint64_t ms);
/* The wall clock now as "YYYY-MM-DDTHH:MM:SS.mmmZ" (UTC, milliseconds) and a NUL: the
 * timestamps of log lines, the audit log and key manifests. */
#define WALL_ISO_MAX 25
void wall_iso_now(char out[WALL_ISO_MAX]);
/* write(2) all of buf, retrying on EINTR and short writes: 0 or -errno (-EAGAIN when fd is
 * non-blocking and full: use write_all_until for that). */
int write_all(int fd, const void *buf, size_t len);
/* Write text to the existing file path in one write(2), neither creating nor truncating
 * it: for the kernel's control files (/proc/PID/uid_map, setgroups...), which take their
 * whole value at once. 0, or -errno (-EIO for a short write). */
int write_control_file(const char *path, const char *text);
/* Write all of buf to fd, waiting for the reader no later than deadline_ms (mono_ms();
 * 0 = no limit): 0; -ETIMEDOUT when the reader had not taken it all by then (part of it
 * may have been written); or -errno (-EPIPE: the reader is gone). What can be written
 * without waiting always is, even past the deadline. A socket is written with
 * MSG_DONTWAIT | MSG_NOSIGNAL; any other fd (a pipe) is made non-blocking for the call
 * and restored, so nothing else may be using its open file description meanwhile. */
int write_all_until(int fd, const void *buf, size_t len, uint64_t deadline_ms);
/* Wait until fd can take more bytes (POLLOUT), or has failed (the next write says how),
 * no later than deadline_ms (0 = no limit): 0, -ETIMEDOUT or -errno. */
int wait_writable(int fd, uint64_t deadline_ms);
/* nbytes random bytes from getrandom(2) as 2 * nbytes lowercase hex digits and a NUL in
 * out (2 * nbytes + 1 bytes), for names no one can guess. At most 64 bytes: a larger
 * nbytes is cut to 64. Aborts when getrandom(2) fails: there is no safe fallback. */
void random_hex(char *out, size_t nbytes);
/* 16 lowercase hex digits and a NUL: an id that tells one thing from others (a request),
 * unique across this host's threads and processes with overwhelming probability, but no
 * secret: it comes from a per-thread generator seeded once from getrandom(2), so no
 * system call per id, and whoever sees ids could predict the next. Never for a name that
 * guards something (random_hex). A child forked without exec continues its parent's
 * thread's sequence. */
void unique_hex16(char out[17]);
/* "dir/name" in a new string (free() it). Nothing is normalised: "a/" and "b" give "a//b". */
char *path_join(const char *dir, const char *name);
/* "dir/name" into out (n bytes): 0, or -ENAMETOOLONG when it does not fit (out then holds
 * a cut copy, or nothing when n is 0: never use it). */
int path_join_buf(char *out, size_t n, const char *dir, const char *name);
/* Parse a decimal unsigned integer that must fill s entirely: 0 or -EINVAL/-ERANGE. */
int parse_u64(const char *s, uint64_t *out);

/* ---- slots: caps that hold across the processes of a host -------------------------
 * A cap of n is n files dir/prefix.<i>.slot (0600, created as needed; dir must exist);
 * a holder keeps one flock'ed. The kernel drops the lock when the holder dies, so a crash
 * never leaks a slot. prefix must be a plain file name part (no '/'): the caller makes it
 * safe; an empty prefix names the files <i>.slot. slot_take returns the held slot's fd
 * (close-on-exec; hand it to slot_release), -EBUSY when all n are held, -EINVAL when n is
 * 0, or -errno (-ENAMETOOLONG; -ELOOP for a symlink in a slot file's place). */
int slot_take(const char *dir, const char *prefix, unsigned n);
/* As slot_take, in the directory open on dfd (borrowed; -EBADF when negative): for a
 * caller that opened its directory safely itself (sandbox/'s beneath its runtime dir). */
int slot_take_at(int dfd, const char *prefix, unsigned n);
/* Unlock and close a slot slot_take gave; a negative fd is ignored. */
void slot_release(int fd);

/* ---- JSON numbers as integers (olp_common_json: links jansson) ----------------------
 * The value of JSON number v as an integer in [min, max], in *out. JSON has one number
 * type and the Node OLP reads every number as a double, so a real with an integral value
 * (2.0, 1e3) is the integer it equals. Returns 0; -EINVAL when v is NULL, not a number,
 * or a real with a fractional part; -ERANGE when the value lies outside [min, max] (a
 * real such as 4e29 is refused here, never cast). *out is left alone on failure.
 * Every JSON number that becomes an integer goes through here. */
struct json_t;
int parse_json_int(const struct json_t *v, int64_t min, int64_t max, int64_t *out);

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Cleanup helpers for locals (bubblewrap utils.h style): an auto_free local is free()d
 * when it goes out of scope; steal_pointer(&p) returns p and leaves NULL behind, for
 * when ownership moves out of the function. */
static inline void free_ptr(void *p)
{
	free(*(void **)p);
}
#define auto_free __attribute__((cleanup(free_ptr)))
static inline void *steal_ptr_impl(void **pp)
{
	void *p = *pp;
	*pp = NULL;
	return p;
}
#define steal_pointer(pp) steal_ptr_impl((void **)(pp))

#endif
