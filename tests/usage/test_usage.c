/* CUnit suite for usage/: the ledger (append, read back, per-day sums, retention), the
 * quota windows at fixed times (minute and day boundaries, retry_after, tokens_per_day),
 * quotas held across processes and threads, file modes, descriptors, the failure policy
 * (an unavailable database lets requests through, counts, and recovers) and the schema
 * (no column for content), and the ledger as JSON (/v1/usage's answer, olp-keys usage's
 * rows; read back with jansson). Through usage.h; SQLite directly only to read the schema. */
#include "tests/support/cunit.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <sqlite3.h>

#include "common/common.h"
#include "usage/usage.h"
#include "common/banned.h"

#define MINUTE_MS 60000LL
#define DAY_MS 86400000LL

static char tmproot[] = "/tmp/olp-usage-test-XXXXXX";
static unsigned home_seq;

/* A fresh, empty OLP_HOME (0700) for one test; the path is static until the next call. */
static const char *new_home(void)
{
	static char home[256];

	snprintf(home, sizeof(home), "%s/h%u", tmproot, ++home_seq);
	CU_ASSERT_FATAL(mkdir(home, 0700) == 0);
	return home;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The start of today (UTC): the quota tests use fixed times in today and tomorrow, so that
 * the store's pruning (by the wall clock) keeps their windows. */
static int64_t today_ms(void)
{
	return now_ms() / DAY_MS * DAY_MS;
}

static const struct usage_options fast = { .reopen_ms = 50 };

static struct usage_store *open_store(const char *home)
{
	struct usage_store *st = usage_store_open(home, &fast);

	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	return st;
}

static void add(struct usage_store *st, int64_t ts, const char *key, const char *provider,
		int status, int64_t p, int64_t c, enum usage_start start)
{
	struct usage_record r = {
		.ts_ms = ts,
		.key_id = key,
		.provider = provider,
		.model = provider ? "m1" : NULL,
		.status = status,
		.prompt_tokens = p,
		.completion_tokens = c,
		.cached_tokens = p / 2,
		.duration_ms = 100,
		.ttfb_ms = 10,
		.start = start,
	};

	CU_ASSERT_EQUAL(usage_record_add(st, &r), 0);
}

/* ---- the ledger ----------------------------------------------------------------------- */

static void test_append_read(void)
{
	const char *home = new_home();
	struct usage_store *st = open_store(home);
	struct usage_filter f = { 0 };
	struct usage_row *rows;
	int64_t t = now_ms() - 10000;
	size_t n;

	CU_ASSERT(usage_available(st));
	add(st, t, "k1", "claude", 200, 10, 20, USAGE_START_COLD);
	add(st, t + 1, "k2", "codex", 500, 0, 0, USAGE_START_WARM);
	add(st, t + 2, "k1", NULL, 499, 0, 0, USAGE_START_COLD);
	CU_ASSERT_EQUAL_FATAL(usage_recent(st, &f, 10, &rows, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 3);
	/* Newest first, every field back as written. */
	CU_ASSERT_EQUAL(rows[0].ts_ms, t + 2);
	CU_ASSERT_STRING_EQUAL(rows[0].key_id, "k1");
	CU_ASSERT_STRING_EQUAL(rows[0].provider, "");
	CU_ASSERT_STRING_EQUAL(rows[0].model, "");
	CU_ASSERT_EQUAL(rows[0].status, 499);
	CU_ASSERT_EQUAL(rows[0].start, USAGE_START_COLD);
	CU_ASSERT_EQUAL(rows[0].count, 1);
	CU_ASSERT_STRING_EQUAL(rows[1].key_id, "k2");
	CU_ASSERT_EQUAL(rows[1].start, USAGE_START_WARM);
	CU_ASSERT_EQUAL(rows[2].ts_ms, t);
	CU_ASSERT_STRING_EQUAL(rows[2].provider, "claude");
	CU_ASSERT_STRING_EQUAL(rows[2].model, "m1");
	CU_ASSERT_EQUAL(rows[2].prompt_tokens, 10);
	CU_ASSERT_EQUAL(rows[2].completion_tokens, 20);
	CU_ASSERT_EQUAL(rows[2].cached_tokens, 5);
	CU_ASSERT_EQUAL(rows[2].duration_ms, 100);
	CU_ASSERT_EQUAL(rows[2].ttfb_ms, 10);
	CU_ASSERT_EQUAL(rows[2].start, USAGE_START_COLD);
	free(rows);
	/* A key filter, a limit, a since. */
	f.key_id = "k1";
	CU_ASSERT_EQUAL(usage_recent(st, &f, 1, &rows, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 1);
	CU_ASSERT_EQUAL(rows[0].ts_ms, t + 2);
	free(rows);
	f.key_id = NULL;
	f.since_ms = t + 1;
	CU_ASSERT_EQUAL(usage_recent(st, &f, 10, &rows, &n), 0);
	CU_ASSERT_EQUAL(n, 2);
	free(rows);
	f.key_id = "nobody";
	f.since_ms = 0;
	CU_ASSERT_EQUAL(usage_recent(st, &f, 10, &rows, &n), 0);
	CU_ASSERT_EQUAL(n, 0);
	CU_ASSERT_PTR_NULL(rows);
	CU_ASSERT_EQUAL(usage_failures(st), 0);
	usage_store_free(st);
	/* Another store on the same file (another worker, later) sees the rows. */
	st = open_store(home);
	CU_ASSERT_EQUAL(usage_recent(st, NULL, 10, &rows, &n), 0);
	CU_ASSERT_EQUAL(n, 3);
	free(rows);
	usage_store_free(st);
}

/* Issue 22 item 4: refusals (no provider started, no token) are counted, not written a row
 * each: one row per key, status, provider and model a UTC minute, whose count the days'
 * sums still count one by one. A client looping on a 429 adds a row a minute. */
static void test_refusals(void)
{
	struct usage_store *st = open_store(new_home());
	int64_t m = today_ms() + 7 * MINUTE_MS; /* a minute boundary */
	struct usage_filter f = { .key_id = "k" };
	struct usage_day *days;
	struct usage_row *rows;
	size_t n;

	for (int i = 0; i < 300; i++) /* 600 ms apart: 100 in each of 3 minutes */
		add(st, m + (int64_t)i * 600, "k", NULL, 429, 0, 0, USAGE_START_NONE);
	add(st, m + 5, "k", NULL, 400, 0, 0, USAGE_START_NONE);
	/* A provider's own max_concurrent: its provider and model, no run. */
	add(st, m + 6, "k", "claude", 429, 0, 0, USAGE_START_NONE);
	add(st, m + 7, "k", "claude", 429, 0, 0, USAGE_START_NONE);
	/* Served, or a run that failed: a row each, as before. */
	add(st, m + 8, "k", "claude", 200, 3, 4, USAGE_START_COLD);
	add(st, m + 9, "k", "claude", 502, 0, 0, USAGE_START_COLD);
	add(st, m + 10, "other", NULL, 429, 0, 0, USAGE_START_NONE);
	CU_ASSERT_EQUAL_FATAL(usage_recent(st, &f, 1000, &rows, &n), 0);
	/* 3 minutes of 429s, the 400, claude's 429s, the 200, the 502. */
	CU_ASSERT_EQUAL_FATAL(n, 7);
	for (size_t i = 0; i < n; i++) {
		if (rows[i].status == 429 && !*rows[i].provider) {
			CU_ASSERT_EQUAL(rows[i].count, 100);
			CU_ASSERT_EQUAL(rows[i].ts_ms % MINUTE_MS, 0);
			CU_ASSERT_EQUAL(rows[i].duration_ms, UINT64_C(10000));
			CU_ASSERT_EQUAL(rows[i].ttfb_ms, 0);
		} else if (rows[i].status == 429) {
			CU_ASSERT_EQUAL(rows[i].count, 2);
			CU_ASSERT_STRING_EQUAL(rows[i].model, "m1");
		} else {
			CU_ASSERT_EQUAL(rows[i].count, 1);
		}
	}
	free(rows);
	CU_ASSERT_EQUAL_FATAL(usage_days(st, &f, &days, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 2);
	CU_ASSERT_STRING_EQUAL(days[0].provider, "");
	CU_ASSERT_EQUAL(days[0].requests, 301);
	CU_ASSERT_EQUAL(days[0].errors, 301);
	CU_ASSERT_STRING_EQUAL(days[1].provider, "claude");
	CU_ASSERT_EQUAL(days[1].requests, 4);
	CU_ASSERT_EQUAL(days[1].errors, 3);
	CU_ASSERT_EQUAL(days[1].prompt_tokens, 3);
	free(days);
	CU_ASSERT_EQUAL(usage_failures(st), 0);
	usage_store_free(st);
}

static void test_days(void)
{
	struct usage_store *st = open_store(new_home());
	int64_t d0 = today_ms() - DAY_MS, d1 = today_ms();
	struct usage_filter f = { 0 };
	struct usage_day *days;
	char day0[11], day1[11];
	time_t t;
	struct tm tm;
	size_t n;

	t = (time_t)(d0 / 1000);
	gmtime_r(&t, &tm);
	(void)strftime(day0, sizeof(day0), "%Y-%m-%d", &tm);
	t = (time_t)(d1 / 1000);
	gmtime_r(&t, &tm);
	(void)strftime(day1, sizeof(day1), "%Y-%m-%d", &tm);

	/* The last millisecond of yesterday and the first of today fall on either side. */
	add(st, d1 - 1, "k1", "claude", 200, 10, 1, USAGE_START_COLD);
	add(st, d1, "k1", "claude", 200, 20, 2, USAGE_START_WARM);
	add(st, d1 + 5, "k1", "claude", 502, 40, 4, USAGE_START_PRESTART);
	add(st, d1 + 6, "k1", "codex", 200, 80, 8, USAGE_START_COLD);
	add(st, d1 + 7, "k2", "claude", 200, 1, 1, USAGE_START_PRESTART);
	add(st, d1 + 8, "k2", NULL, 429, 0, 0, USAGE_START_NONE);
	CU_ASSERT_EQUAL_FATAL(usage_days(st, &f, &days, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 5);
	/* Ordered by day, key, provider; "" for rows without a provider. */
	CU_ASSERT_STRING_EQUAL(days[0].day, day0);
	CU_ASSERT_STRING_EQUAL(days[0].key_id, "k1");
	CU_ASSERT_EQUAL(days[0].requests, 1);
	CU_ASSERT_EQUAL(days[0].prompt_tokens, 10);
	CU_ASSERT_STRING_EQUAL(days[1].day, day1);
	CU_ASSERT_STRING_EQUAL(days[1].key_id, "k1");
	CU_ASSERT_STRING_EQUAL(days[1].provider, "claude");
	CU_ASSERT_EQUAL(days[1].requests, 2);
	CU_ASSERT_EQUAL(days[1].errors, 1);
	CU_ASSERT_EQUAL(days[1].prompt_tokens, 60);
	CU_ASSERT_EQUAL(days[1].completion_tokens, 6);
	CU_ASSERT_EQUAL(days[1].cached_tokens, 10 + 20);
	CU_ASSERT_EQUAL(days[1].duration_ms, 200);
	CU_ASSERT_EQUAL(days[1].warm, 1);
	CU_ASSERT_EQUAL(days[1].prestart, 1);
	CU_ASSERT_STRING_EQUAL(days[2].provider, "codex");
	CU_ASSERT_EQUAL(days[2].prompt_tokens, 80);
	CU_ASSERT_STRING_EQUAL(days[3].key_id, "k2");
	CU_ASSERT_STRING_EQUAL(days[3].provider, "");
	CU_ASSERT_EQUAL(days[3].errors, 1);
	CU_ASSERT_STRING_EQUAL(days[4].provider, "claude");
	CU_ASSERT_EQUAL(days[4].prestart, 1);
	free(days);
	f.key_id = "k2";
	CU_ASSERT_EQUAL(usage_days(st, &f, &days, &n), 0);
	CU_ASSERT_EQUAL(n, 2);
	free(days);
	f.key_id = NULL;
	f.since_ms = d1;
	CU_ASSERT_EQUAL(usage_days(st, &f, &days, &n), 0);
	CU_ASSERT_EQUAL(n, 4);
	free(days);
	/* NULL filter: everything. */
	CU_ASSERT_EQUAL(usage_days(st, NULL, &days, &n), 0);
	CU_ASSERT_EQUAL(n, 5);
	free(days);
	usage_store_free(st);
}

/* Counts that code in a sandbox could have forged (a usage line with 2^62 tokens) are
 * stored at most USAGE_ROW_TOKENS_MAX: the day's sums cannot overflow, so reading the
 * ledger never fails for them (SQLite's sum() stops with "integer overflow", and the
 * store closed on that error and failed its quotas open). */
static void test_huge_counts(void)
{
	struct usage_store *st = open_store(new_home());
	const int64_t huge = INT64_MAX / 2 + 1;
	struct usage_quota_state qs;
	struct usage_day *days;
	struct usage_row *rows;
	size_t n;

	for (int i = 0; i < 4; i++)
		add(st, today_ms() + i, "k1", "claude", 200, huge, huge, USAGE_START_COLD);
	CU_ASSERT_EQUAL_FATAL(usage_days(st, NULL, &days, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 1);
	CU_ASSERT_EQUAL(days[0].prompt_tokens, 4 * USAGE_ROW_TOKENS_MAX);
	CU_ASSERT_EQUAL(days[0].completion_tokens, 4 * USAGE_ROW_TOKENS_MAX);
	CU_ASSERT_EQUAL(days[0].cached_tokens, 4 * USAGE_ROW_TOKENS_MAX);
	free(days);
	CU_ASSERT_EQUAL(usage_recent(st, NULL, 10, &rows, &n), 0);
	CU_ASSERT_EQUAL(n, 4);
	if (n)
		CU_ASSERT_EQUAL(rows[0].prompt_tokens, USAGE_ROW_TOKENS_MAX);
	free(rows);
	CU_ASSERT_EQUAL(usage_quota_state(st, "k1", 0, &qs), 0);
	CU_ASSERT_EQUAL(qs.tokens_today, 8 * USAGE_ROW_TOKENS_MAX);
	CU_ASSERT(usage_available(st));
	CU_ASSERT_EQUAL(usage_failures(st), 0);
	usage_store_free(st);
}

/* A read that fails (here: rows above the cap, written by an older build or by hand, whose
 * sum overflows) fails alone: the readers have a connection of their own, so the writer
 * stays open, and the next quota check and ledger row go through at once. (It used to
 * close the one connection for reopen_ms, and every quota failed open meanwhile.) */
static void test_read_failure_spares_writer(void)
{
	static const struct usage_options slow = { .reopen_ms = 60000 };
	const char *home = new_home();
	struct usage_store *st = usage_store_open(home, &slow);
	struct usage_quota q = { .requests_per_day = 5 };
	struct usage_verdict v;
	struct usage_day *days;
	char path[512];
	sqlite3 *db;
	size_t n;

	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	add(st, today_ms(), "k1", "claude", 200, 1, 1, USAGE_START_COLD);
	snprintf(path, sizeof(path), "%s/usage.db", home);
	CU_ASSERT_FATAL(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK);
	for (int i = 0; i < 2; i++) /* 1, then 2 more rows of 9e18 tokens */
		CU_ASSERT_EQUAL(
			sqlite3_exec(db,
				     "INSERT INTO requests (ts_ms, key_id, provider, model,"
				     " status, prompt_tokens, completion_tokens, cached_tokens,"
				     " duration_ms, ttfb_ms, start) SELECT ts_ms, key_id,"
				     " provider, model, status, 9000000000000000000, 0, 0, 1, 1,"
				     " 1 FROM requests",
				     NULL, NULL, NULL),
			SQLITE_OK);
	sqlite3_close(db);
	add(st, today_ms() + 1, "k1", "claude", 200, 1, 1, USAGE_START_COLD);
	CU_ASSERT(usage_days(st, NULL, &days, &n) < 0); /* integer overflow in sum() */
	CU_ASSERT(usage_failures(st) >= 1);
	CU_ASSERT(usage_available(st));
	CU_ASSERT_EQUAL(usage_quota_take(st, "k1", &q, 0, &v), 0);
	CU_ASSERT(v.allowed);
	add(st, today_ms() + 2, "k1", "claude", 200, 1, 1, USAGE_START_COLD);
	usage_store_free(st);
}

/* Over-long names are cut to what struct usage_row holds, at a UTF-8 boundary. */
static void test_long_names(void)
{
	struct usage_store *st = open_store(new_home());
	struct usage_record r = { .key_id = "k", .status = 200, .prompt_tokens = -5 };
	char model[300];
	struct usage_row *rows;
	size_t n;

	/* 126 ASCII bytes then "é" (2 bytes) straddling the 127-byte cut. */
	memset(model, 'a', 126);
	memcpy(model + 126, "\xc3\xa9zzzz", 7);
	r.model = model;
	CU_ASSERT_EQUAL(usage_record_add(st, &r), 0);
	CU_ASSERT_EQUAL_FATAL(usage_recent(st, NULL, 5, &rows, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 1);
	CU_ASSERT_EQUAL(strlen(rows[0].model), 126);
	CU_ASSERT_EQUAL(rows[0].prompt_tokens, 0);
	CU_ASSERT(rows[0].ts_ms > now_ms() - 60000);
	free(rows);
	usage_store_free(st);
}

/* ---- quotas at fixed times ---------------------------------------------------------------- */

static void test_quota_minute(void)
{
	struct usage_store *st = open_store(new_home());
	struct usage_quota q = { .requests_per_minute = 2 };
	int64_t m = today_ms() + 10 * MINUTE_MS; /* a minute boundary */
	struct usage_quota_state qs;
	struct usage_verdict v;

	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, m, &v), 0);
	CU_ASSERT(v.allowed);
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, m + 30000, &v), 0);
	CU_ASSERT(v.allowed);
	/* At the first millisecond of the minute: the whole minute to wait. */
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, m, &v), 0);
	CU_ASSERT_FALSE(v.allowed);
	CU_ASSERT_STRING_EQUAL(v.limit, "requests_per_minute");
	CU_ASSERT_EQUAL(v.limit_value, 2);
	CU_ASSERT_EQUAL(v.used, 2);
	CU_ASSERT_EQUAL(v.retry_after, 60);
	/* Half a second before its end: rounded up to 1. */
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, m + MINUTE_MS - 500, &v), 0);
	CU_ASSERT_FALSE(v.allowed);
	CU_ASSERT_EQUAL(v.retry_after, 1);
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, m + 20500, &v), 0);
	CU_ASSERT_EQUAL(v.retry_after, 40);
	/* Refusals were not counted. */
	CU_ASSERT_EQUAL(usage_quota_state(st, "k", m + 1, &qs), 0);
	CU_ASSERT_EQUAL(qs.requests_this_minute, 2);
	CU_ASSERT_EQUAL(qs.requests_today, 2);
	/* The next minute starts afresh; another key was never limited by k. */
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, m + MINUTE_MS, &v), 0);
	CU_ASSERT(v.allowed);
	CU_ASSERT_EQUAL(usage_quota_take(st, "other", &q, m, &v), 0);
	CU_ASSERT(v.allowed);
	usage_store_free(st);
}

