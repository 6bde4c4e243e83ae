/* Resource control with cgroup v2: one cgroup per sandboxed run, below a cgroup delegated
 * to this process.
 *
 * rlimits count per process (address space, not memory used) or per uid; a cgroup counts
 * the whole tree: the memory it really uses, every process and thread it starts (a fork
 * bomb hits pids.max, not the host's limit), the CPU time it may take per period. And
 * cgroup.kill ends every process in it at once, however fast it forks.
 *
 * Which cgroup is ours to divide (the "base"):
 *  - config "sandbox.cgroup": "off": none, rlimits only.
 *  - a path: that cgroup, as prepared by the operator (docs/sandbox.md).
 *  - "auto" (the default): the cgroup we run in, but only if it was delegated to us. A
 *    cgroup is delegated when it belongs to our (non-root) uid (systemd chowns a
 *    Delegate=yes unit's cgroup to its User=), or carries systemd's "trusted.delegate" or
 *    "user.delegate" mark, or is the root of a cgroup namespace of our own (a container).
 *    Root may write to any cgroup, so writability alone proves nothing: a cgroup that
 *    systemd manages and did not delegate is never touched.
 * Cgroup v2 lets a cgroup hand controllers to its children only while it holds no process
 * itself, so when the base is the cgroup we run in, every process in it (the worker pool
 * and the web server that spawned it) moves into the leaf "olp-workers" first; limits
 * set on the base still hold for all of them.
 *
 * Per run: <base>/sbx-<scratch name>, with memory.max (and memory.swap.max 0, and
 * memory.oom.group so that an OOM kill takes the whole run), pids.max and cpu.max. The
 * child moves itself in (writes 0 to cgroup.procs) before it execs bwrap, so that every
 * process of the run is in it from the start. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <linux/magic.h>

#include "common/common.h"
#include "sandbox/internal.h"
#include "common/banned.h"

#define CG_WORKERS "olp-workers"
#define CG_RUN_PREFIX "sbx-"

/* Indexed like the SBX_CG_* bits. */
static const char *const cg_names[] = { "memory", "pids", "cpu" };

/* Read a small file below dfd into buf (NUL-terminated). Bytes read or -errno. */
static ssize_t read_at(int dfd, const char *name, char *buf, size_t n)
{
	ssize_t len = 0, r;
	int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	if (fd < 0)
		return -errno;
	while ((size_t)len < n - 1) {
		r = read(fd, buf + len, n - 1 - (size_t)len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r < 0)
				len = -errno;
			break;
		}
		len += r;
	}
	close(fd);
	if (len >= 0)
		buf[len] = '\0';
	return len;
}

/* Write text to a cgroup file below dfd, as one write(2). 0 or -errno. */
static int write_at(int dfd, const char *name, const char *text)
{
	int fd = openat(dfd, name, O_WRONLY | O_CLOEXEC | O_NOFOLLOW), ret = 0;
	size_t len = strlen(text);

	if (fd < 0)
		return -errno;
	if (write(fd, text, len) != (ssize_t)len)
		ret = -errno ?: -EIO;
	close(fd);
	return ret;
}

/* The pids listed in the cgroup's cgroup.procs, one per line, as many as fit in buf: a
 * list longer than buf ends on whole lines, never on a cut pid ("12345" read as "123"
 * would name another process). The callers read again until the list is empty.
 * Length read, or -errno. */
static ssize_t read_pids(int dfd, char *buf, size_t n)
{
	ssize_t len = read_at(dfd, "cgroup.procs", buf, n);
	char *nl;

	if (len == (ssize_t)n - 1) {
		nl = strrchr(buf, '\n');
		len = nl ? nl + 1 - buf : 0;
		buf[len] = '\0';
	}
	return len;
}

/* Is word one of the space-separated words of list? */
static bool has_word(const char *list, const char *word)
{
	size_t n = strlen(word);

	for (const char *p = list; (p = strstr(p, word)); p += n)
		if ((p == list || isspace((unsigned char)p[-1])) &&
		    (!p[n] || isspace((unsigned char)p[n])))
			return true;
	return false;
}

