/* usage: the quota counters (usage.h, docs/adr/0020-usage-store.md,
 * 0026-ledger-fails-closed.md). A key's requests are counted in its fixed UTC minute and
 * day (quota_windows), its tokens in its day, and the tokens a request under way may
 * spend are reserved (quota_holds) until the request's record settles them or a refund
 * gives them back. Check and count are one write transaction on db.c's connection
 * (internal.h). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <sqlite3.h>

#include "common/common.h"
#include "usage/internal.h"
#include "usage/usage.h"
#include "common/banned.h"

enum win_kind { WIN_MINUTE = 0, WIN_DAY = 1 };

/* Drop a reservation (settled or given back): SQLite's result code. */
int usage_hold_drop(struct usage_store *st, int64_t hold_id)
{
	sqlite3_stmt *s;

	if (hold_id <= 0)
		return SQLITE_OK;
	s = usage_stmt_get(st, ST_HOLD_DROP);
	sqlite3_bind_int64(s, 1, hold_id);
	return usage_stmt_run(s);
}

/* What a key counted in its minute and its day. */
struct win_counts {
	int64_t min_requests;
	int64_t day_requests;
	int64_t day_tokens;
	int64_t day_held; /* reserved by requests under way (quota_holds alive at now) */
};

static void bind_windows(sqlite3_stmt *s, const char *key_id, int64_t now_ms)
{
	usage_bind_text(s, 1, key_id, USAGE_KEY_ID_MAX);
	sqlite3_bind_int64(s, 2, usage_floor_to(now_ms, MINUTE_MS));
	sqlite3_bind_int64(s, 3, usage_floor_to(now_ms, DAY_MS));
}

/* The key's current minute and day at now_ms (missing windows count 0), and what its
 * requests under way hold of the day: SQLite's result code. */
static int win_get(struct usage_store *st, const char *key_id, int64_t now_ms, struct win_counts *c)
{
	sqlite3_stmt *s = usage_stmt_get(st, ST_WIN_GET);
	int rc;

	bind_windows(s, key_id, now_ms);
	memset(c, 0, sizeof(*c));
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		if (sqlite3_column_int(s, 0) == WIN_MINUTE) {
			c->min_requests = sqlite3_column_int64(s, 1);
		} else {
			c->day_requests = sqlite3_column_int64(s, 1);
			c->day_tokens = sqlite3_column_int64(s, 2);
		}
	}
	sqlite3_reset(s);
	if (rc != SQLITE_DONE)
		return rc;
	s = usage_stmt_get(st, ST_HELD);
	usage_bind_text(s, 1, key_id, USAGE_KEY_ID_MAX);
	sqlite3_bind_int64(s, 2, usage_floor_to(now_ms, DAY_MS));
	sqlite3_bind_int64(s, 3, now_ms);
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW)
		c->day_held = sqlite3_column_int64(s, 0);
	sqlite3_reset(s);
	return rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* Count one request in the key's minute and day. */
static int win_take(struct usage_store *st, const char *key_id, int64_t now_ms)
{
	sqlite3_stmt *s = usage_stmt_get(st, ST_WIN_TAKE);

	bind_windows(s, key_id, now_ms);
	return usage_stmt_run(s);
}

/* Reserve c->tokens of the key's day until now_ms + c->ttl_ms; c->hold_id its id. */
static int hold_add(struct usage_store *st, const char *key_id, int64_t now_ms,
		    struct usage_claim *c)
{
	sqlite3_stmt *s = usage_stmt_get(st, ST_HOLD_ADD);
	int rc;

	usage_bind_text(s, 1, key_id, USAGE_KEY_ID_MAX);
	sqlite3_bind_int64(s, 2, usage_floor_to(now_ms, DAY_MS));
	sqlite3_bind_int64(s, 3, usage_row_tokens(c->tokens));
	sqlite3_bind_int64(s, 4, now_ms + (int64_t)(c->ttl_ms ? c->ttl_ms : DAY_MS));
	rc = usage_stmt_run(s);
	if (rc == SQLITE_OK)
		c->hold_id = sqlite3_last_insert_rowid(st->db);
	return rc;
}

/* Whole seconds from now_ms to end_ms, rounded up, at least 1. */
static unsigned secs_until(int64_t now_ms, int64_t end_ms)
{
	int64_t d = end_ms - now_ms;

	return d <= 0 ? 1 : (unsigned)((d + 999) / 1000);
}

static void refuse(struct usage_verdict *v, const char *limit, int64_t value, int64_t used,
		   int64_t now_ms, int64_t end_ms)
{
	v->allowed = false;
	v->limit = limit;
	v->limit_value = value;
	v->used = used;
	v->retry_after = secs_until(now_ms, end_ms);
}

/* The verdict of q on what the key counted (c): v stays allowed when no limit is reached. */
static void judge(const struct usage_quota *q, const struct win_counts *c, int64_t now_ms,
		  struct usage_verdict *v)
{
	int64_t minute = usage_floor_to(now_ms, MINUTE_MS), day = usage_floor_to(now_ms, DAY_MS);
	int64_t tokens = c->day_tokens + c->day_held;

