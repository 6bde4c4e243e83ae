/* usage: the ledger, the quota windows and the concurrency leases in the shared PostgreSQL
 * store of several hosts (usage.h, docs/adr/0034-several-hosts-one-postgresql.md). This
 * file holds the "usage" schema, opening and closing the store's side of a usage store,
 * its health, and the quota checks; the ledger's queue, writer thread, reads and import
 * are in pg_ledger.c, the leases in lease.c.
 *
 * Exact across hosts: a quota check is one statement, the function olp_quota_claim, so
 * one round trip and its own transaction. It upserts the key's day window (INSERT ... ON
 * CONFLICT DO UPDATE), which takes that row's lock: every check of the key, from any
 * host, waits there for the one before to commit; then it reads the minute, the day and
 * the reservations as they are now (READ COMMITTED: each statement of the function sees
 * what committed before it), judges, and counts only when allowed. Before the lock, the
 * same reading without it: a key already over its limit is refused there, writing
 * nothing (a refusal seen in committed counts is a true one: counts only grow within a
 * window but for a refund, and a refund committed later is later). The windows are the
 * database's clock's (now_ms 0), so hosts whose clocks differ still share one minute.
 *
 * The database away: every check fails with -ECONNREFUSED at once (store_conn_get does
 * not wait on a dead database) and the caller refuses the request (ADR 0026); the store
 * retries a connection at most once a second, so checks work again within about a second
 * of its return. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "store/store.h"
#include "usage/internal.h"
#include "usage/pg.h"
#include "usage/usage.h"
#include "common/banned.h"

/* Version 1 of the "usage" module. Every column is a number or a name, never content, a
 * token or a hash (as SQLite's, db.c). olp_requests.src_rowid: the row's id in the
 * usage.db it was imported from (usage_pg_import), NULL for the rows written here; with
 * host it makes a re-run of the import copy nothing twice. */
