/* One run: sbx_run acquires a sandbox (a pre-started command, a warm sandbox, or a new
 * one: instance.c), supervises it (supervise.c), then refills the pools (pool.c) and
 * releases it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "sandbox/instance.h"
#include "common/banned.h"

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
	char *now = sbx_policy_key(p), *pkey;

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

/* Where a run's sandbox comes from and what refills after it: the warm key of its policy
 * (NULL: no warm sandbox serves it) and the pre-start key (NULL: no pre-started command),
 * the host-wide slots of a pre-started command it took, kept for the one started after it
 * (lease), and for a warm sandbox, the options its launch message goes in. */
struct acquisition {
	bool bwrap;
	const char *tag;
	char *key, *pkey;
	struct sbx_lease lease;
	struct buf launch;
	struct sbx_run_options wopt;
	const struct sbx_run_options *opt; /* what the run is supervised with */
};

/* Whether the run can start at all, before anything is made. 0 or -errno. */
static int run_possible(const struct sbx_policy *p, const char *const argv[], bool bwrap,
			const struct sbx_callbacks *cb, struct sbx_result *res)
{
	if (!argv || !argv[0] || argv[0][0] != '/') {
		res->spawn_stage = "argv";
		return -EINVAL;
	}
	if (!sbx_g.runtime_dir) {
		res->spawn_stage = "init";
		return -ENOTCONN;
	}
	if (p->net == SBX_NET_LOOPBACK)
		return loopback_possible(bwrap, cb, res);
	return 0;
}

/* The keys a run of p looks its sandbox up by: warm sandboxes only under bwrap, in the
 * mode's own wrapping, for a run whose stdio goes through the supervisor. */
static void acquisition_init(struct acquisition *a, const struct sbx_policy *p,
			     const char *const argv[], const struct sbx_run_options *opt)
{
	bool warmable = a->bwrap && sbx_g.warm && p->wrap == SBX_WRAP_BY_MODE &&
			!(opt && (opt->pass_stdin || opt->pass_stderr));

	a->key = warmable ? sbx_policy_key(p) : NULL;
	if (a->key && opt && opt->prestart && sbx_g.prestart_max)
		a->pkey = sbx_prestart_key(a->key, argv);
}

/* A taken sandbox (pre-started or warm) starts now: its namespace was made with it, and
 * its listener goes to the caller, whose forwarder starts with this run's deadline (the
 * command's connections wait in the listener's backlog until then). Refused: the sandbox
 * is put down unused. */
static int start_taken(struct instance *in, const struct sbx_callbacks *cb, struct sbx_result *res,
		       enum sbx_start how)
{
	int ret = 0;

	if (in->ns.listen_fd >= 0)
		ret = sbx_instance_hand_listener(in, cb, res);
	if (!ret)
		tell_start(cb, res, how);
	return ret;
}

/* Acquire the run's sandbox, ready to supervise: a pre-started command of its key, else a
 * warm sandbox (told what to become), else one started now. 0 or -errno. */
static int acquire(const struct sbx_policy *p, const char *const argv[],
		   const struct sbx_run_options *opt, const struct sbx_callbacks *cb,
		   struct acquisition *a, struct instance *in, struct sbx_result *res)
{
	const char *rid = opt ? opt->request_id : NULL;
	int ret;

	if (a->pkey && sbx_prestart_take(a->pkey, a->tag, in, &a->lease, rid)) {
		sbx_prestart_count(SBX_PRESTART_HIT, 1);
		return start_taken(in, cb, res, SBX_START_PRESTART);
	}
	if (a->key && sbx_warm_take(a->key, a->tag, in, rid)) {
		/* Its stub waits for its command: the launch message is its stdin. */
		sbx_launch_message(argv, opt, &a->launch);
		a->wopt = opt ? *opt : (struct sbx_run_options){ .hangup_fd = -1 };
		a->wopt.stdin_data = a->launch.data;
		a->wopt.stdin_len = a->launch.len;
		a->opt = &a->wopt;
		if ((ret = start_taken(in, cb, res, SBX_START_WARM)))
			return ret;
	} else {
		ret = sbx_instance_start(p, argv, opt, cb, a->bwrap, in, res);
		if (!ret)
			tell_start(cb, res, SBX_START_COLD);
	}
	if (a->pkey)
		sbx_prestart_count(SBX_PRESTART_MISS, 1);
	return ret;
}

/* The answer is out (on_result): get the next sandbox going, then release this one. A run
 * with writable credential copies fills after the teardown instead, keyed anew. */
static void refill_and_release(const struct sbx_policy *p, const char *const argv[],
			       const struct sbx_run_options *opt, struct acquisition *a,
			       struct instance *in, bool ran)
{
	const char *rid = opt ? opt->request_id : NULL;
	bool writes_back = sbx_instance_writes_back(in);

	if (a->key && ran && !writes_back)
		sbx_warm_fill(p, a->key, a->tag);
	sbx_instance_release(in, rid);
	if (a->key && ran && (writes_back || a->pkey))
		refill_after_teardown(p, argv, opt, writes_back, a->pkey != NULL, &a->lease);
}

static void spawn_failed(struct sbx_result *res, int err)
{
	res->end = SBX_END_SPAWN_FAILED;
	if (!res->failure)
		res->failure = SBX_FAIL_SPAWN;
	res->spawn_errno = -err;
}

int sbx_run(const struct sbx_policy *p, const char *const argv[], const struct sbx_run_options *opt,
	    const struct sbx_callbacks *cb, struct sbx_result *res)
{
	struct instance in = INSTANCE_INIT;
	struct acquisition a = {
		.bwrap = p->wrap == SBX_WRAP_ALWAYS ||
			 (p->wrap == SBX_WRAP_BY_MODE && sbx_g.mode == SBX_MODE_BWRAP),
		.tag = opt && opt->owner_tag ? opt->owner_tag : "",
		.lease = SBX_LEASE_INIT,
		.launch = BUF_INIT,
		.opt = opt,
	};
	int ret;

	memset(res, 0, sizeof(*res));
	ret = run_possible(p, argv, a.bwrap, cb, res);
	if (!ret) {
		acquisition_init(&a, p, argv, opt);
		ret = acquire(p, argv, opt, cb, &a, &in, res);
	}
	if (!ret) {
		/* The caller's tick: from the supervision's start to the teardown's end. */
		in.r.tick = cb;
		in.r.tick_due = 1;
		sbx_supervise(&in.r, p, a.opt, cb, res, a.bwrap);
	} else {
		spawn_failed(res, ret);
	}
	refill_and_release(p, argv, opt, &a, &in, !ret);
	sbx_lease_put(&a.lease);
	buf_release(&a.launch);
	free(a.pkey);
	free(a.key);
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
