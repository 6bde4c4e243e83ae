/* Metrics shared by the worker processes of a host: one file-backed MAP_SHARED table
 * (ADR 0021).
 *
 * The table is open-addressed on a hash of the series key (`name{labels}`, rendered as
 * the text format writes it). A slot, once filled, is never emptied, so a lookup needs no
 * lock: it probes until it finds its key or an empty slot. Filling a slot takes the
 * robust process-shared mutex in the file's header (a worker killed holding it does not
 * wedge the others). Values change with atomic adds only.
 *
 * Gauges are per process (a slot per series and pid): a run counted in flight by a worker
 * that is then SIGKILLed would otherwise stay counted for ever. A scrape sums the rows
 * whose process is alive (same pid and start time in /proc), and a dead process's row is
 * taken over, zeroed, by the next process that needs that series. A few gauges are a
 * state each process sets rather than a count (olp_ledger_available): a scrape shows the
 * lowest live row, so one worker that cannot write the ledger shows as 0. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "metrics/metrics.h"
#include "common/banned.h"

#define METRICS_MAGIC 0x31565254454d4c4fULL /* "OLMETRV1" little-endian */
#define METRICS_VERSION 1
#define FILE_NAME "metrics.v1"

enum kind { K_COUNTER = 1, K_GAUGE, K_HISTOGRAM };

/* Histogram upper bounds: 5 ms to 120 s, the span from a refused request to a long run. */
static const uint64_t bucket_us[] = { 5000,	10000,	  25000,    50000,    100000,
				      250000,	500000,	  1000000,  2500000,  5000000,
				      10000000, 30000000, 60000000, 120000000 };
static const char *const bucket_le[] = { "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5",
					 "1",	  "2.5",  "5",	   "10",   "30",  "60",	  "120" };
#define NB (sizeof(bucket_us) / sizeof(bucket_us[0]))

enum { SLOT_EMPTY = 0, SLOT_READY = 1 };

struct mslot {
	uint32_t state; /* SLOT_EMPTY, then SLOT_READY once key and kind are in place */
	uint32_t kind;
	int32_t pid; /* gauges: the process whose row it is; 0 otherwise */
	uint32_t pad;
	uint64_t pid_start; /* its start time (/proc/PID/stat), against pid reuse */
	char key[METRICS_MAX_KEY];
	/* counter: v[0]; gauge: v[0] as int64_t; histogram: NB per-bucket counts (not
	 * cumulative), then the sum in microseconds, then the count. */
	uint64_t v[NB + 2];
};

struct mfile {
	uint64_t magic;
	uint32_t version, slot_size, nslots, pad;
	uint64_t size;
	uint64_t created; /* Unix time the counters started from */
	uint64_t dropped; /* series refused for want of room or of key length */
	pthread_mutex_t lock;
	_Alignas(64) struct mslot slots[METRICS_MAX_SERIES];
};

static struct mfile *mf;

/* The families OLP exposes, in the order a scrape lists them. */
/* How a gauge's live rows make its value. */
enum agg { AGG_SUM = 0, AGG_MIN };

