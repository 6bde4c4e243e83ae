/* CUnit suite for sandbox/: spawning, supervision, descriptors, environment, timeouts,
 * cleanup. Runs real bwrap; the payload is olp-probe (built without sanitizers). */
#include "tests/support/cunit.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "sandbox/sandbox.h"
#include "tests/support/support.h"
#include "common/banned.h"

static char runtime_dir[] = "/tmp/olp-sbx-test-XXXXXX";

static int collect(void *ctx, const char *data, size_t len)
{
	buf_add(ctx, data, len);
	return 0;
}

static struct sbx_policy *probe_policy(void)
{
	struct sbx_policy *p = sbx_policy_new();

	CU_ASSERT_FATAL(p != NULL);
	CU_ASSERT_EQUAL(sbx_policy_add_ro(p, OLP_PROBE_PATH), 0);
	sbx_policy_set_timeout_ms(p, 20000);
	return p;
}

/* How long a run took, bounded: elapsed since t0 under ms. Under emulation (an arm64 guest
 * under TCG on a loaded host: tests/vm/arm64-vm.sh sets OLP_TEST_TIME_FACTOR) the bound is
 * ms times that factor (1 to 10, anything else is 1), and never past 19 s: every bound
 * here tells a run that ended on time from one that ran into the policy's 20 s timeout
 * or `sleep 20`, which a larger bound would no longer do. Lower bounds (a timeout must
 * not fire early) are never scaled. A scaled check prints what it took, so a run's log
 * shows the margin. */
static bool took_under(uint64_t t0, uint64_t ms)
{
	const char *f = getenv("OLP_TEST_TIME_FACTOR");
	uint64_t took = mono_ms() - t0, bound = ms;
	char *end;
	unsigned long k;

	if (f && *f) {
		errno = 0;
		k = strtoul(f, &end, 10);
		if (!errno && !*end && k >= 1 && k <= 10)
			bound = ms * k < 19000 ? ms * k : 19000;
	}
	if (bound != ms)
		fprintf(stderr,
			"  took %llu ms, bound %llu ms (%llu ms x OLP_TEST_TIME_FACTOR=%s)\n",
			(unsigned long long)took, (unsigned long long)bound, (unsigned long long)ms,
			f);
	return took < bound;
}

/* Run argv under p, collecting stdout into out. */
static int run(struct sbx_policy *p, const char *const argv[], const char *in, size_t in_len,
	       struct buf *out, struct sbx_result *res)
{
	struct sbx_callbacks cb = { .on_stdout = collect, .ctx = out };
	struct sbx_run_options opt = { .stdin_data = in, .stdin_len = in_len, .hangup_fd = -1 };

	return sbx_run(p, argv, &opt, &cb, res);
}

static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

static void test_echo_and_exit_status(void)
{
	struct sbx_policy *p = probe_policy();
	struct buf out = BUF_INIT;
	struct sbx_result res;

	CU_ASSERT_EQUAL(run(p, (const char *const[]){ "/usr/bin/echo", "hello", NULL }, NULL, 0,
			    &out, &res),
			0);
	CU_ASSERT_EQUAL(res.end, SBX_END_EXITED);
	CU_ASSERT_EQUAL(res.exit_status, 0);
	CU_ASSERT_STRING_EQUAL(out.data, "hello\n");
	buf_reset(&out);
	CU_ASSERT_EQUAL(run(p,
			    (const char *const[]){ "/bin/sh", "-c", "echo oops >&2; exit 3", NULL },
			    NULL, 0, &out, &res),
			0);
	CU_ASSERT_EQUAL(res.end, SBX_END_EXITED);
	CU_ASSERT_EQUAL(res.exit_status, 3);
	CU_ASSERT_STRING_EQUAL(res.stderr_tail, "oops\n");
	CU_ASSERT_EQUAL(res.failure, SBX_FAIL_NONE);
	buf_release(&out);
	sbx_policy_free(p);
}

static void test_stdin_roundtrip_large(void)
{
	struct sbx_policy *p = probe_policy();
	struct buf out = BUF_INIT;
	struct sbx_result res;
	size_t n = 3 * 1024 * 1024 + 17, i;
	char *in = malloc(n);

	for (i = 0; i < n; i++)
		in[i] = (char)('a' + i % 26);
	/* Larger than any pipe buffer both ways: stdin must be fed while stdout drains. */
	CU_ASSERT_EQUAL(run(p, (const char *const[]){ "/usr/bin/cat", NULL }, in, n, &out, &res),
			0);
	CU_ASSERT_EQUAL(res.end, SBX_END_EXITED);
	CU_ASSERT_EQUAL(out.len, n);
	CU_ASSERT(out.len == n && memcmp(out.data, in, n) == 0);
	free(in);
	buf_release(&out);
	sbx_policy_free(p);
}

static void test_relative_argv_refused(void)
{
	struct sbx_policy *p = probe_policy();
	struct sbx_result res;
	struct buf out = BUF_INIT;

	CU_ASSERT_EQUAL(run(p, (const char *const[]){ "echo", "x", NULL }, NULL, 0, &out, &res),
			-EINVAL);
	CU_ASSERT_EQUAL(res.end, SBX_END_SPAWN_FAILED);
	buf_release(&out);
	sbx_policy_free(p);
}

static void test_missing_binary_fails(void)
{
	struct sbx_policy *p = probe_policy();
	struct sbx_result res;
	struct buf out = BUF_INIT;

	CU_ASSERT_EQUAL(run(p, (const char *const[]){ "/usr/bin/does-not-exist-olp", NULL }, NULL,
			    0, &out, &res),
			0);
	/* The stub reports the failed execve itself: the command never ran. */
	CU_ASSERT_EQUAL(res.end, SBX_END_EXITED);
	CU_ASSERT_EQUAL(res.exit_status, 127);
	CU_ASSERT_EQUAL(res.failure, SBX_FAIL_EXEC);
	CU_ASSERT_EQUAL(res.spawn_errno, ENOENT);
	CU_ASSERT_PTR_NOT_NULL_FATAL(res.spawn_stage);
	CU_ASSERT_STRING_EQUAL(res.spawn_stage, "execve");
	CU_ASSERT_STRING_EQUAL(sbx_failure_str(res.failure), "exec");
	buf_release(&out);
	sbx_policy_free(p);
}

/* bwrap that cannot build the sandbox (here: a read-only bind of a dangling link, whose
 * source it cannot find) is the sandbox's failure, known from bwrap's status report. */
