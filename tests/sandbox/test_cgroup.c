/* CUnit suite for sandbox/'s resource control: a delegated cgroup v2 per run, or rlimits
 * with the reason why not.
 *
 * On a host whose cgroup v2 offers no controllers (this project's CI host is a v1/v2
 * hybrid) it checks the fallback and the reasons the doctor gives. Inside the test VM
 * (tests/vm/olp-vm, a pure cgroup v2 host), CTest sets OLP_EXPECT_CGROUP=cgroup2 and the
 * limits themselves are tested: each run in its own cgroup with memory.max, pids.max and
 * cpu.max, a fork bomb stopped by pids.max, a memory hog killed by memory.max, CPU
 * throttled by cpu.max, nothing left behind. Run both as root and as an unprivileged user
 * in a delegated cgroup (tests/sandbox/cgroup-vm.sh). */
#include "tests/support/cunit.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "sandbox/sandbox.h"
#include "common/banned.h"

static char runtime_dir[] = "/tmp/olp-cg-test-XXXXXX";
static const char *base; /* the cgroup runs are made in (cgroup2 mode), else NULL */
/* The payload and the CLI; OLP_PROBE / OLP_SANDBOX override the build tree's (copies an
 * unprivileged user can read: tests/sandbox/cgroup-vm.sh). */
static const char *probe = OLP_PROBE_PATH, *cli = OLP_SANDBOX_PATH;

static int collect(void *ctx, const char *data, size_t len)
{
	buf_add(ctx, data, len);
	return 0;
}

static struct sbx_policy *probe_policy(const struct sbx_limits *l, uint64_t timeout_ms)
{
	struct sbx_policy *p = sbx_policy_new();

	CU_ASSERT_FATAL(p != NULL);
	CU_ASSERT_EQUAL(sbx_policy_add_ro(p, probe), 0);
	sbx_policy_set_timeout_ms(p, timeout_ms);
	if (l)
		sbx_policy_set_limits(p, l);
	return p;
}

/* Names of the run cgroups ("sbx-...") now in the base; count returned. */
static int run_cgroups(char *first, size_t n)
{
	DIR *d = opendir(base);
	struct dirent *de;
	int count = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		if (!strncmp(de->d_name, "sbx-", 4)) {
			if (!count && first)
				snprintf(first, n, "%s", de->d_name);
			count++;
		}
	closedir(d);
	return count;
}

static void read_cg_file(const char *cg, const char *file, struct buf *out)
{
	char path[4096];

	snprintf(path, sizeof(path), "%s/%s/%s", base, cg, file);
	buf_reset(out);
	CU_ASSERT_EQUAL(buf_read_file(out, path, 4096), 0);
}

