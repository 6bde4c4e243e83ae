/* Key management in PostgreSQL (ADR 0034): what keys.c does to the key files, done to the
 * rows of olp_keys, one transaction each; and the copy of a file store into the database
 * (olp-keys migrate). Every statement takes parameters; a name, a note or a provider
 * name is data, never SQL. The trigger of the keys schema (pg.c) sends NOTIFY olp_keys at
 * commit for every change, so the writers here do not. */
#include <errno.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include "auth/internal.h"
#include "store/store.h"
#include "common/banned.h"

#define AUTH_PG_KEYS_WAIT_MS 5000
/* pg_advisory_xact_lock key of key creation (so that two "keygen --owner" runs cannot
 * both see no owner): "olpkeys" in ASCII. */
#define AUTH_PG_CREATE_LOCK "31084746616104307"

/* A transaction on a connection of db. */
struct pg_tx {
	struct store_db *db;
	PGconn *c;
	bool broken;
	struct buf *err;
};

/* Run sql in tx: the result (PQclear it) or NULL (err set). */
static PGresult *tx_exec(struct pg_tx *tx, const char *sql, int n, const char *const *params)
{
	bool broken = false;
	PGresult *r;

	if (tx->err)
		buf_reset(tx->err);
	r = store_exec(tx->db, tx->c, sql, n, params, tx->err, &broken);
	tx->broken |= broken;
	auth_pg_err_line(tx->err);
	return r;
}

/* Run a statement whose result is not needed: 0 or -EIO. */
static int tx_cmd(struct pg_tx *tx, const char *sql)
{
	PGresult *r = tx_exec(tx, sql, 0, NULL);

	PQclear(r);
	return r ? 0 : -EIO;
}

static int tx_begin(struct pg_tx *tx, struct store_db *db, struct buf *err)
{
	*tx = (struct pg_tx){ .db = db, .err = err };
	tx->c = store_conn_get(db, AUTH_PG_KEYS_WAIT_MS);
	if (!tx->c) {
		int e = errno ? errno : ECONNREFUSED;
		struct store_health h;

		store_health(db, &h);
		if (err) {
			buf_reset(err);
			buf_addf(err, "the store %s cannot be reached%s%s", h.where,
				 h.last_error[0] ? ": " : "", h.last_error);
		}
		return -e;
	}
	if (tx_cmd(tx, "BEGIN")) {
		store_conn_put(db, tx->c, true);
		return -EIO;
	}
	return 0;
}

/* COMMIT (commit true) or ROLLBACK, and give the connection back. 0 or -EIO. */
static int tx_end(struct pg_tx *tx, bool commit)
{
	int ret = -EIO;

	if (!tx->broken) {
		if (commit) {
			ret = tx_cmd(tx, "COMMIT");
		} else {
			/* Keep the first failure's message, not ROLLBACK's. */
			struct buf *keep = tx->err;

			tx->err = NULL;
			(void)tx_cmd(tx, "ROLLBACK");
			tx->err = keep;
		}
	}
	store_conn_put(tx->db, tx->c, tx->broken || (ret && commit));
	return commit ? ret : 0;
}

/* The manifest as the text of a jsonb parameter. */
static char *manifest_text(json_t *root)
{
	return json_dumps(root, JSON_COMPACT);
}

/* Write root back as row id's manifest (its token hash from rec). 0 or -EIO. */
static int row_write(struct pg_tx *tx, const char *id, json_t *root)
{
	const char *params[2];
	char *text = manifest_text(root);
	PGresult *r;

	if (!text)
		return -ENOMEM;
	params[0] = id;
	params[1] = text;
	r = tx_exec(tx,
		    "UPDATE olp_keys SET manifest = $2::jsonb, generation = generation + 1,"
		    " updated = now() WHERE id = $1",
		    2, params);
	free(text);
	PQclear(r);
	return r ? 0 : -EIO;
}

