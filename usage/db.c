/* usage: the ledger and the quota counters in one SQLite database per host (usage.h,
 * docs/adr/0020-usage-store.md, 0026-ledger-fails-closed.md). This file holds the
 * database: opening it (the file, WAL, the schema and its migration), the writer's and
 * the readers' connections, the statements, transactions, failures and health, and the
 * retention's pruning. The quota counters are in quota.c, the records and the readers'
 * queries in usage.c (internal.h).
 *
 * Schema (PRAGMA user_version 3):
 *   requests       one row per request (count 1), or per key, minute, status, provider,
 *                  model and account for refusals (count of them): numbers and names,
 *                  never content, tokens or hashes
 *   quota_windows  (key_id, kind, start_ms) -> requests, tokens: the fixed UTC minute
 *                  (kind 0) and day (kind 1) a key is in; pruned after two days
 *   quota_holds    tokens reserved by requests under way against their key's
 *                  tokens_per_day of a day, until settled or expired (a killed worker's)
 * Versions 1 (no count, no quota_holds) and 2 (no account) are migrated in place.
 * A newer user_version than this code knows is refused (an older olp must not write a
 * database a newer one migrated). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "common/common.h"
#include "usage/internal.h"
#include "usage/usage.h"
#include "common/banned.h"

#define USAGE_SCHEMA_VERSION 3
#define USAGE_BUSY_TIMEOUT_MS 2000
/* How long opening waits for other processes setting the same database up. */
#define USAGE_SETUP_PATIENCE_MS 10000u
#define USAGE_REOPEN_MS 10000u
#define USAGE_PRUNE_EVERY_MS 3600000u /* an hour */
#define USAGE_LOG_EVERY_MS 60000u     /* a minute */
#define USAGE_WINDOW_KEEP_MS (2 * 86400000LL)

/* The cached statements' SQL, by enum stmt_id (internal.h). */
static const char *const stmt_sql[ST__N] = {
	[ST_BEGIN] = "BEGIN IMMEDIATE",
	[ST_COMMIT] = "COMMIT",
	[ST_ROLLBACK] = "ROLLBACK",
	[ST_INSERT] = "INSERT INTO requests (ts_ms, key_id, provider, model, status,"
		      " prompt_tokens, completion_tokens, cached_tokens, duration_ms, ttfb_ms,"
		      " start, account) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
	/* A refusal into its minute's row (same binding as ST_INSERT, ?1 the minute's start):
	 * found by the (key_id, ts_ms) index. No row changed: the caller inserts one. */
	[ST_REFUSAL_ADD] = "UPDATE requests SET count = count + 1, duration_ms = duration_ms + ?9"
			   " WHERE key_id = ?2 AND ts_ms = ?1 AND status = ?5 AND start = 0"
			   " AND provider IS ?3 AND model IS ?4 AND account IS ?12"
			   " AND prompt_tokens = 0"
			   " AND completion_tokens = 0 AND cached_tokens = 0",
	[ST_ADD_TOKENS] = "INSERT INTO quota_windows (key_id, kind, start_ms, requests, tokens)"
			  " VALUES (?1, 1, ?2, 0, ?3) ON CONFLICT (key_id, kind, start_ms)"
			  " DO UPDATE SET tokens = tokens + excluded.tokens",
	/* A key's minute (?2) and day (?3): one statement each way, for the quota check is on
	 * every request's path (usage-bench). */
	[ST_WIN_GET] = "SELECT kind, requests, tokens FROM quota_windows WHERE key_id = ?1"
		       " AND ((kind = 0 AND start_ms = ?2) OR (kind = 1 AND start_ms = ?3))",
	[ST_WIN_TAKE] =
		"INSERT INTO quota_windows (key_id, kind, start_ms, requests, tokens)"
		" VALUES (?1, 0, ?2, 1, 0), (?1, 1, ?3, 1, 0)"
		" ON CONFLICT (key_id, kind, start_ms) DO UPDATE SET requests = requests + 1",
	[ST_WIN_REFUND] = "UPDATE quota_windows SET requests = max(requests - 1, 0)"
			  " WHERE key_id = ?1 AND ((kind = 0 AND start_ms = ?2)"
			  " OR (kind = 1 AND start_ms = ?3))",
	/* The key's reservations of a day (?2) still alive at ?3. */
	[ST_HELD] = "SELECT coalesce(sum(tokens), 0) FROM quota_holds WHERE key_id = ?1"
		    " AND day_ms = ?2 AND expires_ms > ?3",
	[ST_HOLD_ADD] = "INSERT INTO quota_holds (key_id, day_ms, tokens, expires_ms)"
			" VALUES (?1, ?2, ?3, ?4)",
	[ST_HOLD_DROP] = "DELETE FROM quota_holds WHERE id = ?1",
	[ST_DAYS] = "SELECT key_id, COALESCE(provider, ''),"
		    " strftime('%Y-%m-%d', ts_ms / 1000, 'unixepoch') AS day, sum(count),"
		    " sum((status >= 400) * count), sum(prompt_tokens), sum(completion_tokens),"
		    " sum(cached_tokens), sum(duration_ms), sum(start = 2), sum(start = 3),"
		    " COALESCE(account, '')"
		    " FROM requests WHERE (?1 IS NULL OR key_id = ?1) AND ts_ms >= ?2"
		    " AND (?4 IS NULL OR account = ?4)"
		    " GROUP BY day, key_id, COALESCE(provider, ''), COALESCE(account, '')"
		    " ORDER BY day, key_id, COALESCE(provider, ''), COALESCE(account, '')",
	[ST_RECENT] = "SELECT ts_ms, key_id, COALESCE(provider, ''), COALESCE(model, ''), status,"
		      " prompt_tokens, completion_tokens, cached_tokens, duration_ms, ttfb_ms, "
		      "start, count, COALESCE(account, '')"
		      " FROM requests WHERE (?1 IS NULL OR key_id = ?1) AND ts_ms >= ?2"
		      " AND (?4 IS NULL OR account = ?4)"
		      " ORDER BY ts_ms DESC, id DESC LIMIT ?3",
	[ST_PRUNE_ROWS] = "DELETE FROM requests WHERE ts_ms < ?1",
	[ST_PRUNE_WINDOWS] = "DELETE FROM quota_windows WHERE start_ms < ?1",
	[ST_PRUNE_HOLDS] = "DELETE FROM quota_holds WHERE expires_ms < ?1",
};