/* olp-sandbox --doctor --json with extra arguments; its output in out. */
static int doctor(const char *cgroup_setting, struct buf *out)
{
	int pfd[2], st;
	pid_t pid;

	if (pipe(pfd) < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		dup2(pfd[1], 1);
		close(pfd[0]);
		close(pfd[1]);
		execl(cli, "olp-sandbox", "--runtime-dir", runtime_dir, "--cgroup", cgroup_setting,
		      "--doctor", "--json", (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	while (buf_read_once(out, pfd[0], 65536) > 0)
		;
	close(pfd[0]);
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_mode_reported(void)
{
	const struct sbx_status *st = sbx_status_get();
	const char *expect = getenv("OLP_EXPECT_CGROUP");

	if (!st->available) /* every test below fails then: say why once */
		printf("\n  the sandbox is not available: %s\n", st->message ? st->message : "?");
	CU_ASSERT_TRUE(st->available);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st->cgroup);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st->cgroup_detail);
	CU_ASSERT(st->cgroup_detail[0] != '\0');
	if (expect)
		CU_ASSERT_STRING_EQUAL(st->cgroup, expect);
	CU_ASSERT(!strcmp(st->cgroup, "cgroup2") || !strcmp(st->cgroup, "rlimits"));
	if (!strcmp(st->cgroup, "cgroup2"))
		CU_ASSERT_EQUAL(st->cgroup_detail[0], '/');
	printf("\n  resource control: %s (%s)\n", st->cgroup, st->cgroup_detail);
}

/* "off", a bad path and a bad word each fall back to rlimits with their own reason, and
 * the sandbox stays usable (the doctor exits 0). */
static void test_fallbacks_say_why(void)
{
	static const struct {
		const char *setting, *reason;
	} cases[] = {
		{ "off", "\\\"off\\\" in config.json" },
		{ "/nonexistent/olp-cgroup", "cannot open cgroup /nonexistent/olp-cgroup" },
		{ "sometimes", "must be \\\"auto\\\", \\\"off\\\" or an absolute path" },
	};

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		struct buf out = BUF_INIT;

		CU_ASSERT_EQUAL(doctor(cases[i].setting, &out), 0);
		CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "\"limits\":\"rlimits\""));
		if (!strstr(out.data, cases[i].reason))
			fprintf(stderr, "\n  %s: %s\n", cases[i].setting, out.data);
		CU_ASSERT_PTR_NOT_NULL(strstr(out.data, cases[i].reason));
		buf_release(&out);
	}
}

struct inspect {
	struct buf out;
	bool checked;
	struct sbx_limits want;
};

/* While the probe spins: its cgroup exists, holds its processes and has our limits. */
static int inspect_cgroup(void *ctx, const char *data, size_t len)
{
	struct inspect *in = ctx;
	struct buf v = BUF_INIT;
	char cg[256], expect[64];

	buf_add(&in->out, data, len);
	if (in->checked || !strstr(in->out.data, "spinning"))
		return 0;
	in->checked = true;
	CU_ASSERT_EQUAL(run_cgroups(cg, sizeof(cg)), 1);
	read_cg_file(cg, "cgroup.procs", &v);
	/* bwrap, its namespace init, the probe and its grandchild. */
	CU_ASSERT(v.len > 0 && strchr(v.data, '\n') != strrchr(v.data, '\n'));
	read_cg_file(cg, "memory.max", &v);
	snprintf(expect, sizeof(expect), "%llu\n", (unsigned long long)in->want.memory_mb << 20);
	CU_ASSERT_STRING_EQUAL(v.data, expect);
	read_cg_file(cg, "pids.max", &v);
	snprintf(expect, sizeof(expect), "%llu\n", (unsigned long long)in->want.pids);
	CU_ASSERT_STRING_EQUAL(v.data, expect);
	read_cg_file(cg, "cpu.max", &v);
	snprintf(expect, sizeof(expect), "%llu 100000\n",
		 (unsigned long long)in->want.cpu_pct * 1000);
	CU_ASSERT_STRING_EQUAL(v.data, expect);
	read_cg_file(cg, "memory.oom.group", &v);
	CU_ASSERT_STRING_EQUAL(v.data, "1\n");
	buf_release(&v);
	return 1; /* seen enough: end the run */
}

static void test_run_has_own_cgroup(void)
{
	struct inspect in = { .out = BUF_INIT,
			      .want = { .memory_mb = 300, .pids = 77, .cpu_pct = 150 } };
	struct sbx_callbacks cb = { .on_stdout = inspect_cgroup, .ctx = &in };
	struct sbx_policy *p;
	struct sbx_result res;

	p = probe_policy(&in.want, 20000);
	CU_ASSERT_EQUAL(run_cgroups(NULL, 0), 0);
	CU_ASSERT_EQUAL(sbx_run(p, (const char *const[]){ probe, "spin", NULL }, NULL, &cb, &res),
			0);
	CU_ASSERT_TRUE(in.checked);
	CU_ASSERT_EQUAL(res.end, SBX_END_STOPPED);
	/* The tree is gone and so is its cgroup. */
	CU_ASSERT_EQUAL(run_cgroups(NULL, 0), 0);
	buf_release(&in.out);
	sbx_policy_free(p);
}

