/* CUnit suite for auth/'s PostgreSQL backend (ADR 0034), against a real server: run under
 * tests/pg/with-pg.sh (OLP_TEST_PG_URL, OLP_TEST_PG_ADMIN_URL, PGPASSFILE, OLP_TEST_PG_DIR);
 * without it, exit 77 (a skip: no server on this host). What the file store does, the
 * database does: create, check, revoke, quota, login, list; a revocation made through one
 * store_db ("host") refused by another within 2 s; the cache answering without a round
 * trip; the database stopped (known keys served in the offline window, unknown ones
 * AUTH_ERR_UNAVAILABLE) and started again (served within 10 s, nothing reopened); SQL
 * injection through every stored string; migrate run twice; the workers' role unable to
 * change the schema. The tests share one database and never reuse a key. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/cunit.h"
#include <jansson.h>

#include "auth/auth.h"
#include "common/common.h"
#include "store/store.h"
#include "tests/auth/test_util.h"
#include "common/banned.h"

/* Tokens of tests/auth/fixtures/node-home (see TOKENS.txt there). */
#define FIX_OWNER_TOKEN "olp_9pUCRKOoP2lC7hnaE4q27leV2ReTMEZjxyqADKX0hGM"
#define FIX_OWNER_HASH "82e67b75166795f8570c12313241b154d0dfb203da4a0ff7d23c053643bcceff"
#define FIX_REVOKED_TOKEN "olp_U1GKgTrkPh6c9sq5CdhZciwsJ137MUbme75XKanq6gM"

static const char *worker_url, *admin_url;

static struct store_db *db_open_as(const char *url, const char *appname)
{
	struct store_options so = { .application_name = appname, .connect_timeout_s = 20 };
	struct buf err = BUF_INIT;
	struct store_db *db = store_open(url, &so, &err);

	if (!db)
		fprintf(stderr, "store_open: %s\n", err.data);
	CU_ASSERT_PTR_NOT_NULL_FATAL(db);
	buf_release(&err);
	return db;
}

static struct store_db *db_open(const char *url)
{
	return db_open_as(url, "test_auth_pg");
}

/* Wait (at most 5 s) until db's listener has made a round trip: an entry cached before
 * its first connection is stale once it connects (a new epoch). */
static void wait_listening(struct store_db *db)
{
	for (int i = 0; i < 250 && store_listen_fresh_ms(db, NULL) <= 0; i++)
		usleep(20 * 1000);
	CU_ASSERT_TRUE(store_listen_fresh_ms(db, NULL) > 0);
}

/* A worker's auth_store over db (a home of its own for the audit log). */
static struct auth_store *store_over(struct store_db *db, unsigned offline_s, char **home)
{
	struct auth_options o = { .store = db, .store_offline_keys_s = offline_s };
	struct auth_store *st;

	*home = tu_mkhome();
	st = auth_store_open(*home, &o);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	return st;
}

static void make_key_in(struct store_db *db, const struct auth_key_spec *spec,
			struct auth_new_key *k)
{
	struct auth_target t = { .db = db };
	struct buf msg = BUF_INIT;
	enum auth_key_result r = auth_key_create_at(&t, spec, k, &msg);

	if (r)
		fprintf(stderr, "auth_key_create_at: %s\n", msg.data);
	CU_ASSERT_EQUAL_FATAL(r, AUTH_KEY_OK);
	buf_release(&msg);
}

static void make_guest(struct store_db *db, const char *name, struct auth_new_key *k)
{
	static const char *const prov[] = { "claude", "codex" };
	struct auth_key_spec spec = {
		.name = name, .tier = AUTH_TIER_GUEST, .providers = prov, .n_providers = 2
	};

	make_key_in(db, &spec, k);
}

static enum auth_result check_tok(struct auth_store *st, const char *tok, struct auth_identity *id)
{
	struct buf b = BUF_INIT;
	enum auth_result r;

	buf_addf(&b, "Bearer %s", tok);
	r = auth_check(st, b.data, NULL, id);
	buf_release(&b);
	return r;
}

