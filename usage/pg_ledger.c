/* usage: the ledger in the shared PostgreSQL store (usage.h, ADR 0034): the queue of rows a
 * process's requests add, the writer thread that writes them in batches, the retention's
 * pruning, and the readers' queries (every host's rows).
 *
 * A request never waits on the database for its ledger row: usage_record_add copies the
 * row into a bounded queue (usage_options.store_buffer_rows) and returns. The writer
 * thread takes up to WRITER_BATCH rows from its head and writes them in one transaction:
 * the rows in one statement (the batch as a JSON parameter, jsonb_to_recordset: no SQL
 * built from data), each refusal into its minute's row, the day's tokens per key, and the
 * reservations the rows settle. A row leaves the queue only once its batch committed, so a
 * database that is away keeps the rows queued and they are written when it returns
 * (retried every second). A full queue drops the new row, counts it (usage_dropped) and
 * logs that once a minute at most: never silent. A batch the server refuses for its
 * content (no row should be: strings are valid UTF-8 by construction) is dropped the same
 * way rather than retried forever. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "store/store.h"
#include "usage/internal.h"
#include "usage/pg.h"
#include "usage/usage.h"
#include "common/banned.h"

#define WRITER_BATCH 500
#define WRITER_RETRY_MS 1000u
#define DROP_LOG_EVERY_MS 60000u
#define PRUNE_EVERY_MS 3600000u
#define WINDOW_KEEP_MS (2 * DAY_MS)

/* ---- the queue -------------------------------------------------------------------------- */

/* s, cut to n - 1 bytes at a UTF-8 boundary, into out; any byte that is not valid UTF-8
 * becomes '?', so that the database (UTF8) never refuses a batch for one row's name. */
static void copy_name(char *out, size_t n, const char *s)
{
	size_t len = strnlen(s, n);

	if (len >= n) {
		len = n - 1;
		while (len > 0 && ((unsigned char)s[len] & 0xc0) == 0x80)
			len--;
	}
	memcpy(out, s, len);
	out[len] = '\0';
	if (!utf8_valid(out, len))
		for (size_t i = 0; i < len; i++)
			if ((unsigned char)out[i] >= 0x80)
				out[i] = '?';
}

static int64_t row_ms(uint64_t ms)
{
	return ms > USAGE_ROW_DURATION_MAX_MS ? (int64_t)USAGE_ROW_DURATION_MAX_MS : (int64_t)ms;
}

static void row_fill(struct usage_pg_row *q, const struct usage_record *r)
{
	memset(q, 0, sizeof(*q));
	q->ts_ms = r->ts_ms ? r->ts_ms : wall_ms();
	copy_name(q->key_id, USAGE_KEY_ID_MAX + 1, r->key_id);
	q->has_provider = r->provider != NULL;
	if (r->provider)
		copy_name(q->provider, sizeof(q->provider), r->provider);
	q->has_model = r->model != NULL;
	if (r->model)
		copy_name(q->model, sizeof(q->model), r->model);
	if (r->account)
		copy_name(q->account, sizeof(q->account), r->account);
	q->status = r->status;
	q->prompt = usage_row_tokens(r->prompt_tokens);
	q->completion = usage_row_tokens(r->completion_tokens);
	q->cached = usage_row_tokens(r->cached_tokens);
	q->duration_ms = row_ms(r->duration_ms);
	q->ttfb_ms = row_ms(r->ttfb_ms);
	q->start = (int)r->start;
	q->hold_id = r->hold_id;
}

/* A row that cost nothing: counted in its key's row of the minute (as usage.c does). */
static bool row_is_refusal(const struct usage_pg_row *q)
{
	return q->start == USAGE_START_NONE && q->status >= 400 && !q->prompt && !q->completion &&
	       !q->cached;
}

/* Room for one more row in the ring (under lock): false when it holds cap. */
static bool ring_room(struct usage_pg *p)
{
	struct usage_pg_row *n;
	size_t size;

	if (p->len >= p->cap)
		return false;
	if (p->len < p->ring_size)
		return true;
	size = p->ring_size ? 2 * p->ring_size : 64;
	if (size > p->cap)
		size = p->cap;
	n = xreallocarray(NULL, size, sizeof(*n));
	for (size_t i = 0; p->ring_size && i < p->len; i++)
		n[i] = p->ring[(p->head + i) % p->ring_size];
	free(p->ring);
	p->ring = n;
	p->ring_size = size;
	p->head = 0;
	return true;
}

