/* The child between fork and exec, and its start.
 *
 * Everything the child needs (argv, envp, descriptors, rlimits) is built in the parent
 * before vfork() (struct child_plan, instance.h); the child runs sbx_child_exec(), a short
 * straight line of async-signal-safe calls, and reports a failure as {stage, errno} over
 * a close-on-exec pipe before _exit(127). Nothing in that pipe once vfork() returns means
 * exec succeeded (git's run-command.c waits for EOF to learn the same after fork()). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/close_range.h>

#include "common/common.h"
#include "sandbox/instance.h"
#include "common/banned.h"

/* The steps of sbx_child_exec, named in spawn failures. */
enum child_stage {
	STAGE_CGROUP = 1,
	STAGE_RLIMIT,
	STAGE_SIGNALS,
	STAGE_SETPGID,
	STAGE_USERNS,
	STAGE_NETNS,
	STAGE_PDEATHSIG,
	STAGE_CHDIR,
	STAGE_DUPFD,
	STAGE_DUP2,
	STAGE_CLOSE_RANGE,
	STAGE_EXEC,
};

static const char *const stage_names[] = {
	[STAGE_CGROUP] = "cgroup",
	[STAGE_RLIMIT] = "rlimit",
	[STAGE_SIGNALS] = "signals",
	[STAGE_SETPGID] = "setpgid",
	[STAGE_USERNS] = "userns",
	[STAGE_NETNS] = "setns(net)",
	[STAGE_PDEATHSIG] = "pdeathsig",
	[STAGE_CHDIR] = "chdir",
	[STAGE_DUPFD] = "dupfd",
	[STAGE_DUP2] = "dup2",
	[STAGE_CLOSE_RANGE] = "close_range",
	[STAGE_EXEC] = "exec",
};

/* The rlimits every run gets; values come from struct sbx_limits. Set before bwrap so
 * that they hold for every process of the tree. A core dump could hold a token. */
static const int rl_res[5] = { RLIMIT_NOFILE, RLIMIT_FSIZE, RLIMIT_CPU, RLIMIT_AS, RLIMIT_NPROC };

struct child_report {
	int stage;
	int err;
};

static void __attribute__((noreturn)) child_fail(int report_fd, int stage)
{
	struct child_report r = { .stage = stage, .err = errno };

	(void)!write(report_fd, &r, sizeof(r));
	_exit(127);
}

/* The child's first steps (sbx_child_exec's order): into the run's cgroup, under its
 * limits, with default signals, in a process group of its own. */
static void child_enter_limits(const struct child_plan *c)
{
	struct sigaction dfl = { .sa_handler = SIG_DFL };
	struct rlimit zero = { 0, 0 };
	sigset_t none;
	int i, sig;

	/* Into the run's cgroup first, so that everything the run does is counted there. */
	if (c->cgroup_fd >= 0 && write(c->cgroup_fd, "0", 1) != 1)
		child_fail(c->report_fd, STAGE_CGROUP);
	if (setrlimit(RLIMIT_CORE, &zero) < 0)
		child_fail(c->report_fd, STAGE_RLIMIT);
	for (i = 0; i < (int)ARRAY_SIZE(rl_res); i++)
		if (c->rl[i].rlim_cur && setrlimit(rl_res[i], &c->rl[i]) < 0)
			child_fail(c->report_fd, STAGE_RLIMIT);

	/* Ignored signals (SIGPIPE in the worker) and blocked masks survive exec: give the
	 * command the defaults it expects. */
	for (sig = 1; sig < NSIG; sig++)
		if (sig != SIGKILL && sig != SIGSTOP)
			(void)sigaction(sig, &dfl, NULL);
	sigemptyset(&none);
	if (sigprocmask(SIG_SETMASK, &none, NULL) < 0)
		child_fail(c->report_fd, STAGE_SIGNALS);
	/* Own process group: one kill reaches everything it starts. */
	if (setpgid(0, 0) < 0)
		child_fail(c->report_fd, STAGE_SETPGID);
}

/* The child's last step before exec: its descriptors, exactly the plan's slots. Returns
 * the report pipe's new number (above the slots, close-on-exec). */
