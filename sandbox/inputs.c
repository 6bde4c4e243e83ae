/* bwrap's inputs for one run, beside its argv (policy.c): the memfds it reads (the seccomp
 * filter, passwd and group, the /etc copies, the command's environment), the files the
 * policy binds (read-only ones opened, writable ones copied into the scratch dir and
 * written back once the run is over), the child's plan for bwrap or, in mode off, for
 * the command itself, and the warm key that names everything that shapes a sandbox. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "sandbox/instance.h"
#include "common/banned.h"

int sbx_data_fd(const char *text)
{
	return sbx_data_fd_n(text, strlen(text));
}

int sbx_data_fd_n(const void *data, size_t len)
{
	int fd = memfd_create("olp-data", MFD_CLOEXEC | MFD_ALLOW_SEALING), ret;

	if (fd < 0)
		return -errno;
	ret = write_all(fd, data, len);
	if (!ret && (lseek(fd, 0, SEEK_SET) < 0 ||
		     fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) < 0))
		ret = -errno;
	if (ret) {
		close(fd);
		return ret;
	}
	return fd;
}

/* Credentials are small: a file bigger than this is not copied in or back. */
#define COPY_MAX (1u << 20)

static int read_small(const char *path, struct buf *b)
{
	return buf_read_file(b, path, COPY_MAX);
}

/* Copy the host file of bind k into the scratch dir for the run to write (mode 0666 in a
 * directory only the worker can enter: the run's uid needs "other" write access). */
static int make_copy(struct instance *in, const char *host, int n)
{
	struct copy *c = &in->copies[in->ncopies];
	struct buf b = BUF_INIT, path = BUF_INIT;
	struct stat st;
	int fd, ret;

	/* No scratch dir to put it in (sbx_exec_in_place). */
	if (!in->scratch.path[0])
		return -EINVAL;
	c->host = realpath(host, NULL);
	if (!c->host)
		return -errno;
	buf_addf(&path, "%s/copy-%d", in->scratch.path, n);
	c->path = buf_detach(&path, NULL);
	in->ncopies++;
	if ((ret = read_small(c->host, &b)))
		goto out_release_buf;
	fd = open(c->path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		ret = -errno;
		goto out_release_buf;
	}
	ret = write_all(fd, b.data, b.len);
	if (!ret && (fchmod(fd, 0666) < 0 || fstat(fd, &st) < 0))
		ret = -errno;
	if (!ret)
		c->ctime = st.st_ctim;
	close(fd);
out_release_buf:
	buf_release(&b);
	return ret;
}

/* The run wrote its copy: replace the host file with it, atomically (a temporary file
 * beside it, then rename), keeping its mode. Called once the run's processes are gone. */
void sbx_copy_write_back(const struct copy *c, const char *rid)
{
	struct buf b = BUF_INIT, tmp = BUF_INIT;
	struct stat st, hst;
	const char *why = NULL;
	char rnd[17];
	int fd = -1, ret;

	if (stat(c->path, &st) < 0 ||
	    (st.st_ctim.tv_sec == c->ctime.tv_sec && st.st_ctim.tv_nsec == c->ctime.tv_nsec))
		return;
	random_hex(rnd, 8);
	buf_addf(&tmp, "%s.olp-%s", c->host, rnd);
	ret = read_small(c->path, &b);
	/* The caller's verdict on what the run left: a refusal keeps the host file. */
	if (!ret && c->check && !c->check(c->inside, b.data, b.len, &why)) {
		log_warnx(rid, "sandbox: a run's changes to %s were not kept: %s", c->host,
			  why ? why : "refused");
		goto out_release;
	}
	if (!ret && stat(c->host, &hst) < 0)
		ret = -errno;
	if (!ret) {
		fd = open(tmp.data, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
			  hst.st_mode & 07777);
		ret = fd < 0 ? -errno : write_all(fd, b.data, b.len);
	}
	if (!ret && (fchmod(fd, hst.st_mode & 07777) < 0 || fsync(fd) < 0))
		ret = -errno;
	if (fd >= 0)
		close(fd);
	if (!ret && rename(tmp.data, c->host) < 0)
		ret = -errno;
	if (ret) {
		unlink(tmp.data);
		log_warnx(rid, "sandbox: a run's changes to %s were not kept: %s", c->host,
			  strerror(-ret));
	}
out_release:
	buf_release(&tmp);
	buf_release(&b);
}

