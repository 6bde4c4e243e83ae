/* Private to sandbox/: the policy's layout and the steps shared by its files. */
#ifndef OLP_SANDBOX_INTERNAL_H
#define OLP_SANDBOX_INTERNAL_H

#include <sys/stat.h>

#include "common/common.h"
#include "sandbox/sandbox.h"
#include "sandbox/stub.h"

struct sbx_policy {
	enum sbx_net net;
	uint16_t net_port; /* SBX_NET_LOOPBACK's */
	uint64_t timeout_ms;
	struct strv ro;	     /* host paths bound read-only */
	struct strv rw;	     /* host paths bound read-write */
	struct strv env;     /* "NAME=value", one per name */
	struct strv bind_ro; /* pairs: host path, path inside */
	struct strv bind_rw; /* pairs: host path, path inside */
	/* One per bind_rw pair: what checks its write-back, or NULL (written back as is). */
	sbx_writeback_check *rw_checks;
	struct sbx_limits limits;
	/* internal: whether to wrap in bwrap; the status probe overrides the mode */
	enum { SBX_WRAP_BY_MODE = 0, SBX_WRAP_NEVER, SBX_WRAP_ALWAYS } wrap;
};

/* Process-wide state set by sbx_global_init. */
struct sbx_global {
	enum sbx_mode mode;
	char *bwrap_path;
	char *runtime_dir;
	int runtime_fd;	       /* O_PATH|O_DIRECTORY on runtime_dir */
	unsigned warm_per_key; /* warm sandboxes kept per policy (1..SBX_WARM_PER_POLICY_MAX) */
	char *exec_stub;       /* olp-sandbox-exec: the first program of every sandbox */
	bool warm;	       /* keep warm sandboxes (pool.c) */
	unsigned prestart_max; /* idle pre-started commands on the host, at most */
	uint64_t prestart_idle_ms;
	unsigned prestart_per_owner; /* ... of one owner tag (1..prestart_max) */
	void (*on_prestart)(enum sbx_prestart_event ev);
	enum sbx_identity ident; /* per-run uid or the worker's own (ident.c) */
	bool ident_ok;		 /* runs can get their identity */
	char ident_reason[512];	 /* the range in use, or why there is none */
	uid_t uid_base;		 /* slot i runs as uid_base + i, gid_base + i */
	gid_t gid_base;
	unsigned int id_count;
	struct strv root_links;	     /* pairs: "target", "/name" for the merged-/usr links */
	struct strv root_dirs;	     /* top-level lib dirs that are real directories */
	int cg_fd;		     /* the delegated cgroup v2 runs are made in, or -1 */
	char *cg_path;		     /* its path, or NULL */
	unsigned int cg_controllers; /* SBX_CG_* offered there */
	char cg_reason[512];	     /* cg_path, or why no cgroup is used */
};
extern struct sbx_global sbx_g;

/* A limit's value: v, or dflt when v is 0 (the policy's "use the default"). */
static inline uint64_t sbx_or_default(uint64_t v, uint64_t dflt)
{
	return v ? v : dflt;
}

/* A sealed memfd holding len bytes of data (text: strlen), for bwrap's --file. fd or
 * -errno. */
int sbx_data_fd_n(const void *data, size_t len);
int sbx_data_fd(const char *text);
/* The passwd and group files of the sandbox: its one user, nobody of the host. */
#define SBX_STR_(x) #x
#define SBX_STR(x) SBX_STR_(x)
#define SBX_PASSWD_TEXT "olp:x:" SBX_STR(SBX_UID) ":" SBX_STR(SBX_GID) ":olp:" SBX_HOME ":/bin/sh\n"
#define SBX_GROUP_TEXT "olp:x:" SBX_STR(SBX_GID) ":\n"

/* Where the scratch home appears inside the sandbox. */
#define SBX_HOME SBX_HOME_PATH
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
 * the run is left. rid: the request id its log lines name, or NULL. */
void sbx_scratch_remove(struct sbx_scratch *s, const char *rid);
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
 * -errno; on error nothing is left. rid (here and below): the request id log lines name,
 * or NULL. */
int sbx_cgroup_create(struct sbx_cgroup *cg, const char *run_name, const struct sbx_limits *l,
		      const char *rid);
/* SIGKILL every process in it (cgroup.kill). */
void sbx_cgroup_kill(struct sbx_cgroup *cg);
/* Kill what is left, wait until it is empty (bounded), remove it. */
void sbx_cgroup_remove(struct sbx_cgroup *cg, const char *rid);

/* Descriptor numbers bwrap finds its inputs at, in the child. */
#define SBX_FD_STATUS 3	 /* --json-status-fd */
#define SBX_FD_SECCOMP 4 /* --seccomp */
#define SBX_FD_PASSWD 5	 /* --file -> /etc/passwd */
#define SBX_FD_GROUP 6	 /* --file -> /etc/group */
#define SBX_FD_ETC0 7	 /* --file -> the /etc files, SBX_ETC_FILES of them */
#define SBX_ETC_FILES 6
#define SBX_FD_SYNC 13 /* --sync-fd: the uid slot's lock (SBX_FD_ETC0 + SBX_ETC_FILES) */
/* SBX_FD_REPORT 14 (stub.h): olp-sandbox-exec's failure report */
#define SBX_FD_FILE0 15 /* --file: files the policy binds */
_Static_assert(SBX_FD_SYNC == SBX_FD_ETC0 + SBX_ETC_FILES, "fd slots");
_Static_assert(SBX_FD_REPORT == SBX_FD_SYNC + 1, "fd slots");
_Static_assert(SBX_FD_FILE0 == SBX_FD_REPORT + 1, "fd slots");
#define SBX_MAX_FILES 16
#define SBX_FD_ENV 31 /* --file -> SBX_ENV_PATH (stub.h): SBX_FD_FILE0 + SBX_MAX_FILES */
_Static_assert(SBX_FD_ENV == SBX_FD_FILE0 + SBX_MAX_FILES, "fd slots");
#define SBX_FD_COUNT (SBX_FD_ENV + 1)

