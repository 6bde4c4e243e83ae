/* Spawning and supervising one run.
 *
 * Everything the child needs (argv, envp, descriptors) is built in the parent before
 * vfork(); the child runs child_exec(), a short straight line of async-signal-safe calls,
 * and reports a failure as {stage, errno} over a close-on-exec pipe before _exit(127).
 * Nothing in that pipe once vfork() returns means exec succeeded (git's run-command.c
 * waits for EOF to learn the same after fork()).
 *
 * The parent then supervises the run (one state machine, see "supervision" below): it
 * polls the child's stdout and stderr, feeds its stdin, watches a pidfd for its exit,
 * bwrap's status fd, a wall-clock deadline, and optionally a hangup fd (the FastCGI
 * connection). Whether the command ran at all is learnt from bwrap's status and from
 * olp-sandbox-exec's own report, never from what they print (learn_failure). Any way the
 * run ends, the whole tree is killed and reaped before the scratch directory is
 * removed. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/close_range.h>

#include "common/common.h"
#include "sandbox/instance.h"
#include "common/banned.h"

/* The steps of child_exec, named in spawn failures. */
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

/* What child_exec needs; all of it prepared before fork(). */
struct child_plan {
	const char *path;
	char *const *argv;
	char *const *envp;
	int fds[SBX_FD_COUNT]; /* fds[i] becomes fd i in the child */
	int nfds;
	struct rlimit rl[5];  /* applied in rl_res order */
	int cwd_fd;	      /* fchdir here, or -1 */
	int cgroup_fd;	      /* the run cgroup's cgroup.procs, or -1 */
	int userns_fd;	      /* the run's user namespace to join before exec, or -1 */
	int netns_fd;	      /* SBX_NET_LOOPBACK: the run's network namespace, or -1 */
	bool exec_is_command; /* path is the command itself (mode off), not bwrap */
	int report_fd;
	pid_t parent;
};

static void __attribute__((noreturn)) child_fail(int report_fd, int stage)
{
	struct child_report r = { .stage = stage, .err = errno };

	(void)!write(report_fd, &r, sizeof(r));
	_exit(127);
}

/* Runs in the forked child: async-signal-safe calls only, no allocation, no locks. */
static void __attribute__((noreturn)) child_exec(const struct child_plan *c)
{
	struct sigaction dfl = { .sa_handler = SIG_DFL };
	struct rlimit zero = { 0, 0 };
	sigset_t none;
	int tmp[SBX_FD_COUNT], report_fd, i, sig;

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
	execve(c->path, c->argv, c->envp);
	child_fail(report_fd, STAGE_EXEC);
}

static void close_fd(int *fd)
{
	if (*fd >= 0) {
		close(*fd);
		*fd = -1;
	}
}

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

/* One supervised process and the parent's ends of its pipes. */

/* vfork(): the parent sleeps until the child has exec'd (or failed), and no page table
 * is copied, which is slow on a paravirtualized VM (docs/performance.md).
 * The child shares our memory until exec, so it runs child_exec only: no allocation, no
 * lock, no return into this frame; signals are blocked around it so that no handler of
 * ours runs on the child's side, and the child restores the defaults before unblocking.
 * Other threads keep running meanwhile, as with posix_spawn(). */
static pid_t spawn_vfork(const struct child_plan *plan)
{
	/* Deliberate (see above): the child runs only child_exec, async-signal-safe calls. */
	pid_t pid = vfork(); /* NOLINT(clang-analyzer-security.insecureAPI.vfork) */

	if (pid == 0)
		child_exec(plan); /* NOLINT(clang-analyzer-unix.Vfork): it ends in exec or _exit */
	return pid;
}

/* Start the child per plan; fills r->pid/pidfd. On failure res gets the stage. */
static int start_child(struct child_plan *plan, struct run *r, struct sbx_result *res)
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
	close_fd(&rp[1]);
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
	close_fd(&rp[0]);
	close_fd(&rp[1]);
	return ret;
}

static void keep_stderr(struct sbx_result *res, const char *data, size_t len)
{
	size_t cap = sizeof(res->stderr_tail) - 1, have = strlen(res->stderr_tail);

	if (len >= cap) {
		memcpy(res->stderr_tail, data + len - cap, cap);
		res->stderr_tail[cap] = '\0';
		return;
	}
	if (have + len > cap) {
		size_t drop = have + len - cap;

		memmove(res->stderr_tail, res->stderr_tail + drop, have - drop);
		have -= drop;
	}
	memcpy(res->stderr_tail + have, data, len);
	res->stderr_tail[have + len] = '\0';
}

/* bwrap reports {"child-pid": N} once the sandbox's init exists; we keep a pidfd on it so
 * that a kill reaches the whole pid namespace and we can wait for it to be gone. */
static void parse_status(struct run *r)
{
	const char *p = strstr(r->status.data, "\"child-pid\"");
	long pid;

	if (p && r->ns_pidfd < 0 && (p = strchr(p, ':'))) {
		pid = strtol(p + 1, NULL, 10);
		if (pid > 0 && pid <= INT_MAX)
			r->ns_pidfd = pidfd_open((pid_t)pid, 0);
	}
	/* bwrap writes the command's exit code as soon as it knows it, before it exits
	 * itself: the result is known that much earlier. */
	p = strstr(r->status.data, "\"exit-code\"");
	if (p && !r->exit_known && (p = strchr(p, ':')) && strchr(p, '}')) {
		long code = strtol(p + 1, NULL, 10);

		/* An exit status is 0-255; anything else is not bwrap's report. */
		r->exit_code = code >= 0 && code <= 255 ? (int)code : 255;
		r->exit_known = true;
	}
}

/* Learn the sandbox's init from bwrap's status fd if we have not yet (a warm sandbox that
 * was never used). Killing only bwrap while its init waits to be set up would leave that
 * init blocked for ever, outside our reach. */
static void learn_ns_init(struct run *r)
{
	struct pollfd pfd = { .fd = r->status_fd, .events = POLLIN };

	for (int i = 0; i < 20 && r->ns_pidfd < 0 && r->status_fd >= 0 && r->pid > 0 && !r->reaped;
	     i++) {
		ssize_t n;

		if (poll(&pfd, 1, 10) <= 0)
			continue;
		n = buf_read_once(&r->status, r->status_fd, 512);
		if (n <= 0 && n != -EAGAIN)
			break;
		parse_status(r);
	}
}

static void kill_tree(struct run *r)
{
	learn_ns_init(r);
	if (r->ns_pidfd >= 0)
		pidfd_send_signal(r->ns_pidfd, SIGKILL, NULL, 0);
	if (r->pid > 0 && !r->reaped) {
		kill(-r->pid, SIGKILL);
		pidfd_send_signal(r->pidfd, SIGKILL, NULL, 0);
	}
	/* Everything of the run at once, however fast it forks. */
	sbx_cgroup_kill(&r->cg);
}