static void test_setup_failure(void)
{
	struct sbx_policy *p = probe_policy();
	struct sbx_result res;
	struct buf out = BUF_INIT;
	char link[512];

	snprintf(link, sizeof(link), "%s.dangling", runtime_dir);
	CU_ASSERT_FATAL(symlink("/nonexistent/olp-target", link) == 0);
	CU_ASSERT_EQUAL(sbx_policy_add_ro(p, link), 0);
	CU_ASSERT_EQUAL(run(p, (const char *const[]){ "/usr/bin/true", NULL }, NULL, 0, &out, &res),
			0);
	CU_ASSERT_EQUAL(res.end, SBX_END_EXITED);
	CU_ASSERT_NOT_EQUAL(res.exit_status, 0);
	CU_ASSERT_EQUAL(res.failure, SBX_FAIL_SETUP);
	CU_ASSERT_STRING_EQUAL(sbx_failure_str(res.failure), "setup");
	unlink(link);
	buf_release(&out);
	sbx_policy_free(p);
}

/* A command that fails the way bwrap or the stub would, and says so in their words, is a
 * command that failed: its words decide nothing. */
static void test_failure_not_from_text(void)
{
	struct sbx_policy *p = probe_policy();
	struct sbx_result res;
	struct buf out = BUF_INIT;

	CU_ASSERT_EQUAL(run(p,
			    (const char *const[]){ "/bin/sh", "-c",
						   "echo 'olp-sandbox-exec: execve /x: No such "
						   "file or directory' >&2; exit 127",
						   NULL },
			    NULL, 0, &out, &res),
			0);
	CU_ASSERT_EQUAL(res.exit_status, 127);
	CU_ASSERT_EQUAL(res.failure, SBX_FAIL_NONE);
	CU_ASSERT_EQUAL(
		run(p,
		    (const char *const[]){
			    "/bin/sh", "-c",
			    "echo 'bwrap: Creating new namespace failed' >&2; exit 1", NULL },
		    NULL, 0, &out, &res),
		0);
	CU_ASSERT_EQUAL(res.exit_status, 1);
	CU_ASSERT_EQUAL(res.failure, SBX_FAIL_NONE);
	buf_release(&out);
	sbx_policy_free(p);
}

/* The run's process budget above what the worker may give (its own hard RLIMIT_NPROC):
 * the stub cannot set it as it takes the run's uid, and says which step failed. In a
 * child process, whose lowered limit goes with it. */
static int identity_failure_child(void)
{
	struct sbx_policy *p = probe_policy();
	struct sbx_limits l = { 0 };
	struct sbx_result res;
	struct buf out = BUF_INIT;
	struct rlimit rl;
	int bad = 0;

	if (getrlimit(RLIMIT_NPROC, &rl) < 0)
		return 1;
	if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (1u << 20))
		rl.rlim_max = 1u << 20;
	if (rl.rlim_cur > rl.rlim_max)
		rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NPROC, &rl) < 0)
		return 2;
	l.nproc = (uint64_t)rl.rlim_max + 1;
	sbx_policy_set_limits(p, &l);
	if (run(p, (const char *const[]){ "/usr/bin/true", NULL }, NULL, 0, &out, &res))
		return 3;
	bad += res.end != SBX_END_EXITED;
	bad += res.exit_status != 127;
	bad += res.failure != SBX_FAIL_IDENTITY;
	bad += !res.spawn_stage || strcmp(res.spawn_stage, "rlimit nproc") != 0;
	bad += res.spawn_errno != EPERM;
	if (bad)
		fprintf(stderr,
			"identity failure: end %s, exit %d, failure %s, stage %s, errno %d\n",
			sbx_end_name(res.end), res.exit_status, sbx_failure_str(res.failure),
			res.spawn_stage ? res.spawn_stage : "-", res.spawn_errno);
	buf_release(&out);
	sbx_policy_free(p);
	return bad ? 10 + bad : 0;
}

static void test_identity_failure(void)
{
	int st = -1;
	pid_t pid;

	if (strcmp(sbx_status_get()->identity, "per_run") != 0) {
		fprintf(stderr, "(no host uid per run here: skipped) ");
		return;
	}
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0)
		_exit(identity_failure_child());
	CU_ASSERT_EQUAL(waitpid(pid, &st, 0), pid);
	CU_ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_timeout_kills_tree(void)
{
	struct sbx_policy *p = probe_policy();
	struct sbx_result res;
	struct buf out = BUF_INIT;
	uint64_t t0 = mono_ms();

	/* 2 s: long enough for the probe to start and say so on a loaded 2-core host
	 * (400 ms was not), short enough that "killed at the timeout" is what ends it. */
	sbx_policy_set_timeout_ms(p, 2000);
	CU_ASSERT_EQUAL(
		run(p, (const char *const[]){ OLP_PROBE_PATH, "spin", NULL }, NULL, 0, &out, &res),
		0);
	CU_ASSERT_EQUAL(res.end, SBX_END_TIMEOUT);
	CU_ASSERT(mono_ms() - t0 >= 2000);
	CU_ASSERT(took_under(t0, 10000));
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "spinning"));
	buf_release(&out);
	sbx_policy_free(p);
}

/* The run ends with the command: a child it leaves writing to stdout for ever neither
 * keeps the run going nor loses what the command wrote before it exited. */
static void test_ends_with_the_command(void)
{
	struct sbx_policy *p = probe_policy();
	struct sbx_result res;
	struct buf out = BUF_INIT;
	uint64_t t0 = mono_ms();

	CU_ASSERT_EQUAL(run(p,
			    (const char *const[]){ "/bin/sh", "-c",
						   "echo first; yes flood & "
						   "sleep 0.2; echo last; exit 3",
						   NULL },
			    NULL, 0, &out, &res),
			0);
	CU_ASSERT_EQUAL(res.end, SBX_END_EXITED);
	CU_ASSERT_EQUAL(res.exit_status, 3);
	CU_ASSERT(took_under(t0, 5000));
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "first\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "last\n"));
	buf_release(&out);
	sbx_policy_free(p);
}

static void test_no_process_left(void)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	int found = 0;

	/* After the spin tests (which fork a grandchild that calls setsid) nothing of them
	 * may remain anywhere on the host. */
	CU_ASSERT_FATAL(d != NULL);
	while ((de = readdir(d))) {
		char path[300];
		struct buf cmd = BUF_INIT;

		if (de->d_name[0] < '0' || de->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/cmdline", de->d_name);
		if (buf_read_file(&cmd, path, 65536) == 0) {
			for (size_t i = 0; i + 1 < cmd.len; i++)
				if (!cmd.data[i])
					cmd.data[i] = ' ';
			if (strstr(cmd.data, "olp-probe spin"))
				found++;
		}
		buf_release(&cmd);
	}
	closedir(d);
	CU_ASSERT_EQUAL(found, 0);
}