static void set_reason(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_reason(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	/* A clang-analyzer 14 false positive: ap is initialized by va_start just above. */
	/* NOLINTNEXTLINE(clang-analyzer-valist.Uninitialized) */
	(void)vsnprintf(sbx_g.cg_reason, sizeof(sbx_g.cg_reason), fmt, ap);
	va_end(ap);
}

/* Where the cgroup v2 hierarchy is mounted: where systemd puts it (pure v2, or "unified"
 * in a hybrid), else the first cgroup2 mount with root "/" in /proc/self/mountinfo,
 * which costs the kernel far more to produce. 0 or -ENOENT. */
static int find_mount(char *out, size_t n)
{
	static const char *const usual[] = { "/sys/fs/cgroup", "/sys/fs/cgroup/unified" };
	char line[4096];
	FILE *f;
	int ret = -ENOENT;

	for (size_t i = 0; i < ARRAY_SIZE(usual); i++) {
		struct statfs sf;

		if (statfs(usual[i], &sf) == 0 && sf.f_type == CGROUP2_SUPER_MAGIC) {
			snprintf(out, n, "%s", usual[i]);
			return 0;
		}
	}
	f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		char root[PATH_MAX], point[PATH_MAX];
		const char *sep = strstr(line, " - ");

		/* id parent major:minor root mountpoint ... - fstype source options */
		if (!sep || strncmp(sep + 3, "cgroup2 ", 8) ||
		    sscanf(line, "%*s %*s %*s %4095s %4095s", root, point) != 2)
			continue;
		/* Octal escapes (a space in the path): not a mount we can use. */
		if (strcmp(root, "/") || strchr(point, '\\'))
			continue;
		if ((size_t)snprintf(out, n, "%s", point) < n)
			ret = 0;
		break;
	}
	(void)fclose(f);
	return ret;
}

/* Our own cgroup, relative to the hierarchy's root ("/" or "/a/b"), from the "0::" line
 * of /proc/self/cgroup. 0 or -ENOENT. */
static int own_cgroup(char *out, size_t n)
{
	char line[4096];
	FILE *f = fopen("/proc/self/cgroup", "re");
	int ret = -ENOENT;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "0::", 3))
			continue;
		line[strcspn(line, "\n")] = '\0';
		/* " (deleted)" or a path outside our namespace ("/..") is not usable. */
		if (line[3] == '/' && !strstr(line, "/..") && !strchr(line, ' ') &&
		    (size_t)snprintf(out, n, "%s", line + 3) < n)
			ret = 0;
		break;
	}
	(void)fclose(f);
	return ret;
}

/* Was the cgroup open at dfd delegated to us? (See the top of this file.) */
static bool delegated(int dfd, const char *rel)
{
	char mark[8];
	struct stat st;
	ssize_t n;

	if (!strcmp(rel, "/"))
		return true;
	if (fstat(dfd, &st) == 0 && geteuid() != 0 && st.st_uid == geteuid())
		return true;
	n = fgetxattr(dfd, "trusted.delegate", mark, sizeof(mark) - 1);
	if (n <= 0)
		n = fgetxattr(dfd, "user.delegate", mark, sizeof(mark) - 1);
	return n == 1 && mark[0] == '1';
}

/* Move every process of the cgroup at dfd into its leaf CG_WORKERS. 0 or -errno. */
static int evacuate(int dfd)
{
	char procs[8192], one[24];
	int leaf, ret = 0;

	if (mkdirat(dfd, CG_WORKERS, 0755) < 0 && errno != EEXIST)
		return -errno;
	leaf = sbx_open_dir_beneath(dfd, CG_WORKERS);
	if (leaf < 0)
		return -errno;
	/* Processes may be started meanwhile (by the web server): a few rounds. */
	for (int round = 0; round < 5; round++) {
		ssize_t len = read_pids(dfd, procs, sizeof(procs));
		char *p = procs, *end;

		if (len < 0) {
			ret = (int)len;
			break;
		}
		if (len == 0)
			break;
		while (*p) {
			long pid = strtol(p, &end, 10);

			if (end == p)
				break;
			p = end;
			snprintf(one, sizeof(one), "%ld", pid);
			ret = write_at(leaf, "cgroup.procs", one);
			/* Gone meanwhile: fine. */
			if (ret == -ESRCH)
				ret = 0;
			if (ret)
				goto out_close_leaf;
		}
	}
out_close_leaf:
	close(leaf);
	return ret;
}

/* The controllers of ours that the cgroup at dfd offers (SBX_CG_* bits); its list in ctl. */
static unsigned int offered(int dfd, char *ctl, size_t n)
{
	unsigned int mask = 0;

	if (read_at(dfd, "cgroup.controllers", ctl, n) < 0)
		ctl[0] = '\0';
	ctl[strcspn(ctl, "\n")] = '\0';
	for (size_t i = 0; i < ARRAY_SIZE(cg_names); i++)
		if (has_word(ctl, cg_names[i]))
			mask |= 1u << i;
	return mask;
}

