/* CUnit suite for the worker's machine-sized defaults (fcgi/sizing.h): the rule (memory and
 * CPUs -> threads, warm sandboxes, pre-started clients), an explicit setting winning over
 * it, and the probe reading MemTotal, CPUs and a cgroup's memory.max from a made-up /proc
 * and /sys/fs/cgroup. */
#include "tests/support/cunit.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "fcgi/sizing.h"
#include "common/banned.h"

#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)

static void check(uint64_t mem, unsigned cpus, unsigned threads, unsigned warm, unsigned pre)
{
	const struct fcgi_machine m = { .cpus = cpus, .mem = mem };
	const struct fcgi_sizing none = { 0 };
	struct fcgi_sizing out;
	struct buf why = BUF_INIT;

	fcgi_size(&m, &none, &out, &why);
	CU_ASSERT_EQUAL(out.threads, threads);
	CU_ASSERT_EQUAL(out.warm_per_policy, warm);
	CU_ASSERT_EQUAL(out.prestart_max, pre);
	if (out.threads != threads || out.warm_per_policy != warm || out.prestart_max != pre)
		(void)fprintf(stderr, "mem %llu MiB, %u CPUs: %s\n",
			      (unsigned long long)(mem / MIB), cpus, why.data);
	CU_ASSERT_PTR_NOT_NULL(strstr(why.data, "(sized)"));
	CU_ASSERT_PTR_NULL(strstr(why.data, "(set)"));
	buf_release(&why);
}

/* The rule's table (sizing.c), its edges, and the CPUs' cap on threads. */
static void test_rule(void)
{
	check(905 * MIB, 4, 4, 1, 0);	    /* a 1 GB Raspberry Pi 4 */
	check(3 * GIB / 2 - 1, 4, 4, 1, 0); /* just under the threshold */
	check(3 * GIB / 2, 4, 8, 1, 2);	    /* at it */
	check(1850 * MIB, 4, 8, 1, 2);	    /* a 2 GB board */
	check(3 * GIB - 1, 4, 8, 1, 2);
	check(3 * GIB, 4, 16, 2, 4); /* a 4 GB board: the large host's defaults */
	check(64 * GIB, 32, 16, 2, 4);
	check(0, 0, 16, 2, 4);	    /* nothing known: as before sizing */
	check(8 * GIB, 1, 8, 2, 4); /* one CPU: 8 threads */
	check(8 * GIB, 2, 16, 2, 4);
	check(905 * MIB, 1, 4, 1, 0);
}

/* Whatever config.json or the environment set is kept, 0 pre-started included. */
static void test_explicit_wins(void)
{
	const struct fcgi_machine small = { .cpus = 4, .mem = 905 * MIB };
	const struct fcgi_machine large = { .cpus = 16, .mem = 64 * GIB };
	struct fcgi_sizing set = { .threads = 32,
				   .warm_per_policy = 3,
				   .prestart_max = 4,
				   .prestart_set = true },
			   out;
	struct buf why = BUF_INIT;

	fcgi_size(&small, &set, &out, &why);
	CU_ASSERT_EQUAL(out.threads, 32);
	CU_ASSERT_EQUAL(out.warm_per_policy, 3);
	CU_ASSERT_EQUAL(out.prestart_max, 4);
	CU_ASSERT_PTR_NULL(strstr(why.data, "(sized)"));
	buf_reset(&why);
	/* prestart_max 0 given: none, even where the rule would keep four. */
	set = (struct fcgi_sizing){ .prestart_max = 0, .prestart_set = true };
	fcgi_size(&large, &set, &out, &why);
	CU_ASSERT_EQUAL(out.prestart_max, 0);
	CU_ASSERT_EQUAL(out.threads, 16);
	CU_ASSERT_EQUAL(out.warm_per_policy, 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(why.data, "0 pre-started clients on the host (set)"));
	CU_ASSERT_PTR_NOT_NULL(strstr(why.data, "16 threads (sized)"));
	buf_reset(&why);
	/* Only threads given: the rest still sized for the small host. */
	set = (struct fcgi_sizing){ .threads = 2 };
	fcgi_size(&small, &set, &out, &why);
	CU_ASSERT_EQUAL(out.threads, 2);
	CU_ASSERT_EQUAL(out.warm_per_policy, 1);
	CU_ASSERT_EQUAL(out.prestart_max, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(why.data, "905 MiB (MemTotal)"));
	CU_ASSERT_PTR_NOT_NULL(strstr(why.data, "under 1.5 GiB"));
	buf_release(&why);
}

