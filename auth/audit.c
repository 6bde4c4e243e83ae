/* The audit log: one JSON line per API request in $OLP_HOME/logs/audit.ndjson.
 *
 * Many worker processes append to the same file. Each line is built in memory and handed
 * to one write(2) on an O_APPEND descriptor, so lines never interleave. Nothing here ever
 * fails a request: failures are counted for the owner's /health.
 *
 * Growth is bounded (ADR 0026): without this, anyone who can reach the
 * server, holding no key, filled the disk at ~720 bytes a request (~2,100 a second on one
 * connection), and then the usage ledger failed too.
 *  - Rotation: the file is renamed when the UTC day changes (audit-YYYY-MM-DD.ndjson, the
 *    day of its first line) and when it reaches max_bytes (audit-YYYY-MM-DDTHHMMSS.ndjson,
 *    the time of the rotation); after each rotation only the keep newest rotated files
 *    (by mtime) stay, older ones are deleted. A rotation runs under flock(2) on logs/, and
 *    first checks that audit.ndjson is still the file it means to rotate (its day, or the
 *    inode the process wrote the size into): another process may have rotated it already.
 *  - Before each line a process compares audit.ndjson's inode with its descriptor's, and
 *    reopens when they differ (another process rotated, or someone moved the file): a
 *    process never keeps writing into a rotated (or deleted, still taking space) file.
 *  - Requests answered without an identity (a 4xx to a caller with no key, a bad key, or
 *    on a route that takes none) are counted, not written: at most one summary line per
 *    process per summary interval (60 s) says how many, by status; the rest is the
 *    worker's olp_unauthenticated_requests_total. Requests with an identity keep their
 *    line. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth/internal.h"
#include "common/banned.h"

/* Client-controlled strings (path, model, …) are cut to this many bytes in the log. */
#define AUDIT_FIELD_MAX 512
/* Rotated files looked at by the retention, at most (more are left for the next time). */
#define AUDIT_SCAN_MAX 4096

void auth_audit_log_init(struct auth_audit_log *a, char *dir, const struct auth_options *opt)
{
	memset(a, 0, sizeof(*a));
	a->dir = dir;
	a->path = path_join(dir, "audit.ndjson");
	pthread_mutex_init(&a->lock, NULL);
	a->fd = -1;
	a->day = -1;
	a->max_bytes =
		opt && opt->audit_max_bytes ? opt->audit_max_bytes : AUTH_AUDIT_MAX_BYTES_DEFAULT;
	a->keep = opt && opt->audit_keep ? opt->audit_keep : AUTH_AUDIT_KEEP_DEFAULT;
	a->summary_s =
		opt && opt->audit_summary_s ? opt->audit_summary_s : AUTH_AUDIT_SUMMARY_S_DEFAULT;
	atomic_init(&a->failures, 0);
}

static void day_string(long day, char out[16])
{
	time_t t = (time_t)day * 86400;
	struct tm tm;

	gmtime_r(&t, &tm);
	(void)strftime(out, 16, "%Y-%m-%d", &tm);
}

