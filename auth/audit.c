/* The audit log: one JSON line per API request in $OLP_HOME/logs/audit.ndjson.
 *
 * Many worker processes append to the same file. Each line is built in memory and handed
 * to one write(2) on an O_APPEND descriptor, so lines never interleave. The file is
 * rotated to audit-YYYY-MM-DD.ndjson when the UTC day changes; whichever process first
 * writes on the new day renames it, under flock(2) on logs/, after checking that the
 * file still holds an earlier day (another process may have rotated it already).
 * Descriptors still open on the renamed file keep writing the old day's last lines
 * there, which is where they belong. Nothing here ever fails a request: failures are
 * counted for the owner's /health. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth/internal.h"
#include "common/banned.h"

/* Client-controlled strings (path, model, …) are cut to this many bytes in the log. */
#define AUDIT_FIELD_MAX 512

void auth_audit_log_init(struct auth_audit_log *a, char *dir)
{
	a->dir = dir;
	pthread_mutex_init(&a->lock, NULL);
	a->fd = -1;
	a->day = -1;
	atomic_init(&a->failures, 0);
}

void auth_audit_log_release(struct auth_audit_log *a)
{
	if (a->fd >= 0)
		close(a->fd);
	a->fd = -1;
	pthread_mutex_destroy(&a->lock);
	free(a->dir);
	a->dir = NULL;
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

/* Rename audit.ndjson to audit-<day>.ndjson without replacing an existing file. */
static void audit_rotate(int dirfd, const char *day)
{
	char name[64];
	int i;

	for (i = 0; i < 100; i++) {
		if (i)
			snprintf(name, sizeof(name), "audit-%s.%d.ndjson", day, i);
		else
			snprintf(name, sizeof(name), "audit-%s.ndjson", day);
		if (renameat2(dirfd, "audit.ndjson", dirfd, name, RENAME_NOREPLACE) == 0 ||
		    errno != EEXIST)
			return;
	}
}

/* (Re)open audit.ndjson for today, rotating an earlier day's file first. 0 or -errno. */
static int audit_open(struct auth_audit_log *a, long today)
{
	char today_s[16], file_s[16];
	char *slash;
	int dirfd, fd, ret = 0;

	if (a->fd >= 0) {
		close(a->fd);
		a->fd = -1;
	}
	/* OLP_HOME and logs/ are created 0700 when missing: the log names every key id. */
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
			ret = -errno;
			goto out_close;
		}
	}
	day_string(today, today_s);
	/* ISO dates compare as strings. Only an earlier day is rotated: a process whose
	 * clock reads a second before midnight must not rotate the new day's file. */
	if (file_day(dirfd, file_s) && strcmp(file_s, today_s) < 0)
		audit_rotate(dirfd, file_s);
	fd = openat(dirfd, "audit.ndjson", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
		    0600);
	if (fd < 0) {
		ret = -errno;
		goto out_close;
	}
	a->fd = fd;
	a->day = today;
out_close:
	close(dirfd); /* drops the lock */
	return ret;
}

static void add_field(struct buf *b, const char *key, const char *val)
{
	size_t len;

	buf_addf(b, ",\"%s\":", key);
	if (!val) {
		buf_adds(b, "null");
		return;
	}
	len = strlen(val);
	buf_add_json_str(b, val, len > AUDIT_FIELD_MAX ? AUDIT_FIELD_MAX : len);
}

static void audit_format(struct buf *b, const struct audit_record *rec)
{
	char ts[AUTH_ISO_MAX];
	struct buf path = BUF_INIT;

	auth_iso_time_now(ts);
	buf_addf(b, "{\"ts\":\"%s\"", ts);
	add_field(b, "key_id", rec->key_id);
	add_field(b, "owner_tier", rec->owner_tier);
	add_field(b, "method", rec->method);
	/* The query string is left out: it is the one place a careless client might put a
	 * token (?key=…), and the log must never hold one. */
	if (rec->path)
		buf_add(&path, rec->path, strcspn(rec->path, "?"));
	add_field(b, "path", rec->path ? path.data : NULL);
	add_field(b, "provider", rec->provider);
	add_field(b, "model", rec->model);
	buf_addf(b, ",\"status_code\":%d,\"latency_ms\":%llu", rec->status_code,
		 (unsigned long long)rec->latency_ms);
	add_field(b, "error_code", rec->error_code);
	add_field(b, "request_id", rec->request_id);
	buf_adds(b, "}\n");
	buf_release(&path);
}

static void audit_failed(struct auth_audit_log *a, const char *rid, int err)
{
	uint64_t n = atomic_fetch_add(&a->failures, 1) + 1;

	/* Log the 1st, 2nd, 4th, 8th… failure: a full disk must not flood stderr too. */
	if ((n & (n - 1)) == 0)
		log_warnx(rid, "auth: cannot write the audit log in %s (%llu failures so far): %s",
			  a->dir, (unsigned long long)n, strerror(err));
}

void auth_audit_log_write(struct auth_audit_log *a, const struct audit_record *rec)
{
	struct buf line = BUF_INIT;
	long today = (long)(time(NULL) / 86400);
	ssize_t n;
	int err = 0;

	audit_format(&line, rec);
	pthread_mutex_lock(&a->lock);
	if (a->fd < 0 || a->day != today) {
		err = -audit_open(a, today);
		if (err)
			goto out_unlock;
	}
	/* One write(2) per line: with O_APPEND the kernel places it whole at the end. */
	do {
		n = write(a->fd, line.data, line.len);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		err = errno;
	else if ((size_t)n != line.len)
		err = ENOSPC;
	if (err) {
		/* Reopen next time: the disk may have room again, the file may be back. */
		close(a->fd);
		a->fd = -1;
	}
out_unlock:
	pthread_mutex_unlock(&a->lock);
	if (err)
		audit_failed(a, rec->request_id, err);
	buf_release(&line);
}
