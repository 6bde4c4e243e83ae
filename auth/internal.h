/* auth: private declarations shared by the module's files. Never included outside auth/:
 * the CUnit suite and the bench go through auth.h like every other caller. Every
 * non-static name here carries the module prefix (auth_, AUTH_). */
#ifndef OLP_AUTH_INTERNAL_H
#define OLP_AUTH_INTERNAL_H

#include <stdbool.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/stat.h>
#include <time.h>

#include <jansson.h>
#include <sodium.h>

#include "auth/auth.h"
#include "common/common.h"

#define AUTH_HASH_BYTES crypto_hash_sha256_BYTES /* 32 */
#define AUTH_HASH_HEX (2 * AUTH_HASH_BYTES)	 /* 64 hex digits in the manifest */
#define AUTH_ISO_MAX 32				 /* "2025-01-31T12:34:56.789Z" + NUL */
#define AUTH_MANIFEST_MAX (64 * 1024)		 /* a manifest larger than this is invalid */
#define AUTH_TOKEN_MAX 1024			 /* longer presented tokens fail without hashing */

/* Ids the server makes up; no manifest may claim them. */
#define AUTH_ID_ENV_OWNER "__env_owner__"
#define AUTH_ID_ANONYMOUS "__anonymous__"

/* ---- token.c: libsodium, tokens, hashes, header parsing ---------------------------- */
/* sodium_init() once per process (pthread_once): 0 or -ENOSYS when libsodium cannot start. */
int auth_crypto_init(void);
/* SHA-256 of the len bytes at tok. */
void auth_hash_token(const char *tok, size_t len, unsigned char out[AUTH_HASH_BYTES]);
/* Lowercase hex of a hash (AUTH_HASH_HEX + 1 bytes); parse the 64 hex digits back: 0 or -EINVAL. */
void auth_hash_to_hex(const unsigned char h[AUTH_HASH_BYTES], char out[AUTH_HASH_HEX + 1]);
int auth_hash_from_hex(const char *hex, unsigned char out[AUTH_HASH_BYTES]);
/* A fresh token: "olp_" + base64url(32 random bytes), AUTH_TOKEN_LEN characters + NUL. */
void auth_token_generate(char out[AUTH_TOKEN_LEN + 1]);
/* A fresh key id: 8 characters of [a-z0-9_-], never starting with '-' or '_'. */
void auth_id_generate(char out[AUTH_ID_MAX]);
/* Whether s can name a key directory: 1..AUTH_ID_MAX-1 of [A-Za-z0-9_-], not reserved. */
bool auth_id_valid(const char *s);

/* ---- manifest.c: one key's manifest.json --------------------------------------------- */
/* What the request path needs from a manifest. Owned by whoever holds it. */
struct auth_key_record {
	char id[AUTH_ID_MAX];
	unsigned char hash[AUTH_HASH_BYTES];
	enum auth_tier tier; /* AUTH_TIER_OWNER or AUTH_TIER_GUEST */
	bool revoked;	     /* revoked_at is not null */
	bool all_providers;
	struct strv providers;	  /* when !all_providers; zeroed is empty */
	struct auth_quota quota;  /* all 0: none */
	struct strv login_access; /* "login_access": provider names; zeroed is empty */
	char *name;		  /* "name"; NULL when absent or null (for /v1/usage) */
	char *created_at;	  /* "created_at" when a string, else NULL (the listing's order) */
};

void auth_key_record_release(struct auth_key_record *r);
/* Deep copy src into dst (dst is overwritten, not released). */
void auth_key_record_copy(struct auth_key_record *dst, const struct auth_key_record *src);

/* Identity of one version of a file: every atomic rewrite changes the inode, so two
 * equal signatures mean the same contents. A zeroed signature means "no file". */
struct auth_file_sig {
	dev_t dev;
	ino_t ino;
	off_t size;
	nlink_t nlink;
	struct timespec mtime;
	struct timespec ctime;
};

void auth_file_sig_from_stat(struct auth_file_sig *s, const struct stat *sb);
bool auth_file_sig_equal(const struct auth_file_sig *a, const struct auth_file_sig *b);

/* Read and validate keys_dir/<id>/manifest.json. On 0, *root (may be NULL) holds the JSON
 * (json_decref it), rec is filled and sig describes the file read. -ENOENT when there is
 * no manifest, -EINVAL (with *why) when it is invalid, other -errno on I/O failure. */
int auth_manifest_load(const char *keys_dir, const char *id, json_t **root,
		       struct auth_key_record *rec, struct auth_file_sig *sig, const char **why);
/* Validate len bytes of manifest JSON (a row of olp_keys) as key id's, exactly as
 * auth_manifest_load does a file's: 0 with *root (may be NULL) and rec filled, or -EINVAL
 * with *why. */
int auth_manifest_parse(const char *text, size_t len, const char *id, json_t **root,
			struct auth_key_record *rec, const char **why);
/* Write root as dirfd/manifest.json atomically: a 0600 temporary file in the same
 * directory, fsync, rename over, fsync the directory. 0 or -errno. */
/* Root only: give fd like_fd's owner (when that is not root). 0 or -errno. */
int auth_chown_like(int fd, int like_fd);
int auth_manifest_write_at(int dirfd, json_t *root);

/* Locked read-modify-write of keys_dir/<id>/manifest.json. Takes flock(LOCK_EX) on the
 * key's directory (every writer of ours does, so a revocation and a last_used_at update
 * serialise), re-reads and validates the manifest under the lock, then calls edit: edit
 * returns 1 to write the changed JSON back, 0 to leave the file alone, or -errno.
 * Returns edit's verdict (0/1) or -errno; -ENOENT when the key does not exist, -EINVAL
 * when its manifest is invalid. */
