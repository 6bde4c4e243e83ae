/* store: a process's connections to the shared PostgreSQL store, its statements and its
 * health (store.h, ADR 0034).
 *
 * A pool of at most max_conns libpq connections, opened when a thread needs one and none
 * is idle. A database that is away must not hold request threads: after a connection
 * attempt fails, the pool answers "away" at once for a second, then lets one thread try
 * again; so a worker notices the database's return within about a second of it and never
 * queues requests behind connect timeouts. A connection that breaks (the server restarted,
 * the network dropped) is closed with every idle one, which shared its fate. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "store/internal.h"
#include "common/banned.h"

#define STORE_MAX_CONNS_DEFAULT 4
#define STORE_CONNECT_TIMEOUT_DEFAULT 3
#define STORE_RETRY_MS 1000u

static _Thread_local char last_sqlstate[6];

const char *store_last_sqlstate(void)
{
	return last_sqlstate;
}

void store_note_ok(struct store_db *db)
{
	if (atomic_load(&db->ok))
		return;
	pthread_mutex_lock(&db->lock);
	if (!atomic_load(&db->ok) && db->failing_since_ms)
		log_info(NULL, "the store %s answers again", db->where);
	atomic_store(&db->ok, true);
	db->failing_since_ms = 0;
	pthread_mutex_unlock(&db->lock);
}

void store_note_failure(struct store_db *db, const char *why)
{
	bool first;
	size_t n;

	pthread_mutex_lock(&db->lock);
	first = !db->failing_since_ms;
	if (first)
		db->failing_since_ms = wall_ms();
	atomic_store(&db->ok, false);
	(void)snprintf(db->last_error, sizeof(db->last_error), "%s", why ? why : "failed");
	/* libpq's messages span lines ("\n\t"): one line, no trailing blank. */
	for (n = 0; db->last_error[n]; n++)
		if (db->last_error[n] == '\n' || db->last_error[n] == '\t')
			db->last_error[n] = ' ';
	while (n && db->last_error[n - 1] == ' ')
		db->last_error[--n] = '\0';
	if (first)
		log_warnx(NULL, "the store %s fails: %s", db->where, db->last_error);
	pthread_mutex_unlock(&db->lock);
}

void store_health(struct store_db *db, struct store_health *out)
{
	memset(out, 0, sizeof(*out));
	if (!db)
		return;
	pthread_mutex_lock(&db->lock);
	out->ok = atomic_load(&db->ok);
	out->failing_since_ms = db->failing_since_ms;
	(void)snprintf(out->last_error, sizeof(out->last_error), "%s", db->last_error);
	(void)snprintf(out->where, sizeof(out->where), "%s", db->where);
	pthread_mutex_unlock(&db->lock);
}

bool store_available(struct store_db *db)
{
	return db && atomic_load(&db->ok);
}

static void ignore_notice(void *arg, const char *message)
{
	(void)arg;
	(void)message;
}

PGconn *store_connect(struct store_db *db)
{
	char timeout[16];
	const char *keys[10], *vals[10];
	int n = 0;
	PGconn *c;

	(void)snprintf(timeout, sizeof(timeout), "%u", db->connect_timeout_s);
	/* dbname first: expanded from the URL, then the later keywords win over it. */
	keys[n] = "dbname", vals[n++] = db->url;
	keys[n] = "connect_timeout", vals[n++] = timeout;
	keys[n] = "application_name", vals[n++] = db->appname;
	/* A silent peer (a host gone, a cable pulled) is noticed in about 10 s, not hours. */
	keys[n] = "keepalives", vals[n++] = "1";
	keys[n] = "keepalives_idle", vals[n++] = "5";
	keys[n] = "keepalives_interval", vals[n++] = "2";
	keys[n] = "keepalives_count", vals[n++] = "3";
	if (db->passfile)
		keys[n] = "passfile", vals[n++] = db->passfile;
	keys[n] = NULL, vals[n] = NULL;
	c = PQconnectdbParams(keys, vals, 1);
	if (!c) {
		store_note_failure(db, "out of memory");
		return NULL;
	}
	if (PQstatus(c) != CONNECTION_OK) {
		store_note_failure(db, PQerrorMessage(c));
		PQfinish(c);
		return NULL;
	}
	/* The server's notices ("already exists, skipping") are not ours to print. */
	PQsetNoticeProcessor(c, ignore_notice, NULL);
	/* Every statement's time is UTC, whatever the server's default. */
	PQclear(PQexec(c, "SET TIME ZONE 'UTC'"));
	store_note_ok(db);
	return c;
}

