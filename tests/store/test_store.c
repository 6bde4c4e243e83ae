/* CUnit suite for store/: the URL rules (no password in it, the public form), where the
 * URL comes from (OLP_STORE over config.json), the passfile's mode, the pool (its cap,
 * waiting, close-on-exec sockets), the database taken away and given back (health,
 * answering at once while away, recovery without reopening), versioned schemas and the
 * workers' data-only rights, and the LISTEN thread (notifications, freshness, a resync
 * after a restart). Runs under tests/pg/with-pg.sh, against a real PostgreSQL; the tests
 * that need no server run without one. */
#include "tests/support/cunit.h"
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "store/store.h"
#include "common/banned.h"

static char tmproot[] = "/tmp/olp-store-test-XXXXXX";
static const char *pg_url, *pg_admin_url, *pg_ctl;

static int run_ctl(const char *verb)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "'%s' %s", pg_ctl, verb);
	return system(cmd);
}

static void test_url_check(void)
{
	struct buf err = BUF_INIT;

	CU_ASSERT(store_url_check("postgresql://olp@db.example:5432/olp", &err) == 0);
	CU_ASSERT(store_url_check("postgres://olp@db/olp?sslmode=verify-full", &err) == 0);
	CU_ASSERT(err.len == 0);
	CU_ASSERT(store_url_check("postgresql://olp:secret@db/olp", &err) == -1);
	CU_ASSERT(strstr(err.data, "password") != NULL);
	CU_ASSERT(strstr(err.data, "secret") == NULL); /* never echoed */
	buf_reset(&err);
	CU_ASSERT(store_url_check("postgresql://olp@db/olp?password=secret", &err) == -1);
	CU_ASSERT(strstr(err.data, "secret") == NULL);
	buf_reset(&err);
	CU_ASSERT(store_url_check("mysql://olp@db/olp", &err) == -1);
	CU_ASSERT(store_url_check("host=db dbname=olp", &err) == -1);
	CU_ASSERT(store_url_check("", &err) == -1);
	CU_ASSERT(store_url_check("postgresql://olp@db/olp?nosuchparam=1", &err) == -1);
	buf_release(&err);
}

static void test_url_public(void)
{
	char out[128];

	store_url_public("postgresql://olp@db.example:6543/olp?sslmode=verify-full", out,
			 sizeof(out));
	CU_ASSERT_STRING_EQUAL(out, "postgresql://db.example:6543/olp");
	store_url_public("postgresql://u@h/d", out, sizeof(out));
	CU_ASSERT_STRING_EQUAL(out, "postgresql://h/d");
	store_url_public("not a url ::", out, sizeof(out));
	CU_ASSERT_STRING_EQUAL(out, "");
}

static void write_file(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT(write_all(fd, text, strlen(text)) == 0);
	CU_ASSERT(fchmod(fd, mode) == 0);
	close(fd);
}