/* pids.max, not the rlimit (set well above it), stops a process hoarder; the run ends at
 * its timeout and cgroup.kill takes every process at once. */
static void test_pids_stop_fork_bomb(void)
{
	/* An unprivileged worker cannot raise RLIMIT_NPROC past its hard limit. */
	struct sbx_limits l = { .pids = 40, .nproc = 1000 };
	const char *held;
	struct sbx_policy *p;
	struct sbx_result res;
	struct buf out = BUF_INIT;
	struct sbx_callbacks cb = { .on_stdout = collect, .ctx = &out };
	uint64_t t0 = mono_ms();

	p = probe_policy(&l, 3000);
	CU_ASSERT_EQUAL(sbx_run(p, (const char *const[]){ probe, "forkhold", "1000", "10", NULL },
				NULL, &cb, &res),
			0);
	CU_ASSERT_EQUAL(res.end, SBX_END_TIMEOUT);
	CU_ASSERT_PTR_NOT_NULL(
		strstr(out.data, "\"stopped_by\":\"Resource temporarily unavailable"));
	held = strstr(out.data, "\"forkhold\":");
	CU_ASSERT_PTR_NOT_NULL_FATAL(held);
	CU_ASSERT(strtol(held + 11, NULL, 10) < 40);
	CU_ASSERT(mono_ms() - t0 < 30000);
	CU_ASSERT_EQUAL(run_cgroups(NULL, 0), 0);
	buf_release(&out);
	sbx_policy_free(p);
}

/* memory.max, not RLIMIT_AS (set far above it), stops a memory hog: the OOM killer takes
 * the whole run (memory.oom.group), so bwrap itself dies of SIGKILL; the hog never sees
 * malloc fail. */
static void test_memory_kills_hog(void)
{
	struct sbx_limits l = { .memory_mb = 96, .as_mb = 1 << 20 };
	struct sbx_policy *p;
	struct sbx_result res;
	struct buf out = BUF_INIT;
	struct sbx_callbacks cb = { .on_stdout = collect, .ctx = &out };

	p = probe_policy(&l, 60000);
	CU_ASSERT_EQUAL(sbx_run(p, (const char *const[]){ probe, "hog", NULL }, NULL, &cb, &res),
			0);
	CU_ASSERT_EQUAL(res.end, SBX_END_SIGNALED);
	CU_ASSERT_EQUAL(res.term_signal, SIGKILL);
	CU_ASSERT_PTR_NULL(strstr(out.data, "hog_stopped_at_mib"));
	CU_ASSERT_EQUAL(run_cgroups(NULL, 0), 0);
	buf_release(&out);
	sbx_policy_free(p);
}

/* The probe's work done in 1.5 s of busy looping at pct % of a core (its cpu_ms said too). */
static long cpu_work_of(uint64_t pct, long *cpu_ms)
{
	struct sbx_limits l = { .cpu_pct = pct };
	struct sbx_policy *p = probe_policy(&l, 20000);
	struct sbx_result res;
	struct buf out = BUF_INIT;
	struct sbx_callbacks cb = { .on_stdout = collect, .ctx = &out };
	const char *v;
	long work = -1;

	CU_ASSERT_EQUAL(
		sbx_run(p, (const char *const[]){ probe, "cpu", "1500", NULL }, NULL, &cb, &res),
		0);
	CU_ASSERT_EQUAL(res.end, SBX_END_EXITED);
	v = strstr(out.data, "\"cpu_ms\":");
	CU_ASSERT_PTR_NOT_NULL(v);
	*cpu_ms = v ? atol(v + 9) : -1;
	v = strstr(out.data, "\"work\":");
	CU_ASSERT_PTR_NOT_NULL(v);
	if (v)
		work = atol(v + 7);
	buf_release(&out);
	sbx_policy_free(p);
	return work;
}