int usage_pg_record_add(struct usage_store *st, const struct usage_record *r)
{
	struct usage_pg *p = st->pgs;
	uint64_t now, n;

	pthread_mutex_lock(&p->lock);
	if (ring_room(p)) {
		row_fill(&p->ring[(p->head + p->len) % p->ring_size], r);
		p->len++;
		pthread_cond_signal(&p->more);
		pthread_mutex_unlock(&p->lock);
		return 0;
	}
	atomic_fetch_add(&st->dropped, 1);
	p->drops_unlogged++;
	now = mono_ms();
	if (p->last_drop_log_ms && now - p->last_drop_log_ms < DROP_LOG_EVERY_MS) {
		pthread_mutex_unlock(&p->lock);
		return 0;
	}
	n = p->drops_unlogged;
	p->drops_unlogged = 0;
	p->last_drop_log_ms = now;
	pthread_mutex_unlock(&p->lock);
	log_warnx(NULL,
		  "usage: the ledger's queue is full (%zu rows waiting for the store): %" PRIu64
		  " row(s) dropped since the last report",
		  p->cap, n);
	return 0;
}

/* ---- a batch ---------------------------------------------------------------------------- */

static void json_name(struct buf *b, const char *s, bool has)
{
	if (has)
		buf_add_json_str(b, s, strlen(s));
	else
		buf_adds(b, "null");
}

/* The batch's rows (not refusals) as a JSON array for jsonb_to_recordset; their day tokens
 * as another; the reservations they settle as an array literal. */
static void batch_json(const struct usage_pg_row *rows, size_t n, struct buf *rj, struct buf *tj,
		       struct buf *holds)
{
	bool first_r = true, first_t = true, first_h = true;

	buf_addch(rj, '[');
	buf_addch(tj, '[');
	buf_addch(holds, '{');
	for (size_t i = 0; i < n; i++) {
		const struct usage_pg_row *q = &rows[i];

		if (q->hold_id > 0) {
			buf_addf(holds, "%s%" PRId64, first_h ? "" : ",", q->hold_id);
			first_h = false;
		}
		if (q->prompt + q->completion > 0) {
			buf_addf(tj, "%s{\"k\":", first_t ? "" : ",");
			buf_add_json_str(tj, q->key_id, strlen(q->key_id));
			buf_addf(tj, ",\"d\":%" PRId64 ",\"n\":%" PRId64 "}",
				 usage_floor_to(q->ts_ms, DAY_MS), q->prompt + q->completion);
			first_t = false;
		}
		if (row_is_refusal(q))
			continue;
		buf_addf(rj, "%s{\"t\":%" PRId64 ",\"k\":", first_r ? "" : ",", q->ts_ms);
		buf_add_json_str(rj, q->key_id, strlen(q->key_id));
		buf_adds(rj, ",\"p\":");
		json_name(rj, q->provider, q->has_provider);
		buf_adds(rj, ",\"m\":");
		json_name(rj, q->model, q->has_model);
		buf_adds(rj, ",\"a\":");
		json_name(rj, q->account, q->account[0] != '\0');
		buf_addf(rj,
			 ",\"s\":%d,\"pt\":%" PRId64 ",\"ct\":%" PRId64 ",\"ca\":%" PRId64
			 ",\"d\":%" PRId64 ",\"f\":%" PRId64 ",\"st\":%d}",
			 q->status, q->prompt, q->completion, q->cached, q->duration_ms, q->ttfb_ms,
			 q->start);
		first_r = false;
	}
	buf_addch(rj, ']');
	buf_addch(tj, ']');
	buf_addch(holds, '}');
}

static const char sql_rows[] =
	"INSERT INTO olp_requests (host, ts_ms, key_id, provider, model, status, prompt_tokens,"
	" completion_tokens, cached_tokens, duration_ms, ttfb_ms, start, account)"
	" SELECT $1, x.t, x.k, x.p, x.m, x.s, x.pt, x.ct, x.ca, x.d, x.f, x.st, x.a"
	" FROM jsonb_to_recordset($2::jsonb) AS x(t bigint, k text, p text, m text, s integer,"
	" pt bigint, ct bigint, ca bigint, d bigint, f bigint, st integer, a text)";
