/* CUnit suite for pre-started commands (sandbox/pool.c, ADR 0022): a run of exactly the
 * same command under the same policy takes a process started ahead, whose command already
 * runs and waits on its stdin. Real bwrap, real processes. */
#include "tests/support/cunit.h"
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "sandbox/sandbox.h"
#include "common/banned.h"

static char runtime_dir[] = "/tmp/olp-pre-test-XXXXXX";

/* Prints a token only this process has, then what is in its home, then copies its stdin
 * there (a file the next run must never see) and echoes it. */
static const char token_script[] =
	"read -r t < /proc/sys/kernel/random/uuid; echo \"token $t\"; echo \"home $(ls -A "
	"\"$HOME\" /tmp | tr '\\n' ' ')\"; cat > \"$HOME/mine\"; cp \"$HOME/mine\" /tmp/mine; "
	"cat \"$HOME/mine\"";
static const char *const token_argv[] = { "/bin/sh",  "-c",	  token_script,
					  "argv-one", "argv two", NULL };

static int collect(void *ctx, const char *data, size_t len)
{
	buf_add(ctx, data, len);
	return 0;
}

static void init(unsigned max, uint64_t idle_ms)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP,
					 .runtime_dir = runtime_dir,
					 .exec_stub = OLP_SANDBOX_EXEC_PATH,
					 .warm = true,
					 .prestart_max = max,
					 .prestart_idle_ms = idle_ms };

	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
}

static struct sbx_policy *policy(void)
{
	struct sbx_policy *p = sbx_policy_new();

	sbx_policy_set_timeout_ms(p, 20000);
	return p;
}

static int run(const struct sbx_policy *p, const char *const argv[], const char *in,
	       struct buf *out, struct sbx_result *res)
{
	struct sbx_callbacks cb = { .on_stdout = collect, .ctx = out };
	struct sbx_run_options opt = {
		.stdin_data = in, .stdin_len = in ? strlen(in) : 0, .hangup_fd = -1, .prestart = 1
	};

	buf_reset(out);
	return sbx_run(p, argv, &opt, &cb, res);
}

/* A run of owner tag's, whose share is at most share (0: the host's default); argv is
 * "/bin/sh -c cat" with variant as $0, so that each variant is another pre-start key (as
 * another max_tokens is for claude). */
static int run_as(const struct sbx_policy *p, const char *tag, unsigned share, int variant,
		  const struct sbx_callbacks *cbp, struct sbx_result *res)
{
	char v[16];
	const char *const argv[] = { "/bin/sh", "-c", "cat", v, NULL };
	struct buf out = BUF_INIT;
	struct sbx_callbacks cb = { .on_stdout = collect, .ctx = &out };
	struct sbx_run_options opt = { .stdin_data = "x",
				       .stdin_len = 1,
				       .hangup_fd = -1,
				       .prestart = 1,
				       .owner_tag = tag,
				       .owner_prestart_max = share };
	int ret;

	snprintf(v, sizeof(v), "v%d", variant);
	ret = sbx_run(p, argv, &opt, cbp ? cbp : &cb, res);
	buf_release(&out);
	return ret;
}

static size_t idle_now(void)
{
	struct sbx_prestart_stats st;

	sbx_prestart_stats(&st);
	return st.idle;
}

/* Wait (generously: the machine is shared) until n are idle. */
static bool wait_idle(size_t n, int ms)
{
	for (int i = 0; i < ms / 50; i++) {
		if (idle_now() == n)
			return true;
		usleep(50000);
	}
	return idle_now() == n;
}

/* Processes whose parent is this one. */
static int children(void)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d))) {
		char path[300], line[256];
		FILE *f;

		if (de->d_name[0] < '0' || de->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/status", de->d_name);
		if (!(f = fopen(path, "r")))
			continue;
		while (fgets(line, sizeof(line), f))
			if (!strncmp(line, "PPid:", 5) && atol(line + 5) == (long)getpid())
				n++;
		(void)fclose(f);
	}
	closedir(d);
	return n;
}

/* Scratch dirs in the runtime dir (everything but the host-wide slot files' dir). */
static int scratch_dirs(void)
{
	DIR *d = opendir(runtime_dir);
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.' && strcmp(de->d_name, "prestart-slots"))
			n++;
	closedir(d);
	return n;
}

