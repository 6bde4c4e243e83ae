/* CUnit suite for the uid slots of sandbox/ident.c (ADR 0014, issue 22 item 10): a local
 * user who is not the workers' cannot take them, and they hold across worker processes
 * until a run's last process is gone. Real bwrap, real processes.
 *
 * The attacker is a process of its own as `nobody`: it binds the abstract socket names
 * that were the slots' locks (olp-run-uid-<uid>, every socket type), and tries to make and
 * lock the lock files where the workers keep them. Then a worker, as root and as www-data
 * (each a process of its own), runs a command that prints its user namespace's map: the
 * run must get a uid of the range all the same. Only root can be the three users: anyone
 * else gets a SKIP (77), as does a host where runs cannot get a uid of their own. */
#include "tests/support/cunit.h"
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "sandbox/sandbox.h"
#include "common/banned.h"

#define SKIP 77
#define NOBODY 65534
/* Root's ranges here are outside root's default (0x70000000 + 64 Ki), so that no other
 * suite running at the same time takes their slots. */
#define ROOT_BASE 0x70010000u
#define ROOT_SLOT_DIR "/run/olp-uid-slots"

static char top[] = "/tmp/olp-ident-test-XXXXXX";
static char stub[320];

struct worker {
	uid_t uid;
	gid_t gid;
	unsigned base, count; /* the uid range its runs take */
	char runtime[256];
};

/* ---- the attacker ------------------------------------------------------------------- */

/* What the attacker managed. */
struct attack {
	int names_bound;  /* abstract names it holds */
	int files_opened; /* lock files it could open (or make) */
	int dirs_made;	  /* slot directories it could make */
};

static bool bind_abstract(int type, unsigned uid)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, type, 0), n;

	n = snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1, "olp-run-uid-%u", uid);
	if (fd < 0)
		return false;
	if (bind(fd, (struct sockaddr *)&a,
		 (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n)) < 0) {
		close(fd);
		return false;
	}
	return true; /* held until the attacker exits */
}

/* As nobody: take every slot of w's range every way there is, report, then hold on until
 * report_fd's reader closes go_fd's other end. */
static void __attribute__((noreturn))
attacker_main(const struct worker *w, int report_fd, int go_fd)
{
	static const int types[] = { SOCK_DGRAM, SOCK_STREAM, SOCK_SEQPACKET };
	struct attack a = { 0 };
	char path[512], c;

	if (setgroups(0, NULL) || setresgid(NOBODY, NOBODY, NOBODY) ||
	    setresuid(NOBODY, NOBODY, NOBODY))
		_exit(2);
	for (size_t t = 0; t < ARRAY_SIZE(types); t++)
		for (unsigned i = 0; i < w->count; i++)
			a.names_bound += bind_abstract(types[t], w->base + i);
	snprintf(path, sizeof(path), "%s/uid-slots", w->runtime);
	a.dirs_made += mkdir(ROOT_SLOT_DIR, 0777) == 0;
	a.dirs_made += mkdir(path, 0777) == 0;
	for (unsigned i = 0; i < w->count; i++) {
		const char *dirs[] = { ROOT_SLOT_DIR, path };

		for (size_t d = 0; d < ARRAY_SIZE(dirs); d++) {
			char f[600];
			int fd;

			snprintf(f, sizeof(f), "%s/%u.lock", dirs[d], w->base + i);
			fd = open(f, O_RDWR | O_CREAT, 0666);
			if (fd < 0)
				fd = open(f, O_RDONLY);
			if (fd >= 0) {
				a.files_opened++;
				(void)flock(fd, LOCK_EX | LOCK_NB);
			}
		}
	}
	if (write(report_fd, &a, sizeof(a)) != (ssize_t)sizeof(a))
		_exit(3);
	while (read(go_fd, &c, 1) < 0 && errno == EINTR)
		;
	_exit(0);
}

/* ---- a worker ----------------------------------------------------------------------- */

static int collect(void *ctx, const char *data, size_t len)
{
	buf_add(ctx, data, len);
	return 0;
}