static const struct family {
	const char *name;
	enum kind kind;
	enum agg agg;
	const char *help;
} families[] = {
	{ "olp_requests_total", K_COUNTER, AGG_SUM,
	  "Requests answered, by route, provider, model and HTTP status." },
	{ "olp_request_duration_seconds", K_HISTOGRAM, AGG_SUM,
	  "Time from a request's arrival to the end of its answer, by provider." },
	{ "olp_time_to_first_byte_seconds", K_HISTOGRAM, AGG_SUM,
	  "Time from a request's arrival to the first byte of its answer, by provider." },
	{ "olp_runs_in_flight", K_GAUGE, AGG_SUM, "Provider runs under way now, by provider." },
	{ "olp_runs_total", K_COUNTER, AGG_SUM,
	  "Provider runs whose sandbox started, by provider and how (cold, warm, prestart)." },
	{ "olp_account_requests_total", K_COUNTER, AGG_SUM,
	  "Provider runs whose sandbox started, by provider and account (ADR 0037)." },
	{ "olp_sandbox_start_failures_total", K_COUNTER, AGG_SUM,
	  "Provider runs whose sandbox or process could not start, by provider and reason." },
	{ "olp_quota_rejections_total", K_COUNTER, AGG_SUM,
	  "Requests refused for a key's quota, by the limit reached." },
	{ "olp_audit_write_failures_total", K_COUNTER, AGG_SUM,
	  "Audit records that could not be written." },
	{ "olp_ledger_write_failures_total", K_COUNTER, AGG_SUM,
	  "Usage ledger rows that could not be written." },
	{ "olp_prestart_events_total", K_COUNTER, AGG_SUM,
	  "Pre-started provider processes: started (ready), taken by a run (hit), not there "
	  "for a run that could have taken one (miss), put down unused (expired, released), "
	  "found dead (died)." },
	{ "olp_prestart_idle", K_GAUGE, AGG_SUM, "Pre-started provider processes waiting now." },
	{ "olp_ledger_available", K_GAUGE, AGG_MIN,
	  "1 when every worker can write the usage ledger; 0 while one cannot (keys with a "
	  "quota are then refused with 503)." },
	{ "olp_store_available", K_GAUGE, AGG_MIN,
	  "1 when every worker reaches the shared PostgreSQL store (config.json \"store\"); 0 "
	  "while one cannot. Absent with the embedded store." },
	{ "olp_ledger_dropped_total", K_COUNTER, AGG_SUM,
	  "Ledger rows dropped because the queue of rows waiting for the shared store was full "
	  "(store_buffer_rows) while the database was away." },
	{ "olp_unauthenticated_requests_total", K_COUNTER, AGG_SUM,
	  "Requests answered without a checked identity (no key, a bad key, an unknown route), "
	  "by HTTP status: counted here, summarised in the audit log." },
};

static const struct family *family_find(const char *name)
{
	for (size_t i = 0; i < ARRAY_SIZE(families); i++)
		if (!strcmp(families[i].name, name))
			return &families[i];
	return NULL;
}

/* ---- the process's identity, for gauge rows ------------------------------------------ */

/* The start time (field 22 of /proc/PID/stat, clock ticks since boot) of a live process,
 * or 0 when it is gone or a zombie. */
static uint64_t proc_start(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long start = 0;
	ssize_t n;
	int fd, field;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* The command name (field 2) may hold spaces and parentheses: count from its end. */
	p = strrchr(buf, ')');
	if (!p || p[1] != ' ')
		return 0;
	p += 2;
	if (*p == 'Z' || *p == 'X')
		return 0;
	for (field = 3; field < 22 && p; field++) {
		p = strchr(p, ' ');
		if (p)
			p++;
	}
	if (!p || sscanf(p, "%llu", &start) != 1)
		return 0;
	return start ? start : 1;
}

/* Whether the process of a gauge row is still the one that wrote it. Without a readable
 * /proc (start 0) only whether the pid exists: a reused pid then counts. */
static bool alive(pid_t pid, uint64_t start)
{
	if (!start)
		return kill(pid, 0) == 0 || errno == EPERM;
	return proc_start(pid) == start;
}

/* This process's pid and start time: looked up once (getpid is a system call, and this
 * runs on every gauge update), forgotten in the child of a fork. */
static pid_t my_pid;
static uint64_t my_start;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void forget_me(void)
{
	__atomic_store_n(&my_pid, 0, __ATOMIC_RELAXED);
}

static void watch_forks(void)
{
	(void)pthread_atfork(NULL, NULL, forget_me);
}

static void whoami(pid_t *pid, uint64_t *start)
{
	pid_t p = __atomic_load_n(&my_pid, __ATOMIC_ACQUIRE);

	if (!p) {
		/* Threads may race here: they store the same values. */
		p = getpid();
		__atomic_store_n(&my_start, proc_start(p), __ATOMIC_RELAXED);
		__atomic_store_n(&my_pid, p, __ATOMIC_RELEASE);
	}
	*pid = p;
	*start = __atomic_load_n(&my_start, __ATOMIC_RELAXED);
}

/* ---- series ------------------------------------------------------------------------- */

/* Append a label value escaped as the text format wants (\\, \", \n). */
static void add_escaped(struct buf *b, const char *s)
{
	for (; s && *s; s++) {
		if (*s == '\\')
			buf_adds(b, "\\\\");
		else if (*s == '"')
			buf_adds(b, "\\\"");
		else if (*s == '\n')
			buf_adds(b, "\\n");
		else
			buf_addch(b, *s);
	}
}

