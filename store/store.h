/* store: the shared PostgreSQL database of several OLP hosts (ADR 0034).
 *
 * A host keeps its keys in files and its usage in SQLite unless config.json names a
 * "store" (or OLP_STORE does): then keys, the ledger, the quota windows and the
 * concurrency leases of every host behind a load balancer live in one PostgreSQL
 * database. This module is what auth/ and usage/ share of it, and nothing else: where the
 * URL comes from and what it may hold, the connections of a process (a small pool, opened
 * lazily and again after a failure), the database's health as /health reports it, one
 * LISTEN connection that hands notifications to callbacks, and versioned schemas, one per
 * module. What the tables hold is the business of the module that owns them (auth/pg.c,
 * usage/pg.c); this module knows nothing of keys, quotas or HTTP.
 *
 * Credentials never travel in the URL: a URL with a password is refused. The password
 * comes from libpq's own mechanisms (a passfile named by config.json "store_passfile",
 * PGPASSFILE, ~/.pgpass, or a pg_service.conf service), and a passfile must be a regular
 * file that only its owner can read, as libpq itself requires. TLS is libpq's:
 * ?sslmode=verify-full&sslrootcert=... in the URL.
 *
 * Statements are libpq's PQexecParams (parameters, never text pasted into SQL); every
 * descriptor libpq opens is close-on-exec (libpq sets FD_CLOEXEC on its sockets), so a
 * sandboxed child inherits none.
 *
 * Threads: a store_db is shared by every thread of a process. A connection taken with
 * store_conn_get belongs to the caller until store_conn_put. */
#ifndef OLP_STORE_H
#define OLP_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

struct buf; /* common/common.h */

/* ---- where the store is ---------------------------------------------------------------- */

/* The store this host uses: OLP_STORE when set and non-empty, else config.json's "store"
 * in olp_home (a missing file or field: the embedded store). *url gets a heap copy, or
 * NULL for the embedded store (key files and SQLite); *passfile the heap copy of
 * config.json's "store_passfile" or NULL. 0, or -1 with the reason in err (a config.json
 * that does not parse, a "store" that is not a string, a URL store_url_check refuses). */
int store_url_resolve(const char *olp_home, char **url, char **passfile, struct buf *err);

/* Whether url names a store this build can use and carries no secret: "postgresql://" or
 * "postgres://", no password (user:password@), no "password=" parameter. 0, or -1 with the
 * reason in err. */
int store_url_check(const char *url, struct buf *err);

/* url with any user info and parameters removed, for logs and /health:
 * "postgresql://HOST:PORT/DB". Writes at most n bytes (NUL-terminated). */
void store_url_public(const char *url, char *out, size_t n);

/* ---- a process's connections ------------------------------------------------------------ */

struct store_options {
	const char *passfile;	      /* libpq passfile, or NULL (libpq's defaults); copied */
	unsigned max_conns;	      /* connections of this process at most (0: 4) */
	unsigned connect_timeout_s;   /* libpq connect_timeout (0: 3) */
	const char *application_name; /* e.g. "olp-fcgi" (NULL: "olp"); copied */
};

/* An open store: opaque, thread-safe. */
struct store_db;

/* A store for url (checked with store_url_check; the passfile, opt->passfile or else
 * PGPASSFILE when set, must be a regular file this process can read and group and others
 * cannot: libpq would skip any other and every connection fail). Connects once to find
 * out whether the database can be reached, but returns the store either way: it retries
 * later (see store_conn_get). NULL with the reason in err only for a URL or passfile it
 * refuses. Copies what it keeps. */
struct store_db *store_open(const char *url, const struct store_options *opt, struct buf *err);
/* Close every connection, stop the listener thread (store_listen) and free db (NULL is
 * fine). No other thread may use db during or after the call. */
void store_free(struct store_db *db);

/* A connection for one transaction or statement, waiting at most wait_ms for another
 * thread to give one back when all max_conns are in use. When none is idle and the pool
 * may grow, one is opened; when the database could not be reached in the last second,
 * NULL is returned at once (no thread waits on a dead database). NULL: errno ETIMEDOUT
 * (the pool stayed busy) or ECONNREFUSED (the database is away: store_health says why). */
PGconn *store_conn_get(struct store_db *db, unsigned wait_ms);
/* Give c back. broken: it failed in a way that leaves its state unknown (the connection
 * dropped, a transaction left open); it is closed, and the store marked failing when
 * PQstatus says the connection is gone. */
void store_conn_put(struct store_db *db, PGconn *c, bool broken);

