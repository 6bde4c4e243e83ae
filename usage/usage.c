/* usage: the ledger's records (usage.h, docs/adr/0020-usage-store.md): a row per request,
 * refusals counted in a row per key and minute, written on the writer's connection with
 * the day's tokens and the request's reservation settled in the same commit; and the
 * readers' queries (days, recent rows) on the read-only connection (db.c, internal.h). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <sqlite3.h>

#include "common/common.h"
#include "usage/internal.h"
#include "usage/usage.h"
#include "common/banned.h"

const char *usage_start_name(enum usage_start s)
{
	switch (s) {
	case USAGE_START_COLD: return "cold";
	case USAGE_START_WARM: return "warm";
	case USAGE_START_PRESTART: return "prestart";
	case USAGE_START_NONE:
	default: return "none";
	}
}

static int64_t row_ms(uint64_t ms)
{
	return ms > USAGE_ROW_DURATION_MAX_MS ? (int64_t)USAGE_ROW_DURATION_MAX_MS : (int64_t)ms;
}

/* A request that cost nothing: refused before any provider started, or by a full one. */
static bool is_refusal(const struct usage_record *r, int64_t p, int64_t c)
{
	return r->start == USAGE_START_NONE && r->status >= 400 && p == 0 && c == 0 &&
	       usage_row_tokens(r->cached_tokens) == 0;
}

/* Bind r to ST_INSERT's or ST_REFUSAL_ADD's parameters (ts its row's time). */
static void bind_row(sqlite3_stmt *s, const struct usage_record *r, int64_t ts, int64_t p,
		     int64_t c, uint64_t ttfb_ms)
{
	sqlite3_bind_int64(s, 1, ts);
	usage_bind_text(s, 2, r->key_id, USAGE_KEY_ID_MAX);
	usage_bind_text(s, 3, r->provider, sizeof(((struct usage_row *)0)->provider) - 1);
	usage_bind_text(s, 4, r->model, sizeof(((struct usage_row *)0)->model) - 1);
	sqlite3_bind_int(s, 5, r->status);
	sqlite3_bind_int64(s, 6, p);
	sqlite3_bind_int64(s, 7, c);
	sqlite3_bind_int64(s, 8, usage_row_tokens(r->cached_tokens));
	sqlite3_bind_int64(s, 9, row_ms(r->duration_ms));
	sqlite3_bind_int64(s, 10, row_ms(ttfb_ms));
	sqlite3_bind_int(s, 11, (int)r->start);
	usage_bind_text(s, 12, r->account && *r->account ? r->account : NULL,
			USAGE_ACCOUNT_SIZE - 1);
}

/* The row (or the refusal's count in its minute's row), inside the caller's transaction:
 * SQLite's result code. */
static int row_put(struct usage_store *st, const struct usage_record *r, int64_t ts, int64_t p,
		   int64_t c)
{
	sqlite3_stmt *s;
	int rc;

	if (is_refusal(r, p, c)) {
		ts = usage_floor_to(ts, MINUTE_MS);
		s = usage_stmt_get(st, ST_REFUSAL_ADD);
		bind_row(s, r, ts, p, c, 0);
		rc = usage_stmt_run(s);
		if (rc != SQLITE_OK || sqlite3_changes(st->db) > 0)
			return rc;
		s = usage_stmt_get(st, ST_INSERT);
		bind_row(s, r, ts, p, c, 0);
		return usage_stmt_run(s);
	}
	s = usage_stmt_get(st, ST_INSERT);
	bind_row(s, r, ts, p, c, r->ttfb_ms);
	return usage_stmt_run(s);
}

/* What a record's transaction works on. */
struct record_tx {
	const struct usage_record *r;
	int64_t ts, p, c;
};

static int record_body(struct usage_store *st, void *ctx)
{
	const struct record_tx *t = ctx;
	sqlite3_stmt *s;
	int rc;

	rc = row_put(st, t->r, t->ts, t->p, t->c);
	if (rc != SQLITE_OK)
		return rc;
	if (t->p + t->c > 0) {
		s = usage_stmt_get(st, ST_ADD_TOKENS);
		usage_bind_text(s, 1, t->r->key_id, USAGE_KEY_ID_MAX);
		sqlite3_bind_int64(s, 2, usage_floor_to(t->ts, DAY_MS));
		sqlite3_bind_int64(s, 3, t->p + t->c);
		rc = usage_stmt_run(s);
		if (rc != SQLITE_OK)
			return rc;
	}
	/* The real count is in: the reservation made for it goes, in the same commit. */
	return usage_hold_drop(st, t->r->hold_id);
}

int usage_record_add(struct usage_store *st, const struct usage_record *r)
{
	struct record_tx t;

	if (!st || !r || !r->key_id || !*r->key_id)
		return -EINVAL;
	if (st->pg)
		return usage_pg_record_add(st, r);
	t = (struct record_tx){ .r = r,
				.ts = r->ts_ms ? r->ts_ms : wall_ms(),
				.p = usage_row_tokens(r->prompt_tokens),
				.c = usage_row_tokens(r->completion_tokens) };
	return usage_tx_run(st, "recording a request", record_body, &t, USAGE_TX_PRUNE);
}

static void copy_col(char *dst, size_t n, sqlite3_stmt *s, int col)
{
	const unsigned char *t = sqlite3_column_text(s, col);

	snprintf(dst, n, "%s", t ? (const char *)t : "");
}