static void reap(struct run *r)
{
	if (r->reaped || r->pid <= 0)
		return;
	while (waitpid(r->pid, &r->wstatus, 0) < 0 && errno == EINTR)
		;
	r->reaped = true;
}

/* Wait until the sandbox's pid namespace is gone: its init exits only after every other
 * process in it has been killed and reaped by the kernel. */
static void wait_ns_gone(struct run *r)
{
	struct pollfd pfd;

	if (r->ns_pidfd < 0)
		return;
	pfd.fd = r->ns_pidfd;
	pfd.events = POLLIN;
	/* A fork bomb of a few hundred processes takes seconds to die on a slow VM; the
	 * scratch dir must outlive all of them, so wait up to 60 s (SIGKILL was sent). */
	for (int i = 0; i < 600; i++) {
		if (poll(&pfd, 1, 100) != 0)
			break;
		pidfd_send_signal(r->ns_pidfd, SIGKILL, NULL, 0);
	}
}

/* ---- supervision ------------------------------------------------------------------------
 * One state machine:
 *
 *   RUNNING ──bwrap reports the command's exit code──▶ COLLECTING ──▶ DONE
 *      │                                       (what is in the pipes, at most 1 s)
 *      ├──deadline, hangup, on_stdout ≠ 0──▶ DRAINING ──EOF on both pipes, reaped──▶ DONE
 *      │                       (tree killed; output read and dropped; 1 s once reaped)
 *      ├──EOF on both pipes and the process reaped──▶ DONE
 *      │   (reaped with a pipe still held, no pid namespace: 1 s more, then DONE)
 *      └──poll fails──▶ DONE
 *
 * How we ended a run is decided in one place, sv_end(), for the first reason that comes;
 * a run we did not end ended by itself. sv_finish() then fills sbx_result, once: the exit
 * status or signal, and whether the command ran at all (learn_failure). */

#define SV_DRAIN_MS 1000 /* reading what is left after the end, at most */

enum sv_state {
	SV_RUNNING,    /* stdin fed, output handed on, the end awaited */
	SV_COLLECTING, /* the command exited: take what is in the pipes, then stop */
	SV_DRAINING,   /* ended by us: the tree is killed, what is left is read and dropped */
	SV_DONE,
};

struct supervisor {
	struct run *r;
	const char *rid; /* the request id log lines name, or NULL */
	const struct sbx_callbacks *cb;
	struct sbx_result *res;
	struct buf chunk;
	const char *in_data; /* stdin still to write */
	size_t in_left;
	int hup_fd;
	uint64_t start, deadline; /* deadline 0: none */
	uint64_t drain_until;	  /* once the process is reaped: stop reading then */
	enum sv_state state;
	enum sbx_end end; /* SBX_END_EXITED unless sv_end decided otherwise */
};

enum { PF_OUT, PF_ERR, PF_IN, PF_PID, PF_STATUS, PF_HUP, PF_N };

static bool readable(int fd)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };

	return poll(&pfd, 1, 0) > 0;
}

/* Read once from the command's stderr into the result's tail. Bytes read, 0 at EOF (the
 * fd is then closed), -EAGAIN when there is nothing. */
static ssize_t read_err(struct run *r, struct buf *chunk, struct sbx_result *res)
{
	ssize_t s;

	buf_reset(chunk);
	s = buf_read_once(chunk, r->err_fd, 4096);
	if (s > 0)
		keep_stderr(res, chunk->data, (size_t)s);
	else if (s != -EAGAIN)
		close_fd(&r->err_fd);
	return s;
}

/* Read once from the command's stdout and hand it to cb (NULL: read and drop, the run is
 * ending). True when the callback ends the run (*end says how). */
static bool read_out(struct run *r, struct buf *chunk, const struct sbx_callbacks *cb,
		     struct sbx_result *res, enum sbx_end *end)
{
	ssize_t s;
	int rc;

	buf_reset(chunk);
	s = buf_read_once(chunk, r->out_fd, 65536);
	if (s <= 0) {
		if (s != -EAGAIN)
			close_fd(&r->out_fd);
		return false;
	}
	res->stdout_bytes += (size_t)s;
	if (!cb || !cb->on_stdout)
		return false;
	rc = cb->on_stdout(cb->ctx, chunk->data, (size_t)s);
	if (!rc)
		return false;
	*end = rc > 0 ? SBX_END_STOPPED : SBX_END_ABORTED;
	return true;
}

/* bwrap's status fd: the sandbox's init, then the command's exit code. */
static void read_status(struct run *r)
{
	ssize_t s = buf_read_once(&r->status, r->status_fd, 512);

	if (s <= 0 && s != -EAGAIN)
		close_fd(&r->status_fd);
	else
		parse_status(r);
}

/* End the run now, for reason end, unless it is ending already: the first reason is the
 * one. The tree is killed (in COLLECTING it was already); what it wrote meanwhile is read
 * and dropped. */
static void sv_end(struct supervisor *s, enum sbx_end end)
{
	if (s->state != SV_RUNNING && s->state != SV_COLLECTING)
		return;
	if (s->state == SV_RUNNING)
		kill_tree(s->r);
	s->end = end;
	s->state = SV_DRAINING;
}

/* Read once from stdout; while the run is on, the caller gets it and may end the run. */
static void sv_read_out(struct supervisor *s)
{
	bool deliver = s->state == SV_RUNNING || s->state == SV_COLLECTING;
	enum sbx_end end;

	if (read_out(s->r, &s->chunk, deliver ? s->cb : NULL, s->res, &end))
		sv_end(s, end);
}

static void sv_feed_stdin(struct supervisor *s)
{
	struct run *r = s->r;
	ssize_t w = write(r->in_fd, s->in_data, s->in_left);

	if (w > 0) {
		s->in_data += w;
		s->in_left -= (size_t)w;
	}
	/* EPIPE: the command does not read its stdin; that is its business. */
	if (!s->in_left || (w < 0 && errno != EAGAIN && errno != EINTR))
		close_fd(&r->in_fd);
}

/* bwrap has the command's exit code, so everything the command wrote is in the pipes (a
 * write returns only once the pipe holds it): take what is there and stop. Waiting for EOF
 * would wait for the sandbox's processes to exit, a millisecond or more; whatever the
 * command left running is killed, and the sandbox ends with the command, as bwrap's own
 * pid 1 does. */
