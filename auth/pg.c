/* A worker's keys in PostgreSQL (ADR 0034): the schema of olp_keys, the check of a token
 * against a per-process cache kept honest by LISTEN olp_keys, the database-away rules,
 * last_used_at in batches, and the owner's readers of every key.
 *
 * The cache maps a token's hash to the key's record as one SELECT read it. An entry
 * loaded at mono time L in listener epoch E is used while the epoch is still E, no
 * notification for its id came since, and now - max(L, store_listen_fresh_ms()) < 2 s:
 * every change committed before the listener's last round trip has been handed to
 * on_notify, so a revocation anywhere refuses the key here within 2 s, and a check of a
 * known key costs no round trip. A notification removes the key's entries; a new epoch
 * (the listener reconnected: notifications may have been lost) makes every entry stale but
 * keeps it for the database-away rule below. Unknown tokens are not cached: each costs a
 * query (ADR 0034's consequence; the file store rescans keys/ at most once a second).
 *
 * The database away (no connection, or the statement failed with the connection): a key
 * whose entry was last confirmed (loaded, or served fresh) within store_offline_keys_s is
 * served from it; a key known revoked is refused; anything else is AUTH_ERR_UNAVAILABLE. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "auth/internal.h"
#include "store/store.h"
#include "common/banned.h"

#define AUTH_PG_FRESH_MS 2000		/* ADR 0034: a revocation reaches every host within 2 s */
#define AUTH_PG_BUCKETS 1024		/* power of two */
#define AUTH_PG_CACHE_MAX 65536		/* entries beyond this are not cached */
#define AUTH_PG_RECENT 64		/* notified ids remembered for a query in flight */
#define AUTH_PG_WAIT_MS 1000		/* a pool that stays busy longer counts as away */
#define AUTH_PG_TOUCH_MS INT64_C(60000) /* last_used_at at most once a minute per key */

/* ---- the schema ------------------------------------------------------------------------ */

static const char *const keys_steps[] = {
	/* version 1: the keys, their manifests as the key files hold them, and the NOTIFY
	 * of every change but a last_used_at update (which no cache holds). */
	"CREATE TABLE olp_keys ("
	" id text PRIMARY KEY,"
	" token_hash text NOT NULL UNIQUE CHECK (token_hash ~ '^[0-9a-f]{64}$'),"
	" manifest jsonb NOT NULL CHECK (jsonb_typeof(manifest) = 'object'),"
	" generation bigint NOT NULL DEFAULT 1,"
	" created timestamptz NOT NULL DEFAULT now(),"
	" updated timestamptz NOT NULL DEFAULT now());"
	"CREATE FUNCTION olp_keys_notify() RETURNS trigger LANGUAGE plpgsql AS $$"
	" BEGIN"
	"  IF TG_OP = 'DELETE' THEN"
	"   PERFORM pg_notify('olp_keys', OLD.id);"
	"   RETURN OLD;"
	"  END IF;"
	"  IF TG_OP = 'UPDATE' AND OLD.id = NEW.id AND OLD.token_hash = NEW.token_hash AND"
	"     (OLD.manifest - 'last_used_at') = (NEW.manifest - 'last_used_at') THEN"
	"   RETURN NEW;"
	"  END IF;"
	"  PERFORM pg_notify('olp_keys', NEW.id);"
	"  IF TG_OP = 'UPDATE' AND OLD.id <> NEW.id THEN"
	"   PERFORM pg_notify('olp_keys', OLD.id);"
	"  END IF;"
	"  RETURN NEW;"
	" END $$;"
	"CREATE TRIGGER olp_keys_notify AFTER INSERT OR UPDATE OR DELETE ON olp_keys"
	" FOR EACH ROW EXECUTE FUNCTION olp_keys_notify();",
};

static const struct store_schema keys_schema = {
	.module = "keys",
	.step = keys_steps,
	.n = ARRAY_SIZE(keys_steps),
};

const struct store_schema *auth_pg_schema(void)
{
	return &keys_schema;
}

void auth_pg_err_line(struct buf *err)
{
	char *nl;

	if (!err || !err->len)
		return;
	nl = strchr(err->data, '\n');
	if (nl) {
		*nl = '\0';
		err->len = (size_t)(nl - err->data);
	}
}