/* Become w's user and set the sandbox up as a worker does: 0, or SKIP when runs cannot
 * get a uid of their own here (said why). The start-up check runs a sandbox: with every
 * slot of the range held it fails, which only_identity (a worker expected to get no uid)
 * lets pass. */
static int worker_init(const struct worker *w, bool only_identity)
{
	char range[64];
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP,
					 .runtime_dir = w->runtime,
					 .exec_stub = stub,
					 .uid_range = range };
	const struct sbx_status *st;

	snprintf(range, sizeof(range), "%u:%u", w->base, w->count);
	/* Dumpable again after the switch, as a worker exec'd as w is: newuidmap checks that
	 * /proc/PID of the namespace's holder is w's, which a non-dumpable one is not. */
	if (w->uid && (setgroups(0, NULL) || setresgid(w->gid, w->gid, w->gid) ||
		       setresuid(w->uid, w->uid, w->uid) || prctl(PR_SET_DUMPABLE, 1)))
		return 1;
	/* The build tree may be closed to w. */
	if (chdir("/") || sbx_global_init(&cfg))
		return 1;
	st = sbx_status_get();
	if ((!st->available && !only_identity) || strcmp(st->identity, "per_run")) {
		fprintf(stderr, "  uid %u: no uid of its own for runs: %s\n", (unsigned)w->uid,
			st->message ? st->message : st->identity_detail);
		return SKIP;
	}
	return 0;
}

/* One run of argv: 0 if it ran and exited 0 (out gets its stdout), 2 when it could not
 * get a uid (identity), 1 otherwise. */
static int worker_run(const char *const argv[], struct buf *out)
{
	struct sbx_policy *p = sbx_policy_new();
	struct sbx_callbacks cb = { .on_stdout = collect, .ctx = out };
	struct sbx_run_options opt = { .hangup_fd = -1 };
	struct sbx_result res;
	int rc;

	sbx_policy_set_timeout_ms(p, 60000);
	rc = sbx_run(p, argv, &opt, &cb, &res);
	sbx_policy_free(p);
	if (rc && res.spawn_stage && !strcmp(res.spawn_stage, "identity"))
		return 2;
	if (rc || res.end != SBX_END_EXITED || res.exit_status) {
		fprintf(stderr, "  run: %d, end %s, exit %d, stage %s, errno %d\n", rc,
			sbx_end_name(res.end), res.exit_status,
			res.spawn_stage ? res.spawn_stage : "-", res.spawn_errno);
		return 1;
	}
	return 0;
}

/* As w: one run, which must see its own host uid from w's range in its user namespace's
 * map. The exit status of the worker process: 0, 1 (failed), 2 (no uid), SKIP. */
static int worker_main(const struct worker *w, bool only_identity)
{
	static const char *const argv[] = { "/bin/cat", "/proc/self/uid_map", NULL };
	struct buf out = BUF_INIT;
	unsigned inside, host, n;
	int ret = worker_init(w, only_identity);

	if (ret)
		return ret;
	ret = worker_run(argv, &out);
	/* The command's line: "1000 <host uid> 1" (ident.c maps SBX_UID to the slot). */
	for (const char *l = out.data; !ret && l; l = strchr(l, '\n'), l = l ? l + 1 : NULL)
		if (sscanf(l, "%u %u %u", &inside, &host, &n) == 3 && inside == 1000) {
			ret = host >= w->base && host < w->base + w->count ? 0 : 1;
			if (ret)
				fprintf(stderr, "  the run is host uid %u, not one of %u:%u\n",
					host, w->base, w->count);
			break;
		}
	buf_release(&out);
	sbx_global_release();
	return ret;
}

static pid_t fork_worker(const struct worker *w, bool only_identity)
{
	pid_t pid = fork();

	if (pid == 0)
		_exit(worker_main(w, only_identity));
	return pid;
}