static void sv_collect(struct supervisor *s)
{
	struct run *r = s->r;
	uint64_t until = mono_ms() + SV_DRAIN_MS;

	/* Killed first, so that a child left writing cannot keep the pipe full for ever; what
	 * is in the pipes stays there to be read. */
	kill_tree(r);
	while (r->err_fd >= 0 && readable(r->err_fd) && mono_ms() < until)
		read_err(r, &s->chunk, s->res);
	while (s->state == SV_COLLECTING && r->out_fd >= 0 && readable(r->out_fd) &&
	       mono_ms() < until)
		sv_read_out(s);
	close_fd(&r->err_fd);
	close_fd(&r->out_fd);
	s->state = SV_DONE;
}

/* The transitions that need no poll: the run is over, the command's exit is known, the
 * reaped process's pipes have had their time, or the deadline has passed. */
static void sv_check(struct supervisor *s, uint64_t now)
{
	struct run *r = s->r;

	if (r->out_fd < 0 && r->err_fd < 0 && (r->reaped || r->exit_known)) {
		s->state = SV_DONE;
		return;
	}
	if (r->exit_known && s->state == SV_RUNNING) {
		s->state = SV_COLLECTING;
		return;
	}
	if (r->reaped && !s->drain_until) {
		/* The command is gone but something it started still holds a pipe (only
		 * possible without bwrap's pid namespace): kill the group and drain briefly. */
		kill(-r->pid, SIGKILL);
		s->drain_until = now + SV_DRAIN_MS;
	}
	if (s->drain_until && now >= s->drain_until) {
		s->state = SV_DONE;
		return;
	}
	if (s->state == SV_RUNNING && s->deadline && now >= s->deadline)
		sv_end(s, SBX_END_TIMEOUT);
}

static int sv_timeout(const struct supervisor *s, uint64_t now)
{
	uint64_t until = s->drain_until;

	if (!until && s->state == SV_RUNNING)
		until = s->deadline;
	if (!until)
		return -1;
	/* sv_check ended the run at either time: both lie ahead. */
	return until - now > INT_MAX ? INT_MAX : (int)(until - now);
}

static void sv_poll(struct supervisor *s, uint64_t now)
{
	struct run *r = s->r;
	struct pollfd pfd[PF_N] = {
		[PF_OUT] = { .fd = r->out_fd, .events = POLLIN },
		[PF_ERR] = { .fd = r->err_fd, .events = POLLIN },
		[PF_IN] = { .fd = r->in_fd, .events = POLLOUT },
		[PF_PID] = { .fd = r->reaped ? -1 : r->pidfd, .events = POLLIN },
		[PF_STATUS] = { .fd = r->status_fd, .events = POLLIN },
		/* Ended already: the client's going away changes nothing. */
		[PF_HUP] = { .fd = s->state == SV_RUNNING ? s->hup_fd : -1, .events = POLLRDHUP },
	};

	if (poll(pfd, PF_N, sv_timeout(s, now)) < 0) {
		if (errno == EINTR)
			return;
		log_err(s->rid, "sandbox: poll");
		sv_end(s, SBX_END_ABORTED);
		reap(r);
		s->state = SV_DONE;
		return;
	}
	if (pfd[PF_HUP].revents & (POLLRDHUP | POLLHUP | POLLERR))
		sv_end(s, SBX_END_ABORTED);
	if (pfd[PF_IN].revents & (POLLOUT | POLLERR | POLLHUP))
		sv_feed_stdin(s);
	if (pfd[PF_STATUS].revents)
		read_status(r);
	if (pfd[PF_ERR].revents)
		read_err(r, &s->chunk, s->res);
	if (pfd[PF_OUT].revents)
		sv_read_out(s);
	if (pfd[PF_PID].revents)
		reap(r);
}

/* What olp-sandbox-exec's report names each step (stub.h), and what its failure means. */
static const struct {
	const char *name;
	enum sbx_failure failure;
} stub_stages[SBX_STUB_STAGES] = {
	[SBX_STUB_ARGS] = { "olp-sandbox-exec arguments", SBX_FAIL_SETUP },
	[SBX_STUB_CHOWN] = { "chown home", SBX_FAIL_IDENTITY },
	[SBX_STUB_CAPBSET] = { "bounding set", SBX_FAIL_IDENTITY },
	[SBX_STUB_SETGROUPS] = { "setgroups", SBX_FAIL_IDENTITY },
	[SBX_STUB_SETGID] = { "setresgid", SBX_FAIL_IDENTITY },
	[SBX_STUB_NPROC] = { "rlimit nproc", SBX_FAIL_IDENTITY },
	[SBX_STUB_SETUID] = { "setresuid", SBX_FAIL_IDENTITY },
	[SBX_STUB_CAPSET] = { "capset", SBX_FAIL_IDENTITY },
	[SBX_STUB_VERIFY] = { "drop", SBX_FAIL_IDENTITY },
	[SBX_STUB_EXEC] = { "execve", SBX_FAIL_EXEC },
	[SBX_STUB_ENV] = { "environment", SBX_FAIL_SETUP },
};

/* The run ended with an exit status: did the command run at all? Two reports say, neither
 * of them text. bwrap writes {"exit-code": N} on its status fd only when it built the
 * sandbox and exec'd its first program, olp-sandbox-exec (its setup finished and its
 * execvp succeeded); without it, bwrap failed. olp-sandbox-exec writes {stage, errno} on
 * its report fd only when it could not become the command. bwrap reports the exit code
 * after the stub's process ended, and the stub reports before it exits, so both reports
 * are complete by now: nothing here waits. */