/* ---- the cache ------------------------------------------------------------------------- */

struct pg_entry {
	struct pg_entry *next;
	unsigned char hash[AUTH_HASH_BYTES];
	struct auth_key_record rec;
	uint64_t epoch;	   /* the listener's epoch when the SELECT was sent */
	int64_t loaded_ms; /* mono ms when the SELECT was sent */
	int64_t ok_ms;	   /* last confirmed: loaded, or served while fresh */
};

struct pg_touched {
	struct pg_touched *next;
	char id[AUTH_ID_MAX];
	int64_t ms;
};

struct auth_pg {
	struct store_db *db;
	int64_t offline_ms;
	bool no_cache; /* auth_options.store_no_listen: every check asks */

	pthread_mutex_t lock; /* everything below */
	struct pg_entry *buckets[AUTH_PG_BUCKETS];
	size_t n_entries;
	/* Notifications so far, and the last AUTH_PG_RECENT ids, so that a SELECT that raced
	 * a notification for its key does not cache what it read. */
	uint64_t notify_seq;
	char recent[AUTH_PG_RECENT][AUTH_ID_MAX];
	struct pg_touched *touched[AUTH_PG_BUCKETS];
	size_t n_touched;
	bool away_logged;
};

static size_t hash_bucket(const unsigned char hash[AUTH_HASH_BYTES])
{
	size_t b;

	/* The token's SHA-256: its bytes are already uniform. */
	memcpy(&b, hash, sizeof(b));
	return b & (AUTH_PG_BUCKETS - 1);
}

static size_t id_bucket(const char *id)
{
	uint32_t h = 2166136261u; /* FNV-1a */

	for (; *id; id++)
		h = (h ^ (unsigned char)*id) * 16777619u;
	return h & (AUTH_PG_BUCKETS - 1);
}

static void entry_free(struct pg_entry *e)
{
	auth_key_record_release(&e->rec);
	sodium_memzero(e->hash, sizeof(e->hash));
	free(e);
}

/* Caller holds lock. */
static struct pg_entry *cache_find(struct auth_pg *pg, const unsigned char hash[AUTH_HASH_BYTES])
{
	struct pg_entry *e;

	for (e = pg->buckets[hash_bucket(hash)]; e; e = e->next)
		if (sodium_memcmp(e->hash, hash, AUTH_HASH_BYTES) == 0)
			return e;
	return NULL;
}

/* Caller holds lock. */
static void cache_remove(struct auth_pg *pg, const unsigned char hash[AUTH_HASH_BYTES])
{
	struct pg_entry **pp, *e;

	for (pp = &pg->buckets[hash_bucket(hash)]; (e = *pp); pp = &e->next) {
		if (sodium_memcmp(e->hash, hash, AUTH_HASH_BYTES) == 0) {
			*pp = e->next;
			entry_free(e);
			pg->n_entries--;
			return;
		}
	}
}

/* Caller holds lock. Drops every entry of key id (a key may have been given a new token
 * hash, so this walks the table: notifications are rare, a change per key made). */
static void cache_remove_id(struct auth_pg *pg, const char *id)
{
	for (size_t b = 0; b < AUTH_PG_BUCKETS; b++) {
		struct pg_entry **pp = &pg->buckets[b], *e;

		while ((e = *pp)) {
			if (strcmp(e->rec.id, id) == 0) {
				*pp = e->next;
				entry_free(e);
				pg->n_entries--;
			} else {
				pp = &e->next;
			}
		}
	}
}

/* Caller holds lock. Whether id was notified since seq0 (or too much happened to tell). */
static bool notified_since(const struct auth_pg *pg, uint64_t seq0, const char *id)
{
	if (pg->notify_seq - seq0 > AUTH_PG_RECENT)
		return true;
	for (uint64_t s = seq0; s < pg->notify_seq; s++)
		if (strcmp(pg->recent[s % AUTH_PG_RECENT], id) == 0)
			return true;
	return false;
}

/* Caller holds lock. Takes rec. */
static void cache_put(struct auth_pg *pg, const unsigned char hash[AUTH_HASH_BYTES],
		      struct auth_key_record *rec, uint64_t epoch, int64_t loaded_ms)
{
	struct pg_entry *e;
	size_t b = hash_bucket(hash);

