/* spawn-bench: median wall time to start a command and learn how it ended, N times each:
 *   bare     posix_spawn + waitpid, no isolation
 *   cold     sbx_run with the server's policy, building the sandbox on the spot
 *   warm     sbx_run with warm sandboxes on (the server's default): the sandbox was
 *            started ahead of time; runs are 50 ms apart, as requests with a pause
 * "Learn how it ended" is sbx_run's on_result: when olp-fcgi sends the end of an answer.
 * --net loopback: the sandboxed runs get a loopback-only network namespace of their own
 * (SBX_NET_LOOPBACK; its listener is closed unused), to compare with the default (none).
 * usage: spawn-bench [--net none|loopback] RUNTIME_DIR N STUB CMD [ARGS...]
 *        (STUB: olp-sandbox-exec; CMD absolute) */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "sandbox/sandbox.h"
#include "tests/bench/stats.h"

extern char **environ;

static uint64_t t_result;
static enum sbx_net net_mode = SBX_NET_NONE;

static int on_listener(void *ctx, int fd, uint16_t port)
{
	(void)ctx;
	(void)port;
	close(fd);
	return 0;
}

static void on_result(void *ctx, const struct sbx_result *res)
{
	(void)ctx;
	(void)res;
	t_result = mono_ns();
}

/* n sandboxed runs of argv; returns 0 and fills v, or 1. */
static int sandboxed(char **argv, int n, uint64_t *v, bool pause)
{
	struct sbx_callbacks cb = { .on_result = on_result, .on_listener = on_listener };

	for (int i = 0; i < n; i++) {
		struct sbx_policy *p = sbx_policy_new();
		struct sbx_result res;
		uint64_t t0;

		sbx_policy_set_net(p, net_mode, 0);
		t0 = mono_ns();

		if (sbx_run(p, (const char *const *)argv, NULL, &cb, &res) || res.exit_status) {
			fprintf(stderr, "spawn-bench: sandboxed run failed: %s\n", res.stderr_tail);
			return 1;
		}
		v[i] = t_result - t0;
		sbx_policy_free(p);
		if (pause)
			usleep(50000);
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP };
	uint64_t *bare, *cold, *warm;
	int n, i, ret = 1;

	if (argc > 2 && !strcmp(argv[1], "--net")) {
		if (strcmp(argv[2], "none") && strcmp(argv[2], "loopback")) {
			fprintf(stderr, "spawn-bench: --net is none or loopback\n");
			return 2;
		}
		net_mode = strcmp(argv[2], "loopback") ? SBX_NET_NONE : SBX_NET_LOOPBACK;
		argv += 2;
		argc -= 2;
	}
	if (argc < 5) {
		fprintf(stderr, "usage: spawn-bench [--net none|loopback] RUNTIME_DIR N STUB CMD "
				"[ARGS...]\n");
		return 2;
	}
	cfg.runtime_dir = argv[1];
	n = atoi(argv[2]);
	if (n < 2 || sbx_global_init(&cfg)) {
		fprintf(stderr, "spawn-bench: bad N or runtime dir\n");
		return 1;
	}
	bare = calloc((size_t)n, sizeof(*bare));
	cold = calloc((size_t)n, sizeof(*cold));
	warm = calloc((size_t)n + 1, sizeof(*warm));
	if (!bare || !cold || !warm)
		goto out;
	for (i = 0; i < n; i++) {
		uint64_t t0 = mono_ns();
		pid_t pid;
		int st;

		if (posix_spawn(&pid, argv[4], NULL, NULL, argv + 4, environ) != 0)
			goto out;
		waitpid(pid, &st, 0);
		bare[i] = mono_ns() - t0;
	}
	if (sandboxed(argv + 4, n, cold, false))
		goto out;
	cfg.exec_stub = argv[3];
	cfg.warm = true;
	if (sbx_global_init(&cfg))
		goto out;
	/* The first run builds cold and leaves warm sandboxes behind: not counted. */
	if (sandboxed(argv + 4, n + 1, warm, true))
		goto out;
	printf("bare_spawn_median_ms %.3f\n", bench_quantile(bare, (size_t)n, 0.5) / 1e6);
	printf("sandbox_cold_median_ms %.3f\n", bench_quantile(cold, (size_t)n, 0.5) / 1e6);
	printf("sandbox_warm_median_ms %.3f\n", bench_quantile(warm + 1, (size_t)n, 0.5) / 1e6);
	ret = 0;
out:
	free(bare);
	free(cold);
	free(warm);
	sbx_global_release();
	return ret;
}