/* Version 1. Every column is a number or a name the caller chose to store: no prompt, no
 * answer, no token, no hash (tests/usage checks the column list). */
static const char schema_v1[] = "CREATE TABLE requests ("
				" id INTEGER PRIMARY KEY,"
				" ts_ms INTEGER NOT NULL,"
				" key_id TEXT NOT NULL,"
				" provider TEXT,"
				" model TEXT,"
				" status INTEGER NOT NULL,"
				" prompt_tokens INTEGER NOT NULL,"
				" completion_tokens INTEGER NOT NULL,"
				" cached_tokens INTEGER NOT NULL,"
				" duration_ms INTEGER NOT NULL,"
				" ttfb_ms INTEGER NOT NULL,"
				" start INTEGER NOT NULL);"
				"CREATE INDEX requests_ts ON requests (ts_ms);"
				"CREATE INDEX requests_key_ts ON requests (key_id, ts_ms);"
				"CREATE TABLE quota_windows ("
				" key_id TEXT NOT NULL,"
				" kind INTEGER NOT NULL,"
				" start_ms INTEGER NOT NULL,"
				" requests INTEGER NOT NULL,"
				" tokens INTEGER NOT NULL,"
				" PRIMARY KEY (key_id, kind, start_ms)) WITHOUT ROWID;"
				"PRAGMA user_version = 1;";

/* Version 2 (ADR 0026): refusals counted in a row a minute (count), and the tokens
 * reserved by requests under way. AUTOINCREMENT: a hold's id is never reused, so a late
 * settlement of an expired hold cannot drop another request's. */
