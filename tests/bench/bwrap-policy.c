/* bwrap-policy: exec bwrap with exactly the argv and inputs olp-sandbox gives it for
 * `olp-sandbox -- COMMAND` (profile "command": the same namespaces, mounts, /etc copies,
 * seccomp program, passwd/group, the run's own uid and user namespace), in place: no
 * supervising process, no scratch dir made or removed (HOME_DIR is unused), no teardown. sandbox-bench.sh times it
 * beside plain bwrap and olp-sandbox, to split what the policy costs inside bwrap from
 * what olp-sandbox costs as a process. With --plain it execs the plain
 * `bwrap --unshare-all` run of the script instead, so that this program's own exec, which
 * both pay, cancels out of the comparison.
 *
 * usage: bwrap-policy [--plain] HOME_DIR COMMAND [ARGS...]   (a benchmark tool) */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <linux/close_range.h>

#include "common/common.h"
#include "sandbox/internal.h"
#include "common/banned.h"

/* Put fd at slot (clearing close-on-exec there). */
static int place(int fd, int slot)
{
	if (fd < 0)
		return close(slot), 0;
	if (fd == slot)
		return fcntl(fd, F_SETFD, 0);
	return dup2(fd, slot) < 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP,
					 .runtime_dir = "/dev/shm",
					 .cgroup = "off" };
	struct sbx_scratch s = { .home_fd = -1, .name = "bench" };
	struct sbx_inputs inputs = { .scratch = &s };
	struct sbx_ident id;
	struct strv args = STRV_INIT;
	struct sbx_policy *p;
	int etc[SBX_ETC_FILES], in[SBX_FD_COUNT];

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
	if (sbx_lockdown_self() || sbx_global_init(&cfg) || !(p = sbx_policy_new()) ||
	    sbx_policy_apply_profile(p, "command") || sbx_ident_acquire(&id, NULL)) {
		fprintf(stderr, "bwrap-policy: cannot set up\n");
		return 1;
	}
	inputs.etc_mask = sbx_etc_open(etc);
	inputs.sync = id.lock_fd >= 0;
	sbx_build_bwrap_argv(p, &inputs, (const char *const *)argv + 2, &args);
	/* Sources first above every slot, then into place: no source is clobbered. */
	for (int i = 0; i < SBX_FD_COUNT; i++)
		in[i] = -1;
	in[SBX_FD_SYNC] = id.lock_fd;
	in[SBX_FD_STATUS] = open("/dev/null", O_WRONLY | O_CLOEXEC);
	in[SBX_FD_REPORT] = open("/dev/null", O_WRONLY | O_CLOEXEC);
	in[SBX_FD_SECCOMP] = sbx_seccomp_fd(false);
	in[SBX_FD_PASSWD] = sbx_data_fd(SBX_PASSWD_TEXT);
	in[SBX_FD_GROUP] = sbx_data_fd(SBX_GROUP_TEXT);
	for (int i = 0; i < SBX_ETC_FILES; i++)
		in[SBX_FD_ETC0 + i] = etc[i];
	for (int i = SBX_FD_STATUS; i < SBX_FD_COUNT; i++)
		if (in[i] >= 0)
			in[i] = fcntl(in[i], F_DUPFD_CLOEXEC, SBX_FD_COUNT + 8);
	if (id.userns_fd >= 0)
		id.userns_fd = fcntl(id.userns_fd, F_DUPFD_CLOEXEC, SBX_FD_COUNT + 8);
	for (int i = SBX_FD_STATUS; i < SBX_FD_COUNT; i++)
		if (place(in[i], i) < 0) {
			perror("bwrap-policy: dup2");
			return 1;
		}
	/* As olp-sandbox's child does: nothing of ours beyond the slots crosses exec, and
	 * bwrap starts as root of the run's user namespace. */
	close_range(SBX_FD_COUNT, ~0U, CLOSE_RANGE_CLOEXEC);
	if (id.userns_fd >= 0 && setns(id.userns_fd, CLONE_NEWUSER) < 0) {
		perror("bwrap-policy: setns");
		return 1;
	}
	execv(args.v[0], args.v);
	fprintf(stderr, "bwrap-policy: exec %s: %s\n", args.v[0], strerror(errno));
	return 127;
}