static void test_quota_day(void)
{
	struct usage_store *st = open_store(new_home());
	struct usage_quota q = { .requests_per_day = 2, .requests_per_minute = 1 };
	int64_t d = today_ms(), end = d + DAY_MS;
	struct usage_quota_state qs;
	struct usage_verdict v;

	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, end - 3 * MINUTE_MS, &v), 0);
	CU_ASSERT(v.allowed);
	/* Same minute: the minute refuses. */
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, end - 3 * MINUTE_MS + 1000, &v), 0);
	CU_ASSERT_FALSE(v.allowed);
	CU_ASSERT_STRING_EQUAL(v.limit, "requests_per_minute");
	CU_ASSERT_EQUAL(v.retry_after, 59);
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, end - 2 * MINUTE_MS, &v), 0);
	CU_ASSERT(v.allowed);
	/* Both the day and the minute are spent: the day is named, its end is the wait. */
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, end - 2 * MINUTE_MS + 100, &v), 0);
	CU_ASSERT_FALSE(v.allowed);
	CU_ASSERT_STRING_EQUAL(v.limit, "requests_per_day");
	CU_ASSERT_EQUAL(v.limit_value, 2);
	CU_ASSERT_EQUAL(v.used, 2);
	CU_ASSERT_EQUAL(v.retry_after, 120);
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, end - 1500, &v), 0);
	CU_ASSERT_FALSE(v.allowed);
	CU_ASSERT_EQUAL(v.retry_after, 2);
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, end - 1, &v), 0);
	CU_ASSERT_FALSE(v.allowed);
	CU_ASSERT_EQUAL(v.retry_after, 1);
	/* Midnight UTC: a new day. */
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, end, &v), 0);
	CU_ASSERT(v.allowed);
	CU_ASSERT_EQUAL(usage_quota_state(st, "k", end, &qs), 0);
	CU_ASSERT_EQUAL(qs.requests_today, 1);
	CU_ASSERT_EQUAL(usage_quota_state(st, "k", end - 1, &qs), 0);
	CU_ASSERT_EQUAL(qs.requests_today, 2);
	usage_store_free(st);
}

