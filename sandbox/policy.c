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
	p->limits = *l;
}

void sbx_policy_allow_unix_sockets(struct sbx_policy *p, bool allow)
{
	p->allow_unix = allow;
}

void sbx_policy_allow_nested_userns(struct sbx_policy *p, bool allow)
{
	p->nested_userns = allow;
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

int sbx_build_bwrap_argv(const struct sbx_policy *p, const struct sbx_scratch *s,
			 const char *const argv[], const char *stub, unsigned int etc_mask,
			 struct sbx_strv *out)
{
	char link[PATH_MAX];
	size_t i;
	int ret;

	ret = push_all(out, sbx_g.bwrap_path,
		       /* New namespaces of every kind: the child sees no host process, IPC
			* object, hostname or cgroup, and has no capability in the host. */
		       "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts",
		       "--unshare-cgroup-try", "--uid", "1000", "--gid", "1000", "--hostname",
		       SBX_HOSTNAME,
		       /* The tree dies with us and cannot reach our terminal (TIOCSTI). */
		       "--die-with-parent", "--new-session", "--cap-drop", "ALL",
		       /* The environment is rebuilt from the policy alone. */
		       "--clearenv", NULL);
	if (ret)
		return ret;
	if (!p->network && (ret = sbx_strv_push(out, "--unshare-net")))
		return ret;
	/* No nested user namespace: the kernel's most exposed surface from inside one. */
	if (!p->nested_userns && (ret = sbx_strv_push(out, "--disable-userns")))
		return ret;
	for (i = 0; i < p->env.n; i++) {
		const char *kv = p->env.v[i], *eq = strchr(kv, '=');
		char name[256];
		size_t nl = (size_t)(eq - kv);

		if (nl >= sizeof(name))
			return -EINVAL;
		memcpy(name, kv, nl);
		name[nl] = '\0';
		if ((ret = push_all(out, "--setenv", name, eq + 1, NULL)))
			return ret;
	}
	/* An allowlisted root: /usr read-only and the links into it, nothing else of the
	 * host's file system unless the policy names it. */
	if ((ret = push_all(out, "--ro-bind", "/usr", "/usr", NULL)))
		return ret;
	for (i = 0; i + 1 < sbx_g.root_links.n; i += 2)
		if ((ret = push_all(out, "--symlink", sbx_g.root_links.v[i],
				    sbx_g.root_links.v[i + 1], NULL)))
			return ret;
	for (i = 0; i < sbx_g.root_dirs.n; i++)
		if ((ret = push_all(out, "--ro-bind", sbx_g.root_dirs.v[i], sbx_g.root_dirs.v[i],
				    NULL)))
			return ret;
	for (i = 0; i < SBX_ETC_FILES; i++) {
		char fd[16];

		snprintf(fd, sizeof(fd), "%d", SBX_FD_ETC0 + (int)i);
		if ((etc_mask & (1u << i)) &&
		    (ret = push_all(out, "--perms", "0644", "--file", fd, etc_files[i], NULL)))
			return ret;
	}
	if (localtime_link(link, sizeof(link)) &&
	    (ret = push_all(out, "--symlink", link, etc_files[ETC_LOCALTIME], NULL)))
		return ret;
	for (i = 0; i < ARRAY_SIZE(etc_dirs); i++)
		if (path_exists(etc_dirs[i]) &&
		    (ret = push_all(out, "--ro-bind", etc_dirs[i], etc_dirs[i], NULL)))
			return ret;
	/* A passwd and group that name only the sandbox user: no host account is listed. */
	ret = push_all(out, "--perms", "0644", "--file", SBX_STR(SBX_FD_PASSWD), "/etc/passwd",
		       "--perms", "0644", "--file", SBX_STR(SBX_FD_GROUP), "/etc/group", NULL);
	if (ret)
		return ret;
	/* /dev/shm gets a size-limited tmpfs of its own: /dev itself is made read-only at
	 * the end, like the root. */
	ret = push_all(out, "--proc", "/proc", "--dev", "/dev", "--size", "67108864", "--tmpfs",
		       "/dev/shm", "--size", "268435456", "--tmpfs", "/tmp", "--bind", s->home,
		       SBX_HOME, "--chdir", SBX_HOME, NULL);
	if (ret)
		return ret;
	for (i = 0; i < p->ro.n; i++)
		if (path_exists(p->ro.v[i]) &&
		    (ret = push_all(out, "--ro-bind", p->ro.v[i], p->ro.v[i], NULL)))
			return ret;
	for (i = 0; i < p->rw.n; i++)
		if (path_exists(p->rw.v[i]) &&
		    (ret = push_all(out, "--bind", p->rw.v[i], p->rw.v[i], NULL)))
			return ret;
	/* After the scratch home, so that a bind may land inside it (credentials). */
	for (i = 0; i + 1 < p->bind_ro.n; i += 2)
		if (path_exists(p->bind_ro.v[i]) &&
		    (ret = push_all(out, "--ro-bind", p->bind_ro.v[i], p->bind_ro.v[i + 1], NULL)))
			return ret;
	for (i = 0; i + 1 < p->bind_rw.n; i += 2)
		if (path_exists(p->bind_rw.v[i]) &&
		    (ret = push_all(out, "--bind", p->bind_rw.v[i], p->bind_rw.v[i + 1], NULL)))
			return ret;
	/* A warm sandbox's payload waits for its command (spawn.c, olp-sandbox-exec). */
	if (stub && (ret = push_all(out, "--ro-bind", stub, stub, NULL)))
		return ret;
	/* bwrap's own root and /dev are tmpfs without a size limit: read-only, or a child
	 * could fill the host's memory there (rather than in the 256 MiB /tmp). Not
	 * recursive: the mounts below them keep their own modes. */
	ret = push_all(out, "--remount-ro", "/dev", "--remount-ro", "/", "--seccomp",
		       SBX_STR(SBX_FD_SECCOMP), "--json-status-fd", SBX_STR(SBX_FD_STATUS), "--",
		       NULL);
	if (ret)
		return ret;
	for (i = 0; argv[i]; i++)
		if ((ret = sbx_strv_push(out, argv[i])))
			return ret;
	return 0;
}