static void token_of(const struct buf *out, char *tok, size_t size)
{
	const char *t = strstr(out->data, "token ");

	tok[0] = '\0';
	if (t)
		snprintf(tok, size, "%.36s", t + 6);
}

/* The cap holds across processes: another process's idle one takes the one slot; when it
 * is gone (even SIGKILLed), this one can keep one. First: no thread of ours exists yet. */
static void test_host_cap_across_processes(void)
{
	struct sbx_policy *p;
	struct buf out = BUF_INIT;
	struct sbx_result res;
	int go[2], ready[2], status;
	pid_t pid;
	char c;

	init(1, 60000);
	CU_ASSERT_FATAL(pipe(go) == 0 && pipe(ready) == 0);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		struct buf o = BUF_INIT;
		struct sbx_result r;
		struct sbx_policy *cp = policy();

		close(go[1]);
		close(ready[0]);
		(void)run(cp, token_argv, "x", &o, &r);
		c = wait_idle(1, 10000) ? 'y' : 'n';
		(void)!write(ready[1], &c, 1);
		(void)!read(go[0], &c, 1); /* until the parent says, or SIGKILL */
		sbx_policy_free(cp);
		sbx_global_release();
		_exit(0);
	}
	close(go[0]);
	close(ready[1]);
	CU_ASSERT_EQUAL(read(ready[0], &c, 1), 1);
	CU_ASSERT_EQUAL(c, 'y');
	p = policy();
	/* The other process holds the host's one slot: ours runs, but none is kept. */
	CU_ASSERT_EQUAL(run(p, token_argv, "a", &out, &res), 0);
	CU_ASSERT_EQUAL(res.exit_status, 0);
	CU_ASSERT_EQUAL(idle_now(), 0);
	/* SIGKILLed, it leaks nothing: its lock went with it. */
	kill(pid, SIGKILL);
	CU_ASSERT_EQUAL(waitpid(pid, &status, 0), pid);
	CU_ASSERT_EQUAL(run(p, token_argv, "b", &out, &res), 0);
	CU_ASSERT(wait_idle(1, 10000));
	sbx_policy_free(p);
	buf_release(&out);
	close(go[1]);
	close(ready[0]);
}

/* Argv and stdin as for a cold run, the output written before the take comes first, one
 * process per run, and nothing of one run is seen by the next. */
static void test_stdin_argv_and_isolation(void)
{
	struct sbx_policy *p;
	struct buf out = BUF_INIT, argv_out = BUF_INIT;
	struct sbx_result res;
	struct sbx_prestart_stats st0, st;
	char tok[3][40];

	init(4, 60000);
	sbx_prestart_stats(&st0);
	p = policy();
	CU_ASSERT_EQUAL(run(p, token_argv, "first secret\n", &out, &res), 0);
	CU_ASSERT_EQUAL(res.start, SBX_START_COLD);
	CU_ASSERT_EQUAL(res.exit_status, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "first secret\n"));
	token_of(&out, tok[0], sizeof(tok[0]));
	CU_ASSERT(wait_idle(1, 10000));
	for (int i = 1; i < 3; i++) {
		usleep(300000); /* started ahead: its first line is written before the take */
		CU_ASSERT_EQUAL(run(p, token_argv, i == 1 ? "second\n" : "third\n", &out, &res), 0);
		CU_ASSERT_EQUAL(res.start, SBX_START_PRESTART);
		CU_ASSERT_EQUAL(res.end, SBX_END_EXITED);
		CU_ASSERT_EQUAL(res.exit_status, 0);
		/* In order: the line from before the take, then the home, then stdin. */
		CU_ASSERT_EQUAL(strncmp(out.data, "token ", 6), 0);
		CU_ASSERT_PTR_NOT_NULL(strstr(out.data, i == 1 ? "second\n" : "third\n"));
		CU_ASSERT_PTR_NULL(strstr(out.data, "secret"));
		/* The home and /tmp were empty: no "mine" of the run before. */
		CU_ASSERT_PTR_NULL(strstr(out.data, "mine"));
		token_of(&out, tok[i], sizeof(tok[i]));
		CU_ASSERT(strlen(tok[i]) == 36);
		for (int j = 0; j < i; j++)
			CU_ASSERT(strcmp(tok[i], tok[j]) != 0);
		CU_ASSERT(wait_idle(1, 10000));
	}
	/* The argv is the run's own, word for word. */
	usleep(300000);
	CU_ASSERT_EQUAL(run(p,
			    (const char *const[]){ "/bin/sh", "-c", "printf '[%s]' \"$@\"; cat",
						   "sh", "a b", "", "c", NULL },
			    "!", &argv_out, &res),
			0);
	CU_ASSERT_NOT_EQUAL(res.start, SBX_START_PRESTART); /* a new argv: a miss */
	CU_ASSERT_STRING_EQUAL(argv_out.data, "[a b][][c]!");
	CU_ASSERT(wait_idle(2, 10000));
	usleep(300000);
	CU_ASSERT_EQUAL(run(p,
			    (const char *const[]){ "/bin/sh", "-c", "printf '[%s]' \"$@\"; cat",
						   "sh", "a b", "", "c", NULL },
			    "?", &argv_out, &res),
			0);
	CU_ASSERT_EQUAL(res.start, SBX_START_PRESTART);
	CU_ASSERT_STRING_EQUAL(argv_out.data, "[a b][][c]?");
	sbx_prestart_stats(&st);
	CU_ASSERT_EQUAL(st.hit - st0.hit, 3);
	CU_ASSERT_EQUAL(st.miss - st0.miss, 2);
	/* Another policy (here: its environment) never takes one. */
	CU_ASSERT_EQUAL(sbx_policy_setenv(p, "OLP_TEST", "1"), 0);
	CU_ASSERT_EQUAL(run(p, token_argv, "x", &out, &res), 0);
	CU_ASSERT_NOT_EQUAL(res.start, SBX_START_PRESTART);
	sbx_policy_free(p);
	buf_release(&out);
	buf_release(&argv_out);
}