static enum auth_result check_once(struct auth_store *st, const char *tok)
{
	struct auth_identity id;
	enum auth_result r = check_tok(st, tok, &id);

	auth_identity_release(&id);
	return r;
}

/* ms until check_once(st, tok) gives want, polling every 20 ms; -1 past limit_ms. */
static int64_t ms_until(struct auth_store *st, const char *tok, enum auth_result want,
			int64_t limit_ms)
{
	int64_t t0 = (int64_t)mono_ms(), now;

	for (;;) {
		now = (int64_t)mono_ms();
		if (check_once(st, tok) == want)
			return now - t0;
		if (now - t0 > limit_ms)
			return -1;
		usleep(20 * 1000);
	}
}

static void pg_ctl(const char *what)
{
	char cmd[4096];

	snprintf(cmd, sizeof(cmd), "bash %s/tests/pg/pg-ctl.sh %s", OLP_SRC_DIR, what);
	CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
}

/* One SQL value (the first column of the first row) as the admin sees it, or NULL. */
static char *admin_value(const char *sql, int n, const char *const *params)
{
	struct store_db *db = db_open(admin_url);
	PGconn *c = store_conn_get(db, 3000);
	char *v = NULL;
	PGresult *r;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	r = store_exec(db, c, sql, n, params, NULL, NULL);
	if (r && PQntuples(r) > 0)
		v = xstrdup(PQgetvalue(r, 0, 0));
	PQclear(r);
	store_conn_put(db, c, false);
	store_free(db);
	return v;
}

/* ---- schema and roles ---------------------------------------------------------------- */

static void test_schema_init_twice(void)
{
	const struct store_schema *s[] = { auth_pg_schema() };
	struct store_db *db = db_open(admin_url);
	struct buf msg = BUF_INIT;
	unsigned found = 0;

	CU_ASSERT_EQUAL(store_schema_apply(db, s, 1, "olp_worker", &msg), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg.data, "keys: version 0 -> 1"));
	buf_reset(&msg);
	CU_ASSERT_EQUAL(store_schema_apply(db, s, 1, "olp_worker", &msg), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg.data, "keys: version 1, current"));
	CU_ASSERT_EQUAL(store_schema_check(db, auth_pg_schema(), &found), 0);
	buf_release(&msg);
	store_free(db);
}

static void test_worker_cannot_create(void)
{
	struct store_db *db = db_open(worker_url);
	PGconn *c = store_conn_get(db, 3000);
	struct buf err = BUF_INIT;
	PGresult *r;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	r = store_exec(db, c, "CREATE TABLE olp_evil (a int)", 0, NULL, &err, NULL);
	CU_ASSERT_PTR_NULL(r);
	CU_ASSERT_STRING_EQUAL(store_last_sqlstate(), "42501"); /* insufficient_privilege */
	PQclear(r);
	r = store_exec(db, c, "DROP TABLE olp_keys", 0, NULL, &err, NULL);
	CU_ASSERT_PTR_NULL(r);
	PQclear(r);
	r = store_exec(db, c, "SELECT count(*) FROM olp_keys", 0, NULL, &err, NULL);
	CU_ASSERT_PTR_NOT_NULL(r); /* data rights it has */
	PQclear(r);
	store_conn_put(db, c, false);
	buf_release(&err);
	store_free(db);
}

/* ---- what the file store does ------------------------------------------------------------ */

