/* What the worker and olp-sandbox-exec, the first program of every sandbox, both need to
 * know: the sandbox user, the launch message of a warm sandbox, and the report the stub
 * sends when it cannot become the command. Private to sandbox/. Macros and plain types
 * only: olp-sandbox-exec includes this and links nothing but libc. */
#ifndef OLP_SANDBOX_STUB_H
#define OLP_SANDBOX_STUB_H

#include <stdint.h>

/* The sandbox's one user, as the command sees itself (uid and gid). With a host uid per
 * run it is that uid, mapped (ident.c); in mode shared, the worker's. */
#define SBX_UID 1000
#define SBX_GID 1000

/* A warm sandbox's launch message on the stub's stdin (pool.c builds it):
 *     "OLPX" u32 argc, then argc x (u32 length, bytes)      (lengths little-endian)
 * then the command's own stdin. */
#define SBX_LAUNCH_MAGIC "OLPX"

/* The command's environment: a file bwrap makes from a sealed memfd (--file), holding
 * "NAME=value" entries each ended by a NUL, at most SBX_ENV_MAX bytes. Never on bwrap's
 * command line, which any user of the host reads in /proc/PID/cmdline (an API key in a
 * provider's "env", for as long as a warm sandbox waits). The stub reads it before it
 * becomes the sandbox user, who cannot read it (mode 0400) where the run has its own
 * uid. */
#define SBX_ENV_PATH "/etc/.olp-env"
#define SBX_ENV_MAX ((size_t)1 << 20)

/* The steps of olp-sandbox-exec that can fail, as its report names them. */
enum sbx_stub_stage {
	SBX_STUB_ARGS = 1,  /* its own command line: the worker's mistake */
	SBX_STUB_CHOWN,	    /* giving the scratch home to the sandbox user */
	SBX_STUB_CAPBSET,   /* emptying the capability bounding set */
	SBX_STUB_SETGROUPS, /* no supplementary group */
	SBX_STUB_SETGID,    /* the sandbox gid */
	SBX_STUB_NPROC,	    /* the run's process budget (RLIMIT_NPROC) */
	SBX_STUB_SETUID,    /* the sandbox uid, which drops every capability */
	SBX_STUB_CAPSET,    /* no capability left, not even inheritable */
	SBX_STUB_VERIFY,    /* the uid change did not hold */
	SBX_STUB_EXEC,	    /* execve of the command */
	SBX_STUB_ENV,	    /* reading the command's environment (SBX_ENV_PATH) */
	SBX_STUB_STAGES
};

/* The stub's report descriptor: the write end of a pipe the worker places at this number
 * for bwrap to pass on (bwrap consumes its other inputs; only 0-2 and this one reach the
 * stub). A fixed number rather than an option, so that the stub's command line, which
 * the sweep of dead runs and the tests read, stays as it was. */
#define SBX_FD_REPORT 14

/* What the stub writes to its report descriptor when a step fails, right before it exits
 * 127; written once, in one write(2), far below PIPE_BUF. Nothing comes when it became the
 * command: the descriptor is close-on-exec in the stub, so git's run-command rule holds
 * (no report means the exec happened). The worker reads it only once bwrap has reported
 * how the stub's process ended, so by then a report is there or never will be. */
struct sbx_stub_report {
	int32_t stage; /* enum sbx_stub_stage */
	int32_t err;   /* errno of the failed step */
};

#endif
