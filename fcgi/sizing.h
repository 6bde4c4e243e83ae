/* Private to fcgi/: the worker's defaults sized to the machine it runs on (issue 27).
 *
 * A 1 GB board and a 64 GB server get different defaults for what costs memory while idle
 * or per request: the serving threads (each may hold one provider run, a CLI of 60 to 160
 * MB), the warm sandboxes kept per policy, and the pre-started provider processes (a
 * claude ~160 MB, a codex ~60 MB, waiting idle). A setting given in config.json or the
 * environment always wins; only what the operator left out is sized. The rule and its
 * thresholds are written once, in sizing.c, and in docs/deploy.md "Small hosts". */
#ifndef OLP_FCGI_SIZING_H
#define OLP_FCGI_SIZING_H

#include <stdbool.h>
#include <stdint.h>

#include "common/common.h"

/* What the defaults follow. */
struct fcgi_machine {
	unsigned cpus;	 /* online CPUs; 0: unknown */
	uint64_t mem;	 /* bytes the pool may use: MemTotal, or a lower cgroup memory.max;
			  0: unknown (the defaults of a large host apply) */
	bool mem_cgroup; /* mem is a cgroup's memory.max */
};

/* The settings sized here; 0 in an explicit fcgi_sizing means "not set: size it". */
struct fcgi_sizing {
	unsigned threads;	  /* serving threads of this worker */
	unsigned warm_per_policy; /* warm sandboxes kept per policy */
	unsigned prestart_max;	  /* pre-started provider processes on the host */
	bool prestart_set;	  /* prestart_max was given (0 is then a choice: none) */
};

/* Below this much memory no pre-started process waits (1.5 GiB: a 1 GB board's MemTotal
 * is about 0.9 GiB, a 2 GB one's about 1.8 GiB). */
#define FCGI_SIZING_SMALL_MEM (UINT64_C(3) << 29)
/* Below this, half the large host's defaults (a 2 or 3 GB board). */
#define FCGI_SIZING_MEDIUM_MEM (UINT64_C(3) << 30)

/* Read the machine from proc_root ("/proc") and cgroup_root ("/sys/fs/cgroup"): online
 * CPUs (sysconf when proc_root is "/proc", else the "processor" lines of
 * proc_root/cpuinfo), MemTotal from proc_root/meminfo, and the lowest memory.max of this
 * process's cgroup v2 and its ancestors (proc_root/self/cgroup). Never fails: what cannot
 * be read is 0 (unknown). */
void fcgi_machine_probe(const char *proc_root, const char *cgroup_root, struct fcgi_machine *m);

/* The choices for m: each setting of set that is not 0 (prestart_max: prestart_set) is
 * kept as given, the others sized. why gets one line saying what was chosen and why, for
 * the worker's start-up log ("4 threads (sized), ..."). */
void fcgi_size(const struct fcgi_machine *m, const struct fcgi_sizing *set, struct fcgi_sizing *out,
	       struct buf *why);

#endif