/* A credential file a run writes back (a refreshed login) is what the next pre-started
 * process gets: it is started, and keyed, after the write-back, and taken. */
static void test_writable_credential(void)
{
	char dir[] = "/tmp/olp-pre-cred-XXXXXX", cred[64];
	const char *const argv[] = { "/bin/sh", "-c", "cat \"$HOME/cred\"; cat > \"$HOME/cred\"",
				     NULL };
	struct sbx_policy *p = policy();
	struct buf out = BUF_INIT;
	struct sbx_result res;
	FILE *f;

	init(4, 60000);
	CU_ASSERT_FATAL(mkdtemp(dir) != NULL);
	snprintf(cred, sizeof(cred), "%s/cred", dir);
	f = fopen(cred, "w");
	CU_ASSERT_FATAL(f != NULL);
	CU_ASSERT(fputs("v1\n", f) >= 0);
	(void)fclose(f);
	CU_ASSERT_EQUAL(sbx_policy_add_bind(p, cred, "/home/olp/cred", true), 0);
	CU_ASSERT_EQUAL(run(p, argv, "v2\n", &out, &res), 0);
	CU_ASSERT_STRING_EQUAL(out.data, "v1\n");
	for (int i = 3; i <= 4; i++) {
		char in[8], want[8];

		CU_ASSERT(wait_idle(1, 10000));
		usleep(300000);
		snprintf(in, sizeof(in), "v%d\n", i);
		snprintf(want, sizeof(want), "v%d\n", i - 1);
		CU_ASSERT_EQUAL(run(p, argv, in, &out, &res), 0);
		CU_ASSERT_EQUAL(res.start, SBX_START_PRESTART);
		CU_ASSERT_STRING_EQUAL(out.data, want); /* never an older copy */
	}
	init(4, 60000); /* put it down before its file goes */
	unlink(cred);
	rmdir(dir);
	sbx_policy_free(p);
	buf_release(&out);
}