static void test_create_check_list_revoke(void)
{
	struct store_db *db = db_open(worker_url);
	struct auth_target t = { .db = db };
	struct auth_key_list list;
	struct auth_identity id;
	struct auth_new_key k;
	struct auth_store *st;
	struct buf msg = BUF_INIT;
	bool was = true, seen = false;
	char *home;

	make_guest(db, "alice", &k);
	st = store_over(db, 300, &home);
	CU_ASSERT_EQUAL_FATAL(check_tok(st, k.token, &id), AUTH_OK);
	CU_ASSERT_STRING_EQUAL(id.key_id, k.id);
	CU_ASSERT_EQUAL(id.tier, AUTH_TIER_GUEST);
	CU_ASSERT_TRUE(auth_identity_allows(&id, "codex"));
	CU_ASSERT_FALSE(auth_identity_allows(&id, "vibe"));
	auth_identity_release(&id);
	CU_ASSERT_EQUAL(check_once(st, "olp_not-a-key-at-all"), AUTH_ERR_INVALID);

	CU_ASSERT_EQUAL(auth_key_list_at(&t, &list, &msg), AUTH_KEY_OK);
	for (size_t i = 0; i < list.n; i++) {
		if (strcmp(list.keys[i].id, k.id) != 0)
			continue;
		seen = true;
		CU_ASSERT_STRING_EQUAL(list.keys[i].name, "alice");
		CU_ASSERT_EQUAL(list.keys[i].n_providers, 2);
		CU_ASSERT_FALSE(list.keys[i].revoked);
	}
	CU_ASSERT_TRUE(seen);
	auth_key_list_release(&list);

	CU_ASSERT_EQUAL(auth_key_revoke_at(&t, k.id, &was, &msg), AUTH_KEY_OK);
	CU_ASSERT_FALSE(was);
	CU_ASSERT_EQUAL(auth_key_revoke_at(&t, k.id, &was, &msg), AUTH_KEY_OK);
	CU_ASSERT_TRUE(was);
	CU_ASSERT_EQUAL(auth_key_revoke_at(&t, "nosuchk1", &was, &msg), AUTH_KEY_ERR_NOT_FOUND);
	CU_ASSERT_TRUE(ms_until(st, k.token, AUTH_ERR_INVALID, 2000) >= 0);
	auth_new_key_wipe(&k);
	auth_store_free(st);
	tu_rmhome(home);
	buf_release(&msg);
	store_free(db);
}

static void test_owner_once(void)
{
	struct store_db *db = db_open(worker_url);
	struct auth_key_spec spec = { .name = "boss", .tier = AUTH_TIER_OWNER, .force = true };
	struct auth_target t = { .db = db };
	struct buf msg = BUF_INIT;
	struct auth_new_key k;

	make_key_in(db, &spec, &k); /* forced: whatever the other tests made */
	auth_new_key_wipe(&k);
	spec.force = false;
	CU_ASSERT_EQUAL(auth_key_create_at(&t, &spec, &k, &msg), AUTH_KEY_ERR_OWNER_EXISTS);
	buf_release(&msg);
	store_free(db);
}

static void test_quota_and_login(void)
{
	static const char *const logins[] = { "codex" };
	struct store_db *db = db_open(worker_url);
	struct auth_target t = { .db = db };
	struct auth_quota q = { .requests_per_day = 5, .max_concurrent = 2 }, now;
	struct auth_login_grant *g = NULL;
	struct auth_key_summary *ks = NULL;
	struct auth_identity id;
	struct buf msg = BUF_INIT;
	struct auth_new_key k;
	struct auth_store *st;
	char **la = NULL;
	size_t n = 0, ng = 0, nk = 0;
	bool granted = false, listed = false;
	char *home;

	make_guest(db, "bob", &k);
	st = store_over(db, 300, &home);
	CU_ASSERT_EQUAL(check_once(st, k.token), AUTH_OK); /* cached, no quota */
	CU_ASSERT_EQUAL(auth_key_set_quota_at(&t, k.id, &q, AUTH_QUOTA_ALL, &now, &msg),
			AUTH_KEY_OK);
	CU_ASSERT_EQUAL(now.requests_per_day, 5);
	CU_ASSERT_EQUAL(auth_key_set_login_at(&t, k.id, logins, 1, true, false, &la, &n, &msg),
			AUTH_KEY_OK);
	CU_ASSERT_EQUAL_FATAL(n, 1);
	CU_ASSERT_STRING_EQUAL(la[0], "codex");
	auth_strings_free(la, n);
	/* The workers see both within 2 s (the notification drops the cached entry). */
	for (int i = 0; i < 100; i++) {
		CU_ASSERT_EQUAL_FATAL(check_tok(st, k.token, &id), AUTH_OK);
		if (id.quota.requests_per_day == 5 && auth_identity_may_hold_login(&id, "codex"))
			break;
		auth_identity_release(&id);
		usleep(20 * 1000);
	}
	CU_ASSERT_EQUAL(id.quota.requests_per_day, 5);
	CU_ASSERT_EQUAL(id.quota.max_concurrent, 2);
	CU_ASSERT_TRUE(auth_identity_may_hold_login(&id, "codex"));
	auth_identity_release(&id);
	CU_ASSERT_EQUAL(auth_login_grants(st, &g, &ng), 0);
	for (size_t i = 0; i < ng; i++)
		granted |= strcmp(g[i].key_id, k.id) == 0 && strcmp(g[i].provider, "codex") == 0;
	CU_ASSERT_TRUE(granted);
	free(g);
	CU_ASSERT_EQUAL(auth_store_keys(st, &ks, &nk), 0);
	for (size_t i = 0; i < nk; i++)
		listed |= strcmp(ks[i].id, k.id) == 0 && ks[i].quota.requests_per_day == 5;
	CU_ASSERT_TRUE(listed);
	auth_key_summaries_free(ks, nk);
	q = (struct auth_quota){ .requests_per_minute = AUTH_QUOTA_MAX + 1 };
	CU_ASSERT_EQUAL(auth_key_set_quota_at(&t, k.id, &q, AUTH_QUOTA_RPM, NULL, &msg),
			AUTH_KEY_ERR_INVALID_ARG);
	auth_new_key_wipe(&k);
	auth_store_free(st);
	tu_rmhome(home);
	buf_release(&msg);
	store_free(db);
}

