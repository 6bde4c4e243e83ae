/* Process-wide sandbox settings and the cached status that /health reports. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "sandbox/internal.h"
#include "common/banned.h"

struct sbx_global sbx_g = { .runtime_fd = -1, .cg_fd = -1 };

/* Top-level entries that point into /usr on a merged-/usr system, or are real directories
 * on an older one. */
static const char *const root_entries[] = {
	"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"
};

static void scan_root_layout(void)
{
	for (size_t i = 0; i < ARRAY_SIZE(root_entries); i++) {
		char target[PATH_MAX];
		struct stat st;
		ssize_t n;

		if (lstat(root_entries[i], &st) < 0)
			continue;
		if (S_ISLNK(st.st_mode)) {
			n = readlink(root_entries[i], target, sizeof(target) - 1);
			if (n <= 0)
				continue;
			target[n] = '\0';
			strv_push(&sbx_g.root_links, target);
			strv_push(&sbx_g.root_links, root_entries[i]);
		} else if (S_ISDIR(st.st_mode)) {
			strv_push(&sbx_g.root_dirs, root_entries[i]);
		}
	}
}

static int mkdir_p(const char *path, mode_t mode)
{
	char tmp[PATH_MAX];
	size_t len = strlen(path), i;

	if (len == 0 || len >= sizeof(tmp))
		return -ENAMETOOLONG;
	memcpy(tmp, path, len + 1);
	for (i = 1; i <= len; i++) {
		if (tmp[i] != '/' && tmp[i] != '\0')
			continue;
		tmp[i] = '\0';
		if (mkdir(tmp, mode) < 0 && errno != EEXIST)
			return -errno;
		tmp[i] = i == len ? '\0' : '/';
	}
	return 0;
}

int sbx_global_init(const struct sbx_global_config *cfg)
{
	struct sigaction sa;
	struct stat st;
	const char *stub;
	int ret = 0;

	sbx_global_release();
	if (!cfg->runtime_dir || cfg->runtime_dir[0] != '/')
		return -EINVAL;
	sbx_g.mode = cfg->mode;
	sbx_g.bwrap_path = xstrdup(cfg->bwrap_path ? cfg->bwrap_path : "/usr/bin/bwrap");
	sbx_g.runtime_dir = xstrdup(cfg->runtime_dir);
	stub = cfg->exec_stub ? cfg->exec_stub : getenv("OLP_SANDBOX_EXEC");
	sbx_g.exec_stub = xstrdup(stub && *stub ? stub : SBX_DEFAULT_EXEC_STUB);
	sbx_g.warm = cfg->warm;
	sbx_g.warm_per_key = cfg->warm_per_policy ? cfg->warm_per_policy : 2;
	if (sbx_g.warm_per_key > SBX_WARM_PER_POLICY_MAX)
		sbx_g.warm_per_key = SBX_WARM_PER_POLICY_MAX;
	sbx_g.prestart_max = cfg->prestart_max;
	sbx_g.prestart_idle_ms = cfg->prestart_idle_ms ? cfg->prestart_idle_ms : 300000;
	sbx_g.prestart_per_owner =
		cfg->prestart_per_owner ? cfg->prestart_per_owner : (cfg->prestart_max + 1) / 2;
	if (sbx_g.prestart_per_owner > cfg->prestart_max)
		sbx_g.prestart_per_owner = cfg->prestart_max;
	sbx_g.on_prestart = cfg->on_prestart;
	ret = mkdir_p(sbx_g.runtime_dir, 0700);
	if (ret)
		goto fail_release;
	sbx_g.runtime_fd = open(sbx_g.runtime_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sbx_g.runtime_fd < 0) {
		ret = -errno;
		goto fail_release;
	}
	/* Scratch dirs hold one tenant's files: nobody else on the host may look in. */
	if (fstat(sbx_g.runtime_fd, &st) == 0 && (st.st_mode & 077))
		fchmod(sbx_g.runtime_fd, st.st_mode & 0700);
	scan_root_layout();
	/* A dead reader must surface as EPIPE, not kill the worker; children are reaped by
	 * the thread that started them, so SIGCHLD must not be ignored. */
	sigaction(SIGPIPE, NULL, &sa);
	if (sa.sa_handler == SIG_DFL)
		(void)signal(SIGPIPE, SIG_IGN);
	sigaction(SIGCHLD, NULL, &sa);
	if (sa.sa_handler == SIG_IGN)
		(void)signal(SIGCHLD, SIG_DFL);
	sbx_scratch_sweep_stale();
	sbx_cgroup_init(cfg->cgroup);
	sbx_ident_init(cfg->identity, cfg->uid_range);
	return 0;

fail_release:
	sbx_global_release();
	return ret;
}