static int stop_at_first(void *ctx, const char *data, size_t len)
{
	buf_add(ctx, data, len);
	return 1;
}

static int abort_at_first(void *ctx, const char *data, size_t len)
{
	buf_add(ctx, data, len);
	return -1;
}

static void test_callback_stop_and_abort(void)
{
	struct sbx_policy *p = probe_policy();
	struct buf out = BUF_INIT;
	struct sbx_result res;
	struct sbx_callbacks cb = { .on_stdout = stop_at_first, .ctx = &out };
	uint64_t t0 = mono_ms();

	CU_ASSERT_EQUAL(
		sbx_run(p, (const char *const[]){ OLP_PROBE_PATH, "spin", NULL }, NULL, &cb, &res),
		0);
	CU_ASSERT_EQUAL(res.end, SBX_END_STOPPED);
	cb.on_stdout = abort_at_first;
	CU_ASSERT_EQUAL(
		sbx_run(p, (const char *const[]){ OLP_PROBE_PATH, "spin", NULL }, NULL, &cb, &res),
		0);
	CU_ASSERT_EQUAL(res.end, SBX_END_ABORTED);
	CU_ASSERT(took_under(t0, 5000));
	buf_release(&out);
	sbx_policy_free(p);
}

static void test_hangup_fd_aborts(void)
{
	struct sbx_policy *p = probe_policy();
	struct buf out = BUF_INIT;
	struct sbx_result res;
	struct sbx_callbacks cb = { .on_stdout = collect, .ctx = &out };
	struct sbx_run_options opt = { .hangup_fd = -1 };
	int sv[2];
	uint64_t t0 = mono_ms();

	CU_ASSERT_FATAL(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	opt.hangup_fd = sv[0];
	close(sv[1]); /* the "web server" is already gone */
	CU_ASSERT_EQUAL(
		sbx_run(p, (const char *const[]){ "/usr/bin/sleep", "20", NULL }, &opt, &cb, &res),
		0);
	CU_ASSERT_EQUAL(res.end, SBX_END_ABORTED);
	CU_ASSERT(took_under(t0, 3000));
	close(sv[0]);
	buf_release(&out);
	sbx_policy_free(p);
}

/* The caller's tick (sbx_callbacks.on_tick): on the run's own thread, as the run starts
 * and then at the times it asks for, while the command is silent; 0 stops it. */
struct ticks {
	pthread_t thread;
	unsigned n, other_thread;
	uint64_t every, first, last;
};

static uint64_t count_tick(void *ctx, uint64_t now)
{
	struct ticks *t = ctx;

	if (!pthread_equal(pthread_self(), t->thread))
		t->other_thread++;
	if (!t->n++)
		t->first = now;
	t->last = now;
	return t->every ? now + t->every : 0;
}

static void test_ticks_while_silent(void)
{
	struct sbx_policy *p = probe_policy();
	struct ticks t = { .thread = pthread_self(), .every = 100 };
	struct sbx_callbacks cb = { .on_tick = count_tick, .ctx = &t };
	struct sbx_result res;
	uint64_t t0 = mono_ms();

	CU_ASSERT_EQUAL(
		sbx_run(p, (const char *const[]){ "/usr/bin/sleep", "1", NULL }, NULL, &cb, &res),
		0);
	CU_ASSERT_EQUAL(res.end, SBX_END_EXITED);
	CU_ASSERT_EQUAL(t.other_thread, 0);
	/* A second of silence at 100 ms: ten, less what a loaded host delays. */
	CU_ASSERT(t.n >= 4);
	CU_ASSERT(t.first - t0 < 1000);
	CU_ASSERT(t.last - t.first >= 500);
	/* 0: never again. */
	t = (struct ticks){ .thread = pthread_self() };
	CU_ASSERT_EQUAL(
		sbx_run(p, (const char *const[]){ "/usr/bin/sleep", "0.5", NULL }, NULL, &cb, &res),
		0);
	CU_ASSERT_EQUAL(t.n, 1);
	sbx_policy_free(p);
}

/* The caller's deadline (sbx_run_options.deadline_ms) ends the run, not the policy's
 * longer timeout. */
static void test_caller_deadline(void)
{
	struct sbx_policy *p = probe_policy(); /* timeout 20 s */
	struct sbx_result res;
	struct sbx_run_options opt = { .hangup_fd = -1 };
	struct sbx_callbacks cb = { 0 };
	uint64_t t0 = mono_ms();

	opt.deadline_ms = t0 + 1500;
	CU_ASSERT_EQUAL(
		sbx_run(p, (const char *const[]){ "/usr/bin/sleep", "20", NULL }, &opt, &cb, &res),
		0);
	CU_ASSERT_EQUAL(res.end, SBX_END_TIMEOUT);
	CU_ASSERT(mono_ms() - t0 >= 1500);
	CU_ASSERT(took_under(t0, 10000));
	sbx_policy_free(p);
}

/* fd 0 of a FastCGI worker is its listen socket; a key file or another tenant's
 * connection may be open in another thread. None of it may reach the child. */
static void check_only_stdio(void)
{
	struct sbx_policy *p = probe_policy();
	struct buf out = BUF_INIT;
	struct sbx_result res;
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int saved0 = dup(0), lsock, decoy_file, tcp;

	lsock = socket(AF_INET, SOCK_STREAM, 0); /* no CLOEXEC, like libfcgi's */
	CU_ASSERT_FATAL(lsock >= 0);
	CU_ASSERT_FATAL(bind(lsock, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
			listen(lsock, 4) == 0);
	CU_ASSERT_FATAL(dup2(lsock, 0) == 0);
	decoy_file = open("/etc/hostname", O_RDONLY); /* no CLOEXEC */
	tcp = socket(AF_INET6, SOCK_STREAM, 0);
	CU_ASSERT(decoy_file >= 0 && tcp >= 0);

	CU_ASSERT_EQUAL(
		run(p, (const char *const[]){ OLP_PROBE_PATH, "fds", NULL }, NULL, 0, &out, &res),
		0);
	CU_ASSERT_EQUAL(res.exit_status, 0);
	CU_ASSERT_STRING_EQUAL(out.data, "{\"fds\":[0,1,2],\"fd0_socket\":false}\n");

	dup2(saved0, 0);
	close(saved0);
	close(lsock);
	close(decoy_file);
	close(tcp);
	buf_release(&out);
	sbx_policy_free(p);
}

static void test_only_stdio_inherited(void)
{
	check_only_stdio();
}

static void test_environment_is_allowlisted(void)
{
	struct sbx_policy *p = probe_policy();
	struct buf out = BUF_INIT;
	struct sbx_result res;

	setenv("OLP_TEST_SECRET", "do-not-leak", 1);
	CU_ASSERT_EQUAL(sbx_policy_setenv(p, "EXTRA", "1"), 0);
	CU_ASSERT_EQUAL(sbx_policy_setenv(p, "BAD=NAME", "1"), -EINVAL);
	CU_ASSERT_EQUAL(
		run(p, (const char *const[]){ OLP_PROBE_PATH, "env", NULL }, NULL, 0, &out, &res),
		0);
	CU_ASSERT_PTR_NULL(strstr(out.data, "OLP_TEST_SECRET"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "\"EXTRA\""));
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "\"HOME\""));
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "\"PATH\""));
	unsetenv("OLP_TEST_SECRET");
	buf_release(&out);
	sbx_policy_free(p);
}

