/* CUnit suite for usage/ on the shared PostgreSQL store (ADR 0034), against a real server:
 * run by tests/pg/with-pg.sh (a throwaway cluster; exit 77 without one). The schema made
 * by its owner and used by the workers' role; the ledger queued, written in batches and
 * read back (every host's rows), refusals counted per minute; quota windows, their
 * verdicts and token reservations as the SQLite suite checks them; exactness across
 * processes (each its own store_db): a quota of Q under 40 concurrent takes gives exactly
 * Q, tokens_per_day likewise; leases: max_concurrent 1 across two holders, a holder
 * killed with SIGKILL reclaimed within its ttl, renewals keeping a live one; the database
 * stopped and started (rows queued and written, checks failing with -errno, health
 * failing, everything back within 10 s), the queue's overflow counted; the import of a
 * usage.db run twice copying once; SQL injection strings stored verbatim. Through usage.h
 * and store.h only. */
#include "tests/support/cunit.h"
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "store/store.h"
#include "usage/usage.h"
#include "common/banned.h"

#define MINUTE_MS 60000LL
#define DAY_MS 86400000LL

static const char *worker_url, *admin_url, *pg_ctl;
static char tmproot[] = "/tmp/olp-usage-pg-test-XXXXXX";
static unsigned seq;

static int64_t now_ms(void)
{
	return wall_ms();
}

static int64_t today_ms(void)
{
	return now_ms() / DAY_MS * DAY_MS;
}

/* A key id no other test (or earlier run on a kept cluster) uses. */
static const char *new_key(const char *what)
{
	static char key[64];

	snprintf(key, sizeof(key), "%s-%d-%u", what, (int)getpid(), ++seq);
	return key;
}

static struct store_db *db_open(void)
{
	struct buf err = BUF_INIT;
	struct store_db *db = store_open(worker_url, NULL, &err);

	CU_ASSERT_PTR_NOT_NULL_FATAL(db);
	buf_release(&err);
	return db;
}

static struct usage_store *pg_store(struct store_db *db, unsigned buffer_rows)
{
	struct usage_options o = { .store = db, .store_buffer_rows = buffer_rows, .host = "h1" };
	struct usage_store *st = usage_store_open("/nonexistent", &o);

	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	return st;
}

static void pg_ctl_run(const char *what)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "%s %s >/dev/null 2>&1", pg_ctl, what);
	CU_ASSERT_FATAL(system(cmd) == 0);
}

static void add_row(struct usage_store *st, int64_t ts, const char *key, const char *provider,
		    const char *model, int status, int64_t p, int64_t c, enum usage_start start)
{
	struct usage_record r = { .ts_ms = ts,
				  .key_id = key,
				  .provider = provider,
				  .model = model,
				  .status = status,
				  .prompt_tokens = p,
				  .completion_tokens = c,
				  .cached_tokens = p / 2,
				  .duration_ms = 100,
				  .ttfb_ms = 10,
				  .start = start };

	CU_ASSERT_EQUAL(usage_record_add(st, &r), 0);
}

/* The recent rows of key, waiting up to wait_ms for at least want of them (the writer
 * thread writes asynchronously). */
static size_t recent_wait(struct usage_store *st, const char *key, size_t want, unsigned wait_ms,
			  struct usage_row **rows)
{
	struct usage_filter f = { .key_id = key };
	uint64_t end = mono_ms() + wait_ms;
	size_t n = 0;

	for (;;) {
		*rows = NULL;
		if (usage_recent(st, &f, 1000, rows, &n) == 0 && n >= want)
			return n;
		free(*rows);
		*rows = NULL;
		if (mono_ms() >= end)
			return n;
		usleep(50000);
	}
}

/* ---- the schema ------------------------------------------------------------------------- */