/* Append s to key at *n, escaped as a label value when esc; false when it does not fit. */
static bool key_put(char key[METRICS_MAX_KEY], size_t *n, const char *s, bool esc)
{
	for (; s && *s; s++) {
		char c = *s;
		bool two = esc && (c == '\\' || c == '"' || c == '\n');

		if (*n + (two ? 2 : 1) >= METRICS_MAX_KEY)
			return false;
		if (two) {
			key[(*n)++] = '\\';
			if (c == '\n')
				c = 'n';
		}
		key[(*n)++] = c;
	}
	key[*n] = '\0';
	return true;
}

/* `name{l1="v1",…}` into key: its length, or -ENAMETOOLONG. Straight into the caller's
 * buffer: this runs several times a request. */
static int build_key(char key[METRICS_MAX_KEY], const char *name, const char *const labels[])
{
	size_t n = 0;
	bool ok = key_put(key, &n, name, false);

	for (size_t i = 0; ok && labels && labels[i]; i += 2)
		ok = key_put(key, &n, i ? "," : "{", false) && key_put(key, &n, labels[i], false) &&
		     key_put(key, &n, "=\"", false) && key_put(key, &n, labels[i + 1], true) &&
		     key_put(key, &n, "\"", false);
	if (ok && labels && labels[0])
		ok = key_put(key, &n, "}", false);
	return ok ? (int)n : -ENAMETOOLONG;
}

static uint32_t key_hash(const char *key)
{
	uint32_t h = 2166136261u; /* FNV-1a */

	for (; *key; key++)
		h = (h ^ (unsigned char)*key) * 16777619u;
	return h;
}

static bool slot_is(const struct mslot *s, const char *key, enum kind kind, pid_t pid,
		    uint64_t start)
{
	return s->kind == (uint32_t)kind && __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) == pid &&
	       __atomic_load_n(&s->pid_start, __ATOMIC_RELAXED) == start && !strcmp(s->key, key);
}

/* 0, or -1 when the mutex cannot be had (ENOTRECOVERABLE: never, as we always mark it
 * consistent; the series is then dropped). */
static int table_lock(void)
{
	int r = pthread_mutex_lock(&mf->lock);

	/* A process that died holding it: the table is consistent whatever step it was at
	 * (a slot is published last), so carry on. */
	if (r == EOWNERDEAD)
		r = pthread_mutex_consistent(&mf->lock);
	return r ? -1 : 0;
}

/* The slot of (key, kind, pid), made when missing; NULL when the table is full (the
 * series is counted as dropped). */
static struct mslot *slot_get(const char *key, enum kind kind, pid_t pid, uint64_t start)
{
	uint32_t h = key_hash(key), i;
	struct mslot *s, *found = NULL;

	for (i = 0; i < METRICS_MAX_SERIES; i++) {
		s = &mf->slots[(h + i) % METRICS_MAX_SERIES];
		if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == SLOT_EMPTY)
			break;
		if (slot_is(s, key, kind, pid, start))
			return s;
	}
	if (table_lock()) {
		__atomic_add_fetch(&mf->dropped, 1, __ATOMIC_RELAXED);
		return NULL;
	}
	for (i = 0; i < METRICS_MAX_SERIES && !found; i++) {
		s = &mf->slots[(h + i) % METRICS_MAX_SERIES];
		if (s->state == SLOT_EMPTY) {
			memcpy(s->key, key, strlen(key) + 1);
			s->kind = kind;
			s->pid_start = start;
			s->pid = pid;
			__atomic_store_n(&s->state, SLOT_READY, __ATOMIC_RELEASE);
			found = s;
		} else if (slot_is(s, key, kind, pid, start)) {
			found = s;
		} else if (pid && s->kind == (uint32_t)kind && s->pid && !strcmp(s->key, key) &&
			   !alive(s->pid, s->pid_start)) {
			/* A dead process's row: its count is void, the row is ours now. */
			__atomic_store_n(&s->v[0], 0, __ATOMIC_RELAXED);
			__atomic_store_n(&s->pid_start, start, __ATOMIC_RELAXED);
			__atomic_store_n(&s->pid, pid, __ATOMIC_RELEASE);
			found = s;
		}
	}
	if (!found)
		__atomic_add_fetch(&mf->dropped, 1, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&mf->lock);
	return found;
}

