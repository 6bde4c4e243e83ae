/* spawn-bench: median wall time of starting a command and waiting for it, N times each,
 * interleaved so that machine noise hits every variant alike:
 *   bare     posix_spawn + waitpid, no isolation
 *   sandbox  sbx_run with the server's policy (bwrap, namespaces, scratch dir), i.e.
 *            exactly what olp-fcgi does per request
 * usage: spawn-bench RUNTIME_DIR N CMD [ARGS...]   (CMD absolute) */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common/common.h"
#include "sandbox/sandbox.h"

extern char **environ;

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static double median_ms(uint64_t *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_u64);
	return (n % 2 ? (double)v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0) / 1e6;
}

int main(int argc, char **argv)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP };
	uint64_t *bare, *sbx;
	int n, i;

	if (argc < 4) {
		fprintf(stderr, "usage: spawn-bench RUNTIME_DIR N CMD [ARGS...]\n");
		return 2;
	}
	cfg.runtime_dir = argv[1];
	n = atoi(argv[2]);
	if (n < 1 || sbx_global_init(&cfg)) {
		fprintf(stderr, "spawn-bench: bad N or runtime dir\n");
		return 1;
	}
	bare = calloc((size_t)n, sizeof(*bare));
	sbx = calloc((size_t)n, sizeof(*sbx));
	for (i = 0; i < n; i++) {
		struct sbx_policy *p = sbx_policy_new();
		struct sbx_result res;
		uint64_t t0 = mono_ns();
		pid_t pid;
		int st;

		if (posix_spawn(&pid, argv[3], NULL, NULL, argv + 3, environ) != 0)
			return 1;
		waitpid(pid, &st, 0);
		bare[i] = mono_ns() - t0;

		t0 = mono_ns();
		if (sbx_run(p, (const char *const *)argv + 3, NULL, NULL, &res) || res.exit_status) {
			fprintf(stderr, "spawn-bench: sandboxed run failed: %s\n", res.stderr_tail);
			return 1;
		}
		sbx[i] = mono_ns() - t0;
		sbx_policy_free(p);
	}
	printf("bare_spawn_median_ms %.3f\n", median_ms(bare, n));
	printf("sandbox_spawn_median_ms %.3f\n", median_ms(sbx, n));
	free(bare);
	free(sbx);
	sbx_global_release();
	return 0;
}