	cache_remove(pg, hash);
	if (pg->n_entries >= AUTH_PG_CACHE_MAX) {
		auth_key_record_release(rec);
		return; /* served by a query each time: bounded memory first */
	}
	e = xcalloc(1, sizeof(*e));
	memcpy(e->hash, hash, AUTH_HASH_BYTES);
	e->rec = *rec;
	memset(rec, 0, sizeof(*rec));
	e->epoch = epoch;
	e->loaded_ms = e->ok_ms = loaded_ms;
	e->next = pg->buckets[b];
	pg->buckets[b] = e;
	pg->n_entries++;
}

static void on_notify(void *arg, const char *payload)
{
	struct auth_pg *pg = arg;

	pthread_mutex_lock(&pg->lock);
	snprintf(pg->recent[pg->notify_seq % AUTH_PG_RECENT], AUTH_ID_MAX, "%s", payload);
	pg->notify_seq++;
	cache_remove_id(pg, payload);
	pthread_mutex_unlock(&pg->lock);
}

static void on_resync(void *arg)
{
	struct auth_pg *pg = arg;

	/* The epoch moves after this returns, which makes every entry stale; they stay for
	 * the database-away rule. A query in flight must not cache what it read either. */
	pthread_mutex_lock(&pg->lock);
	pg->notify_seq += AUTH_PG_RECENT + 1;
	pthread_mutex_unlock(&pg->lock);
}

/* ---- the check ------------------------------------------------------------------------- */

enum fetch { FETCH_FOUND, FETCH_NONE, FETCH_INVALID, FETCH_AWAY };

/* One SELECT of the key with token hash hex. FETCH_FOUND fills rec. */
static enum fetch pg_fetch(struct auth_pg *pg, const char *hex, struct auth_key_record *rec)
{
	const char *params[1] = { hex };
	struct buf err = BUF_INIT;
	enum fetch res = FETCH_AWAY;
	bool broken = false;
	const char *why = NULL;
	PGresult *r;
	PGconn *c;

	c = store_conn_get(pg->db, AUTH_PG_WAIT_MS);
	if (!c)
		return FETCH_AWAY;
	r = store_exec(pg->db, c, "SELECT id, manifest::text FROM olp_keys WHERE token_hash = $1",
		       1, params, &err, &broken);
	store_conn_put(pg->db, c, broken);
	auth_pg_err_line(&err);
	if (!r) {
		/* Not the connection: the table is not what we know. Refuse, say why. */
		if (!broken)
			log_warnx(NULL, "auth: cannot look a key up in the store: %s", err.data);
		buf_release(&err);
		return FETCH_AWAY;
	}
	if (PQntuples(r) == 0) {
		res = FETCH_NONE;
	} else if (auth_manifest_parse(PQgetvalue(r, 0, 1), (size_t)PQgetlength(r, 0, 1),
				       PQgetvalue(r, 0, 0), NULL, rec, &why) == 0) {
		res = FETCH_FOUND;
	} else {
		log_warnx(NULL, "auth: refusing key %.64s of the store: %s", PQgetvalue(r, 0, 0),
			  why ? why : "invalid manifest");
		res = FETCH_INVALID;
	}
	PQclear(r);
	buf_release(&err);
	return res;
}

static int64_t max64(int64_t a, int64_t b)
{
	return a > b ? a : b;
}

/* The cached answer when the entry is fresh: AUTH_OK / AUTH_ERR_INVALID, or -1 (ask). */
static int check_cached(struct auth_pg *pg, const unsigned char hash[AUTH_HASH_BYTES],
			struct auth_identity *out)
{
	uint64_t epoch = 0;
	int64_t fresh = store_listen_fresh_ms(pg->db, &epoch), now = (int64_t)mono_ms();
	struct pg_entry *e;
	int res = -1;

	pthread_mutex_lock(&pg->lock);
	e = cache_find(pg, hash);
	if (e && e->epoch == epoch && now - max64(e->loaded_ms, fresh) < AUTH_PG_FRESH_MS) {
		e->ok_ms = max64(e->ok_ms, max64(e->loaded_ms, fresh));
		res = AUTH_ERR_INVALID;
		if (!e->rec.revoked) {
			auth_identity_from_record(out, &e->rec);
			res = AUTH_OK;
		}
	}
	pthread_mutex_unlock(&pg->lock);
	return res;
}

