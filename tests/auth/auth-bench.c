/* auth-bench: time auth_check() with stores of different sizes, side by side.
 *
 *   auth-bench [-i ITERATIONS] [-d TMPDIR] [-s postgresql://...] N1 [N2 ...]
 *
 * For each N a fresh OLP home gets N keys (through auth_key_create, as olp-keys makes
 * them); then each case is timed call by call and reported as median / p90 / p99 in
 * microseconds. Cases: a stored key (cycling over all N), the OLP_OWNER_TOKEN owner, an
 * unknown token, a stored key followed by auth_touch (the request path's full cost), and
 * an unknown token right after keys/ changed (the rescan a new key costs every worker).
 * With -s the keys live in that PostgreSQL store (ADR 0034; its schema made by olp-keys
 * store init): a stored key is then answered from the worker's cache, an unknown token
 * costs a query, and the keys/ case does not apply. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth/auth.h"
#include "common/common.h"
#include "store/store.h"
#include "tests/auth/test_util.h"
#include "tests/bench/stats.h"
#include "common/banned.h"

#define ENV_TOKEN "olp_bench-env-owner-token-0000000000000000000000"

static const char *store_url; /* -s: the keys in PostgreSQL */

static void report(size_t nkeys, const char *name, uint64_t *ns, size_t n)
{
	printf("%6zu  %-22s %10.2f %10.2f %10.2f\n", nkeys, name, bench_quantile(ns, n, 0.5) / 1e3,
	       bench_quantile(ns, n, 0.9) / 1e3, bench_quantile(ns, n, 0.99) / 1e3);
}

enum bench_case { CASE_STORED, CASE_ENV, CASE_MISS, CASE_TOUCH, CASE_RESCAN };

/* Change keys/ (as adding a key would) so that the next miss rescans it. */
static void poke_keys_dir(const char *home)
{
	struct buf p = BUF_INIT;

	buf_addf(&p, "%s/keys/.bench-poke", home);
	if (mkdir(p.data, 0700) < 0 || rmdir(p.data) < 0)
		abort();
	buf_release(&p);
}

static int run_size(size_t nkeys, size_t iters)
{
	static const char *const names[] = { "stored key", "env owner token", "unknown token",
					     "stored key + touch", "miss after keys/ change" };
	struct auth_options opt = { .env_owner_token = ENV_TOKEN, .store_offline_keys_s = 300 };
	struct auth_key_spec spec = { .name = "bench", .tier = AUTH_TIER_GUEST };
	char(*tokens)[AUTH_TOKEN_LEN + 1];
	char *home = tu_mkhome();
	struct auth_target t = { .olp_home = home };
	struct store_db *db = NULL;
	struct auth_store *st;
	uint64_t *ns, t0;
	size_t i, c;
	int ret = 1;

	tokens = xcalloc(nkeys, sizeof(*tokens));
	ns = xcalloc(iters, sizeof(*ns));
	if (store_url) {
		/* A store_db per size: its listener takes the channels of one auth_store. */
		struct buf err = BUF_INIT;

		db = store_open(store_url, NULL, &err);
		if (!db) {
			fprintf(stderr, "auth-bench: %s\n", err.data);
			buf_release(&err);
			goto out_free;
		}
		buf_release(&err);
		t.db = opt.store = db;
	}
	for (i = 0; i < nkeys; i++) {
		struct auth_new_key k;
		struct buf msg = BUF_INIT;

		if (auth_key_create_at(&t, &spec, &k, &msg) != AUTH_KEY_OK) {
			fprintf(stderr, "auth-bench: %s\n", msg.data);
			buf_release(&msg);
			goto out_free;
		}
		memcpy(tokens[i], k.token, sizeof(tokens[i]));
		auth_new_key_wipe(&k);
		buf_release(&msg);
	}
	t0 = mono_ns();
	st = auth_store_open(home, &opt);
	if (!st)
		goto out_free;
	printf("%6zu  %-22s %10.2f\n", nkeys, "open (initial scan)", (mono_ns() - t0) / 1000.0);
	for (c = CASE_STORED; c <= (db ? CASE_TOUCH : CASE_RESCAN); c++) {
		/* A rescan is the rare path (keys added or removed): fewer rounds do. */
		size_t rounds = c == CASE_RESCAN && iters > 500 ? 500 : iters;

		for (i = 0; i < rounds; i++) {
			struct auth_identity id;
			enum auth_result r;
			bool miss = c == CASE_MISS || c == CASE_RESCAN;
			const char *tok = c == CASE_ENV ? ENV_TOKEN
					  : miss ? "olp_not-a-key-at-all-000000000000000000000000"
						 : tokens[i % nkeys];

			if (c == CASE_RESCAN)
				poke_keys_dir(home);
			t0 = mono_ns();
			r = auth_check(st, NULL, tok, &id);
			if (c == CASE_TOUCH && r == AUTH_OK)
				auth_touch(st, &id);
			ns[i] = mono_ns() - t0;
			if ((r == AUTH_OK) == miss) {
				fprintf(stderr, "auth-bench: unexpected result %d\n", r);
				auth_store_free(st);
				goto out_free;
			}
			auth_identity_release(&id);
		}
		report(nkeys, names[c], ns, rounds);
	}
	auth_store_free(st);
	ret = 0;
out_free:
	store_free(db);
	free(tokens);
	free(ns);
	tu_rmhome(home);
	return ret;
}

static int usage(void)
{
	fprintf(stderr, "usage: auth-bench [-i ITERATIONS>=100] [-d TMPDIR] [-s STORE_URL] "
			"NKEYS...\n");
	return 2;
}

int main(int argc, char **argv)
{
	const char *iters_s = "20000";
	uint64_t iters, n;
	int opt, i;

	while ((opt = getopt(argc, argv, "i:d:s:")) != -1) {
		switch (opt) {
		case 'i': iters_s = optarg; break;
		case 's': store_url = optarg; break;
		case 'd': setenv("TMPDIR", optarg, 1); break;
		default: return usage();
		}
	}
	if (optind >= argc || parse_u64(iters_s, &iters) || iters < 100)
		return usage();
	printf("%6s  %-22s %10s %10s %10s\n", "keys", "case", "median_us", "p90_us", "p99_us");
	for (i = optind; i < argc; i++) {
		if (parse_u64(argv[i], &n) || !n)
			return usage();
		if (run_size((size_t)n, (size_t)iters))
			return 1;
	}
	return 0;
}
