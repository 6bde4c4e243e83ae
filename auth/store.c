/* The key store as a worker sees it: an in-memory index token-hash → key, kept in step
 * with keys/ without rescanning it per request, and the deferred last_used_at writer.
 *
 * Cost of a check: one SHA-256, a binary search, and one stat(2) of the matched key's
 * manifest — the stat is what makes a revocation by another process visible on the very
 * next request (every write replaces the file, so a changed inode/mtime means re-read).
 * A miss rescans keys/ only when keys/ itself changed (a key was added or removed) or, as
 * a fallback, at most once per AUTH_RESCAN_INTERVAL_NS, and a rescan re-parses only the
 * manifests whose signature changed. */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "auth/internal.h"
#include "common/banned.h"

/* A token that matches nothing rescans keys/ at most this often (per process), so that
 * random tokens cannot turn into a directory walk per request. */
#define AUTH_RESCAN_INTERVAL_NS (1000ull * 1000 * 1000)
/* last_used_at is written at most this often per key and process. */
#define AUTH_TOUCH_INTERVAL_NS (60ull * 1000 * 1000 * 1000)
/* Pending last_used_at writes beyond this are dropped (and the drop is logged once). */
#define AUTH_TOUCH_QUEUE_MAX 4096

struct key_entry {
	struct auth_key_record rec;  /* rec.id is the directory name, even when !valid */
	struct auth_file_sig sig;    /* of the manifest.json the record came from; zero: none */
	bool valid;		     /* rec came from a valid manifest */
	_Atomic uint64_t touched_ns; /* mono_ns() of the last queued last_used_at write */
};

/* Immutable in shape once published: entries change only in place, under the write lock. */
struct key_index {
	struct key_entry *v; /* sorted by id */
	size_t n;
	struct key_entry **by_hash; /* valid entries with a unique hash, sorted by hash */
	size_t n_hash;
};

struct auth_store {
	char *olp_home;
	char *keys_dir;
	bool allow_anonymous;
	/* The anonymous identity's providers and quota (auth_options.anonymous). */
	bool anon_all;
	struct strv anon_providers;
	struct auth_quota anon_quota;
	bool have_env_owner;
	unsigned char env_hash[AUTH_HASH_BYTES];

	pthread_rwlock_t idx_lock; /* guards idx and in-place changes to its entries */
	struct key_index *idx;

	pthread_mutex_t scan_lock; /* serialises rescans; guards the three fields below */
	struct auth_file_sig keys_sig;
	uint64_t last_scan_ns;
	struct timespec scan_wall;     /* CLOCK_REALTIME when the last scan started */
	atomic_bool stale;	       /* an entry's token changed: rescan on the next miss */
	atomic_uint_fast64_t scan_gen; /* rescans so far: a miss that raced one looks again */

	pthread_mutex_t touch_lock; /* guards everything touch_* */
	pthread_cond_t touch_cond;
	pthread_t touch_thread;
	bool touch_started, touch_stop, touch_dropped;
	struct auth_touch_req *touch_q;
	size_t touch_n, touch_cap;

	struct auth_audit_log audit;
	struct auth_pg *pg; /* the keys live in PostgreSQL (pg.c): no index, no keys/ */
};

/* ---- the index --------------------------------------------------------------------- */

static void index_free(struct key_index *idx)
{
	size_t i;

	if (!idx)
		return;
	for (i = 0; i < idx->n; i++)
		auth_key_record_release(&idx->v[i].rec);
	free(idx->v);
	free(idx->by_hash);
	free(idx);
}

static int cmp_entry_id(const void *a, const void *b)
{
	const struct key_entry *x = a, *y = b;

	return strcmp(x->rec.id, y->rec.id);
}

static int cmp_id_entry(const void *id, const void *b)
{
	const struct key_entry *y = b;

	return strcmp(id, y->rec.id);
}

static int cmp_entry_hash(const void *a, const void *b)
{
	const struct key_entry *const *x = a, *const *y = b;

	return memcmp((*x)->rec.hash, (*y)->rec.hash, AUTH_HASH_BYTES);
}

static struct key_entry *index_find_id(const struct key_index *idx, const char *id)
{
	if (!idx || !idx->n)
		return NULL;
	return bsearch(id, idx->v, idx->n, sizeof(*idx->v), cmp_id_entry);
}

/* The binary search orders by the hash, which tells an observer nothing about the token
 * (SHA-256 preimage); the final equality is still checked in constant time. */