/* The database is away: what the entry, if any, allows. */
static enum auth_result check_away(struct auth_pg *pg, const unsigned char hash[AUTH_HASH_BYTES],
				   struct auth_identity *out)
{
	int64_t now = (int64_t)mono_ms();
	enum auth_result res = AUTH_ERR_UNAVAILABLE;
	struct pg_entry *e;

	pthread_mutex_lock(&pg->lock);
	e = cache_find(pg, hash);
	if (e && e->rec.revoked) {
		res = AUTH_ERR_INVALID; /* a revocation is never undone */
	} else if (e && pg->offline_ms && now - e->ok_ms < pg->offline_ms) {
		auth_identity_from_record(out, &e->rec);
		res = AUTH_OK;
	}
	if (!pg->away_logged && pg->offline_ms)
		log_warnx(NULL,
			  "auth: the key store is away: keys checked in the last %llds are "
			  "served, others refused with 503",
			  (long long)(pg->offline_ms / 1000));
	else if (!pg->away_logged)
		log_warnx(NULL, "auth: the key store is away: every key is refused with 503");
	pg->away_logged = true;
	pthread_mutex_unlock(&pg->lock);
	return res;
}

enum auth_result auth_pg_check(struct auth_pg *pg, const unsigned char hash[AUTH_HASH_BYTES],
			       struct auth_identity *out)
{
	struct auth_key_record rec = { 0 };
	char hex[AUTH_HASH_HEX + 1];
	uint64_t epoch = 0, seq0;
	enum auth_result res;
	enum fetch f;
	int64_t sent;
	int cached;

	cached = check_cached(pg, hash, out);
	if (cached >= 0)
		return (enum auth_result)cached;
	pthread_mutex_lock(&pg->lock);
	seq0 = pg->notify_seq;
	pthread_mutex_unlock(&pg->lock);
	(void)store_listen_fresh_ms(pg->db, &epoch);
	sent = (int64_t)mono_ms();
	auth_hash_to_hex(hash, hex);
	f = pg_fetch(pg, hex, &rec);
	sodium_memzero(hex, sizeof(hex));
	if (f == FETCH_AWAY)
		return check_away(pg, hash, out);
	pthread_mutex_lock(&pg->lock);
	pg->away_logged = false;
	if (f != FETCH_FOUND) {
		cache_remove(pg, hash);
		pthread_mutex_unlock(&pg->lock);
		return AUTH_ERR_INVALID;
	}
	res = rec.revoked ? AUTH_ERR_INVALID : AUTH_OK;
	if (res == AUTH_OK)
		auth_identity_from_record(out, &rec);
	/* What we read may predate a change notified meanwhile: not kept, asked again. */
	if (!pg->no_cache && !notified_since(pg, seq0, rec.id))
		cache_put(pg, hash, &rec, epoch, sent);
	else
		cache_remove(pg, hash);
	pthread_mutex_unlock(&pg->lock);
	auth_key_record_release(&rec);
	return res;
}

/* ---- last_used_at ---------------------------------------------------------------------- */

bool auth_pg_touch_due(struct auth_pg *pg, const char *id)
{
	int64_t now = (int64_t)mono_ms();
	size_t b = id_bucket(id);
	struct pg_touched *t;
	bool due = true;

	pthread_mutex_lock(&pg->lock);
	for (t = pg->touched[b]; t; t = t->next)
		if (strcmp(t->id, id) == 0)
			break;
	if (t) {
		due = now - t->ms >= AUTH_PG_TOUCH_MS;
		if (due)
			t->ms = now;
	} else if (pg->n_touched < AUTH_PG_CACHE_MAX) {
		t = xcalloc(1, sizeof(*t));
		snprintf(t->id, sizeof(t->id), "%s", id);
		t->ms = now;
		t->next = pg->touched[b];
		pg->touched[b] = t;
		pg->n_touched++;
	} else {
		due = false; /* more keys than that in use: last_used_at is best effort */
	}
	pthread_mutex_unlock(&pg->lock);
	return due;
}

/* A text[] literal of n strings (ids and ISO times: no quote or backslash in them, but
 * they are quoted and escaped all the same). */
