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
	struct sbx_strv ro;  /* host paths bound read-only */
	struct sbx_strv rw;  /* host paths bound read-write */
	struct sbx_strv env; /* "NAME=value", last one wins */
	/* internal: whether to wrap in bwrap; the status probe overrides the mode */
	enum { SBX_WRAP_BY_MODE = 0, SBX_WRAP_NEVER, SBX_WRAP_ALWAYS } wrap;
};

/* Process-wide state set by sbx_global_init. */
struct sbx_global {
	enum sbx_mode mode;
	char *bwrap_path;
	char *runtime_dir;
	int runtime_fd; /* O_PATH|O_DIRECTORY on runtime_dir */
	struct sbx_strv root_links; /* pairs: "target", "/name" for the merged-/usr links */
	struct sbx_strv root_dirs;  /* top-level lib dirs that are real directories */
};
extern struct sbx_global sbx_g;

int sbx_strv_push(struct sbx_strv *sv, const char *s);
int sbx_strv_pushf(struct sbx_strv *sv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sbx_strv_clear(struct sbx_strv *sv);
/* Set NAME=value in a "NAME=value" vector, replacing an existing NAME. */
int sbx_strv_setenv(struct sbx_strv *sv, const char *name, const char *value);

/* Where the scratch home appears inside the sandbox. */
#define SBX_HOME "/home/olp"
#define SBX_UID 1000
#define SBX_GID 1000
#define SBX_HOSTNAME "olp"

/* Scratch directories: <runtime_dir>/<pid>-<seq>-<random>/home. */
struct sbx_scratch {
	char name[64];
	char path[4096];      /* absolute path of the scratch dir */
	char home[4096];      /* absolute path of its home/ */
	int home_fd;          /* O_DIRECTORY fd on home/ (for fchdir in mode off) */
};
int sbx_scratch_create(struct sbx_scratch *s);
/* Remove the whole scratch tree without following symlinks. Call only when no process of
 * the run is left. */
void sbx_scratch_remove(struct sbx_scratch *s);
void sbx_scratch_sweep_stale(void);

/* Build bwrap's argv for one run (argv[0] = bwrap path). status_fd is the number the
 * child will hold bwrap's --json-status-fd at. */
int sbx_build_bwrap_argv(const struct sbx_policy *p, const struct sbx_scratch *s,
			 const char *const argv[], int status_fd, struct sbx_strv *out);
/* The child's environment for mode off (and the --setenv list for bwrap). */
int sbx_build_envp(const struct sbx_policy *p, struct sbx_strv *out);

#endif
