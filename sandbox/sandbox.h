/* sandbox: run one command under a policy, supervise it, clean up after it.
 *
 * The module knows nothing of providers, keys or HTTP. A caller builds a policy (what the
 * child may see), then sbx_run() spawns the command inside bubblewrap, feeds its stdin,
 * hands its stdout to a callback as it arrives, and returns only when the whole process
 * tree is gone and the per-run scratch directory is removed.
 *
 * Threat model (docs/sandbox.md): the command is hostile. It must not read what it was
 * not given (the key store, other runs' scratch, host credentials), must not inherit any
 * descriptor beyond 0-2 (fd 0 of a FastCGI worker is the listening socket), must not
 * change anything host-wide, must not outlive its run, and must stay within its own
 * budget: every run is a host uid of its own (never 0, never the worker's, never another
 * live run's: ADR 0014), so per-uid limits are per run. */
#ifndef OLP_SANDBOX_H
#define OLP_SANDBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum sbx_mode {
	SBX_MODE_BWRAP = 0, /* every run inside bwrap (the default) */
	SBX_MODE_OFF,	    /* no isolation: only with an explicit config "sandbox.mode":"off" */
};

/* Whose host uid a sandboxed command runs as (ident.c, ADR 0014). */
enum sbx_identity {
	SBX_IDENTITY_PER_RUN = 0, /* its own uid and gid from a reserved range (the default) */
	SBX_IDENTITY_SHARED,	  /* the worker's own uid: weaker, an explicit opt-in, never
				     for a root worker */
};

/* What happens to pre-started commands (sbx_run_options.prestart), for counts. Each event
 * but MISS also moves the number of idle ones: READY adds one, the others take one. */
enum sbx_prestart_event {
	SBX_PRESTART_READY = 0, /* one was started and waits */
	SBX_PRESTART_HIT,	/* a run took one */
	SBX_PRESTART_MISS,	/* a run that asked for one found none and started otherwise */
	SBX_PRESTART_EXPIRED,	/* put down unused: idle too long, or to make room */
	SBX_PRESTART_DIED,	/* found dead while it waited */
	SBX_PRESTART_RELEASED,	/* put down at shutdown */
};
const char *sbx_prestart_event_name(enum sbx_prestart_event ev); /* "ready", "hit", … */

/* The most warm sandboxes one policy keeps (sbx_global_config.warm_per_policy): half of a
 * process's warm pool, one owner tag's share. */
#define SBX_WARM_PER_POLICY_MAX 8

/* Process-wide settings, fixed at start (sbx_global_init). */
struct sbx_global_config {
	enum sbx_mode mode;
	const char *bwrap_path;	 /* absolute; NULL = /usr/bin/bwrap */
	const char *runtime_dir; /* parent of the per-run scratch dirs; created 0700 */
	/* olp-sandbox-exec, the first program of every sandbox (it takes the run's uid, then
	 * becomes the command). NULL: $OLP_SANDBOX_EXEC, else the one this build installs. */
	const char *exec_stub;
	/* A policy run once gets a sandbox started ahead of time for its next run (a "warm"
	 * sandbox; see pool.c). false: every run starts cold. */
	bool warm;
	/* How many wait per policy (one in use by the next request while the other gets
	 * ready): 1 to SBX_WARM_PER_POLICY_MAX; 0 = 2. */
	unsigned warm_per_policy;
	enum sbx_identity identity;
	/* "BASE:COUNT": the host uids (and gids) runs take; NULL = the worker user's ranges
	 * in /etc/subuid and /etc/subgid (root without one: 1879048192:65536). */
	const char *uid_range;
	/* Resource control (cgroup.c): NULL or "auto" = a cgroup v2 delegated to this
	 * process if there is one, "off" = rlimits only, or the absolute path of a cgroup
	 * prepared for the runs. Without a usable cgroup, limits are rlimits. */
	const char *cgroup;
	/* Pre-started commands (sbx_run_options.prestart): at most this many wait idle on
	 * the whole host, across every process using the same runtime_dir (0: none at all),
	 * each for at most prestart_idle_ms (0: 5 minutes). */
	unsigned prestart_max;
	uint64_t prestart_idle_ms;
	/* Of those, at most this many for one owner tag (sbx_run_options.owner_tag) on the
	 * whole host: 0 = half of prestart_max, rounded up; never above prestart_max. */
	unsigned prestart_per_owner;
	/* Optional: told of every pre-started command's event as it happens (from a request's
	 * thread or the expiry thread, never under a lock of the caller's), so that counts can
	 * be kept for the whole host (fcgi/ adds them to the shared metrics). Must be quick
	 * and must not call back into the sandbox. */
	void (*on_prestart)(enum sbx_prestart_event ev);
};

