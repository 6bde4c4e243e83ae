/* store: versioned schemas, one per module (store.h). The table olp_schema holds a row per
 * module with the version its tables are at; olp-keys store init takes each module to the
 * version this build knows, in one transaction, and a worker refuses a database at any
 * other version (an older olp must not write tables a newer one changed; a newer one
 * needs the upgrade run first, by a role that may change the schema). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "store/internal.h"
#include "common/banned.h"

/* pg_advisory_xact_lock's key: any constant no other user of the database takes. */
#define SCHEMA_LOCK_KEY "7301966551"

static const char schema_table[] = "CREATE TABLE IF NOT EXISTS olp_schema ("
				   " module text PRIMARY KEY,"
				   " version integer NOT NULL CHECK (version >= 0),"
				   " updated_at timestamptz NOT NULL DEFAULT now())";

/* The version of module in olp_schema (0: no row), or -1 (err set). */
static int module_version(struct store_db *db, PGconn *c, const char *module, struct buf *err)
{
	const char *p[1] = { module };
	PGresult *r;
	int v = 0;

	r = store_exec(db, c, "SELECT version FROM olp_schema WHERE module = $1", 1, p, err, NULL);
	if (!r)
		return -1;
	if (PQntuples(r) == 1)
		v = atoi(PQgetvalue(r, 0, 0));
	PQclear(r);
	return v;
}

static int simple(PGconn *c, const char *sql, struct buf *msg)
{
	PGresult *r = PQexec(c, sql);
	ExecStatusType s = PQresultStatus(r);

	if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) {
		buf_adds(msg, PQresultErrorMessage(r));
		PQclear(r);
		return -1;
	}
	PQclear(r);
	return 0;
}

static int apply_one(struct store_db *db, PGconn *c, const struct store_schema *s, struct buf *msg)
{
	char ver[16];
	const char *p[2] = { s->module, ver };
	PGresult *r;
	int from = module_version(db, c, s->module, msg);
	unsigned v;

	if (from < 0)
		return -1;
	if ((unsigned)from > s->n) {
		buf_addf(msg,
			 "%s: the database is at version %d, newer than this olp knows (%u): "
			 "upgrade olp first\n",
			 s->module, from, s->n);
		return -1;
	}
	if ((unsigned)from == s->n) {
		buf_addf(msg, "%s: version %u, current\n", s->module, s->n);
		return 0;
	}
	for (v = (unsigned)from; v < s->n; v++) {
		if (simple(c, s->step[v], msg)) {
			buf_addf(msg, "(%s: version %u -> %u)\n", s->module, v, v + 1);
			return -1;
		}
	}
	(void)snprintf(ver, sizeof(ver), "%u", s->n);
	r = store_exec(db, c,
		       "INSERT INTO olp_schema (module, version) VALUES ($1, $2::integer)"
		       " ON CONFLICT (module) DO UPDATE SET version = EXCLUDED.version,"
		       " updated_at = now()",
		       2, p, msg, NULL);
	if (!r)
		return -1;
	PQclear(r);
	buf_addf(msg, "%s: version %d -> %u\n", s->module, from, s->n);
	return 0;
}

static int grant(PGconn *c, const char *role, struct buf *msg)
{
	char *id = PQescapeIdentifier(c, role, strlen(role));
	struct buf sql = BUF_INIT;
	int ret;

	if (!id) {
		buf_adds(msg, PQerrorMessage(c));
		return -1;
	}
	buf_addf(&sql,
		 "GRANT USAGE ON SCHEMA public TO %s;"
		 "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO %s;"
		 "GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO %s;"
		 "REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON olp_schema FROM %s;",
		 id, id, id, id);
	ret = simple(c, sql.data, msg);
	if (!ret)
		buf_addf(msg, "granted data rights to %s\n", role);
	buf_release(&sql);
	PQfreemem(id);
	return ret;
}

int store_schema_apply(struct store_db *db, const struct store_schema *const *schemas, size_t n,
		       const char *worker_role, struct buf *msg)
{
	PGconn *c = store_conn_get(db, 5000);
	size_t i;
	int ret = -1;

	if (!c) {
		struct store_health h;

		store_health(db, &h);
		buf_addf(msg, "cannot reach the store %s: %s\n", h.where,
			 *h.last_error ? h.last_error : strerror(errno));
		return -1;
	}
	if (simple(c, "BEGIN", msg) ||
	    simple(c, "SELECT pg_advisory_xact_lock(" SCHEMA_LOCK_KEY ")", msg) ||
	    simple(c, schema_table, msg))
		goto out;
	for (i = 0; i < n; i++)
		if (apply_one(db, c, schemas[i], msg))
			goto out;
	if (worker_role && grant(c, worker_role, msg))
		goto out;
	ret = simple(c, "COMMIT", msg);
out:
	if (ret)
		(void)simple(c, "ROLLBACK", msg);
	store_conn_put(db, c, false);
	return ret;
}

int store_schema_check(struct store_db *db, const struct store_schema *s, unsigned *found)
{
	PGconn *c = store_conn_get(db, 2000);
	struct buf err = BUF_INIT;
	const char *p[1] = { s->module };
	bool broken = false;
	PGresult *r;
	int ret;

	*found = 0;
	if (!c)
		return -errno;
	r = store_exec(db, c, "SELECT version FROM olp_schema WHERE module = $1", 1, p, &err,
		       &broken);
	if (!r) {
		/* 42P01: undefined table, no schema at all yet. */
		ret = !strcmp(store_last_sqlstate(), "42P01") ? -ENOENT
		      : broken				      ? -ECONNREFUSED
							      : -EIO;
		goto out;
	}
	if (PQntuples(r) != 1) {
		ret = -ENOENT;
	} else {
		*found = (unsigned)atoi(PQgetvalue(r, 0, 0));
		ret = *found == s->n ? 0 : -EPROTO;
	}
	PQclear(r);
out:
	store_conn_put(db, c, broken);
	buf_release(&err);
	return ret;
}
