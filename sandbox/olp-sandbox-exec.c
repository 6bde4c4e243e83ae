/* olp-sandbox-exec: the first program of every sandbox (spawn.c, policy.c).
 *
 *   olp-sandbox-exec --run NAME [--drop NPROC --chown DIR] [-- COMMAND ARGS...]
 *
 * bwrap starts it with only fds 0-2, once the sandbox is built.
 *
 * --drop: the run has a host uid of its own (ADR 0014). bwrap ran in the run's user
 * namespace as its root and left us CAP_SETUID, CAP_SETGID, CAP_CHOWN and CAP_SETPCAP.
 * We give DIR (the home bwrap made, and the credential copies in it) to the sandbox user,
 * set the run's process budget (RLIMIT_NPROC counts the processes of a real uid, so it is
 * set for the uid the run becomes), and become uid and gid 1000 with no supplementary
 * group, which drops every capability for good. Any step that fails ends the run: the
 * command never runs with more than that.
 *
 * Without "--" this is a warm sandbox, started ahead of a request: after the steps above
 * it waits on stdin for the command it is to become:
 *     "OLPX" u32 argc, then argc × (u32 length, bytes)      (lengths little-endian)
 * It reads exactly that much — the rest of stdin (the prompt) is the command's. Then, as
 * with "--", it execs the command in place: same pid, same sandbox, same environment.
 *
 * A failure is said on stderr ("olp-sandbox-exec: …", which the worker recognises as the
 * sandbox's, not the command's) with exit 127; 126 when no launch message came (the
 * worker went away). --run only names the run's scratch dir in our command line, for the
 * worker's sweep of what a dead worker left (scratch.c). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
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

#define MAX_ARGS 4096
#define MAX_BYTES (8u << 20)
#define SANDBOX_ID 1000 /* the sandbox user (sandbox/internal.h SBX_UID, SBX_GID) */
#define CHOWN_MAX_DEPTH 16

static void __attribute__((noreturn)) fail(const char *what)
{
	fprintf(stderr, "olp-sandbox-exec: %s: %s\n", what, strerror(errno));
	exit(127);
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

	if (read_exact(magic, 4) || memcmp(magic, "OLPX", 4) != 0 || read_u32(&argc) || !argc ||
	    argc > MAX_ARGS)
		return NULL;
	argv = calloc(argc + 1, sizeof(*argv));
	if (!argv)
		return NULL;
	for (i = 0; i < argc; i++) {
		if (read_u32(&len) || len > MAX_BYTES - total)
			goto out_free;
		total += len;
		argv[i] = malloc(len + 1);
		if (!argv[i] || read_exact(argv[i], len))
			goto out_free;
		argv[i][len] = '\0';
	}
	return argv;
out_free:
	for (i = 0; argv[i]; i++)
		free(argv[i]);
	free(argv);
	return NULL;
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
		if (fchownat(dirfd(d), de->d_name, SANDBOX_ID, SANDBOX_ID, AT_SYMLINK_NOFOLLOW) < 0)
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
		fail("--drop");
	}
	if (home) {
		dfd = open(home, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (dfd < 0 || fstat(dfd, &st) < 0 || chown_tree(dup(dfd), st.st_dev, 0) < 0 ||
		    fchown(dfd, SANDBOX_ID, SANDBOX_ID) < 0)
			fail("chown home");
		close(dfd);
	}
	/* The bounding set (bwrap leaves it alone in a namespace it did not make): nothing
	 * can ever be regained through an exec either. */
	for (int c = 0; c < 64; c++)
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL)
			fail("bounding set");
	if (setgroups(0, NULL) < 0)
		fail("setgroups");
	if (setresgid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID) < 0)
		fail("setresgid");
	if (setrlimit(RLIMIT_NPROC, &rl) < 0)
		fail("rlimit nproc");
	if (setresuid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID) < 0)
		fail("setresuid");
	/* No capability is left to pass on, not even as inheritable. */
	if (syscall(SYS_capset,
		    &(struct __user_cap_header_struct){ _LINUX_CAPABILITY_VERSION_3, 0 },
		    (struct __user_cap_data_struct[2]){ { 0 }, { 0 } }) < 0)
		fail("capset");
	/* Verify rather than trust: the uid changed everywhere, and there is no way back. */
	if (getresuid(&r, &e, &s) < 0 || r != SANDBOX_ID || e != SANDBOX_ID || s != SANDBOX_ID ||
	    setuid(0) == 0) {
		errno = EPERM;
		fail("drop");
	}
}

int main(int argc, char **argv)
{
	extern char **environ;
	const char *nproc = NULL, *home = NULL;
	char **cmd = NULL;
	int i;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--")) {
			cmd = argv + i + 1;
			break;
		} else if (!strcmp(argv[i], "--run") && i + 1 < argc) {
			i++;
		} else if (!strcmp(argv[i], "--drop") && i + 1 < argc) {
			nproc = argv[++i];
		} else if (!strcmp(argv[i], "--chown") && i + 1 < argc) {
			home = argv[++i];
		} else {
			errno = EINVAL;
			fail(argv[i]);
		}
	}
	if (nproc)
		drop(nproc, home);
	if (!cmd) {
		cmd = read_launch();
		if (!cmd)
			return 126; /* not launched (the worker went away): nothing to do */
	}
	if (!cmd[0]) {
		errno = EINVAL;
		fail("no command");
	}
	execve(cmd[0], cmd, environ);
	/* NOLINTNEXTLINE(clang-analyzer-unix.Malloc): not freed, the process ends here */
	fprintf(stderr, "olp-sandbox-exec: execve %s: %s\n", cmd[0], strerror(errno));
	return 127;
}