static void test_url_resolve(void)
{
	char home[256], cfg[300];
	struct buf err = BUF_INIT;
	char *url, *pass;

	snprintf(home, sizeof(home), "%s/resolve", tmproot);
	CU_ASSERT_FATAL(mkdir(home, 0700) == 0);
	snprintf(cfg, sizeof(cfg), "%s/config.json", home);
	unsetenv("OLP_STORE");
	/* No config.json: the embedded store. */
	CU_ASSERT(store_url_resolve(home, &url, &pass, &err) == 0);
	CU_ASSERT(url == NULL && pass == NULL);
	write_file(cfg, "{\"store\":\"postgresql://a@h/d\",\"store_passfile\":\"/p\"}", 0600);
	CU_ASSERT(store_url_resolve(home, &url, &pass, &err) == 0);
	CU_ASSERT(url && !strcmp(url, "postgresql://a@h/d"));
	CU_ASSERT(pass && !strcmp(pass, "/p"));
	free(url);
	free(pass);
	/* The environment wins. */
	setenv("OLP_STORE", "postgresql://b@h2/d2", 1);
	CU_ASSERT(store_url_resolve(home, &url, &pass, &err) == 0);
	CU_ASSERT(url && !strcmp(url, "postgresql://b@h2/d2"));
	free(url);
	free(pass);
	setenv("OLP_STORE", "postgresql://b:pw@h2/d2", 1);
	CU_ASSERT(store_url_resolve(home, &url, &pass, &err) == -1);
	CU_ASSERT(url == NULL && pass == NULL);
	unsetenv("OLP_STORE");
	buf_reset(&err);
	write_file(cfg, "{\"store\": 5}", 0600);
	CU_ASSERT(store_url_resolve(home, &url, &pass, &err) == -1);
	CU_ASSERT(strstr(err.data, "\"store\"") != NULL);
	buf_reset(&err);
	write_file(cfg, "{\"store\": ", 0600);
	CU_ASSERT(store_url_resolve(home, &url, &pass, &err) == -1);
	CU_ASSERT(strstr(err.data, "config.json") != NULL);
	buf_reset(&err);
	write_file(cfg, "{\"listen\": 1}", 0600);
	CU_ASSERT(store_url_resolve(home, &url, &pass, &err) == 0);
	CU_ASSERT(url == NULL);
	buf_release(&err);
}

/* store_open with o (a URL nothing listens on): the reason it refused, or "" if it opened. */
static void open_refusal(const struct store_options *o, char *why, size_t n)
{
	struct buf err = BUF_INIT;
	struct store_db *db = store_open("postgresql://u@127.0.0.1:1/d", o, &err);

	snprintf(why, n, "%s", db ? "" : err.data);
	store_free(db);
	buf_release(&err);
}

/* As the user nobody, in a child: whether store_open refuses path (a root-owned 0600
 * file nobody cannot open) naming it. 1 refused, 0 opened, -1 could not test. */
static int refused_as_nobody(const char *path)
{
	struct store_options o = { .passfile = path };
	char why[512];
	pid_t pid;
	int status;

	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		if (setgid(65534) < 0 || setuid(65534) < 0)
			_exit(3);
		open_refusal(&o, why, sizeof(why));
		_exit(strstr(why, "Permission denied") ? 1 : *why ? 2 : 0);
	}
	if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) > 2)
		return -1;
	return WEXITSTATUS(status) == 1;
}

/* The passfile libpq would read, refused at start when libpq would skip it (and every
 * connection fail for want of a password): config.json's store_passfile, else
 * PGPASSFILE's; readable by others, not a regular file, missing, or one this process
 * cannot open. */
static void test_passfile_mode(void)
{
	const char *env = getenv("PGPASSFILE");
	char *saved = env ? strdup(env) : NULL;
	char path[256], good[256], why[512];
	struct store_options o = { 0 };

	snprintf(path, sizeof(path), "%s/pgpass", tmproot);
	snprintf(good, sizeof(good), "%s/pgpass-0600", tmproot);
	write_file(path, "127.0.0.1:1:*:u:p\n", 0644);
	write_file(good, "127.0.0.1:1:*:u:p\n", 0600);
	o.passfile = path;
	open_refusal(&o, why, sizeof(why));
	CU_ASSERT(strstr(why, "store_passfile") && strstr(why, "chmod 0600"));
	o.passfile = good;
	open_refusal(&o, why, sizeof(why));
	CU_ASSERT_STRING_EQUAL(why, "");

	/* No store_passfile: PGPASSFILE's file is held to the same rules. */
	o.passfile = NULL;
	setenv("PGPASSFILE", path, 1);
	open_refusal(&o, why, sizeof(why));
	CU_ASSERT(strstr(why, "PGPASSFILE") && strstr(why, "chmod 0600"));
	setenv("PGPASSFILE", tmproot, 1);
	open_refusal(&o, why, sizeof(why));
	CU_ASSERT(strstr(why, "not a regular file") != NULL);
	setenv("PGPASSFILE", "/nonexistent/pgpass", 1);
	open_refusal(&o, why, sizeof(why));
	CU_ASSERT(strstr(why, "No such file") != NULL);
	setenv("PGPASSFILE", good, 1);
	open_refusal(&o, why, sizeof(why));
	CU_ASSERT_STRING_EQUAL(why, "");
	/* store_passfile wins over PGPASSFILE, as libpq's passfile keyword does. */
	setenv("PGPASSFILE", path, 1);
	o.passfile = good;
	open_refusal(&o, why, sizeof(why));
	CU_ASSERT_STRING_EQUAL(why, "");

	/* 0600 but another user's: the workers' user cannot read it. */
	if (geteuid() == 0) {
		chmod(tmproot, 0755);
		CU_ASSERT_EQUAL(refused_as_nobody(good), 1);
		chmod(tmproot, 0700);
	} else {
		char mine[256];

		snprintf(mine, sizeof(mine), "%s/pgpass-0000", tmproot);
		write_file(mine, "127.0.0.1:1:*:u:p\n", 0000);
		o.passfile = mine;
		open_refusal(&o, why, sizeof(why));
		CU_ASSERT(strstr(why, "Permission denied") != NULL);
	}
	if (saved)
		setenv("PGPASSFILE", saved, 1);
	else
		unsetenv("PGPASSFILE");
	free(saved);
}

