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
	key = warmable ? sbx_policy_key(p) : NULL;
	if (key && opt && opt->prestart && sbx_g.prestart_max)
		pkey = sbx_prestart_key(key, argv);
	/* Its host-wide slots stay with this run (lease) for the one started after it. */
	if (pkey && sbx_prestart_take(pkey, tag, &in, &lease, rid)) {
		sbx_prestart_count(SBX_PRESTART_HIT, 1);
		/* Its forwarder starts now, with this run's deadline: the command's connections
		 * wait in the listener's backlog until then. Refused: put down unused. */
		if (in.ns.listen_fd >= 0 && (ret = sbx_instance_hand_listener(&in, cb, res)))
			goto out_release_instance;
		tell_start(cb, res, SBX_START_PRESTART);
		sbx_supervise(&in.r, p, opt, cb, res, bwrap);
		ret = 0;
	} else if (key && sbx_warm_take(key, tag, &in, rid)) {
		/* Its namespace was made with it; the listener goes to the caller now, before
		 * the command exists. Refused: the sandbox is put down unused. */
		if (in.ns.listen_fd >= 0 && (ret = sbx_instance_hand_listener(&in, cb, res)))
			goto out_release_instance;
		/* A sandbox built ahead of time: tell its stub what to become. */
		sbx_launch_message(argv, opt, &launch);
		wopt = opt ? *opt : (struct sbx_run_options){ .hangup_fd = -1 };
		wopt.stdin_data = launch.data;
		wopt.stdin_len = launch.len;
		tell_start(cb, res, SBX_START_WARM);
		sbx_supervise(&in.r, p, &wopt, cb, res, bwrap);
		buf_release(&launch);
		ret = 0;
	} else {
		ret = sbx_instance_start(p, argv, opt, cb, bwrap, &in, res);
		if (!ret) {
			tell_start(cb, res, SBX_START_COLD);
			sbx_supervise(&in.r, p, opt, cb, res, bwrap);
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
	writes_back = sbx_instance_writes_back(&in);
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