/* In key order, so that two hosts' writers lock the same day rows in the same order. */
static const char sql_tokens[] =
	"INSERT INTO olp_quota_windows (key_id, kind, start_ms, requests, tokens)"
	" SELECT x.k, 1, x.d, 0, sum(x.n) FROM jsonb_to_recordset($1::jsonb)"
	" AS x(k text, d bigint, n bigint) GROUP BY x.k, x.d ORDER BY x.k, x.d"
	" ON CONFLICT (key_id, kind, start_ms)"
	" DO UPDATE SET tokens = olp_quota_windows.tokens + excluded.tokens";
static const char sql_holds[] = "DELETE FROM olp_quota_holds WHERE id = ANY($1::bigint[])";
/* A refusal into this host's row of its key, minute, status, provider, model and account,
 * or a new
 * one. One row only: the worker processes of a host (one host name) write at once, so two
 * of them may both have inserted the minute's row; counting into each would count twice
 * (SQLite never sees that: its writers take turns). */
static const char sql_refusal[] =
	"WITH u AS (UPDATE olp_requests SET count = count + 1, duration_ms = duration_ms + "
	"$7::bigint WHERE id = (SELECT id FROM olp_requests"
	" WHERE host = $1 AND key_id = $3 AND ts_ms = $2::bigint AND status = $6::integer"
	" AND start = 0 AND provider IS NOT DISTINCT FROM $4::text"
	" AND model IS NOT DISTINCT FROM $5::text AND account IS NOT DISTINCT FROM $8::text"
	" AND prompt_tokens = 0 AND completion_tokens = 0"
	" AND cached_tokens = 0 ORDER BY id LIMIT 1) RETURNING 1)"
	" INSERT INTO olp_requests (host, ts_ms, key_id, provider, model, status, prompt_tokens,"
	" completion_tokens, cached_tokens, duration_ms, ttfb_ms, start, account)"
	" SELECT $1, $2::bigint, $3, $4::text, $5::text, $6::integer, 0, 0, 0, $7::bigint, 0, 0,"
	" $8::text WHERE NOT EXISTS (SELECT 1 FROM u)";

struct batch_ctx {
	struct store_db *db;
	PGconn *c;
	struct buf err;
	bool broken;
};

static int batch_run(struct batch_ctx *b, const char *sql, int n, const char *const *params)
{
	PGresult *r = store_exec(b->db, b->c, sql, n, params, &b->err, &b->broken);

	if (!r)
		return -1;
	PQclear(r);
	return 0;
}

static int batch_refusal(struct batch_ctx *b, const char *host, const struct usage_pg_row *q)
{
	char ts[24], status[16], dur[24];
	const char *p[8] = { host,
			     ts,
			     q->key_id,
			     q->has_provider ? q->provider : NULL,
			     q->has_model ? q->model : NULL,
			     status,
			     dur,
			     q->account[0] ? q->account : NULL };

	(void)snprintf(ts, sizeof(ts), "%" PRId64, usage_floor_to(q->ts_ms, MINUTE_MS));
	(void)snprintf(status, sizeof(status), "%d", q->status);
	(void)snprintf(dur, sizeof(dur), "%" PRId64, q->duration_ms);
	return batch_run(b, sql_refusal, 8, p);
}

/* The statements of one batch, inside the caller's transaction. */
static int batch_body(struct batch_ctx *b, const char *host, const struct usage_pg_row *rows,
		      size_t n)
{
	struct buf rj = BUF_INIT, tj = BUF_INIT, holds = BUF_INIT;
	const char *p[2];
	int ret = 0;

	batch_json(rows, n, &rj, &tj, &holds);
	p[0] = host;
	p[1] = rj.data;
	if (rj.len > 2)
		ret = batch_run(b, sql_rows, 2, p);
	for (size_t i = 0; !ret && i < n; i++)
		if (row_is_refusal(&rows[i]))
			ret = batch_refusal(b, host, &rows[i]);
	p[0] = tj.data;
	if (!ret && tj.len > 2)
		ret = batch_run(b, sql_tokens, 1, p);
	p[0] = holds.data;
	if (!ret && holds.len > 2)
		ret = batch_run(b, sql_holds, 1, p);
	buf_release(&rj);
	buf_release(&tj);
	buf_release(&holds);
	return ret;
}

/* Whether a failed batch is worth trying again as it is: the connection or the server
 * failed, a deadlock or a serialization failure, a lock timeout (classes 08, 40, 53, 55,
 * 57, 58), or the schema is missing or older. A statement refused for its data is not. */