static void test_touch_batched(void)
{
	struct store_db *db = db_open(worker_url);
	struct auth_identity id;
	struct auth_new_key k;
	struct auth_store *st;
	const char *params[1];
	char *home, *v;

	make_guest(db, "toucher", &k);
	st = store_over(db, 300, &home);
	CU_ASSERT_EQUAL_FATAL(check_tok(st, k.token, &id), AUTH_OK);
	auth_touch(st, &id);
	auth_identity_release(&id);
	auth_store_free(st); /* flushes the queue */
	params[0] = k.id;
	v = admin_value("SELECT manifest->>'last_used_at' FROM olp_keys WHERE id = $1", 1, params);
	CU_ASSERT_PTR_NOT_NULL(v);
	CU_ASSERT_TRUE(v && strlen(v) >= 20 && v[4] == '-');
	free(v);
	auth_new_key_wipe(&k);
	tu_rmhome(home);
	store_free(db);
}

/* ---- two hosts ---------------------------------------------------------------------------- */

static void test_second_host_revocation(void)
{
	struct store_db *db1 = db_open(worker_url), *db2 = db_open(worker_url);
	struct auth_target t1 = { .db = db1 };
	struct auth_store *h1, *h2;
	struct buf msg = BUF_INIT;
	struct auth_new_key k;
	char *home1, *home2;
	int64_t ms;

	h1 = store_over(db1, 300, &home1);
	h2 = store_over(db2, 300, &home2);
	make_guest(db1, "shared", &k);
	CU_ASSERT_EQUAL(check_once(h2, k.token), AUTH_OK); /* made on host 1, used on host 2 */
	CU_ASSERT_EQUAL(check_once(h1, k.token), AUTH_OK);
	usleep(300 * 1000); /* both cached, the listeners past the load */
	CU_ASSERT_EQUAL(check_once(h2, k.token), AUTH_OK);
	CU_ASSERT_EQUAL(auth_key_revoke_at(&t1, k.id, NULL, &msg), AUTH_KEY_OK);
	ms = ms_until(h2, k.token, AUTH_ERR_INVALID, 2000);
	fprintf(stderr, "revocation seen by host 2 after %lld ms\n", (long long)ms);
	CU_ASSERT_TRUE(ms >= 0 && ms <= 2000);
	CU_ASSERT_TRUE(ms_until(h1, k.token, AUTH_ERR_INVALID, 2000) >= 0);
	/* And it stays refused. */
	usleep(500 * 1000);
	CU_ASSERT_EQUAL(check_once(h2, k.token), AUTH_ERR_INVALID);
	auth_new_key_wipe(&k);
	auth_store_free(h1);
	auth_store_free(h2);
	tu_rmhome(home1);
	tu_rmhome(home2);
	buf_release(&msg);
	store_free(db1);
	store_free(db2);
}