static void array_literal(struct buf *b, const struct auth_touch_req *q, size_t n, bool when)
{
	buf_addch(b, '{');
	for (size_t i = 0; i < n; i++) {
		const char *s = when ? q[i].when : q[i].id;

		buf_adds(b, i ? ",\"" : "\"");
		for (; *s; s++) {
			if (*s == '"' || *s == '\\')
				buf_addch(b, '\\');
			buf_addch(b, *s);
		}
		buf_addch(b, '"');
	}
	buf_addch(b, '}');
}

void auth_pg_touch_write(struct auth_pg *pg, const struct auth_touch_req *q, size_t n)
{
	struct buf ids = BUF_INIT, whens = BUF_INIT, err = BUF_INIT;
	const char *params[2];
	bool broken = false;
	PGresult *r;
	PGconn *c;

	if (!n)
		return;
	array_literal(&ids, q, n, false);
	array_literal(&whens, q, n, true);
	params[0] = ids.data;
	params[1] = whens.data;
	c = store_conn_get(pg->db, AUTH_PG_WAIT_MS);
	if (!c) {
		log_warnx(NULL, "auth: the key store is away; %zu last_used_at updates dropped", n);
		goto out;
	}
	/* Under each row's lock: a key revoked meanwhile keeps its last_used_at. */
	r = store_exec(pg->db, c,
		       "UPDATE olp_keys AS k SET manifest = jsonb_set(k.manifest, '{last_used_at}',"
		       " to_jsonb(u.t)) FROM unnest($1::text[], $2::text[]) AS u(id, t)"
		       " WHERE k.id = u.id AND coalesce(k.manifest->'revoked_at', 'null'::jsonb)"
		       " = 'null'::jsonb",
		       2, params, &err, &broken);
	store_conn_put(pg->db, c, broken);
	auth_pg_err_line(&err);
	if (!r)
		log_warnx(NULL, "auth: cannot record the last use of %zu keys: %s", n, err.data);
	PQclear(r);
out:
	buf_release(&ids);
	buf_release(&whens);
	buf_release(&err);
}

/* ---- every key ------------------------------------------------------------------------- */

int auth_pg_each(struct store_db *db, auth_pg_row_fn fn, void *arg, size_t *skipped)
{
	struct buf err = BUF_INIT;
	bool broken = false;
	PGresult *r;
	PGconn *c;
	int ret = 0;

	c = store_conn_get(db, AUTH_PG_WAIT_MS);
	if (!c)
		return -(errno ? errno : ECONNREFUSED);
	r = store_exec(db, c, "SELECT id, manifest::text FROM olp_keys ORDER BY id", 0, NULL, &err,
		       &broken);
	store_conn_put(db, c, broken);
	auth_pg_err_line(&err);
	if (!r) {
		log_warnx(NULL, "auth: cannot read the keys of the store: %s", err.data);
		buf_release(&err);
		return broken ? -ECONNREFUSED : -EPROTO;
	}
	for (int i = 0; i < PQntuples(r) && !ret; i++) {
		struct auth_key_record rec = { 0 };
		const char *why = NULL;
		json_t *root = NULL;

		if (auth_manifest_parse(PQgetvalue(r, i, 1), (size_t)PQgetlength(r, i, 1),
					PQgetvalue(r, i, 0), &root, &rec, &why)) {
			log_warnx(NULL, "auth: skipping key %.64s of the store: %s",
				  PQgetvalue(r, i, 0), why ? why : "invalid manifest");
			if (skipped)
				(*skipped)++;
			continue;
		}
		ret = fn(arg, root, &rec);
	}
	PQclear(r);
	buf_release(&err);
	return ret;
}

struct grants_arg {
	struct auth_login_grant *v;
	size_t n, cap;
};

static int grants_row(void *arg, json_t *root, struct auth_key_record *rec)
{
	struct grants_arg *g = arg;

	for (size_t j = 0; !rec->revoked && rec->tier == AUTH_TIER_GUEST && j < rec->login_access.n;
	     j++) {
		if (g->n == g->cap) {
			g->cap = g->cap ? 2 * g->cap : 8;
			g->v = xreallocarray(g->v, g->cap, sizeof(*g->v));
		}
		snprintf(g->v[g->n].key_id, sizeof(g->v[g->n].key_id), "%s", rec->id);
		snprintf(g->v[g->n].provider, sizeof(g->v[g->n].provider), "%s",
			 rec->login_access.v[j]);
		g->n++;
	}
	json_decref(root);
	auth_key_record_release(rec);
	return 0;
}

