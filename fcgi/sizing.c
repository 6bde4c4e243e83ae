/* The worker's defaults sized to the machine (sizing.h): read the CPUs and the memory the
 * pool may use, then one rule.
 *
 * The rule, by memory (the CPUs only cap the threads: a thread mostly waits on its run, but
 * every run's CLI wants a share of a CPU to start and parse):
 *
 *   memory          threads   warm per policy   pre-started (host)
 *   < 1.5 GiB          4            1                 0
 *   < 3 GiB            8            1                 2
 *   otherwise, or     16            2                 4   (the defaults before sizing)
 *   unknown
 *
 * with threads at most 8 per CPU. Pre-started clients go first: they are memory
 * held while nothing is asked, ~160 MB for a claude, so four of them are most of a 1 GB
 * board, and the run that needs the memory would be the one to fail. A warm sandbox costs
 * about a megabyte (bwrap and the stub), so one per policy stays even on the smallest host:
 * it saves the namespaces' build on every request. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fcgi/sizing.h"
#include "common/banned.h"

#define MAX_FILE 65536

/* The value of "MemTotal:   N kB" in meminfo's text, in bytes; 0 when absent. */
static uint64_t meminfo_total(const char *text)
{
	const char *p = strstr(text, "MemTotal:");
	unsigned long long kb;

	if (!p || sscanf(p + 9, "%llu", &kb) != 1)
		return 0;
	return (uint64_t)kb * 1024;
}

/* The lowest memory.max from cgroup_root/<path> up to cgroup_root (a parent's limit holds
 * for its children too); 0 when none is set ("max") or none can be read. */
static uint64_t cgroup_limit(const char *cgroup_root, const char *path)
{
	char dir[4096];
	uint64_t low = 0;

	if (snprintf(dir, sizeof(dir), "%s%s", cgroup_root, path) >= (int)sizeof(dir))
		return 0;
	for (;;) {
		struct buf b = BUF_INIT;
		char *file = path_join(dir, "memory.max"), *slash;
		uint64_t v;

		if (buf_read_file(&b, file, 64) == 0) {
			b.data[strcspn(b.data, "\n")] = '\0';
			if (!parse_u64(b.data, &v) && v && (!low || v < low))
				low = v;
		}
		buf_release(&b);
		free(file);
		slash = strrchr(dir, '/');
		if (strlen(dir) <= strlen(cgroup_root) || !slash)
			break;
		*slash = '\0';
	}
	return low;
}

/* This process's cgroup v2 path ("0::/a/b" in proc_root/self/cgroup), or NULL. */
static char *own_cgroup(const char *proc_root)
{
	struct buf b = BUF_INIT;
	char *file = path_join(proc_root, "self/cgroup"), *p, *ret = NULL;

	if (buf_read_file(&b, file, MAX_FILE) == 0 && (p = strstr(b.data, "0::/")) &&
	    (p == b.data || p[-1] == '\n')) {
		p += 3;
		ret = xstrndup(p, strcspn(p, "\n"));
	}
	buf_release(&b);
	free(file);
	return ret;
}

static unsigned cpuinfo_count(const char *proc_root)
{
	struct buf b = BUF_INIT;
	char *file = path_join(proc_root, "cpuinfo");
	unsigned n = 0;

	if (buf_read_file(&b, file, 1 << 20) == 0)
		for (const char *p = b.data; (p = strstr(p, "processor")); p++)
			n += p == b.data || p[-1] == '\n';
	buf_release(&b);
	free(file);
	return n;
}

void fcgi_machine_probe(const char *proc_root, const char *cgroup_root, struct fcgi_machine *m)
{
	struct buf b = BUF_INIT;
	char *file = path_join(proc_root, "meminfo"), *cg;
	uint64_t lim = 0;

	*m = (struct fcgi_machine){ 0 };
	if (!strcmp(proc_root, "/proc")) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		m->cpus = n > 0 ? (unsigned)n : 0;
	} else {
		m->cpus = cpuinfo_count(proc_root);
	}
	if (buf_read_file(&b, file, MAX_FILE) == 0)
		m->mem = meminfo_total(b.data);
	buf_release(&b);
	free(file);
	cg = own_cgroup(proc_root);
	if (cg)
		lim = cgroup_limit(cgroup_root, cg);
	free(cg);
	if (lim && (!m->mem || lim < m->mem)) {
		m->mem = lim;
		m->mem_cgroup = true;
	}
}

void fcgi_size(const struct fcgi_machine *m, const struct fcgi_sizing *set, struct fcgi_sizing *out,
	       struct buf *why)
{
	struct fcgi_sizing s = { 16, 2, 4, true };
	const char *tier = "large host";

	if (m->mem && m->mem < FCGI_SIZING_SMALL_MEM) {
		s = (struct fcgi_sizing){ 4, 1, 0, true };
		tier = "under 1.5 GiB: no pre-started clients";
	} else if (m->mem && m->mem < FCGI_SIZING_MEDIUM_MEM) {
		s = (struct fcgi_sizing){ 8, 1, 2, true };
		tier = "under 3 GiB";
	} else if (!m->mem) {
		tier = "memory unknown: the large host's defaults";
	}
	if (m->cpus && s.threads > 8 * m->cpus)
		s.threads = 8 * m->cpus;
	out->threads = set->threads ? set->threads : s.threads;
	out->warm_per_policy = set->warm_per_policy ? set->warm_per_policy : s.warm_per_policy;
	out->prestart_max = set->prestart_set ? set->prestart_max : s.prestart_max;
	out->prestart_set = true;
	buf_addf(why,
		 "machine: %u CPUs, %llu MiB (%s), %s: %u threads (%s), %u warm sandboxes per "
		 "policy (%s), %u pre-started clients on the host (%s)",
		 m->cpus, (unsigned long long)(m->mem >> 20),
		 m->mem_cgroup ? "the cgroup's memory.max" : "MemTotal", tier, out->threads,
		 set->threads ? "set" : "sized", out->warm_per_policy,
		 set->warm_per_policy ? "set" : "sized", out->prestart_max,
		 set->prestart_set ? "set" : "sized");
}
