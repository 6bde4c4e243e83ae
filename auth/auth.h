/* auth: OLP API keys, tiers and the audit log.
 *
 * The key store is the Node OLP's layout, so an existing OLP home works unchanged:
 *   $OLP_HOME/keys/<id>/manifest.json   (directory 0700, file 0600)
 * Only the SHA-256 hex of a token is ever stored. auth knows nothing of HTTP, providers
 * or sandboxes: the caller hands it header values and gets back an identity.
 * Or, with a PostgreSQL store (auth_options.store, ADR 0034), the same manifests are rows
 * of the table olp_keys shared by several hosts.
 *
 * This header is the whole interface: fcgi/, olp-keys, the CUnit suite and the bench use
 * nothing else. Inside, token.c (tokens, ids, hashes), manifest.c (one key's
 * manifest.json), store.c (the index a worker checks tokens against, last_used_at),
 * audit.c, keys.c (what olp-keys does), pg.c (the keys schema and a worker's cached check
 * against PostgreSQL) and pg_keys.c (key management and migration there) share
 * internal.h, where every name is auth_*.
 *
 * Memory: running out aborts, as everywhere in the tree (common.h); nothing here returns
 * ENOMEM for an allocation of its own. The one exception is jansson, which reports a
 * failed allocation by returning NULL: where a manifest is built or rewritten, that
 * surfaces as -ENOMEM / AUTH_KEY_ERR_SYSTEM with errno ENOMEM. */
#ifndef OLP_AUTH_H
#define OLP_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct buf;	 /* common/common.h */
struct store_db; /* store/store.h */
struct store_schema;

enum auth_tier {
	AUTH_TIER_NONE = 0,  /* no identity (missing or bad credentials) */
	AUTH_TIER_ANONYMOUS, /* config auth.allow_anonymous: the shared "__anonymous__" */
	AUTH_TIER_GUEST,
	AUTH_TIER_OWNER,
};

/* Domain results of a credential check; auth_strerror() gives the client-facing message. */
enum auth_result {
	AUTH_OK = 0,
	AUTH_ERR_REQUIRED, /* 401 auth_required: no token and anonymous access is off */
	AUTH_ERR_INVALID,  /* 401 invalid_or_revoked_key: unknown, malformed or revoked */
	/* 503 store_unavailable (with Retry-After): the keys live in PostgreSQL, the database
	 * cannot be reached, and this token was not checked there within the offline window
	 * (auth_options.store_offline_keys_s). It may well be a good key: not a 401. */
	AUTH_ERR_UNAVAILABLE,
};

#define AUTH_ID_MAX 64
/* A provider name as a manifest holds it: 1..63 of [A-Za-z0-9._-], plus the NUL. */
#define AUTH_PROVIDER_MAX 64
/* A provider's account name (ADR 0037): 1..32 of [a-z0-9_-], plus the NUL. */
#define AUTH_ACCOUNT_MAX 33
/* A key's binding as a manifest's "accounts" member holds it: "<provider>=<account>". */
#define AUTH_BINDING_MAX (AUTH_PROVIDER_MAX + AUTH_ACCOUNT_MAX)
/* Whether s is an account name: 1..AUTH_ACCOUNT_MAX - 1 of [a-z0-9_-]. */
bool auth_account_name_valid(const char *s);
/* Split "<provider>=<account>" into its names, each checked. 0 or -EINVAL. */
int auth_binding_split(const char *binding, char provider[AUTH_PROVIDER_MAX],
		       char account[AUTH_ACCOUNT_MAX]);

/* A key's quota: its manifest's "quota" ({"requests_per_minute": N, "requests_per_day": N,
 * "tokens_per_day": N, "max_concurrent": N}, each optional; null: none, as the Node OLP
 * writes it). 0 in a field: no limit. Enforced by the caller (fcgi/, through usage/ and
 * host-wide slots), not here.
 * In a manifest each field is absent, null (no limit) or an integer in 1..AUTH_QUOTA_MAX
 * (max_concurrent: 1..AUTH_QUOTA_CONCURRENT_MAX);
 * anything else there (0, a negative, a fraction, a string, an unknown field such as a
 * misspelt limit) makes the manifest invalid: a typo must not lift a limit silently. */