static const char schema_v2[] = "ALTER TABLE requests ADD COLUMN count INTEGER NOT NULL DEFAULT 1;"
				"CREATE TABLE quota_holds ("
				" id INTEGER PRIMARY KEY AUTOINCREMENT,"
				" key_id TEXT NOT NULL,"
				" day_ms INTEGER NOT NULL,"
				" tokens INTEGER NOT NULL,"
				" expires_ms INTEGER NOT NULL);"
				"CREATE INDEX quota_holds_key ON quota_holds (key_id, day_ms);"
				"PRAGMA user_version = 2;";

/* Version 3 (ADR 0037): the provider's account a request used; NULL for a request no
 * provider took, and for the rows written before. */
static const char schema_v3[] = "ALTER TABLE requests ADD COLUMN account TEXT;"
				"PRAGMA user_version = 3;";

/* SQLite result → -errno. Out of memory aborts: the tree has one OOM policy (common.h). */
static int sq_errno(sqlite3 *db, int rc)
{
	int sys;

	switch (rc & 0xff) {
	case SQLITE_OK:
	case SQLITE_DONE:
	case SQLITE_ROW: return 0;
	case SQLITE_NOMEM: log_errx(NULL, "usage: sqlite ran out of memory"); abort();
	case SQLITE_BUSY:
	case SQLITE_LOCKED: return -EBUSY;
	case SQLITE_READONLY: return -EROFS;
	case SQLITE_FULL: return -ENOSPC;
	case SQLITE_PERM:
	case SQLITE_AUTH: return -EACCES;
	case SQLITE_CANTOPEN:
	case SQLITE_IOERR: sys = db ? sqlite3_system_errno(db) : 0; return sys > 0 ? -sys : -EIO;
	case SQLITE_CORRUPT:
	case SQLITE_NOTADB: return -EILSEQ;
	case SQLITE_MISUSE:
	case SQLITE_RANGE:
	case SQLITE_MISMATCH:
	case SQLITE_CONSTRAINT: return -EINVAL;
	default: return -EIO;
	}
}

/* Count a failure and say why, at most once a minute per store (a dead disk would
 * otherwise write a line per request). Never a key id: what is what the caller was doing.
 * Called with st->lock held. */
void usage_note_failure(struct usage_store *st, const char *what, int err, const char *detail)
{
	uint64_t now = mono_ms();

	atomic_fetch_add(&st->failures, 1);
	st->unlogged++;
	if (st->last_log_ms && now - st->last_log_ms < USAGE_LOG_EVERY_MS)
		return;
	log_warnx(NULL, "usage: %s failed: %s%s%s (%llu failure(s) since the last report)", what,
		  strerror(-err), detail ? ": " : "", detail ? detail : "",
		  (unsigned long long)st->unlogged);
	st->last_log_ms = now;
	st->unlogged = 0;
}

static void db_close(struct usage_store *st)
{
	for (size_t i = 0; i < ST__N; i++) {
		sqlite3_finalize(st->stmt[i]);
		st->stmt[i] = NULL;
	}
	if (st->db)
		sqlite3_close_v2(st->db);
	st->db = NULL;
	atomic_store(&st->available, false);
}

/* Create the file 0600 ourselves before SQLite sees it: SQLite would create it with the
 * umask's mode, and makes -wal and -shm with the database file's mode, so this one open
 * decides all three. An existing file must be a regular file we can keep private. */
static int db_create_file(const char *path)
{
	struct stat sb;
	int fd;

	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd >= 0) {
		close(fd);
		return 0;
	}
	if (errno != EEXIST)
		return -errno;
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return errno == ELOOP ? -ELOOP : -errno;
	if (fstat(fd, &sb) < 0) {
		int e = -errno;

		close(fd);
		return e;
	}
	if (!S_ISREG(sb.st_mode)) {
		close(fd);
		return S_ISDIR(sb.st_mode) ? -EISDIR : -EINVAL;
	}
	/* Someone widened it (or an older tool made it): the ledger names keys, keep it ours. */
	if ((sb.st_mode & 077) && fchmod(fd, 0600) < 0) {
		int e = -errno;

		close(fd);
		return e;
	}
	close(fd);
	return 0;
}

/* Bring the schema to USAGE_SCHEMA_VERSION inside one write transaction, so that workers
 * opening a fresh database together create it once. */