static bool batch_retryable(bool broken)
{
	const char *s = store_last_sqlstate();

	return broken || !*s || !strncmp(s, "08", 2) || !strncmp(s, "40", 2) ||
	       !strncmp(s, "53", 2) || !strncmp(s, "55", 2) || !strncmp(s, "57", 2) ||
	       !strncmp(s, "58", 2) || !strncmp(s, "42", 2);
}

/* Write rows[0..n) in one transaction: 0, -EAGAIN (try again later) or -EINVAL (the
 * server refused the batch's content). Failures counted and logged. */
static int batch_write(struct usage_store *st, const struct usage_pg_row *rows, size_t n)
{
	struct batch_ctx b = { .db = st->pg, .err = BUF_INIT };
	int err = usage_pg_schema_ready(st);

	if (err)
		return -EAGAIN;
	b.c = store_conn_get(st->pg, USAGE_PG_WAIT_MS);
	if (!b.c) {
		usage_pg_failed(st, "writing ledger rows", -ECONNREFUSED, "the store is away");
		return -EAGAIN;
	}
	if (batch_run(&b, "BEGIN", 0, NULL) || batch_body(&b, st->pgs->host, rows, n) ||
	    batch_run(&b, "COMMIT", 0, NULL)) {
		bool retry = batch_retryable(b.broken);

		if (!b.broken)
			PQclear(PQexec(b.c, "ROLLBACK"));
		store_conn_put(st->pg, b.c, b.broken);
		if (!b.broken && !strncmp(store_last_sqlstate(), "42", 2))
			atomic_store(&st->pgs->schema_ok, false);
		usage_pg_failed(st, "writing ledger rows", b.broken ? -ECONNREFUSED : -EIO,
				b.err.data);
		buf_release(&b.err);
		return retry ? -EAGAIN : -EINVAL;
	}
	store_conn_put(st->pg, b.c, false);
	usage_pg_ok(st);
	buf_release(&b.err);
	return 0;
}

/* ---- retention ------------------------------------------------------------------------ */

/* What the retention no longer keeps, every host's (each host's writer does it at its
 * start, as SQLite's first write does, then hourly; the statements are idempotent). A failure is counted and tried next hour. */
static void prune(struct usage_store *st)
{
	char rows[24], wins[24], now[24];
	const char *p[3] = { rows, wins, now };
	int64_t wall = wall_ms();
	PGresult *r;
	int err;

	(void)snprintf(rows, sizeof(rows), "%" PRId64,
		       (int64_t)(wall - (int64_t)st->retention_days * DAY_MS));
	(void)snprintf(wins, sizeof(wins), "%" PRId64,
		       (int64_t)(usage_floor_to(wall, DAY_MS) - WINDOW_KEEP_MS));
	(void)snprintf(now, sizeof(now), "%" PRId64, wall);
	r = usage_pg_exec(
		st, "pruning old rows",
		"WITH a AS (DELETE FROM olp_requests WHERE ts_ms < $1::bigint RETURNING 1),"
		" b AS (DELETE FROM olp_quota_windows WHERE start_ms < $2::bigint"
		" RETURNING 1),"
		" c AS (DELETE FROM olp_quota_holds WHERE expires_ms < $3::bigint"
		" RETURNING 1),"
		/* A dead host's leases of keys no one asked for since. */
		" d AS (DELETE FROM olp_leases WHERE expires_at < now() - interval '1 hour'"
		" RETURNING 1)"
		" SELECT (SELECT count(*) FROM a), (SELECT count(*) FROM b),"
		" (SELECT count(*) FROM c), (SELECT count(*) FROM d)",
		3, p, &err);
	PQclear(r);
}

/* ---- the writer thread ------------------------------------------------------------------ */

/* Wait on cond for ms at most (under p->lock). */
static void timed_wait(struct usage_pg *p, pthread_cond_t *cond, unsigned ms)
{
	struct timespec ts = clock_after_ms(CLOCK_REALTIME, ms);

	(void)pthread_cond_timedwait(cond, &p->lock, &ts);
}

/* One round of the writer: up to WRITER_BATCH rows from the head, written, then taken off
 * the queue. Called and returns with p->lock held. */