/* The wall clock starts at the take, not when the process was started ahead. */
static void test_deadline_from_take(void)
{
	struct sbx_policy *p = policy();
	struct buf out = BUF_INIT;
	struct sbx_result res;
	const char *const argv[] = { "/bin/sh", "-c", "cat; sleep 1; echo done", NULL };

	init(4, 60000);
	sbx_policy_set_timeout_ms(p, 3000);
	CU_ASSERT_EQUAL(run(p, argv, "", &out, &res), 0);
	CU_ASSERT(wait_idle(1, 10000));
	sleep(4); /* longer than its timeout, idle */
	CU_ASSERT_EQUAL(run(p, argv, "", &out, &res), 0);
	CU_ASSERT_EQUAL(res.start, SBX_START_PRESTART);
	CU_ASSERT_EQUAL(res.end, SBX_END_EXITED);
	CU_ASSERT_STRING_EQUAL(out.data, "done\n");
	sbx_policy_free(p);
	buf_release(&out);
}

/* A command that died while it waited is not taken: the run starts cold. */
static void test_died_while_idle(void)
{
	struct sbx_policy *p = policy();
	struct buf out = BUF_INIT;
	struct sbx_result res;
	struct sbx_prestart_stats st0, st;
	const char *const argv[] = { "/bin/sh", "-c", "echo early; exit 0", NULL };

	init(4, 60000);
	sbx_prestart_stats(&st0);
	CU_ASSERT_EQUAL(run(p, argv, NULL, &out, &res), 0);
	CU_ASSERT_STRING_EQUAL(out.data, "early\n");
	sleep(1);
	CU_ASSERT_EQUAL(run(p, argv, NULL, &out, &res), 0);
	CU_ASSERT_NOT_EQUAL(res.start, SBX_START_PRESTART);
	CU_ASSERT_STRING_EQUAL(out.data, "early\n");
	sbx_prestart_stats(&st);
	CU_ASSERT(st.died > st0.died);
	sbx_policy_free(p);
	buf_release(&out);
}

/* Expiry with no traffic at all: the idle one is put down, its dir removed. */
static void test_expiry_without_traffic(void)
{
	struct sbx_policy *p = policy();
	struct buf out = BUF_INIT;
	struct sbx_result res;
	struct sbx_prestart_stats st0, st;

	init(4, 500);
	/* The run leaves its successor started before it returns; the expiry thread puts it
	 * down and counts it in one locked section, so an empty pool means it was counted.
	 * (This tried up to 3 runs when the count could lag the removal.) */
	sbx_prestart_stats(&st0);
	CU_ASSERT_EQUAL(run(p, token_argv, "x", &out, &res), 0);
	CU_ASSERT_EQUAL(idle_now(), 1);
	CU_ASSERT(wait_idle(0, 15000));
	sbx_prestart_stats(&st);
	CU_ASSERT(st.expired > st0.expired);
	CU_ASSERT_EQUAL(st.died, st0.died);
	/* Only the warm sandboxes' processes and dirs are left: put them down too. */
	init(4, 500);
	CU_ASSERT_EQUAL(children(), 0);
	CU_ASSERT_EQUAL(scratch_dirs(), 0);
	sbx_policy_free(p);
	buf_release(&out);
}

/* Shutting down puts every idle one down: no process, no scratch dir left. Last: after a
 * shutdown this process starts no new one. */
static void test_shutdown_leaves_nothing(void)
{
	struct sbx_policy *p = policy();
	struct buf out = BUF_INIT;
	struct sbx_result res;

	init(4, 60000);
	CU_ASSERT_EQUAL(run(p, token_argv, "x", &out, &res), 0);
	CU_ASSERT(wait_idle(1, 10000));
	CU_ASSERT(children() >= 1);
	sbx_warm_shutdown();
	CU_ASSERT_EQUAL(idle_now(), 0);
	CU_ASSERT_EQUAL(children(), 0);
	CU_ASSERT_EQUAL(scratch_dirs(), 0);
	/* Closed: a run still works, cold, and keeps nothing. */
	CU_ASSERT_EQUAL(run(p, token_argv, "y", &out, &res), 0);
	CU_ASSERT_EQUAL(res.exit_status, 0);
	CU_ASSERT_EQUAL(idle_now(), 0);
	sbx_policy_free(p);
	buf_release(&out);
}

/* A guest tag churning variants (another max_tokens each request) evicts only its own
 * pre-started processes and holds at most its share of the host's slots (half of 4): the
 * owner's survives, and the owner's next run takes it. Neither takes the other's. The
 * pools are filled before sbx_run returns: no wait is needed to count them. */