int auth_pg_key_update(struct store_db *db, const char *id,
		       int (*edit)(json_t *root, const struct auth_key_record *rec, void *arg),
		       void *arg, struct buf *err)
{
	struct auth_key_record rec = { 0 };
	const char *params[1] = { id };
	json_t *root = NULL;
	const char *why = NULL;
	struct pg_tx tx;
	PGresult *r;
	int ret;

	ret = tx_begin(&tx, db, err);
	if (ret)
		return ret;
	/* The row's lock: a concurrent revoke, set-quota or last_used_at waits for us. */
	r = tx_exec(&tx, "SELECT manifest::text FROM olp_keys WHERE id = $1 FOR UPDATE", 1, params);
	if (!r) {
		ret = -EIO;
	} else if (PQntuples(r) == 0) {
		ret = -ENOENT;
	} else {
		ret = auth_manifest_parse(PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0), id,
					  &root, &rec, &why);
	}
	PQclear(r);
	if (!ret)
		ret = edit(root, &rec, arg);
	if (ret == 1) {
		int w = row_write(&tx, id, root);

		if (!w)
			w = tx_end(&tx, true);
		else
			tx_end(&tx, false);
		if (w)
			ret = w;
	} else {
		tx_end(&tx, false);
	}
	json_decref(root);
	auth_key_record_release(&rec);
	return ret;
}

/* Whether an active owner key is in the table: 0 (in *found) or -EIO. */
static int owner_in_table(struct pg_tx *tx, bool *found)
{
	PGresult *r = tx_exec(tx,
			      "SELECT 1 FROM olp_keys WHERE manifest->>'owner_tier' = 'owner' AND"
			      " coalesce(manifest->'revoked_at', 'null'::jsonb) = 'null'::jsonb"
			      " LIMIT 1",
			      0, NULL);

	if (!r)
		return -EIO;
	*found = PQntuples(r) > 0;
	PQclear(r);
	return 0;
}

int auth_pg_key_insert(struct store_db *db, const char *id, const char *hash_hex, json_t *m,
		       bool owner_check, bool *owner_exists, struct buf *err)
{
	const char *params[3];
	char *text = manifest_text(m);
	struct pg_tx tx;
	PGresult *r;
	int ret;

	*owner_exists = false;
	if (!text)
		return -ENOMEM;
	ret = tx_begin(&tx, db, err);
	if (ret)
		goto out_free;
	r = tx_exec(&tx, "SELECT pg_advisory_xact_lock(" AUTH_PG_CREATE_LOCK ")", 0, NULL);
	ret = r ? 0 : -EIO;
	PQclear(r);
	if (!ret && owner_check)
		ret = owner_in_table(&tx, owner_exists);
	if (ret || *owner_exists) {
		tx_end(&tx, false);
		goto out_free;
	}
	params[0] = id;
	params[1] = hash_hex;
	params[2] = text;
	/* A taken id is a collision of random ids: the caller picks another. */
	r = tx_exec(&tx,
		    "INSERT INTO olp_keys (id, token_hash, manifest) VALUES ($1, $2, $3::jsonb)"
		    " ON CONFLICT (id) DO NOTHING RETURNING id",
		    3, params);
	ret = !r ? -EIO : PQntuples(r) == 1 ? 0 : -EEXIST;
	PQclear(r);
	if (ret)
		tx_end(&tx, false);
	else
		ret = tx_end(&tx, true);
out_free:
	free(text);
	return ret;
}

/* ---- migrate ------------------------------------------------------------------------- */

/* Copy one valid manifest: 1 copied, 0 unchanged, -EIO (err says why). */
static int migrate_one(struct pg_tx *tx, const struct auth_key_record *rec, json_t *root)
{
	char hex[AUTH_HASH_HEX + 1];
	const char *params[3];
	char *text = manifest_text(root);
	PGresult *r;
	int ret;

	if (!text)
		return -ENOMEM;
	auth_hash_to_hex(rec->hash, hex);
	params[0] = rec->id;
	params[1] = hex;
	params[2] = text;
	/* jsonb compares by value: a manifest equal to the row's changes nothing. */
	r = tx_exec(tx,
		    "INSERT INTO olp_keys AS k (id, token_hash, manifest)"
		    " VALUES ($1, $2, $3::jsonb) ON CONFLICT (id) DO UPDATE"
		    " SET token_hash = EXCLUDED.token_hash, manifest = EXCLUDED.manifest,"
		    " generation = k.generation + 1, updated = now()"
		    " WHERE k.manifest IS DISTINCT FROM EXCLUDED.manifest"
		    " OR k.token_hash IS DISTINCT FROM EXCLUDED.token_hash RETURNING id",
		    3, params);
	ret = !r ? -EIO : PQntuples(r);
	PQclear(r);
	free(text);
	sodium_memzero(hex, sizeof(hex));
	return ret;
}