/* cpu.max: at 10 % of a core, 1.5 s of busy looping does a fraction of the work the
 * same loop does at 100 % (compared in one run: the VM's speed varies). Work, not CPU
 * time: under TCG on a busy host the guest charges a descheduled vCPU's time as CPU
 * time, and the throttled run's cpu_ms came out at a third of the full one's. */
static void test_cpu_throttled(void)
{
	long full, throttled, full_ms, throttled_ms;

	full = cpu_work_of(100, &full_ms);
	throttled = cpu_work_of(10, &throttled_ms);
	printf("\n  in 1.5 s: work %ld (cpu %ld ms) at 100 %%, work %ld (cpu %ld ms) at 10 %%\n",
	       full, full_ms, throttled, throttled_ms);
	CU_ASSERT(full > 0 && throttled >= 0);
	CU_ASSERT(throttled * 3 < full);
}

/* A run cgroup left by a dead worker is removed when a worker starts. As the unprivileged
 * user (tests/sandbox/cgroup-vm.sh) this worker now lives in the leaf it moved itself into,
 * like a worker the web server starts later: it must find the same base again. */
static void test_stale_cgroup_swept(void)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP,
					 .runtime_dir = runtime_dir,
					 .cgroup = getenv("OLP_TEST_CGROUP") };
	char path[4096];
	struct stat st;

	/* pid 2^22 + 1 is above pid_max's ceiling: never a live process. */
	snprintf(path, sizeof(path), "%s/sbx-4194305-0-0123456789abcdef", base);
	CU_ASSERT_EQUAL_FATAL(mkdir(path, 0755), 0);
	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	CU_ASSERT_EQUAL(stat(path, &st), -1);
	CU_ASSERT_EQUAL(errno, ENOENT);
}

int main(void)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP };
	static const struct ts_test tests[] = {
		{ "resource control mode reported", test_mode_reported },
		{ "fallbacks to rlimits say why", test_fallbacks_say_why },
		{ "a run gets its own cgroup with its limits", test_run_has_own_cgroup },
		{ "pids.max stops a fork bomb", test_pids_stop_fork_bomb },
		{ "memory.max kills a memory hog", test_memory_kills_hog },
		{ "cpu.max throttles", test_cpu_throttled },
		{ "stale run cgroups swept", test_stale_cgroup_swept },
		{ NULL, NULL },
	};
	/* The first two: what is reported without a cgroup of ours. */
	static const struct ts_test tests_without_cgroup[] = {
		{ "resource control mode reported", test_mode_reported },
		{ "fallbacks to rlimits say why", test_fallbacks_say_why },
		{ NULL, NULL },
	};
	static char base_buf[4096];
	int fails;

	if (getenv("OLP_PROBE"))
		probe = getenv("OLP_PROBE");
	if (getenv("OLP_SANDBOX"))
		cli = getenv("OLP_SANDBOX");
	if (!mkdtemp(runtime_dir))
		return 1;
	cfg.runtime_dir = runtime_dir;
	cfg.cgroup = getenv("OLP_TEST_CGROUP");
	if (sbx_global_init(&cfg)) {
		fprintf(stderr, "sbx_global_init failed\n");
		return 1;
	}
	if (!strcmp(sbx_status_get()->cgroup, "cgroup2")) {
		snprintf(base_buf, sizeof(base_buf), "%s", sbx_status_get()->cgroup_detail);
		base = base_buf;
	}
	/* The limits themselves only where a cgroup is ours (tests/vm makes sure of one). */
	if (!base)
		printf("no delegated cgroup v2 here: the limit tests run in tests/vm\n");
	fails = ts_cunit_run("sandbox_cgroup", base ? tests : tests_without_cgroup);
	sbx_global_release();
	rmdir(runtime_dir);
	return ts_exit_status(fails);
}
