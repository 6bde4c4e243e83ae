/* Private to usage/: the store, its statements and the helpers its files share.
 *   db.c     the database: opening, migration, the writer's and the readers' connections,
 *            statements, transactions, failures and health, retention
 *   quota.c  the quota windows and the reservations (holds): claim, refund, state
 *   usage.c  the ledger's records, and the readers' queries (days, recent rows)
 *   report.c the ledger as JSON (/v1/usage's answer, olp-keys usage --json's rows)
 * Every function here is called with st->lock held unless it says otherwise. */
#ifndef OLP_USAGE_INTERNAL_H
#define OLP_USAGE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sqlite3.h>

#include "usage/usage.h"

#define MINUTE_MS 60000LL
#define DAY_MS 86400000LL

/* The longest key id the ledger keeps (usage_row's field, less its NUL). */
#define USAGE_KEY_ID_MAX (sizeof(((struct usage_row *)0)->key_id) - 1)

/* The cached statements; prepared once per connection (their SQL: db.c). */
enum stmt_id {
	ST_BEGIN,
	ST_COMMIT,
	ST_ROLLBACK,
	ST_INSERT,
	ST_REFUSAL_ADD,
	ST_ADD_TOKENS,
	ST_WIN_GET,
	ST_WIN_TAKE,
	ST_WIN_REFUND,
	ST_HELD,
	ST_HOLD_ADD,
	ST_HOLD_DROP,
	ST_DAYS,
	ST_RECENT,
	ST_PRUNE_ROWS,
	ST_PRUNE_WINDOWS,
	ST_PRUNE_HOLDS,
	ST__N
};

struct usage_store {
	pthread_mutex_t lock; /* guards everything below but failures/available */
	char *path;
	unsigned retention_days;
	unsigned reopen_ms;
	sqlite3 *db; /* NULL while unavailable */
	sqlite3_stmt *stmt[ST__N];
	/* The ledger's readers (/v1/usage, the dashboard, olp-keys usage) have a read-only
	 * connection of their own: a scan of a key's 90 days must not hold up the quota checks
	 * and ledger rows of the requests being served, which wait on lock (WAL: a reader
	 * never blocks the writer). Guarded by rlock, taken before lock when both are. */
	pthread_mutex_t rlock;
	sqlite3 *rdb;
	sqlite3_stmt *rdays, *rrecent;
	int open_err;	       /* -errno of the last failed open (while db is NULL) */
	uint64_t next_open_ms; /* mono_ms() before which no open is tried */
	uint64_t last_prune_ms;
	bool pruned;
	uint64_t last_log_ms;
	uint64_t unlogged; /* failures since the last line */
	_Atomic uint64_t failures;
	_Atomic bool available;
	/* usage_health: since when writes fail (unix ms; 0: they work), and the last error. */
	_Atomic int64_t failing_since_ms;
	_Atomic int last_err;
	/* With a PostgreSQL store (usage_options.store): pg.c and pg_ledger.c, and the
	 * SQLite fields above are unused but for the failure counters and lock (which then
	 * only guards the failure log's fields). */
	struct store_db *pg;
	struct usage_pg *pgs;
	_Atomic uint64_t dropped;
};

/* t rounded down to a multiple of unit (toward minus infinity). */
static inline int64_t usage_floor_to(int64_t t, int64_t unit)
{
	int64_t q = t / unit;

	if (t % unit < 0)
		q--;
	return q * unit;
}

/* A token count as a row keeps it: 0 to USAGE_ROW_TOKENS_MAX. */
static inline int64_t usage_row_tokens(int64_t n)
{
	return n < 0 ? 0 : n > USAGE_ROW_TOKENS_MAX ? USAGE_ROW_TOKENS_MAX : n;
}