static void writer_round(struct usage_store *st, struct usage_pg_row *batch)
{
	struct usage_pg *p = st->pgs;
	size_t n = p->len < WRITER_BATCH ? p->len : WRITER_BATCH;
	int err;

	for (size_t i = 0; i < n; i++)
		batch[i] = p->ring[(p->head + i) % p->ring_size];
	pthread_mutex_unlock(&p->lock);
	err = batch_write(st, batch, n);
	pthread_mutex_lock(&p->lock);
	if (err == -EAGAIN) {
		/* Kept: tried again in a second (or at once when stopping, until the deadline). */
		if (!p->stop)
			timed_wait(p, &p->more, WRITER_RETRY_MS);
		else
			timed_wait(p, &p->done, 100);
		return;
	}
	if (err)
		atomic_fetch_add(&st->dropped, n);
	p->head = (p->head + n) % p->ring_size;
	p->len -= n;
	pthread_cond_broadcast(&p->done);
}

static void *writer_main(void *arg)
{
	struct usage_store *st = arg;
	struct usage_pg *p = st->pgs;
	struct usage_pg_row *batch = xreallocarray(NULL, WRITER_BATCH, sizeof(*batch));

	pthread_mutex_lock(&p->lock);
	for (;;) {
		if (!p->len && !p->stop)
			timed_wait(p, &p->more, WRITER_RETRY_MS);
		if (p->stop && (!p->len || mono_ms() >= p->stop_deadline_ms))
			break;
		if (p->len)
			writer_round(st, batch);
		if (!p->stop && (!p->pruned || mono_ms() - p->last_prune_ms >= PRUNE_EVERY_MS)) {
			p->pruned = true;
			p->last_prune_ms = mono_ms();
			pthread_mutex_unlock(&p->lock);
			prune(st);
			pthread_mutex_lock(&p->lock);
		}
	}
	pthread_mutex_unlock(&p->lock);
	free(batch);
	return NULL;
}

int usage_pg_writer_start(struct usage_store *st)
{
	struct usage_pg *p = st->pgs;
	int err;

	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->more, NULL);
	pthread_cond_init(&p->done, NULL);
	err = pthread_create(&p->writer, NULL, writer_main, st);
	if (err) {
		log_errx(NULL, "usage: cannot start the ledger's writer thread: %s", strerror(err));
		return -err;
	}
	p->started = true;
	return 0;
}

void usage_pg_writer_stop(struct usage_store *st, unsigned flush_ms)
{
	struct usage_pg *p = st->pgs;
	size_t left;

	if (p->started) {
		pthread_mutex_lock(&p->lock);
		p->stop = true;
		p->stop_deadline_ms = mono_ms() + flush_ms;
		pthread_cond_broadcast(&p->more);
		pthread_mutex_unlock(&p->lock);
		pthread_join(p->writer, NULL);
		p->started = false;
	}
	left = p->len;
	if (left) {
		atomic_fetch_add(&st->dropped, left);
		log_warnx(
			NULL,
			"usage: %zu ledger row(s) not written: the store did not take them within "
			"%u ms",
			left, flush_ms);
	}
	free(p->ring);
	p->ring = NULL;
	p->len = 0;
	pthread_cond_destroy(&p->more);
	pthread_cond_destroy(&p->done);
	pthread_mutex_destroy(&p->lock);
}

/* ---- reading the ledger ----------------------------------------------------------------- */

static void filter_params(const struct usage_filter *f, char *key, char *since)
{
	if (f && f->key_id)
		usage_key_cut(key, USAGE_KEY_ID_MAX + 1, f->key_id);
	(void)snprintf(since, 24, "%" PRId64, f && f->since_ms > 0 ? f->since_ms : INT64_MIN);
}

/* The filter's account, as a statement parameter (NULL: every account); its length was
 * checked by usage_days and usage_recent. */
static const char *filter_account(const struct usage_filter *f, char *acc)
{
	if (!f || !f->account)
		return NULL;
	(void)snprintf(acc, USAGE_ACCOUNT_SIZE, "%s", f->account);
	return acc;
}

static void copy_val(char *dst, size_t n, const PGresult *r, int row, int col)
{
	(void)snprintf(dst, n, "%s", PQgetisnull(r, row, col) ? "" : PQgetvalue(r, row, col));
}