/* Set the process-wide settings; copies every string. Creates runtime_dir if needed and
 * removes scratch dirs left by processes that no longer exist. 0 or -errno. */
int sbx_global_init(const struct sbx_global_config *cfg);
/* Lock the calling process down for the rest of its life: drop every capability (bounding
 * set, effective/permitted/inheritable, ambient) and set no_new_privs, so that a worker
 * started as root holds no privilege a bug could use, but for what giving each run its own
 * uid needs (lockdown.c). A non-root process first forks the helper that maps those uids
 * (ident.c). Call once, early, before threads. 0 or -errno. */
int sbx_lockdown_self(void);
void sbx_global_release(void);
/* Warm sandboxes waiting in this process (for tests and /health). */
size_t sbx_warm_count(void);
/* The process is about to exit: stop every warm sandbox properly and start no new one.
 * Safe while other threads still run requests. */
void sbx_warm_shutdown(void);
/* Pre-started commands of this process (see sbx_run_options.prestart), for /health. Counts
 * since the process started: hit (a run took one), miss (a run that asked for one found
 * none and started cold), expired (put down after prestart_idle_ms unused, or to make
 * room for a more recent one), died (found dead while idle); idle: waiting now. */
struct sbx_prestart_stats {
	uint64_t hit, miss, expired, died;
	size_t idle;
};
void sbx_prestart_stats(struct sbx_prestart_stats *out);
enum sbx_mode sbx_global_mode(void);

/* What the sandbox looks like from a host's point of view, for /health and the doctor.
 * Computed once per process and cached; the strings are static. */
struct sbx_status {
	bool available;		     /* bwrap is present and a real sandboxed spawn worked */
	bool seccomp;		     /* the filter was built and is loaded by every run */
	const char *cgroup;	     /* resource control in use: "cgroup2" or "rlimits" */
	const char *cgroup_detail;   /* the cgroup runs are made in, or why there is none */
	const char *identity;	     /* "per_run", "shared", or "unavailable" */
	const char *identity_detail; /* the uid range, or why runs cannot get their own uid */
	bool active;		     /* runs are actually wrapped (mode bwrap and available) */
	const char *mode;	     /* "bwrap" or "off" */
	const char *bwrap_path;
	const char *bwrap_version; /* "0.8.0", or NULL */
	const char *message;	   /* why not available, or NULL */
};
const struct sbx_status *sbx_status_get(void);

/* ---- policy ------------------------------------------------------------------------- */
struct sbx_policy;

/* The scratch home as the child sees it (HOME, and the working directory). */
#define SBX_HOME_PATH "/home/olp"

/* A baseline policy: read-only /usr and its symlinks, fresh /proc with /proc/sys
 * read-only, minimal /dev, size-limited tmpfs /tmp and scratch HOME (also the working
 * directory), all namespaces unshared (net too), the run's own host uid, clearenv +
 * PATH/HOME/LANG/TMPDIR/USER, die-with-parent, new session. Never NULL: allocation
 * failure aborts, as everywhere (common.h). Free it with sbx_policy_free. */
struct sbx_policy *sbx_policy_new(void);
void sbx_policy_free(struct sbx_policy *p);
/* How a run reaches the network (ADR 0015). */
enum sbx_net {
	SBX_NET_NONE = 0, /* a network namespace of its own with nothing in it, not even lo
			     up (bwrap --unshare-net): the default */
	SBX_NET_HOST,	  /* the host's network namespace: everything the host reaches. An
			     explicit opt-in ("network": "host") */
	SBX_NET_LOOPBACK, /* a namespace of its own with only lo up, and a socket listening
			     on 127.0.0.1:port in it, made before the command starts and
			     handed to the caller (sbx_callbacks.on_listener), whose forwarder
			     is then the one thing the run can reach (netns.c). Fails closed:
			     when the namespace cannot be made, nothing runs
			     (SBX_FAIL_NETWORK); mode off refuses it (no namespace at all) */
};
/* port: SBX_NET_LOOPBACK's, fixed (so that argv and environment can name it before the
 * run, and a warm sandbox is made with it); 0 = the kernel picks one. Ignored otherwise. */
