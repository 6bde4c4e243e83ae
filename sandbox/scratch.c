/* Per-run scratch directories under the runtime directory.
 *
 * Each run gets <runtime_dir>/<pid>-<seq>-<random>/home, created 0700 relative to an fd
 * on the runtime dir and opened with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), so
 * that no path component is looked up twice and no link is ever followed. Removal walks the
 * tree with openat(O_NOFOLLOW) and unlinkat: a symlink planted by the child is removed,
 * never followed. The Node OLP left about half of its per-request homes behind because it
 * deleted them while the client was still writing; here removal happens only after the
 * whole process tree is gone (see instance.c). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/openat2.h>

#include "common/common.h"
#include "sandbox/internal.h"
#include "common/banned.h"

static atomic_ulong scratch_seq;

/* Open a directory below dfd that must be reached without any symlink and without leaving
 * dfd (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS); on kernels
 * before 5.6, a single-component openat with O_NOFOLLOW gives the same guarantee. */
int sbx_open_dir_beneath(int dfd, const char *name)
{
	struct open_how how = {
		.flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	long fd = syscall(SYS_openat2, dfd, name, &how, sizeof(how));

	if (fd >= 0 || errno != ENOSYS)
		return (int)fd;
	if (strchr(name, '/')) {
		errno = EINVAL;
		return -1;
	}
	return openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

int sbx_scratch_create(struct sbx_scratch *s)
{
	char rnd[17];
	int dfd = -1, ret;

	random_hex(rnd, 8);
	snprintf(s->name, sizeof(s->name), "%ld-%lu-%s", (long)getpid(),
		 (unsigned long)atomic_fetch_add(&scratch_seq, 1), rnd);
	s->home_fd = -1;
	if ((size_t)snprintf(s->path, sizeof(s->path), "%s/%s", sbx_g.runtime_dir, s->name) >=
		    sizeof(s->path) ||
	    (size_t)snprintf(s->home, sizeof(s->home), "%s/%s/home", sbx_g.runtime_dir, s->name) >=
		    sizeof(s->home))
		return -ENAMETOOLONG;

	if (mkdirat(sbx_g.runtime_fd, s->name, 0700) < 0)
		return -errno;
	dfd = sbx_open_dir_beneath(sbx_g.runtime_fd, s->name);
	if (dfd < 0) {
		ret = -errno;
		goto out_rmdir;
	}
	if (mkdirat(dfd, "home", 0700) < 0) {
		ret = -errno;
		goto out_close_dir;
	}
	s->home_fd = sbx_open_dir_beneath(dfd, "home");
	if (s->home_fd < 0) {
		ret = -errno;
		unlinkat(dfd, "home", AT_REMOVEDIR);
		goto out_close_dir;
	}
	close(dfd);
	return 0;

out_close_dir:
	close(dfd);
out_rmdir:
	unlinkat(sbx_g.runtime_fd, s->name, AT_REMOVEDIR);
	return ret;
}

/* Empty the directory open at dfd (which is consumed). Depth is bounded to stop a hostile
 * tree from exhausting our stack; anything deeper is left and reported. */
static int remove_tree_at(int dfd, int depth)
{
	DIR *d;
	struct dirent *de;
	int ret = 0;

	d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		return -errno;
	}
	while ((de = readdir(d))) {
		int sub;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (unlinkat(dirfd(d), de->d_name, 0) == 0)
			continue;
		if (errno != EISDIR && errno != EPERM) {
			ret = -errno;
			continue;
		}
		if (depth > 64) {
			ret = -ELOOP;
			continue;
		}
		sub = sbx_open_dir_beneath(dirfd(d), de->d_name);
		if (sub < 0) {
			ret = -errno;
			continue;
		}
		/* The child may have made a directory unwritable or unsearchable. */
		fchmod(sub, 0700);
		ret = remove_tree_at(sub, depth + 1) ?: ret;
		if (unlinkat(dirfd(d), de->d_name, AT_REMOVEDIR) < 0)
			ret = -errno;
	}
	closedir(d);
	return ret;
}

static void remove_named(const char *name, const char *rid)
{
	int dfd, ret;

	dfd = sbx_open_dir_beneath(sbx_g.runtime_fd, name);
	if (dfd < 0 && (errno == ELOOP || errno == ENOTDIR || errno == EXDEV)) {
		/* Not a directory of ours (a link planted in its place): remove the entry
		 * itself, never what it points to. */
		if (unlinkat(sbx_g.runtime_fd, name, 0) < 0)
			log_warn(rid, "sandbox: cannot remove %s", name);
		return;
	}
	if (dfd < 0) {
		if (errno != ENOENT)
			log_warn(rid, "sandbox: cannot open scratch dir %s", name);
		return;
	}
	fchmod(dfd, 0700);
	ret = remove_tree_at(dfd, 0);
	if (ret)
		log_warnx(rid, "sandbox: scratch dir %s not fully removed: %s", name,
			  strerror(-ret));
	if (unlinkat(sbx_g.runtime_fd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		log_warn(rid, "sandbox: cannot remove scratch dir %s", name);
}

void sbx_scratch_remove(struct sbx_scratch *s, const char *rid)
{
	if (s->home_fd >= 0) {
		close(s->home_fd);
		s->home_fd = -1;
	}
	if (s->name[0])
		remove_named(s->name, rid);
	s->name[0] = '\0';
}

/* Kill every process whose command line names the scratch dir `name`: what is left of a
 * run whose worker died. A worker killed while bwrap was still building a sandbox leaves
 * the sandbox's init blocked for ever on bwrap's set-up signal, and no death signal
 * reaches it; its command line is bwrap's, which passes the name to the stub ("--run").
 * The name ends in 64 random bits, so no other process names it by chance. Only processes
 * we may signal are reached (our uid, as bwrap's are; the run's own uid dies with the
 * sandbox's init). */
static void kill_stranded(const char *name)
{
	char needle[4200], path[300];
	size_t nl;
	DIR *d = opendir("/proc");
	struct dirent *de;

	if (!d)
		return;
	nl = (size_t)snprintf(needle, sizeof(needle), "--run%c%s%c", '\0', name, '\0');
	while ((de = readdir(d))) {
		struct buf cmd = BUF_INIT;

		if (de->d_name[0] < '1' || de->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/cmdline", de->d_name);
		if (buf_read_file(&cmd, path, 65536) == 0 && nl < sizeof(needle) &&
		    memmem(cmd.data, cmd.len, needle, nl))
			kill((pid_t)strtol(de->d_name, NULL, 10), SIGKILL);
		buf_release(&cmd);
	}
	closedir(d);
}

/* Whether pid is a process that still runs: not gone, and not a zombie either (a worker
 * that exited and whose parent has not reaped it yet, as when the web server that started
 * it is gone and init reaps late, uses its scratch dirs no more). */
static bool pid_running(long pid)
{
	struct buf stat = BUF_INIT;
	char path[64];
	const char *close;
	bool running;

	if (kill((pid_t)pid, 0) < 0 && errno == ESRCH)
		return false;
	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	if (buf_read_file(&stat, path, 4096) < 0) {
		buf_release(&stat);
		return true; /* cannot tell: keep its dirs */
	}
	/* "pid (comm) S …": comm may hold spaces and parentheses, the state follows the
	 * last ')'. */
	close = memrchr(stat.data, ')', stat.len);
	running = !close || (size_t)(close - stat.data) + 2 >= stat.len ||
		  (close[2] != 'Z' && close[2] != 'X');
	buf_release(&stat);
	return running;
}

/* Remove scratch dirs whose creating process no longer exists (a worker that crashed or
 * was killed mid-run), and whatever of their runs is still alive. Dirs of live processes
 * are left: another worker of the pool may be using them right now. */
void sbx_scratch_sweep_stale(void)
{
	int dfd;
	DIR *d;
	struct dirent *de;

	dfd = openat(sbx_g.runtime_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return;
	d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		return;
	}
	while ((de = readdir(d))) {
		char *end;
		long pid;

		if (de->d_name[0] == '.')
			continue;
		pid = strtol(de->d_name, &end, 10);
		/* Past INT_MAX the cast to pid_t would name another process. */
		if (end == de->d_name || *end != '-' || pid <= 0 || pid > INT_MAX)
			continue;
		if (pid == (long)getpid() || pid_running(pid))
			continue;
		kill_stranded(de->d_name);
		remove_named(de->d_name, NULL);
	}
	closedir(d);
}