struct auth_quota {
	int64_t requests_per_minute;
	int64_t requests_per_day;
	int64_t tokens_per_day;
	int64_t max_concurrent; /* chat completions of the key running at once, host-wide */
};
#define AUTH_QUOTA_MAX 1000000000000000LL /* 10^15 */
/* One slot file each (fcgi/): a cap far above what one host runs at once is no cap. */
#define AUTH_QUOTA_CONCURRENT_MAX 1024

/* Whether q sets no limit at all ("quota": null). */
static inline bool auth_quota_none(const struct auth_quota *q)
{
	return !q->requests_per_minute && !q->requests_per_day && !q->tokens_per_day &&
	       !q->max_concurrent;
}

/* Who is calling. Plain data, owned by the caller; release with auth_identity_release(). */
struct auth_identity {
	char key_id[AUTH_ID_MAX]; /* manifest id, "__env_owner__" or "__anonymous__" */
	enum auth_tier tier;
	bool all_providers; /* providers_enabled was "*" */
	char **providers;   /* else this list (n_providers entries, heap strings) */
	size_t n_providers;
	struct auth_quota quota; /* all 0 for env owner and "quota": null; anonymous: its own
				    (auth_options.anonymous) */
	/* A guest key's "login_access" (provider names, heap strings): the providers whose
	 * login (credential files bound into a run whose CLI runs commands) the owner let this
	 * key reach. NULL for every other identity: an owner reaches every login, anonymous
	 * none. */
	char **login_access;
	size_t n_login_access;
	/* The key's "accounts" (ADR 0037): "<provider>=<account>" bindings, heap strings; a
	 * provider not named is unbound (the worker picks its account). */
	char **accounts;
	size_t n_accounts;
};

/* The account id's requests to provider must use, or NULL when it is not bound there.
 * Points into id. */
const char *auth_identity_account(const struct auth_identity *id, const char *provider);

/* What the anonymous identity may do (config.json auth.anonymous), as a key's manifest
 * says it for a key. */
struct auth_anonymous {
	bool all_providers;	      /* "providers": "*" */
	const char *const *providers; /* else these (n_providers; maybe none at all) */
	size_t n_providers;
	struct auth_quota quota;
};

struct auth_options {
	bool allow_anonymous;	     /* config.json auth.allow_anonymous */
	const char *env_owner_token; /* OLP_OWNER_TOKEN, or NULL; copied (only its hash is kept) */
	/* The anonymous identity's providers and quota; NULL: no provider at all. Copied. */
	const struct auth_anonymous *anonymous;
	/* The audit log (config.json audit.*; 0: the default): rotate audit.ndjson once it
	 * holds max_bytes, keep the keep newest rotated files, and write at most one summary
	 * of unauthenticated requests per summary_s seconds per process. */
	uint64_t audit_max_bytes;
	unsigned audit_keep;
	unsigned audit_summary_s;
	/* The keys' store: NULL for the key files under olp_home (ADR 0010); else the opened
	 * PostgreSQL store (ADR 0034), borrowed: it must outlive the auth_store. Register
	 * every other store_listen channel of this db before auth_store_open, which starts
	 * the db's listener thread. */
	struct store_db *store;
	/* With a store: how long (s) a key checked successfully keeps working while the
	 * database is away; 0: not at all (every check is AUTH_ERR_UNAVAILABLE meanwhile).
	 * config.json's default is AUTH_STORE_OFFLINE_KEYS_S_DEFAULT. */
	unsigned store_offline_keys_s;
	/* With a store, a process that answers one request (plain CGI): no LISTEN connection
	 * or thread is started, and every check asks the database (a cache that lives for one
	 * request would only cost a second connection). */
	bool store_no_listen;
};
#define AUTH_STORE_OFFLINE_KEYS_S_DEFAULT 300
#define AUTH_AUDIT_MAX_BYTES_DEFAULT (UINT64_C(64) << 20)
#define AUTH_AUDIT_KEEP_DEFAULT 7
#define AUTH_AUDIT_SUMMARY_S_DEFAULT 60

/* An open key store: opaque, thread-safe (one per worker process, shared by its threads). */
struct auth_store;

