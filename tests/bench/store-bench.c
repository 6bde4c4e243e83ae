/* store-bench: what the shared PostgreSQL store costs on the request path against the
 * embedded SQLite store (ADR 0034, issue 25: a quota check at most 1 ms median against a
 * PostgreSQL on the same machine). The calls are interleaved, one of each backend in
 * turn, so that both see the same machine at the same moment:
 *   usage_quota_take, allowed (counted: a write)     both
 *   usage_quota_take, refused (nothing counted)      both
 *   usage_record_add (PostgreSQL: queued)            both
 *   usage_lease_take + usage_lease_release           slot files vs olp_leases
 * usage: store-bench OLP_HOME STORE_URL [CALLS]   (PGPASSFILE for the password; the
 * "usage" schema must be in place: store-bench.sh runs it under tests/pg/with-pg.sh)
 * One process, one thread: what one request pays, not a throughput figure. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "store/store.h"
#include "usage/usage.h"
#include "tests/bench/stats.h"
#include "common/banned.h"

struct side {
	const char *name;
	struct usage_store *st;
	struct usage_leases *ls;
	uint64_t *take, *refuse, *record, *lease;
};

/* One round of every case on one side: 0, or -1 (said why). */
static int round_one(struct side *s, size_t i)
{
	static const struct usage_quota big = { .requests_per_day = INT64_MAX / 2,
						.requests_per_minute = INT64_MAX / 2 };
	static const struct usage_quota spent = { .requests_per_day = 1 };
	struct usage_record r = { .key_id = "bench",
				  .provider = "claude",
				  .model = "sonnet",
				  .status = 200,
				  .prompt_tokens = 1200,
				  .completion_tokens = 300,
				  .duration_ms = 2500,
				  .ttfb_ms = 900,
				  .start = USAGE_START_WARM };
	struct usage_lease l = USAGE_LEASE_INIT;
	struct usage_verdict v;
	char key[32];
	uint64_t t0;

	snprintf(key, sizeof(key), "key%02zu", i % 50);
	t0 = mono_ns();
	if (usage_quota_take(s->st, key, &big, 0, &v) || !v.allowed)
		goto fail;
	s->take[i] = mono_ns() - t0;
	t0 = mono_ns();
	if (usage_quota_take(s->st, "spent", &spent, 0, &v) || v.allowed)
		goto fail;
	s->refuse[i] = mono_ns() - t0;
	r.key_id = key;
	t0 = mono_ns();
	if (usage_record_add(s->st, &r))
		goto fail;
	s->record[i] = mono_ns() - t0;
	t0 = mono_ns();
	if (usage_lease_take(s->ls, key, 4, &l))
		goto fail;
	usage_lease_release(s->ls, &l);
	s->lease[i] = mono_ns() - t0;
	return 0;
fail:
	fprintf(stderr, "store-bench: %s: call %zu failed\n", s->name, i);
	return -1;
}

int main(int argc, char **argv)
{
	struct side sides[2] = { { .name = "sqlite" }, { .name = "postgresql" } };
	struct usage_verdict v;
	struct buf err = BUF_INIT;
	struct store_db *db;
	uint64_t calls = 5000;
	size_t n;

	if (argc < 3 || argc > 4 || (argc == 4 && (parse_u64(argv[3], &calls) || calls < 100))) {
		(void)fputs("usage: store-bench OLP_HOME STORE_URL [CALLS >= 100]\n", stderr);
		return 2;
	}
	n = (size_t)calls;
	db = store_open(argv[2], NULL, &err);
	if (!db) {
		fprintf(stderr, "store-bench: %s\n", err.data);
		return 1;
	}
	/* The schema, when the owner's URL is at hand (tests/pg/with-pg.sh sets it). */
	if (getenv("OLP_TEST_PG_ADMIN_URL")) {
		const struct store_schema *v1[1] = { usage_pg_schema() };
		struct store_db *admin = store_open(getenv("OLP_TEST_PG_ADMIN_URL"), NULL, &err);

		if (!admin || store_schema_apply(admin, v1, 1, "olp_worker", &err)) {
			fprintf(stderr, "store-bench: the schema: %s\n", err.data);
			return 1;
		}
		store_free(admin);
	}
	sides[0].st = usage_store_open(argv[1], NULL);
	sides[0].ls = usage_leases_open(&(struct usage_lease_options){ .runtime_dir = argv[1] });
	sides[1].st = usage_store_open(argv[1], &(struct usage_options){ .store = db });
	sides[1].ls = usage_leases_open(&(struct usage_lease_options){ .store = db });
	for (size_t k = 0; k < 2; k++) {
		struct side *s = &sides[k];

		if (!s->st || !s->ls || !usage_available(s->st)) {
			fprintf(stderr, "store-bench: the %s store cannot be used\n", s->name);
			return 1;
		}
		s->take = xcalloc(n, sizeof(uint64_t));
		s->refuse = xcalloc(n, sizeof(uint64_t));
		s->record = xcalloc(n, sizeof(uint64_t));
		s->lease = xcalloc(n, sizeof(uint64_t));
		/* The refused key spent its one request. */
		usage_quota_take(s->st, "spent", &(struct usage_quota){ .requests_per_day = 1 }, 0,
				 &v);
	}
	for (size_t i = 0; i < n; i++)
		for (size_t k = 0; k < 2; k++)
			if (round_one(&sides[(i + k) % 2], i))
				return 1;
	printf("  %-44s %7s %10s %10s %10s %10s\n", "case (microseconds)", "calls", "median", "p90",
	       "p99", "max");
	for (size_t k = 0; k < 2; k++) {
		struct side *s = &sides[k];
		char what[64];

		snprintf(what, sizeof(what), "%s: usage_quota_take, allowed", s->name);
		bench_row(what, 44, s->take, n);
		snprintf(what, sizeof(what), "%s: usage_quota_take, refused", s->name);
		bench_row(what, 44, s->refuse, n);
		snprintf(what, sizeof(what), "%s: usage_record_add", s->name);
		bench_row(what, 44, s->record, n);
		snprintf(what, sizeof(what), "%s: usage_lease_take + release", s->name);
		bench_row(what, 44, s->lease, n);
	}
	printf("  postgresql ledger rows dropped: %" PRIu64 "\n", usage_dropped(sides[1].st));
	for (size_t k = 0; k < 2; k++) {
		usage_leases_free(sides[k].ls);
		usage_store_free(sides[k].st);
		free(sides[k].take);
		free(sides[k].refuse);
		free(sides[k].record);
		free(sides[k].lease);
	}
	store_free(db);
	buf_release(&err);
	return 0;
}