static void test_quota_tokens(void)
{
	struct usage_store *st = open_store(new_home());
	struct usage_quota q = { .tokens_per_day = 100 };
	int64_t d = today_ms();
	struct usage_quota_state qs;
	struct usage_verdict v;

	/* Yesterday's tokens do not count today. */
	add(st, d - 1, "k", "claude", 200, 500, 500, USAGE_START_COLD);
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, d + 1000, &v), 0);
	CU_ASSERT(v.allowed);
	add(st, d + 1000, "k", "claude", 200, 50, 10, USAGE_START_COLD);
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, d + 2000, &v), 0);
	CU_ASSERT(v.allowed);
	/* Cached tokens are part of the prompt's: not counted twice. 60 + 39 = 99 < 100. */
	add(st, d + 2000, "k", "claude", 200, 30, 9, USAGE_START_COLD);
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, d + 3000, &v), 0);
	CU_ASSERT(v.allowed);
	add(st, d + 3000, "k", "claude", 200, 1, 0, USAGE_START_COLD);
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, d + 4000, &v), 0);
	CU_ASSERT_FALSE(v.allowed);
	CU_ASSERT_STRING_EQUAL(v.limit, "tokens_per_day");
	CU_ASSERT_EQUAL(v.limit_value, 100);
	CU_ASSERT_EQUAL(v.used, 100);
	CU_ASSERT_EQUAL(v.retry_after, (DAY_MS - 4000) / 1000);
	CU_ASSERT_EQUAL(usage_quota_state(st, "k", d + 5000, &qs), 0);
	CU_ASSERT_EQUAL(qs.tokens_today, 100);
	CU_ASSERT_EQUAL(qs.requests_today, 3);
	/* A key without a quota: tokens counted, nothing touched by the check. */
	add(st, d + 1, "free", "codex", 200, 7, 3, USAGE_START_COLD);
	q = (struct usage_quota){ 0 };
	CU_ASSERT_EQUAL(usage_quota_take(st, "free", &q, d + 2, &v), 0);
	CU_ASSERT(v.allowed);
	CU_ASSERT_EQUAL(usage_quota_state(st, "free", d + 3, &qs), 0);
	CU_ASSERT_EQUAL(qs.tokens_today, 10);
	CU_ASSERT_EQUAL(qs.requests_today, 0);
	usage_store_free(st);
}

/* Issue 22 item 7: a request reserves what it may spend of tokens_per_day when it starts,
 * and its row settles it: requests under way count against the limit. */
static void test_quota_holds(void)
{
	struct usage_store *st = open_store(new_home());
	struct usage_quota q = { .tokens_per_day = 1000 };
	int64_t d = today_ms() + 1000;
	/* Alive until 10 minutes from now: the store prunes expired ones by the wall clock. */
	uint64_t ttl = (uint64_t)(now_ms() - d + 10 * MINUTE_MS);
	struct usage_claim c[4];
	struct usage_quota_state qs;
	struct usage_verdict v;

	for (int i = 0; i < 3; i++) {
		c[i] = (struct usage_claim){ .tokens = 400, .ttl_ms = ttl };
		CU_ASSERT_EQUAL(usage_quota_claim(st, "k", &q, d + i, &c[i], &v), 0);
		CU_ASSERT(v.allowed);
		CU_ASSERT(c[i].hold_id > 0);
		CU_ASSERT(c[i].counted);
	}
	CU_ASSERT(c[1].hold_id != c[0].hold_id && c[2].hold_id != c[1].hold_id);
	/* 1200 reserved: the 4th waits, though nothing is spent yet. */
	c[3] = (struct usage_claim){ .tokens = 400, .ttl_ms = ttl };
	CU_ASSERT_EQUAL(usage_quota_claim(st, "k", &q, d + 10, &c[3], &v), 0);
	CU_ASSERT_FALSE(v.allowed);
	CU_ASSERT_STRING_EQUAL(v.limit, "tokens_per_day");
	CU_ASSERT_EQUAL(v.used, 1200);
	CU_ASSERT_EQUAL(c[3].hold_id, 0);
	CU_ASSERT_FALSE(c[3].counted);
	CU_ASSERT_EQUAL(usage_quota_state(st, "k", d + 10, &qs), 0);
	CU_ASSERT_EQUAL(qs.tokens_reserved, 1200);
	CU_ASSERT_EQUAL(qs.tokens_today, 0);
	CU_ASSERT_EQUAL(qs.requests_today, 3);
	/* Two end having spent 50 each: their reservations become 100 real tokens. */
	for (int i = 0; i < 2; i++) {
		struct usage_record r = { .ts_ms = d + i,
					  .key_id = "k",
					  .status = 200,
					  .prompt_tokens = 30,
					  .completion_tokens = 20,
					  .start = USAGE_START_COLD,
					  .hold_id = c[i].hold_id };

		CU_ASSERT_EQUAL(usage_record_add(st, &r), 0);
	}
	CU_ASSERT_EQUAL(usage_quota_state(st, "k", d + 20, &qs), 0);
	CU_ASSERT_EQUAL(qs.tokens_reserved, 400);
	CU_ASSERT_EQUAL(qs.tokens_today, 100);
	CU_ASSERT_EQUAL(usage_quota_claim(st, "k", &q, d + 20, &c[3], &v), 0);
	CU_ASSERT(v.allowed);
	/* A worker killed mid-run never settles: its reservation lapses after ttl_ms. */
	CU_ASSERT_EQUAL(usage_quota_state(st, "k", d + 20 + (int64_t)ttl, &qs), 0);
	CU_ASSERT_EQUAL(qs.tokens_reserved, 0);
	/* Without tokens_per_day, or with nothing to reserve, no reservation. */
	q = (struct usage_quota){ .requests_per_day = 10 };
	c[0] = (struct usage_claim){ .tokens = 400, .ttl_ms = 60000 };
	CU_ASSERT_EQUAL(usage_quota_claim(st, "k2", &q, d, &c[0], &v), 0);
	CU_ASSERT(v.allowed);
	CU_ASSERT_EQUAL(c[0].hold_id, 0);
	CU_ASSERT(c[0].counted);
	CU_ASSERT_EQUAL(usage_failures(st), 0);
	usage_store_free(st);
}

/* A request that no provider would take (each at its own max_concurrent) is given back: it
 * does not use up one of the key's requests, and its reservation goes. */
static void test_quota_refund(void)
{
	struct usage_store *st = open_store(new_home());
	struct usage_quota q = { .requests_per_day = 2,
				 .requests_per_minute = 5,
				 .tokens_per_day = 1000 };
	int64_t d = today_ms() + 3 * MINUTE_MS;
	struct usage_claim c = { .tokens = 900, .ttl_ms = 60000 };
	struct usage_quota_state qs;
	struct usage_verdict v;

	CU_ASSERT_EQUAL(usage_quota_claim(st, "k", &q, d, &c, &v), 0);
	CU_ASSERT(v.allowed);
	CU_ASSERT_EQUAL(usage_quota_state(st, "k", d, &qs), 0);
	CU_ASSERT_EQUAL(qs.requests_today, 1);
	CU_ASSERT_EQUAL(qs.requests_this_minute, 1);
	CU_ASSERT_EQUAL(qs.tokens_reserved, 900);
	CU_ASSERT_EQUAL(usage_quota_refund(st, "k", &c), 0);
	CU_ASSERT_FALSE(c.counted);
	CU_ASSERT_EQUAL(c.hold_id, 0);
	CU_ASSERT_EQUAL(usage_quota_state(st, "k", d, &qs), 0);
	CU_ASSERT_EQUAL(qs.requests_today, 0);
	CU_ASSERT_EQUAL(qs.requests_this_minute, 0);
	CU_ASSERT_EQUAL(qs.tokens_reserved, 0);
	/* Given back twice is given back once. */
	CU_ASSERT_EQUAL(usage_quota_refund(st, "k", &c), 0);
	CU_ASSERT_EQUAL(usage_quota_state(st, "k", d, &qs), 0);
	CU_ASSERT_EQUAL(qs.requests_today, 0);
	/* So both of the day's requests are still there. */
	for (int i = 0; i < 2; i++) {
		CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, d + 1 + i, &v), 0);
		CU_ASSERT(v.allowed);
	}
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, d + 5, &v), 0);
	CU_ASSERT_FALSE(v.allowed);
	usage_store_free(st);
}

/* ---- across processes and threads ------------------------------------------------------ */

#define N_CHILDREN 6
#define TAKES_EACH 3

/* Six processes, each with its own store on one file, started together: with
 * requests_per_day 3, exactly 3 requests get through in all. */
static void test_quota_processes(void)
{
	const char *home = new_home();
	struct usage_quota q = { .requests_per_day = 3 };
	struct usage_store *st = open_store(home);
	int go[2], allowed = 0, failed = 0;
	pid_t pids[N_CHILDREN];

	usage_store_free(st); /* the schema exists; no connection crosses fork */
	CU_ASSERT_FATAL(pipe(go) == 0);
	for (int i = 0; i < N_CHILDREN; i++) {
		pids[i] = fork();
		CU_ASSERT_FATAL(pids[i] >= 0);
		if (pids[i] == 0) {
			struct usage_store *cst;
			struct usage_verdict v;
			int n = 0;
			char c;

			close(go[1]);
			cst = usage_store_open(home, NULL);
			/* Wait for the parent to let all of them go at once. */
			if (read(go[0], &c, 1) != 0)
				_exit(100);
			for (int k = 0; k < TAKES_EACH; k++) {
				if (usage_quota_take(cst, "guest", &q, 0, &v) != 0)
					_exit(101);
				n += v.allowed;
			}
			usage_store_free(cst);
			_exit(n);
		}
	}
	close(go[0]);
	usleep(100 * 1000);
	close(go[1]);
	for (int i = 0; i < N_CHILDREN; i++) {
		int status;

		CU_ASSERT_FATAL(waitpid(pids[i], &status, 0) == pids[i]);
		CU_ASSERT_FATAL(WIFEXITED(status));
		if (WEXITSTATUS(status) >= 100)
			failed++;
		else
			allowed += WEXITSTATUS(status);
	}
	CU_ASSERT_EQUAL(failed, 0);
	CU_ASSERT_EQUAL(allowed, 3);
}

#define N_OPENERS 16
#define OPEN_ROUNDS 10

/* One opener: its stderr into a file of its own, the store opened when the parent says go,
 * then a quota check and a row. Exits 0 when all worked without a failure counted. */