void sbx_policy_set_net(struct sbx_policy *p, enum sbx_net net, uint16_t port);
/* The same as sbx_policy_set_net(p, on ? SBX_NET_HOST : SBX_NET_NONE, 0). */
void sbx_policy_set_network(struct sbx_policy *p, bool on);
/* Bind host_path read-only (or read-write) at the same path inside. Copies the string.
 * A path that does not exist on the host is skipped at spawn time. The command runs as
 * its own uid: it reads (writes) only what the file modes give "others". 0, or -EINVAL
 * when host_path is not absolute. */
int sbx_policy_add_ro(struct sbx_policy *p, const char *host_path);
int sbx_policy_add_rw(struct sbx_policy *p, const char *host_path);
/* Bind host_path at a different path inside (e.g. a credentials file at
 * SBX_HOME_PATH "/.claude/.credentials.json"). Both must be absolute; inside must not
 * contain "..". Copies both. Binds are applied after the scratch home, so inside may lie
 * in it; missing parent directories are created there. A host_path that does not exist is
 * skipped at spawn time. A regular file is given to the command as a copy it owns (mode
 * 0600), read when the run starts: it needs no permission for the run's uid. Written
 * (writable), the copy replaces host_path when the run ends, atomically, if it changed.
 * A directory is bound as it is (see sbx_policy_add_ro). In mode off there is no mount
 * namespace and binds are ignored (the child sees the host's files at their own paths).
 * 0, or -EINVAL when a path breaks the rules above. */
int sbx_policy_add_bind(struct sbx_policy *p, const char *host_path, const char *inside,
			bool writable);
/* Whether a run's changed copy of a writable file may replace the host file: inside is
 * where the run saw it, data (len bytes, at most 1 MiB) what it left there. true writes it
 * back; false leaves the host file as it was, and the refusal is logged with *why (a static
 * string that must never quote the content). Called once the run's processes are gone, on
 * the thread that ran it. */
typedef bool (*sbx_writeback_check)(const char *inside, const char *data, size_t len,
				    const char **why);
/* sbx_policy_add_bind(p, host_path, inside, true), whose write-back happens only when check
 * (required) accepts the new content: the caller, who knows what the file is, decides
 * (a credentials file must still parse as one; ADR 0025). 0 or -EINVAL as there. */
int sbx_policy_add_bind_checked(struct sbx_policy *p, const char *host_path, const char *inside,
				sbx_writeback_check check);
/* Set one variable of the child's (otherwise empty) environment. Copies both. 0, or
 * -EINVAL when name is empty or holds '='. */
int sbx_policy_setenv(struct sbx_policy *p, const char *name, const char *value);
/* Wall-clock limit for the whole run; 0 = none. */
void sbx_policy_set_timeout_ms(struct sbx_policy *p, uint64_t ms);

/* Resource limits of the command. The rlimits are set before bwrap starts (so they hold
 * for every process of the tree); the cgroup limits hold for the whole tree together, when
 * a delegated cgroup v2 is in use (sbx_status.cgroup). 0 in a field keeps the default
 * shown. */
struct sbx_limits {
	uint64_t nofile;    /* open files, default 4096 */
	uint64_t fsize_mb;  /* largest file written, default 1024 */
	uint64_t cpu_s;	    /* CPU seconds per process, default 600 */
	uint64_t as_mb;	    /* address space per process, default 8192 */
	uint64_t nproc;	    /* processes (threads count) of the run's own uid, default 256 (see
			      docs/sandbox.md) */
	uint64_t disk_mb;   /* scratch space: the home (3/4) and /tmp (1/4), size-limited tmpfs,
			       default 1024 */
	uint64_t memory_mb; /* cgroup: memory of the whole run (memory.max), default 2048 */
	uint64_t pids;	    /* cgroup: processes and threads of the run (pids.max), default
			       256 */
	uint64_t cpu_pct;   /* cgroup: CPU per 100 ms period (cpu.max), in percent of one
			       core, default 100 */
};
#define SBX_DEFAULT_MEMORY_MB 2048
#define SBX_DEFAULT_PIDS 256
#define SBX_DEFAULT_CPU_PCT 100
#define SBX_DEFAULT_DISK_MB 1024
/* Copies l; a field above SBX_LIMIT_MAX is taken as SBX_LIMIT_MAX. */
#define SBX_LIMIT_MAX ((uint64_t)1 << 40)
void sbx_policy_set_limits(struct sbx_policy *p, const struct sbx_limits *l);

