/* usage: who used what. The per-key usage ledger and the quota counters of a host, behind
 * one store interface (docs/adr/0020-usage-store.md).
 *
 * One store is shared by every worker process of a host (and by olp-keys): by default an
 * embedded SQLite database in WAL mode at $OLP_HOME/usage.db (mode 0600); with
 * usage_options.store, the shared PostgreSQL store of several OLP hosts (ADR 0034: the
 * same functions, exact across hosts; the ledger's rows written by a thread of the
 * process from a bounded queue; see "the PostgreSQL store" below).
 * A ledger row holds what a request cost and how it went — never a prompt, an answer, a
 * token or a key hash. usage knows nothing of HTTP, providers or keys beyond their names:
 * the caller hands it ids and counts.
 *
 * Failure policy (ADR 0026): every function that
 * touches the database returns 0 or -errno; a failure is counted (usage_failures()) and
 * logged with the reason, once per minute at most, never with a key id. A quota check
 * that cannot write its count refuses (the caller answers 503: a quota that cannot be
 * kept is not kept by letting requests through); a key without a quota never touches the
 * store before its run, so it is served whatever the store's state. usage_health() says
 * since when the store's writes fail, for /health and /metrics.
 *
 * Thread-safety: a store is opened once per process and shared by its threads. It has two
 * SQLite connections: the writer's (quota checks, ledger rows, pruning: its prepared
 * statements cached, every use under the store's mutex, so a transaction is never
 * interleaved with another thread's) and the readers' (read-only, under a lock of its
 * own: /v1/usage, the dashboard and olp-keys usage never hold up a quota check, and a
 * failed read never closes the writer). Cross-process safety is SQLite's locking (WAL),
 * with a 2 s busy timeout. With a PostgreSQL store, the store_db's pool (store.h) and the
 * database's row locks instead. A process that forks opens its own store in
 * the child: a connection (or a thread) must not cross fork(2). The database's descriptors
 * are close-on-exec. */
#ifndef OLP_USAGE_H
#define OLP_USAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct buf; /* common/common.h */

struct usage_store; /* opaque */

#define USAGE_DEFAULT_RETENTION_DAYS 90

#define USAGE_DEFAULT_BUFFER_ROWS 10000

struct store_db; /* store/store.h */

struct usage_options {
	const char *path;	 /* NULL: <olp_home>/usage.db */
	unsigned retention_days; /* 0: USAGE_DEFAULT_RETENTION_DAYS */
	unsigned reopen_ms;	 /* how long a failed database waits before the next try to
				    open it; 0: 10000 (tests set it short) */
	/* The shared PostgreSQL store of several hosts (ADR 0034), borrowed: it must outlive
	 * the usage store. NULL: SQLite at path, and none of the fields below matter. With
	 * it, every function below works on its tables (usage_pg_schema) instead; olp_home
	 * and path are not used. */
	struct store_db *store;
	/* Ledger rows waiting for the writer thread at most (0: USAGE_DEFAULT_BUFFER_ROWS);
	 * beyond, a row is dropped and counted (usage_dropped). */
	unsigned store_buffer_rows;
	/* This host's name in the ledger's host column (NULL: gethostname); copied. */
	const char *host;
	/* How long usage_store_free waits for queued rows to be written (0: 5000). */
	unsigned flush_ms;
};

/* Open (creating when missing: the file 0600, the schema, WAL) the store of olp_home.
 * olp_home itself is not created (auth/ and olp-keys make it, 0700). Never NULL for want
 * of the database: a store whose database cannot be opened is still returned, logs why,
 * counts the failure, and tries again (at most every reopen_ms, default 10 s) on later
 * calls, so that a worker started before its OLP_HOME was writable recovers. A database
 * that fails later (I/O error, disk full, corrupt) is closed and reopened the same way.
 * Workers that open one database together (the file, its schema, the switch to WAL) wait
 * for each other: a database another process is setting up is retried for up to 10 s,
 * and not counted or logged as a failure unless that runs out (ADR 0026).
 * NULL (errno EINVAL) only when olp_home is NULL or empty. Copies what it keeps of
 * olp_home and opt (opt may be NULL). Free with usage_store_free (NULL is fine). */