static void learn_failure(struct run *r, struct sbx_result *res)
{
	struct sbx_stub_report rep;

	/* What bwrap wrote before it exited is in the pipe, read or not. */
	while (!r->exit_known && r->status_fd >= 0 &&
	       buf_read_once(&r->status, r->status_fd, 512) > 0)
		parse_status(r);
	if (!r->exit_known) {
		res->failure = SBX_FAIL_SETUP;
		res->spawn_stage = "bwrap";
		return;
	}
	if (r->report_fd < 0 || read(r->report_fd, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
		return;
	if (rep.stage <= 0 || rep.stage >= SBX_STUB_STAGES || !stub_stages[rep.stage].name)
		rep.stage = SBX_STUB_ARGS;
	res->failure = stub_stages[rep.stage].failure;
	res->spawn_stage = stub_stages[rep.stage].name;
	res->spawn_errno = rep.err;
}

/* The run is over: fill the result, once, and tell the caller. */
static void sv_finish(struct supervisor *s, bool bwrap)
{
	struct run *r = s->r;
	struct sbx_result *res = s->res;
	bool exit_known = s->end == SBX_END_EXITED && r->exit_known;

	/* Anything the command left running is killed; nothing more is read. bwrap itself is
	 * reaped now unless it has told us the exit code (then in sbx_instance_release). */
	kill_tree(r);
	if (!exit_known)
		reap(r);
	res->end = s->end;
	if (exit_known) {
		res->exit_status = r->exit_code;
	} else if (s->end == SBX_END_EXITED && WIFSIGNALED(r->wstatus)) {
		res->end = SBX_END_SIGNALED;
		res->term_signal = WTERMSIG(r->wstatus);
	} else if (WIFEXITED(r->wstatus)) {
		res->exit_status = WEXITSTATUS(r->wstatus);
	}
	res->duration_ms = mono_ms() - s->start;
	if (bwrap && res->end == SBX_END_EXITED)
		learn_failure(r, res);
	if (s->cb && s->cb->on_result)
		s->cb->on_result(s->cb->ctx, res);
}

/* Supervise the started run r until it is over and its result known (see above). The
 * namespace's teardown is waited for later (sbx_instance_release), off the client's path. */
static void supervise(struct run *r, const struct sbx_policy *p, const struct sbx_run_options *opt,
		      const struct sbx_callbacks *cb, struct sbx_result *res, bool bwrap)
{
	struct supervisor s = {
		.r = r,
		.rid = opt ? opt->request_id : NULL,
		.cb = cb,
		.res = res,
		.chunk = BUF_INIT,
		.in_data = opt ? opt->stdin_data : NULL,
		.hup_fd = opt ? opt->hangup_fd : -1,
		.start = mono_ms(),
		.state = SV_RUNNING,
		.end = SBX_END_EXITED,
	};

	s.in_left = s.in_data ? opt->stdin_len : 0;
	s.deadline = p->timeout_ms ? s.start + p->timeout_ms : 0;
	if (!s.in_left)
		close_fd(&r->in_fd);
	while (s.state != SV_DONE) {
		uint64_t now = mono_ms();

		sv_check(&s, now);
		if (s.state == SV_COLLECTING)
			sv_collect(&s);
		else if (s.state != SV_DONE)
			sv_poll(&s, now);
	}
	sv_finish(&s, bwrap);
	buf_release(&s.chunk);
}

static void run_close(struct run *r)
{
	close_fd(&r->in_fd);
	close_fd(&r->out_fd);
	close_fd(&r->err_fd);
	close_fd(&r->status_fd);
	close_fd(&r->report_fd);
	close_fd(&r->pidfd);
	close_fd(&r->ns_pidfd);
	buf_release(&r->status);
}

int sbx_data_fd(const char *text)
{
	return sbx_data_fd_n(text, strlen(text));
}

int sbx_data_fd_n(const void *data, size_t len)
{
	int fd = memfd_create("olp-data", MFD_CLOEXEC | MFD_ALLOW_SEALING), ret;

	if (fd < 0)
		return -errno;
	ret = write_all(fd, data, len);
	if (!ret && (lseek(fd, 0, SEEK_SET) < 0 ||
		     fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) < 0))
		ret = -errno;
	if (ret) {
		close(fd);
		return ret;
	}
	return fd;
}

static void set_rlimits(struct child_plan *plan, const struct sbx_policy *p)
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

/* One pipe of a run: *child gets the end the child reads (child_end_is_read) or writes,
 * *parent the other, non-blocking. Both close-on-exec; the child's dup2 clears it. */
static int make_pipe(int child_end_is_read, int *child, int *parent)
{
	int p[2];

	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	*child = child_end_is_read ? p[0] : p[1];
	*parent = child_end_is_read ? p[1] : p[0];
	return set_nonblock(*parent);
}

/* Credentials are small: a file bigger than this is not copied in or back. */
#define COPY_MAX (1u << 20)

static int read_small(const char *path, struct buf *b)
{
	return buf_read_file(b, path, COPY_MAX);
}

/* Copy the host file of bind k into the scratch dir for the run to write (mode 0666 in a
 * directory only the worker can enter: the run's uid needs "other" write access). */
static int make_copy(struct instance *in, const char *host, int n)
{
	struct copy *c = &in->copies[in->ncopies];
	struct buf b = BUF_INIT, path = BUF_INIT;
	struct stat st;
	int fd, ret;

	/* No scratch dir to put it in (sbx_exec_in_place). */
	if (!in->scratch.path[0])
		return -EINVAL;
	c->host = realpath(host, NULL);
	if (!c->host)
		return -errno;
	buf_addf(&path, "%s/copy-%d", in->scratch.path, n);
	c->path = buf_detach(&path, NULL);
	in->ncopies++;
	if ((ret = read_small(c->host, &b)))
		goto out_release_buf;
	fd = open(c->path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		ret = -errno;
		goto out_release_buf;
	}
	ret = write_all(fd, b.data, b.len);
	if (!ret && (fchmod(fd, 0666) < 0 || fstat(fd, &st) < 0))
		ret = -errno;
	if (!ret)
		c->ctime = st.st_ctim;
	close(fd);
out_release_buf:
	buf_release(&b);
	return ret;
}

/* The run wrote its copy: replace the host file with it, atomically (a temporary file
 * beside it, then rename), keeping its mode. Called once the run's processes are gone. */
static void write_back(const struct copy *c, const char *rid)
{
	struct buf b = BUF_INIT, tmp = BUF_INIT;
	struct stat st, hst;
	const char *why = NULL;
	char rnd[17];
	int fd = -1, ret;

	if (stat(c->path, &st) < 0 ||
	    (st.st_ctim.tv_sec == c->ctime.tv_sec && st.st_ctim.tv_nsec == c->ctime.tv_nsec))
		return;
	random_hex(rnd, 8);
	buf_addf(&tmp, "%s.olp-%s", c->host, rnd);
	ret = read_small(c->path, &b);
	/* The caller's verdict on what the run left: a refusal keeps the host file. */
	if (!ret && c->check && !c->check(c->inside, b.data, b.len, &why)) {
		log_warnx(rid, "sandbox: a run's changes to %s were not kept: %s", c->host,
			  why ? why : "refused");
		goto out_release;
	}
	if (!ret && stat(c->host, &hst) < 0)
		ret = -errno;
	if (!ret) {
		fd = open(tmp.data, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
			  hst.st_mode & 07777);
		ret = fd < 0 ? -errno : write_all(fd, b.data, b.len);
	}
	if (!ret && (fchmod(fd, hst.st_mode & 07777) < 0 || fsync(fd) < 0))
		ret = -errno;
	if (fd >= 0)
		close(fd);
	if (!ret && rename(tmp.data, c->host) < 0)
		ret = -errno;
	if (ret) {
		unlink(tmp.data);
		log_warnx(rid, "sandbox: a run's changes to %s were not kept: %s", c->host,
			  strerror(-ret));
	}
out_release:
	buf_release(&tmp);
	buf_release(&b);
}

/* Open the files and make the copies the bind plan names; the fds go to plan slots. */
static int prepare_binds(const struct sbx_policy *p, const struct sbx_inputs *in,
			 struct instance *inst, struct child_plan *plan)
{
	size_t nro = p->bind_ro.n / 2;
	int ret = 0;

	inst->copies = in->nbinds ? xcalloc(in->nbinds, sizeof(*inst->copies)) : NULL;
	for (size_t k = 0; !ret && k < in->nbinds; k++) {
		const struct sbx_bind_plan *b = &in->binds[k];
		const char *host = k < nro ? p->bind_ro.v[2 * k] : p->bind_rw.v[2 * (k - nro)];
		struct stat st;
		int fd;

		if (b->how == SBX_BIND_COPY) {
			size_t at = inst->ncopies;

			ret = make_copy(inst, host, b->file);
			/* What decides the write-back goes with the copy: a warm instance is
			 * released under another policy object than the one that made it. */
			if (inst->ncopies > at) {
				inst->copies[at].inside = xstrdup(p->bind_rw.v[2 * (k - nro) + 1]);
				inst->copies[at].check =
					p->rw_checks ? p->rw_checks[k - nro] : NULL;
			}
		} else if (b->how == SBX_BIND_FILE) {
			fd = open(host, O_RDONLY | O_CLOEXEC | O_NOCTTY);
			if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
				ret = fd < 0 ? -errno : -EINVAL;
				if (fd >= 0)
					close(fd);
				break;
			}
			plan->fds[SBX_FD_FILE0 + b->file] = fd;
		}
	}
	return ret;
}