/* ---- running ------------------------------------------------------------------------ */
struct sbx_result;

/* How a run's sandbox came to be (for logs, the usage ledger and /health). */
enum sbx_start {
	SBX_START_COLD = 0, /* built for this run (also: nothing ran) */
	SBX_START_WARM,	    /* a sandbox started ahead of time, its command exec'd now */
	SBX_START_PRESTART, /* the command itself started ahead of time, waiting on stdin */
};
const char *sbx_start_name(enum sbx_start s); /* "cold", "warm", "prestart" */

/* Callbacks of one run. Each returns 0 to go on, > 0 to end the run normally now (the
 * caller has what it needs; the tree is killed), < 0 to abort it (e.g. the client went
 * away; the tree is killed and sbx_run reports SBX_END_ABORTED). */
struct sbx_callbacks {
	int (*on_stdout)(void *ctx, const char *data, size_t len);
	/* Optional: called once when the result is known (the command is gone and its
	 * output read), before sbx_run waits for the sandbox to be torn down and removes the
	 * scratch dir, so that the caller can answer first. res is complete. Not called when nothing could be spawned. */
	void (*on_result)(void *ctx, const struct sbx_result *res);
	/* Required for a SBX_NET_LOOPBACK policy, unused otherwise: called once per run,
	 * before the command starts, on the calling thread, with the socket listening on
	 * 127.0.0.1:port inside the run's network namespace. The callee owns listen_fd from
	 * then on (hands it to egr_start(), or closes it), whatever it returns. 0 to go on;
	 * < 0 (-errno) and nothing runs: sbx_run returns it, with res->end
	 * SBX_END_SPAWN_FAILED, failure SBX_FAIL_NETWORK, spawn_stage "listener". */
	int (*on_listener)(void *ctx, int listen_fd, uint16_t port);
	/* Optional: called once, before any output, with how the run's command came to be
	 * (cold, warm or pre-started), as soon as that is decided. */
	void (*on_start)(void *ctx, enum sbx_start start);
	/* Optional: the caller's periodic work (a keep-alive to a client that has heard
	 * nothing for a while) on the run's own thread, so that it needs no thread of its
	 * own. Called with the time (mono_ms) once as the run's supervision starts, then
	 * whenever the time it returned last has come: from the supervisor's loop (its poll
	 * waits no longer than that) until the run is over, and from the waits of the
	 * sandbox's teardown after on_result. Returns the next time it wants, 0 for never.
	 * Late by at most 100 ms (the teardown's waits); never called when nothing could be
	 * spawned. */
	uint64_t (*on_tick)(void *ctx, uint64_t now_ms);
	void *ctx;
};

enum sbx_end {
	SBX_END_EXITED = 0,  /* the command exited; see exit_status (and failure: bwrap or
				olp-sandbox-exec may have ended it before the command ran) */
	SBX_END_SIGNALED,    /* killed by a signal it did not get from us; see term_signal */
	SBX_END_TIMEOUT,     /* the wall-clock limit was reached */
	SBX_END_ABORTED,     /* a callback or the hangup fd asked to stop */
	SBX_END_STOPPED,     /* a callback said it has everything (> 0) */
	SBX_END_SPAWN_FAILED /* nothing ran; see failure, spawn_stage and spawn_errno */
};

/* Why the command never ran, when it did not. Learnt from what bwrap and the sandbox's
 * first program report on descriptors of their own, never from what anything printed: a
 * command cannot pass its own failure off as the sandbox's, and rewording a message
 * changes nothing (docs/adr/0016-typed-run-outcomes.md). */
