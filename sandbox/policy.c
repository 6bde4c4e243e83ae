/* The policy object and the bwrap command line it turns into. The command line is an
 * argv built here, never a shell string. */
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "common/common.h"
#include "sandbox/internal.h"
#include "common/banned.h"

int sbx_strv_push(struct sbx_strv *sv, const char *s)
{
	char **nv;
	char *dup = strdup(s);

	if (!dup)
		return -ENOMEM;
	nv = realloc(sv->v, (sv->n + 2) * sizeof(*nv));
	if (!nv) {
		free(dup);
		return -ENOMEM;
	}
	nv[sv->n++] = dup;
	nv[sv->n] = NULL;
	sv->v = nv;
	return 0;
}

int sbx_strv_pushf(struct sbx_strv *sv, const char *fmt, ...)
{
	struct buf b = BUF_INIT;
	va_list ap;
	int ret;

	va_start(ap, fmt);
	buf_vaddf(&b, fmt, ap);
	va_end(ap);
	ret = sbx_strv_push(sv, b.data);
	buf_release(&b);
	return ret;
}

void sbx_strv_clear(struct sbx_strv *sv)
{
	size_t i;

	for (i = 0; i < sv->n; i++)
		free(sv->v[i]);
	free(sv->v);
	sv->v = NULL;
	sv->n = 0;
}

struct sbx_policy *sbx_policy_new(void)
{
	struct sbx_policy *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	if (sbx_policy_setenv(p, "PATH", "/usr/local/bin:/usr/bin:/bin") ||
	    sbx_policy_setenv(p, "HOME", SBX_HOME) || sbx_policy_setenv(p, "LANG", "C.UTF-8") ||
	    sbx_policy_setenv(p, "TMPDIR", "/tmp") || sbx_policy_setenv(p, "USER", "olp")) {
		sbx_policy_free(p);
		errno = ENOMEM;
		return NULL;
	}
	return p;
}

void sbx_policy_free(struct sbx_policy *p)
{
	if (!p)
		return;
	sbx_strv_clear(&p->ro);
	sbx_strv_clear(&p->rw);
	sbx_strv_clear(&p->env);
	sbx_strv_clear(&p->bind_ro);
	sbx_strv_clear(&p->bind_rw);
	free(p);
}

void sbx_policy_set_network(struct sbx_policy *p, bool on)
{
	p->network = on;
}

void sbx_policy_set_timeout_ms(struct sbx_policy *p, uint64_t ms)
{
	p->timeout_ms = ms;
}

void sbx_policy_set_limits(struct sbx_policy *p, const struct sbx_limits *l)
{
	uint64_t *v = (uint64_t *)&p->limits;

	p->limits = *l;
	/* No field is so large that its conversion (MB to bytes, percent to microseconds)
	 * wraps around to a small limit. */
	for (size_t i = 0; i < sizeof(p->limits) / sizeof(*v); i++)
		if (v[i] > SBX_LIMIT_MAX)
			v[i] = SBX_LIMIT_MAX;
}

void sbx_policy_allow_unix_sockets(struct sbx_policy *p, bool allow)
{
	p->allow_unix = allow;
}

int sbx_policy_apply_profile(struct sbx_policy *p, const char *name)
{
	if (!strcmp(name, "command")) {
		p->network = false;
		return 0;
	}
	if (!strcmp(name, "cli")) {
		/* The provider CLIs talk to their API; the rest of the policy is the same. */
		p->network = true;
		return 0;
	}
	return -ENOENT;
}

static int check_abs(const char *path)
{
	/* Relative paths would resolve against whatever directory bwrap runs in. */
	return path && path[0] == '/' ? 0 : -EINVAL;
}

int sbx_policy_add_ro(struct sbx_policy *p, const char *host_path)
{
	return check_abs(host_path) ?: sbx_strv_push(&p->ro, host_path);
}

int sbx_policy_add_rw(struct sbx_policy *p, const char *host_path)
{
	return check_abs(host_path) ?: sbx_strv_push(&p->rw, host_path);
}

/* A path inside must say where it lands without relying on how ".." resolves there. */
static bool has_dotdot(const char *path)
{
	for (const char *c = path; (c = strstr(c, "..")); c += 2)
		if ((c == path || c[-1] == '/') && (c[2] == '/' || c[2] == '\0'))
			return true;
	return false;
}