/* Open the store under olp_home (keys/ need not exist yet) and index its keys, so that the
 * first request pays no scan. Copies olp_home and what it needs of opt (opt may be NULL:
 * no anonymous access, no env owner). NULL with errno EINVAL (olp_home NULL or empty) or
 * ENOSYS (libsodium cannot start). Invalid manifests are skipped with one log warning
 * each. Does not start threads; auth_touch() starts one.
 * With opt->store (PostgreSQL): keys/ is not read (olp_home holds the audit log); the
 * channel olp_keys is registered on the store and its listener thread started; a database
 * that can be reached must hold the keys schema at the version this build knows (else
 * NULL with errno EPROTO, logged with the command that fixes it); one that cannot be
 * reached is tried again on the first check. */
struct auth_store *auth_store_open(const char *olp_home, const struct auth_options *opt);
/* Write out queued last_used_at updates, join the writer thread, close the audit log and
 * free st (NULL is fine). No other thread may use st during or after the call. */
void auth_store_free(struct auth_store *st);

/* Check a request's credentials. authorization is the raw Authorization header value (or
 * NULL), x_api_key the raw x-api-key value (or NULL); both are borrowed for the call.
 * "Bearer" is matched case-insensitively and wins over x-api-key; blanks around the token
 * are ignored. No token: AUTH_ERR_REQUIRED, or the anonymous identity when allowed. A
 * token that is wrong, revoked, or whose manifest is invalid: AUTH_ERR_INVALID (even when
 * anonymous access is on). On AUTH_OK *out is filled (release it); otherwise *out is
 * zeroed and needs no release. Revocation by another process is seen on the very next
 * call: the matched key's manifest is stat(2)ed on every check. With a PostgreSQL store a
 * revocation on any host is seen within 2 s (a cached entry is used only while the
 * store's listener vouches for it, ADR 0034), and while the database is away the result
 * may be AUTH_ERR_UNAVAILABLE (see there). Thread-safe. */
enum auth_result auth_check(struct auth_store *st, const char *authorization, const char *x_api_key,
			    struct auth_identity *out);
/* Find the presented token: "Bearer <t>" in authorization (scheme case-insensitive, then
 * a space or a tab), else x_api_key, surrounding spaces and tabs trimmed. Points into the
 * header strings; *tok NULL and *len 0 when none. The one reading of a bearer token:
 * auth_check's, and olp-fcgi's for config.json's metrics_token. */
void auth_token_extract(const char *authorization, const char *x_api_key, const char **tok,
			size_t *len);
const char *auth_strerror(enum auth_result r);
/* The OpenAI-style error "type" for r: "auth_required" / "invalid_or_revoked_key" /
 * "store_unavailable". */
const char *auth_error_type(enum auth_result r);

void auth_identity_release(struct auth_identity *id);
/* Whether id may use provider (a registry provider name). */
bool auth_identity_allows(const struct auth_identity *id, const char *provider);
/* Whether id may reach provider's login: a run of id may hold the credential files of a
 * provider whose CLI runs commands (the model can read them). The owner tier always;
 * a guest key only when its manifest's "login_access" names provider; anonymous never. */
bool auth_identity_may_hold_login(const struct auth_identity *id, const char *provider);
const char *auth_tier_name(enum auth_tier t); /* "owner", "guest", "anonymous", "none" */

/* Record that id was used (manifest last_used_at). Cheap to call after the response is
 * finished: it only queues the write for a background thread, which writes at most once
 * per key per minute, under the key's lock, and never for a key revoked meanwhile (with a
 * PostgreSQL store: one UPDATE per batch; dropped, logged, while the database is away).
 * Does nothing for synthetic identities (env owner, anonymous). id is borrowed. */
void auth_touch(struct auth_store *st, const struct auth_identity *id);

/* ---- audit log: $OLP_HOME/logs/audit.ndjson, one JSON line per API request ---------- */
struct audit_record {
	const char *key_id;	/* may be NULL */
	const char *owner_tier; /* auth_tier_name() */
	const char *method;
	const char *path;
	const char *provider; /* may be NULL */
	const char *model;    /* may be NULL */
	int status_code;
	uint64_t latency_ms;
	const char *error_code; /* may be NULL */
	const char *request_id;
};