void sbx_global_release(void)
{
	sbx_prestart_release_all();
	sbx_warm_release_all();
	free(sbx_g.exec_stub);
	free(sbx_g.bwrap_path);
	free(sbx_g.runtime_dir);
	if (sbx_g.runtime_fd >= 0)
		close(sbx_g.runtime_fd);
	strv_release(&sbx_g.root_links);
	strv_release(&sbx_g.root_dirs);
	sbx_cgroup_release();
	sbx_ident_release_all();
	sbx_g = (struct sbx_global){ .runtime_fd = -1, .cg_fd = -1 };
}

enum sbx_mode sbx_global_mode(void)
{
	return sbx_g.mode;
}

/* ---- status -------------------------------------------------------------------------- */

static struct sbx_status status;
static char version_buf[64];
static char message_buf[640];
static char cgroup_buf[512];
static char ident_buf[512];
static pthread_once_t status_once = PTHREAD_ONCE_INIT;

static int collect(void *ctx, const char *data, size_t len)
{
	struct buf *b = ctx;

	if (b->len < 4096)
		buf_add(b, data, len);
	return 0;
}

/* A program the sandbox needs is not there: say so, with what to do. */
static bool missing(const char *path, const char *what, const char *fix)
{
	if (path && access(path, X_OK) == 0)
		return false;
	snprintf(message_buf, sizeof(message_buf), "%s not found at %s. %s", what,
		 path ? path : "(unset)", fix);
	status.message = message_buf;
	return true;
}

static void status_compute(void)
{
	struct sbx_policy *p;
	struct sbx_result res;
	struct buf out = BUF_INIT;
	struct sbx_callbacks cb = { .on_stdout = collect, .ctx = &out };
	int ret;

	status.mode = sbx_g.mode == SBX_MODE_OFF ? "off" : "bwrap";
	status.bwrap_path = sbx_g.bwrap_path;
	status.cgroup = sbx_g.cg_fd >= 0 ? "cgroup2" : "rlimits";
	snprintf(cgroup_buf, sizeof(cgroup_buf), "%s", sbx_g.cg_reason);
	status.cgroup_detail = cgroup_buf;
	status.identity = !sbx_g.ident_ok		       ? "unavailable"
			  : sbx_g.ident == SBX_IDENTITY_SHARED ? "shared"
							       : "per_run";
	snprintf(ident_buf, sizeof(ident_buf), "%s", sbx_g.ident_reason);
	status.identity_detail = ident_buf;
	if (missing(sbx_g.bwrap_path, "bubblewrap",
		    "Install: sudo apt-get install -y bubblewrap") ||
	    missing(sbx_g.exec_stub, "olp-sandbox-exec", "Set OLP_SANDBOX_EXEC"))
		return;
	p = sbx_policy_new();
	sbx_policy_set_timeout_ms(p, 10000);
	/* bwrap --version, run as a plain child. */
	p->wrap = SBX_WRAP_NEVER;
	ret = sbx_run(p, (const char *const[]){ sbx_g.bwrap_path, "--version", NULL }, NULL, &cb,
		      &res);
	if (!ret && res.end == SBX_END_EXITED && res.exit_status == 0) {
		const char *v = out.data;

		while (*v && (*v < '0' || *v > '9'))
			v++;
		snprintf(version_buf, sizeof(version_buf), "%.*s", (int)strcspn(v, " \n"), v);
		status.bwrap_version = version_buf;
	}
	/* Then a real sandboxed spawn, whatever the mode: the only reliable test that this
	 * host lets us create the namespaces. */
	p->wrap = SBX_WRAP_ALWAYS;
	ret = sbx_run(p, (const char *const[]){ "/usr/bin/true", NULL }, NULL, NULL, &res);
	status.available = !ret && res.end == SBX_END_EXITED && res.exit_status == 0;
	/* That run loaded the filter through bwrap --seccomp, or it would have failed. */
	status.seccomp = status.available;
	if (sbx_g.mode == SBX_MODE_OFF) {
		status.message = "sandbox.mode is \"off\" in config.json: provider commands run "
				 "WITHOUT isolation";
	} else if (!sbx_g.ident_ok) {
		/* Fail closed: no run without an identity of its own, unless the operator
		 * chose "shared" (reported as such). */
		status.available = false;
		snprintf(message_buf, sizeof(message_buf),
			 "runs cannot get a host uid of their own: %s", sbx_g.ident_reason);
		status.message = message_buf;
	} else if (!status.available) {
		snprintf(message_buf, sizeof(message_buf),
			 "bubblewrap cannot start a sandbox here (%s%s%.300s)",
			 ret ? strerror(-ret) : sbx_end_name(res.end),
			 res.stderr_tail[0] ? ": " : "", res.stderr_tail);
		message_buf[strcspn(message_buf, "\n")] = '\0';
		status.message = message_buf;
	}
	status.active = status.available && sbx_g.mode == SBX_MODE_BWRAP;
	sbx_policy_free(p);
	buf_release(&out);
}

const struct sbx_status *sbx_status_get(void)
{
	pthread_once(&status_once, status_compute);
	return &status;
}