static void close_plan_fds(struct child_plan *plan, int from, int to)
{
	for (int i = from; i < to; i++)
		close_fd(&plan->fds[i]);
}

/* bwrap's fixed inputs: the filter, passwd and group, the /etc copies. */
/* The command's environment as the stub reads it (stub.h, SBX_ENV_PATH). fd or -errno. */
static int env_fd(const struct sbx_policy *p)
{
	struct buf b = BUF_INIT;
	int fd;

	for (size_t i = 0; i < p->env.n; i++)
		buf_add(&b, p->env.v[i], strlen(p->env.v[i]) + 1);
	if (b.len > SBX_ENV_MAX) {
		buf_release(&b);
		return -E2BIG;
	}
	if (!b.len)
		return sbx_data_fd_n("", 0);
	fd = sbx_data_fd_n(b.data, b.len);
	/* The copy in the memfd is the one that counts: wipe ours (it may hold a key). */
	explicit_bzero(b.data, b.len);
	buf_release(&b);
	return fd;
}

static int prepare_bwrap_inputs(const struct sbx_policy *p, struct child_plan *plan,
				struct sbx_inputs *in, struct sbx_result *res)
{
	int etc[SBX_ETC_FILES];

	plan->fds[SBX_FD_SECCOMP] = sbx_seccomp_fd();
	if (plan->fds[SBX_FD_SECCOMP] < 0) {
		res->spawn_stage = "seccomp";
		return plan->fds[SBX_FD_SECCOMP];
	}
	plan->fds[SBX_FD_PASSWD] = sbx_data_fd(SBX_PASSWD_TEXT);
	plan->fds[SBX_FD_GROUP] = sbx_data_fd(SBX_GROUP_TEXT);
	if (plan->fds[SBX_FD_PASSWD] < 0 || plan->fds[SBX_FD_GROUP] < 0) {
		res->spawn_stage = "passwd";
		return plan->fds[SBX_FD_PASSWD] < 0 ? plan->fds[SBX_FD_PASSWD]
						    : plan->fds[SBX_FD_GROUP];
	}
	in->etc_mask = sbx_etc_open(etc);
	for (size_t i = 0; i < SBX_ETC_FILES; i++)
		plan->fds[SBX_FD_ETC0 + i] = etc[i];
	plan->fds[SBX_FD_ENV] = env_fd(p);
	if (plan->fds[SBX_FD_ENV] < 0) {
		res->spawn_stage = "environment";
		return plan->fds[SBX_FD_ENV];
	}
	return 0;
}

/* The inputs the plan owns (bwrap's filter, passwd, /etc and bound files); not the uid
 * slot's lock, which is the identity's, nor the pipes' ends, which are the caller's. */
static void close_plan_inputs(struct child_plan *plan)
{
	close_plan_fds(plan, SBX_FD_SECCOMP, SBX_FD_SYNC);
	close_plan_fds(plan, SBX_FD_FILE0, SBX_FD_COUNT);
}

static void plan_init(struct child_plan *plan)
{
	*plan = (struct child_plan){
		.cwd_fd = -1, .cgroup_fd = -1, .userns_fd = -1, .netns_fd = -1
	};
	for (size_t i = 0; i < SBX_FD_COUNT; i++)
		plan->fds[i] = -1;
}

/* bwrap for argv under p (argv NULL: a warm sandbox, whose stub waits for its command):
 * the bind plan and the files it opens, the filter, passwd, group and /etc copies, the
 * command line, the uid slot. stdio, status and report are the caller's to place. */
static int plan_bwrap(const struct sbx_policy *p, const char *const argv[], struct instance *in,
		      struct sbx_inputs *inputs, struct child_plan *plan, struct strv *args,
		      struct sbx_result *res)
{
	static char *const no_env[] = { NULL }; /* the command's is SBX_ENV_PATH (stub.h) */
	int ret;

	inputs->sync = in->id.lock_fd >= 0;
	ret = sbx_plan_binds(p, &inputs->binds, &inputs->nbinds) ?:
		prepare_bwrap_inputs(p, plan, inputs, res) ?:
		prepare_binds(p, inputs, in, plan);
	if (ret)
		return ret;
	sbx_build_bwrap_argv(p, inputs, argv, args);
	plan->path = args->v[0];
	plan->argv = args->v;
	plan->envp = no_env;
	plan->fds[SBX_FD_SYNC] = inputs->sync ? in->id.lock_fd : -1;
	plan->nfds = SBX_FD_COUNT;
	plan->userns_fd = in->id.userns_fd;
	return 0;
}

/* Mode off: the command itself, in the scratch home, which is its HOME at its host path. */
static void plan_direct(const struct sbx_policy *p, const char *const argv[],
			const struct instance *in, struct child_plan *plan, struct strv *args,
			struct strv *envp)
{
	for (size_t i = 0; argv[i]; i++)
		strv_push(args, argv[i]);
	sbx_build_envp(p, envp);
	(void)strv_setenv(envp, "HOME", in->scratch.home);
	plan->path = args->v[0];
	plan->argv = args->v;
	plan->envp = envp->v;
	plan->nfds = 3;
	plan->cwd_fd = in->scratch.home_fd;
	plan->exec_is_command = true;
}