/* How many processes of this host have needle in their command line. */
static int cmdlines_holding(const char *needle)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	int hits = 0;

	if (!d)
		return -1;
	while ((de = readdir(d))) {
		char path[300];
		struct buf cl = BUF_INIT;

		if (de->d_name[0] < '1' || de->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/cmdline", de->d_name);
		if (buf_read_file(&cl, path, 1 << 20) == 0 && cl.len &&
		    memmem(cl.data, cl.len, needle, strlen(needle)))
			hits++;
		buf_release(&cl);
	}
	closedir(d);
	return hits;
}

struct env_seen {
	struct buf out;
	int cmdline_hits; /* -2: not looked yet */
};

/* Once the command says it runs, look at every command line of the host. */
static int env_on_stdout(void *ctx, const char *data, size_t len)
{
	struct env_seen *es = ctx;

	buf_add(&es->out, data, len);
	if (es->cmdline_hits == -2 && strstr(es->out.data, "ready"))
		es->cmdline_hits = cmdlines_holding("olp-env-value-7f3a9c");
	return 0;
}

static void test_environment_on_no_command_line(void)
{
	struct sbx_policy *p = probe_policy();
	struct env_seen es = { .out = BUF_INIT, .cmdline_hits = -2 };
	struct sbx_callbacks cb = { .on_stdout = env_on_stdout, .ctx = &es };
	struct sbx_run_options opt = { .hangup_fd = -1 };
	struct sbx_result res;

	/* A value as a provider's "env" API key would be: the command has it, no command
	 * line of the host shows it (any user reads those), and, with a uid of its own, the
	 * command cannot read the file it came in either. */
	CU_ASSERT_EQUAL(sbx_policy_setenv(p, "OLP_KEY", "olp-env-value-7f3a9c"), 0);
	CU_ASSERT_EQUAL(
		sbx_run(p,
			(const char *const[]){ "/usr/bin/sh", "-c",
					       "echo ready; sleep 0.5; echo \"key=$OLP_KEY\"; "
					       "cat /etc/.olp-env >/dev/null 2>&1 && "
					       "echo file-readable",
					       NULL },
			&opt, &cb, &res),
		0);
	CU_ASSERT_EQUAL(res.end, SBX_END_EXITED);
	CU_ASSERT_EQUAL(es.cmdline_hits, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(es.out.data, "key=olp-env-value-7f3a9c"));
	if (!strcmp(sbx_status_get()->identity, "per_run"))
		CU_ASSERT_PTR_NULL(strstr(es.out.data, "file-readable"));
	buf_release(&es.out);
	sbx_policy_free(p);
}

static void test_filesystem_view(void)
{
	struct sbx_policy *p = probe_policy();
	struct buf out = BUF_INIT;
	struct sbx_result res;
	char secret[512];
	int fd;

	/* A file next to the scratch dirs (where a key store would be) is not there. */
	snprintf(secret, sizeof(secret), "%s.secret", runtime_dir);
	fd = open(secret, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	CU_ASSERT_FATAL(fd >= 0);
	close(fd);
	CU_ASSERT_EQUAL(run(p, (const char *const[]){ OLP_PROBE_PATH, "read", secret, NULL }, NULL,
			    0, &out, &res),
			0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "\"ok\":false,\"errno\":2}"));
	buf_reset(&out);
	CU_ASSERT_EQUAL(run(p, (const char *const[]){ OLP_PROBE_PATH, "write", "/usr/olp-x", NULL },
			    NULL, 0, &out, &res),
			0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "\"ok\":false"));
	buf_reset(&out);
	/* The scratch home is writable, and it is the working directory. */
	CU_ASSERT_EQUAL(run(p, (const char *const[]){ OLP_PROBE_PATH, "write", "note.txt", NULL },
			    NULL, 0, &out, &res),
			0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "\"ok\":true"));
	unlink(secret);
	buf_release(&out);
	sbx_policy_free(p);
}