static const char schema_v1[] =
	"CREATE TABLE olp_requests ("
	" id bigserial PRIMARY KEY,"
	" host text NOT NULL,"
	" ts_ms bigint NOT NULL,"
	" key_id text NOT NULL,"
	" provider text,"
	" model text,"
	" status integer NOT NULL,"
	" prompt_tokens bigint NOT NULL,"
	" completion_tokens bigint NOT NULL,"
	" cached_tokens bigint NOT NULL,"
	" duration_ms bigint NOT NULL,"
	" ttfb_ms bigint NOT NULL,"
	" start integer NOT NULL,"
	" count bigint NOT NULL DEFAULT 1,"
	" src_rowid bigint,"
	" UNIQUE (host, src_rowid));"
	"CREATE INDEX olp_requests_ts ON olp_requests (ts_ms);"
	"CREATE INDEX olp_requests_key_ts ON olp_requests (key_id, ts_ms);"
	"CREATE TABLE olp_quota_windows ("
	" key_id text NOT NULL,"
	" kind smallint NOT NULL,"
	" start_ms bigint NOT NULL,"
	" requests bigint NOT NULL,"
	" tokens bigint NOT NULL,"
	" PRIMARY KEY (key_id, kind, start_ms));"
	"CREATE TABLE olp_quota_holds ("
	" id bigserial PRIMARY KEY,"
	" key_id text NOT NULL,"
	" day_ms bigint NOT NULL,"
	" tokens bigint NOT NULL,"
	" expires_ms bigint NOT NULL);"
	"CREATE INDEX olp_quota_holds_key ON olp_quota_holds (key_id, day_ms);"
	"CREATE TABLE olp_leases ("
	" key_id text NOT NULL,"
	" slot integer NOT NULL,"
	" holder text NOT NULL,"
	" expires_at timestamptz NOT NULL,"
	" PRIMARY KEY (key_id, slot));"
	"CREATE INDEX olp_leases_holder ON olp_leases (holder);"
	/* The quota check (see the file's comment). p_now 0: the database's clock. Pass 1
	 * reads without a lock and returns a refusal it finds (nothing written, no commit to
	 * flush); pass 2 locks the day's row and decides for real. Each pass reads the
	 * windows and the holds in one statement (one snapshot). */
	"CREATE FUNCTION olp_quota_claim(p_key text, p_now bigint, p_rpm bigint, p_rpd bigint,"
	" p_tpd bigint, p_tokens bigint, p_ttl bigint, OUT o_allowed boolean, OUT o_limit text,"
	" OUT o_value bigint, OUT o_used bigint, OUT o_now bigint, OUT o_minute bigint,"
	" OUT o_day bigint, OUT o_hold bigint) LANGUAGE plpgsql AS $f$\n"
	"DECLARE v_dreq bigint; v_dtok bigint; v_mreq bigint; v_held bigint;\n"
	"BEGIN\n"
	" o_now := CASE WHEN p_now <> 0 THEN p_now"
	"  ELSE (extract(epoch FROM clock_timestamp()) * 1000)::bigint END;\n"
	" o_minute := o_now - ((o_now % 60000) + 60000) % 60000;\n"
	" o_day := o_now - ((o_now % 86400000) + 86400000) % 86400000;\n"
	" o_allowed := true; o_hold := 0;\n"
	" FOR pass IN 1..2 LOOP\n"
	"  IF pass = 2 THEN\n"
	"   INSERT INTO olp_quota_windows AS w (key_id, kind, start_ms, requests, tokens)"
	"    VALUES (p_key, 1, o_day, 0, 0) ON CONFLICT (key_id, kind, start_ms)"
	"    DO UPDATE SET requests = w.requests;\n"
	"  END IF;\n"
	"  SELECT coalesce(max(w.requests) FILTER (WHERE w.kind = 1), 0),"
	"   coalesce(max(w.tokens) FILTER (WHERE w.kind = 1), 0),"
	"   coalesce(max(w.requests) FILTER (WHERE w.kind = 0), 0),"
	"   CASE WHEN p_tpd > 0 THEN (SELECT coalesce(sum(h.tokens), 0) FROM olp_quota_holds h"
	"    WHERE h.key_id = p_key AND h.day_ms = o_day AND h.expires_ms > o_now) ELSE 0 END"
	"   INTO v_dreq, v_dtok, v_mreq, v_held FROM olp_quota_windows w WHERE w.key_id = p_key"
	"   AND ((w.kind = 0 AND w.start_ms = o_minute) OR (w.kind = 1 AND w.start_ms = o_day));\n"
	"  IF p_rpd > 0 AND v_dreq >= p_rpd THEN\n"
	"   o_allowed := false; o_limit := 'requests_per_day'; o_value := p_rpd;"
	"   o_used := v_dreq;\n"
	"  ELSIF p_tpd > 0 AND v_dtok + v_held >= p_tpd THEN\n"
	"   o_allowed := false; o_limit := 'tokens_per_day'; o_value := p_tpd;"
	"   o_used := v_dtok + v_held;\n"
	"  ELSIF p_rpm > 0 AND v_mreq >= p_rpm THEN\n"
	"   o_allowed := false; o_limit := 'requests_per_minute'; o_value := p_rpm;"
	"   o_used := v_mreq;\n"
	"  END IF;\n"
	"  IF NOT o_allowed THEN RETURN; END IF;\n"
	" END LOOP;\n"
	" UPDATE olp_quota_windows w SET requests = w.requests + 1"
	"  WHERE w.key_id = p_key AND w.kind = 1 AND w.start_ms = o_day;\n"
	" INSERT INTO olp_quota_windows AS w (key_id, kind, start_ms, requests, tokens)"
	"  VALUES (p_key, 0, o_minute, 1, 0) ON CONFLICT (key_id, kind, start_ms)"
	"  DO UPDATE SET requests = w.requests + 1;\n"
	" IF p_tpd > 0 AND p_tokens > 0 THEN\n"
	"  INSERT INTO olp_quota_holds (key_id, day_ms, tokens, expires_ms)"
	"   VALUES (p_key, o_day, p_tokens, o_now + p_ttl) RETURNING id INTO o_hold;\n"
	" END IF;\n"
	"END\n$f$;"
	/* A claim given back: the day's row first, as olp_quota_claim locks it, then the
	 * minute's (the other order could deadlock with a check of the same key). */
	"CREATE FUNCTION olp_quota_refund(p_key text, p_minute bigint, p_day bigint,"
	" p_counted boolean, p_hold bigint) RETURNS void LANGUAGE plpgsql AS $f$\n"
	"BEGIN\n"
	" IF p_counted THEN\n"
	"  UPDATE olp_quota_windows w SET requests = greatest(w.requests - 1, 0)"
	"   WHERE w.key_id = p_key AND w.kind = 1 AND w.start_ms = p_day;\n"
	"  UPDATE olp_quota_windows w SET requests = greatest(w.requests - 1, 0)"
	"   WHERE w.key_id = p_key AND w.kind = 0 AND w.start_ms = p_minute;\n"
	" END IF;\n"
	" DELETE FROM olp_quota_holds h WHERE h.id = p_hold;\n"
	"END\n$f$;"
	/* A lease (lease.c): under the key's advisory lock, the expired ones go, and the
	 * lowest free slot is taken when fewer than p_max are held. -1: all are. */
	"CREATE FUNCTION olp_lease_take(p_key text, p_holder text, p_max integer, p_ttl bigint)"
	" RETURNS integer LANGUAGE plpgsql AS $f$\n"
	"DECLARE v_n integer; v_slot integer;\n"
	"BEGIN\n"
	" PERFORM pg_advisory_xact_lock(hashtext('olp_leases'), hashtext(p_key));\n"
	" DELETE FROM olp_leases l WHERE l.key_id = p_key AND l.expires_at < clock_timestamp();\n"
	" SELECT count(*) INTO v_n FROM olp_leases l WHERE l.key_id = p_key;\n"
	" IF v_n >= p_max THEN RETURN -1; END IF;\n"
	" SELECT s INTO v_slot FROM generate_series(0, v_n) s WHERE NOT EXISTS"
	"  (SELECT 1 FROM olp_leases l WHERE l.key_id = p_key AND l.slot = s) ORDER BY s LIMIT 1;\n"
	" INSERT INTO olp_leases (key_id, slot, holder, expires_at)"
	"  VALUES (p_key, v_slot, p_holder, clock_timestamp() + p_ttl * interval '1 "
	"millisecond');\n"
	" RETURN v_slot;\n"
	"END\n$f$;";