/* Open the files and make the copies the bind plan names; the fds go to plan slots. */
static int prepare_binds(const struct sbx_policy *p, const struct sbx_inputs *in,
			 struct instance *inst, struct child_plan *plan)
{
	size_t nro = p->bind_ro.n / 2;
	int ret = 0;

	inst->copies = in->nbinds ? xcalloc(in->nbinds, sizeof(*inst->copies)) : NULL;
	for (size_t k = 0; !ret && k < in->nbinds; k++) {
		const struct sbx_bind_plan *b = &in->binds[k];
		const char *host = k < nro ? p->bind_ro.v[2 * k] : p->bind_rw.v[2 * (k - nro)];
		struct stat st;
		int fd;

		if (b->how == SBX_BIND_COPY) {
			size_t at = inst->ncopies;

			ret = make_copy(inst, host, b->file);
			/* What decides the write-back goes with the copy: a warm instance is
			 * released under another policy object than the one that made it. */
			if (inst->ncopies > at) {
				inst->copies[at].inside = xstrdup(p->bind_rw.v[2 * (k - nro) + 1]);
				inst->copies[at].check =
					p->rw_checks ? p->rw_checks[k - nro] : NULL;
			}
		} else if (b->how == SBX_BIND_FILE) {
			fd = open(host, O_RDONLY | O_CLOEXEC | O_NOCTTY);
			if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
				ret = fd < 0 ? -errno : -EINVAL;
				if (fd >= 0)
					close(fd);
				break;
			}
			plan->fds[SBX_FD_FILE0 + b->file] = fd;
		}
	}
	return ret;
}

/* bwrap's fixed inputs: the filter, passwd and group, the /etc copies. */
/* The command's environment as the stub reads it (stub.h, SBX_ENV_PATH). fd or -errno. */
static int env_fd(const struct sbx_policy *p)
{
	struct buf b = BUF_INIT;
	int fd;

	for (size_t i = 0; i < p->env.n; i++)
		buf_add(&b, p->env.v[i], strlen(p->env.v[i]) + 1);
	if (b.len > SBX_ENV_MAX) {
		buf_release(&b);
		return -E2BIG;
	}
	if (!b.len)
		return sbx_data_fd_n("", 0);
	fd = sbx_data_fd_n(b.data, b.len);
	/* The copy in the memfd is the one that counts: wipe ours (it may hold a key). */
	explicit_bzero(b.data, b.len);
	buf_release(&b);
	return fd;
}

static int prepare_bwrap_inputs(const struct sbx_policy *p, struct child_plan *plan,
				struct sbx_inputs *in, struct sbx_result *res)
{
	int etc[SBX_ETC_FILES];

	plan->fds[SBX_FD_SECCOMP] = sbx_seccomp_fd();
	if (plan->fds[SBX_FD_SECCOMP] < 0) {
		res->spawn_stage = "seccomp";
		return plan->fds[SBX_FD_SECCOMP];
	}
	plan->fds[SBX_FD_PASSWD] = sbx_data_fd(SBX_PASSWD_TEXT);
	plan->fds[SBX_FD_GROUP] = sbx_data_fd(SBX_GROUP_TEXT);
	if (plan->fds[SBX_FD_PASSWD] < 0 || plan->fds[SBX_FD_GROUP] < 0) {
		res->spawn_stage = "passwd";
		return plan->fds[SBX_FD_PASSWD] < 0 ? plan->fds[SBX_FD_PASSWD]
						    : plan->fds[SBX_FD_GROUP];
	}
	in->etc_mask = sbx_etc_open(etc);
	for (size_t i = 0; i < SBX_ETC_FILES; i++)
		plan->fds[SBX_FD_ETC0 + i] = etc[i];
	plan->fds[SBX_FD_ENV] = env_fd(p);
	if (plan->fds[SBX_FD_ENV] < 0) {
		res->spawn_stage = "environment";
		return plan->fds[SBX_FD_ENV];
	}
	return 0;
}

/* bwrap for argv under p (argv NULL: a warm sandbox, whose stub waits for its command):
 * the bind plan and the files it opens, the filter, passwd, group and /etc copies, the
 * command line, the uid slot. stdio, status and report are the caller's to place. */
int sbx_plan_bwrap(const struct sbx_policy *p, const char *const argv[], struct instance *in,
		   struct sbx_inputs *inputs, struct child_plan *plan, struct strv *args,
		   struct sbx_result *res)
{
	static char *const no_env[] = { NULL }; /* the command's is SBX_ENV_PATH (stub.h) */
	int ret;

