/* metrics/: the shared table through metrics.h — counts that add up across processes,
 * histograms, escaping, a full table, a killed process's gauge, and the file checks. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "metrics/metrics.h"
#include "tests/support/cunit.h"
#include "common/banned.h"

static char dir[64];

/* A fresh directory and a fresh table in it. */
static void fresh(void)
{
	struct buf err = BUF_INIT;

	snprintf(dir, sizeof(dir), "/tmp/olp-metrics-XXXXXX");
	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	CU_ASSERT_EQUAL_FATAL(metrics_open(dir, &err), 0);
	buf_release(&err);
}

static void rm_dir(void)
{
	char cmd[128];

	metrics_close();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	CU_ASSERT_EQUAL(system(cmd), 0);
}

/* The value of one series in a scrape (the whole line's name part), or -1 when absent. */
static double value_of(const char *series)
{
	struct buf out = BUF_INIT, want = BUF_INIT;
	double v = -1;
	const char *p;

	CU_ASSERT_EQUAL(metrics_render(&out), 0);
	buf_addf(&want, "\n%s ", series);
	p = strstr(out.data, want.data);
	if (p)
		v = strtod(p + want.len, NULL);
	buf_release(&out);
	buf_release(&want);
	return v;
}

static void test_counts_across_processes(void)
{
	const char *const labels[] = { "route", "chat", "status", "200", NULL };
	pid_t kids[4];
	int st;

	fresh();
	for (int k = 0; k < 4; k++) {
		kids[k] = fork();
		CU_ASSERT_FATAL(kids[k] >= 0);
		if (kids[k] == 0) {
			for (int i = 0; i < 10000; i++)
				if (metrics_counter_add("olp_requests_total", labels, 1))
					_exit(1);
			_exit(0);
		}
	}
	for (int k = 0; k < 4; k++) {
		CU_ASSERT_EQUAL(waitpid(kids[k], &st, 0), kids[k]);
		CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	CU_ASSERT_EQUAL(value_of("olp_requests_total{route=\"chat\",status=\"200\"}"), 40000);
	/* A second mapping of the same file (another worker) sees the same. */
	{
		struct buf err = BUF_INIT;

		CU_ASSERT_EQUAL(metrics_open(dir, &err), 0);
		buf_release(&err);
	}
	CU_ASSERT_EQUAL(value_of("olp_requests_total{route=\"chat\",status=\"200\"}"), 40000);
	rm_dir();
}

static void test_histogram(void)
{
	const char *const l[] = { "provider", "p", NULL };
	const uint64_t obs[] = { 1000, 7000, 7000, 200000, 200000000 };

	fresh();
	for (size_t i = 0; i < ARRAY_SIZE(obs); i++)
		CU_ASSERT_EQUAL(metrics_observe_us("olp_request_duration_seconds", l, obs[i]), 0);
	CU_ASSERT_EQUAL(
		value_of("olp_request_duration_seconds_bucket{provider=\"p\",le=\"0.005\"}"), 1);
	CU_ASSERT_EQUAL(value_of("olp_request_duration_seconds_bucket{provider=\"p\",le=\"0.01\"}"),
			3);
	CU_ASSERT_EQUAL(value_of("olp_request_duration_seconds_bucket{provider=\"p\",le=\"0.1\"}"),
			3);
	CU_ASSERT_EQUAL(value_of("olp_request_duration_seconds_bucket{provider=\"p\",le=\"0.25\"}"),
			4);
	CU_ASSERT_EQUAL(value_of("olp_request_duration_seconds_bucket{provider=\"p\",le=\"120\"}"),
			4);
	CU_ASSERT_EQUAL(value_of("olp_request_duration_seconds_bucket{provider=\"p\",le=\"+Inf\"}"),
			5);
	CU_ASSERT_EQUAL(value_of("olp_request_duration_seconds_count{provider=\"p\"}"), 5);
	CU_ASSERT_DOUBLE_EQUAL(value_of("olp_request_duration_seconds_sum{provider=\"p\"}"),
			       200.215, 1e-9);
	/* Wrong kind, unknown family: refused, nothing recorded. */
	CU_ASSERT_EQUAL(metrics_counter_add("olp_request_duration_seconds", l, 1), -EINVAL);
	CU_ASSERT_EQUAL(metrics_counter_add("olp_no_such_thing", l, 1), -EINVAL);
	/* The per-request helper: ttfb only when there was a first byte. */
	metrics_request("models", NULL, NULL, 200, 3000, -1);
	CU_ASSERT_EQUAL(value_of("olp_requests_total{route=\"models\",provider=\"\",model=\"\","
				 "status=\"200\"}"),
			1);
	CU_ASSERT_EQUAL(value_of("olp_request_duration_seconds_count{provider=\"\"}"), 1);
	CU_ASSERT_EQUAL(value_of("olp_time_to_first_byte_seconds_count{provider=\"\"}"), -1);
	rm_dir();
}

/* metrics_request keeps the slots it found for the next request with the same labels:
 * each request still counts once, in its own series, and in the file mapped now. */
static void test_request_series(void)
{
	fresh();
	for (int i = 0; i < 3; i++)
		metrics_request("chat", "p", "m", 200, 3000, -1);
	metrics_request("chat", "p", "m", 502, 3000, 1000);
	metrics_request("chat", "p", "m", 200, 3000, 1000);
	metrics_request("chat", "q", "m", 200, 3000, 1000);
	metrics_request("chat", "p", "m2", 200, 3000, -1);
	CU_ASSERT_EQUAL(value_of("olp_requests_total{route=\"chat\",provider=\"p\",model=\"m\","
				 "status=\"200\"}"),
			4);
	CU_ASSERT_EQUAL(value_of("olp_requests_total{route=\"chat\",provider=\"p\",model=\"m\","
				 "status=\"502\"}"),
			1);
	CU_ASSERT_EQUAL(value_of("olp_requests_total{route=\"chat\",provider=\"p\",model=\"m2\","
				 "status=\"200\"}"),
			1);
	CU_ASSERT_EQUAL(value_of("olp_request_duration_seconds_count{provider=\"p\"}"), 6);
	CU_ASSERT_EQUAL(value_of("olp_time_to_first_byte_seconds_count{provider=\"p\"}"), 2);
	CU_ASSERT_EQUAL(value_of("olp_time_to_first_byte_seconds_count{provider=\"q\"}"), 1);
	rm_dir();
	/* Another file: counted there, from 0 (nothing written through the old mapping). */
	fresh();
	metrics_request("chat", "p", "m", 200, 3000, -1);
	CU_ASSERT_EQUAL(value_of("olp_requests_total{route=\"chat\",provider=\"p\",model=\"m\","
				 "status=\"200\"}"),
			1);
	rm_dir();
	/* Closed: nothing counted, nothing touched. */
	metrics_request("chat", "p", "m", 200, 3000, -1);
}

static void test_escaping(void)
{
	fresh();
	metrics_run_started("a\\b\"c\nd", "cold");
	CU_ASSERT_EQUAL(value_of("olp_runs_total{provider=\"a\\\\b\\\"c\\nd\",start=\"cold\"}"), 1);
	rm_dir();
}

static void test_table_full(void)
{
	char name[32], longv[400];
	int dropped = 0;

	fresh();
	/* More series than the table holds: the rest are dropped, counted, and what is in
	 * the table still counts. */
	for (int i = 0; i < METRICS_MAX_SERIES + 100; i++) {
		snprintf(name, sizeof(name), "p%d", i);
		if (metrics_counter_add("olp_runs_total",
					(const char *const[]){ "provider", name, NULL },
					1) == -ENOSPC)
			dropped++;
	}
	CU_ASSERT(dropped >= 100);
	CU_ASSERT_EQUAL(value_of("olp_metrics_dropped_series_total"), dropped);
	CU_ASSERT_EQUAL(metrics_counter_add("olp_audit_write_failures_total", NULL, 2), 0);
	CU_ASSERT_EQUAL(value_of("olp_audit_write_failures_total"), 2);
	/* A key longer than a slot holds: dropped too. */
	memset(longv, 'x', sizeof(longv) - 1);
	longv[sizeof(longv) - 1] = '\0';
	CU_ASSERT_EQUAL(metrics_counter_add("olp_runs_total",
					    (const char *const[]){ "provider", longv, NULL }, 1),
			-ENAMETOOLONG);
	CU_ASSERT_EQUAL(value_of("olp_metrics_dropped_series_total"), dropped + 1);
	rm_dir();
}

static void test_killed_gauge(void)
{
	const char *g = "olp_runs_in_flight{provider=\"p\"}";
	int p[2];
	char c;
	pid_t kid;

	fresh();
	CU_ASSERT_FATAL(pipe(p) == 0);
	kid = fork();
	CU_ASSERT_FATAL(kid >= 0);
	if (kid == 0) {
		metrics_run_begin("p");
		metrics_run_begin("p");
		if (write(p[1], "x", 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	CU_ASSERT_EQUAL(read(p[0], &c, 1), 1);
	metrics_run_begin("p");
	CU_ASSERT_EQUAL(value_of(g), 3);
	/* Killed mid-run: its two runs are no longer in flight, ours still is. */
	kill(kid, SIGKILL);
	CU_ASSERT_EQUAL(waitpid(kid, NULL, 0), kid);
	CU_ASSERT_EQUAL(value_of(g), 1);
	metrics_run_end("p");
	CU_ASSERT_EQUAL(value_of(g), 0);
	/* A new process takes the dead one's row over, starting from 0. */
	kid = fork();
	CU_ASSERT_FATAL(kid >= 0);
	if (kid == 0) {
		metrics_run_begin("p");
		_exit(value_of(g) == 1 ? 0 : 1);
	}
	{
		int st;

		CU_ASSERT_EQUAL(waitpid(kid, &st, 0), kid);
		CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	CU_ASSERT_EQUAL(value_of(g), 0);
	close(p[0]);
	close(p[1]);
	rm_dir();
}

/* olp_ledger_available is a state each worker sets: the pool shows the lowest live one (a
 * worker that cannot write the ledger makes it 0), and a dead worker's row stops counting. */
static void test_ledger_available(void)
{
	const char *g = "olp_ledger_available";
	int p[2];
	char c;
	pid_t kid;

	fresh();
	CU_ASSERT_EQUAL(value_of(g), -1); /* no worker said anything yet */
	metrics_ledger_available(true);
	CU_ASSERT_EQUAL(value_of(g), 1);
	CU_ASSERT_FATAL(pipe(p) == 0);
	kid = fork();
	CU_ASSERT_FATAL(kid >= 0);
	if (kid == 0) {
		metrics_ledger_available(false);
		if (write(p[1], "x", 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	CU_ASSERT_EQUAL(read(p[0], &c, 1), 1);
	CU_ASSERT_EQUAL(value_of(g), 0);
	metrics_ledger_available(true); /* set, not added: still 1 for this process */
	CU_ASSERT_EQUAL(value_of(g), 0);
	kill(kid, SIGKILL);
	CU_ASSERT_EQUAL(waitpid(kid, NULL, 0), kid);
	CU_ASSERT_EQUAL(value_of(g), 1);
	metrics_ledger_available(false);
	CU_ASSERT_EQUAL(value_of(g), 0);
	metrics_unauthenticated(401);
	metrics_unauthenticated(401);
	metrics_unauthenticated(404);
	CU_ASSERT_EQUAL(value_of("olp_unauthenticated_requests_total{status=\"401\"}"), 2);
	CU_ASSERT_EQUAL(value_of("olp_unauthenticated_requests_total{status=\"404\"}"), 1);
	close(p[0]);
	close(p[1]);
	rm_dir();
}

static int reopen(void)
{
	struct buf err = BUF_INIT;
	int ret = metrics_open(dir, &err);

	if (ret)
		printf("\n    refused as expected: %s\n", err.data);
	CU_ASSERT(ret == 0 || err.len > 0);
	buf_release(&err);
	return ret;
}

static void write_file(const char *path, size_t size, char fill)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	char b[4096];

	CU_ASSERT_FATAL(fd >= 0);
	memset(b, fill, sizeof(b));
	while (size) {
		size_t n = size < sizeof(b) ? size : sizeof(b);

		CU_ASSERT_FATAL(write(fd, b, n) == (ssize_t)n);
		size -= n;
	}
	close(fd);
}

static void test_file_checks(void)
{
	char path[128], other[128];
	struct stat st;
	off_t size;

	fresh();
	snprintf(path, sizeof(path), "%s/metrics.v1", dir);
	snprintf(other, sizeof(other), "%s/elsewhere", dir);
	CU_ASSERT_FATAL(stat(path, &st) == 0);
	CU_ASSERT_EQUAL(st.st_mode & 0777, 0600);
	size = st.st_size;
	metrics_audit_failures(5);
	metrics_close();

	/* Wrong magic, right size: not this version's table, made anew (counts from 0). */
	write_file(path, (size_t)size, 'z');
	CU_ASSERT_EQUAL(reopen(), 0);
	CU_ASSERT_EQUAL(value_of("olp_audit_write_failures_total"), 0);
	metrics_audit_failures(5);
	/* Wrong size: made anew too. */
	write_file(path, 100, 0);
	CU_ASSERT_EQUAL(reopen(), 0);
	CU_ASSERT_EQUAL(value_of("olp_audit_write_failures_total"), 0);
	CU_ASSERT(stat(path, &st) == 0 && st.st_size == size);

	/* Others may read it: refused, left alone. */
	CU_ASSERT_FATAL(chmod(path, 0644) == 0);
	CU_ASSERT_EQUAL(reopen(), -EPERM);
	CU_ASSERT_FALSE(metrics_is_open());
	CU_ASSERT(stat(path, &st) == 0 && (st.st_mode & 0777) == 0644);
	CU_ASSERT_EQUAL(metrics_render(&(struct buf)BUF_INIT), -ENODEV);
	metrics_audit_failures(1); /* a no-op, not a crash */
	CU_ASSERT_FATAL(chmod(path, 0600) == 0);

	/* Someone else's: refused (only root can make one here). */
	if (geteuid() == 0) {
		CU_ASSERT_FATAL(chown(path, 65534, 65534) == 0);
		CU_ASSERT_EQUAL(reopen(), -EPERM);
		CU_ASSERT_FATAL(chown(path, 0, 0) == 0);
	}

	/* A symlink in its place: refused, its target untouched. */
	write_file(other, 10, 'a');
	CU_ASSERT_FATAL(unlink(path) == 0);
	CU_ASSERT_FATAL(symlink(other, path) == 0);
	CU_ASSERT_EQUAL(reopen(), -ELOOP);
	CU_ASSERT(stat(other, &st) == 0 && st.st_size == 10);
	/* ... and a symlink as the lock file. */
	CU_ASSERT_FATAL(unlink(path) == 0);
	snprintf(path, sizeof(path), "%s/metrics.lock", dir);
	CU_ASSERT_FATAL(unlink(path) == 0);
	CU_ASSERT_FATAL(symlink(other, path) == 0);
	CU_ASSERT_EQUAL(reopen(), -ELOOP);
	CU_ASSERT(stat(other, &st) == 0 && st.st_size == 10);
	rm_dir();
}

/* A disk with no room for the table: refused at open (ENOSPC), never a SIGBUS later on a
 * store into a hole of the mapping. A tmpfs of 64 KiB in a mount namespace of its own. */
static void test_full_disk(void)
{
	pid_t kid;
	int st;

	fresh();
	metrics_close();
	kid = fork();
	CU_ASSERT_FATAL(kid >= 0);
	if (kid == 0) {
		struct buf err = BUF_INIT;
		int ret;

		if (unshare(CLONE_NEWNS) < 0 ||
		    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
		    mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0700") < 0)
			_exit(77);
		ret = metrics_open(dir, &err);
		printf("\n    on a full disk: %d %s\n", ret, err.data);
		_exit(ret == -ENOSPC && !metrics_is_open() ? 0 : 1);
	}
	CU_ASSERT_EQUAL(waitpid(kid, &st, 0), kid);
	CU_ASSERT_FATAL(WIFEXITED(st));
	if (WEXITSTATUS(st) == 77)
		printf("\n    SKIP: no mount namespace here (not root?)\n");
	else
		CU_ASSERT_EQUAL(WEXITSTATUS(st), 0);
	rm_dir();
}

/* metrics_value (what /health reads) agrees with the scrape: a counter's value, a gauge
 * summed over the processes that are alive, 0 for a series never counted. */
static void test_value(void)
{
	const char *const hit[] = { "event", "hit", NULL }, *const miss[] = { "event", "miss",
									      NULL };
	struct metrics_prestart mp;
	int64_t v = -1;
	pid_t pid;
	int st;

	fresh();
	CU_ASSERT_EQUAL(metrics_value("olp_prestart_events_total", hit, &v), 0);
	CU_ASSERT_EQUAL(v, 0);
	metrics_prestart_event("ready", 1);
	metrics_prestart_event("ready", 1);
	metrics_prestart_event("hit", -1);
	CU_ASSERT_EQUAL(metrics_value("olp_prestart_events_total", hit, &v), 0);
	CU_ASSERT_EQUAL(v, 1);
	CU_ASSERT_EQUAL(v, (int64_t)value_of("olp_prestart_events_total{event=\"hit\"}"));
	CU_ASSERT_EQUAL(metrics_value("olp_prestart_idle", NULL, &v), 0);
	CU_ASSERT_EQUAL(v, 1);
	/* Another process's idle ones count while it lives, not once it is gone. */
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		metrics_prestart_event("ready", 1);
		metrics_prestart_event("ready", 1);
		_exit(0);
	}
	CU_ASSERT_EQUAL(waitpid(pid, &st, 0), pid);
	CU_ASSERT_EQUAL(metrics_value("olp_prestart_idle", NULL, &v), 0);
	CU_ASSERT_EQUAL(v, 1);
	CU_ASSERT_EQUAL(metrics_value("olp_prestart_events_total",
				      (const char *const[]){ "event", "ready", NULL }, &v),
			0);
	CU_ASSERT_EQUAL(v, 4);
	CU_ASSERT_EQUAL(metrics_value("olp_request_duration_seconds", NULL, &v), -EINVAL);
	CU_ASSERT_EQUAL(metrics_value("olp_no_such_thing", NULL, &v), -EINVAL);
	/* /health's read of all five at once says the same. */
	metrics_prestart_event("miss", 0);
	metrics_prestart_event("miss", 0);
	metrics_prestart_event("died", -1);
	CU_ASSERT_EQUAL(metrics_prestart_counts(&mp), 0);
	CU_ASSERT_EQUAL(mp.hit, 1);
	CU_ASSERT_EQUAL(mp.miss, 2);
	CU_ASSERT_EQUAL(mp.expired, 0);
	CU_ASSERT_EQUAL(mp.died, 1);
	CU_ASSERT_EQUAL(mp.idle, 0);
	CU_ASSERT_EQUAL(metrics_value("olp_prestart_events_total", miss, &v), 0);
	CU_ASSERT_EQUAL(v, mp.miss);
	rm_dir();
	CU_ASSERT_EQUAL(metrics_value("olp_prestart_idle", NULL, &v), -ENODEV);
	CU_ASSERT_EQUAL(metrics_prestart_counts(&mp), -ENODEV);
}

static void test_render_shape(void)
{
	struct buf out = BUF_INIT;

	fresh();
	CU_ASSERT_EQUAL(metrics_render(&out), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "# TYPE olp_requests_total counter\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "# TYPE olp_runs_in_flight gauge\n"));
	CU_ASSERT_PTR_NOT_NULL(
		strstr(out.data, "# TYPE olp_time_to_first_byte_seconds histogram\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "olp_build_info{version=\"" OLP_VERSION "\"} 1\n"));
	/* Pre-created at 0, so that rate() has a start. */
	CU_ASSERT_PTR_NOT_NULL(
		strstr(out.data, "olp_quota_rejections_total{limit=\"requests_per_day\"} 0\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "olp_ledger_write_failures_total 0\n"));
	buf_release(&out);
	metrics_quota_rejected("requests_per_day");
	metrics_ledger_failure();
	metrics_sandbox_failure("p", "sandbox");
	CU_ASSERT_EQUAL(value_of("olp_quota_rejections_total{limit=\"requests_per_day\"}"), 1);
	CU_ASSERT_EQUAL(value_of("olp_ledger_write_failures_total"), 1);
	CU_ASSERT_EQUAL(
		value_of("olp_sandbox_start_failures_total{provider=\"p\",reason=\"sandbox\"}"), 1);
	rm_dir();
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "counts across 4 processes", test_counts_across_processes },
		{ "histogram buckets, sum, count", test_histogram },
		{ "label values escaped", test_escaping },
		{ "metrics_request: the same labels again, others, another file",
		  test_request_series },
		{ "table full: dropped and counted", test_table_full },
		{ "a SIGKILLed process's gauge", test_killed_gauge },
		{ "olp_ledger_available: the lowest live worker's", test_ledger_available },
		{ "file checks", test_file_checks },
		{ "a full disk: refused at open", test_full_disk },
		{ "families, pre-created series", test_render_shape },
		{ "metrics_value: counters, live gauges", test_value },
		{ NULL, NULL },
	};

	return ts_exit_status(ts_cunit_run("metrics", tests));
}
