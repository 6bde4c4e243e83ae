/* One started sandbox (struct instance, instance.h): what it holds while it exists (its
 * scratch dir, cgroup, host identity and network namespace), its start, and its release.
 * sbx_run (spawn.c) supervises it in between; the pools (pool.c) keep some started ahead. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "sandbox/instance.h"
#include "common/banned.h"

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
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
int sbx_instance_hand_listener(struct instance *in, const struct sbx_callbacks *cb,
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

	sbx_child_plan_init(&plan);
	ret = take_resources(p, bwrap, in, rid, res);
	if (ret)
		goto out_close_fds;
	if (bwrap) {
		ret = sbx_plan_bwrap(p, argv, in, &inputs, &plan, &args, res);
	} else {
		sbx_plan_direct(p, argv, in, &plan, &args, &envp);
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
	sbx_child_set_rlimits(&plan, p);
	if (argv && in->ns.listen_fd >= 0 && (ret = sbx_instance_hand_listener(in, cb, res)))
		goto out_close_fds;
	ret = sbx_child_start(&plan, &in->r, res);
	/* The child is in the namespaces (or gone): the run's processes keep them alive. */
	sbx_close_fd(&in->ns.netns_fd);
	sbx_close_fd(&in->ns_userns_fd);
out_close_fds:
	for (size_t i = 0; i < END_N; i++)
		sbx_close_fd(&ends[i]);
	sbx_child_plan_close_inputs(&plan);
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
	sbx_child_plan_init(&plan);
	/* No scratch dir: the name only labels the stub's command line. */
	snprintf(in.scratch.name, sizeof(in.scratch.name), "in-place-%ld", (long)getpid());
	ret = sbx_ident_acquire(&in.id, NULL);
	/* The same namespace as a run's; its listener has no one to go to and is closed at
	 * exec (close-on-exec), the namespace living on through the process in it. */
	if (!ret && p->net == SBX_NET_LOOPBACK)
		ret = make_netns(p, &in, NULL, &res);
	if (!ret)
		ret = sbx_plan_bwrap(p, argv, &in, &inputs, &plan, &args, &res);
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
	sbx_child_set_rlimits(&plan, p);
	sbx_child_exec(&plan);
out_release_plan:
	sbx_child_plan_close_inputs(&plan);
	free(inputs.binds);
	strv_release(&args);
	sbx_netns_release(&in.ns);
	sbx_close_fd(&in.ns_userns_fd);
	sbx_ident_release(&in.id);
	return ret;
}

/* Whether releasing the instance writes a credential copy back to the host. */
bool sbx_instance_writes_back(const struct instance *in)
{
	for (size_t i = 0; i < in->ncopies; i++)
		if (in->copies[i].path)
			return true;
	return false;
}

void sbx_instance_release(struct instance *in, const char *rid)
{
	sbx_run_kill_tree(&in->r);
	sbx_run_reap(&in->r);
	sbx_run_wait_ns_gone(&in->r);
	sbx_cgroup_remove(&in->r.cg, rid);
	sbx_run_close(&in->r);
	/* A listener never handed on (a warm sandbox dropped or shut down) goes with it. */
	sbx_netns_release(&in->ns);
	sbx_close_fd(&in->ns_userns_fd);
	for (size_t i = 0; i < in->ncopies; i++) {
		if (in->copies[i].path)
			sbx_copy_write_back(&in->copies[i], rid);
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

bool sbx_instance_alive(const struct instance *in)
{
	struct pollfd pfd = { .fd = in->r.pidfd, .events = POLLIN };

	return poll(&pfd, 1, 0) == 0;
}