static int db_migrate(sqlite3 *db, const char **detail)
{
	sqlite3_stmt *s = NULL;
	int rc, version = -1, err = 0;

	rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
	if (rc != SQLITE_OK)
		goto out_err;
	rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &s, NULL);
	if (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
		version = sqlite3_column_int(s, 0);
		rc = SQLITE_OK;
	}
	sqlite3_finalize(s);
	if (rc != SQLITE_OK)
		goto out_rollback;
	if (version > USAGE_SCHEMA_VERSION) {
		*detail = "the database's schema is newer than this olp";
		err = -EPROTO;
		goto out_rollback_err;
	}
	if (version == 0) {
		rc = sqlite3_exec(db, schema_v1, NULL, NULL, NULL);
		if (rc != SQLITE_OK)
			goto out_rollback;
		version = 1;
	}
	if (version == 1) {
		rc = sqlite3_exec(db, schema_v2, NULL, NULL, NULL);
		if (rc != SQLITE_OK)
			goto out_rollback;
		version = 2;
	}
	if (version == 2) {
		rc = sqlite3_exec(db, schema_v3, NULL, NULL, NULL);
		if (rc != SQLITE_OK)
			goto out_rollback;
	}
	rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
	if (rc != SQLITE_OK)
		goto out_rollback;
	return 0;

out_rollback:
	err = sq_errno(db, rc);
	*detail = sqlite3_errstr(rc); /* static: the ROLLBACK below resets sqlite3_errmsg */
out_rollback_err:
	sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
	return err;
out_err:
	*detail = sqlite3_errstr(rc);
	return sq_errno(db, rc);
}

static void stmts_finalize(struct usage_store *st)
{
	for (size_t i = 0; i < ST__N; i++) {
		sqlite3_finalize(st->stmt[i]);
		st->stmt[i] = NULL;
	}
}

/* WAL, the schema, the statements, on an open connection: 0 or -errno (-EBUSY: another
 * process holds a lock this needs), with *detail saying what failed. */
static int db_setup(struct usage_store *st, sqlite3 *db, const char **detail)
{
	int rc, err;

	/* WAL: readers never block the writer. synchronous=NORMAL: no fsync per commit; a power
	 * loss may lose the last rows, never corrupt the file (ADR 0020). */
	rc = sqlite3_exec(db, "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;", NULL, NULL,
			  NULL);
	if (rc != SQLITE_OK) {
		*detail = sqlite3_errmsg(db);
		return sq_errno(db, rc);
	}
	err = db_migrate(db, detail);
	if (err)
		return err;
	for (size_t i = 0; i < ST__N; i++) {
		rc = sqlite3_prepare_v3(db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT,
					&st->stmt[i], NULL);
		if (rc != SQLITE_OK) {
			err = sq_errno(db, rc);
			*detail = sqlite3_errstr(rc); /* static: finalizing may reset errmsg */
			stmts_finalize(st);
			return err;
		}
	}
	return 0;
}

/* Open the connection, set it up and prepare the statements. With st->lock held.
 *
 * SQLite does not wait (call the busy handler) where waiting could deadlock: a connection
 * that holds a read lock and needs the write lock while another process holds it gets
 * SQLITE_BUSY at once. Workers started together on one database meet exactly that when
 * they switch it to WAL and make its schema (ADR 0026: "database is locked" in
 * the log of a normal start). So setting up is tried again, after short pauses, for up to
 * USAGE_SETUP_PATIENCE_MS; only then is it a failure (counted and logged). */