/* Version 2 (ADR 0037): the provider's account a request used; NULL for a request no
 * provider took, and for the rows written before. */
static const char schema_v2[] = "ALTER TABLE olp_requests ADD COLUMN account text;";

static const char *const schema_steps[] = { schema_v1, schema_v2 };
static const struct store_schema schema = { .module = "usage",
					    .step = schema_steps,
					    .n = ARRAY_SIZE(schema_steps) };

const struct store_schema *usage_pg_schema(void)
{
	return &schema;
}

void usage_key_cut(char *out, size_t n, const char *key_id)
{
	size_t len = strnlen(key_id, USAGE_KEY_ID_MAX + 1);

	if (len > USAGE_KEY_ID_MAX) {
		len = USAGE_KEY_ID_MAX;
		while (len > 0 && ((unsigned char)key_id[len] & 0xc0) == 0x80)
			len--;
	}
	if (len >= n)
		len = n - 1;
	memcpy(out, key_id, len);
	out[len] = '\0';
}

/* ---- failures and health ---------------------------------------------------------------- */

int usage_pg_failed(struct usage_store *st, const char *what, int err, const char *detail)
{
	int64_t none = 0;

	pthread_mutex_lock(&st->lock);
	usage_note_failure(st, what, err, detail);
	pthread_mutex_unlock(&st->lock);
	atomic_store(&st->last_err, err);
	atomic_compare_exchange_strong(&st->failing_since_ms, &none, wall_ms());
	return err;
}

void usage_pg_ok(struct usage_store *st)
{
	atomic_store(&st->failing_since_ms, 0);
}

/* 0 when the database holds this build's "usage" schema (checked once, then trusted;
 * again after a failure), else -errno (counted and logged). */
int usage_pg_schema_ready(struct usage_store *st)
{
	unsigned found = 0;
	char detail[96];
	int err;

	if (atomic_load(&st->pgs->schema_ok))
		return 0;
	err = store_schema_check(st->pg, &schema, &found);
	if (!err) {
		atomic_store(&st->pgs->schema_ok, true);
		return 0;
	}
	if (err == -ENOENT)
		(void)snprintf(detail, sizeof(detail), "no usage schema: run olp-keys store init");
	else if (err == -EPROTO)
		(void)snprintf(
			detail, sizeof(detail),
			"usage schema at version %u, this olp knows %u: run olp-keys store init "
			"or upgrade olp",
			found, schema.n);
	else
		(void)snprintf(detail, sizeof(detail), "the store cannot be reached");
	return usage_pg_failed(st, "checking the store's schema", err, detail);
}

bool usage_pg_available(const struct usage_store *st)
{
	struct store_health h;

	store_health(st->pg, &h);
	return h.ok && atomic_load(&st->pgs->schema_ok);
}

void usage_pg_health(const struct usage_store *st, struct usage_health *out)
{
	struct usage_store *m = (struct usage_store *)st; /* atomics are read, not changed */
	struct store_health h;
	int64_t own = atomic_load(&m->failing_since_ms);

	store_health(st->pg, &h);
	out->ok = h.ok && !own;
	out->failing_since_ms = own;
	if (!h.ok && h.failing_since_ms && (!own || h.failing_since_ms < own))
		out->failing_since_ms = h.failing_since_ms;
	if (!out->ok && !out->failing_since_ms)
		out->failing_since_ms = wall_ms();
	out->last_err = atomic_load(&m->last_err);
	if (!h.ok && !out->last_err)
		out->last_err = -ECONNREFUSED;
	out->failures = atomic_load(&m->failures);
}

