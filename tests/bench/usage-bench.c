/* usage-bench: the cost of the ledger and the quota check on the request path (issue 14):
 * usage_record_add (goal: median <= 0.2 ms) and usage_quota_take (goal: <= 20 us), each
 * call timed alone, on a store in OLP_HOME (a fresh directory the caller gives).
 * usage: usage-bench OLP_HOME [CALLS]
 * One process, one thread: what one request pays, not a throughput figure. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "usage/usage.h"
#include "tests/bench/stats.h"
#include "common/banned.h"

int main(int argc, char **argv)
{
	struct usage_quota big = { .requests_per_minute = INT64_MAX / 2,
				   .requests_per_day = INT64_MAX / 2,
				   .tokens_per_day = INT64_MAX / 2 };
	struct usage_quota spent = { .requests_per_day = 1 };
	struct usage_quota none = { 0 };
	struct usage_store *st;
	struct usage_verdict v;
	uint64_t calls = 20000, *ns;
	char key[32];
	size_t n;

	if (argc < 2 || argc > 3 || (argc == 3 && (parse_u64(argv[2], &calls) || calls < 100))) {
		(void)fputs("usage: usage-bench OLP_HOME [CALLS >= 100]\n", stderr);
		return 2;
	}
	n = (size_t)calls;
	st = usage_store_open(argv[1], NULL);
	if (!st || !usage_available(st)) {
		fprintf(stderr, "usage-bench: cannot open the store in %s\n", argv[1]);
		return 1;
	}
	ns = xcalloc(n, sizeof(*ns));
	printf("  %-36s %7s %10s %10s %10s %10s\n", "case (microseconds)", "calls", "median", "p90",
	       "p99", "max");

	/* A request's row: 50 keys, 3 providers, as a small team's traffic. */
	for (size_t i = 0; i < n; i++) {
		struct usage_record r = {
			.key_id = key,
			.provider = i % 3 == 0	 ? "claude"
				    : i % 3 == 1 ? "codex"
						 : "vibe",
			.model = "sonnet",
			.status = 200,
			.prompt_tokens = 1200,
			.completion_tokens = 300,
			.cached_tokens = 1000,
			.duration_ms = 2500,
			.ttfb_ms = 900,
			.start = USAGE_START_WARM,
		};
		uint64_t t0;

		snprintf(key, sizeof(key), "key%02zu", i % 50);
		t0 = mono_ns();
		if (usage_record_add(st, &r) != 0) {
			fprintf(stderr, "usage-bench: usage_record_add failed\n");
			return 1;
		}
		ns[i] = mono_ns() - t0;
	}
	bench_row("usage_record_add", 36, ns, n);

	for (size_t i = 0; i < n; i++) {
		uint64_t t0;

		snprintf(key, sizeof(key), "key%02zu", i % 50);
		t0 = mono_ns();
		if (usage_quota_take(st, key, &big, 0, &v) != 0 || !v.allowed) {
			fprintf(stderr, "usage-bench: usage_quota_take failed\n");
			return 1;
		}
		ns[i] = mono_ns() - t0;
	}
	bench_row("usage_quota_take, allowed", 36, ns, n);

	/* Refused: the check alone, nothing written. */
	usage_quota_take(st, "spent", &spent, 0, &v);
	for (size_t i = 0; i < n; i++) {
		uint64_t t0 = mono_ns();

		if (usage_quota_take(st, "spent", &spent, 0, &v) != 0 || v.allowed) {
			fprintf(stderr, "usage-bench: usage_quota_take did not refuse\n");
			return 1;
		}
		ns[i] = mono_ns() - t0;
	}
	bench_row("usage_quota_take, refused", 36, ns, n);

	for (size_t i = 0; i < n; i++) {
		uint64_t t0 = mono_ns();

		usage_quota_take(st, "free", &none, 0, &v);
		ns[i] = mono_ns() - t0;
	}
	bench_row("usage_quota_take, key without quota", 36, ns, n);

	/* At a person's pace: 50 ms between checks, as the request-path bench sends them
	 * (usage-http-bench.sh). Caches are cold then; this is what a request pays. */
	for (size_t i = 0; i < n / 100; i++) {
		struct timespec pause = { .tv_nsec = 50 * 1000000L };
		uint64_t t0;

		nanosleep(&pause, NULL);
		t0 = mono_ns();
		if (usage_quota_take(st, "paced", &big, 0, &v) != 0 || !v.allowed) {
			fprintf(stderr, "usage-bench: usage_quota_take failed\n");
			return 1;
		}
		ns[i] = mono_ns() - t0;
	}
	bench_row("usage_quota_take, 50 ms apart", 36, ns, n / 100);

	if (usage_failures(st)) {
		fprintf(stderr, "usage-bench: %" PRIu64 " store failures\n", usage_failures(st));
		return 1;
	}
	free(ns);
	usage_store_free(st);
	return 0;
}