enum sbx_failure {
	SBX_FAIL_NONE = 0, /* the command was started: end and exit_status say how it went */
	SBX_FAIL_SPAWN,	   /* the worker could not start the run: its descriptors, memory,
			      processes, scratch dir, cgroup, uid slot, or bwrap itself (end is
			      SBX_END_SPAWN_FAILED) */
	SBX_FAIL_SETUP,	   /* bwrap could not build the sandbox or start its first program, or
			      that program was started wrongly (end SBX_END_EXITED; bwrap says
			      why on stderr only) */
	SBX_FAIL_IDENTITY, /* the sandbox's first program could not make the run its own uid
			      (end SBX_END_EXITED, exit_status 127) */
	SBX_FAIL_EXEC,	   /* the command itself could not be executed: ENOENT, EACCES, E2BIG
			      ... (end SBX_END_EXITED, exit_status 127; without bwrap, mode
			      off, end SBX_END_SPAWN_FAILED) */
	SBX_FAIL_NETWORK,  /* a SBX_NET_LOOPBACK run's namespace or listener could not be made
			      (stage "netns") or joined ("setns(net)"), on_listener is missing
			      or refused it ("listener"), or the sandbox is in mode off ("netns
			      (sandbox mode off)") (end SBX_END_SPAWN_FAILED; nothing ran) */
};

struct sbx_result {
	enum sbx_end end;
	enum sbx_start start;
	int exit_status;
	int term_signal;
	enum sbx_failure failure;
	const char *spawn_stage; /* when failure is set: the step that failed, a static string
				    ("pipe", "identity", "bwrap", "setresuid", "execve"...) */
	int spawn_errno;	 /* ... and its errno; 0 when unknown (bwrap says why on stderr
				    only) */
	char stderr_tail[2048];	 /* last bytes of the child's stderr, NUL-terminated; never
				    sent to clients, logged only cut */
	size_t stdout_bytes;
	uint64_t duration_ms;
};

struct sbx_run_options {
	bool pass_stdin;	/* the child reads our own fd 0 (olp-sandbox); stdin_data unused */
	bool pass_stderr;	/* the child writes our own fd 2; stderr_tail stays empty */
	const void *stdin_data; /* written to the child's stdin, then stdin is closed */
	size_t stdin_len;
	int hangup_fd;		/* >= 0: abort when its peer hangs up (POLLRDHUP), e.g. the
				   FastCGI connection; -1 = none */
	const char *request_id; /* named by every log line of the run (borrowed for the
				   call); NULL = none */
	/* > 0: after the run, keep this many processes of exactly this run started ahead
	 * (same policy, same argv: a warm sandbox whose command was already exec'd and waits
	 * on its stdin), and let the next such run take one (res->start SBX_START_PRESTART):
	 * its listener is handed to on_listener then, its stdin gets stdin_data, and its
	 * clock starts then. What the command wrote before is handed over first, in order
	 * (it waits in the pipes). Each serves one run and is never reused. Bounded by
	 * sbx_global_config.prestart_max (host-wide) and prestart_idle_ms; only where warm
	 * sandboxes are on (sbx_global_config.warm). 0: none. */
	unsigned prestart;
	/* Whose run this is, for the pools (borrowed for the call; NULL = ""): the caller's
	 * own name for who asked (an API key's id), opaque here. A warm sandbox or a
	 * pre-started command made after a run is given only to a later run of the same
	 * owner_tag, a tag that needs room puts down only its own, and each tag has a share:
	 * half of this process's warm sandboxes, and prestart_per_owner of the host's
	 * pre-started commands (idle, being started, or serving the run that took one until
	 * that run's next one is started). At most SBX_OWNER_TAG_MAX bytes: a longer tag gets
	 * no pre-started command. */
	const char *owner_tag;
	/* > 0: this tag's share of pre-started commands is at most this (e.g. its own cap on
	 * runs at once), below sbx_global_config.prestart_per_owner. 0: that one. */
	unsigned owner_prestart_max;
	/* > 0: the run ends (SBX_END_TIMEOUT) at this time (mono_ms), the caller's deadline
	 * computed once before the run, instead of the policy's timeout counted from the
	 * command's start. 0: the policy's timeout. */
	uint64_t deadline_ms;
};
#define SBX_OWNER_TAG_MAX 100