struct usage_store *usage_store_open(const char *olp_home, const struct usage_options *opt);
void usage_store_free(struct usage_store *st);
/* Database operations that failed since this process opened st (for the owner's /health
 * and /metrics). */
uint64_t usage_failures(const struct usage_store *st);
/* Whether the database is open and its schema ready right now. */
bool usage_available(const struct usage_store *st);
/* Ledger rows this process dropped since it opened st: the PostgreSQL store's queue was
 * full (usage_options.store_buffer_rows) while the database was away or slow, or
 * usage_store_free gave up flushing them. Always 0 with SQLite, whose rows are written on
 * the caller's thread (a failure there is a usage_failures()). olp_ledger_dropped_total. */
uint64_t usage_dropped(const struct usage_store *st);
/* Whether the store's writes work: ok until a write (a quota count, a ledger row, opening
 * the database) fails, then not ok from that failure's time until a write succeeds again.
 * What /health ("usage.ok", "failing_since") and /metrics (olp_ledger_available) say. */
struct usage_health {
	bool ok;
	int64_t failing_since_ms; /* unix ms of the first failure of the current run; 0: ok */
	int last_err;		  /* -errno of the last failure (0: none yet) */
	uint64_t failures;	  /* as usage_failures() */
};
void usage_health(const struct usage_store *st, struct usage_health *out);

/* How a request's provider process was started. */
enum usage_start {
	USAGE_START_NONE = 0, /* no provider ran (refused before, or an error) */
	USAGE_START_COLD,     /* a sandbox built for it */
	USAGE_START_WARM,     /* a sandbox started ahead of time (ADR 0008) */
	USAGE_START_PRESTART, /* the provider's client itself started ahead (ADR 0022) */
};
const char *usage_start_name(enum usage_start s); /* "none", "cold", "warm", "prestart" */

/* One ledger row. Strings are borrowed for the call; NULL provider/model are stored as
 * NULL. Token counts are the provider's (0 when it reported none). */
/* A row's token count (each field), and its duration, are stored at most this: far above
 * any real request (a million-token context), and low enough that SQLite's sum() over a
 * key's rows can never overflow. A count written by code inside the sandbox (a forged
 * usage line) must not be able to make the ledger's reads fail. */
#define USAGE_ROW_TOKENS_MAX INT64_C(1000000000)
#define USAGE_ROW_DURATION_MAX_MS UINT64_C(604800000) /* 7 days */
struct usage_record {
	int64_t ts_ms;	    /* when the request arrived, unix ms (0: now) */
	const char *key_id; /* required: a manifest id, "__env_owner__" or "__anonymous__" */
	const char *provider;
	const char *model;
	/* The provider's account the run used (ADR 0037); NULL or "" for a request no
	 * provider took (stored as NULL). */
	const char *account;
	int status; /* the HTTP status the client got (499: it went away) */
	int64_t prompt_tokens;
	int64_t completion_tokens;
	int64_t cached_tokens;
	uint64_t duration_ms; /* arrival to the end of the answer */
	uint64_t ttfb_ms;     /* arrival to the first byte of the answer (0: unknown) */
	enum usage_start start;
	int64_t hold_id; /* the request's token reservation (usage_claim.hold_id), settled by
			    this row; 0: none */
};

/* Append one row (with a PostgreSQL store: queue it for the writer thread, which writes
 * the queued rows in batches, each with the same effects in one transaction; a full queue
 * drops it and counts it in usage_dropped(), logged once a minute at most; 0 then too,
 * for the request was served), and add its tokens to the key's tokens_per_day counter of the row's day
 * (UTC). One short transaction; cheap enough to run on every request (the bench in
 * docs/performance.md: ≤ 0.2 ms median). Prunes rows older than the retention, and quota
 * windows older than two days, now and then (at the first call, then at most once an hour
 * per store; by the wall clock, not by r->ts_ms). Strings longer than what struct
 * usage_row holds are cut (at a UTF-8 boundary); negative token counts are stored as 0,
 * counts above USAGE_ROW_TOKENS_MAX as that, durations above USAGE_ROW_DURATION_MAX_MS as
 * that.
 * A refusal (no provider started, no token, status >= 400: a 429 of a quota, a 400, a
 * provider's full slots) is not a row of its own: it is counted in the one row of its key,
 * status, provider and model for its UTC minute (ts_ms the minute's start, count the
 * refusals, duration_ms their sum), so a client retrying in a loop adds at most a row a
 * minute, and usage_days still counts each one as a request and an error (ADR 0026).
 * With r->hold_id, the reservation is dropped in the same transaction that adds the real
 * tokens (settled).
 * 0 or -errno (-EINVAL: r or r->key_id NULL or empty). */