static void test_churn_evicts_only_its_own(void)
{
	struct sbx_policy *p = policy();
	struct sbx_result res;

	init(4, 60000);
	CU_ASSERT_EQUAL(run_as(p, "owner", 0, 0, NULL, &res), 0);
	CU_ASSERT_EQUAL(idle_now(), 1);
	for (int v = 1; v <= 6; v++) {
		CU_ASSERT_EQUAL(run_as(p, "guest", 0, v, NULL, &res), 0);
		CU_ASSERT_NOT_EQUAL(res.start, SBX_START_PRESTART);
	}
	/* The owner's one and the guest's share of 2 (its last two variants). */
	CU_ASSERT_EQUAL(idle_now(), 3);
	/* The owner's variant run by the guest: not the owner's process. */
	CU_ASSERT_EQUAL(run_as(p, "guest", 0, 0, NULL, &res), 0);
	CU_ASSERT_NOT_EQUAL(res.start, SBX_START_PRESTART);
	CU_ASSERT_EQUAL(run_as(p, "guest", 0, 6, NULL, &res), 0);
	CU_ASSERT_EQUAL(res.start, SBX_START_PRESTART);
	CU_ASSERT_EQUAL(run_as(p, "owner", 0, 0, NULL, &res), 0);
	CU_ASSERT_EQUAL(res.start, SBX_START_PRESTART);
	CU_ASSERT_EQUAL(res.exit_status, 0);
	init(4, 60000);
	sbx_policy_free(p);
}

/* A tag's share holds for the host (init() first: no thread of ours at the fork): another process holding the guest's share leaves a
 * guest run here nothing (it may evict none of it, nor the owner's), while the owner
 * still gets one. */
static void test_share_across_processes(void)
{
	struct sbx_policy *p;
	struct sbx_result res;
	int go[2], ready[2], status;
	pid_t pid;
	char c;

	init(4, 60000);
	CU_ASSERT_FATAL(pipe(go) == 0 && pipe(ready) == 0);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		struct sbx_result r;
		struct sbx_policy *cp = policy();

		close(go[1]);
		close(ready[0]);
		for (int v = 1; v <= 3; v++)
			(void)run_as(cp, "guest", 0, v, NULL, &r);
		c = idle_now() == 2 ? 'y' : 'n';
		(void)!write(ready[1], &c, 1);
		(void)!read(go[0], &c, 1); /* until the parent says, or SIGKILL */
		sbx_policy_free(cp);
		sbx_global_release();
		_exit(0);
	}
	close(go[0]);
	close(ready[1]);
	CU_ASSERT_EQUAL(read(ready[0], &c, 1), 1);
	CU_ASSERT_EQUAL(c, 'y');
	p = policy();
	CU_ASSERT_EQUAL(run_as(p, "guest", 0, 4, NULL, &res), 0);
	CU_ASSERT_EQUAL(res.exit_status, 0);
	CU_ASSERT_EQUAL(idle_now(), 0);
	CU_ASSERT_EQUAL(run_as(p, "owner", 0, 1, NULL, &res), 0);
	CU_ASSERT_EQUAL(idle_now(), 1);
	/* The other process gone, its share is free again. */
	kill(pid, SIGKILL);
	CU_ASSERT_EQUAL(waitpid(pid, &status, 0), pid);
	CU_ASSERT_EQUAL(run_as(p, "guest", 0, 4, NULL, &res), 0);
	CU_ASSERT_EQUAL(idle_now(), 2);
	init(4, 60000);
	sbx_policy_free(p);
	close(go[1]);
	close(ready[0]);
}

/* The run's own share (the caller gives its key's max_concurrent): with 1, a tag keeps one
 * process started ahead, whatever it churns; a hit's successor takes the hit's slots. */
static void test_owner_share_from_the_run(void)
{
	struct sbx_policy *p = policy();
	struct sbx_result res;

	init(4, 60000);
	for (int v = 1; v <= 3; v++)
		CU_ASSERT_EQUAL(run_as(p, "limited", 1, v, NULL, &res), 0);
	CU_ASSERT_EQUAL(idle_now(), 1);
	CU_ASSERT_EQUAL(run_as(p, "limited", 1, 3, NULL, &res), 0);
	CU_ASSERT_EQUAL(res.start, SBX_START_PRESTART);
	CU_ASSERT_EQUAL(idle_now(), 1);
	CU_ASSERT_EQUAL(run_as(p, "limited", 1, 3, NULL, &res), 0);
	CU_ASSERT_EQUAL(res.start, SBX_START_PRESTART);
	init(4, 60000);
	sbx_policy_free(p);
}