int sbx_policy_add_bind(struct sbx_policy *p, const char *host_path, const char *inside,
			bool writable)
{
	struct sbx_strv *sv = writable ? &p->bind_rw : &p->bind_ro;
	int ret;

	if (check_abs(host_path) || check_abs(inside) || has_dotdot(inside) || !strcmp(inside, "/"))
		return -EINVAL;
	if ((ret = sbx_strv_push(sv, host_path)))
		return ret;
	if ((ret = sbx_strv_push(sv, inside))) {
		/* Keep the vector in pairs. */
		free(sv->v[--sv->n]);
		sv->v[sv->n] = NULL;
	}
	return ret;
}

int sbx_strv_setenv(struct sbx_strv *sv, const char *name, const char *value)
{
	size_t i, nlen = strlen(name);
	struct buf b = BUF_INIT;

	if (!nlen || strchr(name, '='))
		return -EINVAL;
	buf_addf(&b, "%s=%s", name, value);
	for (i = 0; i < sv->n; i++) {
		if (!strncmp(sv->v[i], name, nlen) && sv->v[i][nlen] == '=') {
			free(sv->v[i]);
			sv->v[i] = buf_detach(&b, NULL);
			return 0;
		}
	}
	i = (size_t)sbx_strv_push(sv, b.data);
	buf_release(&b);
	return (int)i;
}

int sbx_policy_setenv(struct sbx_policy *p, const char *name, const char *value)
{
	return sbx_strv_setenv(&p->env, name, value);
}

int sbx_build_envp(const struct sbx_policy *p, struct sbx_strv *out)
{
	size_t i;
	int ret;

	for (i = 0; i < p->env.n; i++) {
		ret = sbx_strv_push(out, p->env.v[i]);
		if (ret)
			return ret;
	}
	return 0;
}

static int push_all(struct sbx_strv *out, ...)
{
	va_list ap;
	const char *s;
	int ret = 0;

	va_start(ap, out);
	/* A clang-analyzer 14 false positive: ap is initialized by va_start just above. */
	/* NOLINTNEXTLINE(clang-analyzer-valist.Uninitialized) */
	while (!ret && (s = va_arg(ap, const char *)))
		ret = sbx_strv_push(out, s);
	va_end(ap);
	return ret;
}

static bool path_exists(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0;
}

/* The /etc files a client needs to resolve names, verify TLS and load libraries. bwrap
 * copies each into the sandbox's root from a descriptor we open per run (--file): no
 * mount for each (a bind costs bwrap a pass over the mount table), and the content of the
 * moment (resolv.conf changes). Indexed like the SBX_FD_ETC0 + i slots. */
static const char *const etc_files[SBX_ETC_FILES] = {
	"/etc/ld.so.cache",   "/etc/resolv.conf", "/etc/hosts",
	"/etc/nsswitch.conf", "/etc/localtime",	  "/etc/ssl/openssl.cnf",
};
#define ETC_LOCALTIME 4

/* Directories, bound read-only. Of /etc/ssl only the certificates and openssl.cnf:
 * /etc/ssl/private holds the host's TLS keys, and a sandbox started by root maps its user
 * to host root, whose permission bits it then passes. */
static const char *const etc_dirs[] = { "/etc/ssl/certs", "/etc/alternatives" };

/* /etc/localtime as the link into /usr/share/zoneinfo it usually is (programs read the
 * zone's name from the link), or false when it is not one. */
static bool localtime_link(char *target, size_t n)
{
	ssize_t len = readlink(etc_files[ETC_LOCALTIME], target, n - 1);

	if (len <= 0)
		return false;
	target[len] = '\0';
	if (!strncmp(target, "../usr/", 7))
		memmove(target, target + 2, (size_t)len - 1);
	return !strncmp(target, "/usr/", 5) && !strstr(target, "/..");
}

unsigned int sbx_etc_open(int fds[SBX_ETC_FILES])
{
	unsigned int mask = 0;
	char link[PATH_MAX];

	for (size_t i = 0; i < SBX_ETC_FILES; i++) {
		fds[i] = -1;
		if (i == ETC_LOCALTIME && localtime_link(link, sizeof(link)))
			continue;
		fds[i] = open(etc_files[i], O_RDONLY | O_CLOEXEC | O_NOCTTY);
		if (fds[i] >= 0)
			mask |= 1u << i;
	}
	return mask;
}