/* A SBX_NET_LOOPBACK run's namespace, owned by the run's user namespace (netns.c), so
 * that the child, once it has joined that user namespace, may join this one too. No
 * namespace, no run: a run never gets more network than its policy says (fail closed). */
static int make_netns(const struct sbx_policy *p, struct instance *in, const char *rid,
		      struct sbx_result *res)
{
	int ret;

	/* Identity shared: the run has no user namespace of its own; the namespace gets one
	 * made for it, which the child joins instead, and bwrap nests its own inside. */
	if (in->id.userns_fd < 0)
		ret = sbx_netns_init_userns(&in->ns, &in->ns_userns_fd, p->net_port);
	else
		ret = sbx_netns_init(&in->ns, in->id.userns_fd, p->net_port);
	if (ret) {
		log_warnx(rid, "sandbox: no network namespace for the run: %s", strerror(-ret));
		res->spawn_stage = "netns";
		res->failure = SBX_FAIL_NETWORK;
	}
	return ret;
}

/* Hand a SBX_NET_LOOPBACK run's listener to the caller, who owns it from then on. Before
 * the command starts; a refusal means nothing runs. 0 or -errno. */
static int hand_listener(struct instance *in, const struct sbx_callbacks *cb,
			 struct sbx_result *res)
{
	int fd = in->ns.listen_fd, ret;

	in->ns.listen_fd = -1;
	if (cb && cb->on_listener) {
		ret = cb->on_listener(cb->ctx, fd, in->ns.port);
		ret = ret < 0 ? ret : 0;
	} else {
		close(fd);
		ret = -EINVAL;
	}
	if (ret) {
		res->spawn_stage = "listener";
		res->failure = SBX_FAIL_NETWORK;
	}
	return ret;
}

/* What a run holds while it exists: its scratch dir, its cgroup, with bwrap its own uid,
 * and its network namespace when the policy asks for loopback. Limits, a uid of its own
 * and a network namespace were promised: without them, no run (fail closed). */
static int take_resources(const struct sbx_policy *p, bool bwrap, struct instance *in,
			  const char *rid, struct sbx_result *res)
{
	int ret = sbx_scratch_create(&in->scratch);

	if (ret) {
		res->spawn_stage = "scratch";
		return ret;
	}
	ret = sbx_cgroup_create(&in->r.cg, in->scratch.name, &p->limits, rid);
	if (ret) {
		res->spawn_stage = "cgroup";
		return ret;
	}
	if (bwrap && (ret = sbx_ident_acquire(&in->id, rid))) {
		res->spawn_stage = "identity";
		return ret;
	}
	if (bwrap && p->net == SBX_NET_LOOPBACK)
		ret = make_netns(p, in, rid, res);
	return ret;
}

/* The child's ends of a run's pipes, by what they carry. */
enum { END_IN, END_OUT, END_ERR, END_STATUS, END_REPORT, END_N };

/* The run's pipes: ours go to r, the child's to ends (the caller closes them once the
 * child has them). olp-sandbox passes its own stdin and stderr instead. */
static int make_pipes(const struct sbx_run_options *opt, bool bwrap, struct run *r, int ends[END_N])
{
	int ret = 0;

	if (!(opt && opt->pass_stdin))
		ret = make_pipe(1, &ends[END_IN], &r->in_fd);
	if (!ret)
		ret = make_pipe(0, &ends[END_OUT], &r->out_fd);
	if (!ret && !(opt && opt->pass_stderr))
		ret = make_pipe(0, &ends[END_ERR], &r->err_fd);
	if (!ret && bwrap)
		ret = make_pipe(0, &ends[END_STATUS], &r->status_fd);
	if (!ret && bwrap)
		ret = make_pipe(0, &ends[END_REPORT], &r->report_fd);
	return ret;
}

int sbx_instance_start(const struct sbx_policy *p, const char *const argv[],
		       const struct sbx_run_options *opt, const struct sbx_callbacks *cb,
		       bool bwrap, struct instance *in, struct sbx_result *res)
{
	struct strv args = STRV_INIT, envp = STRV_INIT;
	struct child_plan plan;
	struct sbx_inputs inputs = { .scratch = &in->scratch };
	const char *rid = opt ? opt->request_id : NULL;
	int ends[END_N] = { -1, -1, -1, -1, -1 }, ret;

	plan_init(&plan);
	ret = take_resources(p, bwrap, in, rid, res);
	if (ret)
		goto out_close_fds;
	if (bwrap) {
		ret = plan_bwrap(p, argv, in, &inputs, &plan, &args, res);
	} else {
		plan_direct(p, argv, in, &plan, &args, &envp);
	}
	if (ret) {
		if (!res->spawn_stage)
			res->spawn_stage = "argv";
		goto out_close_fds;
	}
	ret = make_pipes(opt, bwrap, &in->r, ends);
	if (ret) {
		res->spawn_stage = "pipe";
		goto out_close_fds;
	}
	plan.fds[0] = opt && opt->pass_stdin ? STDIN_FILENO : ends[END_IN];
	plan.fds[1] = ends[END_OUT];
	plan.fds[2] = opt && opt->pass_stderr ? STDERR_FILENO : ends[END_ERR];
	plan.fds[SBX_FD_STATUS] = ends[END_STATUS];
	plan.fds[SBX_FD_REPORT] = ends[END_REPORT];
	plan.cgroup_fd = in->r.cg.procs_fd;
	plan.netns_fd = in->ns.netns_fd;
	if (in->ns_userns_fd >= 0)
		plan.userns_fd = in->ns_userns_fd;
	set_rlimits(&plan, p);
	if (argv && in->ns.listen_fd >= 0 && (ret = hand_listener(in, cb, res)))
		goto out_close_fds;
	ret = start_child(&plan, &in->r, res);
	/* The child is in the namespaces (or gone): the run's processes keep them alive. */
	close_fd(&in->ns.netns_fd);
	close_fd(&in->ns_userns_fd);
out_close_fds:
	for (size_t i = 0; i < END_N; i++)
		close_fd(&ends[i]);
	close_plan_inputs(&plan);
	free(inputs.binds);
	strv_release(&args);
	strv_release(&envp);
	return ret;
}

