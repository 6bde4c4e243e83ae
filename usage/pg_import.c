/* usage: copying a host's usage.db into the shared PostgreSQL store (usage_pg_import,
 * usage.h; olp-keys migrate calls it, ADR 0034).
 *
 * The ledger's rows are read from a read-only SQLite connection of their own, in rowid
 * order, IMPORT_BATCH at a time, and each batch is inserted in one statement (the batch
 * as a JSON parameter, jsonb_to_recordset) with its host and source rowid, ON CONFLICT
 * (host, src_rowid) DO NOTHING: a row copied before is skipped, so a re-run copies
 * nothing twice and finishes what a failed run began. The quota windows of today and
 * yesterday (what a quota check still reads) are copied the same way, ON CONFLICT DO
 * NOTHING on their key. Reservations of requests under way are not: they lapse. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "common/common.h"
#include "store/store.h"
#include "usage/internal.h"
#include "usage/usage.h"
#include "common/banned.h"

#define IMPORT_BATCH 1000

static const char sql_rows[] =
	"INSERT INTO olp_requests (host, src_rowid, ts_ms, key_id, provider, model, status,"
	" prompt_tokens, completion_tokens, cached_tokens, duration_ms, ttfb_ms, start, count,"
	" account)"
	" SELECT $1, x.i, x.t, x.k, x.p, x.m, x.s, x.pt, x.ct, x.ca, x.d, x.f, x.st, x.n, x.a"
	" FROM jsonb_to_recordset($2::jsonb) AS x(i bigint, t bigint, k text, p text, m text,"
	" s integer, pt bigint, ct bigint, ca bigint, d bigint, f bigint, st integer, n bigint,"
	" a text)"
	" ON CONFLICT (host, src_rowid) DO NOTHING";
static const char sql_windows[] =
	"INSERT INTO olp_quota_windows (key_id, kind, start_ms, requests, tokens)"
	" SELECT x.k, x.w, x.s, x.r, x.t FROM jsonb_to_recordset($1::jsonb)"
	" AS x(k text, w smallint, s bigint, r bigint, t bigint)"
	" ON CONFLICT (key_id, kind, start_ms) DO NOTHING";

static void json_text(struct buf *b, sqlite3_stmt *s, int col)
{
	const unsigned char *t = sqlite3_column_text(s, col);

	if (!t)
		buf_adds(b, "null");
	else
		buf_add_json_str(b, (const char *)t, (size_t)sqlite3_column_bytes(s, col));
}

/* Run sql with params on dst: rows it inserted, or -1 with the reason in err. */
static int64_t pg_insert(struct store_db *dst, PGconn *c, const char *sql, int n,
			 const char *const *p, struct buf *err)
{
	PGresult *r = store_exec(dst, c, sql, n, p, err, NULL);
	int64_t k;

	if (!r)
		return -1;
	k = strtoll(PQcmdTuples(r), NULL, 10);
	PQclear(r);
	return k;
}

/* One batch of ledger rows after *last (rowid): their count, 0 at the end, -1 (err). */
static int import_rows(sqlite3_stmt *s, int64_t *last, const char *host, struct store_db *dst,
		       PGconn *c, struct usage_import_report *out, struct buf *err)
{
	struct buf j = BUF_INIT;
	const char *p[2] = { host, NULL };
	int rc, n = 0;
	int64_t k;

	sqlite3_reset(s);
	sqlite3_bind_int64(s, 1, *last);
	sqlite3_bind_int(s, 2, IMPORT_BATCH);
	buf_addch(&j, '[');
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		*last = sqlite3_column_int64(s, 0);
		buf_addf(&j, "%s{\"i\":%" PRId64 ",\"t\":%" PRId64 ",\"k\":", n ? "," : "", *last,
			 (int64_t)sqlite3_column_int64(s, 1));
		json_text(&j, s, 2);
		buf_adds(&j, ",\"p\":");
		json_text(&j, s, 3);
		buf_adds(&j, ",\"m\":");
		json_text(&j, s, 4);
		buf_adds(&j, ",\"a\":");
		json_text(&j, s, 13);
		buf_addf(&j,
			 ",\"s\":%d,\"pt\":%lld,\"ct\":%lld,\"ca\":%lld,\"d\":%lld,\"f\":%lld,"
			 "\"st\":%d,\"n\":%lld}",
			 sqlite3_column_int(s, 5), sqlite3_column_int64(s, 6),
			 sqlite3_column_int64(s, 7), sqlite3_column_int64(s, 8),
			 sqlite3_column_int64(s, 9), sqlite3_column_int64(s, 10),
			 sqlite3_column_int(s, 11), sqlite3_column_int64(s, 12));
		n++;
	}
	buf_addch(&j, ']');
	if (rc != SQLITE_DONE) {
		buf_addf(err, "reading usage.db: %s", sqlite3_errstr(rc));
		n = -1;
	} else if (n) {
		p[1] = j.data;
		k = pg_insert(dst, c, sql_rows, 2, p, err);
		if (k < 0)
			n = -1;
		else
			out->rows_read += (uint64_t)n, out->rows_copied += (uint64_t)k;
	}
	buf_release(&j);
	return n;
}