static void open_together_child(const char *home, int go, const char *logpath)
{
	struct usage_quota q = { .requests_per_day = 1000 };
	struct usage_record r = { .key_id = "k", .status = 200 };
	struct usage_store *cst;
	struct usage_verdict v;
	int fd;
	char c;

	fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || dup2(fd, STDERR_FILENO) < 0)
		_exit(100);
	if (read(go, &c, 1) != 0)
		_exit(101);
	cst = usage_store_open(home, NULL);
	if (!cst || !usage_available(cst))
		_exit(102);
	if (usage_quota_take(cst, "k", &q, 0, &v) != 0 || !v.allowed)
		_exit(103);
	if (usage_record_add(cst, &r) != 0)
		_exit(104);
	if (usage_failures(cst) != 0)
		_exit(105);
	usage_store_free(cst);
	_exit(0);
}

/* Issue 22 item 15: workers that open a fresh usage.db together (the schema, the WAL
 * switch) wait for each other: none fails, none logs "database is locked". */
static void test_open_together(void)
{
	for (int round = 0; round < OPEN_ROUNDS; round++) {
		const char *home = new_home();
		pid_t pids[N_OPENERS];
		char logs[N_OPENERS][512];
		int go[2], failed = 0;

		CU_ASSERT_FATAL(pipe(go) == 0);
		for (int i = 0; i < N_OPENERS; i++) {
			snprintf(logs[i], sizeof(logs[i]), "%s/open-%d.log", home, i);
			pids[i] = fork();
			CU_ASSERT_FATAL(pids[i] >= 0);
			if (pids[i] == 0) {
				close(go[1]);
				open_together_child(home, go[0], logs[i]);
			}
		}
		close(go[0]);
		usleep(50 * 1000); /* not synchronisation: only a better chance of a race */
		close(go[1]);
		for (int i = 0; i < N_OPENERS; i++) {
			struct stat sb;
			int status;

			CU_ASSERT_FATAL(waitpid(pids[i], &status, 0) == pids[i]);
			if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
				printf("\n  round %d opener %d: exit %d ", round, i,
				       WIFEXITED(status) ? WEXITSTATUS(status) : -1);
				failed++;
			}
			CU_ASSERT_FATAL(stat(logs[i], &sb) == 0);
			if (sb.st_size) {
				char line[256] = "";
				FILE *f = fopen(logs[i], "r");

				if (f && fgets(line, sizeof(line), f))
					printf("\n  round %d opener %d logged: %s", round, i, line);
				if (f)
					(void)fclose(f);
			}
			CU_ASSERT_EQUAL(sb.st_size, 0);
		}
		CU_ASSERT_EQUAL(failed, 0);
	}
}

/* The holder of test_open_while_locked: a read lock on the file (a rollback journal, not yet
 * WAL; a table in it so that the switch to WAL has a header to write), from when it says so
 * on ready until release closes. */
static void hold_read_lock(const char *path, int ready, int release)
{
	sqlite3 *db;
	char c;

	if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
		    SQLITE_OK ||
	    chmod(path, 0600) != 0 ||
	    sqlite3_exec(db, "CREATE TABLE holder (x); BEGIN; SELECT count(*) FROM holder", NULL,
			 NULL, NULL) != SQLITE_OK)
		_exit(1);
	if (write(ready, "r", 1) != 1 || read(release, &c, 1) != 0)
		_exit(2);
	if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
		_exit(3);
	sqlite3_close(db);
	_exit(0);
}

/* The same, made certain. What the openers above meet: each switching the fresh file to WAL
 * holds a read lock while it waits for the others' to go, so they wait for each other until
 * SQLite's busy timeout (2 s) runs out. Here one process holds a read lock for longer than
 * that while a store opens: the store must wait for it, not fail. (Each connection in a
 * process of its own: SQLite's locks must not cross fork.) */