/* Every key directory of keys_dir, copied in tx. 0, or -errno with msg set. */
static int migrate_dir(struct pg_tx *tx, const char *keys_dir, struct auth_migrate_report *rep,
		       struct buf *msg)
{
	struct dirent *de;
	DIR *d = opendir(keys_dir);
	int ret = 0;

	if (!d) {
		if (errno == ENOENT)
			return 0; /* no keys yet: nothing to copy */
		ret = -errno;
		buf_addf(msg, "cannot read %s: %s", keys_dir, strerror(errno));
		return ret;
	}
	while (!ret && (de = readdir(d))) {
		struct auth_key_record rec = { 0 };
		const char *why = NULL;
		json_t *root = NULL;
		int r;

		if (de->d_name[0] == '.' || !auth_id_valid(de->d_name))
			continue;
		r = auth_manifest_load(keys_dir, de->d_name, &root, &rec, NULL, &why);
		if (r == -ENOENT)
			continue;
		if (r) {
			log_warnx(NULL, "migrate: skipping key manifest %s/%s/manifest.json: %s",
				  keys_dir, de->d_name, why ? why : strerror(-r));
			rep->skipped++;
			continue;
		}
		r = migrate_one(tx, &rec, root);
		if (r < 0 && strcmp(store_last_sqlstate(), "23505") == 0) {
			buf_reset(msg); /* unique_violation: only token_hash can (id is upserted) */
			buf_addf(msg,
				 "cannot copy key %s: another key in the store has the same "
				 "token (a copied key directory?); nothing was copied",
				 rec.id);
			ret = -EEXIST;
		} else if (r < 0) {
			buf_reset(msg);
			buf_addf(msg, "cannot copy key %s: %s", rec.id,
				 tx->err && tx->err->len ? tx->err->data : strerror(-r));
			ret = r;
		} else if (r) {
			rep->copied++;
		} else {
			rep->unchanged++;
		}
		json_decref(root);
		auth_key_record_release(&rec);
	}
	closedir(d);
	return ret;
}

enum auth_key_result auth_key_migrate(const char *olp_home, struct store_db *db,
				      struct auth_migrate_report *rep, struct buf *msg)
{
	struct buf err = BUF_INIT, why = BUF_INIT;
	enum auth_key_result res;
	char keys[4096];
	struct pg_tx tx;
	int ret;

	memset(rep, 0, sizeof(*rep));
	if (msg)
		buf_reset(msg);
	res = auth_store_check_perms(olp_home, msg);
	if (res)
		return res;
	if (path_join_buf(keys, sizeof(keys), olp_home, "keys")) {
		errno = ENAMETOOLONG;
		return AUTH_KEY_ERR_SYSTEM;
	}
	ret = tx_begin(&tx, db, &err);
	if (!ret) {
		ret = migrate_dir(&tx, keys, rep, &why);
		if (ret)
			tx_end(&tx, false);
		else
			ret = tx_end(&tx, true);
	}
	if (ret) {
		if (msg)
			buf_addf(msg, "%s",
				 why.len   ? why.data
				 : err.len ? err.data
					   : strerror(-ret));
		memset(rep, 0, sizeof(*rep)); /* the transaction copied nothing */
		errno = -ret;
		res = AUTH_KEY_ERR_SYSTEM;
	}
	buf_release(&err);
	buf_release(&why);
	return res;
}