/* ---- identity (ident.c) ---------------------------------------------------------------- */

/* Fork the id-map helper now, while exec can still grant newuidmap its privilege (before
 * no_new_privs). Only a non-root process with newuidmap installed; 0 or -errno. */
int sbx_ident_prepare(void);
/* Decide how runs get their uid (sbx_g.ident*); never fails, the reason says why not. */
void sbx_ident_init(enum sbx_identity mode, const char *range);
void sbx_ident_release_all(void);

/* One run's host identity. */
struct sbx_ident {
	uid_t uid; /* host ids; 0 in mode shared (none of its own) */
	gid_t gid;
	int lock_fd;   /* holds the slot host-wide, or -1 */
	int userns_fd; /* the slot's user namespace to join before bwrap (borrowed), or -1 */
};
/* Take a free uid slot and its user namespace (nothing in mode shared). 0, -EAGAIN when
 * every slot is taken, -EPERM when runs cannot get a uid here, or -errno. */
int sbx_ident_acquire(struct sbx_ident *id, const char *rid);
void sbx_ident_release(struct sbx_ident *id);

/* ---- network (netns.c) ------------------------------------------------------------------ */

/* Identity shared: sbx_netns_init's namespace, owned by a user namespace the helper makes
 * for it (root mapped to the worker's uid and gid, nothing else), since the run has none
 * of its own; *userns_fd gets it (close-on-exec), for the child to join before the network
 * namespace. bwrap then nests its own user namespace inside. 0 or -errno (*userns_fd -1). */
int sbx_netns_init_userns(struct sbx_netns *ns, int *userns_fd, uint16_t port);

/* ---- one run's inputs beside the policy (inputs.c builds them, policy.c uses them) ---- */

/* How each bind of the policy reaches the sandbox: a regular file as a copy (read-only:
 * --file from a descriptor the worker opened; writable: a file in the scratch dir that is
 * written back), a directory by its path. Pairs of bind_ro, then bind_rw, in order. */
enum sbx_bind_how { SBX_BIND_SKIP = 0, SBX_BIND_PATH, SBX_BIND_FILE, SBX_BIND_COPY };
struct sbx_bind_plan {
	enum sbx_bind_how how;
	int file; /* SBX_BIND_FILE: the slot (SBX_FD_FILE0 + file); _COPY: the copy's number */
	struct stat st; /* the host file, when a file (keys warm sandboxes) */
};
struct sbx_inputs {
	const struct sbx_scratch *scratch;
	unsigned int etc_mask; /* as sbx_etc_open returned it */
	bool sync;	       /* pass SBX_FD_SYNC to bwrap (a uid slot is held) */
	size_t nbinds;
	struct sbx_bind_plan *binds; /* nbinds: bind_ro pairs, then bind_rw pairs */
};
/* Decide how each bind goes (stat only). *out is malloc'd (free it); 0, or -E2BIG when
 * more than SBX_MAX_FILES files are bound. */
int sbx_plan_binds(const struct sbx_policy *p, struct sbx_bind_plan **out, size_t *n);

/* Open the /etc files the sandbox gets copies of (fds[i] = -1 when absent, or when
 * /etc/localtime is a link into /usr, which the sandbox gets as a link). Bit i of the
 * result is set when fds[i] is open; the caller closes them. */
unsigned int sbx_etc_open(int fds[SBX_ETC_FILES]);
/* The same bits, from the files' presence only (to key warm sandboxes). */
unsigned int sbx_etc_mask(void);

/* Append bwrap's argv for one run to out (argv[0] = bwrap path), with its inputs at
 * SBX_FD_*. argv NULL: a warm sandbox, whose stub waits for its command. */
void sbx_build_bwrap_argv(const struct sbx_policy *p, const struct sbx_inputs *in,
			  const char *const argv[], struct strv *out);
/* Stop every warm sandbox of this process (pool.c). */
void sbx_warm_release_all(void);
/* Stop every pre-started command of this process and its expiry thread (pool.c). */
void sbx_prestart_release_all(void);

/* The host-wide cap on idle pre-started commands (prestart.c): one of prestart_max slot
 * files under <runtime_dir>/prestart-slots, held with flock for as long as one waits. The
 * kernel drops the lock when its holder dies, so a SIGKILLed worker leaks none (common.h's
 * slots; put it with slot_release). An fd (close-on-exec) or -EBUSY when every slot is
 * held, -errno on failure. */
int sbx_prestart_slot_take(void);

/* A sealed memfd holding the seccomp BPF program (built once per process). Caller closes.
 * fd or -errno. */
int sbx_seccomp_fd(void);
/* Build the program with libseccomp and export it as BPF: *out (malloc'd, caller frees),
 * *len. 0 or -errno. */
int sbx_seccomp_export(void **out, size_t *len);
/* Build the default program now (at start-up rather than on the first request). */
int sbx_seccomp_prepare(void);
/* Append the child's environment for mode off to out (under bwrap the stub gets it as a
 * file: stub.h, SBX_ENV_PATH). */
void sbx_build_envp(const struct sbx_policy *p, struct strv *out);

#endif
