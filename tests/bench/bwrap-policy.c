/* bwrap-policy: exec bwrap with exactly the argv and inputs olp-sandbox gives it for
 * `olp-sandbox -- COMMAND` (profile "command": the same namespaces, mounts, /etc copies,
 * seccomp program, passwd/group, rlimits, the run's own uid and user namespace), in place
 * (sbx_exec_in_place): no supervising process, no scratch dir made or removed (HOME_DIR is
 * unused), no teardown. sandbox-bench.sh times it beside plain bwrap and olp-sandbox, to
 * split what the policy costs inside bwrap from what olp-sandbox costs as a process. With
 * --plain it execs the plain `bwrap --unshare-all` run of the script instead, so that this
 * program's own exec, which both pay, cancels out of the comparison.
 *
 * usage: bwrap-policy [--plain] HOME_DIR COMMAND [ARGS...]   (a benchmark tool) */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/close_range.h>

#include "common/common.h"
#include "sandbox/sandbox.h"
#include "common/banned.h"

int main(int argc, char **argv)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP, .cgroup = "off" };
	struct sbx_policy *p;
	char runtime[PATH_MAX];
	const char *x;
	int ret;

	if (argc >= 2 && !strcmp(argv[1], "--plain")) {
		const char *plain[64] = { "/usr/bin/bwrap", "--unshare-all",
					  "--ro-bind",	    "/usr",
					  "/usr",	    "--symlink",
					  "usr/bin",	    "/bin",
					  "--symlink",	    "usr/sbin",
					  "/sbin",	    "--symlink",
					  "usr/lib",	    "/lib",
					  "--symlink",	    "usr/lib64",
					  "/lib64",	    "--proc",
					  "/proc",	    "--dev",
					  "/dev",	    "--" };
		int n = 22;

		for (int i = 3; i < argc && n < 63; i++)
			plain[n++] = argv[i];
		plain[n] = NULL;
		close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
		execv(plain[0], (char *const *)plain);
		return 127;
	}
	if (argc < 3) {
		fprintf(stderr, "usage: bwrap-policy [--plain] HOME_DIR COMMAND [ARGS...]\n");
		return 2;
	}
	/* olp-sandbox's default runtime dir: sbx_global_init makes it and sweeps what dead runs
	 * left there; no scratch dir is made in it here. */
	x = getenv("XDG_RUNTIME_DIR");
	if (x && *x)
		snprintf(runtime, sizeof(runtime), "%s/olp-sandbox", x);
	else
		snprintf(runtime, sizeof(runtime), "/tmp/olp-sandbox-%ld", (long)getuid());
	cfg.runtime_dir = runtime;
	if (sbx_lockdown_self() || sbx_global_init(&cfg)) {
		fprintf(stderr, "bwrap-policy: cannot set up\n");
		return 1;
	}
	p = sbx_policy_new();
	ret = sbx_exec_in_place(p, (const char *const *)argv + 2);
	fprintf(stderr, "bwrap-policy: %s\n", strerror(-ret));
	sbx_policy_free(p);
	return 1;
}