static void write_file(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_FATAL(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
	close(fd);
	chmod(path, mode);
}

/* A credentials file the worker alone may read (0600) reaches the run, which is another
 * uid, as a copy it owns; read-only, what the run does to it stays in the sandbox;
 * writable, the run's version replaces the host file when the run ends, with the host
 * file's mode, and a run that leaves it alone leaves it alone. */
static void test_credential_copies(void)
{
	struct sbx_policy *p = probe_policy();
	struct buf out = BUF_INIT, host = BUF_INIT;
	struct sbx_result res;
	char ro[512], rw[512];
	struct stat before, after;

	snprintf(ro, sizeof(ro), "%s.ro-cred", runtime_dir);
	snprintf(rw, sizeof(rw), "%s.rw-cred", runtime_dir);
	write_file(ro, "token-ro\n", 0600);
	write_file(rw, "token-v1\n", 0600);
	CU_ASSERT_EQUAL(sbx_policy_add_bind(p, ro, SBX_HOME_PATH "/.cfg/ro.json", false), 0);
	CU_ASSERT_EQUAL(sbx_policy_add_bind(p, rw, SBX_HOME_PATH "/.cfg/rw.json", true), 0);
	CU_ASSERT_EQUAL(run(p,
			    (const char *const[]){ "/bin/sh", "-c",
						   "cat .cfg/ro.json .cfg/rw.json; "
						   "stat -c '%u %a' .cfg/ro.json .cfg; "
						   "echo changed > .cfg/ro.json && "
						   "echo token-v2 > .cfg/rw.json",
						   NULL },
			    NULL, 0, &out, &res),
			0);
	CU_ASSERT_EQUAL(res.exit_status, 0);
	CU_ASSERT_STRING_EQUAL(out.data, "token-ro\ntoken-v1\n1000 600\n1000 700\n");
	CU_ASSERT_EQUAL(buf_read_file(&host, ro, 4096), 0);
	CU_ASSERT_STRING_EQUAL(host.data, "token-ro\n");
	buf_reset(&host);
	CU_ASSERT_EQUAL(buf_read_file(&host, rw, 4096), 0);
	CU_ASSERT_STRING_EQUAL(host.data, "token-v2\n");
	CU_ASSERT_EQUAL(stat(rw, &before), 0);
	CU_ASSERT_EQUAL(before.st_mode & 07777, 0600);
	/* A run that only reads it: the host file is not rewritten. */
	buf_reset(&out);
	CU_ASSERT_EQUAL(run(p, (const char *const[]){ "/bin/cat", ".cfg/rw.json", NULL }, NULL, 0,
			    &out, &res),
			0);
	CU_ASSERT_STRING_EQUAL(out.data, "token-v2\n");
	CU_ASSERT_EQUAL(stat(rw, &after), 0);
	CU_ASSERT_EQUAL(after.st_ino, before.st_ino);
	unlink(ro);
	unlink(rw);
	buf_release(&host);
	buf_release(&out);
	sbx_policy_free(p);
}

/* A checked writable bind (issue 22): the run's copy replaces the host file only when the
 * caller's check accepts what the run left; a refusal keeps the host file as it was. */
static bool accept_v(const char *inside, const char *data, size_t len, const char **why)
{
	bool ok = !strcmp(inside, SBX_HOME_PATH "/.cfg/chk.json") && len > 6 &&
		  !memcmp(data, "token-", 6);

	*why = "not a token";
	return ok;
}

static void test_checked_write_back(void)
{
	struct sbx_policy *p = probe_policy();
	struct buf out = BUF_INIT, host = BUF_INIT;
	struct sbx_result res;
	char rw[512];

	snprintf(rw, sizeof(rw), "%s.chk-cred", runtime_dir);
	write_file(rw, "token-v1\n", 0600);
	CU_ASSERT_EQUAL(
		sbx_policy_add_bind_checked(p, rw, SBX_HOME_PATH "/.cfg/chk.json", accept_v), 0);
	CU_ASSERT_EQUAL(
		run(p,
		    (const char *const[]){ "/bin/sh", "-c", "echo garbage > .cfg/chk.json", NULL },
		    NULL, 0, &out, &res),
		0);
	CU_ASSERT_EQUAL(buf_read_file(&host, rw, 4096), 0);
	CU_ASSERT_STRING_EQUAL(host.data, "token-v1\n");
	buf_reset(&host);
	CU_ASSERT_EQUAL(
		run(p,
		    (const char *const[]){ "/bin/sh", "-c", "echo token-v2 > .cfg/chk.json", NULL },
		    NULL, 0, &out, &res),
		0);
	CU_ASSERT_EQUAL(buf_read_file(&host, rw, 4096), 0);
	CU_ASSERT_STRING_EQUAL(host.data, "token-v2\n");
	unlink(rw);
	buf_release(&host);
	buf_release(&out);
	sbx_policy_free(p);
}

/* A run whose log line names its request: the host file of a writable bind is gone when
 * the run ends, so the run's changes cannot be kept, and the warning says for whom. */
struct logged_run {
	const char *host;
	int ret;
	struct sbx_result res;
};

static int remove_host_file(void *ctx, const char *data, size_t len)
{
	(void)data;
	(void)len;
	unlink(((struct logged_run *)ctx)->host);
	return 0;
}

static void logged_run(void *arg)
{
	struct logged_run *lr = arg;
	struct sbx_policy *p = probe_policy();
	struct sbx_callbacks cb = { .on_stdout = remove_host_file, .ctx = lr };
	struct sbx_run_options opt = { .hangup_fd = -1, .request_id = "rid-sbx-test-7" };

	if (sbx_policy_add_bind(p, lr->host, SBX_HOME_PATH "/.cfg/cred.json", true) == 0)
		lr->ret = sbx_run(p,
				  (const char *const[]){ "/bin/sh", "-c",
							 "echo go; sleep 0.2; "
							 "echo changed > .cfg/cred.json",
							 NULL },
				  &opt, &cb, &lr->res);
	sbx_policy_free(p);
}

static void test_log_lines_name_the_request(void)
{
	struct logged_run lr = { .ret = -1 };
	struct buf log = BUF_INIT;
	char host[512], logpath[512];

	snprintf(host, sizeof(host), "%s.cred", runtime_dir);
	snprintf(logpath, sizeof(logpath), "%s.log", runtime_dir);
	write_file(host, "v1\n", 0600);
	lr.host = host;
	CU_ASSERT_EQUAL_FATAL(ts_capture_stderr(logpath, logged_run, &lr), 0);
	CU_ASSERT_EQUAL(lr.ret, 0);
	CU_ASSERT_EQUAL(lr.res.exit_status, 0);
	CU_ASSERT_EQUAL(buf_read_file(&log, logpath, 65536), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(log.data, "were not kept"));
	CU_ASSERT_PTR_NOT_NULL(strstr(log.data, "\"request_id\":\"rid-sbx-test-7\""));
	unlink(logpath);
	unlink(host);
	buf_release(&log);
}

static void test_scratch_removed(void)
{
	/* Every run above wrote into or created its scratch dir; none may be left. */
	CU_ASSERT_EQUAL(count_entries(runtime_dir), 0);
}

static void *thread_runs(void *arg)
{
	int *failures = arg;

	for (int i = 0; i < 8; i++) {
		struct sbx_policy *p = sbx_policy_new();
		struct buf out = BUF_INIT;
		struct sbx_result res;
		char word[32];

		snprintf(word, sizeof(word), "w%d", i);
		if (run(p, (const char *const[]){ "/usr/bin/echo", word, NULL }, NULL, 0, &out,
			&res) ||
		    res.exit_status != 0 || strncmp(out.data, word, strlen(word)))
			__atomic_add_fetch(failures, 1, __ATOMIC_SEQ_CST);
		buf_release(&out);
		sbx_policy_free(p);
	}
	return NULL;
}

static void test_concurrent_runs(void)
{
	pthread_t t[4];
	int failures = 0;

	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, thread_runs, &failures);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	CU_ASSERT_EQUAL(failures, 0);
	CU_ASSERT_EQUAL(count_entries(runtime_dir), 0);
}

static void test_status(void)
{
	const struct sbx_status *st = sbx_status_get();

	CU_ASSERT_TRUE(st->available);
	CU_ASSERT_TRUE(st->active);
	CU_ASSERT_STRING_EQUAL(st->mode, "bwrap");
	CU_ASSERT_PTR_NOT_NULL(st->bwrap_version);
}