unsigned int sbx_etc_mask(void)
{
	unsigned int mask = 0;
	char link[PATH_MAX];

	for (size_t i = 0; i < SBX_ETC_FILES; i++)
		if (!(i == ETC_LOCALTIME && localtime_link(link, sizeof(link))) &&
		    access(etc_files[i], R_OK) == 0)
			mask |= 1u << i;
	return mask;
}

/* Namespaces, identity and capabilities. */
static int argv_namespaces(const struct sbx_policy *p, struct sbx_strv *out)
{
	int ret;

	ret = push_all(out, sbx_g.bwrap_path,
		       /* New namespaces of every kind: the child sees no host process, IPC
			* object, hostname or cgroup. */
		       "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
		       "--hostname", SBX_HOSTNAME,
		       /* The tree dies with us and cannot reach our terminal (TIOCSTI). */
		       "--die-with-parent", "--new-session", "--cap-drop", "ALL",
		       /* The environment is rebuilt from the policy alone. */
		       "--clearenv", NULL);
	if (ret)
		return ret;
	if (sbx_g.ident == SBX_IDENTITY_PER_RUN) {
		/* bwrap runs in the run's user namespace (joined before its exec, ident.c),
		 * as its root. The stub keeps just what it needs to hand the home to uid 1000,
		 * empty the bounding set and become uid 1000, which drops every capability. Nested user namespaces are
		 * refused there (user.max_user_namespaces = 0), as --disable-userns would. */
		ret = push_all(out, "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
			       "--cap-add", "CAP_CHOWN", "--cap-add", "CAP_SETPCAP", NULL);
	} else {
		/* Mode shared: a user namespace of bwrap's own, uid 1000 mapped onto the
		 * worker's; no nested one (the kernel's most exposed surface from inside). */
		ret = push_all(out, "--unshare-user", "--uid", SBX_STR(SBX_UID), "--gid",
			       SBX_STR(SBX_GID), NULL);
		if (!ret)
			ret = sbx_strv_push(out, "--disable-userns");
	}
	if (!ret && !p->network)
		ret = sbx_strv_push(out, "--unshare-net");
	for (size_t i = 0; !ret && i < p->env.n; i++) {
		const char *kv = p->env.v[i], *eq = strchr(kv, '=');
		char name[256];
		size_t nl = (size_t)(eq - kv);

		if (nl >= sizeof(name))
			return -EINVAL;
		memcpy(name, kv, nl);
		name[nl] = '\0';
		ret = push_all(out, "--setenv", name, eq + 1, NULL);
	}
	return ret;
}

/* An allowlisted root: /usr read-only and the links into it, copies of a few /etc files,
 * nothing else of the host's file system unless the policy names it. */
static int argv_root(unsigned int etc_mask, struct sbx_strv *out)
{
	char link[PATH_MAX];
	size_t i;
	int ret;

	if ((ret = push_all(out, "--ro-bind", "/usr", "/usr", NULL)))
		return ret;
	for (i = 0; !ret && i + 1 < sbx_g.root_links.n; i += 2)
		ret = push_all(out, "--symlink", sbx_g.root_links.v[i], sbx_g.root_links.v[i + 1],
			       NULL);
	for (i = 0; !ret && i < sbx_g.root_dirs.n; i++)
		ret = push_all(out, "--ro-bind", sbx_g.root_dirs.v[i], sbx_g.root_dirs.v[i], NULL);
	for (i = 0; !ret && i < SBX_ETC_FILES; i++) {
		char fd[16];

		snprintf(fd, sizeof(fd), "%d", SBX_FD_ETC0 + (int)i);
		if (etc_mask & (1u << i))
			ret = push_all(out, "--perms", "0644", "--file", fd, etc_files[i], NULL);
	}
	if (!ret && localtime_link(link, sizeof(link)))
		ret = push_all(out, "--symlink", link, etc_files[ETC_LOCALTIME], NULL);
	for (i = 0; !ret && i < ARRAY_SIZE(etc_dirs); i++)
		if (path_exists(etc_dirs[i]))
			ret = push_all(out, "--ro-bind", etc_dirs[i], etc_dirs[i], NULL);
	/* A passwd and group that name only the sandbox user: no host account is listed. */
	if (!ret)
		ret = push_all(out, "--perms", "0644", "--file", SBX_STR(SBX_FD_PASSWD),
			       "/etc/passwd", "--perms", "0644", "--file", SBX_STR(SBX_FD_GROUP),
			       "/etc/group", NULL);
	return ret;
}