static void test_open_while_locked(void)
{
	const char *home = new_home();
	char path[512], logpath[512], c;
	int ready[2], release[2], go[2], status;
	pid_t holder, opener;
	struct stat sb;

	snprintf(path, sizeof(path), "%s/usage.db", home);
	snprintf(logpath, sizeof(logpath), "%s/open.log", home);
	CU_ASSERT_FATAL(pipe(ready) == 0 && pipe(release) == 0 && pipe(go) == 0);
	holder = fork();
	CU_ASSERT_FATAL(holder >= 0);
	if (holder == 0) {
		close(ready[0]);
		close(release[1]);
		close(go[0]);
		close(go[1]);
		hold_read_lock(path, ready[1], release[0]);
	}
	close(ready[1]);
	close(release[0]);
	CU_ASSERT_FATAL(read(ready[0], &c, 1) == 1);
	opener = fork();
	CU_ASSERT_FATAL(opener >= 0);
	if (opener == 0) {
		/* Only the parent may end the hold: its release end must not live on here. */
		close(release[1]);
		close(ready[0]);
		close(go[1]);
		open_together_child(home, go[0], logpath);
	}
	close(go[0]);
	close(go[1]);
	/* Past SQLite's busy timeout, well within the store's patience (10 s). */
	usleep(2500 * 1000);
	close(release[1]);
	CU_ASSERT_FATAL(waitpid(holder, &status, 0) == holder);
	CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CU_ASSERT_FATAL(waitpid(opener, &status, 0) == opener);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		printf("\n  opener: exit %d ", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CU_ASSERT_FATAL(stat(logpath, &sb) == 0);
	if (sb.st_size) {
		char line[256] = "";
		FILE *f = fopen(logpath, "r");

		if (f && fgets(line, sizeof(line), f))
			printf("\n  opener logged: %s", line);
		if (f)
			(void)fclose(f);
	}
	CU_ASSERT_EQUAL(sb.st_size, 0);
	close(ready[0]);
}

#define TOKEN_LIMIT 1000
#define TOKEN_COST 100

/* Six processes at once, three requests each, every one reserving and then spending
 * TOKEN_COST against tokens_per_day TOKEN_LIMIT: what they spend in all stays within one
 * reservation of the limit (here exactly at it: the reservations are exact). Without
 * reservations every request started below the limit, and all 18 ran (1800). */
static void test_quota_holds_processes(void)
{
	const char *home = new_home();
	struct usage_quota q = { .tokens_per_day = TOKEN_LIMIT };
	struct usage_store *st = open_store(home);
	struct usage_quota_state qs;
	int go[2], allowed = 0, failed = 0;
	pid_t pids[N_CHILDREN];

	usage_store_free(st); /* the schema exists; no connection crosses fork */
	CU_ASSERT_FATAL(pipe(go) == 0);
	for (int i = 0; i < N_CHILDREN; i++) {
		pids[i] = fork();
		CU_ASSERT_FATAL(pids[i] >= 0);
		if (pids[i] == 0) {
			struct usage_store *cst;
			struct usage_verdict v;
			int n = 0;
			char c;

			close(go[1]);
			cst = usage_store_open(home, NULL);
			if (read(go[0], &c, 1) != 0)
				_exit(100);
			for (int k = 0; k < TAKES_EACH; k++) {
				struct usage_claim cl = { .tokens = TOKEN_COST, .ttl_ms = 60000 };
				struct usage_record r = { .key_id = "guest",
							  .status = 200,
							  .prompt_tokens = TOKEN_COST / 2,
							  .completion_tokens = TOKEN_COST / 2,
							  .start = USAGE_START_COLD };

				if (usage_quota_claim(cst, "guest", &q, 0, &cl, &v) != 0)
					_exit(101);
				if (!v.allowed)
					continue;
				n++;
				usleep(20 * 1000); /* the run: others start meanwhile */
				r.hold_id = cl.hold_id;
				if (usage_record_add(cst, &r) != 0)
					_exit(102);
			}
			usage_store_free(cst);
			_exit(n);
		}
	}
	close(go[0]);
	usleep(100 * 1000);
	close(go[1]);
	for (int i = 0; i < N_CHILDREN; i++) {
		int status;

		CU_ASSERT_FATAL(waitpid(pids[i], &status, 0) == pids[i]);
		CU_ASSERT_FATAL(WIFEXITED(status));
		if (WEXITSTATUS(status) >= 100)
			failed++;
		else
			allowed += WEXITSTATUS(status);
	}
	CU_ASSERT_EQUAL(failed, 0);
	CU_ASSERT_EQUAL(allowed, TOKEN_LIMIT / TOKEN_COST);
	st = open_store(home);
	CU_ASSERT_EQUAL(usage_quota_state(st, "guest", 0, &qs), 0);
	CU_ASSERT(qs.tokens_today <= TOKEN_LIMIT + TOKEN_COST);
	CU_ASSERT_EQUAL(qs.tokens_today, TOKEN_LIMIT);
	CU_ASSERT_EQUAL(qs.tokens_reserved, 0);
	usage_store_free(st);
}

/* A version 1 database (before issue 22) is migrated in place: its rows kept, counted once
 * each, reservations and refusal counts work on it. */
static void test_migrate_v1(void)
{
	static const char v1[] =
		"CREATE TABLE requests (id INTEGER PRIMARY KEY, ts_ms INTEGER NOT NULL,"
		" key_id TEXT NOT NULL, provider TEXT, model TEXT, status INTEGER NOT NULL,"
		" prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,"
		" cached_tokens INTEGER NOT NULL, duration_ms INTEGER NOT NULL,"
		" ttfb_ms INTEGER NOT NULL, start INTEGER NOT NULL);"
		"CREATE INDEX requests_ts ON requests (ts_ms);"
		"CREATE INDEX requests_key_ts ON requests (key_id, ts_ms);"
		"CREATE TABLE quota_windows (key_id TEXT NOT NULL, kind INTEGER NOT NULL,"
		" start_ms INTEGER NOT NULL, requests INTEGER NOT NULL, tokens INTEGER NOT NULL,"
		" PRIMARY KEY (key_id, kind, start_ms)) WITHOUT ROWID;"
		"PRAGMA user_version = 1; PRAGMA journal_mode = WAL;";
	const char *home = new_home();
	struct usage_quota q = { .tokens_per_day = 100 };
	struct usage_claim c = { .tokens = 10, .ttl_ms = 1000 };
	struct usage_verdict v;
	struct usage_day *days;
	struct usage_store *st;
	char path[512], sql[512];
	sqlite3 *db;
	size_t n;

	snprintf(path, sizeof(path), "%s/usage.db", home);
	CU_ASSERT_FATAL(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
					NULL) == SQLITE_OK);
	CU_ASSERT_FATAL(chmod(path, 0600) == 0);
	CU_ASSERT_FATAL(sqlite3_exec(db, v1, NULL, NULL, NULL) == SQLITE_OK);
	snprintf(sql, sizeof(sql),
		 "INSERT INTO requests VALUES (NULL, %lld, 'k', NULL, NULL, 429, 0, 0, 0, 1, 0,"
		 " 0), (NULL, %lld, 'k', 'p', 'm', 200, 5, 5, 0, 1, 1, 1)",
		 (long long)today_ms(), (long long)today_ms() + 1);
	CU_ASSERT_FATAL(sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK);
	sqlite3_close(db);
	st = open_store(home);
	CU_ASSERT(usage_available(st));
	add(st, today_ms() + 2, "k", NULL, 429, 0, 0, USAGE_START_NONE);
	CU_ASSERT_EQUAL_FATAL(usage_days(st, NULL, &days, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 2);
	CU_ASSERT_EQUAL(days[0].requests, 2); /* the old row (count 1), then + 1 */
	CU_ASSERT_EQUAL(days[0].errors, 2);
	CU_ASSERT_EQUAL(days[1].requests, 1);
	free(days);
	CU_ASSERT_EQUAL(usage_quota_claim(st, "k", &q, 0, &c, &v), 0);
	CU_ASSERT(v.allowed);
	CU_ASSERT(c.hold_id > 0);
	CU_ASSERT_EQUAL(usage_failures(st), 0);
	usage_store_free(st);
}

/* A version 2 database (before accounts, ADR 0037) is migrated in place to 3: its rows
 * kept (no account), a refusal still counted into its minute's row, new rows with their
 * account. */
static void test_migrate_v2(void)
{
	static const char v2[] =
		"CREATE TABLE requests (id INTEGER PRIMARY KEY, ts_ms INTEGER NOT NULL,"
		" key_id TEXT NOT NULL, provider TEXT, model TEXT, status INTEGER NOT NULL,"
		" prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,"
		" cached_tokens INTEGER NOT NULL, duration_ms INTEGER NOT NULL,"
		" ttfb_ms INTEGER NOT NULL, start INTEGER NOT NULL,"
		" count INTEGER NOT NULL DEFAULT 1);"
		"CREATE INDEX requests_ts ON requests (ts_ms);"
		"CREATE INDEX requests_key_ts ON requests (key_id, ts_ms);"
		"CREATE TABLE quota_windows (key_id TEXT NOT NULL, kind INTEGER NOT NULL,"
		" start_ms INTEGER NOT NULL, requests INTEGER NOT NULL, tokens INTEGER NOT NULL,"
		" PRIMARY KEY (key_id, kind, start_ms)) WITHOUT ROWID;"
		"CREATE TABLE quota_holds (id INTEGER PRIMARY KEY AUTOINCREMENT,"
		" key_id TEXT NOT NULL, day_ms INTEGER NOT NULL, tokens INTEGER NOT NULL,"
		" expires_ms INTEGER NOT NULL);"
		"CREATE INDEX quota_holds_key ON quota_holds (key_id, day_ms);"
		"PRAGMA user_version = 2; PRAGMA journal_mode = WAL;";
	const char *home = new_home();
	struct usage_record r = { .key_id = "k",
				  .provider = "p",
				  .model = "m",
				  .account = "alice",
				  .status = 200,
				  .prompt_tokens = 3,
				  .completion_tokens = 4,
				  .start = USAGE_START_COLD };
	struct usage_day *days;
	struct usage_row *rows;
	struct usage_store *st;
	char path[512], sql[512];
	int64_t t = today_ms();
	sqlite3_stmt *s;
	sqlite3 *db;
	size_t n;

	snprintf(path, sizeof(path), "%s/usage.db", home);
	CU_ASSERT_FATAL(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
					NULL) == SQLITE_OK);
	CU_ASSERT_FATAL(chmod(path, 0600) == 0);
	CU_ASSERT_FATAL(sqlite3_exec(db, v2, NULL, NULL, NULL) == SQLITE_OK);
	snprintf(sql, sizeof(sql),
		 "INSERT INTO requests VALUES (NULL, %lld, 'k', NULL, NULL, 429, 0, 0, 0, 1, 0,"
		 " 0, 3), (NULL, %lld, 'k', 'p', 'm', 200, 5, 5, 0, 1, 1, 1, 1)",
		 (long long)t, (long long)t + 1);
	CU_ASSERT_FATAL(sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK);
	sqlite3_close(db);
	st = open_store(home);
	CU_ASSERT(usage_available(st));
	/* A refusal of the old row's minute, key, status, no provider and no account: into
	 * it. */
	add(st, t + 2, "k", NULL, 429, 0, 0, USAGE_START_NONE);
	r.ts_ms = t + 3;
	CU_ASSERT_EQUAL(usage_record_add(st, &r), 0);
	CU_ASSERT_EQUAL_FATAL(usage_days(st, NULL, &days, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 3);
	CU_ASSERT_STRING_EQUAL(days[0].provider, "");
	CU_ASSERT_EQUAL(days[0].requests, 4); /* 3 kept, then + 1 */
	CU_ASSERT_STRING_EQUAL(days[1].provider, "p");
	CU_ASSERT_STRING_EQUAL(days[1].account, ""); /* the old row: no account */
	CU_ASSERT_EQUAL(days[1].prompt_tokens, 5);
	CU_ASSERT_STRING_EQUAL(days[2].account, "alice");
	CU_ASSERT_EQUAL(days[2].prompt_tokens, 3);
	free(days);
	CU_ASSERT_EQUAL_FATAL(usage_recent(st, NULL, 10, &rows, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 3);
	CU_ASSERT_STRING_EQUAL(rows[0].account, "alice");
	CU_ASSERT_STRING_EQUAL(rows[1].account, "");
	CU_ASSERT_EQUAL(rows[2].count, 4);
	free(rows);
	CU_ASSERT_EQUAL(usage_failures(st), 0);
	usage_store_free(st);
	CU_ASSERT_FATAL(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK);
	CU_ASSERT_FATAL(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &s, NULL) == SQLITE_OK);
	CU_ASSERT_EQUAL(sqlite3_step(s), SQLITE_ROW);
	CU_ASSERT_EQUAL(sqlite3_column_int(s, 0), 3);
	sqlite3_finalize(s);
	sqlite3_close(db);
}

struct thread_arg {
	struct usage_store *st;
	int allowed;
	int errors;
};

static void *take_many(void *p)
{
	struct thread_arg *a = p;
	struct usage_quota q = { .requests_per_day = 100 };
	struct usage_verdict v;

	for (int i = 0; i < 60; i++) {
		struct usage_record r = { .key_id = "t", .status = 200, .prompt_tokens = 1 };

		if (usage_quota_take(a->st, "t", &q, 0, &v) != 0)
			a->errors++;
		a->allowed += v.allowed;
		if (usage_record_add(a->st, &r) != 0)
			a->errors++;
	}
	return NULL;
}

/* Four threads of one process share its store: 240 tries, exactly 100 through. */
static void test_quota_threads(void)
{
	struct usage_store *st = open_store(new_home());
	struct thread_arg args[4];
	pthread_t th[4];
	struct usage_day *days;
	int allowed = 0;
	size_t n;

	for (int i = 0; i < 4; i++) {
		args[i] = (struct thread_arg){ .st = st };
		CU_ASSERT_FATAL(pthread_create(&th[i], NULL, take_many, &args[i]) == 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		CU_ASSERT_EQUAL(args[i].errors, 0);
		allowed += args[i].allowed;
	}
	CU_ASSERT_EQUAL(allowed, 100);
	CU_ASSERT_EQUAL(usage_days(st, NULL, &days, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 1);
	CU_ASSERT_EQUAL(days[0].requests, 240);
	free(days);
	usage_store_free(st);
}

/* ---- retention ------------------------------------------------------------------------- */

static void test_retention(void)
{
	const char *home = new_home();
	struct usage_store *st = open_store(home);
	struct usage_quota q = { .requests_per_day = 5 };
	int64_t now = now_ms(), old = now - 3 * DAY_MS;
	struct usage_options opt = { .retention_days = 1, .reopen_ms = 50 };
	struct usage_quota_state qs;
	struct usage_verdict v;
	struct usage_row *rows;
	size_t n;

	/* The first add prunes (keeping 90 days); what comes after stays until the next. */
	add(st, now - 1000, "k", "claude", 200, 1, 1, USAGE_START_COLD);
	add(st, old, "k", "claude", 200, 1, 1, USAGE_START_COLD);
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, old, &v), 0);
	CU_ASSERT_EQUAL(usage_quota_state(st, "k", old, &qs), 0);
	CU_ASSERT_EQUAL(qs.requests_today, 1);
	CU_ASSERT_EQUAL(qs.tokens_today, 2);
	CU_ASSERT_EQUAL(usage_recent(st, NULL, 10, &rows, &n), 0);
	CU_ASSERT_EQUAL(n, 2);
	free(rows);
	usage_store_free(st);

	/* Another process keeping one day: its first add drops the old row and window. */
	st = usage_store_open(home, &opt);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	add(st, now, "k", "codex", 200, 1, 1, USAGE_START_COLD);
	CU_ASSERT_EQUAL(usage_recent(st, NULL, 10, &rows, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 2);
	CU_ASSERT(rows[0].ts_ms >= now - 1000);
	CU_ASSERT(rows[1].ts_ms >= now - 1000);
	free(rows);
	CU_ASSERT_EQUAL(usage_quota_state(st, "k", old, &qs), 0);
	CU_ASSERT_EQUAL(qs.requests_today, 0);
	CU_ASSERT_EQUAL(qs.tokens_today, 0);
	/* Today's window survives. */
	CU_ASSERT_EQUAL(usage_quota_state(st, "k", now, &qs), 0);
	CU_ASSERT_EQUAL(qs.tokens_today, 4);
	usage_store_free(st);
}

/* ---- files, descriptors, schema ------------------------------------------------------- */

static void check_mode(const char *home, const char *name)
{
	char path[512];
	struct stat sb;

	snprintf(path, sizeof(path), "%s/%s", home, name);
	CU_ASSERT_FATAL(lstat(path, &sb) == 0);
	CU_ASSERT(S_ISREG(sb.st_mode));
	CU_ASSERT_EQUAL(sb.st_mode & 07777, 0600);
}

static void test_modes(void)
{
	const char *home = new_home();
	struct usage_store *st;
	char path[512];
	mode_t old = umask(0); /* the modes must not depend on the caller's umask */

	st = open_store(home);
	add(st, 0, "k", "claude", 200, 1, 1, USAGE_START_COLD);
	check_mode(home, "usage.db");
	check_mode(home, "usage.db-wal");
	check_mode(home, "usage.db-shm");
	usage_store_free(st);

	/* A widened file is made private again. */
	snprintf(path, sizeof(path), "%s/usage.db", home);
	CU_ASSERT(chmod(path, 0644) == 0);
	st = open_store(home);
	CU_ASSERT(usage_available(st));
	check_mode(home, "usage.db");
	usage_store_free(st);
	umask(old);

	/* A symlink where the database should be is not followed. */
	home = new_home();
	snprintf(path, sizeof(path), "%s/usage.db", home);
	CU_ASSERT(symlink("/tmp/olp-usage-test-elsewhere.db", path) == 0);
	st = open_store(home);
	CU_ASSERT_FALSE(usage_available(st));
	CU_ASSERT(access("/tmp/olp-usage-test-elsewhere.db", F_OK) != 0);
	usage_store_free(st);
}

/* A child never inherits a descriptor beyond 0-2: every one the store holds is
 * close-on-exec. */
static void test_cloexec(void)
{
	static bool before[1024];
	struct usage_store *st;
	int checked = 0;

	/* Only the store's own: whatever ran this test may have left others open. */
	for (int fd = 3; fd < 1024; fd++)
		before[fd] = fcntl(fd, F_GETFD) >= 0;
	st = open_store(new_home());
	add(st, 0, "k", "claude", 200, 1, 1, USAGE_START_COLD);
	for (int fd = 3; fd < 1024; fd++) {
		int fl = fcntl(fd, F_GETFD);

		if (fl < 0 || before[fd])
			continue;
		checked++;
		CU_ASSERT(fl & FD_CLOEXEC);
	}
	CU_ASSERT(checked >= 2); /* the database and its WAL at least */
	usage_store_free(st);
}

/* The exact column list: a new column is a decision, taken here, with a look at what
 * it holds (never a prompt, an answer, a token or a hash). */
static void test_schema(void)
{
	const char *home = new_home();
	const char *want = "quota_holds:id,key_id,day_ms,tokens,expires_ms;"
			   "quota_windows:key_id,kind,start_ms,requests,tokens;"
			   "requests:id,ts_ms,key_id,provider,model,status,prompt_tokens,"
			   "completion_tokens,cached_tokens,duration_ms,ttfb_ms,start,count,"
			   "account;"
			   "sqlite_sequence:name,seq;";
	struct usage_store *st = open_store(home);
	char path[512], got[1024] = "";
	sqlite3_stmt *s;
	sqlite3 *db;

	usage_store_free(st);
	snprintf(path, sizeof(path), "%s/usage.db", home);
	CU_ASSERT_FATAL(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK);
	CU_ASSERT_FATAL(sqlite3_prepare_v2(db,
					   "SELECT m.name, p.name FROM sqlite_schema m,"
					   " pragma_table_info(m.name) p WHERE m.type = 'table'"
					   " ORDER BY m.name, p.cid",
					   -1, &s, NULL) == SQLITE_OK);
	{
		char table[64] = "";

		while (sqlite3_step(s) == SQLITE_ROW) {
			const char *t = (const char *)sqlite3_column_text(s, 0);
			const char *c = (const char *)sqlite3_column_text(s, 1);
			size_t len = strlen(got);

			if (strcmp(t, table) != 0) {
				if (*table)
					got[len - 1] = ';'; /* replace the last ',' */
				snprintf(table, sizeof(table), "%s", t);
				len = strlen(got);
				snprintf(got + len, sizeof(got) - len, "%s:", t);
				len = strlen(got);
			}
			snprintf(got + len, sizeof(got) - len, "%s,", c);
		}
		got[strlen(got) - 1] = ';';
	}
	sqlite3_finalize(s);
	CU_ASSERT_STRING_EQUAL(got, want);
	CU_ASSERT_FATAL(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &s, NULL) == SQLITE_OK);
	CU_ASSERT_EQUAL(sqlite3_step(s), SQLITE_ROW);
	CU_ASSERT_EQUAL(sqlite3_column_int(s, 0), 3);
	sqlite3_finalize(s);
	CU_ASSERT_FATAL(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &s, NULL) == SQLITE_OK);
	CU_ASSERT_EQUAL(sqlite3_step(s), SQLITE_ROW);
	CU_ASSERT_STRING_EQUAL((const char *)sqlite3_column_text(s, 0), "wal");
	sqlite3_finalize(s);
	sqlite3_close(db);

	/* A schema newer than this code is refused, not written to. */
	CU_ASSERT_FATAL(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK);
	CU_ASSERT(sqlite3_exec(db, "PRAGMA user_version = 99", NULL, NULL, NULL) == SQLITE_OK);
	sqlite3_close(db);
	st = open_store(home);
	CU_ASSERT_FALSE(usage_available(st));
	CU_ASSERT(usage_failures(st) >= 1);
	usage_store_free(st);
}