static void test_mode_off_still_closes_fds(void)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_OFF, .runtime_dir = runtime_dir };

	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	check_only_stdio();
	cfg.mode = SBX_MODE_BWRAP;
	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
}

static void test_stale_scratch_swept(void)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP, .runtime_dir = runtime_dir };
	char path[600];

	/* pid 2^22+1 cannot exist (pid_max is at most 2^22). */
	snprintf(path, sizeof(path), "%s/4194305-1-deadbeef", runtime_dir);
	CU_ASSERT_FATAL(mkdir(path, 0700) == 0);
	snprintf(path, sizeof(path), "%s/4194305-1-deadbeef/home", runtime_dir);
	CU_ASSERT_FATAL(mkdir(path, 0500) == 0);
	snprintf(path, sizeof(path), "%s/%ld-99-live", runtime_dir, (long)getppid());
	CU_ASSERT_FATAL(mkdir(path, 0700) == 0);
	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	CU_ASSERT_EQUAL(count_entries(runtime_dir), 1); /* the live one stays */
	rmdir(path);
}

/* What a dead worker left running of a run (here a stand-in whose command line names the
 * stale dir as a stranded bwrap's does, "--run NAME" for the stub) is killed with the
 * dir; a process naming a live worker's dir is not. */
static void test_stale_run_killed(void)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP, .runtime_dir = runtime_dir };
	char stale[600], live[600];
	pid_t a, b;
	int st;

	snprintf(stale, sizeof(stale), "%s/4194305-2-0123456789abcdef", runtime_dir);
	snprintf(live, sizeof(live), "%s/%ld-98-fedcba9876543210", runtime_dir, (long)getppid());
	CU_ASSERT_FATAL(mkdir(stale, 0700) == 0);
	CU_ASSERT_FATAL(mkdir(live, 0700) == 0);
	a = fork();
	if (a == 0) {
		execl("/bin/sh", "sh", "-c", "sleep 30", "--run", strrchr(stale, '/') + 1,
		      (char *)NULL);
		_exit(127);
	}
	b = fork();
	if (b == 0) {
		execl("/bin/sh", "sh", "-c", "sleep 30", "--run", strrchr(live, '/') + 1,
		      (char *)NULL);
		_exit(127);
	}
	usleep(200000); /* both exec'd */
	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	CU_ASSERT_EQUAL(waitpid(a, &st, 0), a);
	CU_ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	CU_ASSERT_EQUAL(waitpid(b, &st, WNOHANG), 0); /* still running */
	kill(b, SIGKILL);
	waitpid(b, &st, 0);
	rmdir(live);
	CU_ASSERT_EQUAL(count_entries(runtime_dir), 0);
}

static void test_sweep_never_follows_links(void)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP, .runtime_dir = runtime_dir };
	char target[] = "/tmp/olp-sbx-target-XXXXXX", path[600], keep[600];
	int fd;
	struct stat st;

	CU_ASSERT_FATAL(mkdtemp(target) != NULL);
	snprintf(keep, sizeof(keep), "%s/precious", target);
	fd = open(keep, O_WRONLY | O_CREAT, 0600);
	CU_ASSERT_FATAL(fd >= 0);
	close(fd);
	/* A dead worker's "scratch dir" that is really a link to somewhere else. */
	snprintf(path, sizeof(path), "%s/4194306-1-evil", runtime_dir);
	CU_ASSERT_FATAL(symlink(target, path) == 0);
	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	CU_ASSERT_EQUAL(lstat(path, &st), -1); /* the link is gone */
	CU_ASSERT_EQUAL(stat(keep, &st), 0);   /* what it pointed to is untouched */
	unlink(keep);
	rmdir(target);
}

/* Warm sandboxes: a policy run once gets sandboxes started ahead of time; the next run
 * with the same policy goes through one of them, with the same guarantees. */
static void test_warm_sandboxes(void)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP,
					 .runtime_dir = runtime_dir,
					 .exec_stub = OLP_SANDBOX_EXEC_PATH,
					 .warm = true };
	struct sbx_policy *p;
	struct buf out = BUF_INIT;
	struct sbx_result res;
	uint64_t t0;

	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	CU_ASSERT_EQUAL(sbx_warm_count(), 0);
	p = probe_policy();
	/* Cold, then warm ones are waiting. */
	CU_ASSERT_EQUAL(
		run(p, (const char *const[]){ OLP_PROBE_PATH, "fds", NULL }, NULL, 0, &out, &res),
		0);
	CU_ASSERT_STRING_EQUAL(out.data, "{\"fds\":[0,1,2],\"fd0_socket\":false}\n");
	CU_ASSERT(sbx_warm_count() >= 1);
	usleep(200000); /* let them finish building */
	/* This run goes through a warm sandbox; the stub is there, read-only. */
	buf_reset(&out);
	CU_ASSERT_EQUAL(
		run(p, (const char *const[]){ OLP_PROBE_PATH, "read", OLP_SANDBOX_EXEC_PATH, NULL },
		    NULL, 0, &out, &res),
		0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "\"ok\":true"));
	/* Warm: the same descriptors, the same environment, stdin after the launch message. */
	buf_reset(&out);
	CU_ASSERT_EQUAL(
		run(p, (const char *const[]){ OLP_PROBE_PATH, "fds", NULL }, NULL, 0, &out, &res),
		0);
	CU_ASSERT_STRING_EQUAL(out.data, "{\"fds\":[0,1,2],\"fd0_socket\":false}\n");
	buf_reset(&out);
	CU_ASSERT_EQUAL(
		run(p, (const char *const[]){ OLP_PROBE_PATH, "env", NULL }, NULL, 0, &out, &res),
		0);
	CU_ASSERT_PTR_NULL(strstr(out.data, "OLP_"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "\"HOME\""));
	buf_reset(&out);
	CU_ASSERT_EQUAL(run(p, (const char *const[]){ "/usr/bin/cat", NULL }, "prompt bytes\n", 13,
			    &out, &res),
			0);
	CU_ASSERT_STRING_EQUAL(out.data, "prompt bytes\n");
	CU_ASSERT_EQUAL(res.exit_status, 0);
	/* A missing program is a spawn failure, as when cold. */
	buf_reset(&out);
	CU_ASSERT_EQUAL(run(p, (const char *const[]){ "/usr/bin/olp-no-such-program", NULL }, NULL,
			    0, &out, &res),
			0);
	CU_ASSERT_EQUAL(res.exit_status, 127);
	CU_ASSERT_EQUAL(res.failure, SBX_FAIL_EXEC);
	CU_ASSERT_EQUAL(res.spawn_errno, ENOENT);
	/* For the logs, the stub says it on stderr too. */
	CU_ASSERT_PTR_NOT_NULL(strstr(res.stderr_tail, "execve"));
	/* The wall-clock limit holds from the launch. */
	sbx_policy_set_timeout_ms(p, 300);
	t0 = mono_ms();
	CU_ASSERT_EQUAL(
		run(p, (const char *const[]){ OLP_PROBE_PATH, "spin", NULL }, NULL, 0, &out, &res),
		0);
	CU_ASSERT_EQUAL(res.end, SBX_END_TIMEOUT);
	CU_ASSERT(took_under(t0, 5000));
	sbx_policy_free(p);
	buf_release(&out);
	/* Releasing the runtime stops every warm sandbox and removes its scratch dir. */
	cfg.warm = false;
	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	CU_ASSERT_EQUAL(sbx_warm_count(), 0);
	CU_ASSERT_EQUAL(count_entries(runtime_dir), 0);
}