/* An account longer than the ledger keeps would be cut into another name: refused. */
static bool filter_ok(const struct usage_filter *f)
{
	return !f || !f->account || strlen(f->account) < USAGE_ACCOUNT_SIZE;
}

/* Bind a filter to ?1 (key), ?2 (since) and ?4 (account; ?3 is the recent rows' limit). */
static void bind_filter(sqlite3_stmt *s, const struct usage_filter *f)
{
	if (f && f->key_id)
		usage_bind_text(s, 1, f->key_id, USAGE_KEY_ID_MAX);
	else
		sqlite3_bind_null(s, 1);
	sqlite3_bind_int64(s, 2, f && f->since_ms > 0 ? f->since_ms : INT64_MIN);
	if (f && f->account)
		usage_bind_text(s, 4, f->account, USAGE_ACCOUNT_SIZE - 1);
	else
		sqlite3_bind_null(s, 4);
}

int usage_days(struct usage_store *st, const struct usage_filter *f, struct usage_day **out,
	       size_t *n)
{
	struct usage_day *days = NULL;
	size_t len = 0, cap = 0;
	sqlite3_stmt *s;
	int rc, err;

	if (out)
		*out = NULL;
	if (n)
		*n = 0;
	if (!st || !out || !n || !filter_ok(f))
		return -EINVAL;
	if (st->pg)
		return usage_pg_days(st, f, out, n);
	pthread_mutex_lock(&st->rlock);
	err = usage_reader_ready(st);
	if (err)
		goto out_unlock;
	s = usage_reader_stmt(st->rdays);
	bind_filter(s, f);
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		struct usage_day *d;

		if (len == cap) {
			cap = cap ? 2 * cap : 16;
			days = xreallocarray(days, cap, sizeof(*days));
		}
		d = &days[len++];
		memset(d, 0, sizeof(*d));
		copy_col(d->key_id, sizeof(d->key_id), s, 0);
		copy_col(d->provider, sizeof(d->provider), s, 1);
		copy_col(d->day, sizeof(d->day), s, 2);
		d->requests = sqlite3_column_int64(s, 3);
		d->errors = sqlite3_column_int64(s, 4);
		d->prompt_tokens = sqlite3_column_int64(s, 5);
		d->completion_tokens = sqlite3_column_int64(s, 6);
		d->cached_tokens = sqlite3_column_int64(s, 7);
		d->duration_ms = (uint64_t)sqlite3_column_int64(s, 8);
		d->warm = sqlite3_column_int64(s, 9);
		d->prestart = sqlite3_column_int64(s, 10);
		copy_col(d->account, sizeof(d->account), s, 11);
	}
	sqlite3_reset(s);
	if (rc != SQLITE_DONE) {
		free(days);
		err = usage_reader_failed(st, "reading the ledger", rc);
		goto out_unlock;
	}
	*out = days;
	*n = len;
out_unlock:
	pthread_mutex_unlock(&st->rlock);
	return err;
}

int usage_recent(struct usage_store *st, const struct usage_filter *f, size_t limit,
		 struct usage_row **out, size_t *n)
{
	struct usage_row *rows = NULL;
	size_t len = 0, cap = 0;
	sqlite3_stmt *s;
	int rc, err;

	if (out)
		*out = NULL;
	if (n)
		*n = 0;
	if (!st || !out || !n || !filter_ok(f))
		return -EINVAL;
	if (!limit)
		return 0;
	if (limit > 100000)
		limit = 100000; /* a page, not the whole ledger in memory */
	if (st->pg)
		return usage_pg_recent(st, f, limit, out, n);
	pthread_mutex_lock(&st->rlock);
	err = usage_reader_ready(st);
	if (err)
		goto out_unlock;
	s = usage_reader_stmt(st->rrecent);
	bind_filter(s, f);
	sqlite3_bind_int64(s, 3, (int64_t)limit);
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		struct usage_row *r;

		if (len == cap) {
			cap = cap ? 2 * cap : 16;
			rows = xreallocarray(rows, cap, sizeof(*rows));
		}
		r = &rows[len++];
		memset(r, 0, sizeof(*r));
		r->ts_ms = sqlite3_column_int64(s, 0);
		copy_col(r->key_id, sizeof(r->key_id), s, 1);
		copy_col(r->provider, sizeof(r->provider), s, 2);
		copy_col(r->model, sizeof(r->model), s, 3);
		r->status = sqlite3_column_int(s, 4);
		r->prompt_tokens = sqlite3_column_int64(s, 5);
		r->completion_tokens = sqlite3_column_int64(s, 6);
		r->cached_tokens = sqlite3_column_int64(s, 7);
		r->duration_ms = (uint64_t)sqlite3_column_int64(s, 8);
		r->ttfb_ms = (uint64_t)sqlite3_column_int64(s, 9);
		r->start = (enum usage_start)sqlite3_column_int(s, 10);
		r->count = sqlite3_column_int64(s, 11);
		copy_col(r->account, sizeof(r->account), s, 12);
	}
	sqlite3_reset(s);
	if (rc != SQLITE_DONE) {
		free(rows);
		err = usage_reader_failed(st, "reading the ledger", rc);
		goto out_unlock;
	}
	*out = rows;
	*n = len;
out_unlock:
	pthread_mutex_unlock(&st->rlock);
	return err;
}