/* Run argv[0] (an absolute path) with argv under policy p. Blocks until the run is over,
 * the process tree is gone and the scratch dir is removed. Returns 0 when the run
 * happened (see res->end), -errno when it could not be set up at all (res->end is then
 * SBX_END_SPAWN_FAILED). Thread-safe: many runs may go on at once in one process. */
int sbx_run(const struct sbx_policy *p, const char *const argv[], const struct sbx_run_options *opt,
	    const struct sbx_callbacks *cb, struct sbx_result *res);

/* Static names for logs: "exited", "timeout"...; "setup", "exec"... ("none" for
 * SBX_FAIL_NONE). */
/* For benchmarks (tests/bench/bwrap-policy.c): the calling process becomes bwrap running
 * argv (argv[0] absolute) under p, with the command line, descriptors, rlimits and user
 * namespace sbx_run gives it, and none of the run around it: no supervising process, no
 * pipes (the command gets our fds 0-2), no scratch dir (the home is bwrap's tmpfs; a
 * writable file bind, which needs one, is refused), no cgroup, no teardown. p and argv
 * are only read. Call after sbx_global_init. Returns -errno when the run cannot be
 * prepared; once the process starts becoming bwrap, a failed step ends it (status 127). */
int sbx_exec_in_place(const struct sbx_policy *p, const char *const argv[]);

const char *sbx_end_name(enum sbx_end e);
const char *sbx_failure_str(enum sbx_failure f);

/* ---- a run's own network namespace (netns.c; ADR 0015) -----------------------
 * A network namespace with only `lo` (up: 127.0.0.1 and ::1), and a TCP socket listening
 * on 127.0.0.1:port inside it. The worker's forwarder (egress/) accepts on that socket;
 * the run is put in the namespace, so the one thing it can reach is the forwarder: no
 * host loopback service, no route anywhere (a connect to 169.254.169.254, 10.0.0.1 or
 * 192.0.2.1 fails with ENETUNREACH), no host sockets in /proc/net.
 *
 * Who may join it. setns(CLONE_NEWNET) needs CAP_SYS_ADMIN in the user namespace that
 * owns the network namespace and in the caller's own. So the namespace is made inside
 * the run's user namespace: pass the per-slot user namespace of ident.c (U1, whose root
 * is the worker's uid) as userns_fd. The spawned child, which already joins U1 before it
 * execs bwrap (child.c), then joins this namespace right after (it is U1's root, it holds
 * CAP_SYS_ADMIN over both), and bwrap runs without --unshare-net: the whole sandbox lives
 * in it. Order in the child: setns(U1, CLONE_NEWUSER), then setns(netns_fd, CLONE_NEWNET).
 * userns_fd -1: the namespace belongs to the caller's user namespace; that only works for
 * a process with CAP_SYS_ADMIN (root before sbx_lockdown_self: tests, tools), and only a
 * process with CAP_SYS_ADMIN there may join it.
 *
 * The worker's own namespaces never change: a short-lived helper process (started as
 * posix_spawn starts its child, every signal blocked, system calls only) joins userns_fd,
 * unshares the network namespace, brings `lo` up, binds, listens, and passes both
 * descriptors back (SCM_RIGHTS). The calling thread waits for it (about 1 ms). Safe to
 * call from any thread, many at once. The namespace lives as long as either descriptor
 * (or a process in it) does. */
struct sbx_netns {
	int listen_fd; /* listening on 127.0.0.1:port in the namespace (close-on-exec); take it
			  (set it to -1) to hand it to egr_start() */
	int netns_fd;  /* the namespace, for setns(fd, CLONE_NEWNET) (close-on-exec) */
	uint16_t port; /* the port bound */
};
#define SBX_NETNS_INIT                                     \
	{                                                  \
		.listen_fd = -1, .netns_fd = -1, .port = 0 \
	}

/* Make the namespace and its listener. port 0: the kernel picks one; any fixed port is
 * free, the namespace being new, so every run may use the same one. userns_fd is borrowed
 * (see above). 0, or -errno (ns is then SBX_NETNS_INIT): -EPERM when namespaces cannot be
 * made here; -EINVAL when userns_fd is not a user namespace this process may join. */
int sbx_netns_init(struct sbx_netns *ns, int userns_fd, uint16_t port);
/* Close whatever ns still holds; ns is left SBX_NETNS_INIT. */
void sbx_netns_release(struct sbx_netns *ns);

#endif