static struct mslot *series(const char *name, const char *const labels[], enum kind kind, int *err)
{
	const struct family *f = family_find(name);
	char key[METRICS_MAX_KEY];
	pid_t pid = 0;
	uint64_t start = 0;
	struct mslot *s;

	if (!mf) {
		*err = -ENODEV;
		return NULL;
	}
	if (!f || f->kind != kind) {
		*err = -EINVAL;
		return NULL;
	}
	if (build_key(key, name, labels) < 0) {
		__atomic_add_fetch(&mf->dropped, 1, __ATOMIC_RELAXED);
		*err = -ENAMETOOLONG;
		return NULL;
	}
	if (kind == K_GAUGE)
		whoami(&pid, &start);
	s = slot_get(key, kind, pid, start);
	*err = s ? 0 : -ENOSPC;
	return s;
}

int metrics_counter_add(const char *name, const char *const labels[], uint64_t n)
{
	int err;
	struct mslot *s = series(name, labels, K_COUNTER, &err);

	if (s)
		__atomic_add_fetch(&s->v[0], n, __ATOMIC_RELAXED);
	return err;
}

int metrics_gauge_add(const char *name, const char *const labels[], int64_t delta)
{
	int err;
	struct mslot *s = series(name, labels, K_GAUGE, &err);

	if (s)
		__atomic_add_fetch(&s->v[0], (uint64_t)delta, __ATOMIC_RELAXED);
	return err;
}

int metrics_gauge_set(const char *name, const char *const labels[], int64_t value)
{
	int err;
	struct mslot *s = series(name, labels, K_GAUGE, &err);

	if (s)
		__atomic_store_n(&s->v[0], (uint64_t)value, __ATOMIC_RELAXED);
	return err;
}

int metrics_observe_us(const char *name, const char *const labels[], uint64_t us)
{
	int err;
	struct mslot *s = series(name, labels, K_HISTOGRAM, &err);
	size_t b;

	if (!s)
		return err;
	/* The count first, the bucket last: a scrape reads the buckets before the count,
	 * so it never sees a bucket above +Inf. */
	__atomic_add_fetch(&s->v[NB + 1], 1, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&s->v[NB], us, __ATOMIC_SEQ_CST);
	for (b = 0; b < NB && us > bucket_us[b]; b++)
		;
	if (b < NB)
		__atomic_add_fetch(&s->v[b], 1, __ATOMIC_SEQ_CST);
	return 0;
}

/* ---- the scrape --------------------------------------------------------------------- */

static void render_histogram(struct buf *out, const char *name, const struct mslot *s)
{
	const char *labels = s->key + strlen(name);
	uint64_t cum = 0, count, sum;
	int llen = 0;

	/* labels is "" or "{…}": keep what is inside the braces. */
	if (*labels == '{') {
		labels++;
		llen = (int)strlen(labels) - 1;
	}
	for (size_t b = 0; b < NB; b++) {
		cum += __atomic_load_n(&s->v[b], __ATOMIC_SEQ_CST);
		buf_addf(out, "%s_bucket{%.*s%sle=\"%s\"} %llu\n", name, llen, labels,
			 llen ? "," : "", bucket_le[b], (unsigned long long)cum);
	}
	sum = __atomic_load_n(&s->v[NB], __ATOMIC_SEQ_CST);
	count = __atomic_load_n(&s->v[NB + 1], __ATOMIC_SEQ_CST);
	if (count < cum)
		count = cum;
	buf_addf(out, "%s_bucket{%.*s%sle=\"+Inf\"} %llu\n", name, llen, labels, llen ? "," : "",
		 (unsigned long long)count);
	buf_addf(out, "%s_sum%s%.*s%s %.6f\n", name, llen ? "{" : "", llen, labels, llen ? "}" : "",
		 (double)sum / 1e6);
	buf_addf(out, "%s_count%s%.*s%s %llu\n", name, llen ? "{" : "", llen, labels,
		 llen ? "}" : "", (unsigned long long)count);
}