int auth_manifest_update(const char *keys_dir, const char *id,
			 int (*edit)(json_t *root, const struct auth_key_record *rec, void *arg),
			 void *arg);

/* Whether s can be a provider name in a manifest: 1..AUTH_PROVIDER_MAX-1 of
 * [A-Za-z0-9._-]. */
bool auth_provider_name_valid(const char *s);

/* Whether every limit of q is in 0..AUTH_QUOTA_MAX (max_concurrent: 0..1024). */
bool auth_quota_valid(const struct auth_quota *q);
/* The manifest's "quota" for q: null when no limit is set, else an object holding the
 * limits that are set. NULL when jansson runs out of memory. */
json_t *auth_quota_to_json(const struct auth_quota *q);

/* Wall-clock time as JavaScript's Date.toISOString() prints it. */
void auth_iso_time_now(char out[AUTH_ISO_MAX]);

/* ---- store.c: the worker's store, shared with pg.c ------------------------------------ */
/* Fill out (zeroed first) with what r lets its holder do. */
void auth_identity_from_record(struct auth_identity *out, const struct auth_key_record *r);
/* One queued last_used_at write. */
struct auth_touch_req {
	char id[AUTH_ID_MAX];
	char when[AUTH_ISO_MAX];
};
/* Order of the key listings: created_at (NULL first), then id. */
int auth_created_cmp(const char *ca, const char *ia, const char *cb, const char *ib);

/* ---- pg.c: a worker's keys in PostgreSQL (ADR 0034) ------------------------------------ */
struct auth_pg;
/* The cache and LISTEN registration of one auth_store over db (borrowed). NULL with errno
 * (EPROTO: the schema is missing or of another version). */
struct auth_pg *auth_pg_open(struct store_db *db, const struct auth_options *opt);
void auth_pg_free(struct auth_pg *pg);
/* AUTH_OK (out filled), AUTH_ERR_INVALID or AUTH_ERR_UNAVAILABLE for the token hash. */
enum auth_result auth_pg_check(struct auth_pg *pg, const unsigned char hash[AUTH_HASH_BYTES],
			       struct auth_identity *out);
/* Whether id's last_used_at is due a write (at most once a minute per key and process). */
bool auth_pg_touch_due(struct auth_pg *pg, const char *id);
/* Write n queued last_used_at updates in one statement (never on a revoked key). */
void auth_pg_touch_write(struct auth_pg *pg, const struct auth_touch_req *q, size_t n);
int auth_pg_login_grants(struct auth_pg *pg, struct auth_login_grant **out, size_t *n);
int auth_pg_keys(struct auth_pg *pg, struct auth_key_summary **out, size_t *n);

/* Cut a server message (store_exec's err) to its first line: the DETAIL of a unique
 * violation on token_hash would otherwise carry a key's hash into a log or a reply. */
void auth_pg_err_line(struct buf *err);

/* Called for each valid row of olp_keys (root and rec are the callee's to keep: it
 * releases what it does not keep). 0 to go on, else stop with that value. */
typedef int (*auth_pg_row_fn)(void *arg, json_t *root, struct auth_key_record *rec);
/* Every row of olp_keys, ordered by id; invalid manifests logged and counted in *skipped
 * (may be NULL). 0, fn's non-zero, or -errno (-ECONNREFUSED: the database is away). */
int auth_pg_each(struct store_db *db, auth_pg_row_fn fn, void *arg, size_t *skipped);

/* ---- pg_keys.c: key management in PostgreSQL ------------------------------------------- */
/* auth_manifest_update's contract on row id: SELECT ... FOR UPDATE, validate, edit, write
 * back (bumping generation) and commit. edit's 0/1, -ENOENT, -EINVAL, or -errno with the
 * server's message in err (may be NULL). */
int auth_pg_key_update(struct store_db *db, const char *id,
		       int (*edit)(json_t *root, const struct auth_key_record *rec, void *arg),
		       void *arg, struct buf *err);
/* Insert the new key m (id, hash_hex) unless owner_check finds an active owner (then
 * *owner_exists). 0, -EEXIST (the id is taken: pick another), or -errno with err. */
int auth_pg_key_insert(struct store_db *db, const char *id, const char *hash_hex, json_t *m,
		       bool owner_check, bool *owner_exists, struct buf *err);

/* ---- audit.c: $OLP_HOME/logs/audit.ndjson ------------------------------------------- */
/* The statuses 400..499 counted one by one in an unauthenticated summary. */
#define AUTH_AUDIT_STATUSES 100
struct auth_audit_log {
	char *dir;	      /* $OLP_HOME/logs */
	char *path;	      /* dir/audit.ndjson */
	pthread_mutex_t lock; /* guards everything below but failures */
	int fd;		      /* open on audit.ndjson, or -1 */
	ino_t ino;	      /* ... its inode (a rotation by another process changes the path's) */
	long day;	      /* UTC day number (time / 86400) fd was opened for */
	uint64_t max_bytes;   /* rotate past this size */
	unsigned keep;	      /* rotated files kept */
	unsigned summary_s;   /* at most one unauthenticated summary per this many seconds */
	/* Requests without an identity since the last summary: in all, by status, since. */
	uint64_t unauth_total;
	uint64_t unauth[AUTH_AUDIT_STATUSES];
	time_t unauth_since;
	time_t next_summary; /* no summary before this */
	_Atomic uint64_t failures;
};

/* Takes ownership of dir (a heap string); the audit_ settings of opt (NULL: defaults).
 * Opens nothing until the first line. */
void auth_audit_log_init(struct auth_audit_log *a, char *dir, const struct auth_options *opt);
void auth_audit_log_release(struct auth_audit_log *a);
void auth_audit_log_write(struct auth_audit_log *a, const struct audit_record *rec);

#endif