/* ---- the failure policy ---------------------------------------------------------------- */

/* Everything a request does with a store that cannot work: a quota refuses (fails closed),
 * every call says -errno, counts, and usage_health says since when. */
static void check_unavailable(struct usage_store *st)
{
	struct usage_quota q = { .requests_per_day = 1 };
	struct usage_record r = { .key_id = "k", .status = 200 };
	struct usage_quota_state qs;
	struct usage_verdict v;
	struct usage_day *days;
	uint64_t before = usage_failures(st);
	size_t n;

	struct usage_health h;

	CU_ASSERT_FALSE(usage_available(st));
	for (int i = 0; i < 3; i++) {
		CU_ASSERT(usage_quota_take(st, "k", &q, 0, &v) < 0);
		CU_ASSERT_FALSE(v.allowed);
		CU_ASSERT_PTR_NULL(v.limit);
	}
	usage_health(st, &h);
	CU_ASSERT_FALSE(h.ok);
	CU_ASSERT(h.failing_since_ms > now_ms() - 60000 && h.failing_since_ms <= now_ms());
	CU_ASSERT(h.last_err < 0);
	CU_ASSERT(usage_record_add(st, &r) < 0);
	CU_ASSERT(usage_quota_state(st, "k", 0, &qs) < 0);
	CU_ASSERT(usage_days(st, NULL, &days, &n) < 0);
	CU_ASSERT_PTR_NULL(days);
	CU_ASSERT_EQUAL(usage_failures(st), before + 6);
	usage_health(st, &h);
	CU_ASSERT_EQUAL(h.failures, before + 6);
}

static void check_recovers(struct usage_store *st)
{
	struct usage_quota q = { .requests_per_day = 1 };
	struct usage_verdict v;

	struct usage_health h;

	usleep(80 * 1000); /* past reopen_ms (50 ms) */
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, 0, &v), 0);
	CU_ASSERT(v.allowed);
	CU_ASSERT(usage_available(st));
	usage_health(st, &h);
	CU_ASSERT(h.ok);
	CU_ASSERT_EQUAL(h.failing_since_ms, 0);
	/* The quota holds again. */
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", &q, 0, &v), 0);
	CU_ASSERT_FALSE(v.allowed);
}

static void test_unavailable_dir(void)
{
	const char *home = new_home();
	struct usage_store *st;
	char path[512];

	snprintf(path, sizeof(path), "%s/usage.db", home);
	CU_ASSERT_FATAL(mkdir(path, 0700) == 0);
	st = open_store(home);
	CU_ASSERT(usage_failures(st) >= 1);
	check_unavailable(st);
	CU_ASSERT(rmdir(path) == 0);
	check_recovers(st);
	usage_store_free(st);
}

static void test_unavailable_home(void)
{
	char home[512];
	struct usage_store *st;

	/* OLP_HOME missing (a worker started before the home was made). */
	snprintf(home, sizeof(home), "%s/later", tmproot);
	st = open_store(home);
	check_unavailable(st);
	CU_ASSERT(mkdir(home, 0700) == 0);
	check_recovers(st);
	usage_store_free(st);

	/* OLP_HOME not writable: root writes anyway, so only an unprivileged run checks it. */
	if (geteuid() == 0) {
		printf("\n  (not-writable OLP_HOME: skipped as root) ");
		return;
	}
	snprintf(home, sizeof(home), "%s/readonly", tmproot);
	CU_ASSERT_FATAL(mkdir(home, 0500) == 0);
	st = open_store(home);
	check_unavailable(st);
	CU_ASSERT(chmod(home, 0700) == 0);
	check_recovers(st);
	usage_store_free(st);
}

static void test_bad_args(void)
{
	struct usage_quota q = { .requests_per_day = 1 };
	struct usage_record r = { .key_id = "", .status = 200 };
	struct usage_store *st;
	struct usage_verdict v;

	errno = 0;
	CU_ASSERT_PTR_NULL(usage_store_open(NULL, NULL));
	CU_ASSERT_EQUAL(errno, EINVAL);
	CU_ASSERT_PTR_NULL(usage_store_open("", NULL));
	usage_store_free(NULL);
	CU_ASSERT_EQUAL(usage_failures(NULL), 0);
	CU_ASSERT_FALSE(usage_available(NULL));
	st = open_store(new_home());
	CU_ASSERT_EQUAL(usage_record_add(st, &r), -EINVAL);
	CU_ASSERT_EQUAL(usage_record_add(st, NULL), -EINVAL);
	CU_ASSERT_EQUAL(usage_quota_take(st, NULL, &q, 0, &v), -EINVAL);
	CU_ASSERT_FALSE(v.allowed);
	CU_ASSERT_EQUAL(usage_quota_take(st, "k", NULL, 0, &v), -EINVAL);
	CU_ASSERT_FALSE(v.allowed);
	CU_ASSERT_EQUAL(usage_quota_refund(st, "k", NULL), -EINVAL);
	CU_ASSERT_FALSE(usage_quota_any(NULL));
	CU_ASSERT_STRING_EQUAL(usage_start_name(USAGE_START_PRESTART), "prestart");
	CU_ASSERT_STRING_EQUAL(usage_start_name(USAGE_START_NONE), "none");
	CU_ASSERT_EQUAL(usage_failures(st), 0);
	usage_store_free(st);
}

/* ---- the ledger as JSON (report.c) ------------------------------------------------------ */

static void test_day_parse(void)
{
	int64_t ms = 1;

	CU_ASSERT_EQUAL(usage_day_parse("2026-01-31", &ms), 0);
	CU_ASSERT_EQUAL(ms, INT64_C(1769817600000));
	CU_ASSERT_EQUAL(usage_day_parse("2024-02-29", &ms), 0); /* a leap day */
	for (const char *const *bad =
		     (const char *const[]){ "2026-02-30", "2025-02-29", "2026-1-1", "2026-13-01",
					    "2026-01-00", "2026-01-01x", "yesterday", "", NULL };
	     *bad; bad++) {
		ms = 7;
		CU_ASSERT_EQUAL(usage_day_parse(*bad, &ms), -EINVAL);
		CU_ASSERT_EQUAL(ms, 7);
	}
	CU_ASSERT_EQUAL(usage_day_parse(NULL, &ms), -EINVAL);
}