/* A gauge's value: the sum (AGG_MIN: the lowest) of the rows of its series whose process is
 * alive. Only from the series' first row (i), so that each series is written once; false
 * too for an AGG_MIN gauge without a live row (nothing to say). */
static bool gauge_sum(size_t i, enum agg agg, int64_t *sum)
{
	bool any = false;

	const struct mslot *s = &mf->slots[i];

	for (size_t j = 0; j < i; j++) {
		const struct mslot *t = &mf->slots[j];

		if (__atomic_load_n(&t->state, __ATOMIC_ACQUIRE) == SLOT_READY &&
		    t->kind == K_GAUGE && !strcmp(t->key, s->key))
			return false;
	}
	*sum = 0;
	for (size_t j = i; j < METRICS_MAX_SERIES; j++) {
		const struct mslot *t = &mf->slots[j];
		pid_t pid;
		uint64_t start;

		if (__atomic_load_n(&t->state, __ATOMIC_ACQUIRE) != SLOT_READY ||
		    t->kind != K_GAUGE || strcmp(t->key, s->key))
			continue;
		pid = __atomic_load_n(&t->pid, __ATOMIC_ACQUIRE);
		start = __atomic_load_n(&t->pid_start, __ATOMIC_RELAXED);
		if (pid && alive(pid, start)) {
			int64_t v = (int64_t)__atomic_load_n(&t->v[0], __ATOMIC_RELAXED);

			if (agg == AGG_SUM)
				*sum += v;
			else if (!any || v < *sum)
				*sum = v;
			any = true;
		}
	}
	return agg == AGG_SUM || any;
}

static bool key_in_family(const char *key, const char *name)
{
	size_t n = strlen(name);

	return !strncmp(key, name, n) && (key[n] == '\0' || key[n] == '{');
}

int metrics_render(struct buf *out)
{
	static const char *const type_name[] = {
		[K_COUNTER] = "counter", [K_GAUGE] = "gauge", [K_HISTOGRAM] = "histogram"
	};

	if (!mf)
		return -ENODEV;
	buf_adds(out, "# HELP olp_build_info The OLP version this worker runs.\n"
		      "# TYPE olp_build_info gauge\n"
		      "olp_build_info{version=\"");
	add_escaped(out, OLP_VERSION);
	buf_adds(out, "\"} 1\n");
	buf_addf(out,
		 "# HELP olp_metrics_start_time_seconds Unix time the pool's shared counters "
		 "count from.\n"
		 "# TYPE olp_metrics_start_time_seconds gauge\n"
		 "olp_metrics_start_time_seconds %llu\n",
		 (unsigned long long)mf->created);
	buf_addf(out,
		 "# HELP olp_metrics_dropped_series_total Series not recorded: the shared "
		 "table was full or the series' labels too long.\n"
		 "# TYPE olp_metrics_dropped_series_total counter\n"
		 "olp_metrics_dropped_series_total %llu\n",
		 (unsigned long long)__atomic_load_n(&mf->dropped, __ATOMIC_RELAXED));
	for (size_t f = 0; f < ARRAY_SIZE(families); f++) {
		const struct family *fam = &families[f];

		buf_addf(out, "# HELP %s %s\n# TYPE %s %s\n", fam->name, fam->help, fam->name,
			 type_name[fam->kind]);
		for (size_t i = 0; i < METRICS_MAX_SERIES; i++) {
			const struct mslot *s = &mf->slots[i];
			int64_t g;

			if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != SLOT_READY ||
			    s->kind != (uint32_t)fam->kind || !key_in_family(s->key, fam->name))
				continue;
			if (fam->kind == K_HISTOGRAM)
				render_histogram(out, fam->name, s);
			else if (fam->kind == K_GAUGE && gauge_sum(i, fam->agg, &g))
				buf_addf(out, "%s %lld\n", s->key, (long long)g);
			else if (fam->kind == K_COUNTER)
				buf_addf(out, "%s %llu\n", s->key,
					 (unsigned long long)__atomic_load_n(&s->v[0],
									     __ATOMIC_RELAXED));
		}
	}
	return 0;
}

/* ---- the file ----------------------------------------------------------------------- */

static int open_err(struct buf *err, int e, const char *path, const char *what)
{
	buf_addf(err, "%s: %s", path, what ? what : strerror(e));
	return -e;
}