int sbx_exec_in_place(const struct sbx_policy *p, const char *const argv[])
{
	struct instance in = INSTANCE_INIT;
	struct sbx_inputs inputs = { .scratch = &in.scratch };
	struct child_plan plan;
	struct strv args = STRV_INIT;
	struct sbx_result res = { 0 };
	int null = -1, ret;

	if (!argv || !argv[0] || argv[0][0] != '/' || !sbx_g.runtime_dir)
		return -EINVAL;
	plan_init(&plan);
	/* No scratch dir: the name only labels the stub's command line. */
	snprintf(in.scratch.name, sizeof(in.scratch.name), "in-place-%ld", (long)getpid());
	ret = sbx_ident_acquire(&in.id, NULL);
	/* The same namespace as a run's; its listener has no one to go to and is closed at
	 * exec (close-on-exec), the namespace living on through the process in it. */
	if (!ret && p->net == SBX_NET_LOOPBACK)
		ret = make_netns(p, &in, NULL, &res);
	if (!ret)
		ret = plan_bwrap(p, argv, &in, &inputs, &plan, &args, &res);
	if (!ret && (null = open("/dev/null", O_WRONLY | O_CLOEXEC)) < 0)
		ret = -errno;
	if (ret)
		goto out_release_plan;
	/* Our own stdio; bwrap's status and the stub's report go nowhere, as does the
	 * report of a failed step below (the process then exits 127). */
	plan.fds[0] = STDIN_FILENO;
	plan.fds[1] = STDOUT_FILENO;
	plan.fds[2] = STDERR_FILENO;
	plan.fds[SBX_FD_STATUS] = null;
	plan.fds[SBX_FD_REPORT] = null;
	plan.report_fd = null;
	plan.parent = getppid();
	plan.netns_fd = in.ns.netns_fd;
	if (in.ns_userns_fd >= 0)
		plan.userns_fd = in.ns_userns_fd;
	set_rlimits(&plan, p);
	child_exec(&plan);
out_release_plan:
	close_plan_inputs(&plan);
	free(inputs.binds);
	strv_release(&args);
	sbx_netns_release(&in.ns);
	close_fd(&in.ns_userns_fd);
	sbx_ident_release(&in.id);
	return ret;
}

/* Whether releasing the instance writes a credential copy back to the host. */
static bool instance_writes_back(const struct instance *in)
{
	for (size_t i = 0; i < in->ncopies; i++)
		if (in->copies[i].path)
			return true;
	return false;
}

void sbx_instance_release(struct instance *in, const char *rid)
{
	kill_tree(&in->r);
	reap(&in->r);
	wait_ns_gone(&in->r);
	sbx_cgroup_remove(&in->r.cg, rid);
	run_close(&in->r);
	/* A listener never handed on (a warm sandbox dropped or shut down) goes with it. */
	sbx_netns_release(&in->ns);
	close_fd(&in->ns_userns_fd);
	for (size_t i = 0; i < in->ncopies; i++) {
		if (in->copies[i].path)
			write_back(&in->copies[i], rid);
		free(in->copies[i].host);
		free(in->copies[i].path);
		free(in->copies[i].inside);
	}
	free(in->copies);
	in->copies = NULL;
	in->ncopies = 0;
	sbx_ident_release(&in->id);
	sbx_scratch_remove(&in->scratch, rid);
}

/* The warm key of a policy (pool.c): everything that shapes its sandbox. NULL when no run
 * of it can start. */
static char *policy_key(const struct sbx_policy *p)
{
	struct sbx_scratch fake = { .name = "@scratch", .path = "@scratch" };
	struct sbx_inputs in = { .scratch = &fake,
				 .etc_mask = sbx_etc_mask(),
				 .sync = sbx_g.ident == SBX_IDENTITY_PER_RUN };
	size_t nro = p->bind_ro.n / 2;
	struct strv args = STRV_INIT;
	struct child_plan plan = { 0 };
	struct buf key = BUF_INIT;

	/* Too many files to bind: no run of it can start, warm or cold. */
	if (sbx_plan_binds(p, &in.binds, &in.nbinds))
		return NULL;
	sbx_build_bwrap_argv(p, &in, NULL, &args);
	for (size_t i = 0; i < args.n; i++) {
		buf_adds(&key, args.v[i]);
		buf_addch(&key, '\x1f');
	}
	/* A file given as a copy is keyed by what it is now: a sandbox made before the file
	 * changed (a refreshed login) is not the same sandbox. */
	for (size_t k = 0; k < in.nbinds; k++) {
		const struct stat *st = &in.binds[k].st;

		if (in.binds[k].how == SBX_BIND_FILE || in.binds[k].how == SBX_BIND_COPY)
			buf_addf(&key, "%s:%llu:%llu:%lld:%lld.%ld\x1f",
				 k < nro ? p->bind_ro.v[2 * k] : p->bind_rw.v[2 * (k - nro)],
				 (unsigned long long)st->st_dev, (unsigned long long)st->st_ino,
				 (long long)st->st_size, (long long)st->st_mtim.tv_sec,
				 st->st_mtim.tv_nsec);
	}
	/* Who decides a write-back is part of the sandbox: a warm one keeps what made it. */
	for (size_t k = 0; k < p->bind_rw.n / 2; k++)
		buf_addf(&key, "check%zu=%p,", k, p->rw_checks ? (void *)p->rw_checks[k] : NULL);
	set_rlimits(&plan, p);
	for (size_t i = 0; i < ARRAY_SIZE(plan.rl); i++)
		buf_addf(&key, "%llu,", (unsigned long long)plan.rl[i].rlim_cur);
	/* bwrap's argv is the same for HOST and LOOPBACK (neither has --unshare-net): the
	 * network mode and port say which namespace the sandbox was made in. */
	buf_addf(&key, "net=%d:%u,", (int)p->net, (unsigned)p->net_port);
	/* The environment is no longer on bwrap's command line (stub.h): key it here. */
	for (size_t i = 0; i < p->env.n; i++) {
		buf_adds(&key, p->env.v[i]);
		buf_addch(&key, '\x1e');
	}
	buf_addf(&key, "cg=%llu,%llu,%llu", (unsigned long long)p->limits.memory_mb,
		 (unsigned long long)p->limits.pids, (unsigned long long)p->limits.cpu_pct);
	free(in.binds);
	strv_release(&args);
	return buf_detach(&key, NULL);
}

bool sbx_instance_alive(const struct instance *in)
{
	struct pollfd pfd = { .fd = in->r.pidfd, .events = POLLIN };

	return poll(&pfd, 1, 0) == 0;
}

/* After a run's teardown: a warm sandbox for a run that wrote credentials back, and the
 * run's next pre-started process (lease: the slots of the one it took, if it took one),
 * both keyed anew: a credential file this run wrote back is copied and keyed as it is
 * now, so that the next run can take it (a sandbox made before would hold the old copy
 * under the old key, one no later run asks for). */
static void refill_after_teardown(const struct sbx_policy *p, const char *const argv[],
				  const struct sbx_run_options *opt, bool warm, bool pre,
				  struct sbx_lease *lease)
{
	const char *tag = opt && opt->owner_tag ? opt->owner_tag : "";
	char *now = policy_key(p), *pkey;