/* While a run that took its tag's pre-started process goes on, its host-wide slots stay
 * its own: a third tag that runs meanwhile finds the host full (2 slots: the owner's in
 * use, guest1's idle) and keeps nothing, evicts nothing; the owner's next one is made,
 * and both the owner and guest1 hit. */
struct nested {
	const struct sbx_policy *p;
	bool done;
	size_t idle_during;
};

static int run_guest2(void *ctx, const char *data, size_t len)
{
	struct nested *n = ctx;
	struct sbx_result res;

	(void)data;
	(void)len;
	if (n->done)
		return 0;
	n->done = true;
	(void)run_as(n->p, "guest2", 0, 2, NULL, &res);
	n->idle_during = idle_now();
	return 0;
}

static void test_lease_through_the_run(void)
{
	struct sbx_policy *p = policy();
	struct sbx_result res;
	struct nested n = { .p = p };
	struct sbx_callbacks cb = { .on_stdout = run_guest2, .ctx = &n };

	init(2, 60000);
	CU_ASSERT_EQUAL(run_as(p, "owner", 0, 0, NULL, &res), 0);
	CU_ASSERT_EQUAL(run_as(p, "guest1", 0, 1, NULL, &res), 0);
	CU_ASSERT_EQUAL(idle_now(), 2);
	CU_ASSERT_EQUAL(run_as(p, "owner", 0, 0, &cb, &res), 0);
	CU_ASSERT_EQUAL(res.start, SBX_START_PRESTART);
	CU_ASSERT(n.done);
	CU_ASSERT_EQUAL(n.idle_during, 1); /* guest1's only */
	CU_ASSERT_EQUAL(idle_now(), 2);
	CU_ASSERT_EQUAL(run_as(p, "guest1", 0, 1, NULL, &res), 0);
	CU_ASSERT_EQUAL(res.start, SBX_START_PRESTART);
	CU_ASSERT_EQUAL(run_as(p, "owner", 0, 0, NULL, &res), 0);
	CU_ASSERT_EQUAL(res.start, SBX_START_PRESTART);
	init(4, 60000);
	sbx_policy_free(p);
}

/* This binary's slot files and their dir, and nobody else's: a glob over
 * /tmp/olp-pre-test-* here removed the slot files of another test_prestart running at the
 * same time (another build's suite), whose next take then made and locked a new file of
 * the same name beside the old one still held: two holders of one slot. */
static void remove_slots(void)
{
	char dir[sizeof(runtime_dir) + 32];
	DIR *d;
	struct dirent *de;

	snprintf(dir, sizeof(dir), "%s/prestart-slots", runtime_dir);
	d = opendir(dir);
	if (!d)
		return;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			(void)unlinkat(dirfd(d), de->d_name, 0);
	closedir(d);
	(void)rmdir(dir);
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "host cap across processes", test_host_cap_across_processes },
		{ "a tag's share across processes", test_share_across_processes },
		{ "a tag's churn evicts only its own", test_churn_evicts_only_its_own },
		{ "the run's own share", test_owner_share_from_the_run },
		{ "slots kept through the run", test_lease_through_the_run },
		{ "stdin, argv and isolation", test_stdin_argv_and_isolation },
		{ "deadline from the take", test_deadline_from_take },
		{ "a written-back credential", test_writable_credential },
		{ "died while idle", test_died_while_idle },
		{ "expiry without traffic", test_expiry_without_traffic },
		{ "shutdown leaves nothing", test_shutdown_leaves_nothing },
		{ NULL, NULL },
	};
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP };
	int fails;

	if (!mkdtemp(runtime_dir))
		return 1;
	cfg.runtime_dir = runtime_dir;
	if (sbx_global_init(&cfg) || !sbx_status_get()->available) {
		fprintf(stderr, "SKIP: the sandbox is not available here\n");
		return 77;
	}
	fails = ts_cunit_run("prestart", tests);
	sbx_global_release();
	remove_slots();
	rmdir(runtime_dir);
	return ts_exit_status(fails);
}