/* Turn on the controllers we use for the children of the base. 0 or -errno. */
static int enable_controllers(int dfd, bool may_evacuate)
{
	char want[64] = "", have[256];
	int ret = 0;

	if (read_at(dfd, "cgroup.subtree_control", have, sizeof(have)) < 0)
		have[0] = '\0';
	for (size_t i = 0; i < ARRAY_SIZE(cg_names); i++)
		if ((sbx_g.cg_controllers & (1u << i)) && !has_word(have, cg_names[i]))
			snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s+%s",
				 want[0] ? " " : "", cg_names[i]);
	if (!want[0])
		return 0;
	for (int round = 0; round < 3; round++) {
		ret = write_at(dfd, "cgroup.subtree_control", want);
		/* EBUSY: processes live in the base itself (no internal processes). */
		if (ret != -EBUSY || !may_evacuate)
			break;
		ret = evacuate(dfd);
		if (ret)
			break;
		ret = -EBUSY;
	}
	return ret;
}

/* A cgroup of ours that a process of ours can really be moved into: the only reliable
 * test of the kernel's delegation rules (write access to the common ancestor too). */
static int probe_move(void)
{
	char name[64];
	int dfd, procs, ret = 0, st;
	pid_t pid;

	snprintf(name, sizeof(name), CG_RUN_PREFIX "probe-%ld", (long)getpid());
	if (mkdirat(sbx_g.cg_fd, name, 0755) < 0 && errno != EEXIST)
		return -errno;
	dfd = sbx_open_dir_beneath(sbx_g.cg_fd, name);
	procs = dfd < 0 ? -1 : openat(dfd, "cgroup.procs", O_WRONLY | O_CLOEXEC);
	if (procs < 0) {
		ret = -errno;
		goto out_remove_probe;
	}
	pid = fork();
	if (pid == 0)
		_exit(write(procs, "0", 1) == 1 ? 0 : (errno & 0x7f) ?: 1);
	if (pid < 0) {
		ret = -errno;
		goto out_remove_probe;
	}
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		ret = WIFEXITED(st) ? -WEXITSTATUS(st) : -EIO;
out_remove_probe:
	if (procs >= 0)
		close(procs);
	if (dfd >= 0)
		close(dfd);
	unlinkat(sbx_g.cg_fd, name, AT_REMOVEDIR);
	return ret;
}

static void kill_procs(int dfd)
{
	char procs[8192];

	/* cgroup.kill (Linux 5.14) takes the whole cgroup at once, new forks included. */
	if (write_at(dfd, "cgroup.kill", "1") == 0)
		return;
	for (int round = 0; round < 50; round++) {
		char *p = procs, *end;

		if (read_pids(dfd, procs, sizeof(procs)) <= 0)
			return;
		/* The analyzer takes -errno for a possible positive length; > 0 means filled. */
		/* NOLINTNEXTLINE(clang-analyzer-core.uninitialized.Branch) */
		while (*p) {
			long pid = strtol(p, &end, 10);

			if (end == p)
				break;
			p = end;
			kill((pid_t)pid, SIGKILL);
		}
	}
}

/* Remove the run cgroup `name` of the base: kill what is left in it, wait (bounded) until
 * it is empty, rmdir. */