	if (now && warm)
		sbx_warm_fill(p, now, tag);
	if (now && pre && opt) { /* pre: opt asked for it */
		pkey = sbx_prestart_key(now, argv);
		sbx_prestart_fill(p, argv, pkey, tag, opt->prestart, opt->owner_prestart_max,
				  lease);
		free(pkey);
	}
	free(now);
}

static void tell_start(const struct sbx_callbacks *cb, struct sbx_result *res, enum sbx_start s)
{
	res->start = s;
	if (cb && cb->on_start)
		cb->on_start(cb->ctx, s);
}

/* Whether a SBX_NET_LOOPBACK run can keep its promise here; checked before anything is
 * made. Mode off has no namespace at all: nothing runs, rather than a run with more
 * network than its policy says (ADR 0015). 0 or -errno. */
static int loopback_possible(bool bwrap, const struct sbx_callbacks *cb, struct sbx_result *res)
{
	res->failure = SBX_FAIL_NETWORK;
	if (!bwrap) {
		res->spawn_stage = "netns (sandbox mode off)";
		return -EOPNOTSUPP;
	}
	if (!cb || !cb->on_listener) {
		res->spawn_stage = "listener";
		return -EINVAL;
	}
	res->failure = SBX_FAIL_NONE;
	return 0;
}

int sbx_run(const struct sbx_policy *p, const char *const argv[], const struct sbx_run_options *opt,
	    const struct sbx_callbacks *cb, struct sbx_result *res)
{
	struct instance in = INSTANCE_INIT;
	struct sbx_run_options wopt;
	struct buf launch = BUF_INIT;
	bool bwrap = p->wrap == SBX_WRAP_ALWAYS ||
		     (p->wrap == SBX_WRAP_BY_MODE && sbx_g.mode == SBX_MODE_BWRAP);
	bool warmable = bwrap && sbx_g.warm && p->wrap == SBX_WRAP_BY_MODE &&
			!(opt && (opt->pass_stdin || opt->pass_stderr));
	const char *rid = opt ? opt->request_id : NULL;
	const char *tag = opt && opt->owner_tag ? opt->owner_tag : "";
	struct sbx_lease lease = SBX_LEASE_INIT;
	char *key = NULL, *pkey = NULL;
	bool writes_back;
	int ret;

	memset(res, 0, sizeof(*res));
	if (!argv || !argv[0] || argv[0][0] != '/') {
		res->spawn_stage = "argv";
		ret = -EINVAL;
		goto out_release_instance;
	}
	if (!sbx_g.runtime_dir) {
		res->spawn_stage = "init";
		ret = -ENOTCONN;
		goto out_release_instance;
	}
	if (p->net == SBX_NET_LOOPBACK && (ret = loopback_possible(bwrap, cb, res)))
		goto out_release_instance;
	key = warmable ? policy_key(p) : NULL;
	if (key && opt && opt->prestart && sbx_g.prestart_max)
		pkey = sbx_prestart_key(key, argv);
	/* Its host-wide slots stay with this run (lease) for the one started after it. */
	if (pkey && sbx_prestart_take(pkey, tag, &in, &lease, rid)) {
		sbx_prestart_count(SBX_PRESTART_HIT, 1);
		/* Its forwarder starts now, with this run's deadline: the command's connections
		 * wait in the listener's backlog until then. Refused: put down unused. */
		if (in.ns.listen_fd >= 0 && (ret = hand_listener(&in, cb, res)))
			goto out_release_instance;
		tell_start(cb, res, SBX_START_PRESTART);
		supervise(&in.r, p, opt, cb, res, bwrap);
		ret = 0;
	} else if (key && sbx_warm_take(key, tag, &in, rid)) {
		/* Its namespace was made with it; the listener goes to the caller now, before
		 * the command exists. Refused: the sandbox is put down unused. */
		if (in.ns.listen_fd >= 0 && (ret = hand_listener(&in, cb, res)))
			goto out_release_instance;
		/* A sandbox built ahead of time: tell its stub what to become. */
		sbx_launch_message(argv, opt, &launch);
		wopt = opt ? *opt : (struct sbx_run_options){ .hangup_fd = -1 };
		wopt.stdin_data = launch.data;
		wopt.stdin_len = launch.len;
		tell_start(cb, res, SBX_START_WARM);
		supervise(&in.r, p, &wopt, cb, res, bwrap);
		buf_release(&launch);
		ret = 0;
	} else {
		ret = sbx_instance_start(p, argv, opt, cb, bwrap, &in, res);
		if (!ret) {
			tell_start(cb, res, SBX_START_COLD);
			supervise(&in.r, p, opt, cb, res, bwrap);
		}
	}
	if (pkey && res->start != SBX_START_PRESTART)
		sbx_prestart_count(SBX_PRESTART_MISS, 1);
out_release_instance:
	if (ret) {
		res->end = SBX_END_SPAWN_FAILED;
		if (!res->failure)
			res->failure = SBX_FAIL_SPAWN;
		res->spawn_errno = -ret;
	}
	/* The answer is out (on_result): get the next sandbox going, then clean up. A run
	 * with writable credential copies fills after the teardown instead. */
	writes_back = instance_writes_back(&in);
	if (key && !ret && !writes_back)
		sbx_warm_fill(p, key, tag);
	sbx_instance_release(&in, rid);
	if (key && !ret && (writes_back || pkey))
		refill_after_teardown(p, argv, opt, writes_back, pkey != NULL, &lease);
	sbx_lease_put(&lease);
	free(pkey);
	free(key);
	return ret;
}

const char *sbx_start_name(enum sbx_start s)
{
	switch (s) {
	case SBX_START_COLD: return "cold";
	case SBX_START_WARM: return "warm";
	case SBX_START_PRESTART: return "prestart";
	}
	return "unknown";
}

const char *sbx_failure_str(enum sbx_failure f)
{
	switch (f) {
	case SBX_FAIL_NONE: return "none";
	case SBX_FAIL_SPAWN: return "spawn";
	case SBX_FAIL_SETUP: return "setup";
	case SBX_FAIL_IDENTITY: return "identity";
	case SBX_FAIL_EXEC: return "exec";
	case SBX_FAIL_NETWORK: return "network";
	}
	return "unknown";
}

const char *sbx_end_name(enum sbx_end e)
{
	switch (e) {
	case SBX_END_EXITED: return "exited";
	case SBX_END_SIGNALED: return "signaled";
	case SBX_END_TIMEOUT: return "timeout";
	case SBX_END_ABORTED: return "aborted";
	case SBX_END_STOPPED: return "stopped";
	case SBX_END_SPAWN_FAILED: return "spawn_failed";
	}
	return "unknown";
}
