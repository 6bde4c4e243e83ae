/* auth: OLP API keys, tiers and the audit log.
 *
 * The key store is the Node OLP's layout, so an existing OLP home works unchanged:
 *   $OLP_HOME/keys/<id>/manifest.json   (directory 0700, file 0600)
 * Only the SHA-256 hex of a token is ever stored. auth knows nothing of HTTP, providers
 * or sandboxes: the caller hands it header values and gets back an identity. */
#ifndef OLP_AUTH_H
#define OLP_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
};

#define AUTH_ID_MAX 64

/* Who is calling. Plain data, owned by the caller; release with auth_identity_release(). */
struct auth_identity {
	char key_id[AUTH_ID_MAX]; /* manifest id, "__env_owner__" or "__anonymous__" */
	enum auth_tier tier;
	bool all_providers; /* providers_enabled was "*" */
	char **providers;   /* else this list (n_providers entries, heap strings) */
	size_t n_providers;
};

struct auth_options {
	bool allow_anonymous;        /* config.json auth.allow_anonymous */
	const char *env_owner_token; /* OLP_OWNER_TOKEN, or NULL; copied (only its hash is kept) */
};

/* An open key store: opaque, thread-safe (one per worker process, shared by its threads). */
struct auth_store;

/* Open the store under olp_home (keys/ need not exist yet). NULL with errno on failure. */
struct auth_store *auth_store_open(const char *olp_home, const struct auth_options *opt);
void auth_store_free(struct auth_store *st);

/* Check a request's credentials. authorization is the raw Authorization header value (or
 * NULL), x_api_key the raw x-api-key value (or NULL). "Bearer" is matched case-insensitively
 * and wins over x-api-key. On AUTH_OK *out is filled (release it). Revocation by another
 * process is seen on the very next call. */
enum auth_result auth_check(struct auth_store *st, const char *authorization,
			    const char *x_api_key, struct auth_identity *out);
const char *auth_strerror(enum auth_result r);
/* The OpenAI-style error "type" for r: "auth_required" / "invalid_or_revoked_key". */
const char *auth_error_type(enum auth_result r);

void auth_identity_release(struct auth_identity *id);
/* Whether id may use provider (a registry provider name). */
bool auth_identity_allows(const struct auth_identity *id, const char *provider);
const char *auth_tier_name(enum auth_tier t); /* "owner", "guest", "anonymous", "none" */

/* Record that id was used (manifest last_used_at). Cheap to call after the response is
 * finished: it never blocks on disk in the caller's thread, never revives a revoked key,
 * and does nothing for synthetic identities. */
void auth_touch(struct auth_store *st, const struct auth_identity *id);

/* ---- audit log: $OLP_HOME/logs/audit.ndjson, one JSON line per API request ---------- */
struct audit_record {
	const char *key_id;     /* may be NULL */
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

/* Append one line (one write(2), O_APPEND, 0600, daily rotation). Never fails a request:
 * a failure is counted and reported by auth_audit_failures(). */
void auth_audit(struct auth_store *st, const struct audit_record *rec);
uint64_t auth_audit_failures(const struct auth_store *st);

#endif