/* A store of the workers' role; skips (NULL) without a server. */
static struct store_db *open_worker(unsigned max_conns)
{
	struct store_options o = { .max_conns = max_conns, .application_name = "test_store" };
	struct buf err = BUF_INIT;
	struct store_db *db;

	if (!pg_url)
		return NULL;
	db = store_open(pg_url, &o, &err);
	CU_ASSERT_PTR_NOT_NULL(db);
	buf_release(&err);
	return db;
}

static void test_exec(void)
{
	struct store_db *db = open_worker(0);
	const char *p[2] = { "it's; DROP TABLE x; --", NULL };
	struct store_health h;
	PGconn *c;
	PGresult *r;
	int flags;

	if (!db)
		return;
	c = store_conn_get(db, 1000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	/* A parameter is data, whatever it holds; NULL is SQL NULL. */
	r = store_exec(db, c, "SELECT $1::text, $2::text IS NULL", 2, p, NULL, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	CU_ASSERT_STRING_EQUAL(PQgetvalue(r, 0, 0), p[0]);
	CU_ASSERT_STRING_EQUAL(PQgetvalue(r, 0, 1), "t");
	PQclear(r);
	/* A failed statement: NULL, its SQLSTATE, the connection still fine. */
	r = store_exec(db, c, "SELECT * FROM no_such_table", 0, NULL, NULL, NULL);
	CU_ASSERT(r == NULL);
	CU_ASSERT_STRING_EQUAL(store_last_sqlstate(), "42P01");
	/* A child must inherit no descriptor of the store. */
	flags = fcntl(PQsocket(c), F_GETFD);
	CU_ASSERT(flags >= 0 && (flags & FD_CLOEXEC));
	store_conn_put(db, c, false);
	store_health(db, &h);
	CU_ASSERT(h.ok);
	CU_ASSERT(h.failing_since_ms == 0);
	CU_ASSERT(strstr(h.where, "127.0.0.1") != NULL);
	CU_ASSERT(strstr(h.where, "olp_worker") == NULL);
	store_free(db);
}

static void test_pool_cap(void)
{
	struct store_db *db = open_worker(2);
	PGconn *a, *b, *c;
	uint64_t t0;

	if (!db)
		return;
	a = store_conn_get(db, 100);
	b = store_conn_get(db, 100);
	CU_ASSERT_FATAL(a && b && a != b);
	t0 = mono_ms();
	errno = 0;
	c = store_conn_get(db, 150);
	CU_ASSERT(c == NULL && errno == ETIMEDOUT);
	CU_ASSERT(mono_ms() - t0 >= 140);
	store_conn_put(db, a, false);
	c = store_conn_get(db, 100);
	CU_ASSERT(c == a); /* the idle one, not a third */
	store_conn_put(db, b, false);
	store_conn_put(db, c, false);
	store_free(db);
}

/* SELECT 1 through db: 0, or -1. */
static int ping(struct store_db *db)
{
	PGconn *c = store_conn_get(db, 500);
	bool broken = false;
	PGresult *r;

	if (!c)
		return -1;
	r = store_exec(db, c, "SELECT 1", 0, NULL, NULL, &broken);
	store_conn_put(db, c, broken || !r);
	PQclear(r);
	return r ? 0 : -1;
}

static void test_away_and_back(void)
{
	struct store_db *db = open_worker(0);
	struct store_health h;
	uint64_t t0;
	int i, ok = 0;

	if (!db)
		return;
	CU_ASSERT(ping(db) == 0);
	CU_ASSERT_FATAL(run_ctl("stop") == 0);
	/* The idle connection dies with the server; the store says so. */
	CU_ASSERT(ping(db) == -1);
	store_health(db, &h);
	CU_ASSERT(!h.ok);
	CU_ASSERT(h.failing_since_ms > 0);
	CU_ASSERT(*h.last_error);
	/* While away, a thread is answered at once, not after a connect timeout. */
	(void)ping(db);
	t0 = mono_ms();
	for (i = 0; i < 20; i++)
		CU_ASSERT(ping(db) == -1);
	CU_ASSERT(mono_ms() - t0 < 500);
	CU_ASSERT_FATAL(run_ctl("start") == 0);
	/* Back within 10 s, without reopening the store. */
	t0 = mono_ms();
	while (mono_ms() - t0 < 10000 && !ok) {
		ok = ping(db) == 0;
		if (!ok)
			usleep(100000);
	}
	CU_ASSERT(ok);
	store_health(db, &h);
	CU_ASSERT(h.ok);
	CU_ASSERT(h.failing_since_ms == 0);
	store_free(db);
}

static const char *const t_steps[] = {
	"CREATE TABLE store_t (id integer PRIMARY KEY, v text NOT NULL)",
	"ALTER TABLE store_t ADD COLUMN w integer NOT NULL DEFAULT 0",
};

static void test_schema(void)
{
	struct store_schema v1 = { "store_test", t_steps, 1 }, v2 = { "store_test", t_steps, 2 };
	const struct store_schema *s1[] = { &v1 }, *s2[] = { &v2 };
	struct store_db *adm, *db = open_worker(0);
	struct buf msg = BUF_INIT;
	unsigned found;
	PGconn *c;
	PGresult *r;

	if (!db)
		return;
	adm = store_open(pg_admin_url, NULL, &msg);
	CU_ASSERT_PTR_NOT_NULL_FATAL(adm);
	CU_ASSERT(store_schema_check(db, &v1, &found) == -ENOENT);
	CU_ASSERT(store_schema_apply(adm, s1, 1, "olp_worker", &msg) == 0);
	CU_ASSERT(strstr(msg.data, "store_test: version 0 -> 1") != NULL);
	CU_ASSERT(store_schema_check(db, &v1, &found) == 0 && found == 1);
	CU_ASSERT(store_schema_check(db, &v2, &found) == -EPROTO && found == 1);
	buf_reset(&msg);
	CU_ASSERT(store_schema_apply(adm, s2, 1, "olp_worker", &msg) == 0);
	CU_ASSERT(strstr(msg.data, "version 1 -> 2") != NULL);
	buf_reset(&msg);
	CU_ASSERT(store_schema_apply(adm, s2, 1, "olp_worker", &msg) == 0);
	CU_ASSERT(strstr(msg.data, "version 2, current") != NULL);
	/* An older olp refuses the newer database, and leaves it as it is. */
	buf_reset(&msg);
	CU_ASSERT(store_schema_apply(adm, s1, 1, NULL, &msg) == -1);
	CU_ASSERT(strstr(msg.data, "newer") != NULL);
	CU_ASSERT(store_schema_check(db, &v2, &found) == 0);
	/* The workers' role: data, not schema. */
	c = store_conn_get(db, 1000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	r = store_exec(db, c, "INSERT INTO store_t (id, v) VALUES (1, 'a')", 0, NULL, NULL, NULL);
	CU_ASSERT(r != NULL);
	PQclear(r);
	r = store_exec(db, c, "CREATE TABLE store_u (x integer)", 0, NULL, NULL, NULL);
	CU_ASSERT(r == NULL);
	CU_ASSERT_STRING_EQUAL(store_last_sqlstate(), "42501");
	r = store_exec(db, c, "UPDATE olp_schema SET version = 9", 0, NULL, NULL, NULL);
	CU_ASSERT(r == NULL);
	CU_ASSERT_STRING_EQUAL(store_last_sqlstate(), "42501");
	store_conn_put(db, c, false);
	/* Nor can it run the upgrade itself. */
	buf_reset(&msg);
	CU_ASSERT(store_schema_apply(db, s2, 1, NULL, &msg) == -1);
	CU_ASSERT(strstr(msg.data, "permission denied") != NULL);
	buf_release(&msg);
	store_free(adm);
	store_free(db);
}

/* A store over TLS whose certificate is checked (sslmode=verify-full): connected, and the
 * session is encrypted; a CA that did not sign the server's certificate: refused. */
static void test_tls(void)
{
	const char *ca = getenv("OLP_TEST_PG_CA");
	const char *port = getenv("OLP_TEST_PG_PORT");
	char url[512], other_ca[300];
	struct buf err = BUF_INIT;
	struct store_health h;
	struct store_db *db;
	PGconn *c;
	PGresult *r;

	if (!pg_url || !ca || !port)
		return;
	snprintf(url, sizeof(url),
		 "postgresql://olp_worker@127.0.0.1:%s/olp?sslmode=verify-full&sslrootcert=%s",
		 port, ca);
	db = store_open(url, NULL, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(db);
	c = store_conn_get(db, 2000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	r = store_exec(db, c, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", 0, NULL,
		       NULL, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	CU_ASSERT_STRING_EQUAL(PQgetvalue(r, 0, 0), "t");
	PQclear(r);
	store_conn_put(db, c, false);
	store_free(db);
	/* Another CA: the server is not who it says it is. */
	snprintf(other_ca, sizeof(other_ca), "%s/other-ca.crt", tmproot);
	snprintf(url, sizeof(url),
		 "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=other "
		 "-keyout %s/other-ca.key -out %s >/dev/null 2>&1",
		 tmproot, other_ca);
	CU_ASSERT_FATAL(system(url) == 0);
	snprintf(url, sizeof(url),
		 "postgresql://olp_worker@127.0.0.1:%s/olp?sslmode=verify-full&sslrootcert=%s",
		 port, other_ca);
	db = store_open(url, NULL, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(db);
	CU_ASSERT(store_conn_get(db, 500) == NULL);
	store_health(db, &h);
	CU_ASSERT(!h.ok);
	CU_ASSERT(strstr(h.last_error, "certificate") != NULL);
	store_free(db);
	buf_release(&err);
}

struct heard {
	atomic_int notes;
	atomic_int resyncs;
	char last[64];
};

static void on_note(void *arg, const char *payload)
{
	struct heard *h = arg;

	snprintf(h->last, sizeof(h->last), "%s", payload);
	atomic_fetch_add(&h->notes, 1);
}

static void on_resync(void *arg)
{
	struct heard *h = arg;

	atomic_fetch_add(&h->resyncs, 1);
}

/* Wait up to ms for *v to reach at least want. */
static bool wait_for(atomic_int *v, int want, unsigned ms)
{
	uint64_t t0 = mono_ms();

	while (atomic_load(v) < want && mono_ms() - t0 < ms)
		usleep(20000);
	return atomic_load(v) >= want;
}

static void notify(struct store_db *db, const char *payload)
{
	const char *p[1] = { payload };
	PGconn *c = store_conn_get(db, 1000);
	PGresult *r;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	r = store_exec(db, c, "SELECT pg_notify('store_test', $1)", 1, p, NULL, NULL);
	CU_ASSERT(r != NULL);
	PQclear(r);
	store_conn_put(db, c, false);
}

static void test_listen(void)
{
	struct store_db *db = open_worker(0), *other = open_worker(0);
	struct heard h = { 0 };
	uint64_t epoch, epoch2;
	int64_t f1, f2;
	int ok;

	if (!db || !other) {
		store_free(db);
		store_free(other);
		return;
	}
	CU_ASSERT(store_listen(db, "Bad-Name", on_note, on_resync, &h) == -EINVAL);
	CU_ASSERT(store_listen(db, "store_test", on_note, on_resync, &h) == 0);
	CU_ASSERT(store_listen_start(db) == 0);
	CU_ASSERT(store_listen(db, "later", on_note, on_resync, &h) == -EBUSY);
	CU_ASSERT(wait_for(&h.resyncs, 1, 5000));
	/* The freshness moves on with the round trips. */
	usleep(100000);
	f1 = store_listen_fresh_ms(db, &epoch);
	CU_ASSERT(f1 > 0);
	usleep(700000);
	f2 = store_listen_fresh_ms(db, &epoch2);
	CU_ASSERT(f2 > f1);
	CU_ASSERT(epoch2 == epoch);
	/* A notification from another "host" arrives, with its payload. */
	notify(other, "key-1");
	CU_ASSERT(wait_for(&h.notes, 1, 2000));
	CU_ASSERT_STRING_EQUAL(h.last, "key-1");
	/* A restart: the thread reconnects, resyncs, and a new epoch begins. */
	CU_ASSERT_FATAL(run_ctl("restart") == 0);
	CU_ASSERT(wait_for(&h.resyncs, 2, 10000));
	(void)store_listen_fresh_ms(db, &epoch2);
	CU_ASSERT(epoch2 > epoch);
	ok = 0;
	for (int i = 0; i < 50 && !ok; i++) {
		if (ping(other) == 0) {
			notify(other, "key-2");
			ok = wait_for(&h.notes, 2, 2000);
		} else {
			usleep(200000);
		}
	}
	CU_ASSERT(ok);
	CU_ASSERT_STRING_EQUAL(h.last, "key-2");
	store_free(db);
	store_free(other);
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "a URL: postgresql only, no password", test_url_check },
		{ "a URL's public form", test_url_public },
		{ "OLP_STORE over config.json", test_url_resolve },
		{ "a passfile others can read is refused", test_passfile_mode },
		{ "statements: parameters, failures, close-on-exec", test_exec },
		{ "the pool's cap and waiting", test_pool_cap },
		{ "the database away and back", test_away_and_back },
		{ "schemas: versions, newer refused, data-only rights", test_schema },
		{ "TLS with the certificate checked (verify-full)", test_tls },
		{ "notifications, freshness, resync after a restart", test_listen },
		{ NULL, NULL },
	};
	char cmd[128];
	int fails;

	pg_url = getenv("OLP_TEST_PG_URL");
	pg_admin_url = getenv("OLP_TEST_PG_ADMIN_URL");
	pg_ctl = getenv("OLP_TEST_PG_CTL");
	if (!pg_url || !pg_admin_url || !pg_ctl) {
		pg_url = pg_admin_url = pg_ctl = NULL;
		fprintf(stderr, "no PostgreSQL (run under tests/pg/with-pg.sh): the tests that "
				"need one do nothing\n");
	}
	if (!mkdtemp(tmproot)) {
		perror("mkdtemp");
		return 1;
	}
	fails = ts_cunit_run("store", tests);
	snprintf(cmd, sizeof(cmd), "rm -rf -- '%s'", tmproot);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmproot);
	return ts_exit_status(fails);
}