static int wait_status(pid_t pid)
{
	int st;

	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A runtime dir for w under top, its own. */
static int worker_dir(struct worker *w, const char *name)
{
	snprintf(w->runtime, sizeof(w->runtime), "%s/%s", top, name);
	if (mkdir(w->runtime, 0700) < 0 || chown(w->runtime, w->uid, w->gid) < 0)
		return -errno;
	return 0;
}

/* ---- the tests ---------------------------------------------------------------------- */

/* nobody holds every name and tries every file: w's run gets a uid of the range all the
 * same, and nobody could not make or open a single lock file. */
static void squatted(struct worker *w)
{
	struct attack a = { 0 };
	int report[2], go[2], st;
	pid_t att;

	/* Whether w's runs get a uid here at all, before anyone interferes. */
	st = wait_status(fork_worker(w, false));
	if (st == SKIP) {
		fprintf(stderr, "(skipped as uid %u) ", (unsigned)w->uid);
		return;
	}
	CU_ASSERT_EQUAL_FATAL(st, 0);
	CU_ASSERT_EQUAL_FATAL(pipe2(report, O_CLOEXEC), 0);
	CU_ASSERT_EQUAL_FATAL(pipe2(go, O_CLOEXEC), 0);
	att = fork();
	if (att == 0) {
		close(report[0]);
		close(go[1]);
		attacker_main(w, report[1], go[0]);
	}
	close(report[1]);
	close(go[0]);
	CU_ASSERT_EQUAL(read(report[0], &a, sizeof(a)), (ssize_t)sizeof(a));
	close(report[0]);
	/* The old locks are all taken; no new one is reachable. */
	CU_ASSERT_EQUAL(a.names_bound, 3 * (int)w->count);
	CU_ASSERT_EQUAL(a.files_opened, 0);
	CU_ASSERT_EQUAL(a.dirs_made, 0);
	/* Now a worker starts and serves a run, its start-up check included. */
	CU_ASSERT_EQUAL(wait_status(fork_worker(w, false)), 0);
	close(go[1]);
	CU_ASSERT_EQUAL(wait_status(att), 0);
}

static void test_squatted_root(void)
{
	struct worker w = { .uid = 0, .gid = 0, .base = ROOT_BASE, .count = 2 };

	CU_ASSERT_EQUAL_FATAL(worker_dir(&w, "root"), 0);
	squatted(&w);
}

/* www-data's first /etc/subuid range: 0 with *base, *count, or -ENOENT. */
static int www_data_range(unsigned *base, unsigned *count)
{
	struct buf b = BUF_INIT;
	const char *l;
	int ret = -ENOENT;

	if (buf_read_file(&b, "/etc/subuid", 1 << 20) == 0)
		for (l = b.data; l && ret; l = strchr(l, '\n'), l = l ? l + 1 : NULL)
			if (sscanf(l, "www-data:%u:%u", base, count) == 2)
				ret = 0;
	buf_release(&b);
	return ret;
}

static void test_squatted_www_data(void)
{
	struct worker w = { .uid = 33, .gid = 33, .count = 2 };
	unsigned base, count;

	if (www_data_range(&base, &count) || count < 1024) {
		fprintf(stderr, "(no /etc/subuid range for www-data: not run) ");
		return;
	}
	/* Far from the range's start, where www-data's other suites take theirs. */
	w.base = base + count - 16;
	CU_ASSERT_EQUAL_FATAL(worker_dir(&w, "www-data"), 0);
	squatted(&w);
}

/* Reads until "up" comes, then tells the test on fd (ctx) once. */
static int say_up(void *ctx, const char *data, size_t len)
{
	int *fd = ctx;

	if (*fd >= 0 && memmem(data, len, "up", 2)) {
		(void)!write(*fd, "u", 1);
		close(*fd);
		*fd = -1;
	}
	return 0;
}

/* A worker process whose run is under way holds its slot from every other process; when
 * that worker dies, the slot is free again once the sandbox is gone, and taken again. */
static void test_across_processes(void)
{
	static const char *const long_argv[] = { "/bin/sh", "-c", "echo up; exec sleep 60", NULL };
	struct worker w = { .uid = 0, .gid = 0, .base = ROOT_BASE + 16, .count = 1 };
	struct pollfd pfd;
	char path[128], c;
	int up[2], fd, st;
	pid_t first;

	CU_ASSERT_EQUAL_FATAL(worker_dir(&w, "exclusive"), 0);
	CU_ASSERT_EQUAL_FATAL(pipe2(up, O_CLOEXEC), 0);
	first = fork();
	if (first == 0) {
		struct sbx_policy *p = sbx_policy_new();
		struct sbx_callbacks cb = { .on_stdout = say_up, .ctx = &up[1] };
		struct sbx_run_options opt = { .hangup_fd = -1 };
		struct sbx_result res;

		close(up[0]);
		if (worker_init(&w, false))
			_exit(1);
		sbx_policy_set_timeout_ms(p, 60000);
		_exit(sbx_run(p, long_argv, &opt, &cb, &res) ? 1 : 0);
	}
	close(up[1]);
	pfd = (struct pollfd){ .fd = up[0], .events = POLLIN };
	CU_ASSERT_EQUAL_FATAL(poll(&pfd, 1, 30000), 1);
	CU_ASSERT_EQUAL_FATAL(read(up[0], &c, 1), 1);
	close(up[0]);
	/* Its one slot is held: another worker gets no uid. */
	CU_ASSERT_EQUAL(wait_status(fork_worker(&w, true)), 2);
	/* The first worker dies; its sandbox follows (--die-with-parent). Wait for the lock
	 * itself, bounded by an alarm. */
	kill(first, SIGKILL);
	CU_ASSERT_EQUAL(wait_status(first), 128 + SIGKILL);
	snprintf(path, sizeof(path), "%s/%u.lock", ROOT_SLOT_DIR, w.base);
	fd = open(path, O_RDWR | O_CLOEXEC);
	CU_ASSERT_FATAL(fd >= 0);
	alarm(30);
	st = flock(fd, LOCK_EX);
	alarm(0);
	CU_ASSERT_EQUAL(st, 0);
	close(fd);
	/* Free again: the next worker's run takes it. */
	CU_ASSERT_EQUAL(wait_status(fork_worker(&w, false)), 0);
}

/* ---- the worker's user name ------------------------------------------------------------- */

#define NAMED_UID 4242u /* no user of the host's */
#define NAMED_BASE 2100000u

/* path holds text, mode 0644: 0 or -1. */
static int write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "we");
	int ret = f && fputs(text, f) >= 0 ? 0 : -1;

	if (f && fclose(f))
		ret = -1;
	return ret;
}