	inputs->sync = in->id.lock_fd >= 0;
	ret = sbx_plan_binds(p, &inputs->binds, &inputs->nbinds) ?:
		prepare_bwrap_inputs(p, plan, inputs, res) ?:
		prepare_binds(p, inputs, in, plan);
	if (ret)
		return ret;
	sbx_build_bwrap_argv(p, inputs, argv, args);
	plan->path = args->v[0];
	plan->argv = args->v;
	plan->envp = no_env;
	plan->fds[SBX_FD_SYNC] = inputs->sync ? in->id.lock_fd : -1;
	plan->nfds = SBX_FD_COUNT;
	plan->userns_fd = in->id.userns_fd;
	return 0;
}

/* Mode off: the command itself, in the scratch home, which is its HOME at its host path. */
void sbx_plan_direct(const struct sbx_policy *p, const char *const argv[],
		     const struct instance *in, struct child_plan *plan, struct strv *args,
		     struct strv *envp)
{
	for (size_t i = 0; argv[i]; i++)
		strv_push(args, argv[i]);
	sbx_build_envp(p, envp);
	(void)strv_setenv(envp, "HOME", in->scratch.home);
	plan->path = args->v[0];
	plan->argv = args->v;
	plan->envp = envp->v;
	plan->nfds = 3;
	plan->cwd_fd = in->scratch.home_fd;
	plan->exec_is_command = true;
}

/* The warm key of a policy (pool.c): everything that shapes its sandbox. NULL when no run
 * of it can start. */
char *sbx_policy_key(const struct sbx_policy *p)
{
	struct sbx_scratch fake = { .name = "@scratch", .path = "@scratch" };
	struct sbx_inputs in = { .scratch = &fake,
				 .etc_mask = sbx_etc_mask(),
				 .sync = sbx_g.ident == SBX_IDENTITY_PER_RUN };
	size_t nro = p->bind_ro.n / 2;
	struct strv args = STRV_INIT;
	struct child_plan plan = { 0 };
	struct buf key = BUF_INIT;

	/* Too many files to bind: no run of it can start, warm or cold. */
	if (sbx_plan_binds(p, &in.binds, &in.nbinds))
		return NULL;
	sbx_build_bwrap_argv(p, &in, NULL, &args);
	for (size_t i = 0; i < args.n; i++) {
		buf_adds(&key, args.v[i]);
		buf_addch(&key, '\x1f');
	}
	/* A file given as a copy is keyed by what it is now: a sandbox made before the file
	 * changed (a refreshed login) is not the same sandbox. */
	for (size_t k = 0; k < in.nbinds; k++) {
		const struct stat *st = &in.binds[k].st;

		if (in.binds[k].how == SBX_BIND_FILE || in.binds[k].how == SBX_BIND_COPY)
			buf_addf(&key, "%s:%llu:%llu:%lld:%lld.%ld\x1f",
				 k < nro ? p->bind_ro.v[2 * k] : p->bind_rw.v[2 * (k - nro)],
				 (unsigned long long)st->st_dev, (unsigned long long)st->st_ino,
				 (long long)st->st_size, (long long)st->st_mtim.tv_sec,
				 st->st_mtim.tv_nsec);
	}
	/* Who decides a write-back is part of the sandbox: a warm one keeps what made it. */
	for (size_t k = 0; k < p->bind_rw.n / 2; k++)
		buf_addf(&key, "check%zu=%p,", k, p->rw_checks ? (void *)p->rw_checks[k] : NULL);
	sbx_child_set_rlimits(&plan, p);
	for (size_t i = 0; i < ARRAY_SIZE(plan.rl); i++)
		buf_addf(&key, "%llu,", (unsigned long long)plan.rl[i].rlim_cur);
	/* bwrap's argv is the same for HOST and LOOPBACK (neither has --unshare-net): the
	 * network mode and port say which namespace the sandbox was made in. */
	buf_addf(&key, "net=%d:%u,", (int)p->net, (unsigned)p->net_port);
	/* The environment is no longer on bwrap's command line (stub.h): key it here. */
	for (size_t i = 0; i < p->env.n; i++) {
		buf_adds(&key, p->env.v[i]);
		buf_addch(&key, '\x1e');
	}
	buf_addf(&key, "cg=%llu,%llu,%llu", (unsigned long long)p->limits.memory_mb,
		 (unsigned long long)p->limits.pids, (unsigned long long)p->limits.cpu_pct);
	free(in.binds);
	strv_release(&args);
	return buf_detach(&key, NULL);
}
