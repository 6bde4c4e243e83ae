/* Private to sandbox/: one started sandbox and what its files share: the child between
 * fork and exec (child.c), bwrap's inputs (inputs.c), the instance's start and release
 * (instance.c), its supervision (supervise.c), and the pools that keep some ahead of time
 * (pool.c), which spawn.c's sbx_run takes from and refills. */
#ifndef OLP_SANDBOX_INSTANCE_H
#define OLP_SANDBOX_INSTANCE_H

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "sandbox/internal.h"

struct run {
	pid_t pid;
	int pidfd;
	int in_fd, out_fd, err_fd, status_fd;
	int report_fd;	   /* olp-sandbox-exec's failure report (stub.h), or -1 */
	int ns_pidfd;	   /* pidfd on bwrap's pid-namespace init, once known */
	struct buf status; /* bytes read from --json-status-fd */
	bool reaped;
	int wstatus;
	bool exit_known; /* bwrap reported the command's exit code */
	int exit_code;
	struct sbx_cgroup cg; /* the run's cgroup (dir_fd -1 without one) */
	/* The caller's periodic work (sbx_callbacks.on_tick), set by sbx_run once the run's
	 * sandbox is acquired, and when it is due (0: never). */
	const struct sbx_callbacks *tick;
	uint64_t tick_due;
};

/* A writable file bind: the run works on a copy in its scratch dir, written back. */
struct copy {
	char *host;		   /* the real path of the host file */
	char *path;		   /* the copy */
	struct timespec ctime;	   /* the copy's, as made: changed means written */
	char *inside;		   /* where the run sees it (a warm instance outlives its policy) */
	sbx_writeback_check check; /* or NULL: any change is written back */
};

/* One started process (bwrap, or the command itself in mode off), its scratch dir, its
 * host identity and, for SBX_NET_LOOPBACK, its network namespace. */
struct instance {
	struct run r;
	struct sbx_scratch scratch;
	struct sbx_ident id;
	/* listen_fd until handed to on_listener (a warm sandbox keeps it until taken);
	 * netns_fd until the child has joined the namespace. Both close-on-exec. */
	struct sbx_netns ns;
	int ns_userns_fd; /* identity shared: the user namespace made for ns, or -1 */
	struct copy *copies;
	size_t ncopies;
};

#define RUN_INIT                                                                                  \
	{                                                                                         \
		.pid = -1, .pidfd = -1, .in_fd = -1, .out_fd = -1, .err_fd = -1, .status_fd = -1, \
		.report_fd = -1, .ns_pidfd = -1, .status = BUF_INIT,                              \
		.cg = {.dir_fd = -1,                                                              \
		       .procs_fd = -1 }                                                           \
	}
#define INSTANCE_INIT                                                                              \
	{                                                                                          \
		.r = RUN_INIT, .scratch = { .home_fd = -1 },                                       \
		.id = { .lock_fd = -1, .userns_fd = -1 }, .ns = SBX_NETNS_INIT, .ns_userns_fd = -1 \
	}

/* Close *fd if open, and mark it closed. */
static inline void sbx_close_fd(int *fd)
{
	if (*fd >= 0) {
		close(*fd);
		*fd = -1;
	}
}

/* ---- child.c: the child between fork and exec -------------------------------------------- */
/* What sbx_child_exec needs; all of it prepared before fork(). */
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

/* Every slot closed, no cwd, cgroup or namespace: the plan fills what it needs. */
void sbx_child_plan_init(struct child_plan *plan);
/* The rlimits of a run under p, into plan->rl. */
void sbx_child_set_rlimits(struct child_plan *plan, const struct sbx_policy *p);
/* Close the inputs the plan owns (bwrap's filter, passwd, /etc and bound files); not the
 * uid slot's lock, which is the identity's, nor the pipes' ends, which are the caller's. */
void sbx_child_plan_close_inputs(struct child_plan *plan);
/* Start the child per plan (vfork, then sbx_child_exec); fills r->pid and r->pidfd. 0, or
 * -errno with res->spawn_stage and res->failure saying which step failed. */
int sbx_child_start(struct child_plan *plan, struct run *r, struct sbx_result *res);
/* Become the plan's program, in this process (sbx_exec_in_place: only where nothing else
 * runs). Never returns: a failed step writes {stage, errno} to plan->report_fd, exit 127. */
void __attribute__((noreturn)) sbx_child_exec(const struct child_plan *c);

/* ---- supervise.c: one run, from its start to its result ---------------------------------- */
/* Supervise the started run r until it is over and its result known: stdin fed, stdout to
 * cb, the deadline (p), the hangup fd (opt); res filled and cb->on_result told, once. */
void sbx_supervise(struct run *r, const struct sbx_policy *p, const struct sbx_run_options *opt,
		   const struct sbx_callbacks *cb, struct sbx_result *res, bool bwrap);
/* SIGKILL the whole tree: the sandbox's pid namespace, the process group, the cgroup. */
void sbx_run_kill_tree(struct run *r);
/* Wait for the run's first process (bwrap, or the command), once. */
void sbx_run_reap(struct run *r);
/* Wait (bounded) until the sandbox's pid namespace is gone; the caller's tick meanwhile. */
void sbx_run_wait_ns_gone(struct run *r);
/* The caller's tick (sbx_callbacks.on_tick), if its time has come by now. */
void sbx_run_tick(struct run *r, uint64_t now);
/* A poll timeout (ms, -1: none) shortened to end when the caller's tick is due. */
int sbx_run_tick_timeout(const struct run *r, uint64_t now, int timeout);
/* Close the parent's ends and release what was read of the status. */
void sbx_run_close(struct run *r);