/* In a mount namespace of its own, /etc/passwd gives NAMED_UID the name olpident with
 * password field pw (after a decoy line whose uid only starts alike), and /etc/subuid and
 * /etc/subgid give that name, and only the name, a range; then as NAMED_UID set the
 * sandbox up as a worker does and write what it says of runs' identity to fd. The exit
 * status: 0, or 1 (a step of the set-up failed, said why). */
static int named_main(const char *pw, int fd)
{
	static const char *const files[] = { "passwd", "subuid", "subgid" };
	struct sbx_global_config cfg = { .mode = SBX_MODE_OFF };
	char dir[320], path[352], text[256];
	const struct sbx_status *st;
	size_t i;

	snprintf(dir, sizeof(dir), "%s/named-%d", top, (int)getpid());
	if (mkdir(dir, 0755) < 0 || unshare(CLONE_NEWNS) < 0 ||
	    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		return perror("named: set-up"), 1;
	for (i = 0; i < ARRAY_SIZE(files); i++) {
		if (i == 0)
			snprintf(
				text, sizeof(text),
				"root:x:0:0:root:/root:/bin/sh\n"
				"decoy:x:%u0:%u0::/nonexistent:/usr/sbin/nologin\n"
				"olpident:%s:%u:%u:OLP ident test:/nonexistent:/usr/sbin/nologin\n",
				NAMED_UID, NAMED_UID, pw, NAMED_UID, NAMED_UID);
		else
			snprintf(text, sizeof(text), "olpident:%u:65536\n", NAMED_BASE);
		snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
		if (write_text(path, text))
			return perror(path), 1;
		snprintf(text, sizeof(text), "/etc/%s", files[i]);
		if (mount(path, text, NULL, MS_BIND, NULL) < 0)
			return perror(text), 1;
	}
	snprintf(path, sizeof(path), "%s/run", dir);
	if (mkdir(path, 0700) < 0 || chown(path, NAMED_UID, NAMED_UID) < 0)
		return perror(path), 1;
	cfg.runtime_dir = path;
	if (setgroups(0, NULL) || setresgid(NAMED_UID, NAMED_UID, NAMED_UID) ||
	    setresuid(NAMED_UID, NAMED_UID, NAMED_UID) || prctl(PR_SET_DUMPABLE, 1) || chdir("/") ||
	    sbx_global_init(&cfg))
		return perror("named: become the user"), 1;
	st = sbx_status_get();
	snprintf(text, sizeof(text), "%s", st->identity_detail ? st->identity_detail : "");
	sbx_global_release();
	return write(fd, text, strlen(text)) == (ssize_t)strlen(text) ? 0 : 1;
}

/* A worker's user is found by its name in /etc/subuid whatever its password field holds
 * ("x", or "*", "!", "" or a hash where no shadow file is used): its range is the one runs
 * take. */
static void test_named_user(void)
{
	static const char *const pws[] = { "x", "*", "!", "", "$6$salt$hash" };
	char want[32];

	snprintf(want, sizeof(want), "%u-", NAMED_BASE);
	for (size_t i = 0; i < ARRAY_SIZE(pws); i++) {
		char detail[512] = "";
		int fd[2], st;
		ssize_t n;
		pid_t pid;

		CU_ASSERT_EQUAL_FATAL(pipe2(fd, O_CLOEXEC), 0);
		pid = fork();
		if (pid == 0) {
			close(fd[0]);
			_exit(named_main(pws[i], fd[1]));
		}
		close(fd[1]);
		n = read(fd[0], detail, sizeof(detail) - 1);
		close(fd[0]);
		st = wait_status(pid);
		detail[n > 0 ? n : 0] = '\0';
		if (st || !strstr(detail, want))
			fprintf(stderr, "\n  password field \"%s\": exit %d, identity: %s\n",
				pws[i], st, detail);
		CU_ASSERT_EQUAL(st, 0);
		/* "one host uid per run from 2100000-2165535 …", or that range refused for a
		 * reason after it was found (newuidmap missing, say): never "no uid range for
		 * user ?". */
		CU_ASSERT_PTR_NOT_NULL(strstr(detail, want));
		CU_ASSERT_PTR_NULL(strstr(detail, "no uid range"));
	}
}

static void on_alarm(int sig)
{
	(void)sig; /* only interrupts a blocking flock */
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "nobody cannot take a root worker's slots", test_squatted_root },
		{ "nobody cannot take a www-data worker's slots", test_squatted_www_data },
		{ "slots across worker processes", test_across_processes },
		{ "a user's range found by its name, whatever its password field",
		  test_named_user },
		{ NULL, NULL },
	};
	struct sigaction sa = { .sa_handler = on_alarm };
	char bin[64];
	int fails;

	if (geteuid() != 0) {
		fprintf(stderr, "SKIP: not root: cannot act as nobody and as www-data\n");
		return SKIP;
	}
	sigaction(SIGALRM, &sa, NULL);
	if (!mkdtemp(top) || chmod(top, 0755) < 0)
		return 1;
	/* The stub where www-data can read it (the build tree may be closed to it). */
	snprintf(bin, sizeof(bin), "%s/bin", top);
	snprintf(stub, sizeof(stub), "%s/olp-sandbox-exec", bin);
	{
		struct buf cmd = BUF_INIT;

		buf_addf(&cmd, "mkdir -m 755 '%s' && cp '%s' '%s' && chmod 755 '%s'", bin,
			 OLP_SANDBOX_EXEC_PATH, stub, stub);
		fails = system(cmd.data);
		buf_release(&cmd);
		if (fails)
			return 1;
	}
	fails = ts_cunit_run("uid slots", tests);
	{
		struct buf cmd = BUF_INIT;

		buf_addf(&cmd, "rm -rf '%s'", top);
		(void)!system(cmd.data);
		buf_release(&cmd);
	}
	return ts_exit_status(fails);
}