int usage_pg_days(struct usage_store *st, const struct usage_filter *f, struct usage_day **out,
		  size_t *n)
{
	char key[USAGE_KEY_ID_MAX + 1], since[24], acc[USAGE_ACCOUNT_SIZE];
	const char *p[3] = { f && f->key_id ? key : NULL, since, filter_account(f, acc) };
	struct usage_day *days;
	PGresult *r;
	int err, rows;

	filter_params(f, key, since);
	r = usage_pg_exec(
		st, "reading the ledger",
		"SELECT key_id, coalesce(provider, ''),"
		" to_char(to_timestamp(ts_ms / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day,"
		" sum(count), sum(CASE WHEN status >= 400 THEN count ELSE 0 END),"
		" sum(prompt_tokens), sum(completion_tokens), sum(cached_tokens), sum(duration_ms),"
		" count(*) FILTER (WHERE start = 2), count(*) FILTER (WHERE start = 3),"
		" coalesce(account, '')"
		" FROM olp_requests WHERE ($1::text IS NULL OR key_id = $1) AND ts_ms >= $2::bigint"
		" AND ($3::text IS NULL OR account = $3)"
		" GROUP BY day, key_id, coalesce(provider, ''), coalesce(account, '')"
		" ORDER BY day, key_id, coalesce(provider, ''), coalesce(account, '')",
		3, p, &err);
	if (!r)
		return err;
	rows = PQntuples(r);
	days = rows ? xcalloc((size_t)rows, sizeof(*days)) : NULL;
	for (int i = 0; i < rows; i++) {
		struct usage_day *d = &days[i];

		copy_val(d->key_id, sizeof(d->key_id), r, i, 0);
		copy_val(d->provider, sizeof(d->provider), r, i, 1);
		copy_val(d->day, sizeof(d->day), r, i, 2);
		d->requests = usage_pg_int(r, i, 3);
		d->errors = usage_pg_int(r, i, 4);
		d->prompt_tokens = usage_pg_int(r, i, 5);
		d->completion_tokens = usage_pg_int(r, i, 6);
		d->cached_tokens = usage_pg_int(r, i, 7);
		d->duration_ms = (uint64_t)usage_pg_int(r, i, 8);
		d->warm = usage_pg_int(r, i, 9);
		d->prestart = usage_pg_int(r, i, 10);
		copy_val(d->account, sizeof(d->account), r, i, 11);
	}
	PQclear(r);
	*out = days;
	*n = (size_t)rows;
	return 0;
}

int usage_pg_recent(struct usage_store *st, const struct usage_filter *f, size_t limit,
		    struct usage_row **out, size_t *n)
{
	char key[USAGE_KEY_ID_MAX + 1], since[24], lim[24], acc[USAGE_ACCOUNT_SIZE];
	const char *p[4] = { f && f->key_id ? key : NULL, since, lim, filter_account(f, acc) };
	struct usage_row *rows;
	PGresult *r;
	int err, nr;

	filter_params(f, key, since);
	(void)snprintf(lim, sizeof(lim), "%zu", limit);
	r = usage_pg_exec(
		st, "reading the ledger",
		"SELECT ts_ms, key_id, coalesce(provider, ''), coalesce(model, ''), status,"
		" prompt_tokens, completion_tokens, cached_tokens, duration_ms, ttfb_ms,"
		" start, count, coalesce(account, '') FROM olp_requests"
		" WHERE ($1::text IS NULL OR key_id = $1) AND ts_ms >= $2::bigint"
		" AND ($4::text IS NULL OR account = $4)"
		" ORDER BY ts_ms DESC, id DESC LIMIT $3::bigint",
		4, p, &err);
	if (!r)
		return err;
	nr = PQntuples(r);
	rows = nr ? xcalloc((size_t)nr, sizeof(*rows)) : NULL;
	for (int i = 0; i < nr; i++) {
		struct usage_row *w = &rows[i];

		w->ts_ms = usage_pg_int(r, i, 0);
		copy_val(w->key_id, sizeof(w->key_id), r, i, 1);
		copy_val(w->provider, sizeof(w->provider), r, i, 2);
		copy_val(w->model, sizeof(w->model), r, i, 3);
		w->status = (int)usage_pg_int(r, i, 4);
		w->prompt_tokens = usage_pg_int(r, i, 5);
		w->completion_tokens = usage_pg_int(r, i, 6);
		w->cached_tokens = usage_pg_int(r, i, 7);
		w->duration_ms = (uint64_t)usage_pg_int(r, i, 8);
		w->ttfb_ms = (uint64_t)usage_pg_int(r, i, 9);
		w->start = (enum usage_start)usage_pg_int(r, i, 10);
		w->count = usage_pg_int(r, i, 11);
		copy_val(w->account, sizeof(w->account), r, i, 12);
	}
	PQclear(r);
	*out = rows;
	*n = (size_t)nr;
	return 0;
}