/* b's JSON, parsed (the test fails when it does not parse). */
static json_t *parsed(const struct buf *b)
{
	json_error_t err;
	json_t *j = json_loads(b->data, 0, &err);

	if (!j)
		fprintf(stderr, "not JSON (%s): %s\n", err.text, b->data);
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	return j;
}

static int64_t member_int(const json_t *o, const char *name)
{
	const json_t *v = json_object_get(o, name);

	CU_ASSERT(json_is_integer(v));
	return json_integer_value(v);
}

static const char *member_str(const json_t *o, const char *name)
{
	const json_t *v = json_object_get(o, name);

	CU_ASSERT(json_is_string(v));
	return json_is_string(v) ? json_string_value(v) : "";
}

/* One day's object, as both readers get it: with its key (olp-keys) and without. */
static void test_day_json(void)
{
	struct usage_day d = { .key_id = "k1",
			       .provider = "claude",
			       .day = "2026-12-01",
			       .requests = 3,
			       .errors = 1,
			       .prompt_tokens = 21,
			       .completion_tokens = 15,
			       .cached_tokens = 4,
			       .duration_ms = 1860,
			       .warm = 2,
			       .prestart = 1 };
	struct buf b = BUF_INIT;
	json_t *j;

	usage_day_json(&b, &d, false, NULL);
	CU_ASSERT_STRING_EQUAL(b.data,
			       "{\"date\":\"2026-12-01\",\"provider\":\"claude\","
			       "\"account\":null,\"requests\":3,\"errors\":1,\"prompt_tokens\":21,"
			       "\"completion_tokens\":15,\"cached_tokens\":4,\"warm\":2,"
			       "\"prestart\":1,\"duration_ms\":1860}");
	buf_reset(&b);
	d.provider[0] = '\0';
	usage_day_json(&b, &d, true, "a \"name\"\n\xc3\xa9");
	j = parsed(&b);
	CU_ASSERT_EQUAL(json_object_size(j), 13);
	CU_ASSERT_STRING_EQUAL(member_str(j, "key_id"), "k1");
	CU_ASSERT_STRING_EQUAL(member_str(j, "name"), "a \"name\"\n\xc3\xa9");
	CU_ASSERT(json_is_null(json_object_get(j, "provider")));
	json_decref(j);
	buf_reset(&b);
	usage_day_json(&b, &d, true, NULL);
	j = parsed(&b);
	CU_ASSERT(json_is_null(json_object_get(j, "name")));
	json_decref(j);
	buf_reset(&b);
	snprintf(d.account, sizeof(d.account), "alice");
	usage_day_json(&b, &d, false, NULL);
	j = parsed(&b);
	CU_ASSERT_STRING_EQUAL(member_str(j, "account"), "alice");
	json_decref(j);
	buf_release(&b);
}

/* GET /v1/usage's answer from a real ledger: keys with and without a quota or a name, their
 * days and totals, where they stand now, the recent rows. */
static void test_report_json(void)
{
	const char *home = new_home();
	struct usage_store *st = open_store(home);
	const struct usage_quota q = { .requests_per_day = 3 };
	const struct usage_key_info keys[] = {
		{ .id = "k1",
		  .name = "<b>alice</b> \"x\"",
		  .tier = "guest",
		  .have_quota = true,
		  .quota = q },
		{ .id = "k2",
		  .name = "bob",
		  .tier = "owner",
		  .revoked = true,
		  .have_quota = true,
		  .max_concurrent = 2 },
		{ .id = "gone" },
	};
	struct usage_report r = { .since_ms = today_ms() - DAY_MS,
				  .now_ms = INT64_C(1796152486606),
				  .recent_limit = 2,
				  .all_keys = true,
				  .keys = keys,
				  .nkeys = 3 };
	struct usage_verdict v;
	struct usage_day *days;
	struct usage_row *rows;
	struct buf b = BUF_INIT;
	const json_t *k, *day, *row;
	json_t *j;
	int64_t t = now_ms() - 1000;

	add(st, t, "k1", "claude", 200, 10, 20, USAGE_START_WARM);
	add(st, t + 1, "k1", "codex", 500, 1, 2, USAGE_START_COLD);
	add(st, t + 2, "k2", NULL, 499, 0, 0, USAGE_START_COLD);
	CU_ASSERT_EQUAL(usage_quota_take(st, "k1", &q, 0, &v), 0);
	CU_ASSERT_EQUAL(usage_days(st, NULL, &days, &r.ndays), 0);
	CU_ASSERT_EQUAL(usage_recent(st, NULL, 2, &rows, &r.nrows), 0);
	r.days = days;
	r.rows = rows;
	usage_report_json(st, &r, &b);
	j = parsed(&b);
	CU_ASSERT_STRING_EQUAL(member_str(j, "object"), "usage");
	CU_ASSERT_EQUAL(strlen(member_str(j, "since")), 10);
	CU_ASSERT_STRING_EQUAL(member_str(j, "generated_at"), "2026-12-01T19:14:46.606Z");
	CU_ASSERT_EQUAL(member_int(j, "recent_limit"), 2);
	CU_ASSERT(json_is_true(json_object_get(j, "all_keys")));
	CU_ASSERT_EQUAL_FATAL(json_array_size(json_object_get(j, "keys")), 3);
	/* k1: a quota, two days' rows (one a provider each), where it stands. */
	k = json_array_get(json_object_get(j, "keys"), 0);
	CU_ASSERT_STRING_EQUAL(member_str(k, "key_id"), "k1");
	CU_ASSERT_STRING_EQUAL(member_str(k, "name"), "<b>alice</b> \"x\"");
	CU_ASSERT_STRING_EQUAL(member_str(k, "tier"), "guest");
	CU_ASSERT(json_is_false(json_object_get(k, "revoked")));
	CU_ASSERT_EQUAL(member_int(json_object_get(k, "quota"), "requests_per_day"), 3);
	CU_ASSERT_EQUAL(member_int(json_object_get(k, "quota"), "max_concurrent"), 0);
	CU_ASSERT_EQUAL(json_object_size(json_object_get(k, "quota")), 4);
	CU_ASSERT_EQUAL(member_int(json_object_get(k, "quota_state"), "requests_today"), 1);
	CU_ASSERT_EQUAL(member_int(json_object_get(k, "quota_state"), "tokens_today"), 33);
	CU_ASSERT_EQUAL_FATAL(json_array_size(json_object_get(k, "days")), 2);
	day = json_array_get(json_object_get(k, "days"), 0);
	CU_ASSERT_STRING_EQUAL(member_str(day, "provider"), "claude");
	CU_ASSERT_EQUAL(member_int(day, "warm"), 1);
	CU_ASSERT_EQUAL(member_int(day, "duration_ms"), 100);
	CU_ASSERT_EQUAL(member_int(json_object_get(k, "totals"), "requests"), 2);
	CU_ASSERT_EQUAL(member_int(json_object_get(k, "totals"), "errors"), 1);
	CU_ASSERT_EQUAL(member_int(json_object_get(k, "totals"), "total_tokens"), 33);
	CU_ASSERT_EQUAL(member_int(json_object_get(k, "totals"), "cached_tokens"), 5);
	CU_ASSERT_EQUAL(member_int(json_object_get(k, "totals"), "warm"), 1);
	/* k2: revoked, max_concurrent its only limit, one request gone before a provider ran. */
	k = json_array_get(json_object_get(j, "keys"), 1);
	CU_ASSERT(json_is_true(json_object_get(k, "revoked")));
	CU_ASSERT_EQUAL(member_int(json_object_get(k, "quota"), "max_concurrent"), 2);
	day = json_array_get(json_object_get(k, "days"), 0);
	CU_ASSERT(json_is_null(json_object_get(day, "provider")));
	CU_ASSERT_EQUAL(member_int(day, "errors"), 1);
	/* gone: nothing known of it, nothing in the ledger. */
	k = json_array_get(json_object_get(j, "keys"), 2);
	CU_ASSERT(json_is_null(json_object_get(k, "name")));
	CU_ASSERT(json_is_null(json_object_get(k, "tier")));
	CU_ASSERT(json_is_null(json_object_get(k, "quota")));
	CU_ASSERT_EQUAL(json_array_size(json_object_get(k, "days")), 0);
	CU_ASSERT_EQUAL(member_int(json_object_get(k, "totals"), "total_tokens"), 0);
	/* The recent rows, newest first. */
	CU_ASSERT_EQUAL_FATAL(json_array_size(json_object_get(j, "recent")), 2);
	row = json_array_get(json_object_get(j, "recent"), 0);
	CU_ASSERT_STRING_EQUAL(member_str(row, "key_id"), "k2");
	CU_ASSERT(json_is_null(json_object_get(row, "provider")));
	CU_ASSERT(json_is_null(json_object_get(row, "model")));
	CU_ASSERT_STRING_EQUAL(member_str(row, "start"), "cold");
	CU_ASSERT_EQUAL(member_int(row, "count"), 1);
	row = json_array_get(json_object_get(j, "recent"), 1);
	CU_ASSERT_EQUAL(member_int(row, "ts_ms"), t + 1);
	CU_ASSERT_EQUAL(strlen(member_str(row, "ts")), 24);
	CU_ASSERT_STRING_EQUAL(member_str(row, "model"), "m1");
	CU_ASSERT_EQUAL(member_int(row, "status"), 500);
	CU_ASSERT_EQUAL(member_int(row, "ttfb_ms"), 10);
	json_decref(j);
	/* Nothing to say: still an answer. */
	buf_reset(&b);
	usage_report_json(st, &(struct usage_report){ .since_ms = 0, .now_ms = 1 }, &b);
	CU_ASSERT_STRING_EQUAL(b.data, "{\"object\":\"usage\",\"since\":\"1970-01-01\","
				       "\"generated_at\":\"1970-01-01T00:00:00.001Z\","
				       "\"recent_limit\":0,\"all_keys\":false,\"account\":null,"
				       "\"keys\":[],"
				       "\"recent\":[]}");
	buf_release(&b);
	free(days);
	free(rows);
	usage_store_free(st);
}

/* Accounts in the ledger (ADR 0037): a key's rows split by account in its days, the
 * report's by_account totals and recent rows; refusals counted per account; "" stored as
 * none. */
