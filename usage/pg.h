/* Private to usage/: what pg.c (schema, health, quotas), pg_ledger.c (the ledger's queue,
 * writer, reads, import) and lease.c share of the PostgreSQL store (ADR 0034). */
#ifndef OLP_USAGE_PG_H
#define OLP_USAGE_PG_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "store/store.h"
#include "usage/internal.h"

/* How long a request's statement waits for a connection of the pool. */
#define USAGE_PG_WAIT_MS 2000u
/* usage_store_free's wait for the queued rows (usage_options.flush_ms). */
#define USAGE_PG_FLUSH_MS 5000u

/* A queued ledger row: usage_record's fields, copied (strings cut as SQLite's are). */
struct usage_pg_row {
	int64_t ts_ms;
	char key_id[64];
	char provider[64];
	char model[128];
	char account[USAGE_ACCOUNT_SIZE]; /* "": none (stored as NULL) */
	bool has_provider, has_model;
	int status;
	int64_t prompt, completion, cached;
	int64_t duration_ms, ttfb_ms;
	int start;
	int64_t hold_id;
};

struct usage_pg {
	char *host; /* this host's name in olp_requests.host */
	atomic_bool schema_ok;
	unsigned flush_ms;

	/* The queue: a ring of rows, oldest at head, at most cap. A row stays in it until
	 * its batch is committed, so a failed batch is tried again as it was. */
	pthread_mutex_t lock;
	pthread_cond_t more; /* a row was queued, or stop was set */
	pthread_cond_t done; /* a batch was written (usage_pg_writer_stop waits on it) */
	struct usage_pg_row *ring;
	size_t ring_size; /* allocated, grows to cap */
	size_t head, len;
	size_t cap;
	bool stop;
	uint64_t stop_deadline_ms; /* mono ms: usage_pg_writer_stop's flush ends */
	bool started;
	pthread_t writer;
	uint64_t last_drop_log_ms; /* under lock */
	uint64_t drops_unlogged;   /* under lock */
	uint64_t last_prune_ms;	   /* the writer's own */
	bool pruned;		   /* the writer's own: once since the start */
};

/* The "usage" schema is this build's version, or -errno (counted and logged). */
int usage_pg_schema_ready(struct usage_store *st);
/* Run sql (parameters p, n of them) on a connection of the pool: the result (PQclear it),
 * or NULL with *err the -errno, the failure counted, logged and the health failing
 * (usage_pg_failed). A success marks the health ok. */
PGresult *usage_pg_exec(struct usage_store *st, const char *what, const char *sql, int n,
			const char *const *params, int *err);
/* An integer column (NULL: 0). */
int64_t usage_pg_int(const PGresult *r, int row, int col);

#endif