	if (q->requests_per_day > 0 && c->day_requests >= q->requests_per_day)
		refuse(v, "requests_per_day", q->requests_per_day, c->day_requests, now_ms,
		       day + DAY_MS);
	else if (q->tokens_per_day > 0 && tokens >= q->tokens_per_day)
		refuse(v, "tokens_per_day", q->tokens_per_day, tokens, now_ms, day + DAY_MS);
	else if (q->requests_per_minute > 0 && c->min_requests >= q->requests_per_minute)
		refuse(v, "requests_per_minute", q->requests_per_minute, c->min_requests, now_ms,
		       minute + MINUTE_MS);
}

int usage_quota_take(struct usage_store *st, const char *key_id, const struct usage_quota *q,
		     int64_t now_ms, struct usage_verdict *v)
{
	return usage_quota_claim(st, key_id, q, now_ms, NULL, v);
}

/* What a claim's transaction works on. */
struct claim_tx {
	const char *key_id;
	const struct usage_quota *q;
	int64_t now_ms;
	struct usage_claim *claim;
	struct usage_verdict *v;
};

/* Check and count in one write transaction (usage_tx_locked takes the database's write lock
 * first, so two workers cannot both read "2 of 3" and both go ahead). */
static int claim_body(struct usage_store *st, void *ctx)
{
	struct claim_tx *t = ctx;
	struct win_counts c;
	int rc;

	rc = win_get(st, t->key_id, t->now_ms, &c);
	if (rc != SQLITE_OK)
		return rc;
	judge(t->q, &c, t->now_ms, t->v);
	if (!t->v->allowed)
		return USAGE_TX_NOTHING;
	rc = win_take(st, t->key_id, t->now_ms);
	if (rc == SQLITE_OK && t->q->tokens_per_day > 0 && t->claim->tokens > 0)
		rc = hold_add(st, t->key_id, t->now_ms, t->claim);
	return rc;
}

int usage_quota_claim(struct usage_store *st, const char *key_id, const struct usage_quota *q,
		      int64_t now_ms, struct usage_claim *claim, struct usage_verdict *v)
{
	struct usage_claim none = { 0 };
	struct claim_tx t;
	int err;

	if (v)
		*v = (struct usage_verdict){ .allowed = true };
	if (!claim)
		claim = &none;
	claim->hold_id = 0;
	claim->counted = false;
	if (!st || !key_id || !*key_id || !q || !v) {
		if (v)
			v->allowed = false;
		return -EINVAL;
	}
	if (!usage_quota_any(q))
		return 0;
	if (st->pg)
		return usage_pg_claim(st, key_id, q, now_ms, claim, v);
	if (!now_ms)
		now_ms = wall_ms();
	claim->minute_ms = usage_floor_to(now_ms, MINUTE_MS);
	claim->day_ms = usage_floor_to(now_ms, DAY_MS);
	t = (struct claim_tx){ .key_id = key_id, .q = q, .now_ms = now_ms, .claim = claim, .v = v };
	err = usage_tx_run(st, "checking a quota", claim_body, &t, 0);
	if (err < 0) {
		/* Fail closed (usage.h): a count that cannot be written is no quota kept. */
		*v = (struct usage_verdict){ .allowed = false };
		claim->hold_id = 0;
		return err;
	}
	claim->counted = err == 0; /* 1: refused, nothing written */
	return 0;
}

/* What a refund's transaction works on. */
struct refund_tx {
	const char *key_id;
	const struct usage_claim *c;
};

static int refund_body(struct usage_store *st, void *ctx)
{
	const struct refund_tx *t = ctx;
	sqlite3_stmt *s;
	int rc;

	if (t->c->counted) {
		s = usage_stmt_get(st, ST_WIN_REFUND);
		usage_bind_text(s, 1, t->key_id, USAGE_KEY_ID_MAX);
		sqlite3_bind_int64(s, 2, t->c->minute_ms);
		sqlite3_bind_int64(s, 3, t->c->day_ms);
		rc = usage_stmt_run(s);
		if (rc != SQLITE_OK)
			return rc;
	}
	return usage_hold_drop(st, t->c->hold_id);
}

int usage_quota_refund(struct usage_store *st, const char *key_id, struct usage_claim *c)
{
	int err;

	if (!st || !key_id || !*key_id || !c)
		return -EINVAL;
	if (!c->counted && c->hold_id <= 0)
		return 0;
	if (st->pg)
		return usage_pg_refund(st, key_id, c);
	err = usage_tx_run(st, "giving a quota back", refund_body,
			   &(struct refund_tx){ .key_id = key_id, .c = c }, 0);
	if (err)
		return err;
	c->counted = false;
	c->hold_id = 0;
	return 0;
}

int usage_quota_state(struct usage_store *st, const char *key_id, int64_t now_ms,
		      struct usage_quota_state *out)
{
	struct win_counts c;
	int rc, err;

	if (out)
		*out = (struct usage_quota_state){ 0 };
	if (!st || !key_id || !*key_id || !out)
		return -EINVAL;
	if (st->pg)
		return usage_pg_state(st, key_id, now_ms, out);
	if (!now_ms)
		now_ms = wall_ms();
	pthread_mutex_lock(&st->lock);
	err = usage_db_ready(st);
	if (err)
		goto out_unlock;
	rc = win_get(st, key_id, now_ms, &c);
	if (rc != SQLITE_OK) {
		err = usage_db_failed(st, "reading a quota", rc);
		goto out_unlock;
	}
	out->requests_this_minute = c.min_requests;
	out->requests_today = c.day_requests;
	out->tokens_today = c.day_tokens;
	out->tokens_reserved = c.day_held;
out_unlock:
	pthread_mutex_unlock(&st->lock);
	return err;
}