/* The listener's connection dies and the revocation's notification is lost with it: the
 * entry, loaded in the old epoch, is still refused within 2 s (the freshness rule, then
 * the new epoch), not served until the next notification. */
static void test_lost_notification(void)
{
	struct store_db *db1 = db_open(worker_url), *db2 = db_open_as(worker_url, "authpg_h2");
	struct auth_target t1 = { .db = db1 };
	struct auth_store *h2;
	struct buf msg = BUF_INIT;
	struct auth_new_key k;
	uint64_t epoch = 0, epoch2 = 0;
	int64_t ms, created;
	char *home;

	h2 = store_over(db2, 300, &home);
	wait_listening(db2);
	make_guest(db1, "unheard", &k);
	/* The creation's own notification handed over first (it would drop the entry). */
	created = (int64_t)mono_ms();
	while (store_listen_fresh_ms(db2, &epoch) < created + 50)
		usleep(20 * 1000);
	CU_ASSERT_EQUAL(check_once(h2, k.token), AUTH_OK);
	pg_ctl("psql -c \"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
	       "application_name = 'authpg_h2' AND query = 'SELECT 1'\" >/dev/null");
	CU_ASSERT_EQUAL(auth_key_revoke_at(&t1, k.id, NULL, &msg), AUTH_KEY_OK);
	ms = ms_until(h2, k.token, AUTH_ERR_INVALID, 3000);
	fprintf(stderr, "revocation without its notification refused after %lld ms\n",
		(long long)ms);
	CU_ASSERT_TRUE(ms >= 0 && ms <= 2000);
	(void)store_listen_fresh_ms(db2, &epoch2);
	CU_ASSERT_TRUE(epoch2 > epoch); /* the listener did reconnect */
	auth_new_key_wipe(&k);
	auth_store_free(h2);
	tu_rmhome(home);
	buf_release(&msg);
	store_free(db1);
	store_free(db2);
}

/* ---- the cache and the database away ------------------------------------------------------ */

/* The key is made, checked once (cached), the database stopped: with no offline window at
 * all, the check still answers for the cache's 2 s, which is the proof that it made no
 * round trip; after that, AUTH_ERR_UNAVAILABLE. Another worker with an offline window
 * keeps serving its known key, refuses an unknown one with AUTH_ERR_UNAVAILABLE, and
 * once the database is back serves a key it never saw, within 10 s, not reopened. */
static void test_database_away(void)
{
	struct store_db *db1 = db_open(worker_url), *db2 = db_open(worker_url);
	struct auth_store *strict, *lenient;
	struct auth_new_key k, other;
	struct store_health h;
	char *home1, *home2;
	int64_t ms, loaded;

	make_guest(db1, "steady", &k);
	make_guest(db1, "unseen", &other);
	strict = store_over(db1, 0, &home1);
	lenient = store_over(db2, 300, &home2);
	wait_listening(db1);
	wait_listening(db2);
	loaded = (int64_t)mono_ms();
	CU_ASSERT_EQUAL(check_once(strict, k.token), AUTH_OK);
	CU_ASSERT_EQUAL(check_once(lenient, k.token), AUTH_OK);
	pg_ctl("stop");
	/* The cache: no round trip (while the entry is under 2 s old; a slow stop leaves
	 * nothing to tell). */
	if ((int64_t)mono_ms() - loaded < 1800) {
		CU_ASSERT_EQUAL(check_once(strict, k.token), AUTH_OK);
	} else {
		fprintf(stderr, "the server took over 1.8 s to stop: cache not measured\n");
	}
	ms = ms_until(strict, k.token, AUTH_ERR_UNAVAILABLE, 3000);
	CU_ASSERT_TRUE(ms >= 0);
	sleep(1);
	CU_ASSERT_EQUAL(check_once(lenient, k.token), AUTH_OK); /* the offline window */
	CU_ASSERT_EQUAL(check_once(lenient, other.token), AUTH_ERR_UNAVAILABLE);
	CU_ASSERT_EQUAL(check_once(lenient, "olp_nobody"), AUTH_ERR_UNAVAILABLE);
	store_health(db2, &h);
	CU_ASSERT_FALSE(h.ok);
	pg_ctl("start");
	ms = ms_until(lenient, other.token, AUTH_OK, 10000);
	fprintf(stderr, "database back: an unseen key served after %lld ms\n", (long long)ms);
	CU_ASSERT_TRUE(ms >= 0 && ms <= 10000);
	CU_ASSERT_TRUE(ms_until(strict, k.token, AUTH_OK, 10000) >= 0);
	auth_new_key_wipe(&k);
	auth_new_key_wipe(&other);
	auth_store_free(strict);
	auth_store_free(lenient);
	tu_rmhome(home1);
	tu_rmhome(home2);
	store_free(db1);
	store_free(db2);
}