struct burst {
	pthread_barrier_t go;
	int failures;
};

static void *thread_burst(void *arg)
{
	struct burst *b = arg;

	for (int round = 0; round < 3; round++) {
		struct sbx_policy *p = sbx_policy_new();
		struct buf out = BUF_INIT;
		struct sbx_result res;

		pthread_barrier_wait(&b->go);
		if (run(p, (const char *const[]){ "/usr/bin/true", NULL }, NULL, 0, &out, &res) ||
		    res.exit_status != 0)
			__atomic_add_fetch(&b->failures, 1, __ATOMIC_SEQ_CST);
		buf_release(&out);
		sbx_policy_free(p);
	}
	return NULL;
}

/* Runs of one policy that end together start two warm sandboxes between them, not two
 * each: the pool kept up to 16 (its cap) after a burst, each a uid, a scratch dir and three
 * processes. */
static void test_warm_burst_keeps_two(void)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP,
					 .runtime_dir = runtime_dir,
					 .exec_stub = OLP_SANDBOX_EXEC_PATH,
					 .warm = true };
	enum { N = 8 };
	struct burst b = { .failures = 0 };
	pthread_t t[N];

	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	CU_ASSERT_FATAL(pthread_barrier_init(&b.go, NULL, N) == 0);
	for (int i = 0; i < N; i++)
		pthread_create(&t[i], NULL, thread_burst, &b);
	for (int i = 0; i < N; i++)
		pthread_join(t[i], NULL);
	pthread_barrier_destroy(&b.go);
	CU_ASSERT_EQUAL(b.failures, 0);
	/* Every start has been put in the pool by now (a start is added before its run
	 * returns); 2 for the one policy. */
	CU_ASSERT(sbx_warm_count() >= 1);
	CU_ASSERT(sbx_warm_count() <= 2);
	cfg.warm = false;
	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	CU_ASSERT_EQUAL(sbx_warm_count(), 0);
	CU_ASSERT_EQUAL(count_entries(runtime_dir), 0);
}

/* A run that rewrites its writable credential copy (a refreshed login) leaves a warm
 * sandbox made from the file as it is now: the next run takes it, warm, and reads the new
 * contents. The pool used to be filled before the write-back, with the old copy under the
 * old key, which no later run asked for: every such run went cold. */
static void test_warm_after_write_back(void)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP,
					 .runtime_dir = runtime_dir,
					 .exec_stub = OLP_SANDBOX_EXEC_PATH,
					 .warm = true };
	struct sbx_policy *p;
	struct buf out = BUF_INIT;
	struct sbx_result res;
	char rw[512];

	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	p = probe_policy();
	snprintf(rw, sizeof(rw), "%s.warm-cred", runtime_dir);
	write_file(rw, "token-v1\n", 0600);
	CU_ASSERT_EQUAL(sbx_policy_add_bind(p, rw, SBX_HOME_PATH "/.cfg/rw.json", true), 0);
	CU_ASSERT_EQUAL(
		run(p,
		    (const char *const[]){ "/bin/sh", "-c", "echo token-v2 > .cfg/rw.json", NULL },
		    NULL, 0, &out, &res),
		0);
	CU_ASSERT_EQUAL(res.exit_status, 0);
	CU_ASSERT_EQUAL(res.start, SBX_START_COLD);
	usleep(200000); /* let the warm one finish building */
	for (int i = 0; i < 2; i++) {
		buf_reset(&out);
		CU_ASSERT_EQUAL(run(p, (const char *const[]){ "/bin/cat", ".cfg/rw.json", NULL },
				    NULL, 0, &out, &res),
				0);
		CU_ASSERT_STRING_EQUAL(out.data, "token-v2\n");
		CU_ASSERT_EQUAL(res.start, SBX_START_WARM);
		usleep(200000);
	}
	sbx_policy_free(p);
	buf_release(&out);
	unlink(rw);
	cfg.warm = false;
	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	CU_ASSERT_EQUAL(sbx_warm_count(), 0);
	CU_ASSERT_EQUAL(count_entries(runtime_dir), 0);
}

/* SIGKILL every child of this process (the warm sandboxes' bwraps: every run's own is
 * reaped by now) and wait until each has exited, without reaping it: the pool learns it
 * from its pidfd. How many there were. */
static int kill_children(void)
{
	DIR *tasks = opendir("/proc/self/task");
	struct dirent *t;
	int n = 0;

	if (!tasks)
		return 0;
	while ((t = readdir(tasks))) {
		char path[300];
		FILE *f;
		long pid;

		if (t->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/children", t->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		while (fscanf(f, "%ld", &pid) == 1) {
			siginfo_t si;

			if (kill((pid_t)pid, SIGKILL) == 0 &&
			    waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) == 0)
				n++;
		}
		(void)fclose(f);
	}
	closedir(tasks);
	return n;
}

/* Warm sandboxes with a writable credential copy that died while they waited: the run
 * finds them dead, puts them down and starts its own, cold, from a clean instance. The
 * warm pool used to hand back the dead one's state (its copies among it) to the cold
 * start, which then wrote past its own array of copies. */