static char root[64];

static void put(const char *rel, const char *text)
{
	char path[256], *slash;
	FILE *f;

	(void)snprintf(path, sizeof(path), "%s/%s", root, rel);
	for (slash = strchr(path + strlen(root) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
		*slash = '\0';
		(void)mkdir(path, 0700);
		*slash = '/';
	}
	f = fopen(path, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	(void)fputs(text, f);
	(void)fclose(f);
}

static void probe(struct fcgi_machine *m)
{
	char proc[128], sys[128];

	(void)snprintf(proc, sizeof(proc), "%s/proc", root);
	(void)snprintf(sys, sizeof(sys), "%s/sys", root);
	fcgi_machine_probe(proc, sys, m);
}

/* MemTotal, CPUs, and the lowest memory.max on the way up from this process's cgroup. */
static void test_probe(void)
{
	struct fcgi_machine m;

	(void)snprintf(root, sizeof(root), "/tmp/olp-sizing-XXXXXX");
	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(root));
	put("proc/meminfo", "MemFree:  100 kB\nMemTotal:       8000000 kB\nSwapTotal: 0 kB\n");
	put("proc/cpuinfo", "processor\t: 0\nmodel name\t: x\n\nprocessor\t: 1\nmodel name\t: x\n");
	put("proc/self/cgroup", "0::/a/b\n");
	probe(&m);
	CU_ASSERT_EQUAL(m.cpus, 2);
	CU_ASSERT_EQUAL(m.mem, UINT64_C(8000000) * 1024);
	CU_ASSERT_FALSE(m.mem_cgroup);
	/* A parent's limit holds for the child; "max" is none. */
	put("sys/a/b/memory.max", "max\n");
	put("sys/a/memory.max", "1073741824\n");
	probe(&m);
	CU_ASSERT_EQUAL(m.mem, GIB);
	CU_ASSERT_TRUE(m.mem_cgroup);
	put("sys/a/b/memory.max", "536870912\n");
	probe(&m);
	CU_ASSERT_EQUAL(m.mem, GIB / 2);
	/* A limit above the machine's memory changes nothing. */
	put("sys/a/b/memory.max", "max\n");
	put("sys/a/memory.max", "99999999999999\n");
	probe(&m);
	CU_ASSERT_EQUAL(m.mem, UINT64_C(8000000) * 1024);
	CU_ASSERT_FALSE(m.mem_cgroup);
	/* Nothing readable: unknown, and the large host's defaults. */
	put("proc/meminfo", "nothing here\n");
	put("proc/cpuinfo", "\n");
	put("proc/self/cgroup", "1:name=systemd:/x\n");
	probe(&m);
	CU_ASSERT_EQUAL(m.mem, 0);
	CU_ASSERT_EQUAL(m.cpus, 0);
	/* The real machine: something, and at least one CPU. */
	fcgi_machine_probe("/proc", "/sys/fs/cgroup", &m);
	CU_ASSERT_TRUE(m.cpus >= 1);
	CU_ASSERT_TRUE(m.mem > 0);
	{
		char cmd[128];

		(void)snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
		CU_ASSERT_EQUAL(system(cmd), 0);
	}
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "rule: memory and CPUs to threads, warm, pre-started", test_rule },
		{ "an explicit setting wins", test_explicit_wins },
		{ "probe: MemTotal, CPUs, cgroup memory.max", test_probe },
		{ NULL, NULL },
	};

	return ts_exit_status(ts_cunit_run("fcgi sizing", tests));
}