/* A passfile libpq will read: a regular file this process can open, that group and others
 * cannot read. libpq skips one it cannot open, or one others can read (a warning on
 * stderr), and every connection then fails for want of a password: the worker would run
 * as if the database were away (503 for every key with a quota) instead of saying why.
 * Refused here, as it starts. what: where the path came from, for the message. */
static int check_passfile(const char *path, const char *what, struct buf *err)
{
	struct stat st;
	int fd, ret = -1;

	/* O_NONBLOCK: a FIFO named here must not hang the start. */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		buf_addf(err, "%s %s: %s (the workers' user must be able to read it)", what, path,
			 strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) < 0)
		buf_addf(err, "%s %s: %s", what, path, strerror(errno));
	else if (!S_ISREG(st.st_mode))
		buf_addf(err, "%s %s: not a regular file", what, path);
	else if (st.st_mode & 077)
		buf_addf(err, "%s %s: group or others can read it (chmod 0600 %s)", what, path,
			 path);
	else
		ret = 0;
	close(fd);
	return ret;
}

struct store_db *store_open(const char *url, const struct store_options *opt, struct buf *err)
{
	struct store_options none = { 0 };
	const char *passfile;
	struct store_db *db;
	PGconn *c;

	if (!opt)
		opt = &none;
	if (store_url_check(url, err))
		return NULL;
	/* The passfile libpq will use: the option's, else PGPASSFILE's (~/.pgpass and a
	 * service file are libpq's own business). */
	passfile = opt->passfile ? opt->passfile : getenv("PGPASSFILE");
	if (passfile && *passfile &&
	    check_passfile(passfile, opt->passfile ? "store_passfile" : "PGPASSFILE", err))
		return NULL;
	db = xcalloc(1, sizeof(*db));
	db->url = xstrdup(url);
	db->passfile = opt->passfile ? xstrdup(opt->passfile) : NULL;
	db->appname = xstrdup(opt->application_name ? opt->application_name : "olp");
	db->max_conns = opt->max_conns ? opt->max_conns : STORE_MAX_CONNS_DEFAULT;
	db->connect_timeout_s =
		opt->connect_timeout_s ? opt->connect_timeout_s : STORE_CONNECT_TIMEOUT_DEFAULT;
	store_url_public(url, db->where, sizeof(db->where));
	pthread_mutex_init(&db->lock, NULL);
	pthread_cond_init(&db->freed, NULL);
	pthread_mutex_init(&db->listen_lock, NULL);
	db->idle = xcalloc(db->max_conns, sizeof(PGconn *));
	db->wake[0] = db->wake[1] = -1;
	atomic_store(&db->ok, true);
	c = store_connect(db);
	if (c) {
		db->idle[db->n_idle++] = c;
		db->n_open = 1;
	} else {
		db->last_connect_fail_ms = mono_ms();
	}
	return db;
}

void store_free(struct store_db *db)
{
	if (!db)
		return;
	store_listen_stop(db);
	while (db->n_idle)
		PQfinish(db->idle[--db->n_idle]);
	free(db->idle);
	pthread_cond_destroy(&db->freed);
	pthread_mutex_destroy(&db->lock);
	pthread_mutex_destroy(&db->listen_lock);
	free(db->url);
	free(db->passfile);
	free(db->appname);
	free(db);
}

