/* olp-sandbox-exec: the first program of every sandbox (child.c, policy.c).
 *
 *   olp-sandbox-exec --run NAME [--drop NPROC --chown DIR] [-- COMMAND ARGS...]
 *
 * bwrap starts it with fds 0-2 and the worker's report pipe at SBX_FD_REPORT (stub.h),
 * once the sandbox is built, with an empty environment: the command's is the file
 * SBX_ENV_PATH (stub.h), read first, so that no value of it is ever on a command line.
 *
 * --drop: the run has a host uid of its own (ADR 0014). bwrap ran in the run's user
 * namespace as its root and left us CAP_SETUID, CAP_SETGID, CAP_CHOWN and CAP_SETPCAP.
 * We give DIR (the home bwrap made, and the credential copies in it) to the sandbox user,
 * set the run's process budget (RLIMIT_NPROC counts the processes of a real uid, so it is
 * set for the uid the run becomes), and become the sandbox user (SBX_UID, SBX_GID) with no
 * supplementary group, which drops every capability for good. Any step that fails ends the
 * run: the command never runs with more than that.
 *
 * Without "--" this is a warm sandbox, started ahead of a request: after the steps above
 * it waits on stdin for the launch message (stub.h) naming the command it is to become. It
 * reads exactly that much — the rest of stdin (the prompt) is the command's. Then, as
 * with "--", it execs the command in place: same pid, same sandbox, same environment.
 *
 * A step that fails is reported to the worker as {stage, errno} on SBX_FD_REPORT (stub.h),
 * which is close-on-exec here: the command never holds it, and nothing on it means the
 * command was exec'd. The failure is also said on stderr ("olp-sandbox-exec: …") for the
 * logs; the worker never reads that text. Exit 127 then; 126 when no launch message came
 * (the worker went away). --run only names the run's scratch dir in our command line, for
 * the worker's sweep of what a dead worker left (scratch.c). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <linux/capability.h>
#include <unistd.h>

#include "sandbox/stub.h"

/* Bounds of a launch message: what no command line of a provider comes near. */
#define MAX_ARGS 4096
#define MAX_BYTES (8u << 20)
#define CHOWN_MAX_DEPTH 16

static int report_fd = -1; /* the worker's report pipe, or -1 */

/* End the run before the command: tell the worker which step failed and why, say it on
 * stderr for the logs, exit 127. */
static void __attribute__((noreturn))
fail(enum sbx_stub_stage stage, const char *what, const char *detail)
{
	struct sbx_stub_report r = { .stage = stage, .err = errno };

	if (report_fd >= 0)
		(void)!write(report_fd, &r, sizeof(r));
	fprintf(stderr, "olp-sandbox-exec: %s%s%s: %s\n", what, detail ? " " : "",
		detail ? detail : "", strerror(r.err));
	exit(127);
}

/* Take the report descriptor the worker gave us, if it did, close-on-exec so that the
 * command never holds it (it could report a failure of its own making). Run by hand, the
 * stub has none and only says its failures on stderr. */
static void take_report_fd(void)
{
	if (fcntl(SBX_FD_REPORT, F_SETFD, FD_CLOEXEC) == 0)
		report_fd = SBX_FD_REPORT;
}