/* Append one line (one write(2), O_APPEND, 0600; rotated daily to audit-YYYY-MM-DD.ndjson
 * and past audit_max_bytes to audit-YYYY-MM-DDTHHMMSS.ndjson, the audit_keep newest
 * rotated files kept). rec and its strings are borrowed; NULL strings become null.
 * The query string of path is dropped and long fields are cut, so that no token a client
 * put in a URL reaches the log. A request without an identity refused with a 4xx
 * (key_id NULL) is not a line: it is counted, and a summary line (event
 * "unauthenticated_summary", count, statuses) goes out at most once per
 * audit_summary_s per process, and when the store is freed. Never fails a request: a
 * failure is counted and reported by auth_audit_failures(). Thread-safe and safe across
 * processes. */
void auth_audit(struct auth_store *st, const struct audit_record *rec);
uint64_t auth_audit_failures(const struct auth_store *st);

/* One key other than an owner's that may reach a provider's login ("login_access"). */
struct auth_login_grant {
	char key_id[AUTH_ID_MAX];
	char provider[AUTH_PROVIDER_MAX];
};
/* Every grant of the active keys, for the owner's /health: the manifests that changed
 * since they were last read are read again first, so a set-login shows at once. *out is
 * malloc'd (free it; NULL when *n is 0). 0 or -errno (with a PostgreSQL store, which is
 * queried each time: -ECONNREFUSED while it is away). Thread-safe. */
int auth_login_grants(struct auth_store *st, struct auth_login_grant **out, size_t *n);

/* One key as the worker's index holds it (for the owner's /v1/usage): never its hash.
 * The strings are heap copies, NULL when the manifest has none. */
struct auth_key_summary {
	char id[AUTH_ID_MAX];
	char *name;
	char *created_at;
	enum auth_tier tier;
	bool revoked;
	struct auth_quota quota;
};
/* Every key with a valid manifest, in auth_key_list's order (created_at, then id), from
 * the index auth_check keeps rather than a parse of every manifest: keys/ and each
 * indexed manifest are stat(2)ed, and keys/ is read again (and the changed manifests
 * alone re-parsed) only when one of them changed. A key made, revoked or given a quota by
 * another process shows in the very next call. *out is malloc'd (release it with
 * auth_key_summaries_free; NULL when *n is 0). 0 or -EINVAL (st NULL). With a PostgreSQL
 * store the table is queried each time (an owner-only path): -ECONNREFUSED while the
 * database is away. Thread-safe. */
int auth_store_keys(struct auth_store *st, struct auth_key_summary **out, size_t *n);
void auth_key_summaries_free(struct auth_key_summary *v, size_t n);

/* ==== key management (olp-keys) ==========================================================
 * These work on the files under olp_home directly and need no open auth_store. They are
 * safe against running workers and other olp-keys runs: every writer takes flock(2) on the
 * key's directory (keys/<id>/) or, to create a key, on keys/ itself, and re-reads under the
 * lock. Workers see the result on their next request.
 * Each has an _at twin that works on a struct auth_target: the same files (db NULL), or
 * the table olp_keys of a PostgreSQL store (db set; olp_home is then unused). There a
 * change is one transaction that locks the key's row (SELECT ... FOR UPDATE), validates
 * the manifest as a file's would be, writes it back and bumps its generation; a trigger
 * sends NOTIFY olp_keys '<id>' at commit, and every worker's cache drops the key within
 * 2 s (ADR 0034). The manifest is the file's JSON, so both stores mean the same thing. */

/* Where keys live, for the _at functions. Both borrowed. */
struct auth_target {
	const char *olp_home; /* the key files (db NULL) */
	struct store_db *db;  /* or this PostgreSQL store */
};
/* The key files under home, as a target (a compound literal: valid in the enclosing block). */
#define AUTH_TARGET_FILES(home) (&(const struct auth_target){ .olp_home = (home), .db = NULL })

/* The keys' schema (module "keys": the table olp_keys and its NOTIFY trigger), for
 * store_schema_apply (olp-keys store init) and store_schema_check. Static storage. */
const struct store_schema *auth_pg_schema(void);

#define AUTH_TOKEN_LEN 47 /* "olp_" + 43 base64url characters (32 random bytes) */
#define AUTH_NAME_MAX 128 /* bytes of a key's name */