/* Threads checking keys while their quotas change (a notification each): every check
 * answers OK, none is refused or told the store is away. */
#define STRESS_THREADS 4
#define STRESS_CHECKS 400

struct stress_arg {
	struct auth_store *st;
	const char *token;
	int bad;
};

static void *stress_main(void *p)
{
	struct stress_arg *a = p;

	for (int i = 0; i < STRESS_CHECKS; i++)
		a->bad += check_once(a->st, a->token) != AUTH_OK;
	return NULL;
}

static void test_threads_and_changes(void)
{
	struct store_db *db = db_open(worker_url);
	struct auth_target t = { .db = db };
	struct stress_arg args[STRESS_THREADS];
	pthread_t th[STRESS_THREADS];
	struct auth_new_key k[STRESS_THREADS];
	struct buf msg = BUF_INIT;
	struct auth_store *st;
	char *home;

	st = store_over(db, 300, &home);
	for (int i = 0; i < STRESS_THREADS; i++) {
		make_guest(db, "busy", &k[i]);
		args[i] = (struct stress_arg){ .st = st, .token = k[i].token };
		CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, stress_main, &args[i]), 0);
	}
	for (int r = 1; r <= 20; r++) {
		struct auth_quota q = { .requests_per_minute = r };

		CU_ASSERT_EQUAL(auth_key_set_quota_at(&t, k[r % STRESS_THREADS].id, &q,
						      AUTH_QUOTA_RPM, NULL, &msg),
				AUTH_KEY_OK);
	}
	for (int i = 0; i < STRESS_THREADS; i++) {
		pthread_join(th[i], NULL);
		CU_ASSERT_EQUAL(args[i].bad, 0);
		auth_new_key_wipe(&k[i]);
	}
	auth_store_free(st);
	tu_rmhome(home);
	buf_release(&msg);
	store_free(db);
}

/* One request per process (CGI): no listener, no cache, a revocation seen on the very
 * next check. */
static void test_no_listen(void)
{
	struct store_db *db = db_open(worker_url);
	struct auth_options o = { .store = db,
				  .store_offline_keys_s = 300,
				  .store_no_listen = true };
	struct auth_target t = { .db = db };
	struct buf msg = BUF_INIT;
	struct auth_new_key k;
	struct auth_store *st;
	char *home = tu_mkhome();

	make_guest(db, "cgi", &k);
	st = auth_store_open(home, &o);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	CU_ASSERT_EQUAL(check_once(st, k.token), AUTH_OK);
	CU_ASSERT_EQUAL(store_listen_fresh_ms(db, NULL), 0); /* no listener */
	CU_ASSERT_EQUAL(auth_key_revoke_at(&t, k.id, NULL, &msg), AUTH_KEY_OK);
	CU_ASSERT_EQUAL(check_once(st, k.token), AUTH_ERR_INVALID);
	auth_store_free(st);
	auth_new_key_wipe(&k);
	tu_rmhome(home);
	buf_release(&msg);
	store_free(db);
}