/* ---- statements ------------------------------------------------------------------------- */

PGresult *usage_pg_exec(struct usage_store *st, const char *what, const char *sql, int n,
			const char *const *params, int *errp)
{
	struct buf err = BUF_INIT;
	bool broken = false;
	PGresult *r;
	PGconn *c;
	int e;

	*errp = usage_pg_schema_ready(st);
	if (*errp)
		return NULL;
	c = store_conn_get(st->pg, USAGE_PG_WAIT_MS);
	if (!c) {
		e = errno == ETIMEDOUT ? -ETIMEDOUT : -ECONNREFUSED;
		*errp = usage_pg_failed(st, what, e,
					e == -ETIMEDOUT ? "every connection busy"
							: "the store is away");
		return NULL;
	}
	r = store_exec(st->pg, c, sql, n, params, &err, &broken);
	store_conn_put(st->pg, c, broken);
	if (!r) {
		e = broken ? -ECONNREFUSED : -EIO;
		/* The schema may have changed under us (an upgrade, a restore): check again. */
		if (!broken)
			atomic_store(&st->pgs->schema_ok, false);
		*errp = usage_pg_failed(st, what, e, err.data);
	} else {
		usage_pg_ok(st);
	}
	buf_release(&err);
	return r;
}

int64_t usage_pg_int(const PGresult *r, int row, int col)
{
	if (PQgetisnull(r, row, col))
		return 0;
	return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

/* ---- quotas ----------------------------------------------------------------------------- */

/* The verdict of olp_quota_claim's row r into v and c. */
static void claim_read(const PGresult *r, struct usage_claim *c, struct usage_verdict *v)
{
	int64_t now = usage_pg_int(r, 0, 4);
	int64_t end;

	c->minute_ms = usage_pg_int(r, 0, 5);
	c->day_ms = usage_pg_int(r, 0, 6);
	c->hold_id = usage_pg_int(r, 0, 7);
	if (!strcmp(PQgetvalue(r, 0, 0), "t")) {
		c->counted = true;
		return;
	}
	v->allowed = false;
	v->limit = "requests_per_day";
	end = c->day_ms + DAY_MS;
	if (!strcmp(PQgetvalue(r, 0, 1), "tokens_per_day")) {
		v->limit = "tokens_per_day";
	} else if (!strcmp(PQgetvalue(r, 0, 1), "requests_per_minute")) {
		v->limit = "requests_per_minute";
		end = c->minute_ms + MINUTE_MS;
	}
	v->limit_value = usage_pg_int(r, 0, 2);
	v->used = usage_pg_int(r, 0, 3);
	v->retry_after = end - now <= 0 ? 1 : (unsigned)((end - now + 999) / 1000);
}

int usage_pg_claim(struct usage_store *st, const char *key_id, const struct usage_quota *q,
		   int64_t now_ms, struct usage_claim *c, struct usage_verdict *v)
{
	char key[USAGE_KEY_ID_MAX + 1], now[24], rpm[24], rpd[24], tpd[24], tok[24], ttl[24];
	const char *p[7] = { key, now, rpm, rpd, tpd, tok, ttl };
	PGresult *r;
	int err;

	usage_key_cut(key, sizeof(key), key_id);
	(void)snprintf(now, sizeof(now), "%" PRId64, now_ms);
	(void)snprintf(rpm, sizeof(rpm), "%" PRId64, q->requests_per_minute);
	(void)snprintf(rpd, sizeof(rpd), "%" PRId64, q->requests_per_day);
	(void)snprintf(tpd, sizeof(tpd), "%" PRId64, q->tokens_per_day);
	(void)snprintf(tok, sizeof(tok), "%" PRId64, usage_row_tokens(c->tokens));
	(void)snprintf(ttl, sizeof(ttl), "%" PRIu64, c->ttl_ms ? c->ttl_ms : (uint64_t)DAY_MS);
	r = usage_pg_exec(st, "checking a quota",
			  "SELECT * FROM olp_quota_claim($1, $2::bigint, $3::bigint, $4::bigint,"
			  " $5::bigint, $6::bigint, $7::bigint)",
			  7, p, &err);
	if (!r || PQntuples(r) != 1) {
		PQclear(r);
		/* Fail closed (usage.h): a count that cannot be written is no quota kept. */
		*v = (struct usage_verdict){ .allowed = false };
		c->hold_id = 0;
		c->counted = false;
		return err ? err : -EIO;
	}
	claim_read(r, c, v);
	PQclear(r);
	return 0;
}

int usage_pg_refund(struct usage_store *st, const char *key_id, struct usage_claim *c)
{
	char key[USAGE_KEY_ID_MAX + 1], minute[24], day[24], hold[24];
	const char *p[5] = { key, minute, day, c->counted ? "t" : "f", hold };
	PGresult *r;
	int err;

	usage_key_cut(key, sizeof(key), key_id);
	(void)snprintf(minute, sizeof(minute), "%" PRId64, c->minute_ms);
	(void)snprintf(day, sizeof(day), "%" PRId64, c->day_ms);
	(void)snprintf(hold, sizeof(hold), "%" PRId64, c->hold_id);
	/* One statement: the request out of both windows and its reservation dropped, or
	 * neither. */
	r = usage_pg_exec(
		st, "giving a quota back",
		"SELECT olp_quota_refund($1, $2::bigint, $3::bigint, $4::boolean, $5::bigint)", 5,
		p, &err);
	if (!r)
		return err;
	PQclear(r);
	c->counted = false;
	c->hold_id = 0;
	return 0;
}

int usage_pg_state(struct usage_store *st, const char *key_id, int64_t now_ms,
		   struct usage_quota_state *out)
{
	char key[USAGE_KEY_ID_MAX + 1], now[24];
	const char *p[2] = { key, now };
	PGresult *r;
	int err;

	usage_key_cut(key, sizeof(key), key_id);
	(void)snprintf(now, sizeof(now), "%" PRId64, now_ms);
	r = usage_pg_exec(
		st, "reading a quota",
		"WITH t AS (SELECT n, n - ((n % 60000) + 60000) % 60000 AS m,"
		" n - ((n % 86400000) + 86400000) % 86400000 AS d FROM (SELECT CASE WHEN"
		" $2::bigint <> 0 THEN $2::bigint ELSE (extract(epoch FROM clock_timestamp())"
		" * 1000)::bigint END AS n) x)"
		" SELECT (SELECT coalesce(sum(requests), 0) FROM olp_quota_windows w, t"
		"  WHERE w.key_id = $1 AND w.kind = 0 AND w.start_ms = t.m),"
		" (SELECT coalesce(sum(requests), 0) FROM olp_quota_windows w, t"
		"  WHERE w.key_id = $1 AND w.kind = 1 AND w.start_ms = t.d),"
		" (SELECT coalesce(sum(tokens), 0) FROM olp_quota_windows w, t"
		"  WHERE w.key_id = $1 AND w.kind = 1 AND w.start_ms = t.d),"
		" (SELECT coalesce(sum(tokens), 0) FROM olp_quota_holds h, t"
		"  WHERE h.key_id = $1 AND h.day_ms = t.d AND h.expires_ms > t.n)",
		2, p, &err);
	if (!r)
		return err;
	if (PQntuples(r) == 1) {
		out->requests_this_minute = usage_pg_int(r, 0, 0);
		out->requests_today = usage_pg_int(r, 0, 1);
		out->tokens_today = usage_pg_int(r, 0, 2);
		out->tokens_reserved = usage_pg_int(r, 0, 3);
	}
	PQclear(r);
	return 0;
}

/* ---- the store's side of a usage store ------------------------------------------------- */

int usage_pg_open(struct usage_store *st, const struct usage_options *opt)
{
	char host[256] = "";

	st->pg = opt->store;
	st->pgs = xcalloc(1, sizeof(*st->pgs));
	if (opt->host && *opt->host)
		(void)snprintf(host, sizeof(host), "%s", opt->host);
	else if (gethostname(host, sizeof(host) - 1) < 0 || !*host)
		(void)snprintf(host, sizeof(host), "localhost");
	st->pgs->host = xstrdup(host);
	st->pgs->cap = opt->store_buffer_rows ? opt->store_buffer_rows : USAGE_DEFAULT_BUFFER_ROWS;
	st->pgs->flush_ms = opt->flush_ms ? opt->flush_ms : USAGE_PG_FLUSH_MS;
	/* Checked now so that a worker started against a database at the wrong version says
	 * so in its first lines; a database away is checked again at first use. */
	(void)usage_pg_schema_ready(st);
	return usage_pg_writer_start(st);
}

void usage_pg_free(struct usage_store *st)
{
	if (!st->pgs)
		return;
	usage_pg_writer_stop(st, st->pgs->flush_ms);
	free(st->pgs->host);
	free(st->pgs);
	st->pgs = NULL;
	st->pg = NULL;
}