static int db_open(struct usage_store *st)
{
	const char *detail = NULL;
	sqlite3 *db = NULL;
	uint64_t give_up;
	unsigned pause_ms = 1;
	int rc, err;

	err = db_create_file(st->path);
	if (err)
		goto out_fail;
	/* No SQLITE_OPEN_CREATE: the file exists, made above. NOMUTEX: st->lock serialises. */
	rc = sqlite3_open_v2(st->path, &db,
			     SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW,
			     NULL);
	if (rc != SQLITE_OK) {
		err = sq_errno(db, rc);
		detail = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
		goto out_close;
	}
	if (sqlite3_db_readonly(db, "main") == 1) {
		err = -EACCES;
		detail = "the database is read-only for this user";
		goto out_close;
	}
	/* A database file is data, not code: no schema may run functions with side effects,
	 * and nothing may write the schema behind SQLite's back. */
	sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 1, NULL);
	sqlite3_db_config(db, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, NULL);
	sqlite3_busy_timeout(db, USAGE_BUSY_TIMEOUT_MS);
	give_up = mono_ms() + USAGE_SETUP_PATIENCE_MS;
	while ((err = db_setup(st, db, &detail)) == -EBUSY && mono_ms() < give_up) {
		usleep(pause_ms * 1000);
		pause_ms = pause_ms < 64 ? 2 * pause_ms : 64;
	}
	if (err)
		goto out_close;
	st->db = db;
	atomic_store(&st->available, true);
	return 0;

out_close:
	usage_note_failure(st, "opening the database", err, detail);
	stmts_finalize(st);
	sqlite3_close_v2(db);
	return err;
out_fail:
	usage_note_failure(st, "creating the database file", err, NULL);
	return err;
}

/* usage_health: a write could not be made (the first of a run sets since when). */
static void health_failed(struct usage_store *st, int err)
{
	int64_t none = 0;

	atomic_store(&st->last_err, err);
	atomic_compare_exchange_strong(&st->failing_since_ms, &none, wall_ms());
}

/* ... and one was: the store works again. */
void usage_health_ok(struct usage_store *st)
{
	atomic_store(&st->failing_since_ms, 0);
}

/* 0 when the connection is up (opening it when its time has come), else -errno. */
int usage_db_ready(struct usage_store *st)
{
	uint64_t now;

	if (st->db)
		return 0;
	now = mono_ms();
	if (st->next_open_ms && now < st->next_open_ms) {
		/* Still waiting to retry: this call failed too, counted but not logged anew. */
		usage_note_failure(st, "using the database", st->open_err, "not open");
		health_failed(st, st->open_err);
		return st->open_err;
	}
	st->open_err = db_open(st);
	if (st->open_err) {
		st->next_open_ms = now + st->reopen_ms;
		health_failed(st, st->open_err);
	}
	return st->open_err;
}

/* After a failed statement: a busy database or a bad argument leaves the connection be;
 * anything else (I/O, disk full, corruption, read-only) closes it, to be reopened later. */
int usage_db_failed(struct usage_store *st, const char *what, int rc)
{
	int err = sq_errno(st->db, rc);

	usage_note_failure(st, what, err, sqlite3_errmsg(st->db));
	health_failed(st, err);
	if (err != -EBUSY && err != -EINVAL) {
		db_close(st);
		st->open_err = err;
		st->next_open_ms = mono_ms() + st->reopen_ms;
	}
	return err;
}

sqlite3_stmt *usage_stmt_get(struct usage_store *st, enum stmt_id id)
{
	sqlite3_stmt *s = st->stmt[id];

	sqlite3_reset(s);
	sqlite3_clear_bindings(s);
	return s;
}