/* db.c: the writer's connection (with st->lock held). */
int usage_db_ready(struct usage_store *st);
int usage_db_failed(struct usage_store *st, const char *what, int rc);
void usage_health_ok(struct usage_store *st);
sqlite3_stmt *usage_stmt_get(struct usage_store *st, enum stmt_id id);
int usage_stmt_run(sqlite3_stmt *s);
/* The frame of every write, held once: BEGIN IMMEDIATE, body(st, ctx), COMMIT, with
 * st->lock held and the database open. body runs the statements and returns SQLite's
 * result code: SQLITE_OK commits; USAGE_TX_NOTHING ends the transaction with nothing
 * written (a refused quota check), which is no failure; anything else rolls back. 0
 * committed, 1 nothing written, or -errno: rolled back, counted and logged as a failure
 * of what (usage_db_failed). */
#define USAGE_TX_NOTHING (-1) /* no SQLite result code is negative */
int usage_tx_locked(struct usage_store *st, const char *what,
		    int (*body)(struct usage_store *st, void *ctx), void *ctx);
enum usage_tx_flags {
	USAGE_TX_PRUNE = 1 << 0, /* after a commit, the retention's prune (usage_prune_maybe) */
};
/* The whole frame, called without st->lock: take it, open the database when it is not
 * (-errno when it cannot be), usage_tx_locked; a commit marks the writes healthy again
 * (usage_health_ok). flags: enum usage_tx_flags. Same return. */
int usage_tx_run(struct usage_store *st, const char *what,
		 int (*body)(struct usage_store *st, void *ctx), void *ctx, unsigned flags);
int usage_bind_text(sqlite3_stmt *s, int i, const char *str, size_t max);
void usage_prune_maybe(struct usage_store *st);

/* db.c: the readers' connection (with st->rlock held, not st->lock). */
int usage_reader_ready(struct usage_store *st);
int usage_reader_failed(struct usage_store *st, const char *what, int rc);
sqlite3_stmt *usage_reader_stmt(sqlite3_stmt *s);

/* db.c: count a failure and log it, once a minute at most (with st->lock held). */
void usage_note_failure(struct usage_store *st, const char *what, int err, const char *detail);

/* pg.c, pg_ledger.c: the PostgreSQL store (st->pg set). Each is the usage.h function of
 * the same name without "_pg", called without st->lock. */
int usage_pg_open(struct usage_store *st, const struct usage_options *opt);
void usage_pg_free(struct usage_store *st);
bool usage_pg_available(const struct usage_store *st);
void usage_pg_health(const struct usage_store *st, struct usage_health *out);
int usage_pg_claim(struct usage_store *st, const char *key_id, const struct usage_quota *q,
		   int64_t now_ms, struct usage_claim *c, struct usage_verdict *v);
int usage_pg_refund(struct usage_store *st, const char *key_id, struct usage_claim *c);
int usage_pg_state(struct usage_store *st, const char *key_id, int64_t now_ms,
		   struct usage_quota_state *out);
int usage_pg_record_add(struct usage_store *st, const struct usage_record *r);
int usage_pg_days(struct usage_store *st, const struct usage_filter *f, struct usage_day **out,
		  size_t *n);
int usage_pg_recent(struct usage_store *st, const struct usage_filter *f, size_t limit,
		    struct usage_row **out, size_t *n);
/* pg_ledger.c: the writer thread (started by usage_pg_open, stopped and flushed by
 * usage_pg_free). */
int usage_pg_writer_start(struct usage_store *st);
void usage_pg_writer_stop(struct usage_store *st, unsigned flush_ms);
/* pg.c: a failure of the store seen by pg*.c: counted, logged once a minute, the health
 * failing; the -errno to return (a broken connection or the database away: -ECONNREFUSED,
 * a statement the server refused: -EIO). */
int usage_pg_failed(struct usage_store *st, const char *what, int err, const char *detail);
void usage_pg_ok(struct usage_store *st);
/* key_id cut to USAGE_KEY_ID_MAX bytes at a UTF-8 boundary, into out (65 bytes). */
void usage_key_cut(char *out, size_t n, const char *key_id);

/* quota.c: drop a reservation (settled or given back), inside the caller's transaction. */
int usage_hold_drop(struct usage_store *st, int64_t hold_id);

#endif