int usage_record_add(struct usage_store *st, const struct usage_record *r);

/* A key's quota: the manifest's "quota" object ({"requests_per_minute": N,
 * "requests_per_day": N, "tokens_per_day": N}, each optional). 0 in a field: no limit. */
struct usage_quota {
	int64_t requests_per_minute;
	int64_t requests_per_day;
	int64_t tokens_per_day;
};
static inline bool usage_quota_any(const struct usage_quota *q)
{
	return q &&
	       (q->requests_per_minute > 0 || q->requests_per_day > 0 || q->tokens_per_day > 0);
}

/* What a quota check decided. */
struct usage_verdict {
	bool allowed;
	const char *limit;    /* when refused: "requests_per_minute", "requests_per_day" or
				 "tokens_per_day" (static) */
	int64_t limit_value;  /* ... its value */
	int64_t used;	      /* ... and what the key used of it in the current window */
	unsigned retry_after; /* when refused: seconds until the window that refused ends */
};

/* Check key_id's quota q at now_ms (unix ms; 0: now) and, when allowed, count this request
 * in its minute and day (fixed UTC windows), in one transaction, so that the workers of a
 * host never let more through than the limit between them. With no limit set
 * (usage_quota_any false) nothing is touched and the request is allowed. When several
 * limits refuse, the day's is reported (its window ends last, so its retry_after is the
 * one worth waiting). A refused request is not counted.
 * tokens_per_day counts the tokens recorded for the day (usage_record_add) plus those
 * reserved by requests under way (usage_quota_claim) and refuses once they reach the
 * limit; used is that sum.
 * On a store failure: refused (allowed false, limit NULL) and -errno returned (the store
 * has counted and logged it): the caller answers that the quota cannot be checked.
 * -EINVAL (refused too) when key_id, q or v is NULL. Otherwise 0. */
int usage_quota_take(struct usage_store *st, const char *key_id, const struct usage_quota *q,
		     int64_t now_ms, struct usage_verdict *v);

/* A request's claim on its key's quota: usage_quota_take, plus a reservation of the tokens
 * it may spend, so that requests running at once cannot take a key past tokens_per_day by
 * more than one request's reservation (ADR 0026). In: tokens (what the caller
 * expects the request to cost; 0: reserve nothing) and ttl_ms (how long the reservation
 * lives when nothing settles it: a worker killed mid-run leaves one that lapses). Out: the
 * reservation (hold_id, 0 when none was made: no tokens_per_day, tokens 0, or refused)
 * and the windows the request was counted in (for usage_quota_refund). */
struct usage_claim {
	int64_t tokens;
	uint64_t ttl_ms;
	int64_t hold_id;
	int64_t minute_ms, day_ms;
	bool counted; /* the request was counted in its windows */
};
/* usage_quota_take with c (NULL: as usage_quota_take). Same return and verdict. */
int usage_quota_claim(struct usage_store *st, const char *key_id, const struct usage_quota *q,
		      int64_t now_ms, struct usage_claim *c, struct usage_verdict *v);
/* Give back a claim whose request was never run (every provider it could go to was at its
 * own max_concurrent): its request no longer counts in its minute and day, and its
 * reservation is dropped. Clears c->counted and c->hold_id. 0 or -errno. */
int usage_quota_refund(struct usage_store *st, const char *key_id, struct usage_claim *c);

/* Where a key stands in its current windows (for /v1/usage, the dashboard, olp-keys).
 * Requests are those usage_quota_take counted (so 0 for a key without a quota); tokens are
 * those usage_record_add recorded, for every key. now_ms 0: now. 0 or -errno (*out is
 * zeroed then). */
struct usage_quota_state {
	int64_t requests_this_minute;
	int64_t requests_today;
	int64_t tokens_today;
	int64_t tokens_reserved; /* held now by the key's requests under way */
};
int usage_quota_state(struct usage_store *st, const char *key_id, int64_t now_ms,
		      struct usage_quota_state *out);