static int import_windows(sqlite3 *db, struct store_db *dst, PGconn *c,
			  struct usage_import_report *out, struct buf *err)
{
	struct buf j = BUF_INIT;
	const char *p[1];
	sqlite3_stmt *s = NULL;
	int rc, ret = 0;
	int64_t k;

	rc = sqlite3_prepare_v2(db,
				"SELECT key_id, kind, start_ms, requests, tokens FROM quota_windows"
				" WHERE start_ms >= ?1",
				-1, &s, NULL);
	if (rc != SQLITE_OK) {
		buf_addf(err, "reading usage.db: %s", sqlite3_errmsg(db));
		return -1;
	}
	sqlite3_bind_int64(s, 1, usage_floor_to(wall_ms(), DAY_MS) - DAY_MS);
	buf_addch(&j, '[');
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		buf_adds(&j, out->windows_read ? ",{\"k\":" : "{\"k\":");
		json_text(&j, s, 0);
		buf_addf(&j, ",\"w\":%d,\"s\":%lld,\"r\":%lld,\"t\":%lld}",
			 sqlite3_column_int(s, 1), sqlite3_column_int64(s, 2),
			 sqlite3_column_int64(s, 3), sqlite3_column_int64(s, 4));
		out->windows_read++;
	}
	buf_addch(&j, ']');
	if (rc != SQLITE_DONE) {
		buf_addf(err, "reading usage.db: %s", sqlite3_errmsg(db));
		ret = -1;
	} else if (out->windows_read) {
		p[0] = j.data;
		k = pg_insert(dst, c, sql_windows, 1, p, err);
		if (k < 0)
			ret = -1;
		else
			out->windows_copied = (uint64_t)k;
	}
	sqlite3_finalize(s);
	buf_release(&j);
	return ret;
}

int usage_pg_import(struct usage_store *src, struct store_db *dst, const char *host,
		    struct usage_import_report *out, struct buf *err)
{
	char name[256] = "";
	sqlite3 *db = NULL;
	sqlite3_stmt *s = NULL;
	PGconn *c = NULL;
	int64_t last = 0;
	int n, ret = -EIO;

	if (out)
		*out = (struct usage_import_report){ 0 };
	if (!src || src->pg || !src->path || !dst || !out) {
		buf_adds(err, "usage_pg_import: the source must be an SQLite usage store");
		return -EINVAL;
	}
	if (host && *host)
		(void)snprintf(name, sizeof(name), "%s", host);
	else if (gethostname(name, sizeof(name) - 1) < 0 || !*name)
		(void)snprintf(name, sizeof(name), "localhost");
	if (sqlite3_open_v2(src->path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOFOLLOW, NULL) !=
		    SQLITE_OK ||
	    sqlite3_prepare_v2(
		    db,
		    "SELECT id, ts_ms, key_id, provider, model, status, prompt_tokens,"
		    " completion_tokens, cached_tokens, duration_ms, ttfb_ms, start, count,"
		    " account FROM requests WHERE id > ?1 ORDER BY id LIMIT ?2",
		    -1, &s, NULL) != SQLITE_OK) {
		buf_addf(err, "%s: %s", src->path, db ? sqlite3_errmsg(db) : "cannot open");
		goto out;
	}
	sqlite3_busy_timeout(db, 2000);
	c = store_conn_get(dst, 5000);
	if (!c) {
		buf_adds(err, "the store cannot be reached");
		ret = -ECONNREFUSED;
		goto out;
	}
	while ((n = import_rows(s, &last, name, dst, c, out, err)) > 0)
		;
	if (n == 0 && !import_windows(db, dst, c, out, err))
		ret = 0;
out:
	if (c)
		store_conn_put(dst, c, PQstatus(c) != CONNECTION_OK);
	sqlite3_finalize(s);
	sqlite3_close_v2(db);
	return ret;
}