static int read_exact(void *dst, size_t n)
{
	char *p = dst;

	while (n) {
		ssize_t r = read(STDIN_FILENO, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

static int read_u32(uint32_t *v)
{
	unsigned char b[4];

	if (read_exact(b, 4))
		return -1;
	*v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
	return 0;
}

/* The launch message of a warm sandbox: the command's argv, or NULL. What it allocates
 * lives until the exec replaces us (or we exit), so nothing is freed. */
static char **read_launch(void)
{
	char magic[4], **argv;
	uint32_t argc, i, len, total = 0;

	if (read_exact(magic, 4) || memcmp(magic, SBX_LAUNCH_MAGIC, 4) != 0 || read_u32(&argc) ||
	    !argc || argc > MAX_ARGS)
		return NULL;
	/* No allocator that aborts here (common.h's is not linked in): a failure ends this
	 * run only, as "not launched". */
	argv = calloc(argc + 1, sizeof(*argv));
	if (!argv)
		return NULL;
	for (i = 0; i < argc; i++) {
		if (read_u32(&len) || len > MAX_BYTES - total)
			goto out_free_argv;
		total += len;
		argv[i] = malloc(len + 1);
		if (!argv[i] || read_exact(argv[i], len))
			goto out_free_argv;
		argv[i][len] = '\0';
	}
	return argv;
out_free_argv:
	for (i = 0; argv[i]; i++)
		free(argv[i]);
	free(argv);
	return NULL;
}

/* The command's environment (stub.h, SBX_ENV_PATH): read whole, split at its NULs. What
 * it allocates lives until the exec. Fails the run rather than start the command without
 * the environment it was given. */
static char **read_env(void)
{
	char *data, **env;
	size_t len = 0, n = 0, k = 0;
	ssize_t r;
	int fd = open(SBX_ENV_PATH, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	if (fd < 0)
		fail(SBX_STUB_ENV, "open", SBX_ENV_PATH);
	data = malloc(SBX_ENV_MAX + 1);
	if (!data) {
		errno = ENOMEM;
		fail(SBX_STUB_ENV, "read", SBX_ENV_PATH);
	}
	while ((r = read(fd, data + len, SBX_ENV_MAX + 1 - len)) != 0) {
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			fail(SBX_STUB_ENV, "read", SBX_ENV_PATH);
		len += (size_t)r;
		if (len > SBX_ENV_MAX) {
			errno = E2BIG;
			fail(SBX_STUB_ENV, "read", SBX_ENV_PATH);
		}
	}
	close(fd);
	if (len && data[len - 1] != '\0') {
		errno = EINVAL;
		fail(SBX_STUB_ENV, "read", SBX_ENV_PATH);
	}
	for (size_t i = 0; i < len; i++)
		n += data[i] == '\0';
	env = calloc(n + 1, sizeof(*env));
	if (!env) {
		errno = ENOMEM;
		fail(SBX_STUB_ENV, "read", SBX_ENV_PATH);
	}
	for (size_t i = 0; i < len; i += strlen(data + i) + 1)
		env[k++] = data + i;
	return env;
}

/* Give everything below the directory open at dfd that bwrap made (owned by our uid 0) to
 * the sandbox user, each directory after what is in it (once it is the sandbox user's,
 * we, without CAP_DAC_OVERRIDE, can no longer look inside). Other mounts (a bound host
 * directory or file) are left as they are: they are not ours to give. dfd is consumed. */
static int chown_tree(int dfd, dev_t dev, int depth)
{
	DIR *d = fdopendir(dfd);
	struct dirent *de;
	int ret = 0;

	if (!d) {
		close(dfd);
		return -1;
	}
	while (!ret && (de = readdir(d))) {
		struct stat st;
		int sub;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			ret = -1;
			break;
		}
		if (st.st_dev != dev || st.st_uid != 0)
			continue;
		if (S_ISDIR(st.st_mode)) {
			if (depth >= CHOWN_MAX_DEPTH) {
				errno = ELOOP;
				ret = -1;
				break;
			}
			sub = openat(dirfd(d), de->d_name,
				     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub < 0 || chown_tree(sub, dev, depth + 1) < 0) {
				ret = -1;
				break;
			}
		}
		if (fchownat(dirfd(d), de->d_name, SBX_UID, SBX_GID, AT_SYMLINK_NOFOLLOW) < 0)
			ret = -1;
	}
	closedir(d);
	return ret;
}

/* Become the sandbox user for good: the home first (CAP_CHOWN), then the groups and gid
 * (CAP_SETGID), the process budget, and the uid (CAP_SETUID) last, which clears every
 * capability. */
static void drop(const char *nproc_s, const char *home)
{
	struct rlimit rl;
	struct stat st;
	uid_t r, e, s;
	char *end;
	int dfd;

	errno = 0;
	rl.rlim_cur = rl.rlim_max = strtoull(nproc_s, &end, 10);
	if (errno || *end || !rl.rlim_cur) {
		errno = EINVAL;
		fail(SBX_STUB_ARGS, "--drop", nproc_s);
	}
	if (home) {
		dfd = open(home, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (dfd < 0 || fstat(dfd, &st) < 0 || chown_tree(dup(dfd), st.st_dev, 0) < 0 ||
		    fchown(dfd, SBX_UID, SBX_GID) < 0)
			fail(SBX_STUB_CHOWN, "chown home", NULL);
		close(dfd);
	}
	/* The bounding set (bwrap leaves it alone in a namespace it did not make): nothing
	 * can ever be regained through an exec either. */
	for (int c = 0; c < 64; c++)
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL)
			fail(SBX_STUB_CAPBSET, "bounding set", NULL);
	if (setgroups(0, NULL) < 0)
		fail(SBX_STUB_SETGROUPS, "setgroups", NULL);
	if (setresgid(SBX_GID, SBX_GID, SBX_GID) < 0)
		fail(SBX_STUB_SETGID, "setresgid", NULL);
	if (setrlimit(RLIMIT_NPROC, &rl) < 0)
		fail(SBX_STUB_NPROC, "rlimit nproc", NULL);
	if (setresuid(SBX_UID, SBX_UID, SBX_UID) < 0)
		fail(SBX_STUB_SETUID, "setresuid", NULL);
	/* No capability is left to pass on, not even as inheritable. */
	if (syscall(SYS_capset,
		    &(struct __user_cap_header_struct){ _LINUX_CAPABILITY_VERSION_3, 0 },
		    (struct __user_cap_data_struct[2]){ { 0 }, { 0 } }) < 0)
		fail(SBX_STUB_CAPSET, "capset", NULL);
	/* Verify rather than trust: the uid changed everywhere, and there is no way back. */
	if (getresuid(&r, &e, &s) < 0 || r != SBX_UID || e != SBX_UID || s != SBX_UID ||
	    setuid(0) == 0) {
		errno = EPERM;
		fail(SBX_STUB_VERIFY, "drop", NULL);
	}
}

int main(int argc, char **argv)
{
	const char *nproc = NULL, *home = NULL, *bad = NULL;
	char **cmd = NULL, **env;

	for (int i = 1; i < argc && !bad; i++) {
		bool has_value = i + 1 < argc;

		if (!strcmp(argv[i], "--")) {
			cmd = argv + i + 1;
			break;
		} else if (!strcmp(argv[i], "--run") && has_value) {
			i++;
		} else if (!strcmp(argv[i], "--drop") && has_value) {
			nproc = argv[++i];
		} else if (!strcmp(argv[i], "--chown") && has_value) {
			home = argv[++i];
		} else {
			bad = argv[i];
		}
	}
	/* First the report descriptor, so that every failure after it is reported. */
	take_report_fd();
	if (bad) {
		errno = EINVAL;
		fail(SBX_STUB_ARGS, bad, NULL);
	}
	/* Before the drop: the file is the sandbox root's alone. */
	env = read_env();
	if (nproc)
		drop(nproc, home);
	if (!cmd) {
		cmd = read_launch();
		if (!cmd)
			/* not launched (the worker went away): nothing to do; what read_env
			 * allocated goes with the process */
			return 126; /* NOLINT(clang-analyzer-unix.Malloc) */
	}
	if (!cmd[0]) {
		errno = EINVAL;
		fail(SBX_STUB_ARGS, "no command", NULL);
	}
	execve(cmd[0], cmd, env);
	/* NOLINTNEXTLINE(clang-analyzer-unix.Malloc): not freed, the process ends here */
	fail(SBX_STUB_EXEC, "execve", cmd[0]);
}