/* Run sql with params (text parameters, n of them; a NULL entry is SQL NULL) on c. The
 * result when its status is PGRES_COMMAND_OK or PGRES_TUPLES_OK (PQclear it), else NULL
 * with the server's message in err (may be NULL) and *broken (may be NULL) set when the
 * connection itself failed. A failure of the connection marks the store failing. */
PGresult *store_exec(struct store_db *db, PGconn *c, const char *sql, int n,
		     const char *const *params, struct buf *err, bool *broken);

/* The SQLSTATE of the last failure store_exec saw on this thread ("40001", "23505"...),
 * or "" when it had none. */
const char *store_last_sqlstate(void);

/* Record that the database answered (ok) or failed (the message, never a secret), for
 * store_health. store_exec and store_conn_get call these; a module calls them for a
 * failure it finds on its own. */
void store_note_ok(struct store_db *db);
void store_note_failure(struct store_db *db, const char *why);

struct store_health {
	bool ok;		  /* the last attempt reached the database */
	int64_t failing_since_ms; /* wall clock ms of the first failure of this outage, or 0 */
	char last_error[160];	  /* the last failure's message, or "" */
	char where[128];	  /* store_url_public */
};
void store_health(struct store_db *db, struct store_health *out);
/* Whether the last attempt reached the database: store_health's ok, without its lock. */
bool store_available(struct store_db *db);

/* ---- notifications ---------------------------------------------------------------------- */

/* Called on the listener thread for each notification on its channel (payload may be
 * ""). Must be quick and must not call back into the store. */
typedef void (*store_notify_fn)(void *arg, const char *payload);
/* Called on the listener thread each time its connection was (re)established and its
 * LISTENs issued, before any notification on it: whatever was cached before may have
 * missed changes and must be dropped. */
typedef void (*store_resync_fn)(void *arg);

/* LISTEN on channel (an SQL identifier: [a-z_][a-z0-9_]*) from the one dedicated
 * connection of db, once store_listen_start has started its thread. Register every
 * channel first: 0, -EINVAL (a bad channel, more than 8), -EBUSY (the thread runs). */
int store_listen(struct store_db *db, const char *channel, store_notify_fn on_notify,
		 store_resync_fn on_resync, void *arg);
/* Stop calling the callbacks registered with arg (their owner is going away): once this
 * returns none of them runs again. The connection keeps its LISTEN (harmless); the
 * channels of a running thread cannot be registered again. */
void store_unlisten(struct store_db *db, void *arg);
/* Start the listener thread (once; later calls do nothing): it connects, LISTENs, and
 * makes a round trip at least every 500 ms so that a silent connection is noticed and
 * store_listen_fresh_ms moves; when the connection fails it tries again every second.
 * Its descriptors are close-on-exec. 0 or -errno. */
int store_listen_start(struct store_db *db);

/* A time (ms, mono_ms's clock) before which every committed change has been handed to
 * on_notify: the listener's last completed round trip, less a 250 ms margin. *epoch (may
 * be NULL) gets the connection's epoch, bumped at each reconnect (after on_resync). An
 * entry cached in the same epoch, with no notification for it since, is as fresh as the
 * database was at that time. 0 when the listener is not connected. */
int64_t store_listen_fresh_ms(struct store_db *db, uint64_t *epoch);

/* ---- schemas ---------------------------------------------------------------------------- */

/* One module's schema: versions 1..n, step[i] the SQL that takes it from version i to
 * i + 1 (several statements, no parameters). */
struct store_schema {
	const char *module; /* "keys", "usage": the row in olp_schema */
	const char *const *step;
	unsigned n;
};

/* Create or upgrade the schema of each module in one transaction under an advisory lock
 * (two operators running it at once do it once). The table olp_schema (module, version)
 * is created first. For each module msg gets a line "keys: version 1 -> 2" or "keys:
 * version 2, current". A database at a newer version than a module's n is refused and
 * left as it is. worker_role (may be NULL: none) is then granted SELECT, INSERT, UPDATE
 * and DELETE on every table of the schema and the use of its sequences, and SELECT only
 * on olp_schema: the workers' role needs data rights, never the right to change the
 * schema. 0, or -1 with the reason in msg. Needs a role that may create tables (the
 * operator's, not the workers'). */
int store_schema_apply(struct store_db *db, const struct store_schema *const *schemas, size_t n,
		       const char *worker_role, struct buf *msg);

/* Whether the database holds exactly version s->n of s->module: 0; -ENOENT (none yet:
 * "run olp-keys store init"), -EPROTO (older or newer, the version in *found), or the
 * -errno of a failure (the database away: -ECONNREFUSED). */
int store_schema_check(struct store_db *db, const struct store_schema *s, unsigned *found);

#endif