/* /proc, /dev and the run's writable space. */
static int argv_scratch(const struct sbx_policy *p, struct sbx_strv *out)
{
	uint64_t disk = sbx_or_default(p->limits.disk_mb, SBX_DEFAULT_DISK_MB) << 20;
	char home_size[32], tmp_size[32];

	/* The scratch space is a size-limited tmpfs each (the run's disk budget, in memory
	 * that the run's cgroup is charged for where there is one): 3/4 for the home, 1/4
	 * for /tmp. /dev/shm has its own 64 MiB. */
	snprintf(tmp_size, sizeof(tmp_size), "%llu", (unsigned long long)(disk / 4));
	snprintf(home_size, sizeof(home_size), "%llu", (unsigned long long)(disk - disk / 4));
	return push_all(out, "--proc", "/proc",
			/* The host's kernel knobs (core_pattern runs a program as host root),
			 * whoever the run is: read-only. bwrap covers them only when it could
			 * write them itself. */
			"--ro-bind", "/proc/sys", "/proc/sys", "--ro-bind-try",
			"/proc/sysrq-trigger", "/proc/sysrq-trigger",
			/* /dev/shm gets a size-limited tmpfs of its own: /dev itself is made
			 * read-only at the end, like the root. */
			"--dev", "/dev", "--perms", "01777", "--size", "67108864", "--tmpfs",
			"/dev/shm", "--perms", "01777", "--size", tmp_size, "--tmpfs", "/tmp",
			"--perms", "0755", "--dir", "/home", "--perms", "0700", "--size", home_size,
			"--tmpfs", SBX_HOME, "--chdir", SBX_HOME, NULL);
}

/* bwrap 0.8.0 makes the missing parents of a bind's destination 0700, owned by bwrap's
 * uid: the command, another uid, could not reach what is bound there. Make them 0755
 * first (--dir leaves an existing directory as it is). Each once: seen collects them. */
static int push_parents(struct sbx_strv *out, struct sbx_strv *seen, const char *dest)
{
	char dir[PATH_MAX];
	int ret = 0;

	if (strlen(dest) >= sizeof(dir))
		return -ENAMETOOLONG;
	for (const char *c = strchr(dest + 1, '/'); !ret && c; c = strchr(c + 1, '/')) {
		size_t i;

		memcpy(dir, dest, (size_t)(c - dest));
		dir[c - dest] = '\0';
		for (i = 0; i < seen->n && strcmp(seen->v[i], dir) != 0; i++)
			;
		if (i == seen->n)
			ret = sbx_strv_push(seen, dir)
				      ?: push_all(out, "--perms", "0755", "--dir", dir, NULL);
	}
	return ret;
}

static int push_bind(struct sbx_strv *out, struct sbx_strv *seen, const char *how, const char *src,
		     const char *dest)
{
	return push_parents(out, seen, dest) ?: push_all(out, how, src, dest, NULL);
}

/* The policy's own paths; after the home, so that a bind may land inside it. */
static int argv_binds(const struct sbx_policy *p, const struct sbx_inputs *in, struct sbx_strv *out)
{
	size_t i, k = 0, nro = p->bind_ro.n / 2;
	struct sbx_strv seen = { 0 };
	int ret;

	/* The home's parents exist already: nothing inside it needs the world's access. */
	ret = sbx_strv_push(&seen, "/home") ?: sbx_strv_push(&seen, SBX_HOME);
	for (i = 0; !ret && i < p->ro.n; i++)
		if (path_exists(p->ro.v[i]))
			ret = push_bind(out, &seen, "--ro-bind", p->ro.v[i], p->ro.v[i]);
	for (i = 0; !ret && i < p->rw.n; i++)
		if (path_exists(p->rw.v[i]))
			ret = push_bind(out, &seen, "--bind", p->rw.v[i], p->rw.v[i]);
	/* The stub: the first program of the sandbox. */
	if (!ret)
		ret = push_bind(out, &seen, "--ro-bind", sbx_g.exec_stub, sbx_g.exec_stub);
	for (k = 0; !ret && k < in->nbinds; k++) {
		const struct sbx_bind_plan *b = &in->binds[k];
		const struct sbx_strv *sv = k < nro ? &p->bind_ro : &p->bind_rw;
		const char *host = sv->v[2 * (k < nro ? k : k - nro)];
		const char *inside = sv->v[2 * (k < nro ? k : k - nro) + 1];
		char num[16];

		switch (b->how) {
		case SBX_BIND_SKIP: break;
		case SBX_BIND_PATH:
			ret = push_bind(out, &seen, k < nro ? "--ro-bind" : "--bind", host, inside);
			break;
		case SBX_BIND_FILE:
			snprintf(num, sizeof(num), "%d", SBX_FD_FILE0 + b->file);
			ret = push_all(out, "--perms", "0600", "--file", num, inside, NULL);
			break;
		case SBX_BIND_COPY:
			ret = sbx_strv_push(out, "--bind") ?:
				sbx_strv_pushf(out, "%s/copy-%d", in->scratch->path, b->file) ?:
				push_all(out, inside, NULL);
			break;
		}
	}
	sbx_strv_clear(&seen);
	return ret;
}