static void test_warm_dead_goes_cold(void)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP,
					 .runtime_dir = runtime_dir,
					 .exec_stub = OLP_SANDBOX_EXEC_PATH,
					 .warm = true };
	struct sbx_policy *p;
	struct buf out = BUF_INIT;
	struct sbx_result res;
	char rw[512];

	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	p = probe_policy();
	snprintf(rw, sizeof(rw), "%s.dead-cred", runtime_dir);
	write_file(rw, "token-v1\n", 0600);
	CU_ASSERT_EQUAL(sbx_policy_add_bind(p, rw, SBX_HOME_PATH "/.cfg/rw.json", true), 0);
	CU_ASSERT_EQUAL(
		run(p,
		    (const char *const[]){ "/bin/sh", "-c", "echo token-v2 > .cfg/rw.json", NULL },
		    NULL, 0, &out, &res),
		0);
	CU_ASSERT_EQUAL(res.start, SBX_START_COLD);
	CU_ASSERT(sbx_warm_count() >= 1);
	CU_ASSERT(kill_children() >= 1);
	buf_reset(&out);
	CU_ASSERT_EQUAL(
		run(p,
		    (const char *const[]){ "/bin/sh", "-c",
					   "cat .cfg/rw.json; echo token-v3 > .cfg/rw.json", NULL },
		    NULL, 0, &out, &res),
		0);
	CU_ASSERT_STRING_EQUAL(out.data, "token-v2\n");
	CU_ASSERT_EQUAL(res.exit_status, 0);
	CU_ASSERT_EQUAL(res.start, SBX_START_COLD);
	sbx_policy_free(p);
	/* Its own copy was written back. */
	buf_reset(&out);
	CU_ASSERT_EQUAL(buf_read_file(&out, rw, 4096), 0);
	CU_ASSERT_STRING_EQUAL(out.data, "token-v3\n");
	buf_release(&out);
	unlink(rw);
	cfg.warm = false;
	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	CU_ASSERT_EQUAL(sbx_warm_count(), 0);
	CU_ASSERT_EQUAL(count_entries(runtime_dir), 0);
}

/* A run of owner tag's under p. */
static int run_as(struct sbx_policy *p, const char *tag, struct sbx_result *res)
{
	struct buf out = BUF_INIT;
	struct sbx_callbacks cb = { .on_stdout = collect, .ctx = &out };
	struct sbx_run_options opt = { .hangup_fd = -1, .owner_tag = tag };
	int ret = sbx_run(p, (const char *const[]){ "/bin/true", NULL }, &opt, &cb, res);

	buf_release(&out);
	return ret;
}

/* A guest tag churning policies (each run another environment) keeps at most half of the
 * process's 16 warm sandboxes and evicts only its own: the owner's wait on, and only the
 * owner's run takes them. The pool used to drop its oldest, whoever's. */
static void test_warm_churn_evicts_only_its_own(void)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP,
					 .runtime_dir = runtime_dir,
					 .exec_stub = OLP_SANDBOX_EXEC_PATH,
					 .warm = true };
	struct sbx_policy *owner, *guest;
	struct sbx_result res;

	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	owner = probe_policy();
	CU_ASSERT_EQUAL(run_as(owner, "owner", &res), 0);
	CU_ASSERT_EQUAL(res.start, SBX_START_COLD);
	CU_ASSERT_EQUAL(sbx_warm_count(), 2); /* filled before sbx_run returns */
	for (int i = 0; i < 12; i++) {
		char v[16];

		guest = probe_policy();
		snprintf(v, sizeof(v), "%d", i);
		CU_ASSERT_EQUAL(sbx_policy_setenv(guest, "OLP_VARIANT", v), 0);
		CU_ASSERT_EQUAL(run_as(guest, "guest", &res), 0);
		CU_ASSERT_EQUAL(res.exit_status, 0);
		sbx_policy_free(guest);
	}
	CU_ASSERT_EQUAL(sbx_warm_count(), 2 + 8);
	/* The owner's policy run by the guest: not the owner's sandbox. */
	CU_ASSERT_EQUAL(run_as(owner, "guest", &res), 0);
	CU_ASSERT_EQUAL(res.start, SBX_START_COLD);
	CU_ASSERT_EQUAL(run_as(owner, "owner", &res), 0);
	CU_ASSERT_EQUAL(res.start, SBX_START_WARM);
	CU_ASSERT_EQUAL(res.exit_status, 0);
	sbx_policy_free(owner);
	cfg.warm = false;
	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	CU_ASSERT_EQUAL(sbx_warm_count(), 0);
	CU_ASSERT_EQUAL(count_entries(runtime_dir), 0);
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "status probe starts a real sandbox", test_status },
		{ "echo and exit status", test_echo_and_exit_status },
		{ "3 MiB through stdin and stdout", test_stdin_roundtrip_large },
		{ "relative argv refused", test_relative_argv_refused },
		{ "missing binary fails", test_missing_binary_fails },
		{ "bwrap's own failure", test_setup_failure },
		{ "the stub's identity failure", test_identity_failure },
		{ "a failure is never learnt from text", test_failure_not_from_text },
		{ "timeout kills the tree", test_timeout_kills_tree },
		{ "callback stop and abort", test_callback_stop_and_abort },
		{ "the run ends with the command", test_ends_with_the_command },
		{ "hangup fd aborts", test_hangup_fd_aborts },
		{ "the caller's tick while the command is silent", test_ticks_while_silent },
		{ "the caller's deadline ends the run", test_caller_deadline },
		{ "no process left behind", test_no_process_left },
		{ "only fds 0-2 inherited", test_only_stdio_inherited },
		{ "environment allowlisted", test_environment_is_allowlisted },
		{ "environment on no command line", test_environment_on_no_command_line },
		{ "filesystem view", test_filesystem_view },
		{ "credential files as copies", test_credential_copies },
		{ "a checked write-back", test_checked_write_back },
		{ "log lines name the request", test_log_lines_name_the_request },
		{ "scratch removed", test_scratch_removed },
		{ "concurrent runs", test_concurrent_runs },
		{ "mode off still closes fds", test_mode_off_still_closes_fds },
		{ "stale scratch swept", test_stale_scratch_swept },
		{ "what a dead worker left running is killed", test_stale_run_killed },
		{ "sweep never follows links", test_sweep_never_follows_links },
		{ "warm sandboxes", test_warm_sandboxes },
		{ "a burst keeps two warm sandboxes", test_warm_burst_keeps_two },
		{ "warm after a credential write-back", test_warm_after_write_back },
		{ "dead warm sandboxes: the run goes cold", test_warm_dead_goes_cold },
		{ "a tag's warm churn evicts only its own", test_warm_churn_evicts_only_its_own },
		{ NULL, NULL },
	};
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP };
	int fails;

	if (!mkdtemp(runtime_dir))
		return 1;
	cfg.runtime_dir = runtime_dir;
	if (sbx_global_init(&cfg)) {
		fprintf(stderr, "sbx_global_init failed\n");
		return 1;
	}
	fails = ts_cunit_run("sandbox", tests);
	sbx_global_release();
	rmdir(runtime_dir);
	return ts_exit_status(fails);
}
