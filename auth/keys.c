/* Key management for olp-keys: create, revoke, list, and the store permission check. */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth/internal.h"
#include "common/banned.h"

const char *auth_key_strerror(enum auth_key_result r)
{
	switch (r) {
	case AUTH_KEY_OK: return "done";
	case AUTH_KEY_ERR_SYSTEM: return "system error";
	case AUTH_KEY_ERR_INSECURE: return "the key store is accessible to other users";
	case AUTH_KEY_ERR_OWNER_EXISTS: return "an active owner key already exists";
	case AUTH_KEY_ERR_NOT_FOUND: return "no such key";
	case AUTH_KEY_ERR_INVALID_ARG: break;
	}
	return "invalid argument";
}

static void msg_set(struct buf *msg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void msg_set(struct buf *msg, const char *fmt, ...)
{
	va_list ap;

	if (!msg)
		return;
	buf_reset(msg);
	va_start(ap, fmt);
	buf_vaddf(msg, fmt, ap);
	va_end(ap);
}

/* A failed system call: keep errno for the caller, say where in msg. */
static enum auth_key_result sys_fail(struct buf *msg, int err, const char *what, const char *path)
{
	msg_set(msg, "%s %s: %s", what, path, strerror(err));
	errno = err;
	return AUTH_KEY_ERR_SYSTEM;
}

/* ---- permissions ------------------------------------------------------------------- */

static enum auth_key_result insecure(struct buf *msg, const char *path, mode_t mode,
				     const char *fix)
{
	msg_set(msg, "%s has mode %04o: group or others can reach the key store. Fix it with: %s",
		path, (unsigned)(mode & 07777), fix);
	return AUTH_KEY_ERR_INSECURE;
}

enum auth_key_result auth_store_check_perms(const char *olp_home, struct buf *msg)
{
	char keys[4096], path[4096], fix[8300];
	struct dirent *de;
	struct stat sb;
	enum auth_key_result res = AUTH_KEY_OK;
	DIR *d;

	if (stat(olp_home, &sb) < 0)
		return errno == ENOENT ? AUTH_KEY_OK
				       : sys_fail(msg, errno, "cannot stat", olp_home);
	/* Whoever can write OLP_HOME can swap keys/ for a store of their own. */
	if (sb.st_mode & 022) {
		snprintf(fix, sizeof(fix), "chmod go-w '%s'", olp_home);
		return insecure(msg, olp_home, sb.st_mode, fix);
	}
	if (path_join_buf(keys, sizeof(keys), olp_home, "keys"))
		return sys_fail(msg, ENAMETOOLONG, "path too long:", olp_home);
	if (lstat(keys, &sb) < 0)
		return errno == ENOENT ? AUTH_KEY_OK : sys_fail(msg, errno, "cannot stat", keys);
	snprintf(fix, sizeof(fix), "chmod -R go= '%s'", keys);
	if (sb.st_mode & 077)
		return insecure(msg, keys, sb.st_mode, fix);
	d = opendir(keys);
	if (!d)
		return sys_fail(msg, errno, "cannot read", keys);
	while ((de = readdir(d)) && res == AUTH_KEY_OK) {
		char rel[300];

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (path_join_buf(path, sizeof(path), keys, de->d_name) || lstat(path, &sb) < 0)
			continue;
		if (sb.st_mode & 077) {
			res = insecure(msg, path, sb.st_mode, fix);
			break;
		}
		if (!S_ISDIR(sb.st_mode))
			continue;
		snprintf(rel, sizeof(rel), "%s/manifest.json", de->d_name);
		if (fstatat(dirfd(d), rel, &sb, AT_SYMLINK_NOFOLLOW) == 0 && (sb.st_mode & 077)) {
			(void)path_join_buf(path, sizeof(path), keys, rel);
			res = insecure(msg, path, sb.st_mode, fix);
		}
	}
	closedir(d);
	return res;
}

/* ---- create ------------------------------------------------------------------------ */

static bool name_valid(const char *s)
{
	size_t n = strlen(s), i;

	if (!n || n > AUTH_NAME_MAX || !utf8_valid(s, n))
		return false;
	for (i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
			return false;
	return true;
}

static int mkdir_0700(const char *path)
{
	if (mkdir(path, 0700) == 0 || errno == EEXIST)
		return 0;
	return -errno;
}

/* keys/, when missing. Made by root in a home another user owns (sudo olp-keys keygen on a
 * fresh home), it gets OLP_HOME's owner: a root-owned 0700 keys/ is a store in which no
 * worker can read a single key. 0 or -errno. */
static int keys_dir_make(const char *olp_home, const char *keys)
{
	int home_fd, keys_fd, ret;

	if (mkdir(keys, 0700) < 0)
		return errno == EEXIST ? 0 : -errno;
	home_fd = open(olp_home, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (home_fd < 0)
		return -errno;
	keys_fd = open(keys, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	if (keys_fd < 0) {
		ret = -errno;
		goto out_home;
	}
	ret = auth_chown_like(keys_fd, home_fd);
	close(keys_fd);
out_home:
	close(home_fd);
	return ret;
}

/* Whether keys/ holds a valid, unrevoked owner key. */
static int owner_exists(const char *keys_dir, bool *found)
{
	struct auth_key_record rec;
	struct dirent *de;
	const char *why;
	DIR *d;

	*found = false;
	d = opendir(keys_dir);
	if (!d)
		return -errno;
	while (!*found && (de = readdir(d))) {
		if (de->d_name[0] == '.' || !auth_id_valid(de->d_name))
			continue;
		memset(&rec, 0, sizeof(rec));
		if (auth_manifest_load(keys_dir, de->d_name, NULL, &rec, NULL, &why) == 0)
			*found = rec.tier == AUTH_TIER_OWNER && !rec.revoked;
		auth_key_record_release(&rec);
	}
	closedir(d);
	return 0;
}

static json_t *manifest_new(const char *id, const struct auth_key_spec *spec,
			    const unsigned char hash[AUTH_HASH_BYTES], const char *now)
{
	char hex[AUTH_HASH_HEX + 1];
	json_t *m, *prov;
	size_t i;

	auth_hash_to_hex(hash, hex);
	if (spec->providers) {
		prov = json_array();
		for (i = 0; i < spec->n_providers; i++)
			json_array_append_new(prov, json_string(spec->providers[i]));
	} else {
		prov = json_string("*");
	}
	/* Field order as the Node OLP writes them. */
	m = json_pack("{s:i, s:s, s:s, s:s, s:s, s:s, s:o, s:o, s:s, s:n, s:n, s:s?}",
		      "schema_version", 1, "id", id, "name", spec->name, "token_hash", hex,
		      "token_hash_algo", "sha256", "owner_tier", auth_tier_name(spec->tier),
		      "providers_enabled", prov, "quota", auth_quota_to_json(&spec->quota),
		      "created_at", now, "revoked_at", "last_used_at", "notes", spec->notes);
	if (m && !spec->notes)
		json_object_set_new(m, "notes", json_null());
	/* Written only when given: a key without it keeps the Node OLP's exact layout. */
	if (m && spec->n_login_access) {
		json_t *la = json_array();

		for (i = 0; la && i < spec->n_login_access; i++)
			json_array_append_new(la, json_string(spec->login_access[i]));
		if (!la || json_object_set_new(m, "login_access", la) < 0) {
			json_decref(m);
			m = NULL;
		}
	}
	return m;
}

/* Write the manifest into a hidden directory, then rename it to keys/<id>: a worker that
 * scans keys/ sees the key complete or not at all. */
static int key_publish(int keys_fd, const char *id, json_t *m)
{
	char tmp[AUTH_ID_MAX + 32], rnd[9];
	int dfd, ret;

	random_hex(rnd, 4);
	snprintf(tmp, sizeof(tmp), ".new-%s-%s", id, rnd);
	if (mkdirat(keys_fd, tmp, 0700) < 0)
		return -errno;
	dfd = openat(keys_fd, tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	if (dfd < 0) {
		ret = -errno;
		goto out_rmdir;
	}
	/* sudo olp-keys keygen: the new key directory is keys/'s owner's. */
	ret = auth_chown_like(dfd, keys_fd);
	if (!ret)
		ret = auth_manifest_write_at(dfd, m);
	close(dfd);
	if (ret)
		goto out_rmdir;
	/* NOREPLACE: an id collision must never overwrite another key. */
	if (renameat2(keys_fd, tmp, keys_fd, id, RENAME_NOREPLACE) < 0) {
		ret = -errno;
		goto out_rmdir;
	}
	return fsync(keys_fd) < 0 ? -errno : 0;
out_rmdir:
	dfd = openat(keys_fd, tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	if (dfd >= 0) {
		DIR *d = fdopendir(dfd);
		struct dirent *de;

		while (d && (de = readdir(d)))
			if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
				unlinkat(dfd, de->d_name, 0);
		if (d)
			closedir(d);
		else
			close(dfd);
	}
	unlinkat(keys_fd, tmp, AT_REMOVEDIR);
	return ret;
}

/* The spec's fields, checked before anything is written. */
static enum auth_key_result spec_check(const struct auth_key_spec *spec, struct buf *msg)
{
	size_t i;

	if (!spec->name || !name_valid(spec->name)) {
		msg_set(msg, "a key name is 1 to %d bytes of UTF-8 without control characters",
			AUTH_NAME_MAX);
		return AUTH_KEY_ERR_INVALID_ARG;
	}
	if (spec->notes && !utf8_valid(spec->notes, strlen(spec->notes))) {
		msg_set(msg, "a key's notes are UTF-8 text");
		return AUTH_KEY_ERR_INVALID_ARG;
	}
	if (spec->tier != AUTH_TIER_OWNER && spec->tier != AUTH_TIER_GUEST) {
		msg_set(msg, "a key's tier is owner or guest");
		return AUTH_KEY_ERR_INVALID_ARG;
	}
	for (i = 0; spec->providers && i < spec->n_providers; i++) {
		if (!auth_provider_name_valid(spec->providers[i])) {
			msg_set(msg, "invalid provider name \"%s\"", spec->providers[i]);
			return AUTH_KEY_ERR_INVALID_ARG;
		}
	}
	if (!auth_quota_valid(&spec->quota)) {
		msg_set(msg, "a quota limit is a whole number from 1 to 10^15, max_concurrent "
			     "from 1 to 1024 (0: no limit)");
		return AUTH_KEY_ERR_INVALID_ARG;
	}
	if (spec->n_login_access && spec->tier != AUTH_TIER_GUEST) {
		msg_set(msg, "an owner key reaches every provider's login already");
		return AUTH_KEY_ERR_INVALID_ARG;
	}
	for (i = 0; i < spec->n_login_access; i++) {
		if (!auth_provider_name_valid(spec->login_access[i])) {
			msg_set(msg, "invalid provider name \"%s\"", spec->login_access[i]);
			return AUTH_KEY_ERR_INVALID_ARG;
		}
	}
	return AUTH_KEY_OK;
}

/* keys/ under olp_home, made when missing (with keys/'s owner: keys_dir_make), its
 * permissions checked, opened and locked (so that two "keygen --owner" runs cannot both
 * see no owner) into *fd. keys receives its path. */
static enum auth_key_result keys_open_locked(const char *olp_home, char *keys, size_t size, int *fd,
					     struct buf *msg)
{
	enum auth_key_result res;
	int ret;

	if (path_join_buf(keys, size, olp_home, "keys"))
		return sys_fail(msg, ENAMETOOLONG, "path too long:", olp_home);
	ret = mkdir_0700(olp_home);
	if (!ret)
		ret = keys_dir_make(olp_home, keys);
	if (ret)
		return sys_fail(msg, -ret, "cannot create", keys);
	res = auth_store_check_perms(olp_home, msg);
	if (res)
		return res;
	*fd = open(keys, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (*fd < 0)
		return sys_fail(msg, errno, "cannot open", keys);
	while (flock(*fd, LOCK_EX) < 0) {
		if (errno != EINTR) {
			res = sys_fail(msg, errno, "cannot lock", keys);
			close(*fd);
			return res;
		}
	}
	return AUTH_KEY_OK;
}

/* A second active owner only with --force. */
static enum auth_key_result owner_check(const struct auth_key_spec *spec, const char *keys,
					struct buf *msg)
{
	bool owner = false;
	int ret;

	if (spec->tier != AUTH_TIER_OWNER || spec->force)
		return AUTH_KEY_OK;
	ret = owner_exists(keys, &owner);
	if (ret)
		return sys_fail(msg, -ret, "cannot read", keys);
	if (owner) {
		msg_set(msg,
			"an active owner key already exists in %s; pass --force to create another",
			keys);
		return AUTH_KEY_ERR_OWNER_EXISTS;
	}
	return AUTH_KEY_OK;
}

/* A store's failure: the server's message (never a secret: statements carry parameters,
 * and no token reaches one) in msg, errno err. */
static enum auth_key_result db_fail(struct buf *msg, int err, const char *what,
				    const struct buf *why)
{
	msg_set(msg, "%s: %s", what, why && why->len ? why->data : strerror(err));
	errno = err;
	return AUTH_KEY_ERR_SYSTEM;
}

/* Create in a PostgreSQL store: a fresh id until one is free. */
static enum auth_key_result key_create_db(struct store_db *db, const struct auth_key_spec *spec,
					  const unsigned char hash[AUTH_HASH_BYTES],
					  struct auth_new_key *out, struct buf *msg)
{
	char hex[AUTH_HASH_HEX + 1];
	struct buf err = BUF_INIT;
	enum auth_key_result res = AUTH_KEY_OK;
	bool owner = false;
	int ret = -EEXIST;

	auth_hash_to_hex(hash, hex);
	for (int tries = 0; tries < 8 && ret == -EEXIST; tries++) {
		json_t *m;

		auth_id_generate(out->id);
		m = manifest_new(out->id, spec, hash, out->created_at);
		if (!m) {
			res = sys_fail(msg, ENOMEM, "cannot build", "the manifest");
			goto out;
		}
		ret = auth_pg_key_insert(db, out->id, hex, m,
					 spec->tier == AUTH_TIER_OWNER && !spec->force, &owner,
					 &err);
		json_decref(m);
	}
	if (owner) {
		msg_set(msg, "an active owner key already exists in the store; pass --force to "
			     "create another");
		res = AUTH_KEY_ERR_OWNER_EXISTS;
	} else if (ret) {
		res = db_fail(msg, -ret, "cannot write a key to the store", &err);
	}
out:
	buf_release(&err);
	return res;
}

enum auth_key_result auth_key_create(const char *olp_home, const struct auth_key_spec *spec,
				     struct auth_new_key *out, struct buf *msg)
{
	return auth_key_create_at(AUTH_TARGET_FILES(olp_home), spec, out, msg);
}

enum auth_key_result auth_key_create_at(const struct auth_target *t,
					const struct auth_key_spec *spec, struct auth_new_key *out,
					struct buf *msg)
{
	unsigned char hash[AUTH_HASH_BYTES];
	char keys[4096];
	enum auth_key_result res;
	json_t *m = NULL;
	int keys_fd, ret = 0, tries;

	memset(out, 0, sizeof(*out));
	if (auth_crypto_init())
		return sys_fail(msg, ENOSYS, "cannot start", "libsodium");
	res = spec_check(spec, msg);
	if (!res && t->db) {
		auth_iso_time_now(out->created_at);
		auth_token_generate(out->token);
		auth_hash_token(out->token, AUTH_TOKEN_LEN, hash);
		res = key_create_db(t->db, spec, hash, out, msg);
		sodium_memzero(hash, sizeof(hash));
		if (res)
			auth_new_key_wipe(out);
		return res;
	}
	if (!res)
		res = keys_open_locked(t->olp_home, keys, sizeof(keys), &keys_fd, msg);
	if (res)
		return res;
	res = owner_check(spec, keys, msg);
	if (res)
		goto out_close;
	auth_iso_time_now(out->created_at);
	auth_token_generate(out->token);
	auth_hash_token(out->token, AUTH_TOKEN_LEN, hash);
	for (tries = 0; tries < 8; tries++) {
		auth_id_generate(out->id);
		m = manifest_new(out->id, spec, hash, out->created_at);
		if (!m) {
			res = sys_fail(msg, ENOMEM, "cannot build", "the manifest");
			goto out_close;
		}
		ret = key_publish(keys_fd, out->id, m);
		json_decref(m);
		if (ret != -EEXIST && ret != -ENOTEMPTY)
			break;
	}
	if (ret)
		res = sys_fail(msg, -ret, "cannot write a key under", keys);
out_close:
	close(keys_fd);
	sodium_memzero(hash, sizeof(hash));
	if (res)
		auth_new_key_wipe(out);
	return res;
}

void auth_new_key_wipe(struct auth_new_key *k)
{
	sodium_memzero(k, sizeof(*k));
}

/* ---- revoke ------------------------------------------------------------------------ */

struct revoke_arg {
	char when[AUTH_ISO_MAX];
	bool was_revoked;
};

static int revoke_edit(json_t *root, const struct auth_key_record *rec, void *arg)
{
	struct revoke_arg *ra = arg;

	if (rec->revoked) {
		ra->was_revoked = true;
		return 0;
	}
	return json_object_set_new(root, "revoked_at", json_string(ra->when)) < 0 ? -ENOMEM : 1;
}

/* Edit key id's manifest under its lock (auth_manifest_update), for revoke and set-quota:
 * the id checked, the store's permissions checked, a missing or invalid manifest
 * AUTH_KEY_ERR_NOT_FOUND; what names the edit in a system error's message. */
static enum auth_key_result key_edit_db(struct store_db *db, const char *id,
					int (*edit)(json_t *, const struct auth_key_record *,
						    void *),
					void *arg, const char *what, struct buf *msg)
{
	struct buf err = BUF_INIT;
	enum auth_key_result res = AUTH_KEY_OK;
	int ret = auth_pg_key_update(db, id, edit, arg, &err);

	if (ret == -ENOENT || ret == -EINVAL) {
		msg_set(msg, "no key %s in the store%s", id,
			ret == -EINVAL ? " (its manifest is invalid)" : "");
		res = AUTH_KEY_ERR_NOT_FOUND;
	} else if (ret < 0) {
		msg_set(msg, "%s %s: %s", what, id, err.len ? err.data : strerror(-ret));
		errno = -ret;
		res = AUTH_KEY_ERR_SYSTEM;
	}
	buf_release(&err);
	return res;
}

static enum auth_key_result key_edit(const struct auth_target *t, const char *id,
				     int (*edit)(json_t *, const struct auth_key_record *, void *),
				     void *arg, const char *what, struct buf *msg)
{
	const char *olp_home = t->olp_home;
	char keys[4096];
	enum auth_key_result res;
	int ret;

	if (!id || !auth_id_valid(id)) {
		msg_set(msg, "\"%s\" is not a key id", id ? id : "");
		return AUTH_KEY_ERR_INVALID_ARG;
	}
	if (t->db)
		return key_edit_db(t->db, id, edit, arg, what, msg);
	res = auth_store_check_perms(olp_home, msg);
	if (res)
		return res;
	if (path_join_buf(keys, sizeof(keys), olp_home, "keys"))
		return sys_fail(msg, ENAMETOOLONG, "path too long:", olp_home);
	ret = auth_manifest_update(keys, id, edit, arg);
	if (ret == -ENOENT || ret == -EINVAL) {
		msg_set(msg, "no key %s in %s%s", id, keys,
			ret == -EINVAL ? " (its manifest is invalid)" : "");
		return AUTH_KEY_ERR_NOT_FOUND;
	}
	if (ret < 0)
		return sys_fail(msg, -ret, what, id);
	return AUTH_KEY_OK;
}

enum auth_key_result auth_key_revoke(const char *olp_home, const char *id, bool *was_revoked,
				     struct buf *msg)
{
	return auth_key_revoke_at(AUTH_TARGET_FILES(olp_home), id, was_revoked, msg);
}

enum auth_key_result auth_key_revoke_at(const struct auth_target *t, const char *id,
					bool *was_revoked, struct buf *msg)
{
	struct revoke_arg ra = { .was_revoked = false };
	enum auth_key_result res;

	auth_iso_time_now(ra.when);
	res = key_edit(t, id, revoke_edit, &ra, "cannot revoke key", msg);
	if (res == AUTH_KEY_OK && was_revoked)
		*was_revoked = ra.was_revoked;
	return res;
}

/* ---- quota ------------------------------------------------------------------------- */

struct quota_arg {
	const struct auth_quota *q;
	unsigned fields;
	struct auth_quota result;
};

static int quota_edit(json_t *root, const struct auth_key_record *rec, void *arg)
{
	struct quota_arg *qa = arg;
	json_t *v;

	qa->result = rec->quota;
	if (qa->fields & AUTH_QUOTA_RPM)
		qa->result.requests_per_minute = qa->q->requests_per_minute;
	if (qa->fields & AUTH_QUOTA_RPD)
		qa->result.requests_per_day = qa->q->requests_per_day;
	if (qa->fields & AUTH_QUOTA_TPD)
		qa->result.tokens_per_day = qa->q->tokens_per_day;
	if (qa->fields & AUTH_QUOTA_CONC)
		qa->result.max_concurrent = qa->q->max_concurrent;
	if (memcmp(&qa->result, &rec->quota, sizeof(qa->result)) == 0 &&
	    json_object_get(root, "quota"))
		return 0; /* nothing changes: leave the file (and the workers' caches) alone */
	v = auth_quota_to_json(&qa->result);
	if (!v)
		return -ENOMEM;
	return json_object_set_new(root, "quota", v) < 0 ? -ENOMEM : 1;
}

enum auth_key_result auth_key_set_quota(const char *olp_home, const char *id,
					const struct auth_quota *q, unsigned fields,
					struct auth_quota *result, struct buf *msg)
{
	return auth_key_set_quota_at(AUTH_TARGET_FILES(olp_home), id, q, fields, result, msg);
}

enum auth_key_result auth_key_set_quota_at(const struct auth_target *t, const char *id,
					   const struct auth_quota *q, unsigned fields,
					   struct auth_quota *result, struct buf *msg)
{
	struct quota_arg qa = { .q = q, .fields = fields & AUTH_QUOTA_ALL };
	enum auth_key_result res;

	if (!q || !auth_quota_valid(q)) {
		msg_set(msg, "a quota limit is a whole number from 1 to 10^15, max_concurrent "
			     "from 1 to 1024 (0: no limit)");
		return AUTH_KEY_ERR_INVALID_ARG;
	}
	res = key_edit(t, id, quota_edit, &qa, "cannot set the quota of key", msg);
	if (res == AUTH_KEY_OK && result)
		*result = qa.result;
	return res;
}

/* ---- login access (ADR 0025) ---------------------------------------------------------- */

struct login_arg {
	const char *const *providers;
	size_t n;
	bool allow, clear;
	struct strv result;
	bool owner; /* the key is an owner's: refused */
};

static int login_edit(json_t *root, const struct auth_key_record *rec, void *arg)
{
	struct login_arg *la = arg;
	json_t *v;

	strv_release(&la->result);
	if (rec->tier != AUTH_TIER_GUEST) {
		la->owner = true;
		return 0;
	}
	/* What it had (unless cleared), less what is taken back, then what is allowed. */
	for (size_t i = 0; !la->clear && i < rec->login_access.n; i++) {
		const char *p = rec->login_access.v[i];
		bool taken = false;

		for (size_t j = 0; !la->allow && j < la->n; j++)
			taken |= strcmp(p, la->providers[j]) == 0;
		if (!taken && strv_find(&la->result, p) < 0)
			strv_push(&la->result, p);
	}
	for (size_t i = 0; la->allow && i < la->n; i++)
		if (strv_find(&la->result, la->providers[i]) < 0)
			strv_push(&la->result, la->providers[i]);
	if (!la->result.n)
		return json_object_del(root, "login_access") == 0 ? 1 : 0;
	v = json_array();
	for (size_t i = 0; v && i < la->result.n; i++)
		json_array_append_new(v, json_string(la->result.v[i]));
	if (!v)
		return -ENOMEM;
	return json_object_set_new(root, "login_access", v) < 0 ? -ENOMEM : 1;
}

enum auth_key_result auth_key_set_login(const char *olp_home, const char *id,
					const char *const *providers, size_t n, bool allow,
					bool clear, char ***result, size_t *n_result,
					struct buf *msg)
{
	return auth_key_set_login_at(AUTH_TARGET_FILES(olp_home), id, providers, n, allow, clear,
				     result, n_result, msg);
}

enum auth_key_result auth_key_set_login_at(const struct auth_target *t, const char *id,
					   const char *const *providers, size_t n, bool allow,
					   bool clear, char ***result, size_t *n_result,
					   struct buf *msg)
{
	struct login_arg la = {
		.providers = providers, .n = n, .allow = allow, .clear = clear, .result = STRV_INIT
	};
	enum auth_key_result res;

	if (result) {
		*result = NULL;
		*n_result = 0;
	}
	for (size_t i = 0; i < n; i++) {
		if (!auth_provider_name_valid(providers[i])) {
			msg_set(msg, "invalid provider name \"%s\"", providers[i]);
			return AUTH_KEY_ERR_INVALID_ARG;
		}
	}
	res = key_edit(t, id, login_edit, &la, "cannot set the login access of key", msg);
	if (res == AUTH_KEY_OK && la.owner) {
		msg_set(msg, "key %s is an owner key: it reaches every provider's login already",
			id);
		res = AUTH_KEY_ERR_INVALID_ARG;
	}
	if (res == AUTH_KEY_OK && result)
		*result = strv_detach(&la.result, n_result);
	strv_release(&la.result);
	return res;
}

/* ---- list -------------------------------------------------------------------------- */

static char *dup_str_or_null(json_t *v)
{
	return json_is_string(v) ? xstrdup(json_string_value(v)) : NULL;
}

static int cmp_info(const void *a, const void *b)
{
	const struct auth_key_info *x = a, *y = b;

	return auth_created_cmp(x->created_at, x->id, y->created_at, y->id);
}

static void key_info_release(struct auth_key_info *k)
{
	size_t i;

	free(k->name);
	for (i = 0; i < k->n_providers; i++)
		free(k->providers[i]);
	free(k->providers);
	free(k->created_at);
	free(k->revoked_at);
	free(k->last_used_at);
	free(k->notes);
	auth_strings_free(k->login_access, k->n_login_access);
}

void auth_key_list_release(struct auth_key_list *l)
{
	size_t i;

	for (i = 0; i < l->n; i++)
		key_info_release(&l->keys[i]);
	free(l->keys);
	memset(l, 0, sizeof(*l));
}

/* Append the key of a valid manifest (root, rec: taken) to out. */
static void list_add(struct auth_key_list *out, size_t *cap, json_t *root,
		     struct auth_key_record *rec)
{
	struct auth_key_info *k;

	if (out->n == *cap) {
		*cap = *cap ? 2 * *cap : 16;
		out->keys = xreallocarray(out->keys, *cap, sizeof(*out->keys));
	}
	k = &out->keys[out->n++];
	memset(k, 0, sizeof(*k));
	snprintf(k->id, sizeof(k->id), "%s", rec->id);
	k->name = dup_str_or_null(json_object_get(root, "name"));
	k->tier = rec->tier;
	k->revoked = rec->revoked;
	k->all_providers = rec->all_providers;
	k->providers = strv_detach(&rec->providers, &k->n_providers);
	k->created_at = dup_str_or_null(json_object_get(root, "created_at"));
	k->revoked_at = dup_str_or_null(json_object_get(root, "revoked_at"));
	k->last_used_at = dup_str_or_null(json_object_get(root, "last_used_at"));
	k->notes = dup_str_or_null(json_object_get(root, "notes"));
	k->quota = rec->quota;
	k->login_access = strv_detach(&rec->login_access, &k->n_login_access);
	json_decref(root);
	auth_key_record_release(rec);
}

struct list_db_arg {
	struct auth_key_list *out;
	size_t cap;
};

static int list_row(void *arg, json_t *root, struct auth_key_record *rec)
{
	struct list_db_arg *a = arg;

	list_add(a->out, &a->cap, root, rec);
	return 0;
}

enum auth_key_result auth_key_list(const char *olp_home, struct auth_key_list *out, struct buf *msg)
{
	return auth_key_list_at(AUTH_TARGET_FILES(olp_home), out, msg);
}

enum auth_key_result auth_key_list_at(const struct auth_target *t, struct auth_key_list *out,
				      struct buf *msg)
{
	const char *olp_home = t->olp_home;
	char keys[4096];
	enum auth_key_result res;
	struct dirent *de;
	size_t cap = 0;
	DIR *d;

	memset(out, 0, sizeof(*out));
	if (t->db) {
		struct list_db_arg a = { .out = out };
		int ret = auth_pg_each(t->db, list_row, &a, &out->n_skipped);

		if (ret) {
			auth_key_list_release(out);
			return db_fail(msg, -ret, "cannot read the keys of the store", NULL);
		}
		goto out_sort;
	}
	res = auth_store_check_perms(olp_home, msg);
	if (res)
		return res;
	if (path_join_buf(keys, sizeof(keys), olp_home, "keys"))
		return sys_fail(msg, ENAMETOOLONG, "path too long:", olp_home);
	d = opendir(keys);
	if (!d)
		return errno == ENOENT ? AUTH_KEY_OK : sys_fail(msg, errno, "cannot read", keys);
	while ((de = readdir(d))) {
		struct auth_key_record rec = { 0 };
		json_t *root = NULL;
		const char *why = NULL;
		int ret;

		if (de->d_name[0] == '.')
			continue;
		ret = auth_id_valid(de->d_name)
			      ? auth_manifest_load(keys, de->d_name, &root, &rec, NULL, &why)
			      : -ENOENT;
		if (ret) {
			if (ret != -ENOENT) {
				log_warnx(NULL, "skipping key manifest %s/%s/manifest.json: %s",
					  keys, de->d_name, why ? why : strerror(-ret));
				out->n_skipped++;
			}
			continue;
		}
		list_add(out, &cap, root, &rec);
	}
	closedir(d);
out_sort:
	if (out->n)
		qsort(out->keys, out->n, sizeof(*out->keys), cmp_info);
	return AUTH_KEY_OK;
}