/* ---- inputs.c: bwrap's inputs ------------------------------------------------------------- */
/* bwrap for argv under p (argv NULL: a warm sandbox, whose stub waits for its command):
 * the bind plan and the files it opens (copies of writable files into in), the filter,
 * passwd, group and /etc copies, the command line into args, the uid slot. stdio, status
 * and report are the caller's to place. 0 or -errno (res->spawn_stage may say where). */
int sbx_plan_bwrap(const struct sbx_policy *p, const char *const argv[], struct instance *in,
		   struct sbx_inputs *inputs, struct child_plan *plan, struct strv *args,
		   struct sbx_result *res);
/* Mode off: the command itself, in the scratch home, which is its HOME at its host path. */
void sbx_plan_direct(const struct sbx_policy *p, const char *const argv[],
		     const struct instance *in, struct child_plan *plan, struct strv *args,
		     struct strv *envp);
/* The run wrote its copy c: replace the host file with it (once the run's processes are
 * gone), unless c->check refuses it. */
void sbx_copy_write_back(const struct copy *c, const char *rid);
/* The warm key of a policy (pool.c): everything that shapes its sandbox. malloc'd; NULL
 * when no run of it can start. */
char *sbx_policy_key(const struct sbx_policy *p);

/* ---- instance.c ---------------------------------------------------------------------------- */
/* Create the scratch dir, take the run's cgroup and identity (and network namespace),
 * build the plan and the pipes, and start argv under p (argv NULL: a warm sandbox, whose
 * stub waits for its command and which keeps its listener until it is taken). in starts
 * as INSTANCE_INIT and is released by the caller either way. 0 or -errno (res says where). */
int sbx_instance_start(const struct sbx_policy *p, const char *const argv[],
		       const struct sbx_run_options *opt, const struct sbx_callbacks *cb,
		       bool bwrap, struct instance *in, struct sbx_result *res);
/* Kill what is left of an instance, reap it, wait for its namespace, keep what it wrote
 * to its writable credentials, release its uid and remove its dir. */
void sbx_instance_release(struct instance *in, const char *rid);
/* Its sandbox (bwrap, or the command in mode off) has not exited. */
bool sbx_instance_alive(const struct instance *in);
/* Releasing it writes a credential copy back to the host. */
bool sbx_instance_writes_back(const struct instance *in);
/* Hand a SBX_NET_LOOPBACK instance's listener to cb->on_listener, who owns it from then
 * on; before the command starts, and a refusal means nothing runs. 0 or -errno. */
int sbx_instance_hand_listener(struct instance *in, const struct sbx_callbacks *cb,
			       struct sbx_result *res);

/* ---- pool.c: what this process keeps started ahead, per owner tag ------------------------
 * Both pools file each entry under the tag of the run that made it
 * (sbx_run_options.owner_tag; "" for none) and give it only to a run of the same tag, and
 * a tag that needs room puts down only entries of its own: one tag's churn never costs
 * another tag its entries (ADR 0008 and 0022, amended). */

/* The host-wide slots a pre-started command holds (prestart.c): one of the host's, one of
 * its tag's. A run that took one keeps them for the one it starts after it
 * (sbx_prestart_fill), so that a tag does not lose its place on the host to another tag
 * in the middle of its own run. -1: not held. */
struct sbx_lease {
	int host_fd, tag_fd;
};
#define SBX_LEASE_INIT                      \
	{                                   \
		.host_fd = -1, .tag_fd = -1 \
	}
void sbx_lease_put(struct sbx_lease *l);

/* Take a live warm sandbox of policy key for tag (the oldest); false when there is none. */
bool sbx_warm_take(const char *key, const char *tag, struct instance *out, const char *rid);
/* Start warm sandboxes of policy key for tag until two wait or are on their way, within
 * the tag's share of this process's pool. Started, not waited for. */
void sbx_warm_fill(const struct sbx_policy *p, const char *key, const char *tag);

/* The pre-start key: the warm key plus argv. malloc'd. */
char *sbx_prestart_key(const char *policy, const char *const argv[]);
/* Take a live pre-started command of key for tag (the oldest), with the host-wide slots it
 * held (*lease, which must be empty); false when there is none. One found dead is put down
 * and counted. */
bool sbx_prestart_take(const char *key, const char *tag, struct instance *out,
		       struct sbx_lease *lease, const char *rid);
/* Start pre-started commands of key for tag until want wait, within the host's slots and
 * the tag's share (share: 0 = sbx_g.prestart_per_owner, never above it). The first uses the
 * slots in *lease, if any (they are taken from it). */
void sbx_prestart_fill(const struct sbx_policy *p, const char *const argv[], const char *key,
		       const char *tag, unsigned want, unsigned share, struct sbx_lease *lease);
/* Count one event of this process's, and tell sbx_g.on_prestart. */
void sbx_prestart_count(enum sbx_prestart_event ev, uint64_t n);
/* The launch message olp-sandbox-exec reads before it becomes argv (stub.h), then
 * opt->stdin_data if any. */
void sbx_launch_message(const char *const argv[], const struct sbx_run_options *opt,
			struct buf *out);

/* prestart.c: one of a tag's `share` host-wide slots (<runtime_dir>/prestart-slots/
 * t<hex of tag>.<i>.slot), as sbx_prestart_slot_take; put it with slot_release.
 * -ENAMETOOLONG for a tag above SBX_OWNER_TAG_MAX bytes. */
int sbx_prestart_tag_take(const char *tag, unsigned share);

#endif
