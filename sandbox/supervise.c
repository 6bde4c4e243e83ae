/* Supervising one started run, and ending it.
 *
 * The parent supervises the run (one state machine, below): it polls the child's stdout
 * and stderr, feeds its stdin, watches a pidfd for its exit, bwrap's status fd, a
 * wall-clock deadline, and optionally a hangup fd (the FastCGI connection). Whether the
 * command ran at all is learnt from bwrap's status and from olp-sandbox-exec's own report,
 * never from what they print (learn_failure). Any way the run ends, the whole tree is
 * killed and reaped before the scratch directory is removed (sbx_instance_release). */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "sandbox/instance.h"
#include "common/banned.h"

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

void sbx_run_kill_tree(struct run *r)
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

void sbx_run_reap(struct run *r)
{
	if (r->reaped || r->pid <= 0)
		return;
	while (waitpid(r->pid, &r->wstatus, 0) < 0 && errno == EINTR)
		;
	r->reaped = true;
}

void sbx_run_tick(struct run *r, uint64_t now)
{
	if (r->tick && r->tick->on_tick && r->tick_due && now >= r->tick_due)
		r->tick_due = r->tick->on_tick(r->tick->ctx, now);
}

int sbx_run_tick_timeout(const struct run *r, uint64_t now, int timeout)
{
	uint64_t left;

	if (!r->tick || !r->tick->on_tick || !r->tick_due)
		return timeout;
	left = r->tick_due > now ? r->tick_due - now : 0;
	if (left > INT_MAX)
		left = INT_MAX;
	return timeout < 0 || (int)left < timeout ? (int)left : timeout;
}

/* Wait until the sandbox's pid namespace is gone: its init exits only after every other
 * process in it has been killed and reaped by the kernel. The caller's tick goes on
 * meanwhile: a chain's next hop waits for this teardown, its client for a keep-alive. */
void sbx_run_wait_ns_gone(struct run *r)
{
	struct pollfd pfd;

	if (r->ns_pidfd < 0)
		return;
	pfd.fd = r->ns_pidfd;
	pfd.events = POLLIN;
	/* A fork bomb of a few hundred processes takes seconds to die on a slow VM; the
	 * scratch dir must outlive all of them, so wait up to 60 s (SIGKILL was sent). */
	for (int i = 0; i < 600; i++) {
		sbx_run_tick(r, mono_ms());
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
		sbx_close_fd(&r->err_fd);
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
			sbx_close_fd(&r->out_fd);
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
		sbx_close_fd(&r->status_fd);
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
		sbx_run_kill_tree(s->r);
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
		sbx_close_fd(&r->in_fd);
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
	sbx_run_kill_tree(r);
	while (r->err_fd >= 0 && readable(r->err_fd) && mono_ms() < until)
		read_err(r, &s->chunk, s->res);
	while (s->state == SV_COLLECTING && r->out_fd >= 0 && readable(r->out_fd) &&
	       mono_ms() < until)
		sv_read_out(s);
	sbx_close_fd(&r->err_fd);
	sbx_close_fd(&r->out_fd);
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

/* How long the poll may wait: until the drain's end or the deadline, and no later than
 * the caller's next tick. */
static int sv_timeout(const struct supervisor *s, uint64_t now)
{
	uint64_t until = s->drain_until;

	if (!until && s->state == SV_RUNNING)
		until = s->deadline;
	if (!until)
		return sbx_run_tick_timeout(s->r, now, -1);
	/* sv_check ended the run at either time: both lie ahead. */
	return sbx_run_tick_timeout(s->r, now,
				    until - now > INT_MAX ? INT_MAX : (int)(until - now));
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
		sbx_run_reap(r);
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
		sbx_run_reap(r);
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
	sbx_run_kill_tree(r);
	if (!exit_known)
		sbx_run_reap(r);
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
void sbx_supervise(struct run *r, const struct sbx_policy *p, const struct sbx_run_options *opt,
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
	if (opt && opt->deadline_ms)
		s.deadline = opt->deadline_ms;
	else if (p->timeout_ms)
		s.deadline = s.start + p->timeout_ms;
	if (!s.in_left)
		sbx_close_fd(&r->in_fd);
	while (s.state != SV_DONE) {
		uint64_t now = mono_ms();

		sv_check(&s, now);
		if (s.state == SV_COLLECTING) {
			sv_collect(&s);
			continue;
		}
		if (s.state == SV_DONE)
			break;
		sbx_run_tick(r, now);
		sv_poll(&s, now);
	}
	sv_finish(&s, bwrap);
	buf_release(&s.chunk);
}

void sbx_run_close(struct run *r)
{
	sbx_close_fd(&r->in_fd);
	sbx_close_fd(&r->out_fd);
	sbx_close_fd(&r->err_fd);
	sbx_close_fd(&r->status_fd);
	sbx_close_fd(&r->report_fd);
	sbx_close_fd(&r->pidfd);
	sbx_close_fd(&r->ns_pidfd);
	buf_release(&r->status);
}