/* Domain results of key management. AUTH_KEY_ERR_SYSTEM leaves errno set. */
enum auth_key_result {
	AUTH_KEY_OK = 0,
	AUTH_KEY_ERR_SYSTEM,	   /* a system call failed: errno says which */
	AUTH_KEY_ERR_INSECURE,	   /* group or others can reach the store (see the message) */
	AUTH_KEY_ERR_OWNER_EXISTS, /* an active owner key exists and force was not given */
	AUTH_KEY_ERR_NOT_FOUND,	   /* no key directory with a valid manifest has that id */
	AUTH_KEY_ERR_INVALID_ARG,  /* a name, tier, provider or id the store cannot hold */
};
const char *auth_key_strerror(enum auth_key_result r);

/* What to create. Strings are borrowed for the call. */
struct auth_key_spec {
	const char *name;	      /* required, 1..AUTH_NAME_MAX bytes, no control characters */
	enum auth_tier tier;	      /* AUTH_TIER_OWNER or AUTH_TIER_GUEST */
	const char *const *providers; /* NULL: providers_enabled "*"; else n_providers names */
	size_t n_providers;
	const char *notes;	 /* NULL: "notes": null */
	bool force;		 /* allow a second active owner */
	struct auth_quota quota; /* each 0..AUTH_QUOTA_MAX; all 0: "quota": null */
	/* A guest's "login_access" (provider names; none: the field is not written). An
	 * owner key reaches every login: giving it one is AUTH_KEY_ERR_INVALID_ARG. */
	const char *const *login_access;
	size_t n_login_access;
	/* "accounts": "<provider>=<account>" bindings, one per provider (none: the field
	 * is not written). */
	const char *const *accounts;
	size_t n_accounts;
};

/* A created key. token is the only copy of the secret: show it once, then wipe the struct
 * with auth_new_key_wipe(). */
struct auth_new_key {
	char id[AUTH_ID_MAX];
	char token[AUTH_TOKEN_LEN + 1];
	char created_at[32];
};

/* Create keys/<id>/manifest.json (creating olp_home and keys/ 0700 when missing). The key
 * appears in keys/ complete or not at all: it is written in a hidden temporary directory
 * which is then renamed to keys/<id>. Refuses an insecure store (msg says why and how to
 * fix it; msg may be NULL, else it is a struct buf * the caller owns). */
enum auth_key_result auth_key_create(const char *olp_home, const struct auth_key_spec *spec,
				     struct auth_new_key *out, struct buf *msg);
/* With a db: one row, inserted with a fresh id under a transaction-scoped advisory lock (so
 * that two "keygen --owner" runs cannot both see no owner). */
enum auth_key_result auth_key_create_at(const struct auth_target *t,
					const struct auth_key_spec *spec, struct auth_new_key *out,
					struct buf *msg);
void auth_new_key_wipe(struct auth_new_key *k);

/* Set revoked_at on key id (under the key's lock, so no concurrent last_used_at update
 * can undo it). Revoking a revoked key succeeds and keeps the first revoked_at;
 * *was_revoked (may be NULL) tells which happened. */
enum auth_key_result auth_key_revoke(const char *olp_home, const char *id, bool *was_revoked,
				     struct buf *msg);
enum auth_key_result auth_key_revoke_at(const struct auth_target *t, const char *id,
					bool *was_revoked, struct buf *msg);

/* Which limits auth_key_set_quota changes. */
enum auth_quota_fields {
	AUTH_QUOTA_RPM = 1 << 0,  /* requests_per_minute */
	AUTH_QUOTA_RPD = 1 << 1,  /* requests_per_day */
	AUTH_QUOTA_TPD = 1 << 2,  /* tokens_per_day */
	AUTH_QUOTA_CONC = 1 << 3, /* max_concurrent */
	AUTH_QUOTA_ALL = AUTH_QUOTA_RPM | AUTH_QUOTA_RPD | AUTH_QUOTA_TPD | AUTH_QUOTA_CONC,
};

/* Set the limits named in fields (enum auth_quota_fields) of key id to q's (0: no limit),
 * keeping the others, under the key's lock with an atomic rewrite (as revoke does). A
 * quota left with no limit is written as "quota": null. Running workers apply it from
 * their next request (auth_check re-reads a manifest that changed). *result (may be NULL)
 * gets the quota as written. AUTH_KEY_ERR_INVALID_ARG for a value outside
 * 0..AUTH_QUOTA_MAX or a bad id; a revoked key's quota can still be set. */
enum auth_key_result auth_key_set_quota(const char *olp_home, const char *id,
					const struct auth_quota *q, unsigned fields,
					struct auth_quota *result, struct buf *msg);