static void remove_run(const char *name, const char *rid)
{
	int dfd = sbx_open_dir_beneath(sbx_g.cg_fd, name);
	char events[256];

	if (dfd < 0)
		return;
	for (int i = 0; i < 600; i++) {
		if (read_at(dfd, "cgroup.events", events, sizeof(events)) <= 0 ||
		    strstr(events, "populated 0"))
			break;
		kill_procs(dfd);
		poll(NULL, 0, i < 10 ? 1 : 100);
	}
	close(dfd);
	if (unlinkat(sbx_g.cg_fd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		log_warn(rid, "sandbox: cannot remove cgroup %s", name);
}

/* Run cgroups left by a process that no longer exists (a worker killed mid-run). */
static void sweep_stale(void)
{
	int dfd = openat(sbx_g.cg_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
	struct dirent *de;

	if (!d) {
		if (dfd >= 0)
			close(dfd);
		return;
	}
	while ((de = readdir(d))) {
		size_t pl = strlen(CG_RUN_PREFIX);
		const char *s = de->d_name + pl;
		char *end;
		long pid;

		if (strncmp(de->d_name, CG_RUN_PREFIX, pl))
			continue;
		if (!strncmp(s, "probe-", 6))
			s += 6;
		pid = strtol(s, &end, 10);
		/* Past INT_MAX the cast to pid_t would name another process. */
		if (end == s || pid <= 0 || pid > INT_MAX || pid == (long)getpid() ||
		    kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		remove_run(de->d_name, NULL);
	}
	closedir(d);
}

/* The setting is one we can act on: NULL, "auto", or an absolute path. */
static bool setting_usable(const char *setting)
{
	if (setting && !strcmp(setting, "off")) {
		set_reason("sandbox.cgroup is \"off\" in config.json");
		return false;
	}
	if (setting && *setting && setting[0] != '/' && strcmp(setting, "auto")) {
		set_reason("sandbox.cgroup must be \"auto\", \"off\" or an absolute path");
		return false;
	}
	return true;
}

/* The path of the base (see the top of this file) into path: the setting's, or the cgroup
 * we run in (rel, below the mount mnt; a leaf CG_WORKERS is left for its parent). *own:
 * the base is the cgroup we run in. 0, or -1 with the reason set. */
static int base_path(const char *setting, const char *mnt, char *rel, size_t rel_size, char *path,
		     size_t n, bool *own)
{
	size_t rl = strlen(rel), wl = strlen("/" CG_WORKERS);

	if (setting && setting[0] == '/') {
		if ((size_t)snprintf(path, n, "%s", setting) >= n) {
			set_reason("sandbox.cgroup is longer than PATH_MAX");
			return -1;
		}
		*own = !strncmp(path, mnt, strlen(mnt)) &&
		       !strcmp(path + strlen(mnt), !strcmp(rel, "/") ? "" : rel);
		return 0;
	}
	/* Born in the leaf a worker before us moved the pool into (the web server lives there
	 * now): the base is its parent, evacuated already. */
	if (rl > wl && !strcmp(rel + rl - wl, "/" CG_WORKERS)) {
		rel[rl - wl] = '\0';
		if (!rel[0])
			snprintf(rel, rel_size, "/");
	}
	if ((size_t)snprintf(path, n, "%s%s", mnt, !strcmp(rel, "/") ? "" : rel) >= n) {
		set_reason("the path of this process's cgroup is longer than PATH_MAX");
		return -1;
	}
	*own = true;
	return 0;
}

/* At the root of the hierarchy (a container or a VM without a cgroup manager), keep our
 * runs together below "olp" rather than among the host's own cgroups; the root is exempt
 * from the no-internal-process rule. *fd and path become olp's. 0, or -1 with the reason
 * set (*fd is still the root's). */
static int base_below_root(int *fd, char *path, size_t n)
{
	size_t len = strlen(path);
	int ret, sub;

	if (len + sizeof("/olp") > n) {
		set_reason("cgroup %s/olp: the path is longer than PATH_MAX", path);
		return -1;
	}
	ret = enable_controllers(*fd, false);
	if (ret < 0 || (mkdirat(*fd, "olp", 0755) < 0 && errno != EEXIST) ||
	    (sub = sbx_open_dir_beneath(*fd, "olp")) < 0) {
		set_reason("cannot prepare %s/olp: %s", path, strerror(ret < 0 ? -ret : errno));
		return -1;
	}
	close(*fd);
	*fd = sub;
	memcpy(path + len, "/olp", sizeof("/olp"));
	return 0;
}

void sbx_cgroup_init(const char *setting)
{
	char mnt[PATH_MAX], rel[PATH_MAX], path[PATH_MAX], ctl[256];
	bool own = false;
	int fd, ret;

	sbx_g.cg_fd = -1;
	sbx_g.cg_controllers = 0;
	if (!setting_usable(setting))
		return;
	if (find_mount(mnt, sizeof(mnt))) {
		set_reason("no cgroup v2 hierarchy is mounted");
		return;
	}
	if (own_cgroup(rel, sizeof(rel))) {
		set_reason("this process is in no cgroup v2 cgroup it can see");
		return;
	}
	if (base_path(setting, mnt, rel, sizeof(rel), path, sizeof(path), &own))
		return;
	fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		set_reason("cannot open cgroup %s: %s", path, strerror(errno));
		return;
	}
	/* A cgroup the operator named is theirs to give; our own must have been given. */
	if (!(setting && setting[0] == '/') && !delegated(fd, rel)) {
		set_reason("cgroup %s was not delegated to this process (uid %ld); see "
			   "docs/sandbox.md, \"Resource control\"",
			   path, (long)geteuid());
		goto fail_close_base;
	}
	sbx_g.cg_controllers = offered(fd, ctl, sizeof(ctl));
	if ((sbx_g.cg_controllers & (SBX_CG_MEMORY | SBX_CG_PIDS)) !=
	    (SBX_CG_MEMORY | SBX_CG_PIDS)) {
		set_reason("cgroup %s does not offer the memory and pids controllers (%s)", path,
			   ctl[0] ? ctl : "none; a cgroup v1/v2 hybrid keeps them in v1");
		goto fail_close_base;
	}
	if (!strcmp(rel, "/") && own) {
		if (base_below_root(&fd, path, sizeof(path)))
			goto fail_close_base;
		own = false;
	}
	ret = enable_controllers(fd, own);
	if (ret < 0) {
		set_reason("cannot enable controllers in %s/cgroup.subtree_control: %s", path,
			   strerror(-ret));
		goto fail_close_base;
	}
	sbx_g.cg_fd = fd;
	sbx_g.cg_path = xstrdup(path);
	if (probe_move() < 0) {
		set_reason("cannot move a process into a cgroup below %s", path);
		goto fail_release; /* the base is sbx_g's now */
	}
	sweep_stale();
	set_reason("%s", path);
	return;
fail_close_base:
	close(fd);
fail_release:
	sbx_cgroup_release();
}

void sbx_cgroup_release(void)
{
	if (sbx_g.cg_fd >= 0)
		close(sbx_g.cg_fd);
	sbx_g.cg_fd = -1;
	free(sbx_g.cg_path);
	sbx_g.cg_path = NULL;
	sbx_g.cg_controllers = 0;
}

int sbx_cgroup_create(struct sbx_cgroup *cg, const char *run_name, const struct sbx_limits *l,
		      const char *rid)
{
	char v[64];
	int ret;

	cg->dir_fd = cg->procs_fd = -1;
	cg->name[0] = '\0';
	if (sbx_g.cg_fd < 0)
		return 0;
	if ((size_t)snprintf(cg->name, sizeof(cg->name), CG_RUN_PREFIX "%s", run_name) >=
	    sizeof(cg->name)) {
		cg->name[0] = '\0';
		return -ENAMETOOLONG;
	}
	if (mkdirat(sbx_g.cg_fd, cg->name, 0755) < 0) {
		ret = -errno;
		cg->name[0] = '\0';
		return ret;
	}
	cg->dir_fd = sbx_open_dir_beneath(sbx_g.cg_fd, cg->name);
	if (cg->dir_fd < 0) {
		ret = -errno;
		goto fail_remove_cgroup;
	}
	if (sbx_g.cg_controllers & SBX_CG_MEMORY) {
		snprintf(v, sizeof(v), "%llu",
			 (unsigned long long)sbx_or_default(l->memory_mb, SBX_DEFAULT_MEMORY_MB)
				 << 20);
		ret = write_at(cg->dir_fd, "memory.max", v);
		if (ret)
			goto fail_remove_cgroup;
		/* Without swap accounting the file is absent: nothing to limit then. */
		(void)write_at(cg->dir_fd, "memory.swap.max", "0");
		/* An OOM kill takes the whole run, not one process of a half-working client. */
		(void)write_at(cg->dir_fd, "memory.oom.group", "1");
	}
	if (sbx_g.cg_controllers & SBX_CG_PIDS) {
		snprintf(v, sizeof(v), "%llu",
			 (unsigned long long)sbx_or_default(l->pids, SBX_DEFAULT_PIDS));
		ret = write_at(cg->dir_fd, "pids.max", v);
		if (ret)
			goto fail_remove_cgroup;
	}
	if (sbx_g.cg_controllers & SBX_CG_CPU) {
		snprintf(v, sizeof(v), "%llu 100000",
			 (unsigned long long)sbx_or_default(l->cpu_pct, SBX_DEFAULT_CPU_PCT) *
				 1000);
		ret = write_at(cg->dir_fd, "cpu.max", v);
		if (ret)
			goto fail_remove_cgroup;
	}
	cg->procs_fd = openat(cg->dir_fd, "cgroup.procs", O_WRONLY | O_CLOEXEC);
	if (cg->procs_fd < 0) {
		ret = -errno;
		goto fail_remove_cgroup;
	}
	return 0;
fail_remove_cgroup:
	sbx_cgroup_remove(cg, rid);
	return ret;
}

void sbx_cgroup_kill(struct sbx_cgroup *cg)
{
	if (cg->dir_fd >= 0)
		kill_procs(cg->dir_fd);
}

void sbx_cgroup_remove(struct sbx_cgroup *cg, const char *rid)
{
	if (cg->procs_fd >= 0)
		close(cg->procs_fd);
	if (cg->dir_fd >= 0)
		close(cg->dir_fd);
	cg->procs_fd = cg->dir_fd = -1;
	if (cg->name[0] && sbx_g.cg_fd >= 0)
		remove_run(cg->name, rid);
	cg->name[0] = '\0';
}