/* Wait on db->freed until deadline (mono ms): false once it has passed. Under db->lock. */
static bool wait_until(struct store_db *db, uint64_t deadline)
{
	struct timespec ts;
	uint64_t now = mono_ms();

	if (now >= deadline)
		return false;
	ts = clock_after_ms(CLOCK_MONOTONIC, deadline - now);
	(void)pthread_cond_timedwait(&db->freed, &db->lock, &ts);
	return true;
}

PGconn *store_conn_get(struct store_db *db, unsigned wait_ms)
{
	uint64_t deadline = mono_ms() + wait_ms;
	PGconn *c;

	pthread_mutex_lock(&db->lock);
	for (;;) {
		if (db->n_idle) {
			c = db->idle[--db->n_idle];
			pthread_mutex_unlock(&db->lock);
			return c;
		}
		if (db->last_connect_fail_ms &&
		    mono_ms() - db->last_connect_fail_ms < STORE_RETRY_MS) {
			pthread_mutex_unlock(&db->lock);
			errno = ECONNREFUSED;
			return NULL;
		}
		if (db->n_open < db->max_conns)
			break;
		if (!wait_until(db, deadline)) {
			pthread_mutex_unlock(&db->lock);
			errno = ETIMEDOUT;
			return NULL;
		}
	}
	db->n_open++;
	pthread_mutex_unlock(&db->lock);
	c = store_connect(db);
	pthread_mutex_lock(&db->lock);
	if (!c) {
		db->n_open--;
		db->last_connect_fail_ms = mono_ms();
		pthread_cond_broadcast(&db->freed);
		errno = ECONNREFUSED;
	} else {
		db->last_connect_fail_ms = 0;
	}
	pthread_mutex_unlock(&db->lock);
	return c;
}

void store_conn_put(struct store_db *db, PGconn *c, bool broken)
{
	PGconn *drop[16];
	unsigned n_drop = 0;

	if (!c)
		return;
	/* A transaction left open would hold its locks for the next user: never reuse it. */
	if (!broken && PQtransactionStatus(c) != PQTRANS_IDLE)
		broken = true;
	if (broken && PQstatus(c) != CONNECTION_OK)
		store_note_failure(db, PQerrorMessage(c));
	pthread_mutex_lock(&db->lock);
	if (broken) {
		db->n_open--;
		/* A server that dropped this one (a restart) dropped the idle ones too. */
		if (PQstatus(c) != CONNECTION_OK) {
			while (db->n_idle && n_drop < ARRAY_SIZE(drop)) {
				drop[n_drop++] = db->idle[--db->n_idle];
				db->n_open--;
			}
		}
	} else {
		db->idle[db->n_idle++] = c;
	}
	pthread_cond_broadcast(&db->freed);
	pthread_mutex_unlock(&db->lock);
	if (broken)
		PQfinish(c);
	while (n_drop)
		PQfinish(drop[--n_drop]);
}

/* Whether a failed statement's SQLSTATE or the connection says the connection is gone. */
static bool conn_failed(PGconn *c, const char *state)
{
	if (PQstatus(c) != CONNECTION_OK)
		return true;
	/* 08: connection exception; 57P01..57P03: the server is shutting down or starting. */
	return !strncmp(state, "08", 2) || !strncmp(state, "57P", 3);
}

PGresult *store_exec(struct store_db *db, PGconn *c, const char *sql, int n,
		     const char *const *params, struct buf *err, bool *broken)
{
	const char *state;
	ExecStatusType s;
	PGresult *r;

	last_sqlstate[0] = '\0';
	if (broken)
		*broken = false;
	r = PQexecParams(c, sql, n, NULL, params, NULL, NULL, 0);
	s = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
	if (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK) {
		store_note_ok(db);
		return r;
	}
	state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
	(void)snprintf(last_sqlstate, sizeof(last_sqlstate), "%s", state ? state : "");
	if (err)
		buf_adds(err, r ? PQresultErrorMessage(r) : PQerrorMessage(c));
	if (conn_failed(c, last_sqlstate)) {
		if (broken)
			*broken = true;
		store_note_failure(db, r ? PQresultErrorMessage(r) : PQerrorMessage(c));
	}
	PQclear(r);
	return NULL;
}
