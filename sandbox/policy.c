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

/* The baseline environment: the rest of the host's never reaches the command. */
static const struct {
	const char *name, *value;
} base_env[] = {
	{ "PATH", "/usr/local/bin:/usr/bin:/bin" },
	{ "HOME", SBX_HOME },
	{ "LANG", "C.UTF-8" },
	{ "TMPDIR", "/tmp" },
	{ "USER", "olp" },
};

struct sbx_policy *sbx_policy_new(void)
{
	struct sbx_policy *p = xcalloc(1, sizeof(*p));

	for (size_t i = 0; i < ARRAY_SIZE(base_env); i++)
		(void)strv_setenv(&p->env, base_env[i].name, base_env[i].value);
	return p;
}

void sbx_policy_free(struct sbx_policy *p)
{
	if (!p)
		return;
	strv_release(&p->ro);
	strv_release(&p->rw);
	strv_release(&p->env);
	strv_release(&p->bind_ro);
	strv_release(&p->bind_rw);
	free(p->rw_checks);
	free(p);
}

void sbx_policy_set_net(struct sbx_policy *p, enum sbx_net net, uint16_t port)
{
	p->net = net;
	p->net_port = net == SBX_NET_LOOPBACK ? port : 0;
}

void sbx_policy_set_network(struct sbx_policy *p, bool on)
{
	sbx_policy_set_net(p, on ? SBX_NET_HOST : SBX_NET_NONE, 0);
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

static int check_abs(const char *path)
{
	/* Relative paths would resolve against whatever directory bwrap runs in. */
	return path && path[0] == '/' ? 0 : -EINVAL;
}

int sbx_policy_add_ro(struct sbx_policy *p, const char *host_path)
{
	if (check_abs(host_path))
		return -EINVAL;
	strv_push(&p->ro, host_path);
	return 0;
}

int sbx_policy_add_rw(struct sbx_policy *p, const char *host_path)
{
	if (check_abs(host_path))
		return -EINVAL;
	strv_push(&p->rw, host_path);
	return 0;
}

/* A path inside must say where it lands without relying on how ".." resolves there. */
static bool has_dotdot(const char *path)
{
	for (const char *c = path; (c = strstr(c, "..")); c += 2)
		if ((c == path || c[-1] == '/') && (c[2] == '/' || c[2] == '\0'))
			return true;
	return false;
}

int sbx_policy_add_bind_checked(struct sbx_policy *p, const char *host_path, const char *inside,
				sbx_writeback_check check)
{
	size_t n = p->bind_rw.n / 2;

	if (check_abs(host_path) || check_abs(inside) || has_dotdot(inside) || !strcmp(inside, "/"))
		return -EINVAL;
	strv_push(&p->bind_rw, host_path);
	strv_push(&p->bind_rw, inside);
	p->rw_checks = xreallocarray(p->rw_checks, n + 1, sizeof(*p->rw_checks));
	p->rw_checks[n] = check;
	return 0;
}

int sbx_policy_add_bind(struct sbx_policy *p, const char *host_path, const char *inside,
			bool writable)
{
	if (writable)
		return sbx_policy_add_bind_checked(p, host_path, inside, NULL);
	if (check_abs(host_path) || check_abs(inside) || has_dotdot(inside) || !strcmp(inside, "/"))
		return -EINVAL;
	strv_push(&p->bind_ro, host_path);
	strv_push(&p->bind_ro, inside);
	return 0;
}

int sbx_policy_setenv(struct sbx_policy *p, const char *name, const char *value)
{
	return strv_setenv(&p->env, name, value);
}

void sbx_build_envp(const struct sbx_policy *p, struct strv *out)
{
	for (size_t i = 0; i < p->env.n; i++)
		strv_push(out, p->env.v[i]);
}

static void push_all(struct strv *out, ...)
{
	va_list ap;
	const char *s;

	va_start(ap, out);
	/* A clang-analyzer 14 false positive: ap is initialized by va_start just above. */
	/* NOLINTNEXTLINE(clang-analyzer-valist.Uninitialized) */
	while ((s = va_arg(ap, const char *)))
		strv_push(out, s);
	va_end(ap);
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
static void argv_namespaces(const struct sbx_policy *p, struct strv *out)
{
	push_all(out, sbx_g.bwrap_path,
		 /* New namespaces of every kind: the child sees no host process, IPC object,
		  * hostname or cgroup. */
		 "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
		 "--hostname", SBX_HOSTNAME,
		 /* The tree dies with us and cannot reach our terminal (TIOCSTI). */
		 "--die-with-parent", "--new-session", "--cap-drop", "ALL",
		 /* The environment is rebuilt from the policy alone. */
		 "--clearenv", NULL);
	if (sbx_g.ident == SBX_IDENTITY_PER_RUN) {
		/* bwrap runs in the run's user namespace (joined before its exec, ident.c),
		 * as its root. The stub keeps just what it needs to hand the home to the
		 * sandbox user, empty the bounding set and become that user, which drops every
		 * capability. Nested user namespaces are refused there
		 * (user.max_user_namespaces = 0), as --disable-userns would. */
		push_all(out, "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add",
			 "CAP_CHOWN", "--cap-add", "CAP_SETPCAP", NULL);
	} else {
		/* Mode shared: a user namespace of bwrap's own, the sandbox user mapped onto
		 * the worker's; no nested one (the kernel's most exposed surface from inside). */
		push_all(out, "--unshare-user", "--uid", SBX_STR(SBX_UID), "--gid",
			 SBX_STR(SBX_GID), "--disable-userns", NULL);
	}
	if (p->net == SBX_NET_NONE)
		strv_push(out, "--unshare-net");
}

/* An allowlisted root: /usr read-only and the links into it, copies of a few /etc files,
 * nothing else of the host's file system unless the policy names it. */
static void argv_root(unsigned int etc_mask, struct strv *out)
{
	char link[PATH_MAX];
	size_t i;

	push_all(out, "--ro-bind", "/usr", "/usr", NULL);
	for (i = 0; i + 1 < sbx_g.root_links.n; i += 2)
		push_all(out, "--symlink", sbx_g.root_links.v[i], sbx_g.root_links.v[i + 1], NULL);
	for (i = 0; i < sbx_g.root_dirs.n; i++)
		push_all(out, "--ro-bind", sbx_g.root_dirs.v[i], sbx_g.root_dirs.v[i], NULL);
	for (i = 0; i < SBX_ETC_FILES; i++) {
		if (!(etc_mask & (1u << i)))
			continue;
		push_all(out, "--perms", "0644", "--file", NULL);
		strv_pushf(out, "%d", SBX_FD_ETC0 + (int)i);
		strv_push(out, etc_files[i]);
	}
	if (localtime_link(link, sizeof(link)))
		push_all(out, "--symlink", link, etc_files[ETC_LOCALTIME], NULL);
	for (i = 0; i < ARRAY_SIZE(etc_dirs); i++)
		if (path_exists(etc_dirs[i]))
			push_all(out, "--ro-bind", etc_dirs[i], etc_dirs[i], NULL);
	/* A passwd and group that name only the sandbox user: no host account is listed. */
	push_all(out, "--perms", "0644", "--file", SBX_STR(SBX_FD_PASSWD), "/etc/passwd", "--perms",
		 "0644", "--file", SBX_STR(SBX_FD_GROUP), "/etc/group", NULL);
	/* The command's environment, for the stub (stub.h): the sandbox's root owns it; where
	 * the run has its own uid, the command cannot read the file (only its own
	 * environment), and in mode shared the stub already is the sandbox user. */
	push_all(out, "--perms", sbx_g.ident == SBX_IDENTITY_PER_RUN ? "0400" : "0444", "--file",
		 SBX_STR(SBX_FD_ENV), SBX_ENV_PATH, NULL);
}

/* /proc, /dev and the run's writable space. */
static void argv_scratch(const struct sbx_policy *p, struct strv *out)
{
	uint64_t disk = sbx_or_default(p->limits.disk_mb, SBX_DEFAULT_DISK_MB) << 20;
	char home_size[32], tmp_size[32];

	/* The scratch space is a size-limited tmpfs each (the run's disk budget, in memory
	 * that the run's cgroup is charged for where there is one): 3/4 for the home, 1/4
	 * for /tmp. /dev/shm has its own 64 MiB. */
	snprintf(tmp_size, sizeof(tmp_size), "%llu", (unsigned long long)(disk / 4));
	snprintf(home_size, sizeof(home_size), "%llu", (unsigned long long)(disk - disk / 4));
	push_all(out, "--proc", "/proc",
		 /* The host's kernel knobs (core_pattern runs a program as host root), whoever
		  * the run is: read-only. bwrap covers them only when it could write them
		  * itself. */
		 "--ro-bind", "/proc/sys", "/proc/sys", "--ro-bind-try", "/proc/sysrq-trigger",
		 "/proc/sysrq-trigger",
		 /* /dev/shm gets a size-limited tmpfs of its own: /dev itself is made read-only
		  * at the end, like the root. */
		 "--dev", "/dev", "--perms", "01777", "--size", "67108864", "--tmpfs", "/dev/shm",
		 "--perms", "01777", "--size", tmp_size, "--tmpfs", "/tmp", "--perms", "0755",
		 "--dir", "/home", "--perms", "0700", "--size", home_size, "--tmpfs", SBX_HOME,
		 "--chdir", SBX_HOME, NULL);
}

/* bwrap 0.8.0 makes the missing parents of a bind's destination 0700, owned by bwrap's
 * uid: the command, another uid, could not reach what is bound there. Make them 0755
 * first (--dir leaves an existing directory as it is). Each once: seen collects them. */
static void push_parents(struct strv *out, struct strv *seen, const char *dest)
{
	for (const char *c = strchr(dest + 1, '/'); c; c = strchr(c + 1, '/')) {
		char *dir = xstrndup(dest, (size_t)(c - dest));

		if (strv_find(seen, dir) >= 0) {
			free(dir);
			continue;
		}
		push_all(out, "--perms", "0755", "--dir", dir, NULL);
		strv_push_take(seen, dir);
	}
}

static void push_bind(struct strv *out, struct strv *seen, const char *how, const char *src,
		      const char *dest)
{
	push_parents(out, seen, dest);
	push_all(out, how, src, dest, NULL);
}

/* One bind of the policy, as its plan says it reaches the sandbox. */
static void push_planned_bind(struct strv *out, struct strv *seen, const struct sbx_inputs *in,
			      const struct sbx_bind_plan *b, bool writable, const char *host,
			      const char *inside)
{
	switch (b->how) {
	case SBX_BIND_SKIP: break;
	case SBX_BIND_PATH:
		push_bind(out, seen, writable ? "--bind" : "--ro-bind", host, inside);
		break;
	case SBX_BIND_FILE:
		push_all(out, "--perms", "0600", "--file", NULL);
		strv_pushf(out, "%d", SBX_FD_FILE0 + b->file);
		strv_push(out, inside);
		break;
	case SBX_BIND_COPY:
		strv_push(out, "--bind");
		strv_pushf(out, "%s/copy-%d", in->scratch->path, b->file);
		strv_push(out, inside);
		break;
	}
}

/* The policy's own paths; after the home, so that a bind may land inside it. */
static void argv_binds(const struct sbx_policy *p, const struct sbx_inputs *in, struct strv *out)
{
	size_t i, nro = p->bind_ro.n / 2;
	struct strv seen = STRV_INIT;

	/* The home's parents exist already: nothing inside it needs the world's access. */
	strv_push(&seen, "/home");
	strv_push(&seen, SBX_HOME);
	for (i = 0; i < p->ro.n; i++)
		if (path_exists(p->ro.v[i]))
			push_bind(out, &seen, "--ro-bind", p->ro.v[i], p->ro.v[i]);
	for (i = 0; i < p->rw.n; i++)
		if (path_exists(p->rw.v[i]))
			push_bind(out, &seen, "--bind", p->rw.v[i], p->rw.v[i]);
	/* The stub: the first program of the sandbox. */
	push_bind(out, &seen, "--ro-bind", sbx_g.exec_stub, sbx_g.exec_stub);
	for (size_t k = 0; k < in->nbinds; k++) {
		bool rw = k >= nro;
		const struct strv *sv = rw ? &p->bind_rw : &p->bind_ro;
		size_t j = 2 * (rw ? k - nro : k);

		push_planned_bind(out, &seen, in, &in->binds[k], rw, sv->v[j], sv->v[j + 1]);
	}
	strv_release(&seen);
}

void sbx_build_bwrap_argv(const struct sbx_policy *p, const struct sbx_inputs *in,
			  const char *const argv[], struct strv *out)
{
	argv_namespaces(p, out);
	argv_root(in->etc_mask, out);
	argv_scratch(p, out);
	argv_binds(p, in, out);
	/* bwrap's own root and /dev are tmpfs without a size limit: read-only, or a child
	 * could fill the host's memory there. Not recursive: the mounts below them keep their
	 * own modes. */
	push_all(out, "--remount-ro", "/dev", "--remount-ro", "/", "--seccomp",
		 SBX_STR(SBX_FD_SECCOMP), "--json-status-fd", SBX_STR(SBX_FD_STATUS), NULL);
	/* The sandbox's init keeps the uid slot taken until the run's last process is gone. */
	if (in->sync)
		push_all(out, "--sync-fd", SBX_STR(SBX_FD_SYNC), NULL);
	/* The stub's command line names the scratch dir: what is left of a dead worker's
	 * run is found by it (scratch.c). */
	push_all(out, "--", sbx_g.exec_stub, "--run", in->scratch->name, NULL);
	if (sbx_g.ident == SBX_IDENTITY_PER_RUN) {
		strv_push(out, "--drop");
		strv_pushf(out, "%llu",
			   (unsigned long long)sbx_or_default(p->limits.nproc, SBX_DEFAULT_PIDS));
		push_all(out, "--chown", SBX_HOME, NULL);
	}
	if (argv) {
		strv_push(out, "--");
		for (size_t i = 0; argv[i]; i++)
			strv_push(out, argv[i]);
	}
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
	b = xcalloc(nro + nrw, sizeof(*b));
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