/* A file we may trust: a regular file of our own, nobody else's to read or write. */
static int check_ours(int fd, const char *path, struct buf *err)
{
	struct stat st;

	if (fstat(fd, &st) < 0)
		return open_err(err, errno, path, NULL);
	if (!S_ISREG(st.st_mode))
		return open_err(err, EPERM, path, "not a regular file; refused");
	if (st.st_uid != geteuid())
		return open_err(err, EPERM, path,
				"owned by another user; refused (remove it, or give it to the "
				"workers' user with mode 0600)");
	if (st.st_mode & 077)
		return open_err(err, EPERM, path,
				"readable or writable by others than its owner; refused (mode "
				"0600 expected)");
	return 0;
}

static bool layout_ok(const struct mfile *f)
{
	return f->magic == METRICS_MAGIC && f->version == METRICS_VERSION &&
	       f->slot_size == sizeof(struct mslot) && f->nslots == METRICS_MAX_SERIES &&
	       f->size == sizeof(struct mfile);
}

/* A fresh table at path: built beside it, then renamed over it, so that no process maps a
 * half-made one. Called under the open lock. */
static struct mfile *create_file(const char *path, struct buf *err)
{
	char tmp[PATH_MAX];
	pthread_mutexattr_t ma;
	struct mfile *f = NULL;
	int fd, e;

	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.new", path) >= sizeof(tmp)) {
		open_err(err, ENAMETOOLONG, path, NULL);
		errno = ENAMETOOLONG;
		return NULL;
	}
	(void)unlink(tmp);
	fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		e = errno;
		open_err(err, e, tmp, NULL);
		errno = e;
		return NULL;
	}
	if (fchmod(fd, 0600) < 0) {
		e = errno;
		goto out_unlink;
	}
	/* Every block allocated now: a store into a hole of a shared mapping on a full disk
	 * is a SIGBUS, which would kill the worker in the middle of a request. */
	e = posix_fallocate(fd, 0, sizeof(*f));
	if (e)
		goto out_unlink;
	f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (f == MAP_FAILED) {
		e = errno;
		f = NULL;
		goto out_unlink;
	}
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
	e = pthread_mutex_init(&f->lock, &ma);
	pthread_mutexattr_destroy(&ma);
	if (e)
		goto out_unmap;
	f->version = METRICS_VERSION;
	f->slot_size = sizeof(struct mslot);
	f->nslots = METRICS_MAX_SERIES;
	f->size = sizeof(*f);
	f->created = (uint64_t)time(NULL);
	f->magic = METRICS_MAGIC;
	if (rename(tmp, path) < 0) {
		e = errno;
		goto out_unmap;
	}
	close(fd);
	return f;
out_unmap:
	munmap(f, sizeof(*f));
	f = NULL;
out_unlink:
	open_err(err, e, tmp, NULL);
	(void)unlink(tmp);
	close(fd);
	errno = e;
	return NULL;
}

/* The table at path, checked, or replaced when its layout is not ours (another
 * version's). Called under the open lock. */
static struct mfile *map_file(const char *path, struct buf *err)
{
	struct mfile *f;
	struct stat st;
	int fd, e;

	fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		return create_file(path, err);
	if (fd < 0) {
		e = errno;
		open_err(err, e, path, e == ELOOP ? "a symbolic link; refused (remove it)" : NULL);
		errno = e;
		return NULL;
	}
	e = check_ours(fd, path, err);
	if (e || fstat(fd, &st) < 0) {
		close(fd);
		errno = e ? -e : EIO;
		return NULL;
	}
	if ((size_t)st.st_size != sizeof(*f)) {
		close(fd);
		log_warnx(NULL, "%s: %lld bytes, not %zu: another version's; made anew", path,
			  (long long)st.st_size, sizeof(*f));
		return create_file(path, err);
	}
	/* As at creation: no hole left for a store to fault on (a no-op on our own file). */
	e = posix_fallocate(fd, 0, sizeof(*f));
	f = e ? MAP_FAILED : mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (!e)
		e = errno;
	close(fd);
	if (f == MAP_FAILED) {
		open_err(err, e, path, NULL);
		errno = e;
		return NULL;
	}
	if (!layout_ok(f)) {
		munmap(f, sizeof(*f));
		log_warnx(NULL, "%s: not this version's metrics table; made anew", path);
		return create_file(path, err);
	}
	return f;
}