/* ---- SQL injection ------------------------------------------------------------------------ */

static void test_injection_stored_verbatim(void)
{
	static const char *const evil_prov[] = { "x'); DROP TABLE olp_keys; --" };
	static const char *const ok_prov[] = { "a.b_c-d" };
	static const char name[] = "x'); DROP TABLE olp_keys; -- $1 \\ \" ' ;";
	static const char notes[] = "'; UPDATE olp_keys SET manifest = '{}'; -- \xc3\xa9";
	struct store_db *db = db_open(worker_url);
	struct auth_key_spec spec = { .name = name,
				      .tier = AUTH_TIER_GUEST,
				      .notes = notes,
				      .providers = ok_prov,
				      .n_providers = 1 };
	struct auth_target t = { .db = db };
	struct auth_key_list list;
	struct buf msg = BUF_INIT;
	struct auth_new_key k, refused;
	bool seen = false;

	make_key_in(db, &spec, &k);
	spec.providers = evil_prov;
	CU_ASSERT_EQUAL(auth_key_create_at(&t, &spec, &refused, &msg), AUTH_KEY_ERR_INVALID_ARG);
	CU_ASSERT_EQUAL(auth_key_revoke_at(&t, "a' OR '1'='1", NULL, &msg),
			AUTH_KEY_ERR_INVALID_ARG);
	CU_ASSERT_EQUAL(auth_key_list_at(&t, &list, &msg), AUTH_KEY_OK);
	CU_ASSERT_TRUE(list.n >= 1);
	for (size_t i = 0; i < list.n; i++) {
		if (strcmp(list.keys[i].id, k.id) != 0)
			continue;
		seen = true;
		CU_ASSERT_STRING_EQUAL(list.keys[i].name, name);
		CU_ASSERT_STRING_EQUAL(list.keys[i].notes, notes);
		CU_ASSERT_STRING_EQUAL(list.keys[i].providers[0], "a.b_c-d");
	}
	CU_ASSERT_TRUE(seen);
	CU_ASSERT_EQUAL(list.n_skipped, 0); /* no manifest was emptied */
	auth_key_list_release(&list);
	auth_new_key_wipe(&k);
	buf_release(&msg);
	store_free(db);
}

/* ---- migrate ------------------------------------------------------------------------------ */

static char *rows_dump(void)
{
	return admin_value("SELECT string_agg(id || ' ' || generation || ' ' || manifest::text,"
			   " E'\\n' ORDER BY id) FROM olp_keys WHERE id IN"
			   " ('own3r0k1', 'gu3st0k1', 'r3vok3d1')",
			   0, NULL);
}