/* ---- reading the ledger ----------------------------------------------------------------- */

/* An account name as the ledger keeps it (ADR 0037: 1-32 bytes), with its NUL. */
#define USAGE_ACCOUNT_SIZE 33

/* Usage per key, provider, account and UTC day. */
struct usage_day {
	char key_id[64];
	char provider[64]; /* "" for rows without a provider (refused before any ran) */
	char account[USAGE_ACCOUNT_SIZE]; /* "" for rows without an account (and before v3) */
	char day[11];			  /* "YYYY-MM-DD" */
	int64_t requests;		  /* refusals counted one by one (usage_record_add) */
	int64_t errors;			  /* status >= 400 */
	int64_t prompt_tokens;
	int64_t completion_tokens;
	int64_t cached_tokens;
	uint64_t duration_ms;	/* summed */
	int64_t warm, prestart; /* requests served by a warm sandbox / a pre-started client */
};

/* One request, as the dashboard lists recent ones: no content. */
struct usage_row {
	int64_t ts_ms;
	char key_id[64];
	char provider[64];
	char model[128];
	char account[USAGE_ACCOUNT_SIZE]; /* "": none */
	int status;
	int64_t prompt_tokens, completion_tokens, cached_tokens;
	uint64_t duration_ms, ttfb_ms;
	enum usage_start start;
	int64_t count; /* 1, or the refusals of a minute this row counts (usage_record_add) */
};

struct usage_filter {
	const char *key_id;  /* NULL: every key */
	int64_t since_ms;    /* rows at or after (unix ms); 0: all kept */
	const char *account; /* NULL: every account (and rows without one); else only rows
			      * of that account, of whichever provider (ADR 0037); at most
			      * USAGE_ACCOUNT_SIZE - 1 bytes (longer: -EINVAL) */
};

/* Per-key, per-provider, per-account, per-day sums matching f (NULL: everything), ordered
 * by day, key, provider, account. *out is a heap array (free()), *n its length; NULL and 0
 * on failure or when nothing matches. 0 or -errno. */
int usage_days(struct usage_store *st, const struct usage_filter *f, struct usage_day **out,
	       size_t *n);
/* The most recent rows matching f, newest first, at most limit. Same ownership. */
int usage_recent(struct usage_store *st, const struct usage_filter *f, size_t limit,
		 struct usage_row **out, size_t *n);

/* ---- the ledger as JSON (report.c): one writer for GET /v1/usage and olp-keys usage --- */

/* "YYYY-MM-DD", a real day (2026-02-30 is refused), into the unix ms of its 00:00 UTC: what
 * /v1/usage's ?since= and olp-keys usage --since= take. 0 or -EINVAL. */
int usage_day_parse(const char *s, int64_t *ms);

/* Append d to b as a JSON object: "date", then with with_key "key_id" (d's) and "name"
 * (name; NULL: null), then "provider" and "account" (null for rows without one),
 * "requests", "errors",
 * "prompt_tokens", "completion_tokens", "cached_tokens", "warm", "prestart" and
 * "duration_ms" (summed). With the key: an element of olp-keys usage --json's list;
 * without: of a key's "days" in /v1/usage. */
void usage_day_json(struct buf *b, const struct usage_day *d, bool with_key, const char *name);

/* Who a key is, as the key store says (usage knows keys by id only: the caller looks them
 * up). Strings borrowed. */
struct usage_key_info {
	const char *id;
	const char *name; /* NULL: unknown (deleted since) or none */
	const char *tier; /* NULL: unknown */
	bool revoked;
	bool have_quota; /* quota and max_concurrent are known */
	struct usage_quota quota;
	int64_t max_concurrent;
};

/* GET /v1/usage's answer: what it says, all borrowed for the call. */
struct usage_report {
	int64_t since_ms;    /* the first day the days cover */
	int64_t now_ms;	     /* "generated_at" (0: now) */
	size_t recent_limit; /* ?recent= */
	bool all_keys;	     /* the owner asked for every key */
	const char *account; /* the rows' account (?account=), or NULL: every account */
	const struct usage_key_info *keys;
	size_t nkeys;
	const struct usage_day *days; /* usage_days' */
	size_t ndays;
	const struct usage_row *rows; /* usage_recent's */
	size_t nrows;
};
/* Append r to b as one JSON object (docs/openai-compat.md has the shape): per key its
 * quota, where it stands in its windows now (usage_quota_state, read from st; a failure
 * there leaves zeros, counted by the store), its days (a row per provider and account),
 * their totals, and the totals by provider and account ("by_account"); then the recent
 * rows (each with its "account"). */