enum auth_key_result auth_key_set_quota_at(const struct auth_target *t, const char *id,
					   const struct auth_quota *q, unsigned fields,
					   struct auth_quota *result, struct buf *msg);

/* Allow (allow true) or take back the logins of key id named in providers ("login_access",
 * which holds provider names; the key's runs may then hold those providers' credential
 * files where the provider's CLI runs commands, so whoever holds the key can read them).
 * clear: take back every one first. Under the key's lock, as set-quota; the field is
 * removed when it ends empty. *result (may be NULL) gets the list as written (release with
 * auth_strings_free). AUTH_KEY_ERR_INVALID_ARG for a bad provider name, or for allowing
 * an owner key (which reaches every login anyway). */
enum auth_key_result auth_key_set_login(const char *olp_home, const char *id,
					const char *const *providers, size_t n, bool allow,
					bool clear, char ***result, size_t *n_result,
					struct buf *msg);
enum auth_key_result auth_key_set_login_at(const struct auth_target *t, const char *id,
					   const char *const *providers, size_t n, bool allow,
					   bool clear, char ***result, size_t *n_result,
					   struct buf *msg);
/* Bind key id's requests to provider to account (the manifest's "accounts" member; NULL:
 * unbind them), under the key's lock as set-quota, in either store. The field is removed
 * when it ends empty. The account is not checked against the configuration here (the
 * tool has none): a request of a key bound to an account its provider does not have is
 * refused. AUTH_KEY_ERR_INVALID_ARG for a bad name. */
enum auth_key_result auth_key_set_account_at(const struct auth_target *t, const char *id,
					     const char *provider, const char *account,
					     struct buf *msg);
/* Free an array of n heap strings (NULL is fine). */
void auth_strings_free(char **v, size_t n);

/* One key as listed: never its hash. Strings are heap copies owned by the list; the
 * timestamps are NULL when the manifest has null. */
struct auth_key_info {
	char id[AUTH_ID_MAX];
	char *name;
	enum auth_tier tier;
	bool revoked;
	bool all_providers;
	char **providers;
	size_t n_providers;
	char *created_at;
	char *revoked_at;
	char *last_used_at;
	char *notes;
	struct auth_quota quota;
	char **login_access; /* "login_access" (n_login_access provider names) */
	size_t n_login_access;
	char **accounts; /* "accounts": "<provider>=<account>" bindings */
	size_t n_accounts;
};

struct auth_key_list {
	struct auth_key_info *keys; /* sorted by created_at, then id */
	size_t n;
	size_t n_skipped; /* invalid manifests left out (each logged once) */
};

/* Read every valid manifest under olp_home/keys (an absent keys/ is an empty store).
 * Release the list with auth_key_list_release(). */
enum auth_key_result auth_key_list(const char *olp_home, struct auth_key_list *out,
				   struct buf *msg);
/* With a db: every row whose manifest is valid (the others counted in n_skipped). */
enum auth_key_result auth_key_list_at(const struct auth_target *t, struct auth_key_list *out,
				      struct buf *msg);
void auth_key_list_release(struct auth_key_list *l);

/* Refuse a store others could read or tamper with: olp_home writable by group/others, or
 * keys/ (or anything under it) reachable by group/others. AUTH_KEY_OK when fine or absent;
 * AUTH_KEY_ERR_INSECURE with the offending path and the chmod command that fixes it in msg. */
enum auth_key_result auth_store_check_perms(const char *olp_home, struct buf *msg);

/* What auth_key_migrate did. */
struct auth_migrate_report {
	size_t copied;	  /* rows inserted, or updated because the file's manifest differed */
	size_t unchanged; /* rows already holding the file's manifest */
	size_t skipped;	  /* invalid manifests (each logged), not copied */
};
/* Copy every valid manifest under olp_home/keys into db's olp_keys, in one transaction:
 * INSERT ... ON CONFLICT (id) DO UPDATE only where the stored manifest differs, so running
 * it again changes nothing and reports every key unchanged. The key files are left as they
 * are. A token hash already held by another id in db fails the whole copy (msg names the
 * key): two keys with one token would be ambiguous. */
enum auth_key_result auth_key_migrate(const char *olp_home, struct store_db *db,
				      struct auth_migrate_report *rep, struct buf *msg);

#endif