/* Run a statement that returns no rows: SQLite's result code. */
int usage_stmt_run(sqlite3_stmt *s)
{
	int rc = sqlite3_step(s);

	sqlite3_reset(s);
	return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* ---- the frame of a write ------------------------------------------------------------- */

/* Roll back what is open (nothing when a failed statement already ended it). */
static void tx_rollback(struct usage_store *st)
{
	if (st->db && !sqlite3_get_autocommit(st->db))
		usage_stmt_run(usage_stmt_get(st, ST_ROLLBACK));
}

int usage_tx_locked(struct usage_store *st, const char *what,
		    int (*body)(struct usage_store *st, void *ctx), void *ctx)
{
	bool nothing = false;
	int rc;

	/* BEGIN IMMEDIATE: the database's write lock first, so that what the body reads
	 * (a quota's counts) cannot change before it writes. */
	rc = usage_stmt_run(usage_stmt_get(st, ST_BEGIN));
	if (rc == SQLITE_OK)
		rc = body(st, ctx);
	if (rc == USAGE_TX_NOTHING) {
		/* Nothing written: end the transaction without a commit's work. */
		nothing = true;
		rc = usage_stmt_run(usage_stmt_get(st, ST_ROLLBACK));
	} else if (rc == SQLITE_OK) {
		rc = usage_stmt_run(usage_stmt_get(st, ST_COMMIT));
	}
	if (rc == SQLITE_OK)
		return nothing ? 1 : 0;
	tx_rollback(st);
	return usage_db_failed(st, what, rc);
}

int usage_tx_run(struct usage_store *st, const char *what,
		 int (*body)(struct usage_store *st, void *ctx), void *ctx, unsigned flags)
{
	int err;

	pthread_mutex_lock(&st->lock);
	err = usage_db_ready(st);
	if (!err)
		err = usage_tx_locked(st, what, body, ctx);
	if (!err) {
		usage_health_ok(st);
		if (flags & USAGE_TX_PRUNE)
			usage_prune_maybe(st);
	}
	pthread_mutex_unlock(&st->lock);
	return err;
}

/* Bind at most max bytes of s, cut back to a UTF-8 character boundary; NULL as NULL. */
int usage_bind_text(sqlite3_stmt *s, int i, const char *str, size_t max)
{
	size_t n;

	if (!str)
		return sqlite3_bind_null(s, i);
	n = strnlen(str, max + 1);
	if (n > max) {
		n = max;
		while (n > 0 && ((unsigned char)str[n] & 0xc0) == 0x80)
			n--;
	}
	return sqlite3_bind_text(s, i, str, (int)n, SQLITE_TRANSIENT);
}

/* ---- the readers' connection ------------------------------------------------------------ */

static void reader_close(struct usage_store *st)
{
	sqlite3_finalize(st->rdays);
	sqlite3_finalize(st->rrecent);
	st->rdays = st->rrecent = NULL;
	if (st->rdb)
		sqlite3_close_v2(st->rdb);
	st->rdb = NULL;
}

/* A reader's failure: counted and logged like the writer's (under lock); the read-only
 * connection is closed, to be opened again by the next read, and the writer is left be. */
int usage_reader_failed(struct usage_store *st, const char *what, int rc)
{
	int err = sq_errno(st->rdb, rc);

	pthread_mutex_lock(&st->lock);
	usage_note_failure(st, what, err ? err : -EIO, st->rdb ? sqlite3_errmsg(st->rdb) : NULL);
	pthread_mutex_unlock(&st->lock);
	reader_close(st);
	return err ? err : -EIO;
}

/* 0 when the read-only connection is up, else -errno. Called with rlock held. The file is
 * made and its schema migrated by the writer's connection first. */
int usage_reader_ready(struct usage_store *st)
{
	int rc, err;

	if (st->rdb)
		return 0;
	pthread_mutex_lock(&st->lock);
	err = usage_db_ready(st);
	pthread_mutex_unlock(&st->lock);
	if (err)
		return err;
	rc = sqlite3_open_v2(st->path, &st->rdb,
			     SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW,
			     NULL);
	if (rc != SQLITE_OK)
		return usage_reader_failed(st, "opening the database to read", rc);
	sqlite3_db_config(st->rdb, SQLITE_DBCONFIG_DEFENSIVE, 1, NULL);
	sqlite3_db_config(st->rdb, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, NULL);
	sqlite3_busy_timeout(st->rdb, USAGE_BUSY_TIMEOUT_MS);
	rc = sqlite3_prepare_v3(st->rdb, stmt_sql[ST_DAYS], -1, SQLITE_PREPARE_PERSISTENT,
				&st->rdays, NULL);
	if (rc == SQLITE_OK)
		rc = sqlite3_prepare_v3(st->rdb, stmt_sql[ST_RECENT], -1, SQLITE_PREPARE_PERSISTENT,
					&st->rrecent, NULL);
	if (rc != SQLITE_OK)
		return usage_reader_failed(st, "opening the database to read", rc);
	return 0;
}

sqlite3_stmt *usage_reader_stmt(sqlite3_stmt *s)
{
	sqlite3_reset(s);
	sqlite3_clear_bindings(s);
	return s;
}

/* ---- the store ------------------------------------------------------------------------- */

struct usage_store *usage_store_open(const char *olp_home, const struct usage_options *opt)
{
	struct usage_store *st;

	if (!olp_home || !*olp_home) {
		errno = EINVAL;
		return NULL;
	}
	st = xcalloc(1, sizeof(*st));
	pthread_mutex_init(&st->lock, NULL);
	pthread_mutex_init(&st->rlock, NULL);
	if (opt && opt->store) {
		/* PostgreSQL (pg.c): no SQLite file at all. */
		st->retention_days =
			opt->retention_days ? opt->retention_days : USAGE_DEFAULT_RETENTION_DAYS;
		if (usage_pg_open(st, opt)) {
			usage_store_free(st);
			errno = ENOMEM;
			return NULL;
		}
		return st;
	}
	st->path = opt && opt->path ? xstrdup(opt->path) : path_join(olp_home, "usage.db");
	st->retention_days =
		opt && opt->retention_days ? opt->retention_days : USAGE_DEFAULT_RETENTION_DAYS;
	st->reopen_ms = opt && opt->reopen_ms ? opt->reopen_ms : USAGE_REOPEN_MS;
	pthread_mutex_lock(&st->lock);
	usage_db_ready(st);
	pthread_mutex_unlock(&st->lock);
	return st;
}

void usage_store_free(struct usage_store *st)
{
	if (!st)
		return;
	if (st->pg)
		usage_pg_free(st);
	reader_close(st);
	db_close(st);
	pthread_mutex_destroy(&st->rlock);
	pthread_mutex_destroy(&st->lock);
	free(st->path);
	free(st);
}

uint64_t usage_failures(const struct usage_store *st)
{
	return st ? atomic_load(&((struct usage_store *)st)->failures) : 0;
}

bool usage_available(const struct usage_store *st)
{
	if (st && st->pg)
		return usage_pg_available(st);
	return st && atomic_load(&((struct usage_store *)st)->available);
}

uint64_t usage_dropped(const struct usage_store *st)
{
	return st ? atomic_load(&((struct usage_store *)st)->dropped) : 0;
}

void usage_health(const struct usage_store *st, struct usage_health *out)
{
	struct usage_store *m = (struct usage_store *)st; /* atomics are read, not changed */

	*out = (struct usage_health){ .ok = false };
	if (!st)
		return;
	if (st->pg) {
		usage_pg_health(st, out);
		return;
	}
	out->failing_since_ms = atomic_load(&m->failing_since_ms);
	out->ok = out->failing_since_ms == 0;
	out->last_err = atomic_load(&m->last_err);
	out->failures = atomic_load(&m->failures);
}

/* ---- retention ------------------------------------------------------------------------ */

/* The prune's statements (usage_tx_locked's body). */
static int prune_body(struct usage_store *st, void *ctx)
{
	int64_t wall = *(const int64_t *)ctx;
	sqlite3_stmt *s;
	int rc;

	s = usage_stmt_get(st, ST_PRUNE_ROWS);
	sqlite3_bind_int64(s, 1, wall - (int64_t)st->retention_days * DAY_MS);
	rc = usage_stmt_run(s);
	if (rc != SQLITE_OK)
		return rc;
	s = usage_stmt_get(st, ST_PRUNE_WINDOWS);
	sqlite3_bind_int64(s, 1, usage_floor_to(wall, DAY_MS) - USAGE_WINDOW_KEEP_MS);
	rc = usage_stmt_run(s);
	if (rc != SQLITE_OK)
		return rc;
	s = usage_stmt_get(st, ST_PRUNE_HOLDS);
	sqlite3_bind_int64(s, 1, wall);
	return usage_stmt_run(s);
}

/* Delete what the retention no longer keeps. Its own transaction, after the caller's. A
 * failure here is counted like any other but fails nothing: the row is in. */
void usage_prune_maybe(struct usage_store *st)
{
	uint64_t now = mono_ms();
	int64_t wall = wall_ms();

	if (st->pruned && now - st->last_prune_ms < USAGE_PRUNE_EVERY_MS)
		return;
	st->pruned = true;
	st->last_prune_ms = now;
	(void)usage_tx_locked(st, "pruning old rows", prune_body, &wall);
}