void usage_report_json(struct usage_store *st, const struct usage_report *r, struct buf *b);

/* ---- the PostgreSQL store (pg.c, pg_ledger.c; ADR 0034) ------------------------------- */

struct store_schema; /* store/store.h */

/* The "usage" module's tables in the shared store: olp_requests (the ledger, every host's
 * rows with their host), olp_quota_windows, olp_quota_holds, olp_leases, and the
 * functions that check a quota and take a lease in one round trip. Static. */
const struct store_schema *usage_pg_schema(void);

/* What usage_pg_import copied. */
struct usage_import_report {
	uint64_t rows_read, rows_copied;       /* ledger rows of usage.db, and those new */
	uint64_t windows_read, windows_copied; /* quota windows of today and yesterday */
};
/* Copy src's ledger (an embedded SQLite store, usage_store_open without a store) and its
 * current quota windows (today's and yesterday's) into dst's tables, as host's rows (NULL:
 * gethostname). Idempotent: a row is known by (host, its rowid in usage.db) and a window
 * by its key; what dst holds already is left as it is, so a re-run copies nothing twice
 * and a run that failed half-way is finished by running it again. Each batch of rows is
 * one transaction. out gets the counts (zeroed first). 0, or -errno with the reason in
 * err (-EINVAL: src is not an SQLite store). */
int usage_pg_import(struct usage_store *src, struct store_db *dst, const char *host,
		    struct usage_import_report *out, struct buf *err);

/* ---- a key's requests at once across the processes, or hosts (lease.c) ---------------- */

/* A key's max_concurrent: a slot held while its request runs. Embedded (no store): one of
 * the slot files <runtime_dir>/keyslots/<hex of the key id>.<i>.slot, flock'ed (common.h
 * slot_take: the kernel frees it when the holder dies), so the cap holds across the
 * processes of one host. With a store: a row of olp_leases (key, slot, holder, expires_at)
 * taken under the key's advisory lock, renewed by a thread of this process every ttl / 3
 * and expiring ttl after the last renewal, so the cap holds across hosts and a dead host's
 * slots come back within ttl. */
struct usage_leases; /* opaque, thread-safe */

struct usage_lease_options {
	const char *runtime_dir; /* embedded: where keyslots/ is made (0700); copied */
	struct store_db *store;	 /* borrowed; NULL: embedded */
	unsigned ttl_ms;	 /* with a store: a lease's life after a renewal (0: 15000) */
	const char *host;	 /* with a store: the holder's host name (NULL: gethostname) */
};
/* NULL (errno) when runtime_dir cannot be used and there is no store. Free with
 * usage_leases_free, which gives back nothing: release every lease first (what a process
 * still holds at exit lapses, or its files are unlocked by the kernel). */
struct usage_leases *usage_leases_open(const struct usage_lease_options *o);
void usage_leases_free(struct usage_leases *ls);

/* One held slot. Zeroed (or USAGE_LEASE_INIT): none. */
struct usage_lease {
	bool held;
	int fd;	      /* embedded: the slot file */
	int64_t slot; /* with a store: the slot's number */
	char key_id[64];
};
#define USAGE_LEASE_INIT                \
	{                               \
		.held = false, .fd = -1 \
	}

/* Take one of key_id's max slots into *l. 0; -EBUSY when all max are held; -EINVAL (bad
 * arguments, max <= 0); -ECONNREFUSED or -ETIMEDOUT when the store cannot be reached (the
 * caller refuses: a cap that fails open is no cap, ADR 0026); another -errno. */
int usage_lease_take(struct usage_leases *ls, const char *key_id, int64_t max,
		     struct usage_lease *l);
/* Give l back, if held (a lease that cannot be deleted now is retried by the renewal
 * thread and lapses meanwhile). l is none afterwards. */
void usage_lease_release(struct usage_leases *ls, struct usage_lease *l);

#endif