int metrics_open(const char *dir, struct buf *err)
{
	char path[PATH_MAX], lpath[PATH_MAX];
	struct mfile *f = NULL;
	int lfd, ret;

	metrics_close();
	pthread_once(&atfork_once, watch_forks);
	if ((size_t)snprintf(path, sizeof(path), "%s/" FILE_NAME, dir) >= sizeof(path) ||
	    (size_t)snprintf(lpath, sizeof(lpath), "%s/metrics.lock", dir) >= sizeof(lpath))
		return open_err(err, ENAMETOOLONG, dir, NULL);
	/* Workers starting together must not each replace the file the other just made. */
	lfd = open(lpath, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (lfd < 0)
		return open_err(err, errno, lpath,
				errno == ELOOP ? "a symbolic link; refused (remove it)" : NULL);
	ret = check_ours(lfd, lpath, err);
	if (ret)
		goto out_close;
	if (flock(lfd, LOCK_EX) < 0) {
		ret = open_err(err, errno, lpath, NULL);
		goto out_close;
	}
	f = map_file(path, err);
	ret = f ? 0 : -errno;
	(void)flock(lfd, LOCK_UN);
out_close:
	close(lfd);
	mf = f;
	if (mf) {
		/* The series a scrape should show from the start, at 0. */
		static const char *const limits[] = { "requests_per_minute", "requests_per_day",
						      "tokens_per_day", "max_concurrent" };

		(void)metrics_counter_add("olp_audit_write_failures_total", NULL, 0);
		(void)metrics_counter_add("olp_ledger_write_failures_total", NULL, 0);
		for (size_t i = 0; i < ARRAY_SIZE(limits); i++)
			(void)metrics_counter_add("olp_quota_rejections_total",
						  (const char *const[]){ "limit", limits[i], NULL },
						  0);
	}
	return ret;
}

void metrics_close(void)
{
	if (mf)
		munmap(mf, sizeof(*mf));
	mf = NULL;
}

bool metrics_is_open(void)
{
	return mf != NULL;
}

/* ---- OLP's events ------------------------------------------------------------------- */

static const char *s_or_empty(const char *s)
{
	return s ? s : "";
}

void metrics_request(const char *route, const char *provider, const char *model, int status,
		     uint64_t dur_us, int64_t ttfb_us)
{
	char st[16];
	const char *const by_provider[] = { "provider", s_or_empty(provider), NULL };

	if (!mf)
		return;
	snprintf(st, sizeof(st), "%d", status);
	(void)metrics_counter_add("olp_requests_total",
				  (const char *const[]){ "route", route, "provider",
							 s_or_empty(provider), "model",
							 s_or_empty(model), "status", st, NULL },
				  1);
	(void)metrics_observe_us("olp_request_duration_seconds", by_provider, dur_us);
	if (ttfb_us >= 0)
		(void)metrics_observe_us("olp_time_to_first_byte_seconds", by_provider,
					 (uint64_t)ttfb_us);
}

void metrics_provider_add(const char *provider)
{
	(void)metrics_gauge_add("olp_runs_in_flight",
				(const char *const[]){ "provider", provider, NULL }, 0);
}

void metrics_run_begin(const char *provider)
{
	(void)metrics_gauge_add("olp_runs_in_flight",
				(const char *const[]){ "provider", provider, NULL }, 1);
}

void metrics_run_end(const char *provider)
{
	(void)metrics_gauge_add("olp_runs_in_flight",
				(const char *const[]){ "provider", provider, NULL }, -1);
}

void metrics_run_started(const char *provider, const char *start)
{
	(void)metrics_counter_add(
		"olp_runs_total",
		(const char *const[]){ "provider", provider, "start", start, NULL }, 1);
}

void metrics_account_run(const char *provider, const char *account)
{
	(void)metrics_counter_add(
		"olp_account_requests_total",
		(const char *const[]){ "provider", provider, "account", account, NULL }, 1);
}

void metrics_sandbox_failure(const char *provider, const char *reason)
{
	(void)metrics_counter_add(
		"olp_sandbox_start_failures_total",
		(const char *const[]){ "provider", provider, "reason", reason, NULL }, 1);
}

void metrics_quota_rejected(const char *limit)
{
	(void)metrics_counter_add("olp_quota_rejections_total",
				  (const char *const[]){ "limit", limit, NULL }, 1);
}

void metrics_audit_failures(uint64_t n)
{
	(void)metrics_counter_add("olp_audit_write_failures_total", NULL, n);
}

void metrics_prestart_event(const char *event, int64_t idle_delta)
{
	(void)metrics_counter_add("olp_prestart_events_total",
				  (const char *const[]){ "event", event, NULL }, 1);
	if (idle_delta)
		(void)metrics_gauge_add("olp_prestart_idle", NULL, idle_delta);
}

/* The pool's value of the series key (rendered as build_key does) of family fam. */
static void value_by_key(const struct family *fam, const char *key, int64_t *out)
{
	uint32_t h = key_hash(key);
	bool any = false;

	*out = 0;
	/* Every row of the series is on its key's probe chain (slot_get fills the chain's
	 * first empty slot, and no slot is ever emptied): walk that, not the table. */
	for (uint32_t i = 0; i < METRICS_MAX_SERIES; i++) {
		const struct mslot *s = &mf->slots[(h + i) % METRICS_MAX_SERIES];
		pid_t pid;
		int64_t v;

		if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != SLOT_READY)
			break;
		if (s->kind != (uint32_t)fam->kind || strcmp(s->key, key))
			continue;
		v = (int64_t)__atomic_load_n(&s->v[0], __ATOMIC_RELAXED);
		if (fam->kind != K_GAUGE) {
			*out = v;
			return;
		}
		/* A gauge: the live processes' rows, summed (or the lowest, AGG_MIN). */
		pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
		if (!pid || !alive(pid, __atomic_load_n(&s->pid_start, __ATOMIC_RELAXED)))
			continue;
		if (fam->agg == AGG_SUM)
			*out += v;
		else if (!any || v < *out)
			*out = v;
		any = true;
	}
}

