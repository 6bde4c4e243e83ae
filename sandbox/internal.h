/* Private to sandbox/: the policy's layout and the steps shared by its files. */
#ifndef OLP_SANDBOX_INTERNAL_H
#define OLP_SANDBOX_INTERNAL_H

#include "sandbox/sandbox.h"

struct sbx_strv {
	char **v; /* NULL-terminated */
	size_t n;
};

struct sbx_policy {
	bool network;
	uint64_t timeout_ms;
	struct sbx_strv ro;	 /* host paths bound read-only */
	struct sbx_strv rw;	 /* host paths bound read-write */
	struct sbx_strv env;	 /* "NAME=value", last one wins */
	struct sbx_strv bind_ro; /* pairs: host path, path inside */
	struct sbx_strv bind_rw; /* pairs: host path, path inside */
	bool allow_unix;
	bool nested_userns;
	struct sbx_limits limits;
	/* internal: whether to wrap in bwrap; the status probe overrides the mode */
	enum { SBX_WRAP_BY_MODE = 0, SBX_WRAP_NEVER, SBX_WRAP_ALWAYS } wrap;
};

/* Process-wide state set by sbx_global_init. */
struct sbx_global {
	enum sbx_mode mode;
	char *bwrap_path;
	char *runtime_dir;
	int runtime_fd;		     /* O_PATH|O_DIRECTORY on runtime_dir */
	char *exec_stub;	     /* olp-sandbox-exec, or NULL: no warm sandboxes */
	struct sbx_strv root_links;  /* pairs: "target", "/name" for the merged-/usr links */
	struct sbx_strv root_dirs;   /* top-level lib dirs that are real directories */
	int cg_fd;		     /* the delegated cgroup v2 runs are made in, or -1 */
	char *cg_path;		     /* its path, or NULL */
	unsigned int cg_controllers; /* SBX_CG_* offered there */
	char cg_reason[512];	     /* cg_path, or why no cgroup is used */
};
extern struct sbx_global sbx_g;

int sbx_strv_push(struct sbx_strv *sv, const char *s);
int sbx_strv_pushf(struct sbx_strv *sv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sbx_strv_clear(struct sbx_strv *sv);
/* Set NAME=value in a "NAME=value" vector, replacing an existing NAME. */
int sbx_strv_setenv(struct sbx_strv *sv, const char *name, const char *value);

/* A limit's value: v, or dflt when v is 0 (the policy's "use the default"). */
static inline uint64_t sbx_or_default(uint64_t v, uint64_t dflt)
{
	return v ? v : dflt;
}

/* A sealed memfd holding text, for bwrap's --file. fd or -errno. */
int sbx_data_fd(const char *text);
/* The passwd and group files of the sandbox: its one user, nobody of the host. */
#define SBX_STR_(x) #x
#define SBX_STR(x) SBX_STR_(x)
#define SBX_PASSWD_TEXT "olp:x:" SBX_STR(SBX_UID) ":" SBX_STR(SBX_GID) ":olp:" SBX_HOME ":/bin/sh\n"
#define SBX_GROUP_TEXT "olp:x:" SBX_STR(SBX_GID) ":\n"

/* Where the scratch home appears inside the sandbox. */
#define SBX_HOME SBX_HOME_PATH
#define SBX_UID 1000
#define SBX_GID 1000
#define SBX_HOSTNAME "olp"

/* Scratch directories: <runtime_dir>/<pid>-<seq>-<random>/home. */
struct sbx_scratch {
	char name[64];
	char path[4096]; /* absolute path of the scratch dir */
	char home[4096]; /* absolute path of its home/ */
	int home_fd;	 /* O_DIRECTORY fd on home/ (for fchdir in mode off) */
};
int sbx_scratch_create(struct sbx_scratch *s);
/* Remove the whole scratch tree without following symlinks. Call only when no process of
 * the run is left. */
void sbx_scratch_remove(struct sbx_scratch *s);
void sbx_scratch_sweep_stale(void);
/* openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) of a directory below dfd: fd or -1/errno. */
int sbx_open_dir_beneath(int dfd, const char *name);

/* cgroup v2 (cgroup.c). */
enum sbx_cg_controller {
	SBX_CG_MEMORY = 1 << 0,
	SBX_CG_PIDS = 1 << 1,
	SBX_CG_CPU = 1 << 2,
};
/* Find the cgroup runs are made in, per setting (NULL/"auto", "off" or a path). Never
 * fails: without a usable cgroup, limits are rlimits and sbx_g.cg_reason says why. */
void sbx_cgroup_init(const char *setting);
void sbx_cgroup_release(void);

/* One run's cgroup. procs_fd: its cgroup.procs, for the child to move itself in. */
struct sbx_cgroup {
	char name[96];
	int dir_fd;
	int procs_fd;
};
/* Make the run's cgroup with l's limits (nothing, and 0, without a usable cgroup). 0 or
 * -errno; on error nothing is left. */
int sbx_cgroup_create(struct sbx_cgroup *cg, const char *run_name, const struct sbx_limits *l);
/* SIGKILL every process in it (cgroup.kill). */
void sbx_cgroup_kill(struct sbx_cgroup *cg);
/* Kill what is left, wait until it is empty (bounded), remove it. */
void sbx_cgroup_remove(struct sbx_cgroup *cg);

/* Descriptor numbers bwrap finds its inputs at, in the child. */
#define SBX_FD_STATUS 3	 /* --json-status-fd */
#define SBX_FD_SECCOMP 4 /* --seccomp */
#define SBX_FD_PASSWD 5	 /* --file -> /etc/passwd */
#define SBX_FD_GROUP 6	 /* --file -> /etc/group */
#define SBX_FD_ETC0 7	 /* --file -> the /etc files, SBX_ETC_FILES of them */
#define SBX_ETC_FILES 6
#define SBX_FD_COUNT (SBX_FD_ETC0 + SBX_ETC_FILES)

/* Open the /etc files the sandbox gets copies of (fds[i] = -1 when absent, or when
 * /etc/localtime is a link into /usr, which the sandbox gets as a link). Bit i of the
 * result is set when fds[i] is open; the caller closes them. */
unsigned int sbx_etc_open(int fds[SBX_ETC_FILES]);
/* The same bits, from the files' presence only (to key warm sandboxes). */
unsigned int sbx_etc_mask(void);

/* Build bwrap's argv for one run (argv[0] = bwrap path), with its inputs at SBX_FD_*;
 * etc_mask as sbx_etc_open returned it. */
int sbx_build_bwrap_argv(const struct sbx_policy *p, const struct sbx_scratch *s,
			 const char *const argv[], const char *stub, unsigned int etc_mask,
			 struct sbx_strv *out);
/* Stop every warm sandbox of this process (spawn.c). */
void sbx_warm_release_all(void);

/* A sealed memfd holding the seccomp BPF program (built once per process). Caller closes.
 * fd or -errno. */
int sbx_seccomp_fd(bool allow_unix);
/* Build the program with libseccomp and export it as BPF: *out (malloc'd, caller frees),
 * *len. 0 or -errno. */
int sbx_seccomp_export(bool allow_unix, void **out, size_t *len);
/* Build the default program now (at start-up rather than on the first request). */
int sbx_seccomp_prepare(void);
/* The child's environment for mode off (and the --setenv list for bwrap). */
int sbx_build_envp(const struct sbx_policy *p, struct sbx_strv *out);

#endif