static int child_place_fds(const struct child_plan *c)
{
	int tmp[SBX_FD_COUNT], report_fd, i;

	/* Move every source above the target slots first, so that dup2 onto 0..n cannot
	 * clobber a source still to be moved (the FastCGI listen socket is fd 0 here). */
	report_fd = fcntl(c->report_fd, F_DUPFD_CLOEXEC, SBX_FD_COUNT);
	if (report_fd < 0)
		child_fail(c->report_fd, STAGE_DUPFD);
	for (i = 0; i < c->nfds; i++) {
		tmp[i] = c->fds[i] < 0 ? -1 : fcntl(c->fds[i], F_DUPFD_CLOEXEC, SBX_FD_COUNT);
		if (c->fds[i] >= 0 && tmp[i] < 0)
			child_fail(report_fd, STAGE_DUPFD);
	}
	for (i = 0; i < c->nfds; i++) {
		/* An unused slot is closed: whatever of ours sits at that number (another
		 * thread's key file) must not reach bwrap. */
		if (tmp[i] < 0)
			(void)close(i);
		else if (dup2(tmp[i], i) < 0) /* dup2 clears close-on-exec on the target */
			child_fail(report_fd, STAGE_DUP2);
	}
	/* Nothing beyond our slots crosses exec: not the listen socket, not another
	 * request's connection, not a key file another thread has open. */
	if (close_range((unsigned)c->nfds, ~0U, CLOSE_RANGE_CLOEXEC) < 0) {
		struct rlimit rl;
		long fd, max = 65536;

		if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
		    (long)rl.rlim_cur < max)
			max = (long)rl.rlim_cur;
		for (fd = c->nfds; fd < max; fd++)
			if (fd != report_fd)
				(void)fcntl((int)fd, F_SETFD, FD_CLOEXEC);
	}
	return report_fd;
}

/* Runs in the forked child: async-signal-safe calls only, no allocation, no locks. The
 * lockdown's order, each step with its why; the helpers above are steps of it, in line. */
void __attribute__((noreturn)) sbx_child_exec(const struct child_plan *c)
{
	int report_fd;

	child_enter_limits(c);
	/* Into the run's user namespace, where bwrap will be root and the command the run's
	 * own host uid (ident.c). Before the death signal: changing credentials clears it. */
	if (c->userns_fd >= 0 && setns(c->userns_fd, CLONE_NEWUSER) < 0)
		child_fail(c->report_fd, STAGE_USERNS);
	/* Then into the run's loopback-only network namespace (netns.c), which that user
	 * namespace owns: only its root may join it, and bwrap, run without --unshare-net,
	 * builds the whole sandbox inside it. */
	if (c->netns_fd >= 0 && setns(c->netns_fd, CLONE_NEWNET) < 0)
		child_fail(c->report_fd, STAGE_NETNS);
	/* If the worker thread that started us dies, so do we (bwrap's --die-with-parent
	 * then takes the sandbox down). */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
		child_fail(c->report_fd, STAGE_PDEATHSIG);
	if (getppid() != c->parent)
		_exit(127);
	if (c->cwd_fd >= 0 && fchdir(c->cwd_fd) < 0)
		child_fail(c->report_fd, STAGE_CHDIR);
	report_fd = child_place_fds(c);
	execve(c->path, c->argv, c->envp);
	child_fail(report_fd, STAGE_EXEC);
}

/* vfork(): the parent sleeps until the child has exec'd (or failed), and no page table
 * is copied, which is slow on a paravirtualized VM (docs/performance.md).
 * The child shares our memory until exec, so it runs sbx_child_exec only: no allocation, no
 * lock, no return into this frame; signals are blocked around it so that no handler of
 * ours runs on the child's side, and the child restores the defaults before unblocking.
 * Other threads keep running meanwhile, as with posix_spawn(). */
static pid_t spawn_vfork(const struct child_plan *plan)
{
	/* Deliberate (see above): the child runs only sbx_child_exec, async-signal-safe calls. */
	pid_t pid = vfork(); /* NOLINT(clang-analyzer-security.insecureAPI.vfork) */

	/* It ends in exec or _exit. */
	if (pid == 0)
		sbx_child_exec(plan); /* NOLINT(clang-analyzer-unix.Vfork) */
	return pid;
}