int metrics_value(const char *name, const char *const labels[], int64_t *out)
{
	char key[METRICS_MAX_KEY];
	const struct family *fam = family_find(name);
	int ret;

	*out = 0;
	if (!mf)
		return -ENODEV;
	if (!fam || fam->kind == K_HISTOGRAM)
		return -EINVAL;
	if ((ret = build_key(key, name, labels)) < 0)
		return ret;
	value_by_key(fam, key, out);
	return 0; /* 0 too for a series not counted yet */
}

int metrics_prestart_counts(struct metrics_prestart *out)
{
	/* The keys as build_key renders them, made once: /health reads these on every call. */
	static const char *const keys[] = {
		"olp_prestart_events_total{event=\"hit\"}",
		"olp_prestart_events_total{event=\"miss\"}",
		"olp_prestart_events_total{event=\"expired\"}",
		"olp_prestart_events_total{event=\"died\"}",
	};
	int64_t *const to[] = { &out->hit, &out->miss, &out->expired, &out->died };

	memset(out, 0, sizeof(*out));
	if (!mf)
		return -ENODEV;
	for (size_t i = 0; i < ARRAY_SIZE(keys); i++)
		value_by_key(family_find("olp_prestart_events_total"), keys[i], to[i]);
	value_by_key(family_find("olp_prestart_idle"), "olp_prestart_idle", &out->idle);
	return 0;
}

void metrics_ledger_failure(void)
{
	(void)metrics_counter_add("olp_ledger_write_failures_total", NULL, 1);
}

void metrics_ledger_available(bool ok)
{
	(void)metrics_gauge_set("olp_ledger_available", NULL, ok ? 1 : 0);
}

void metrics_store_available(bool ok)
{
	(void)metrics_gauge_set("olp_store_available", NULL, ok ? 1 : 0);
}

void metrics_ledger_dropped(uint64_t n)
{
	/* 0 makes the series, so that a scrape shows it at 0 (the store's first sync). */
	(void)metrics_counter_add("olp_ledger_dropped_total", NULL, n);
}

void metrics_unauthenticated(int status)
{
	char st[16];

	snprintf(st, sizeof(st), "%d", status);
	(void)metrics_counter_add("olp_unauthenticated_requests_total",
				  (const char *const[]){ "status", st, NULL }, 1);
}