static struct key_entry *index_find_hash(const struct key_index *idx,
					 const unsigned char hash[AUTH_HASH_BYTES])
{
	size_t lo = 0, hi = idx ? idx->n_hash : 0;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		struct key_entry *e = idx->by_hash[mid];
		int c = memcmp(hash, e->rec.hash, AUTH_HASH_BYTES);

		if (c == 0)
			return sodium_memcmp(hash, e->rec.hash, AUTH_HASH_BYTES) == 0 ? e : NULL;
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

/* Sort v by id and build by_hash. Two manifests with the same token hash (a copied key
 * directory) are ambiguous — revoking one would leave the other working — so neither
 * matches until the operator removes one. */
static void index_finish(struct key_index *idx)
{
	size_t i, j, n = 0;

	if (idx->n)
		qsort(idx->v, idx->n, sizeof(*idx->v), cmp_entry_id);
	/* NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers */
	idx->by_hash = xcalloc(idx->n, sizeof(*idx->by_hash));
	for (i = 0; i < idx->n; i++)
		if (idx->v[i].valid)
			idx->by_hash[n++] = &idx->v[i];
	/* NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers */
	qsort(idx->by_hash, n, sizeof(*idx->by_hash), cmp_entry_hash);
	idx->n_hash = 0;
	for (i = 0; i < n; i = j) {
		for (j = i + 1; j < n; j++)
			if (memcmp(idx->by_hash[i]->rec.hash, idx->by_hash[j]->rec.hash,
				   AUTH_HASH_BYTES) != 0)
				break;
		if (j - i > 1) {
			log_warnx(NULL,
				  "auth: keys %s and %s share one token hash; neither is accepted",
				  idx->by_hash[i]->rec.id, idx->by_hash[i + 1]->rec.id);
			continue;
		}
		idx->by_hash[idx->n_hash++] = idx->by_hash[i];
	}
}

static void warn_invalid(const char *keys_dir, const char *id, const char *why)
{
	log_warnx(NULL, "auth: skipping key manifest %s/%s/manifest.json: %s", keys_dir, id,
		  why ? why : "unreadable");
}

/* Build a fresh index from keys/, reusing old's entries whose manifest is unchanged (no
 * re-parse, no repeated warning). Caller holds scan_lock. */
static struct key_index *index_scan(struct auth_store *st)
{
	struct key_index *idx, *old;
	struct dirent *de;
	size_t cap = 0;
	DIR *d;

	idx = xcalloc(1, sizeof(*idx));
	d = opendir(st->keys_dir);
	if (!d) {
		if (errno != ENOENT)
			log_warn(NULL, "auth: cannot read %s", st->keys_dir);
		index_finish(idx); /* an empty index: nothing was taken that needs release */
		return idx;
	}
	pthread_rwlock_rdlock(&st->idx_lock);
	old = st->idx;
	while ((de = readdir(d))) {
		struct key_entry *e, *prev;
		struct stat sb;
		char rel[sizeof(de->d_name) + 16];
		const char *why = NULL;
		int ret;

		/* Dot names are ours (key creation in progress) or not keys at all. */
		if (de->d_name[0] == '.')
			continue;
		if (!auth_id_valid(de->d_name)) {
			/* Said once, at open: such a name has no entry to remember it by. */
			if (de->d_type == DT_DIR && !old)
				log_warnx(NULL, "auth: skipping %s/%.64s: not a key id",
					  st->keys_dir, de->d_name);
			continue;
		}
		snprintf(rel, sizeof(rel), "%s/manifest.json", de->d_name);
		if (fstatat(dirfd(d), rel, &sb, AT_SYMLINK_NOFOLLOW) < 0)
			continue; /* not a key directory (yet): nothing to say */
		if (idx->n == cap) {
			cap = cap ? 2 * cap : 64;
			idx->v = xreallocarray(idx->v, cap, sizeof(*idx->v));
		}
		e = &idx->v[idx->n];
		memset(e, 0, sizeof(*e));
		prev = index_find_id(old, de->d_name);
		auth_file_sig_from_stat(&e->sig, &sb);
		if (prev && auth_file_sig_equal(&prev->sig, &e->sig)) {
			auth_key_record_copy(&e->rec, &prev->rec);
			e->valid = prev->valid;
			atomic_store(&e->touched_ns, atomic_load(&prev->touched_ns));
			idx->n++;
			continue;
		}
		if (prev)
			atomic_store(&e->touched_ns, atomic_load(&prev->touched_ns));
		ret = auth_manifest_load(st->keys_dir, de->d_name, NULL, &e->rec, &e->sig, &why);
		if (ret == -ENOENT)
			continue; /* removed while we looked */
		if (ret) {
			warn_invalid(st->keys_dir, de->d_name, why);
			memset(&e->rec, 0, sizeof(e->rec));
			/* auth_id_valid() above bounds the name to AUTH_ID_MAX - 1 bytes. */
			memcpy(e->rec.id, de->d_name, strlen(de->d_name) + 1);
		}
		e->valid = ret == 0;
		idx->n++;
	}
	pthread_rwlock_unlock(&st->idx_lock);
	closedir(d);
	index_finish(idx);
	return idx;
}

/* Stat keys/ itself: adding or removing a key directory changes its mtime and link count. */
static void keys_dir_sig(const struct auth_store *st, struct auth_file_sig *sig)
{
	struct stat sb;

	memset(sig, 0, sizeof(*sig));
	if (stat(st->keys_dir, &sb) == 0)
		auth_file_sig_from_stat(sig, &sb);
}

/* Rescan and publish (caller holds scan_lock). */
static void store_rescan_locked(struct auth_store *st, const struct auth_file_sig *dir_sig)
{
	struct key_index *fresh, *old;

	clock_gettime(CLOCK_REALTIME, &st->scan_wall);
	fresh = index_scan(st);
	pthread_rwlock_wrlock(&st->idx_lock);
	old = st->idx;
	st->idx = fresh;
	pthread_rwlock_unlock(&st->idx_lock);
	index_free(old);
	st->keys_sig = *dir_sig;
	st->last_scan_ns = mono_ns();
	atomic_store(&st->stale, false);
	atomic_fetch_add(&st->scan_gen, 1);
}

/* keys/ was changed so close to the last scan that the scan may have missed the change
 * while its timestamp (the file system's coarse clock) still looks the same: a key added
 * by renaming a finished directory into place changes neither keys/'s link count nor its
 * size. Like git's "racily clean" index entries: look again. */
static bool racy(const struct auth_file_sig *sig, const struct timespec *scan)
{
	int64_t m = (int64_t)sig->mtime.tv_sec * 1000000000 + sig->mtime.tv_nsec;
	int64_t c = (int64_t)sig->ctime.tv_sec * 1000000000 + sig->ctime.tv_nsec;
	int64_t t = (int64_t)scan->tv_sec * 1000000000 + scan->tv_nsec;

	return (m > c ? m : c) >= t - 50000000; /* within 50 ms of the scan's start */
}

/* After a miss: rescan when keys/ changed, the index is stale, or the fallback interval
 * has passed. Returns whether the index is newer than the one the miss was seen in
 * (gen_seen: scan_gen before that lookup), so worth looking again: rescanned here, or by
 * another thread meanwhile. Without the second case, two threads missing a new key at
 * once gave one of them a 401: the other's rescan had made keys/ look unchanged. */
static bool store_refresh(struct auth_store *st, uint_fast64_t gen_seen)
{
	struct auth_file_sig sig;
	bool done;

	pthread_mutex_lock(&st->scan_lock);
	done = atomic_load(&st->scan_gen) != gen_seen;
	if (!done) {
		keys_dir_sig(st, &sig);
		if (!auth_file_sig_equal(&sig, &st->keys_sig) || atomic_load(&st->stale) ||
		    racy(&sig, &st->scan_wall) ||
		    mono_ns() - st->last_scan_ns >= AUTH_RESCAN_INTERVAL_NS) {
			store_rescan_locked(st, &sig);
			done = true;
		}
	}
	pthread_mutex_unlock(&st->scan_lock);
	return done;
}

/* ---- identities -------------------------------------------------------------------- */

/* A heap copy of sv's strings into *out (NULL when sv is empty). */
static void strings_copy(const struct strv *sv, char ***out, size_t *n)
{
	struct strv copy = STRV_INIT;

	*out = NULL;
	*n = 0;
	if (!sv || !sv->n)
		return;
	for (size_t i = 0; i < sv->n; i++)
		strv_push(&copy, sv->v[i]);
	*out = strv_detach(&copy, n);
}

/* providers (may be NULL) is copied; out->providers stays NULL when all or empty. */
static void identity_fill(struct auth_identity *out, const char *id, enum auth_tier tier, bool all,
			  const struct strv *providers)
{
	memset(out, 0, sizeof(*out));
	snprintf(out->key_id, sizeof(out->key_id), "%s", id);
	out->tier = tier;
	out->all_providers = all;
	if (!all)
		strings_copy(providers, &out->providers, &out->n_providers);
}

void auth_identity_from_record(struct auth_identity *out, const struct auth_key_record *r)
{
	identity_fill(out, r->id, r->tier, r->all_providers, &r->providers);
	out->quota = r->quota;
	/* An owner reaches every login: a list on an owner key means nothing. */
	if (r->tier == AUTH_TIER_GUEST)
		strings_copy(&r->login_access, &out->login_access, &out->n_login_access);
	strings_copy(&r->accounts, &out->accounts, &out->n_accounts);
}

const char *auth_identity_account(const struct auth_identity *id, const char *provider)
{
	size_t pl = strlen(provider);

	for (size_t i = 0; i < id->n_accounts; i++)
		if (!strncmp(id->accounts[i], provider, pl) && id->accounts[i][pl] == '=')
			return id->accounts[i] + pl + 1;
	return NULL;
}

void auth_strings_free(char **v, size_t n)
{
	for (size_t i = 0; v && i < n; i++)
		free(v[i]);
	free(v);
}

void auth_identity_release(struct auth_identity *id)
{
	if (!id)
		return;
	auth_strings_free(id->providers, id->n_providers);
	auth_strings_free(id->login_access, id->n_login_access);
	auth_strings_free(id->accounts, id->n_accounts);
	id->providers = id->login_access = id->accounts = NULL;
	id->n_providers = id->n_login_access = id->n_accounts = 0;
}

bool auth_identity_allows(const struct auth_identity *id, const char *provider)
{
	size_t i;

	if (!id || id->tier == AUTH_TIER_NONE || !provider)
		return false;
	if (id->all_providers)
		return true;
	for (i = 0; i < id->n_providers; i++)
		if (strcmp(id->providers[i], provider) == 0)
			return true;
	return false;
}

bool auth_identity_may_hold_login(const struct auth_identity *id, const char *provider)
{
	if (!id || !provider)
		return false;
	if (id->tier == AUTH_TIER_OWNER)
		return true;
	if (id->tier != AUTH_TIER_GUEST)
		return false; /* anonymous (and no identity) never */
	for (size_t i = 0; i < id->n_login_access; i++)
		if (strcmp(id->login_access[i], provider) == 0)
			return true;
	return false;
}

const char *auth_tier_name(enum auth_tier t)
{
	switch (t) {
	case AUTH_TIER_OWNER: return "owner";
	case AUTH_TIER_GUEST: return "guest";
	case AUTH_TIER_ANONYMOUS: return "anonymous";
	case AUTH_TIER_NONE: break;
	}
	return "none";
}

const char *auth_strerror(enum auth_result r)
{
	switch (r) {
	case AUTH_OK: return "OK";
	case AUTH_ERR_REQUIRED:
		return "OLP API key required. Pass via \"Authorization: Bearer <token>\" or "
		       "\"x-api-key: <token>\".";
	case AUTH_ERR_UNAVAILABLE: return "The key store is unavailable; try again shortly.";
	case AUTH_ERR_INVALID: break;
	}
	return "OLP API key is invalid or has been revoked.";
}

const char *auth_error_type(enum auth_result r)
{
	switch (r) {
	case AUTH_OK: return NULL;
	case AUTH_ERR_REQUIRED: return "auth_required";
	case AUTH_ERR_UNAVAILABLE: return "store_unavailable";
	case AUTH_ERR_INVALID: break;
	}
	return "invalid_or_revoked_key";
}

/* ---- the check --------------------------------------------------------------------- */

enum lookup { LOOKUP_MISS, LOOKUP_OK, LOOKUP_REFUSED };

/* Append s to path at *at, cut as snprintf would cut it (n: path's size). */
static void path_put(char *path, size_t n, size_t *at, const char *s)
{
	size_t len = strlen(s);

	if (len > n - 1 - *at)
		len = n - 1 - *at;
	memcpy(path + *at, s, len);
	*at += len;
	path[*at] = '\0';
}

/* keys_dir/id/manifest.json into path (n bytes), as snprintf would write it: without
 * printf's cost, on every key check. */
static void manifest_path(char *path, size_t n, const char *keys_dir, const char *id)
{
	size_t at = 0;

	path[0] = '\0';
	path_put(path, n, &at, keys_dir);
	path_put(path, n, &at, "/");
	path_put(path, n, &at, id);
	path_put(path, n, &at, "/manifest.json");
}

/* A hit's manifest changed on disk: re-read it and update the entry in place. */
static enum lookup lookup_reload(struct auth_store *st, const unsigned char hash[AUTH_HASH_BYTES],
				 const char *id, struct auth_identity *out)
{
	struct auth_key_record rec = { 0 };
	struct auth_file_sig sig = { 0 };
	struct key_entry *e;
	const char *why = NULL;
	enum lookup res = LOOKUP_REFUSED;
	int ret;

	ret = auth_manifest_load(st->keys_dir, id, NULL, &rec, &sig, &why);
	if (ret == -EINVAL)
		warn_invalid(st->keys_dir, id, why);
	else if (ret && ret != -ENOENT)
		log_warnx(NULL, "auth: cannot read the manifest of key %s: %s", id, strerror(-ret));
	pthread_rwlock_wrlock(&st->idx_lock);
	e = index_find_hash(st->idx, hash);
	if (!e || strcmp(e->rec.id, id) != 0)
		goto out_unlock; /* the index moved on meanwhile; refuse this once */
	if (ret == 0 && sodium_memcmp(rec.hash, hash, AUTH_HASH_BYTES) == 0) {
		auth_key_record_release(&e->rec);
		e->rec = rec;
		memset(&rec, 0, sizeof(rec));
		e->sig = sig;
		e->valid = true;
		if (!e->rec.revoked) {
			auth_identity_from_record(out, &e->rec);
			res = LOOKUP_OK;
		}
		goto out_unlock;
	}
	/* Gone, unreadable, invalid, or now holding another token: this token is refused
	 * until a rescan rebuilds the index (the entry's hash keeps by_hash sorted). */
	e->valid = false;
	e->sig = sig;
	if (ret == 0 || ret == -ENOENT)
		atomic_store(&st->stale, true);
out_unlock:
	pthread_rwlock_unlock(&st->idx_lock);
	auth_key_record_release(&rec);
	return res;
}

static enum lookup store_lookup(struct auth_store *st, const unsigned char hash[AUTH_HASH_BYTES],
				struct auth_identity *out)
{
	char path[4096], id[AUTH_ID_MAX];
	struct auth_file_sig sig = { 0 };
	struct key_entry *e;
	struct stat sb;
	enum lookup res;

	pthread_rwlock_rdlock(&st->idx_lock);
	e = index_find_hash(st->idx, hash);
	if (!e) {
		pthread_rwlock_unlock(&st->idx_lock);
		return LOOKUP_MISS;
	}
	snprintf(id, sizeof(id), "%s", e->rec.id);
	manifest_path(path, sizeof(path), st->keys_dir, id);
	if (lstat(path, &sb) == 0)
		auth_file_sig_from_stat(&sig, &sb);
	if (auth_file_sig_equal(&sig, &e->sig)) {
		res = LOOKUP_REFUSED;
		if (e->valid && !e->rec.revoked) {
			auth_identity_from_record(out, &e->rec);
			res = LOOKUP_OK;
		}
		pthread_rwlock_unlock(&st->idx_lock);
		return res;
	}
	pthread_rwlock_unlock(&st->idx_lock);
	return lookup_reload(st, hash, id, out);
}

enum auth_result auth_check(struct auth_store *st, const char *authorization, const char *x_api_key,
			    struct auth_identity *out)
{
	unsigned char hash[AUTH_HASH_BYTES];
	uint_fast64_t gen;
	enum lookup res;
	const char *tok;
	size_t len;

	memset(out, 0, sizeof(*out));
	auth_token_extract(authorization, x_api_key, &tok, &len);
	if (!tok) {
		if (!st->allow_anonymous)
			return AUTH_ERR_REQUIRED;
		identity_fill(out, AUTH_ID_ANONYMOUS, AUTH_TIER_ANONYMOUS, st->anon_all,
			      &st->anon_providers);
		out->quota = st->anon_quota;
		return AUTH_OK;
	}
	if (len > AUTH_TOKEN_MAX)
		return AUTH_ERR_INVALID;
	auth_hash_token(tok, len, hash);
	if (st->have_env_owner && sodium_memcmp(hash, st->env_hash, AUTH_HASH_BYTES) == 0) {
		identity_fill(out, AUTH_ID_ENV_OWNER, AUTH_TIER_OWNER, true, NULL);
		return AUTH_OK;
	}
	if (st->pg) {
		enum auth_result r = auth_pg_check(st->pg, hash, out);

		sodium_memzero(hash, sizeof(hash));
		if (r != AUTH_OK)
			memset(out, 0, sizeof(*out));
		return r;
	}
	gen = atomic_load(&st->scan_gen);
	res = store_lookup(st, hash, out);
	if (res == LOOKUP_MISS && store_refresh(st, gen))
		res = store_lookup(st, hash, out);
	sodium_memzero(hash, sizeof(hash));
	if (res == LOOKUP_OK)
		return AUTH_OK;
	memset(out, 0, sizeof(*out));
	return AUTH_ERR_INVALID;
}

/* ---- last_used_at, off the request path ---------------------------------------------- */

static int touch_edit(json_t *root, const struct auth_key_record *rec, void *arg)
{
	const char *when = arg;

	/* Under the key's lock, on the manifest as it is now: a key revoked since the
	 * request stays revoked and keeps its last_used_at. */
	if (rec->revoked)
		return 0;
	if (json_object_set_new(root, "last_used_at", json_string(when)) < 0)
		return -ENOMEM;
	return 1;
}

static void *touch_main(void *arg)
{
	struct auth_store *st = arg;
	struct auth_touch_req *q = NULL;
	size_t n, i;

	pthread_mutex_lock(&st->touch_lock);
	for (;;) {
		while (!st->touch_n && !st->touch_stop)
			pthread_cond_wait(&st->touch_cond, &st->touch_lock);
		if (!st->touch_n && st->touch_stop)
			break;
		q = st->touch_q;
		n = st->touch_n;
		st->touch_q = NULL;
		st->touch_n = st->touch_cap = 0;
		pthread_mutex_unlock(&st->touch_lock);
		if (st->pg)
			auth_pg_touch_write(st->pg, q, n); /* one statement for the batch */
		for (i = 0; !st->pg && i < n; i++) {
			int ret =
				auth_manifest_update(st->keys_dir, q[i].id, touch_edit, q[i].when);

			if (ret < 0 && ret != -ENOENT)
				log_warnx(NULL, "auth: cannot record last use of key %s: %s",
					  q[i].id, strerror(-ret));
		}
		free(q);
		pthread_mutex_lock(&st->touch_lock);
	}
	pthread_mutex_unlock(&st->touch_lock);
	return NULL;
}

static void touch_enqueue(struct auth_store *st, const char *id)
{
	struct auth_touch_req *r;

	pthread_mutex_lock(&st->touch_lock);
	if (st->touch_stop)
		goto out_unlock;
	/* Started on first use, not at open: olp-keys and tests that never touch stay
	 * single-threaded, and a worker that forks before serving keeps its thread. */
	if (!st->touch_started) {
		if (pthread_create(&st->touch_thread, NULL, touch_main, st) != 0) {
			log_warnx(NULL, "auth: cannot start the last_used_at writer");
			goto out_unlock;
		}
		st->touch_started = true;
	}
	if (st->touch_n >= AUTH_TOUCH_QUEUE_MAX) {
		if (!st->touch_dropped)
			log_warnx(NULL, "auth: last_used_at queue full; dropping updates");
		st->touch_dropped = true;
		goto out_unlock;
	}
	if (st->touch_n == st->touch_cap) {
		st->touch_cap = st->touch_cap ? 2 * st->touch_cap : 16;
		st->touch_q = xreallocarray(st->touch_q, st->touch_cap, sizeof(*st->touch_q));
	}
	r = &st->touch_q[st->touch_n++];
	snprintf(r->id, sizeof(r->id), "%s", id);
	auth_iso_time_now(r->when);
	pthread_cond_signal(&st->touch_cond);
out_unlock:
	pthread_mutex_unlock(&st->touch_lock);
}

void auth_touch(struct auth_store *st, const struct auth_identity *id)
{
	struct key_entry *e;
	uint64_t now, last;
	bool due = false;

	if (!st || !id || (id->tier != AUTH_TIER_OWNER && id->tier != AUTH_TIER_GUEST) ||
	    !auth_id_valid(id->key_id))
		return; /* synthetic identities have no manifest */
	if (st->pg) {
		if (auth_pg_touch_due(st->pg, id->key_id))
			touch_enqueue(st, id->key_id);
		return;
	}
	now = mono_ns();
	pthread_rwlock_rdlock(&st->idx_lock);
	e = index_find_id(st->idx, id->key_id);
	if (e && e->valid && !e->rec.revoked) {
		last = atomic_load(&e->touched_ns);
		/* Coalesce: one write per key per interval; the CAS picks one thread. */
		due = (!last || now - last >= AUTH_TOUCH_INTERVAL_NS) &&
		      atomic_compare_exchange_strong(&e->touched_ns, &last, now);
	}
	pthread_rwlock_unlock(&st->idx_lock);
	if (due)
		touch_enqueue(st, id->key_id);
}

/* ---- lifecycle --------------------------------------------------------------------- */

struct auth_store *auth_store_open(const char *olp_home, const struct auth_options *opt)
{
	struct auth_store *st;
	struct auth_file_sig sig;
	struct stat sb;
	int ret;

	if (!olp_home || !*olp_home) {
		errno = EINVAL;
		return NULL;
	}
	ret = auth_crypto_init();
	if (ret) {
		errno = -ret;
		return NULL;
	}
	st = xcalloc(1, sizeof(*st));
	st->olp_home = xstrdup(olp_home);
	st->keys_dir = path_join(olp_home, "keys");
	if (opt) {
		st->allow_anonymous = opt->allow_anonymous;
		if (opt->anonymous) {
			st->anon_all = opt->anonymous->all_providers;
			for (size_t i = 0; i < opt->anonymous->n_providers; i++)
				strv_push(&st->anon_providers, opt->anonymous->providers[i]);
			st->anon_quota = opt->anonymous->quota;
		}
		/* Only the hash is kept: the token itself never lives in our memory. */
		if (opt->env_owner_token && *opt->env_owner_token) {
			auth_hash_token(opt->env_owner_token, strlen(opt->env_owner_token),
					st->env_hash);
			st->have_env_owner = true;
		}
	}
	pthread_rwlock_init(&st->idx_lock, NULL);
	pthread_mutex_init(&st->scan_lock, NULL);
	pthread_mutex_init(&st->touch_lock, NULL);
	pthread_cond_init(&st->touch_cond, NULL);
	atomic_init(&st->stale, false);
	auth_audit_log_init(&st->audit, path_join(olp_home, "logs"), opt);
	if (opt && opt->store) {
		st->pg = auth_pg_open(opt->store, opt);
		if (!st->pg) {
			ret = errno;
			auth_store_free(st);
			errno = ret;
			return NULL;
		}
		return st; /* no keys/ to index */
	}

	if (stat(st->keys_dir, &sb) == 0 && (sb.st_mode & 077))
		log_warnx(NULL, "auth: %s is accessible to group or others; run: chmod -R go= %s",
			  st->keys_dir, st->keys_dir);
	/* Scan now, so that the first request does not pay for it. */
	pthread_mutex_lock(&st->scan_lock);
	keys_dir_sig(st, &sig);
	store_rescan_locked(st, &sig);
	pthread_mutex_unlock(&st->scan_lock);
	return st;
}

void auth_store_free(struct auth_store *st)
{
	if (!st)
		return;
	/* Flush queued last_used_at writes, then stop the writer. */
	pthread_mutex_lock(&st->touch_lock);
	st->touch_stop = true;
	pthread_cond_signal(&st->touch_cond);
	pthread_mutex_unlock(&st->touch_lock);
	if (st->touch_started)
		pthread_join(st->touch_thread, NULL);
	free(st->touch_q);
	auth_pg_free(st->pg);
	auth_audit_log_release(&st->audit);
	index_free(st->idx);
	pthread_cond_destroy(&st->touch_cond);
	pthread_mutex_destroy(&st->touch_lock);
	pthread_mutex_destroy(&st->scan_lock);
	pthread_rwlock_destroy(&st->idx_lock);
	sodium_memzero(st->env_hash, sizeof(st->env_hash));
	strv_release(&st->anon_providers);
	free(st->olp_home);
	free(st->keys_dir);
	free(st);
}

/* ---- audit ------------------------------------------------------------------------- */

void auth_audit(struct auth_store *st, const struct audit_record *rec)
{
	if (st && rec)
		auth_audit_log_write(&st->audit, rec);
}

uint64_t auth_audit_failures(const struct auth_store *st)
{
	return st ? atomic_load(&st->audit.failures) : 0;
}

/* ---- readers of every key: login grants (ADR 0025), /v1/usage's keys -------------------- */

/* Whether a manifest of the index is no longer the file it was read from (a key revoked,
 * its quota or logins set: each write replaces the file). Under the index's read lock
 * only: threads check at once. */
static bool index_changed(struct auth_store *st)
{
	bool changed = false;

	pthread_rwlock_rdlock(&st->idx_lock);
	for (size_t i = 0; st->idx && i < st->idx->n && !changed; i++) {
		const struct key_entry *e = &st->idx->v[i];
		struct auth_file_sig sig = { 0 };
		char path[4096];
		struct stat sb;

		manifest_path(path, sizeof(path), st->keys_dir, e->rec.id);
		if (lstat(path, &sb) == 0)
			auth_file_sig_from_stat(&sig, &sb);
		changed = !auth_file_sig_equal(&sig, &e->sig);
	}
	pthread_rwlock_unlock(&st->idx_lock);
	return changed;
}

/* Bring the index in step with keys/ for a caller that reads every key (the owner's
 * /health and /v1/usage): keys/ and each indexed manifest are stat(2)ed, and only when
 * one changed is keys/ read again (re-parsing only the manifests that changed). So what
 * another process did (a key made, revoked, its quota or logins set) shows at once,
 * without parsing every manifest on every call. */
static bool store_unchanged_locked(struct auth_store *st, const struct auth_file_sig *sig)
{
	return auth_file_sig_equal(sig, &st->keys_sig) && !atomic_load(&st->stale) &&
	       !racy(sig, &st->scan_wall);
}

/* The stat(2)s outside scan_lock: every owner /health comes here, and threads that held
 * it for theirs made the others wait (a futex wait and a wake-up each). Only when
 * something changed are they made again, under the lock, to rescan as one. */
static void store_sync(struct auth_store *st)
{
	struct auth_file_sig sig;
	bool same;

	keys_dir_sig(st, &sig);
	pthread_mutex_lock(&st->scan_lock);
	same = store_unchanged_locked(st, &sig);
	pthread_mutex_unlock(&st->scan_lock);
	if (same && !index_changed(st))
		return;
	pthread_mutex_lock(&st->scan_lock);
	keys_dir_sig(st, &sig);
	if (!store_unchanged_locked(st, &sig) || index_changed(st))
		store_rescan_locked(st, &sig);
	pthread_mutex_unlock(&st->scan_lock);
}

int auth_login_grants(struct auth_store *st, struct auth_login_grant **out, size_t *n)
{
	size_t cap = 0;

	*out = NULL;
	*n = 0;
	if (st->pg)
		return auth_pg_login_grants(st->pg, out, n);
	store_sync(st);
	pthread_rwlock_rdlock(&st->idx_lock);
	for (size_t i = 0; st->idx && i < st->idx->n; i++) {
		const struct key_entry *e = &st->idx->v[i];

		if (!e->valid || e->rec.revoked || e->rec.tier != AUTH_TIER_GUEST)
			continue;
		for (size_t j = 0; j < e->rec.login_access.n; j++) {
			if (*n == cap) {
				cap = cap ? 2 * cap : 8;
				*out = xreallocarray(*out, cap, sizeof(**out));
			}
			snprintf((*out)[*n].key_id, sizeof((*out)[*n].key_id), "%s", e->rec.id);
			snprintf((*out)[*n].provider, sizeof((*out)[*n].provider), "%s",
				 e->rec.login_access.v[j]);
			(*n)++;
		}
	}
	pthread_rwlock_unlock(&st->idx_lock);
	return 0;
}

/* As auth_key_list orders its keys: by created_at, then id. */
int auth_created_cmp(const char *ca, const char *ia, const char *cb, const char *ib)
{
	int c = strcmp(ca ? ca : "", cb ? cb : "");

	return c ? c : strcmp(ia, ib);
}

static int cmp_summary(const void *a, const void *b)
{
	const struct auth_key_summary *x = a, *y = b;

	return auth_created_cmp(x->created_at, x->id, y->created_at, y->id);
}

int auth_store_keys(struct auth_store *st, struct auth_key_summary **out, size_t *n)
{
	*out = NULL;
	*n = 0;
	if (!st)
		return -EINVAL;
	if (st->pg)
		return auth_pg_keys(st->pg, out, n);
	store_sync(st);
	pthread_rwlock_rdlock(&st->idx_lock);
	if (st->idx && st->idx->n)
		*out = xcalloc(st->idx->n, sizeof(**out));
	for (size_t i = 0; st->idx && i < st->idx->n; i++) {
		const struct key_entry *e = &st->idx->v[i];
		struct auth_key_summary *k = &(*out)[*n];

		if (!e->valid)
			continue; /* as auth_key_list, which skips an invalid manifest */
		snprintf(k->id, sizeof(k->id), "%s", e->rec.id);
		k->name = e->rec.name ? xstrdup(e->rec.name) : NULL;
		k->created_at = e->rec.created_at ? xstrdup(e->rec.created_at) : NULL;
		k->tier = e->rec.tier;
		k->revoked = e->rec.revoked;
		k->quota = e->rec.quota;
		(*n)++;
	}
	pthread_rwlock_unlock(&st->idx_lock);
	if (*n) {
		qsort(*out, *n, sizeof(**out), cmp_summary);
	} else {
		free(*out); /* every manifest invalid */
		*out = NULL;
	}
	return 0;
}

void auth_key_summaries_free(struct auth_key_summary *v, size_t n)
{
	for (size_t i = 0; v && i < n; i++) {
		free(v[i].name);
		free(v[i].created_at);
	}
	free(v);
}