static void test_schema(void)
{
	const struct store_schema *s = usage_pg_schema();
	struct store_db *db = db_open();
	unsigned found = 0;
	struct buf err = BUF_INIT;
	struct store_db *admin = store_open(admin_url, NULL, &err);
	const struct store_schema *v[1] = { s };
	/* Numbers and names, as SQLite's (tests/usage/test_usage.c): nothing else. */
	const char *ok =
		" id host ts_ms key_id provider model status prompt_tokens completion_tokens"
		" cached_tokens duration_ms ttfb_ms start count src_rowid account kind start_ms"
		" requests"
		" tokens day_ms expires_ms slot holder expires_at ";
	char word[80];
	PGconn *c;
	PGresult *r;

	CU_ASSERT_STRING_EQUAL(s->module, "usage");
	CU_ASSERT_EQUAL(store_schema_check(db, s, &found), 0);
	CU_ASSERT_EQUAL(found, s->n);
	/* Applied again: current, nothing changed. */
	CU_ASSERT_PTR_NOT_NULL_FATAL(admin);
	CU_ASSERT_EQUAL(store_schema_apply(admin, v, 1, "olp_worker", &err), 0);
	{
		char want[64];

		snprintf(want, sizeof(want), "usage: version %u, current", s->n);
		CU_ASSERT_PTR_NOT_NULL(strstr(err.data, want));
	}
	/* The workers' role may not change the schema. */
	buf_reset(&err);
	CU_ASSERT_NOT_EQUAL(store_schema_apply(db, v, 1, NULL, &err), 0);
	/* No column for content, a token or a hash. */
	c = store_conn_get(db, 1000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	r = store_exec(db, c,
		       "SELECT column_name FROM information_schema.columns WHERE table_name IN"
		       " ('olp_requests', 'olp_quota_windows', 'olp_quota_holds', 'olp_leases')",
		       0, NULL, NULL, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	CU_ASSERT(PQntuples(r) > 20);
	for (int i = 0; i < PQntuples(r); i++) {
		snprintf(word, sizeof(word), " %s ", PQgetvalue(r, i, 0));
		if (!strstr(ok, word))
			fprintf(stderr, "unexpected column %s\n", word);
		CU_ASSERT_PTR_NOT_NULL(strstr(ok, word));
	}
	PQclear(r);
	store_conn_put(db, c, false);
	buf_release(&err);
	store_free(admin);
	store_free(db);
}

/* Whether main found the database at version 1 (a fresh cluster) and left it there for
 * test_upgrade; false on a kept cluster already upgraded. */
static bool at_v1;

/* Version 1 -> 2 (ADR 0037's account column): a worker at the old version refuses (the
 * ledger unreadable with -EPROTO, a quota check refused), olp-keys store init's apply
 * upgrades, rows then carry their account. */
static void test_upgrade(void)
{
	const struct store_schema *s = usage_pg_schema();
	const struct store_schema *v[1] = { s };
	struct store_db *db = db_open(), *admin;
	struct usage_quota q = { .requests_per_day = 5 };
	const char *key = new_key("upg");
	struct usage_record r = { .key_id = key,
				  .provider = "claude",
				  .model = "m",
				  .account = "alice",
				  .status = 200,
				  .prompt_tokens = 1,
				  .start = USAGE_START_COLD };
	struct usage_filter f = { .key_id = key };
	struct buf err = BUF_INIT;
	struct usage_verdict vd;
	struct usage_day *days = NULL;
	struct usage_row *rows = NULL;
	struct usage_store *st;
	unsigned found = 0;
	size_t n = 0;

	CU_ASSERT_EQUAL(s->n, 2);
	if (at_v1) {
		CU_ASSERT_EQUAL(store_schema_check(db, s, &found), -EPROTO);
		CU_ASSERT_EQUAL(found, 1);
		st = pg_store(db, 0);
		CU_ASSERT_EQUAL(usage_days(st, &f, &days, &n), -EPROTO);
		CU_ASSERT_NOT_EQUAL(usage_quota_take(st, key, &q, 0, &vd), 0);
		CU_ASSERT_FALSE(vd.allowed);
		CU_ASSERT_FALSE(usage_available(st));
		usage_store_free(st);
	} else {
		fprintf(stderr, "test_upgrade: a kept cluster, already at version %u\n", s->n);
	}
	admin = store_open(admin_url, NULL, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(admin);
	CU_ASSERT_EQUAL_FATAL(store_schema_apply(admin, v, 1, "olp_worker", &err), 0);
	if (at_v1)
		CU_ASSERT_PTR_NOT_NULL(strstr(err.data, "usage: version 1 -> 2"));
	store_free(admin);
	CU_ASSERT_EQUAL(store_schema_check(db, s, &found), 0);
	st = pg_store(db, 0);
	r.ts_ms = now_ms();
	CU_ASSERT_EQUAL(usage_record_add(st, &r), 0);
	r.ts_ms++;
	r.account = "bob";
	CU_ASSERT_EQUAL(usage_record_add(st, &r), 0);
	r.ts_ms++;
	r.account = NULL; /* refused before any provider: no account */
	r.status = 429;
	r.prompt_tokens = 0;
	r.start = USAGE_START_NONE;
	CU_ASSERT_EQUAL(usage_record_add(st, &r), 0);
	r.account = "bob"; /* a refusal through bob: a row of its own */
	CU_ASSERT_EQUAL(usage_record_add(st, &r), 0);
	CU_ASSERT_EQUAL(usage_record_add(st, &r), 0);
	CU_ASSERT_EQUAL(recent_wait(st, key, 4, 5000, &rows), 4);
	free(rows);
	usleep(300000);
	CU_ASSERT_EQUAL(usage_days(st, &f, &days, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 3); /* claude: "", alice, bob */
	CU_ASSERT_STRING_EQUAL(days[0].account, "");
	CU_ASSERT_EQUAL(days[0].requests, 1);
	CU_ASSERT_STRING_EQUAL(days[1].account, "alice");
	CU_ASSERT_EQUAL(days[1].requests, 1);
	CU_ASSERT_STRING_EQUAL(days[2].account, "bob");
	CU_ASSERT_EQUAL(days[2].requests, 3);
	CU_ASSERT_EQUAL(days[2].errors, 2);
	free(days);
	CU_ASSERT_EQUAL(usage_recent(st, &f, 10, &rows, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 4);
	{
		int bob_refusals = 0;

		for (size_t i = 0; i < n; i++)
			if (rows[i].status == 429 && !strcmp(rows[i].account, "bob"))
				bob_refusals += (int)rows[i].count;
		CU_ASSERT_EQUAL(bob_refusals, 2);
	}
	free(rows);
	CU_ASSERT_EQUAL(usage_failures(st), 0);
	usage_store_free(st);
	buf_release(&err);
	store_free(db);
}

/* ---- the ledger ------------------------------------------------------------------------- */

static void test_record_read(void)
{
	struct store_db *db = db_open();
	struct usage_store *st = pg_store(db, 0);
	const char *key = new_key("rec");
	int64_t t0 = today_ms() + 3600000;
	struct usage_filter f = { .key_id = key };
	struct usage_day *days = NULL;
	struct usage_row *rows = NULL;
	size_t n = 0;

	add_row(st, t0, key, "claude", "sonnet", 200, 100, 50, USAGE_START_COLD);
	add_row(st, t0 + 1000, key, "claude", "sonnet", 200, 10, 5, USAGE_START_WARM);
	add_row(st, t0 + 2000, key, "codex", NULL, 500, 0, 0, USAGE_START_PRESTART);
	/* Three refusals in one minute: one row counting 3. */
	add_row(st, t0 + 3000, key, NULL, NULL, 429, 0, 0, USAGE_START_NONE);
	add_row(st, t0 + 4000, key, NULL, NULL, 429, 0, 0, USAGE_START_NONE);
	add_row(st, t0 + 5000, key, NULL, NULL, 429, 0, 0, USAGE_START_NONE);
	CU_ASSERT_EQUAL(recent_wait(st, key, 4, 5000, &rows), 4);
	free(rows);
	/* Once all are in, check the sums (the refusals' row may be the last written). */
	usleep(300000);
	CU_ASSERT_EQUAL(usage_recent(st, &f, 10, &rows, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 4);
	/* Newest first; the refusals' row is at its minute's start, t0, after the row of t0
	 * written before it. */
	CU_ASSERT_EQUAL(rows[0].start, USAGE_START_PRESTART);
	CU_ASSERT_STRING_EQUAL(rows[0].model, "");
	CU_ASSERT_EQUAL(rows[1].start, USAGE_START_WARM);
	CU_ASSERT_EQUAL(rows[2].status, 429);
	CU_ASSERT_EQUAL(rows[2].count, 3);
	CU_ASSERT_EQUAL(rows[2].ts_ms, t0);
	CU_ASSERT_STRING_EQUAL(rows[2].provider, "");
	CU_ASSERT_EQUAL(rows[3].prompt_tokens, 100);
	CU_ASSERT_EQUAL(rows[3].cached_tokens, 50);
	CU_ASSERT_EQUAL(rows[3].ttfb_ms, 10);
	CU_ASSERT_STRING_EQUAL(rows[3].model, "sonnet");
	free(rows);
	CU_ASSERT_EQUAL(usage_days(st, &f, &days, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 3); /* "", claude, codex */
	CU_ASSERT_STRING_EQUAL(days[0].provider, "");
	CU_ASSERT_EQUAL(days[0].requests, 3);
	CU_ASSERT_EQUAL(days[0].errors, 3);
	CU_ASSERT_STRING_EQUAL(days[1].provider, "claude");
	CU_ASSERT_EQUAL(days[1].requests, 2);
	CU_ASSERT_EQUAL(days[1].prompt_tokens, 110);
	CU_ASSERT_EQUAL(days[1].completion_tokens, 55);
	CU_ASSERT_EQUAL(days[1].warm, 1);
	CU_ASSERT_EQUAL(days[2].prestart, 1);
	CU_ASSERT_EQUAL(days[2].errors, 1);
	CU_ASSERT_EQUAL(strlen(days[0].day), 10);
	free(days);
	CU_ASSERT_EQUAL(usage_dropped(st), 0);
	/* Nothing failed, the writer's first prune (at its start) included. */
	CU_ASSERT_EQUAL(usage_failures(st), 0);
	usage_store_free(st);
	store_free(db);
}

/* ?account= on the store (ADR 0037): that account's rows alone, the recent rows' limit
 * counted after the filter, with a key or without; an account without rows reads
 * nothing; a name is a statement parameter, never SQL. */
static void test_account_filter(void)
{
	struct store_db *db = db_open();
	struct usage_store *st = pg_store(db, 0);
	char k1[64], k2[64]; /* new_key's buffer is static */
	static const char *const acct[] = { "alice", "bob", "bob", NULL, "alice", "bob" };
	int64_t t0 = today_ms() + 3600000;
	struct usage_filter f = { .key_id = k1, .account = "bob" };
	struct usage_day *days = NULL;
	struct usage_row *rows = NULL;
	size_t n = 0;

	snprintf(k1, sizeof(k1), "%s", new_key("acf1"));
	snprintf(k2, sizeof(k2), "%s", new_key("acf2"));
	for (size_t i = 0; i < ARRAY_SIZE(acct); i++) {
		struct usage_record r = { .ts_ms = t0 + (int64_t)i * 1000,
					  .key_id = i < 4 ? k1 : k2,
					  .provider = "claude",
					  .model = "m",
					  .account = acct[i],
					  .status = 200,
					  .prompt_tokens = (int64_t)i + 1,
					  .start = USAGE_START_COLD };

		CU_ASSERT_EQUAL(usage_record_add(st, &r), 0);
	}
	CU_ASSERT_EQUAL(recent_wait(st, k1, 4, 5000, &rows), 4);
	free(rows);
	CU_ASSERT_EQUAL(recent_wait(st, k2, 2, 5000, &rows), 2);
	free(rows);
	CU_ASSERT_EQUAL(usage_days(st, &f, &days, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 1);
	CU_ASSERT_STRING_EQUAL(days[0].account, "bob");
	CU_ASSERT_EQUAL(days[0].requests, 2);
	CU_ASSERT_EQUAL(days[0].prompt_tokens, 2 + 3);
	free(days);
	CU_ASSERT_EQUAL(usage_recent(st, &f, 1, &rows, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 1);
	CU_ASSERT_EQUAL(rows[0].prompt_tokens, 3); /* bob's newest, not k1's newest */
	free(rows);
	f.account = "alice";
	f.key_id = k2;
	CU_ASSERT_EQUAL(usage_recent(st, &f, 10, &rows, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 1);
	CU_ASSERT_EQUAL(rows[0].prompt_tokens, 5);
	free(rows);
	f.account = "carol";
	CU_ASSERT_EQUAL(usage_days(st, &f, &days, &n), 0);
	CU_ASSERT_EQUAL(n, 0);
	f.account = "x' OR '1'='1";
	f.key_id = NULL;
	CU_ASSERT_EQUAL(usage_recent(st, &f, 10, &rows, &n), 0);
	CU_ASSERT_EQUAL(n, 0);
	f.account = "abcdefghijabcdefghijabcdefghijabc";
	CU_ASSERT_EQUAL(usage_days(st, &f, &days, &n), -EINVAL);
	usage_store_free(st);
	store_free(db);
}

/* Rows queued just before usage_store_free are written by it; a second host's rows are
 * read by the first. */
static void test_free_flushes_two_hosts(void)
{
	struct store_db *db = db_open(), *db2 = db_open();
	struct usage_store *st = pg_store(db, 0);
	struct usage_options o2 = { .store = db2, .host = "h2" };
	struct usage_store *st2 = usage_store_open("/nonexistent", &o2);
	const char *key = new_key("flush");
	struct usage_row *rows = NULL;
	size_t n;

	CU_ASSERT_PTR_NOT_NULL_FATAL(st2);
	for (int i = 0; i < 300; i++)
		add_row(i % 2 ? st : st2, now_ms() - i, key, "p", "m", 200, 1, 1, USAGE_START_COLD);
	usage_store_free(st2);
	usage_store_free(st);
	st = pg_store(db, 0);
	n = recent_wait(st, key, 300, 100, &rows);
	CU_ASSERT_EQUAL(n, 300);
	free(rows);
	usage_store_free(st);
	store_free(db);
	store_free(db2);
}

/* ---- quotas ----------------------------------------------------------------------------- */

static void test_quota_minute_day(void)
{
	struct store_db *db = db_open();
	struct usage_store *st = pg_store(db, 0);
	const char *key = new_key("qmd");
	struct usage_quota q = { .requests_per_minute = 2, .requests_per_day = 3 };
	int64_t t = today_ms() + 10 * MINUTE_MS + 30000; /* 30 s into a minute */
	struct usage_verdict v;
	struct usage_quota_state s;

	CU_ASSERT_EQUAL(usage_quota_take(st, key, &q, t, &v), 0);
	CU_ASSERT(v.allowed);
	CU_ASSERT_EQUAL(usage_quota_take(st, key, &q, t + 1000, &v), 0);
	CU_ASSERT(v.allowed);
	CU_ASSERT_EQUAL(usage_quota_take(st, key, &q, t + 2000, &v), 0);
	CU_ASSERT_FALSE(v.allowed);
	CU_ASSERT_STRING_EQUAL(v.limit, "requests_per_minute");
	CU_ASSERT_EQUAL(v.limit_value, 2);
	CU_ASSERT_EQUAL(v.used, 2);
	CU_ASSERT_EQUAL(v.retry_after, 28);
	/* The next minute: one more, then the day's limit. */
	CU_ASSERT_EQUAL(usage_quota_take(st, key, &q, t + MINUTE_MS, &v), 0);
	CU_ASSERT(v.allowed);
	CU_ASSERT_EQUAL(usage_quota_take(st, key, &q, t + MINUTE_MS + 1, &v), 0);
	CU_ASSERT_FALSE(v.allowed);
	CU_ASSERT_STRING_EQUAL(v.limit, "requests_per_day");
	CU_ASSERT_EQUAL(v.used, 3);
	CU_ASSERT_EQUAL(usage_quota_state(st, key, t + MINUTE_MS, &s), 0);
	CU_ASSERT_EQUAL(s.requests_this_minute, 1);
	CU_ASSERT_EQUAL(s.requests_today, 3);
	/* The database's clock: now_ms 0. */
	key = new_key("qclock");
	CU_ASSERT_EQUAL(usage_quota_take(st, key, &q, 0, &v), 0);
	CU_ASSERT(v.allowed);
	CU_ASSERT_EQUAL(usage_quota_state(st, key, 0, &s), 0);
	CU_ASSERT_EQUAL(s.requests_today, 1);
	usage_store_free(st);
	store_free(db);
}

static void test_quota_tokens(void)
{
	struct store_db *db = db_open();
	struct usage_store *st = pg_store(db, 0);
	const char *key = new_key("qtok");
	struct usage_quota q = { .tokens_per_day = 100 };
	int64_t t = now_ms();
	struct usage_claim c1 = { .tokens = 60, .ttl_ms = 600000 }, c2 = c1, c3 = c1;
	struct usage_verdict v;
	struct usage_quota_state s;
	struct usage_record r = { .ts_ms = t, .key_id = key, .provider = "p", .status = 200 };

	CU_ASSERT_EQUAL(usage_quota_claim(st, key, &q, t, &c1, &v), 0);
	CU_ASSERT(v.allowed);
	CU_ASSERT(c1.hold_id > 0);
	CU_ASSERT_EQUAL(usage_quota_claim(st, key, &q, t, &c2, &v), 0);
	CU_ASSERT(v.allowed); /* 60 held < 100 */
	CU_ASSERT_EQUAL(usage_quota_claim(st, key, &q, t, &c3, &v), 0);
	CU_ASSERT_FALSE(v.allowed);
	CU_ASSERT_STRING_EQUAL(v.limit, "tokens_per_day");
	CU_ASSERT_EQUAL(v.used, 120);
	CU_ASSERT_EQUAL(c3.hold_id, 0);
	/* c2 never ran: given back. c1 settled by its row: 30 real tokens. */
	CU_ASSERT_EQUAL(usage_quota_refund(st, key, &c2), 0);
	CU_ASSERT_EQUAL(c2.hold_id, 0);
	r.prompt_tokens = 20;
	r.completion_tokens = 10;
	r.hold_id = c1.hold_id;
	r.start = USAGE_START_COLD;
	CU_ASSERT_EQUAL(usage_record_add(st, &r), 0);
	for (int i = 0; i < 100; i++) {
		CU_ASSERT_EQUAL(usage_quota_state(st, key, t, &s), 0);
		if (s.tokens_today == 30)
			break;
		usleep(50000);
	}
	CU_ASSERT_EQUAL(s.tokens_today, 30);
	CU_ASSERT_EQUAL(s.tokens_reserved, 0);
	CU_ASSERT_EQUAL(s.requests_today, 1); /* c2's count given back */
	usage_store_free(st);
	store_free(db);
}

/* ---- exactness across processes --------------------------------------------------------- */

/* n children, each with its own store_db and usage store, each makes takes claims at once
 * (released together by a pipe): the number of allowed ones, or -1. */
static int takes_in_children(const char *key, const struct usage_quota *q, int64_t tokens, int n,
			     int takes)
{
	int go[2], allowed = 0;
	pid_t pids[16];

	CU_ASSERT_FATAL(n <= 16 && pipe(go) == 0);
	for (int i = 0; i < n; i++) {
		pids[i] = fork();
		CU_ASSERT_FATAL(pids[i] >= 0);
		if (pids[i] == 0) {
			struct buf err = BUF_INIT;
			struct store_db *db = store_open(worker_url, NULL, &err);
			struct usage_options o = { .store = db };
			struct usage_store *st = usage_store_open("/nonexistent", &o);
			char b;
			int ok = 0;

			close(go[1]);
			if (read(go[0], &b, 1) < 0)
				_exit(255);
			for (int k = 0; k < takes; k++) {
				struct usage_claim c = { .tokens = tokens, .ttl_ms = 600000 };
				struct usage_verdict v;

				if (usage_quota_claim(st, key, q, 0, &c, &v) == 0 && v.allowed)
					ok++;
			}
			usage_store_free(st);
			store_free(db);
			_exit(ok);
		}
	}
	close(go[0]);
	usleep(300000); /* every child connected */
	close(go[1]);
	for (int i = 0; i < n; i++) {
		int status;

		CU_ASSERT_FATAL(waitpid(pids[i], &status, 0) == pids[i]);
		if (!WIFEXITED(status) || WEXITSTATUS(status) == 255)
			return -1;
		allowed += WEXITSTATUS(status);
	}
	return allowed;
}

static void test_exact_processes(void)
{
	struct usage_quota q = { .requests_per_day = 7 };
	struct usage_quota t = { .tokens_per_day = 1000 };

	/* 8 processes x 5 takes = 40 at once, a quota of 7: exactly 7. */
	CU_ASSERT_EQUAL(takes_in_children(new_key("exact"), &q, 0, 8, 5), 7);
	/* tokens_per_day 1000, 100 reserved by each: allowed while less than 1000 is held,
	 * so exactly 10. */
	CU_ASSERT_EQUAL(takes_in_children(new_key("exacttok"), &t, 100, 8, 5), 10);
}

/* Checks, refunds and ledger rows (settling holds) of one key from several processes at
 * once: no call fails (no deadlock between a check, a refund and the writer), and the
 * counts add up. */
static void test_mixed_processes(void)
{
	const char *key = new_key("mixed");
	struct usage_quota q = { .requests_per_day = 1000000, .tokens_per_day = 1000000000 };
	struct store_db *db;
	struct usage_store *st;
	struct usage_quota_state s;
	int go[2], bad = 0;
	pid_t pids[6];

	CU_ASSERT_FATAL(pipe(go) == 0);
	for (int i = 0; i < 6; i++) {
		pids[i] = fork();
		CU_ASSERT_FATAL(pids[i] >= 0);
		if (pids[i] == 0) {
			struct buf err = BUF_INIT;
			struct store_db *cdb = store_open(worker_url, NULL, &err);
			struct usage_options o = { .store = cdb };
			struct usage_store *cst = usage_store_open("/nonexistent", &o);
			int fails = 0;
			char b;

			close(go[1]);
			if (read(go[0], &b, 1) < 0)
				_exit(255);
			for (int k = 0; k < 30; k++) {
				struct usage_claim c = { .tokens = 10, .ttl_ms = 600000 };
				struct usage_verdict v;
				struct usage_record r = { .key_id = key,
							  .provider = "p",
							  .status = 200,
							  .prompt_tokens = 1,
							  .completion_tokens = 1,
							  .start = USAGE_START_COLD };

				if (usage_quota_claim(cst, key, &q, 0, &c, &v) || !v.allowed) {
					fails++;
					continue;
				}
				r.hold_id = c.hold_id;
				if (k % 2 ? usage_quota_refund(cst, key, &c)
					  : usage_record_add(cst, &r))
					fails++;
			}
			fails += (int)usage_failures(cst);
			usage_store_free(cst);
			store_free(cdb);
			_exit(fails);
		}
	}
	close(go[0]);
	usleep(300000);
	close(go[1]);
	for (int i = 0; i < 6; i++) {
		int status;

		CU_ASSERT_FATAL(waitpid(pids[i], &status, 0) == pids[i]);
		if (!WIFEXITED(status) || WEXITSTATUS(status))
			bad++;
	}
	CU_ASSERT_EQUAL(bad, 0);
	/* 6 x 30 counted, half given back; 6 x 15 rows of 2 tokens; no hold left. */
	db = db_open();
	st = pg_store(db, 0);
	CU_ASSERT_EQUAL(usage_quota_state(st, key, 0, &s), 0);
	CU_ASSERT_EQUAL(s.requests_today, 90);
	CU_ASSERT_EQUAL(s.tokens_today, 180);
	CU_ASSERT_EQUAL(s.tokens_reserved, 0);
	usage_store_free(st);
	store_free(db);
}

/* The worker processes of one host (one host name) write refusals of one key and minute
 * at once: each is counted once, whichever rows hold them. */
static void test_refusals_processes(void)
{
	const char *key = new_key("refusals");
	int64_t t = today_ms() + 7 * MINUTE_MS;
	struct usage_filter f = { .key_id = key };
	struct usage_day *days = NULL;
	struct store_db *db;
	struct usage_store *st;
	int go[2], bad = 0;
	pid_t pids[4];
	size_t n = 0;

	CU_ASSERT_FATAL(pipe(go) == 0);
	for (int i = 0; i < 4; i++) {
		pids[i] = fork();
		CU_ASSERT_FATAL(pids[i] >= 0);
		if (pids[i] == 0) {
			struct buf err = BUF_INIT;
			struct store_db *cdb = store_open(worker_url, NULL, &err);
			struct usage_options o = { .store = cdb, .host = "one-host" };
			struct usage_store *cst = usage_store_open("/nonexistent", &o);
			int fails = 0;
			char b;

			close(go[1]);
			if (read(go[0], &b, 1) < 0)
				_exit(255);
			for (int k = 0; k < 25; k++) {
				struct usage_record r = { .ts_ms = t + k,
							  .key_id = key,
							  .status = 429 };

				fails += usage_record_add(cst, &r) != 0;
				if (k % 5 == 0)
					usleep(2000); /* several batches each */
			}
			usage_store_free(cst);
			store_free(cdb);
			_exit(fails);
		}
	}
	close(go[0]);
	usleep(300000);
	close(go[1]);
	for (int i = 0; i < 4; i++) {
		int status;

		CU_ASSERT_FATAL(waitpid(pids[i], &status, 0) == pids[i]);
		if (!WIFEXITED(status) || WEXITSTATUS(status))
			bad++;
	}
	CU_ASSERT_EQUAL(bad, 0);
	db = db_open();
	st = pg_store(db, 0);
	CU_ASSERT_EQUAL(usage_days(st, &f, &days, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 1);
	CU_ASSERT_EQUAL(days[0].requests, 100);
	CU_ASSERT_EQUAL(days[0].errors, 100);
	free(days);
	usage_store_free(st);
	store_free(db);
}

/* ---- leases ----------------------------------------------------------------------------- */

static struct usage_leases *leases(struct store_db *db, unsigned ttl_ms, const char *host)
{
	struct usage_lease_options o = { .store = db, .ttl_ms = ttl_ms, .host = host };
	struct usage_leases *ls = usage_leases_open(&o);

	CU_ASSERT_PTR_NOT_NULL_FATAL(ls);
	return ls;
}

static void test_leases_two_hosts(void)
{
	struct store_db *a = db_open(), *b = db_open();
	struct usage_leases *la = leases(a, 0, "ha"), *lb = leases(b, 0, "hb");
	const char *key = new_key("lease");
	struct usage_lease x = USAGE_LEASE_INIT, y = USAGE_LEASE_INIT, z = USAGE_LEASE_INIT;

	CU_ASSERT_EQUAL(usage_lease_take(la, key, 1, &x), 0);
	CU_ASSERT(x.held);
	CU_ASSERT_EQUAL(usage_lease_take(lb, key, 1, &y), -EBUSY);
	CU_ASSERT_FALSE(y.held);
	CU_ASSERT_EQUAL(usage_lease_take(la, key, 1, &y), -EBUSY);
	/* max 2: one more, on the other host, slot 1. */
	CU_ASSERT_EQUAL(usage_lease_take(lb, key, 2, &y), 0);
	CU_ASSERT_EQUAL(y.slot, 1);
	CU_ASSERT_EQUAL(usage_lease_take(la, key, 2, &z), -EBUSY);
	usage_lease_release(la, &x);
	CU_ASSERT_FALSE(x.held);
	CU_ASSERT_EQUAL(usage_lease_take(lb, key, 2, &z), 0);
	CU_ASSERT_EQUAL(z.slot, 0);
	usage_lease_release(lb, &y);
	usage_lease_release(lb, &z);
	CU_ASSERT_EQUAL(usage_lease_take(la, key, 1, &x), 0);
	usage_lease_release(la, &x);
	CU_ASSERT_EQUAL(usage_lease_take(la, key, 0, &x), -EINVAL);
	usage_leases_free(la);
	usage_leases_free(lb);
	store_free(a);
	store_free(b);
}

/* A holder killed: its lease is taken over once its ttl has run out since its last
 * renewal; a live holder's renewals keep it. */
static void test_lease_reclaim(void)
{
	const unsigned ttl = 1500;
	struct store_db *db = db_open();
	struct usage_leases *ls = leases(db, ttl, "hp");
	const char *key = new_key("reclaim");
	struct usage_lease l = USAGE_LEASE_INIT;
	uint64_t t0;
	int ready[2], rc;
	pid_t pid;
	char b;

	CU_ASSERT_FATAL(pipe(ready) == 0);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		struct buf err = BUF_INIT;
		struct store_db *cdb = store_open(worker_url, NULL, &err);
		struct usage_lease_options o = { .store = cdb, .ttl_ms = ttl, .host = "hc" };
		struct usage_leases *cls = usage_leases_open(&o);
		struct usage_lease cl = USAGE_LEASE_INIT;

		if (usage_lease_take(cls, key, 1, &cl))
			_exit(1);
		if (write(ready[1], "x", 1) != 1)
			_exit(1);
		for (;;)
			pause();
	}
	close(ready[1]);
	CU_ASSERT_FATAL(read(ready[0], &b, 1) == 1);
	close(ready[0]);
	/* Alive for 3 ttl: renewed, never taken over. */
	t0 = mono_ms();
	while (mono_ms() - t0 < 3 * (uint64_t)ttl) {
		CU_ASSERT_EQUAL(usage_lease_take(ls, key, 1, &l), -EBUSY);
		usleep(200000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	t0 = mono_ms();
	while ((rc = usage_lease_take(ls, key, 1, &l)) == -EBUSY && mono_ms() - t0 < 15000)
		usleep(100000);
	CU_ASSERT_EQUAL(rc, 0);
	/* Within the ttl (the last renewal was at most ttl / 3 before the kill), with room for
	 * a loaded machine's polling: far under the 15 s default either way. */
	CU_ASSERT(mono_ms() - t0 <= 2 * (uint64_t)ttl);
	usage_lease_release(ls, &l);
	usage_leases_free(ls);
	store_free(db);
}

/* The embedded backend: slot files under runtime_dir. */
static void test_leases_embedded(void)
{
	char dir[256];
	struct usage_lease_options o = { .runtime_dir = dir };
	struct usage_leases *ls;
	struct usage_lease x = USAGE_LEASE_INIT, y = USAGE_LEASE_INIT;
	struct stat sb;

	snprintf(dir, sizeof(dir), "%s/run%u", tmproot, ++seq);
	CU_ASSERT_FATAL(mkdir(dir, 0700) == 0);
	ls = usage_leases_open(&o);
	CU_ASSERT_PTR_NOT_NULL_FATAL(ls);
	snprintf(dir + strlen(dir), sizeof(dir) - strlen(dir), "/keyslots");
	CU_ASSERT_FATAL(stat(dir, &sb) == 0);
	CU_ASSERT_EQUAL(sb.st_mode & 0777, 0700);
	CU_ASSERT_EQUAL(usage_lease_take(ls, "k/../x", 1, &x), 0);
	CU_ASSERT_EQUAL(usage_lease_take(ls, "k/../x", 1, &y), -EBUSY);
	usage_lease_release(ls, &x);
	CU_ASSERT_EQUAL(usage_lease_take(ls, "k/../x", 1, &y), 0);
	usage_lease_release(ls, &y);
	usage_leases_free(ls);
}

/* ---- the database away ------------------------------------------------------------------ */

static void test_db_away(void)
{
	struct store_db *db = db_open();
	struct usage_store *st = pg_store(db, 5);
	struct usage_leases *ls = leases(db, 0, "haway");
	const char *key = new_key("away");
	struct usage_quota q = { .requests_per_day = 100 };
	struct usage_health h;
	struct usage_verdict v;
	struct usage_lease l = USAGE_LEASE_INIT;
	struct usage_row *rows = NULL;
	uint64_t t0;
	int err;

	CU_ASSERT_EQUAL(usage_quota_take(st, key, &q, 0, &v), 0);
	CU_ASSERT(v.allowed);
	pg_ctl_run("stop");
	/* 8 rows into a queue of 5: 5 kept, 3 dropped and counted. */
	for (int i = 0; i < 8; i++)
		add_row(st, now_ms() + i, key, "p", "m", 200, 1, 1, USAGE_START_COLD);
	err = usage_quota_take(st, key, &q, 0, &v);
	CU_ASSERT(err < 0);
	CU_ASSERT_FALSE(v.allowed);
	CU_ASSERT_PTR_NULL(v.limit);
	err = usage_lease_take(ls, key, 1, &l);
	CU_ASSERT(err == -ECONNREFUSED || err == -ETIMEDOUT);
	CU_ASSERT_FALSE(l.held);
	usage_health(st, &h);
	CU_ASSERT_FALSE(h.ok);
	CU_ASSERT(h.failing_since_ms > 0);
	CU_ASSERT(h.last_err < 0);
	CU_ASSERT(h.failures > 0);
	CU_ASSERT_FALSE(usage_available(st));
	CU_ASSERT_EQUAL(usage_dropped(st), 3);
	/* Freeing a store whose rows cannot be written waits flush_ms, not more. */
	{
		struct usage_options o = { .store = db, .flush_ms = 300 };
		struct usage_store *st2 = usage_store_open("/nonexistent", &o);

		CU_ASSERT_PTR_NOT_NULL_FATAL(st2);
		add_row(st2, now_ms(), key, "p", "m", 200, 1, 1, USAGE_START_COLD);
		t0 = mono_ms();
		usage_store_free(st2);
		CU_ASSERT(mono_ms() - t0 < 2000);
	}
	pg_ctl_run("start");
	/* Back within 10 s, without a new store. */
	t0 = mono_ms();
	do {
		usleep(100000);
		err = usage_quota_take(st, key, &q, 0, &v);
	} while (err && mono_ms() - t0 < 10000);
	CU_ASSERT_EQUAL(err, 0);
	CU_ASSERT(v.allowed);
	CU_ASSERT_EQUAL(recent_wait(st, key, 5, 10000 - (unsigned)(mono_ms() - t0), &rows), 5);
	free(rows);
	CU_ASSERT(mono_ms() - t0 < 10000);
	CU_ASSERT_EQUAL(usage_lease_take(ls, key, 1, &l), 0);
	usage_lease_release(ls, &l);
	usage_health(st, &h);
	CU_ASSERT(h.ok);
	CU_ASSERT_EQUAL(h.failing_since_ms, 0);
	CU_ASSERT(usage_available(st));
	usage_leases_free(ls);
	usage_store_free(st);
	store_free(db);
}

/* ---- import, injection ------------------------------------------------------------------ */

static void test_import(void)
{
	char home[256];
	struct usage_store *src, *st;
	struct store_db *db = db_open();
	struct usage_import_report rep;
	struct buf err = BUF_INIT;
	const char *key = new_key("imp");
	struct usage_quota q = { .requests_per_day = 10 };
	struct usage_verdict v;
	struct usage_quota_state s;
	struct usage_day *days = NULL;
	struct usage_filter f = { .key_id = key };
	size_t n = 0;

	snprintf(home, sizeof(home), "%s/h%u", tmproot, ++seq);
	CU_ASSERT_FATAL(mkdir(home, 0700) == 0);
	src = usage_store_open(home, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(src);
	for (int i = 0; i < 1500; i++)
		add_row(src, now_ms() - i, key, "p", "m", 200, 2, 3, USAGE_START_COLD);
	add_row(src, now_ms(), key, NULL, NULL, 429, 0, 0, USAGE_START_NONE);
	add_row(src, now_ms(), key, NULL, NULL, 429, 0, 0, USAGE_START_NONE);
	{
		/* A row with its account (SQLite v3): copied with it. */
		struct usage_record r = { .ts_ms = now_ms(),
					  .key_id = key,
					  .provider = "p",
					  .model = "m",
					  .account = "carol",
					  .status = 200,
					  .start = USAGE_START_COLD };

		CU_ASSERT_EQUAL(usage_record_add(src, &r), 0);
	}
	CU_ASSERT_EQUAL(usage_quota_take(src, key, &q, 0, &v), 0);
	CU_ASSERT_EQUAL(usage_quota_take(src, key, &q, 0, &v), 0);
	CU_ASSERT_EQUAL(usage_pg_import(src, db, "old-host", &rep, &err), 0);
	CU_ASSERT_EQUAL(rep.rows_read, 1502);
	CU_ASSERT_EQUAL(rep.rows_copied, 1502);
	CU_ASSERT(rep.windows_read >= 2);
	CU_ASSERT_EQUAL(rep.windows_copied, rep.windows_read);
	/* Again: nothing twice. */
	CU_ASSERT_EQUAL(usage_pg_import(src, db, "old-host", &rep, &err), 0);
	CU_ASSERT_EQUAL(rep.rows_read, 1502);
	CU_ASSERT_EQUAL(rep.rows_copied, 0);
	CU_ASSERT_EQUAL(rep.windows_copied, 0);
	st = pg_store(db, 0);
	CU_ASSERT_EQUAL(usage_days(st, &f, &days, &n), 0);
	CU_ASSERT_FATAL(n >= 1);
	{
		int64_t req = 0, pt = 0, carol = 0;

		for (size_t i = 0; i < n; i++) {
			req += days[i].requests, pt += days[i].prompt_tokens;
			if (!strcmp(days[i].account, "carol"))
				carol += days[i].requests;
		}
		CU_ASSERT_EQUAL(req, 1503);
		CU_ASSERT_EQUAL(carol, 1);
		CU_ASSERT_EQUAL(pt, 3000);
	}
	free(days);
	CU_ASSERT_EQUAL(usage_quota_state(st, key, 0, &s), 0);
	CU_ASSERT_EQUAL(s.requests_today, 2);
	/* A store that is not SQLite is no source. */
	CU_ASSERT_EQUAL(usage_pg_import(st, db, NULL, &rep, &err), -EINVAL);
	usage_store_free(st);
	usage_store_free(src);
	buf_release(&err);
	store_free(db);
}

static void test_injection(void)
{
	static const char *const evil[] = {
		"k'; DROP TABLE olp_requests; --",
		"k\"); DELETE FROM olp_quota_windows; --",
		"k\\' OR '1'='1",
		"$1::text; SELECT pg_sleep(5)",
	};
	struct store_db *db = db_open();
	struct usage_store *st = pg_store(db, 0);
	struct usage_leases *ls = leases(db, 0, "hinj");
	struct usage_quota q = { .requests_per_day = 1 };

	for (size_t i = 0; i < ARRAY_SIZE(evil); i++) {
		struct usage_verdict v;
		struct usage_row *rows = NULL;
		struct usage_lease l = USAGE_LEASE_INIT;
		char key[64];

		snprintf(key, sizeof(key), "%s%u", evil[i], ++seq);
		add_row(st, now_ms(), key, evil[i], evil[i], 200, 1, 1, USAGE_START_COLD);
		CU_ASSERT_EQUAL_FATAL(recent_wait(st, key, 1, 5000, &rows), 1);
		CU_ASSERT_PTR_NOT_NULL_FATAL(rows);
		CU_ASSERT_STRING_EQUAL(rows[0].key_id, key);
		CU_ASSERT_STRING_EQUAL(rows[0].provider, evil[i]);
		CU_ASSERT_STRING_EQUAL(rows[0].model, evil[i]);
		free(rows);
		CU_ASSERT_EQUAL(usage_quota_take(st, key, &q, 0, &v), 0);
		CU_ASSERT(v.allowed);
		CU_ASSERT_EQUAL(usage_quota_take(st, key, &q, 0, &v), 0);
		CU_ASSERT_FALSE(v.allowed);
		CU_ASSERT_EQUAL(usage_lease_take(ls, key, 1, &l), 0);
		usage_lease_release(ls, &l);
	}
	/* Invalid UTF-8 in a model name: stored (the bytes replaced), the batch not lost. */
	{
		const char *key = new_key("utf8");
		struct usage_row *rows = NULL;

		add_row(st, now_ms(), key, "p", "m\xff\xfe", 200, 1, 1, USAGE_START_COLD);
		CU_ASSERT_EQUAL(recent_wait(st, key, 1, 5000, &rows), 1);
		free(rows);
	}
	CU_ASSERT_EQUAL(usage_dropped(st), 0);
	usage_leases_free(ls);
	usage_store_free(st);
	store_free(db);
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "schema 1 -> 2 (accounts)", test_upgrade },
		{ "schema", test_schema },
		{ "record and read", test_record_read },
		{ "?account= filter", test_account_filter },
		{ "free flushes, two hosts", test_free_flushes_two_hosts },
		{ "quota minute and day", test_quota_minute_day },
		{ "quota tokens", test_quota_tokens },
		{ "exact across processes", test_exact_processes },
		{ "checks, refunds, rows at once", test_mixed_processes },
		{ "refusals of one host's processes", test_refusals_processes },
		{ "leases across hosts", test_leases_two_hosts },
		{ "lease reclaimed", test_lease_reclaim },
		{ "leases embedded", test_leases_embedded },
		{ "import", test_import },
		{ "injection", test_injection },
		{ "database away", test_db_away },
		{ NULL, NULL },
	};
	struct store_schema v1 = *usage_pg_schema();
	const struct store_schema *v[1] = { &v1 };
	struct buf err = BUF_INIT;
	struct store_db *admin;
	char cmd[128];
	int fails;

	worker_url = getenv("OLP_TEST_PG_URL");
	admin_url = getenv("OLP_TEST_PG_ADMIN_URL");
	pg_ctl = getenv("OLP_TEST_PG_CTL");
	if (!worker_url || !admin_url || !pg_ctl) {
		fprintf(stderr, "test_usage_pg: run under tests/pg/with-pg.sh (no PostgreSQL)\n");
		return 77;
	}
	if (!mkdtemp(tmproot))
		return 1;
	/* Version 1 only: test_upgrade (the first test) takes it to the current one. A kept
	 * cluster already past it refuses version 1: made current then. */
	v1.n = 1;
	admin = store_open(admin_url, NULL, &err);
	if (admin && store_schema_apply(admin, v, 1, "olp_worker", &err) == 0) {
		at_v1 = true;
	} else if (admin) {
		buf_reset(&err);
		v[0] = usage_pg_schema();
		if (store_schema_apply(admin, v, 1, "olp_worker", &err)) {
			store_free(admin);
			admin = NULL;
		}
	}
	if (!admin) {
		fprintf(stderr, "test_usage_pg: the schema: %s\n", err.data);
		return 1;
	}
	store_free(admin);
	buf_release(&err);
	fails = ts_cunit_run("usage_pg", tests);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmproot);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmproot);
	return ts_exit_status(fails);
}