static void test_migrate_twice(void)
{
	struct store_db *db = db_open(worker_url);
	struct auth_migrate_report rep;
	struct buf msg = BUF_INIT;
	struct auth_identity id;
	struct auth_store *st;
	char *home = tu_mkhome(), *shome, *before, *after;

	CU_ASSERT_EQUAL_FATAL(tu_copy_tree(AUTH_FIXTURE_DIR, home), 0);
	CU_ASSERT_EQUAL_FATAL(auth_key_migrate(home, db, &rep, &msg), AUTH_KEY_OK);
	CU_ASSERT_EQUAL(rep.copied, 3);
	CU_ASSERT_EQUAL(rep.unchanged, 0);
	before = rows_dump();
	CU_ASSERT_EQUAL(auth_key_migrate(home, db, &rep, &msg), AUTH_KEY_OK);
	CU_ASSERT_EQUAL(rep.copied, 0);
	CU_ASSERT_EQUAL(rep.unchanged, 3);
	after = rows_dump();
	CU_ASSERT_PTR_NOT_NULL_FATAL(before);
	CU_ASSERT_PTR_NOT_NULL_FATAL(after);
	CU_ASSERT_STRING_EQUAL(before, after);
	/* Another id with the owner's token: refused whole, and the hash never shown. */
	{
		char *dup = tu_mkhome();
		struct auth_migrate_report r2;

		tu_write_manifest(dup, "copy0001",
				  "{\"schema_version\": 1, \"id\": \"copy0001\", \"name\": \"c\","
				  " \"token_hash\": \"" FIX_OWNER_HASH "\","
				  " \"owner_tier\": \"guest\", \"providers_enabled\": \"*\"}");
		CU_ASSERT_EQUAL(auth_key_migrate(dup, db, &r2, &msg), AUTH_KEY_ERR_SYSTEM);
		CU_ASSERT_PTR_NOT_NULL(strstr(msg.data, "copy0001"));
		CU_ASSERT_PTR_NULL(strstr(msg.data, FIX_OWNER_HASH));
		CU_ASSERT_EQUAL(r2.copied, 0);
		tu_rmhome(dup);
	}
	/* The migrated keys mean what they meant in the files. */
	st = store_over(db, 300, &shome);
	CU_ASSERT_EQUAL(check_tok(st, FIX_OWNER_TOKEN, &id), AUTH_OK);
	CU_ASSERT_EQUAL(id.tier, AUTH_TIER_OWNER);
	CU_ASSERT_STRING_EQUAL(id.key_id, "own3r0k1");
	auth_identity_release(&id);
	CU_ASSERT_EQUAL(check_once(st, FIX_REVOKED_TOKEN), AUTH_ERR_INVALID);
	auth_store_free(st);
	free(before);
	free(after);
	tu_rmhome(shome);
	tu_rmhome(home);
	buf_release(&msg);
	store_free(db);
}

/* The file store, through the _at functions, is what it was. */
static void test_files_target_unchanged(void)
{
	static const struct auth_options no_opts = { .allow_anonymous = false };
	struct auth_key_spec spec = { .name = "filed", .tier = AUTH_TIER_GUEST };
	struct auth_new_key k;
	struct buf msg = BUF_INIT;
	struct auth_store *st;
	char *home = tu_mkhome();
	json_t *m;

	CU_ASSERT_EQUAL_FATAL(auth_key_create_at(AUTH_TARGET_FILES(home), &spec, &k, &msg),
			      AUTH_KEY_OK);
	m = tu_manifest(home, k.id);
	CU_ASSERT_PTR_NOT_NULL(m);
	json_decref(m);
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_EQUAL(check_once(st, k.token), AUTH_OK);
	CU_ASSERT_EQUAL(auth_key_revoke_at(AUTH_TARGET_FILES(home), k.id, NULL, &msg), AUTH_KEY_OK);
	CU_ASSERT_EQUAL(check_once(st, k.token), AUTH_ERR_INVALID); /* on the next call */
	auth_store_free(st);
	auth_new_key_wipe(&k);
	buf_release(&msg);
	tu_rmhome(home);
}

static const struct ts_test pg_tests[] = {
	{ "schema init twice", test_schema_init_twice },
	{ "workers' role cannot change the schema", test_worker_cannot_create },
	{ "create, check, list, revoke", test_create_check_list_revoke },
	{ "one active owner", test_owner_once },
	{ "quota and login", test_quota_and_login },
	{ "last_used_at batched", test_touch_batched },
	{ "a second host sees a revocation within 2 s", test_second_host_revocation },
	{ "a lost notification: refused within 2 s", test_lost_notification },
	{ "threads checking while keys change", test_threads_and_changes },
	{ "no listener (one request per process)", test_no_listen },
	{ "SQL injection stored verbatim", test_injection_stored_verbatim },
	{ "migrate twice", test_migrate_twice },
	{ "the file target unchanged", test_files_target_unchanged },
	{ "the database away and back", test_database_away },
	{ NULL, NULL },
};

int main(void)
{
	worker_url = getenv("OLP_TEST_PG_URL");
	admin_url = getenv("OLP_TEST_PG_ADMIN_URL");
	if (!worker_url || !admin_url || !getenv("OLP_TEST_PG_DIR")) {
		fprintf(stderr, "test_auth_pg: run under tests/pg/with-pg.sh (no PostgreSQL)\n");
		return 77;
	}
	return ts_exit_status(ts_cunit_run("auth_pg", pg_tests));
}