int sbx_build_bwrap_argv(const struct sbx_policy *p, const struct sbx_inputs *in,
			 const char *const argv[], struct sbx_strv *out)
{
	bool per_run = sbx_g.ident == SBX_IDENTITY_PER_RUN;
	char nproc[24];
	int ret;

	ret = argv_namespaces(p, out) ?: argv_root(in->etc_mask, out) ?: argv_scratch(p, out)
		?: argv_binds(p, in, out);
	/* bwrap's own root and /dev are tmpfs without a size limit: read-only, or a child
	 * could fill the host's memory there. Not recursive: the mounts below them keep their
	 * own modes. */
	if (!ret)
		ret = push_all(out, "--remount-ro", "/dev", "--remount-ro", "/", "--seccomp",
			       SBX_STR(SBX_FD_SECCOMP), "--json-status-fd", SBX_STR(SBX_FD_STATUS),
			       NULL);
	/* The sandbox's init keeps the uid slot taken until the run's last process is gone. */
	if (!ret && in->sync)
		ret = push_all(out, "--sync-fd", SBX_STR(SBX_FD_SYNC), NULL);
	/* The stub's command line names the scratch dir: what is left of a dead worker's
	 * run is found by it (scratch.c). */
	if (!ret)
		ret = push_all(out, "--", sbx_g.exec_stub, "--run", in->scratch->name, NULL);
	snprintf(nproc, sizeof(nproc), "%llu",
		 (unsigned long long)sbx_or_default(p->limits.nproc, SBX_DEFAULT_PIDS));
	if (!ret && per_run)
		ret = push_all(out, "--drop", nproc, "--chown", SBX_HOME, NULL);
	if (!ret && argv) {
		ret = sbx_strv_push(out, "--");
		for (size_t i = 0; !ret && argv[i]; i++)
			ret = sbx_strv_push(out, argv[i]);
	}
	return ret;
}

int sbx_plan_binds(const struct sbx_policy *p, struct sbx_bind_plan **out, size_t *n)
{
	size_t nro = p->bind_ro.n / 2, nrw = p->bind_rw.n / 2;
	struct sbx_bind_plan *b;
	int files = 0, copies = 0;

	*out = NULL;
	*n = 0;
	if (!nro && !nrw)
		return 0;
	b = calloc(nro + nrw, sizeof(*b));
	if (!b)
		return -ENOMEM;
	for (size_t k = 0; k < nro + nrw; k++) {
		const char *host = k < nro ? p->bind_ro.v[2 * k] : p->bind_rw.v[2 * (k - nro)];

		if (stat(host, &b[k].st) < 0) {
			b[k].how = SBX_BIND_SKIP; /* not there: skipped, as documented */
		} else if (!S_ISREG(b[k].st.st_mode)) {
			b[k].how = SBX_BIND_PATH;
		} else if (k < nro) {
			b[k].how = SBX_BIND_FILE;
			b[k].file = files++;
		} else {
			b[k].how = SBX_BIND_COPY;
			b[k].file = copies++;
		}
	}
	if (files > SBX_MAX_FILES) {
		free(b);
		return -E2BIG;
	}
	*out = b;
	*n = nro + nrw;
	return 0;
}