/* The day a log file holds, from the ts of its first line: {"ts":"YYYY-MM-DD…. */
static bool file_day(int dirfd, char out[16])
{
	static const char prefix[] = "{\"ts\":\"";
	char head[64];
	ssize_t n;
	int fd;

	fd = openat(dirfd, "audit.ndjson", O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return false;
	n = pread(fd, head, sizeof(head) - 1, 0);
	close(fd);
	if (n < (ssize_t)(sizeof(prefix) - 1 + 10))
		return false;
	head[n] = '\0';
	if (memcmp(head, prefix, sizeof(prefix) - 1) != 0)
		return false;
	memcpy(out, head + sizeof(prefix) - 1, 10);
	out[10] = '\0';
	return true;
}

/* Rename audit.ndjson to audit-<stem>.ndjson without replacing an existing file (.1, .2…
 * on a clash). 0, or -1 when it could not (the file then keeps growing: counted). */
static int audit_rename(int dirfd, const char *stem)
{
	char name[96];

	for (int i = 0; i < 100; i++) {
		if (i)
			snprintf(name, sizeof(name), "audit-%s.%d.ndjson", stem, i);
		else
			snprintf(name, sizeof(name), "audit-%s.ndjson", stem);
		if (renameat2(dirfd, "audit.ndjson", dirfd, name, RENAME_NOREPLACE) == 0)
			return 0;
		if (errno != EEXIST)
			return -1;
	}
	return -1;
}

struct rotated {
	struct timespec mtime;
	char name[256];
};

static int by_age(const void *x, const void *y)
{
	const struct rotated *a = x, *b = y;

	if (a->mtime.tv_sec != b->mtime.tv_sec)
		return a->mtime.tv_sec < b->mtime.tv_sec ? 1 : -1;
	if (a->mtime.tv_nsec != b->mtime.tv_nsec)
		return a->mtime.tv_nsec < b->mtime.tv_nsec ? 1 : -1;
	return -strcmp(a->name, b->name); /* names sort by time too */
}

/* Delete the rotated files (audit-*.ndjson, regular files) but the keep newest. Called
 * under the directory's lock. */
static void audit_prune(int dirfd, unsigned keep)
{
	struct rotated *files = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	DIR *d;
	int fd = dup(dirfd);

	if (fd < 0 || !(d = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((de = readdir(d)) && n < AUDIT_SCAN_MAX) {
		size_t len = strlen(de->d_name);
		struct stat sb;

		if (strncmp(de->d_name, "audit-", 6) != 0 || len < 13 || len >= 256 ||
		    strcmp(de->d_name + len - 7, ".ndjson") != 0 ||
		    fstatat(dirfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISREG(sb.st_mode))
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 32;
			files = xreallocarray(files, cap, sizeof(*files));
		}
		files[n].mtime = sb.st_mtim;
		memcpy(files[n].name, de->d_name, len + 1);
		n++;
	}
	closedir(d);
	if (n > keep) {
		qsort(files, n, sizeof(*files), by_age);
		for (size_t i = keep; i < n; i++)
			(void)unlinkat(dirfd, files[i].name, 0);
	}
	free(files);
}

/* OLP_HOME and logs/, created 0700 when missing (the log names every key id), opened and
 * locked: the directory's fd, or -errno. */
static int dir_lock(struct auth_audit_log *a)
{
	char *slash;
	int dirfd;

	if (mkdir(a->dir, 0700) < 0 && errno == ENOENT) {
		slash = strrchr(a->dir, '/');
		if (slash && slash != a->dir) {
			*slash = '\0';
			(void)mkdir(a->dir, 0700);
			*slash = '/';
		}
		(void)mkdir(a->dir, 0700);
	}
	dirfd = open(a->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0)
		return -errno;
	while (flock(dirfd, LOCK_EX) < 0) {
		if (errno != EINTR) {
			int err = -errno;

			close(dirfd);
			return err;
		}
	}
	return dirfd;
}

/* The size rotation, under the lock: only when audit.ndjson is still the file this
 * process saw grow past max_bytes (ino), not one another process has started since. */
static void rotate_full(struct auth_audit_log *a, int dirfd, ino_t ino)
{
	char stem[32];
	struct stat sb;
	struct tm tm;
	time_t now = time(NULL);

	if (fstatat(dirfd, "audit.ndjson", &sb, AT_SYMLINK_NOFOLLOW) < 0 || sb.st_ino != ino ||
	    sb.st_size < (off_t)a->max_bytes)
		return;
	gmtime_r(&now, &tm);
	(void)strftime(stem, sizeof(stem), "%Y-%m-%dT%H%M%S", &tm);
	if (audit_rename(dirfd, stem) == 0)
		audit_prune(dirfd, a->keep);
}

/* (Re)open audit.ndjson for today, rotating it first when it holds an earlier day, or
 * (full_ino) when it is the file this process found full. 0 or -errno. */
static int audit_open(struct auth_audit_log *a, long today, ino_t full_ino)
{
	char today_s[16], file_s[16];
	struct stat sb;
	int dirfd, fd, ret = 0;

	if (a->fd >= 0) {
		close(a->fd);
		a->fd = -1;
	}
	dirfd = dir_lock(a);
	if (dirfd < 0)
		return dirfd;
	day_string(today, today_s);
	/* ISO dates compare as strings. Only an earlier day is rotated: a process whose
	 * clock reads a second before midnight must not rotate the new day's file. */
	if (file_day(dirfd, file_s) && strcmp(file_s, today_s) < 0) {
		if (audit_rename(dirfd, file_s) == 0)
			audit_prune(dirfd, a->keep);
	} else if (full_ino) {
		rotate_full(a, dirfd, full_ino);
	}
	fd = openat(dirfd, "audit.ndjson", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
		    0600);
	if (fd < 0) {
		ret = -errno;
		goto out_close;
	}
	if (fstat(fd, &sb) < 0) {
		ret = -errno;
		close(fd);
		goto out_close;
	}
	a->fd = fd;
	a->ino = sb.st_ino;
	a->day = today;
out_close:
	close(dirfd); /* drops the lock */
	return ret;
}

/* Whether the descriptor is no longer audit.ndjson (another process rotated it, or the
 * file was moved or deleted): it must be reopened before the next line. Else *size is
 * the file's size now. */
static bool audit_stale(const struct auth_audit_log *a, off_t *size)
{
	struct stat sb;

	if (lstat(a->path, &sb) < 0 || sb.st_ino != a->ino)
		return true;
	*size = sb.st_size;
	return false;
}

/* ,"key":val with val (len bytes) cut to AUDIT_FIELD_MAX; NULL: null. */
static void add_field_n(struct buf *b, const char *key, const char *val, size_t len)
{
	buf_add(b, ",\"", 2);
	buf_adds(b, key);
	buf_add(b, "\":", 2);
	if (!val) {
		buf_add(b, "null", 4);
		return;
	}
	buf_add_json_str(b, val, len > AUDIT_FIELD_MAX ? AUDIT_FIELD_MAX : len);
}

static void add_field(struct buf *b, const char *key, const char *val)
{
	add_field_n(b, key, val, val ? strlen(val) : 0);
}

static void audit_format(struct buf *b, const struct audit_record *rec)
{
	char ts[AUTH_ISO_MAX];

	auth_iso_time_now(ts);
	buf_grow(b, 512); /* a line, at once */
	buf_adds(b, "{\"ts\":\"");
	buf_adds(b, ts);
	buf_addch(b, '"');
	add_field(b, "key_id", rec->key_id);
	add_field(b, "owner_tier", rec->owner_tier);
	add_field(b, "method", rec->method);
	/* The query string is left out: it is the one place a careless client might put a
	 * token (?key=…), and the log must never hold one. */
	add_field_n(b, "path", rec->path, rec->path ? strcspn(rec->path, "?") : 0);
	add_field(b, "provider", rec->provider);
	add_field(b, "model", rec->model);
	buf_adds(b, ",\"status_code\":");
	buf_add_int(b, rec->status_code);
	buf_adds(b, ",\"latency_ms\":");
	buf_add_uint(b, rec->latency_ms);
	add_field(b, "error_code", rec->error_code);
	add_field(b, "request_id", rec->request_id);
	buf_adds(b, "}\n");
}

/* The summary of the unauthenticated requests counted since the last one:
 * {"ts":…,"key_id":null,"owner_tier":"none","event":"unauthenticated_summary","count":N,
 *  "since":…,"statuses":{"401":n,…}}. Resets the counts. With a->lock held. */
static void summary_format(struct auth_audit_log *a, struct buf *b)
{
	char ts[AUTH_ISO_MAX], since[AUTH_ISO_MAX];
	struct tm tm;
	bool first = true;

	auth_iso_time_now(ts);
	gmtime_r(&a->unauth_since, &tm);
	(void)strftime(since, sizeof(since), "%Y-%m-%dT%H:%M:%S.000Z", &tm);
	buf_addf(b,
		 "{\"ts\":\"%s\",\"key_id\":null,\"owner_tier\":\"none\","
		 "\"event\":\"unauthenticated_summary\",\"count\":%llu,\"since\":\"%s\","
		 "\"statuses\":{",
		 ts, (unsigned long long)a->unauth_total, since);
	for (int i = 0; i < AUTH_AUDIT_STATUSES; i++) {
		if (!a->unauth[i])
			continue;
		buf_addf(b, "%s\"%d\":%llu", first ? "" : ",", 400 + i,
			 (unsigned long long)a->unauth[i]);
		first = false;
		a->unauth[i] = 0;
	}
	buf_adds(b, "}}\n");
	a->unauth_total = 0;
}

static void audit_failed(struct auth_audit_log *a, const char *rid, int err)
{
	uint64_t n = atomic_fetch_add(&a->failures, 1) + 1;

	/* Log the 1st, 2nd, 4th, 8th… failure: a full disk must not flood stderr too. */
	if ((n & (n - 1)) == 0)
		log_warnx(rid, "auth: cannot write the audit log in %s (%llu failures so far): %s",
			  a->dir, (unsigned long long)n, strerror(err));
}

/* Append one line, with a->lock held: 0 or an errno. */
static int write_locked(struct auth_audit_log *a, const struct buf *line)
{
	long today = (long)(time(NULL) / 86400);
	struct stat sb;
	off_t size = -1;
	ssize_t n;
	int err = 0;

	if (a->fd < 0 || a->day != today || audit_stale(a, &size)) {
		size = -1;
		err = -audit_open(a, today, 0);
		if (err)
			return err;
	}
	/* One write(2) per line: with O_APPEND the kernel places it whole at the end. */
	do {
		n = write(a->fd, line->data, line->len);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		err = errno;
	else if ((size_t)n != line->len)
		err = ENOSPC;
	if (err) {
		/* Reopen next time: the disk may have room again, the file may be back. */
		close(a->fd);
		a->fd = -1;
		return err;
	}
	/* Full: rotate now, so that no process adds to it past one line each. The size: as
	 * audit_stale saw it just before, plus this line (another process's line written in
	 * between is that process's to count), or after a reopen the file's. */
	if (size < 0 && fstat(a->fd, &sb) == 0)
		size = sb.st_size;
	else if (size >= 0)
		size += n;
	if (size >= (off_t)a->max_bytes)
		err = -audit_open(a, today, a->ino);
	return err;
}

/* An unauthenticated request: counted for the next summary. With a->lock held. */
static void count_unauth(struct auth_audit_log *a, int status)
{
	if (!a->unauth_total)
		a->unauth_since = time(NULL);
	a->unauth_total++;
	if (status >= 400 && status < 400 + AUTH_AUDIT_STATUSES)
		a->unauth[status - 400]++;
}

/* Whether rec is a request answered without a checked identity (a refusal: 4xx). */
static bool unauthenticated(const struct audit_record *rec)
{
	return !rec->key_id && rec->status_code >= 400 && rec->status_code < 500;
}

void auth_audit_log_write(struct auth_audit_log *a, const struct audit_record *rec)
{
	struct buf line = BUF_INIT;
	time_t now = time(NULL);
	bool unauth = unauthenticated(rec);
	int err = 0;

	if (!unauth)
		audit_format(&line, rec); /* before the lock: its holders only write */
	pthread_mutex_lock(&a->lock);
	if (unauth)
		count_unauth(a, rec->status_code);
	/* The summary goes out with the first line (of either kind) after its interval. */
	if (a->unauth_total && now >= a->next_summary) {
		summary_format(a, &line);
		a->next_summary = now + (time_t)a->summary_s;
	}
	if (line.len)
		err = write_locked(a, &line);
	pthread_mutex_unlock(&a->lock);
	if (err)
		audit_failed(a, rec->request_id, err);
	buf_release(&line);
}

void auth_audit_log_release(struct auth_audit_log *a)
{
	struct buf line = BUF_INIT;

	/* What was counted since the last summary is not lost with the process. */
	if (a->unauth_total) {
		summary_format(a, &line);
		if (write_locked(a, &line))
			atomic_fetch_add(&a->failures, 1);
	}
	buf_release(&line);
	if (a->fd >= 0)
		close(a->fd);
	a->fd = -1;
	pthread_mutex_destroy(&a->lock);
	free(a->dir);
	free(a->path);
	a->dir = a->path = NULL;
}