static void test_accounts(void)
{
	const char *home = new_home();
	struct usage_store *st = open_store(home);
	const struct usage_key_info keys[] = { { .id = "k" } };
	struct usage_report rep = { .keys = keys, .nkeys = 1 };
	const char *acct[] = { "alice", "bob", "alice", "", NULL };
	struct usage_day *days;
	struct usage_row *rows;
	struct buf b = BUF_INIT;
	const json_t *ba, *e;
	json_t *j;
	int64_t t = today_ms();
	size_t n;

	for (size_t i = 0; i < ARRAY_SIZE(acct); i++) {
		struct usage_record r = { .ts_ms = t + (int64_t)i,
					  .key_id = "k",
					  .provider = "claude",
					  .model = "m",
					  .account = acct[i],
					  .status = 200,
					  .prompt_tokens = 10,
					  .completion_tokens = 1,
					  .start = USAGE_START_COLD };

		CU_ASSERT_EQUAL(usage_record_add(st, &r), 0);
	}
	/* Two refusals of one minute through alice, one through bob: two rows. */
	for (int i = 0; i < 3; i++) {
		struct usage_record r = { .ts_ms = t + MINUTE_MS + 10,
					  .key_id = "k",
					  .provider = "claude",
					  .model = "m",
					  .account = i < 2 ? "alice" : "bob",
					  .status = 429 };

		CU_ASSERT_EQUAL(usage_record_add(st, &r), 0);
	}
	CU_ASSERT_EQUAL_FATAL(usage_days(st, NULL, &days, &n), 0);
	/* One day: "", alice, bob in that order. */
	CU_ASSERT_EQUAL_FATAL(n, 3);
	CU_ASSERT_STRING_EQUAL(days[0].account, "");
	CU_ASSERT_EQUAL(days[0].requests, 2);
	CU_ASSERT_STRING_EQUAL(days[1].account, "alice");
	CU_ASSERT_EQUAL(days[1].requests, 4);
	CU_ASSERT_EQUAL(days[1].errors, 2);
	CU_ASSERT_STRING_EQUAL(days[2].account, "bob");
	CU_ASSERT_EQUAL(days[2].requests, 2);
	rep.days = days;
	rep.ndays = n;
	CU_ASSERT_EQUAL(usage_recent(st, NULL, 3, &rows, &rep.nrows), 0);
	rep.rows = rows;
	usage_report_json(st, &rep, &b);
	j = parsed(&b);
	ba = json_object_get(json_array_get(json_object_get(j, "keys"), 0), "by_account");
	CU_ASSERT_EQUAL_FATAL(json_array_size(ba), 3);
	e = json_array_get(ba, 0);
	CU_ASSERT_STRING_EQUAL(member_str(e, "provider"), "claude");
	CU_ASSERT(json_is_null(json_object_get(e, "account")));
	CU_ASSERT_EQUAL(member_int(e, "requests"), 2); /* "" and NULL: none */
	e = json_array_get(ba, 1);
	CU_ASSERT_STRING_EQUAL(member_str(e, "account"), "alice");
	CU_ASSERT_EQUAL(member_int(e, "requests"), 4);
	CU_ASSERT_EQUAL(member_int(e, "errors"), 2);
	CU_ASSERT_EQUAL(member_int(e, "total_tokens"), 22);
	e = json_array_get(ba, 2);
	CU_ASSERT_STRING_EQUAL(member_str(e, "account"), "bob");
	CU_ASSERT_EQUAL(member_int(e, "requests"), 2);
	/* The key's totals are still every account's. */
	CU_ASSERT_EQUAL(
		member_int(json_object_get(json_array_get(json_object_get(j, "keys"), 0), "totals"),
			   "requests"),
		8);
	e = json_array_get(json_object_get(j, "recent"), 0);
	CU_ASSERT_STRING_EQUAL(member_str(e, "account"), "bob"); /* the bob refusal, newest */
	CU_ASSERT_EQUAL(member_int(json_array_get(json_object_get(j, "recent"), 1), "count"), 2);
	json_decref(j);
	buf_release(&b);
	free(days);
	free(rows);
	usage_store_free(st);
}

/* ?account= (ADR 0037): only that account's rows, in the days, the recent rows (the limit
 * counted after the filter) and the report's totals; with a key too; an account without
 * rows, or a name too long for the ledger, reads nothing. */
static void test_account_filter(void)
{
	const char *home = new_home();
	struct usage_store *st = open_store(home);
	const struct usage_key_info keys[] = { { .id = "k1" }, { .id = "k2" } };
	struct usage_report rep = { .keys = keys, .nkeys = 2, .account = "bob" };
	static const struct {
		const char *key, *acct;
	} rec[] = { { "k1", "alice" }, { "k1", "bob" }, { "k2", "bob" },  { "k1", "bob" },
		    { "k2", "alice" }, { "k1", NULL },	{ "k1", "alice" } };
	struct usage_filter f = { .account = "bob" };
	struct usage_day *days;
	struct usage_row *rows;
	struct buf b = BUF_INIT;
	json_t *j;
	int64_t t = today_ms();
	size_t n, nr;

	for (size_t i = 0; i < ARRAY_SIZE(rec); i++) {
		struct usage_record r = { .ts_ms = t + (int64_t)i,
					  .key_id = rec[i].key,
					  .provider = i == 3 ? "codex" : "claude",
					  .model = "m",
					  .account = rec[i].acct,
					  .status = 200,
					  .prompt_tokens = 10 * (int64_t)(i + 1),
					  .completion_tokens = 1,
					  .start = USAGE_START_COLD };

		CU_ASSERT_EQUAL(usage_record_add(st, &r), 0);
	}
	/* bob's rows of every key and provider: k1 claude, k1 codex, k2 claude. */
	CU_ASSERT_EQUAL_FATAL(usage_days(st, &f, &days, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 3);
	for (size_t i = 0; i < n; i++) {
		CU_ASSERT_STRING_EQUAL(days[i].account, "bob");
		CU_ASSERT_EQUAL(days[i].requests, 1);
	}
	/* The newest two of bob's, not the newest two of all. */
	CU_ASSERT_EQUAL_FATAL(usage_recent(st, &f, 2, &rows, &nr), 0);
	CU_ASSERT_EQUAL_FATAL(nr, 2);
	CU_ASSERT_STRING_EQUAL(rows[0].account, "bob");
	CU_ASSERT_EQUAL(rows[0].prompt_tokens, 40);
	CU_ASSERT_STRING_EQUAL(rows[1].account, "bob");
	CU_ASSERT_EQUAL(rows[1].prompt_tokens, 30);
	rep.days = days;
	rep.ndays = n;
	rep.rows = rows;
	rep.nrows = nr;
	usage_report_json(st, &rep, &b);
	j = parsed(&b);
	CU_ASSERT_STRING_EQUAL(member_str(j, "account"), "bob");
	CU_ASSERT_EQUAL(
		member_int(json_object_get(json_array_get(json_object_get(j, "keys"), 0), "totals"),
			   "requests"),
		2);
	CU_ASSERT_EQUAL(
		member_int(json_object_get(json_array_get(json_object_get(j, "keys"), 0), "totals"),
			   "prompt_tokens"),
		20 + 40);
	json_decref(j);
	free(days);
	free(rows);
	/* With a key: k2's bob row alone. */
	f.key_id = "k2";
	CU_ASSERT_EQUAL_FATAL(usage_days(st, &f, &days, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 1);
	CU_ASSERT_STRING_EQUAL(days[0].key_id, "k2");
	CU_ASSERT_EQUAL(days[0].prompt_tokens, 30);
	free(days);
	/* An account with no rows (or none of this key's): nothing. */
	f.account = "carol";
	f.key_id = NULL;
	CU_ASSERT_EQUAL(usage_days(st, &f, &days, &n), 0);
	CU_ASSERT_EQUAL(n, 0);
	CU_ASSERT_EQUAL(usage_recent(st, &f, 10, &rows, &nr), 0);
	CU_ASSERT_EQUAL(nr, 0);
	f.account = "alice";
	f.key_id = "k2";
	CU_ASSERT_EQUAL(usage_days(st, &f, &days, &n), 0);
	CU_ASSERT_EQUAL(n, 1);
	free(days);
	/* A name longer than the ledger keeps is refused, never cut into another. */
	f.account = "abcdefghijabcdefghijabcdefghijabc";
	CU_ASSERT_EQUAL(usage_days(st, &f, &days, &n), -EINVAL);
	CU_ASSERT_EQUAL(usage_recent(st, &f, 10, &rows, &nr), -EINVAL);
	/* No account: every row, those without one included. */
	CU_ASSERT_EQUAL(usage_recent(st, NULL, 100, &rows, &nr), 0);
	CU_ASSERT_EQUAL(nr, ARRAY_SIZE(rec));
	free(rows);
	buf_release(&b);
	usage_store_free(st);
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "append and read back", test_append_read },
		{ "refusals counted a row a minute", test_refusals },
		{ "per-day sums", test_days },
		{ "long names cut at a UTF-8 boundary", test_long_names },
		{ "forged huge counts are capped", test_huge_counts },
		{ "a failed read spares the writer", test_read_failure_spares_writer },
		{ "requests_per_minute windows", test_quota_minute },
		{ "requests_per_day windows", test_quota_day },
		{ "tokens_per_day", test_quota_tokens },
		{ "tokens_per_day reservations and their expiry", test_quota_holds },
		{ "a refused run gives its request back", test_quota_refund },
		{ "a quota across 6 processes", test_quota_processes },
		{ "a quota across threads", test_quota_threads },
		{ "tokens_per_day across 6 processes stays within a reservation",
		  test_quota_holds_processes },
		{ "a version 1 database is migrated", test_migrate_v1 },
		{ "a version 2 database is migrated to 3 (accounts)", test_migrate_v2 },
		{ "accounts: days, refusals, by_account, recent", test_accounts },
		{ "?account=: one account's rows", test_account_filter },
		{ "a fresh store opened by 16 processes at once, 10 times", test_open_together },
		{ "a store opened while another holds a lock past the busy timeout",
		  test_open_while_locked },
		{ "retention pruning", test_retention },
		{ "file modes 0600, no symlink", test_modes },
		{ "descriptors close-on-exec", test_cloexec },
		{ "schema: no content column", test_schema },
		{ "unavailable: a directory as the file", test_unavailable_dir },
		{ "unavailable: OLP_HOME missing or read-only", test_unavailable_home },
		{ "bad arguments", test_bad_args },
		{ "a day parsed: real days only", test_day_parse },
		{ "a day's JSON, with its key and without", test_day_json },
		{ "the report's JSON (/v1/usage)", test_report_json },
		{ NULL, NULL },
	};
	int fails;

	if (!mkdtemp(tmproot)) {
		perror("mkdtemp");
		return 1;
	}
	fails = ts_cunit_run("usage", tests);
	if (!fails) {
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf -- '%s'", tmproot);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", tmproot);
	}
	return ts_exit_status(fails);
}