int auth_pg_login_grants(struct auth_pg *pg, struct auth_login_grant **out, size_t *n)
{
	struct grants_arg g = { 0 };
	int ret = auth_pg_each(pg->db, grants_row, &g, NULL);

	if (ret) {
		free(g.v);
		return ret;
	}
	*out = g.v;
	*n = g.n;
	return 0;
}

struct keys_arg {
	struct auth_key_summary *v;
	size_t n, cap;
};

static int keys_row(void *arg, json_t *root, struct auth_key_record *rec)
{
	struct keys_arg *a = arg;
	struct auth_key_summary *k;

	if (a->n == a->cap) {
		a->cap = a->cap ? 2 * a->cap : 16;
		a->v = xreallocarray(a->v, a->cap, sizeof(*a->v));
	}
	k = &a->v[a->n++];
	memset(k, 0, sizeof(*k));
	snprintf(k->id, sizeof(k->id), "%s", rec->id);
	k->name = steal_pointer(&rec->name);
	k->created_at = steal_pointer(&rec->created_at);
	k->tier = rec->tier;
	k->revoked = rec->revoked;
	k->quota = rec->quota;
	json_decref(root);
	auth_key_record_release(rec);
	return 0;
}

static int cmp_summary(const void *a, const void *b)
{
	const struct auth_key_summary *x = a, *y = b;

	return auth_created_cmp(x->created_at, x->id, y->created_at, y->id);
}

int auth_pg_keys(struct auth_pg *pg, struct auth_key_summary **out, size_t *n)
{
	struct keys_arg a = { 0 };
	int ret = auth_pg_each(pg->db, keys_row, &a, NULL);

	if (ret) {
		auth_key_summaries_free(a.v, a.n);
		return ret;
	}
	if (a.n)
		qsort(a.v, a.n, sizeof(*a.v), cmp_summary);
	*out = a.n ? a.v : NULL;
	if (!a.n)
		free(a.v);
	*n = a.n;
	return 0;
}

/* ---- lifecycle ------------------------------------------------------------------------- */

struct auth_pg *auth_pg_open(struct store_db *db, const struct auth_options *opt)
{
	struct auth_pg *pg;
	unsigned found = 0;
	int ret;

	ret = store_schema_check(db, &keys_schema, &found);
	if (ret == -ENOENT || ret == -EPROTO) {
		if (ret == -ENOENT)
			log_errx(NULL,
				 "auth: the store holds no keys schema; run: olp-keys store init");
		else
			log_errx(NULL,
				 "auth: the store's keys schema is version %u, this build knows %u;"
				 " run: olp-keys store init (or upgrade OLP)",
				 found, keys_schema.n);
		errno = EPROTO;
		return NULL;
	}
	/* Any other failure: the database is away; the checks try again. */
	pg = xcalloc(1, sizeof(*pg));
	pg->db = db;
	pg->offline_ms = (int64_t)opt->store_offline_keys_s * 1000;
	pthread_mutex_init(&pg->lock, NULL);
	if (opt->store_no_listen) {
		pg->no_cache = true;
		return pg;
	}
	ret = store_listen(db, "olp_keys", on_notify, on_resync, pg);
	if (!ret)
		ret = store_listen_start(db);
	if (ret) {
		/* Without the listener nothing is fresh beyond 2 s after its load: still
		 * correct, one query per check after that. */
		log_warnx(NULL,
			  "auth: cannot listen for key changes (%s); every check asks the"
			  " store",
			  strerror(-ret));
	}
	return pg;
}

void auth_pg_free(struct auth_pg *pg)
{
	if (!pg)
		return;
	store_unlisten(pg->db, pg); /* no callback with pg after this */
	for (size_t b = 0; b < AUTH_PG_BUCKETS; b++) {
		struct pg_entry *e, *ne;
		struct pg_touched *t, *nt;

		for (e = pg->buckets[b]; e; e = ne) {
			ne = e->next;
			entry_free(e);
		}
		for (t = pg->touched[b]; t; t = nt) {
			nt = t->next;
			free(t);
		}
	}
	pthread_mutex_destroy(&pg->lock);
	free(pg);
}