/* Start the child per plan; fills r->pid/pidfd. On failure res gets the stage. */
int sbx_child_start(struct child_plan *plan, struct run *r, struct sbx_result *res)
{
	struct child_report rep;
	sigset_t all, old;
	int rp[2], ret = 0;
	ssize_t n;

	/* Non-blocking: vfork() returns only once the child has exec'd (past the point of
	 * no return) or exited, so a failure report is in the pipe by then or will never
	 * come. Waiting for EOF instead would wait for another CPU to run the exec on. */
	if (pipe2(rp, O_CLOEXEC | O_NONBLOCK) < 0) {
		res->spawn_stage = "pipe";
		return -errno;
	}
	plan->report_fd = rp[1];
	plan->parent = getpid();
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	r->pid = spawn_vfork(plan);
	if (r->pid < 0)
		ret = -errno;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r->pid < 0) {
		res->spawn_stage = "fork";
		goto out_close_pipe;
	}
	sbx_close_fd(&rp[1]);
	do
		n = read(rp[0], &rep, sizeof(rep));
	while (n < 0 && errno == EINTR);
	if (n == (ssize_t)sizeof(rep)) {
		ret = -rep.err;
		res->spawn_stage = rep.stage > 0 && rep.stage < (int)ARRAY_SIZE(stage_names)
					   ? stage_names[rep.stage]
					   : "child";
		res->failure = rep.stage == STAGE_EXEC && plan->exec_is_command ? SBX_FAIL_EXEC
			       : rep.stage == STAGE_NETNS			? SBX_FAIL_NETWORK
										: SBX_FAIL_SPAWN;
		while (waitpid(r->pid, NULL, 0) < 0 && errno == EINTR)
			;
		r->pid = -1;
		goto out_close_pipe;
	}
	r->pidfd = pidfd_open(r->pid, 0);
	if (r->pidfd < 0) {
		/* Without a pidfd we cannot supervise it safely: stop it now. */
		ret = -errno;
		res->spawn_stage = "pidfd_open";
		kill(r->pid, SIGKILL);
		while (waitpid(r->pid, NULL, 0) < 0 && errno == EINTR)
			;
		r->pid = -1;
	}
out_close_pipe:
	sbx_close_fd(&rp[0]);
	sbx_close_fd(&rp[1]);
	return ret;
}

void sbx_child_set_rlimits(struct child_plan *plan, const struct sbx_policy *p)
{
	const struct sbx_limits *l = &p->limits;
	uint64_t v[5] = {
		sbx_or_default(l->nofile, 4096),
		sbx_or_default(l->fsize_mb, 1024) << 20,
		sbx_or_default(l->cpu_s, p->timeout_ms ? p->timeout_ms / 1000 + 5 : 600),
		sbx_or_default(l->as_mb, 8192) << 20,
		/* RLIMIT_NPROC counts a real uid's processes. With a uid per run the stub sets
		 * it as it takes that uid; here it would count the worker's (bwrap's). */
		sbx_g.ident == SBX_IDENTITY_PER_RUN ? 0
						    : sbx_or_default(l->nproc, SBX_DEFAULT_PIDS),
	};

	for (size_t i = 0; i < ARRAY_SIZE(v); i++)
		plan->rl[i].rlim_cur = plan->rl[i].rlim_max = (rlim_t)v[i];
}

void sbx_child_plan_init(struct child_plan *plan)
{
	*plan = (struct child_plan){
		.cwd_fd = -1, .cgroup_fd = -1, .userns_fd = -1, .netns_fd = -1
	};
	for (size_t i = 0; i < SBX_FD_COUNT; i++)
		plan->fds[i] = -1;
}

static void close_plan_fds(struct child_plan *plan, int from, int to)
{
	for (int i = from; i < to; i++)
		sbx_close_fd(&plan->fds[i]);
}

/* The inputs the plan owns (bwrap's filter, passwd, /etc and bound files); not the uid
 * slot's lock, which is the identity's, nor the pipes' ends, which are the caller's. */
void sbx_child_plan_close_inputs(struct child_plan *plan)
{
	close_plan_fds(plan, SBX_FD_SECCOMP, SBX_FD_SYNC);
	close_plan_fds(plan, SBX_FD_FILE0, SBX_FD_COUNT);
}
