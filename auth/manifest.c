/* One key's manifest.json: validation, atomic rewrite, and the locked read-modify-write
 * that keeps a revocation from being undone by a concurrent last_used_at update. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "auth/internal.h"
#include "common/banned.h"

void auth_key_record_release(struct auth_key_record *r)
{
	strv_release(&r->providers);
	strv_release(&r->login_access);
	strv_release(&r->accounts);
	free(r->name);
	free(r->created_at);
	r->name = r->created_at = NULL;
}

void auth_key_record_copy(struct auth_key_record *dst, const struct auth_key_record *src)
{
	size_t i;

	*dst = *src;
	strv_init(&dst->providers);
	strv_init(&dst->login_access);
	for (i = 0; i < src->providers.n; i++)
		strv_push(&dst->providers, src->providers.v[i]);
	for (i = 0; i < src->login_access.n; i++)
		strv_push(&dst->login_access, src->login_access.v[i]);
	strv_init(&dst->accounts);
	for (i = 0; i < src->accounts.n; i++)
		strv_push(&dst->accounts, src->accounts.v[i]);
	dst->name = src->name ? xstrdup(src->name) : NULL;
	dst->created_at = src->created_at ? xstrdup(src->created_at) : NULL;
}

bool auth_provider_name_valid(const char *s)
{
	size_t i;

	for (i = 0; s[i]; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
		      (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-' || s[i] == '.'))
			return false;
	return i > 0 && i < AUTH_PROVIDER_MAX;
}

bool auth_account_name_valid(const char *s)
{
	size_t i;

	for (i = 0; s[i]; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' ||
		      s[i] == '-'))
			return false;
	return i > 0 && i < AUTH_ACCOUNT_MAX;
}

int auth_binding_split(const char *binding, char provider[AUTH_PROVIDER_MAX],
		       char account[AUTH_ACCOUNT_MAX])
{
	const char *eq = strchr(binding, '=');
	size_t pl = eq ? (size_t)(eq - binding) : 0;

	if (!eq || pl >= AUTH_PROVIDER_MAX || strlen(eq + 1) >= AUTH_ACCOUNT_MAX)
		return -EINVAL;
	memcpy(provider, binding, pl);
	provider[pl] = '\0';
	snprintf(account, AUTH_ACCOUNT_MAX, "%s", eq + 1);
	return auth_provider_name_valid(provider) && auth_account_name_valid(account) ? 0 : -EINVAL;
}

void auth_file_sig_from_stat(struct auth_file_sig *s, const struct stat *sb)
{
	memset(s, 0, sizeof(*s));
	s->dev = sb->st_dev;
	s->ino = sb->st_ino;
	s->size = sb->st_size;
	s->nlink = sb->st_nlink;
	s->mtime = sb->st_mtim;
	s->ctime = sb->st_ctim;
}

bool auth_file_sig_equal(const struct auth_file_sig *a, const struct auth_file_sig *b)
{
	return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->nlink == b->nlink &&
	       a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec &&
	       a->ctime.tv_sec == b->ctime.tv_sec && a->ctime.tv_nsec == b->ctime.tv_nsec;
}

void auth_iso_time_now(char out[AUTH_ISO_MAX])
{
	_Static_assert(AUTH_ISO_MAX >= WALL_ISO_MAX, "an ISO time fits");
	wall_iso_now(out);
}

/* providers_enabled: "*" or an array of non-empty strings. */
static int parse_providers(json_t *v, struct auth_key_record *rec, const char **why)
{
	size_t i, n;

	if (json_is_string(v) && strcmp(json_string_value(v), "*") == 0) {
		rec->all_providers = true;
		return 0;
	}
	if (!json_is_array(v)) {
		*why = "providers_enabled is neither \"*\" nor an array";
		return -EINVAL;
	}
	n = json_array_size(v);
	for (i = 0; i < n; i++) {
		json_t *p = json_array_get(v, i);

		if (!json_is_string(p) || !json_string_length(p)) {
			*why = "providers_enabled holds something other than a provider name";
			return -EINVAL;
		}
	}
	rec->all_providers = false;
	for (i = 0; i < n; i++)
		strv_push(&rec->providers, json_string_value(json_array_get(v, i)));
	return 0;
}

/* "login_access" (this edition's, ADR 0025): absent or null (none), or an array of
 * provider names. Strict: a value that does not parse makes the manifest invalid, so the
 * key is refused rather than given a login nobody meant it to have. The Node OLP keeps
 * fields it does not know, so such a manifest still works there. */
static int parse_login_access(json_t *v, struct auth_key_record *rec, const char **why)
{
	json_t *p;
	size_t i;

	if (!v || json_is_null(v))
		return 0;
	if (!json_is_array(v)) {
		*why = "login_access is neither null nor an array";
		return -EINVAL;
	}
	json_array_foreach(v, i, p) {
		if (!json_is_string(p) || strlen(json_string_value(p)) != json_string_length(p) ||
		    !auth_provider_name_valid(json_string_value(p))) {
			*why = "login_access holds something other than a provider name";
			return -EINVAL;
		}
	}
	json_array_foreach(v, i, p) {
		strv_push(&rec->login_access, json_string_value(p));
	}
	return 0;
}

/* "accounts" (ADR 0037): absent or null (none), or an object of provider names to
 * account names. Strict, as login_access: a key bound to an account nobody can read is
 * refused, never given another account. */
static int parse_accounts(json_t *v, struct auth_key_record *rec, const char **why)
{
	char p[AUTH_PROVIDER_MAX], a[AUTH_ACCOUNT_MAX], pair[AUTH_BINDING_MAX + 1];
	const char *name;
	json_t *acc;

	if (!v || json_is_null(v))
		return 0;
	if (!json_is_object(v)) {
		*why = "accounts is neither null nor an object";
		return -EINVAL;
	}
	json_object_foreach(v, name, acc) {
		const char *an = json_string_value(acc);

		if (!an || strlen(an) != json_string_length(acc) ||
		    (size_t)snprintf(pair, sizeof(pair), "%s=%s", name, an) >= sizeof(pair) ||
		    auth_binding_split(pair, p, a) || strcmp(p, name)) {
			*why = "accounts holds something other than provider and account names";
			strv_release(&rec->accounts);
			return -EINVAL;
		}
		strv_push(&rec->accounts, pair);
	}
	return 0;
}

static const struct {
	const char *name;
	size_t off;
	int64_t max;
	const char *bad; /* why a manifest with a bad value is refused */
} quota_fields[] = {
	{ "requests_per_minute", offsetof(struct auth_quota, requests_per_minute), AUTH_QUOTA_MAX,
	  "a quota limit is not a positive integer (at most 10^15)" },
	{ "requests_per_day", offsetof(struct auth_quota, requests_per_day), AUTH_QUOTA_MAX,
	  "a quota limit is not a positive integer (at most 10^15)" },
	{ "tokens_per_day", offsetof(struct auth_quota, tokens_per_day), AUTH_QUOTA_MAX,
	  "a quota limit is not a positive integer (at most 10^15)" },
	{ "max_concurrent", offsetof(struct auth_quota, max_concurrent), AUTH_QUOTA_CONCURRENT_MAX,
	  "quota max_concurrent is not an integer from 1 to 1024" },
};

bool auth_quota_valid(const struct auth_quota *q)
{
	for (size_t i = 0; i < ARRAY_SIZE(quota_fields); i++) {
		int64_t v = *(const int64_t *)((const char *)q + quota_fields[i].off);

		if (v < 0 || v > quota_fields[i].max)
			return false;
	}
	return true;
}

json_t *auth_quota_to_json(const struct auth_quota *q)
{
	json_t *o;

	if (auth_quota_none(q))
		return json_null();
	o = json_object();
	for (size_t i = 0; o && i < ARRAY_SIZE(quota_fields); i++) {
		int64_t v = *(const int64_t *)((const char *)q + quota_fields[i].off);

		if (v && json_object_set_new(o, quota_fields[i].name, json_integer(v)) < 0) {
			json_decref(o);
			o = NULL;
		}
	}
	return o;
}

/* "quota": absent or null (none), or an object of known limits, each null or an integer
 * in 1..AUTH_QUOTA_MAX. Strict, because a limit that does not parse must not become no
 * limit. */
static int parse_quota(json_t *v, struct auth_quota *q, const char **why)
{
	const char *k;
	json_t *f;

	memset(q, 0, sizeof(*q));
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_object(v)) {
		*why = "quota is neither null nor an object";
		return -EINVAL;
	}
	json_object_foreach(v, k, f) {
		size_t i;

		for (i = 0; i < ARRAY_SIZE(quota_fields); i++)
			if (strcmp(k, quota_fields[i].name) == 0)
				break;
		if (i == ARRAY_SIZE(quota_fields)) {
			*why = "quota holds an unknown limit";
			return -EINVAL;
		}
		if (json_is_null(f))
			continue;
		if (parse_json_int(f, 1, quota_fields[i].max,
				   (int64_t *)((char *)q + quota_fields[i].off))) {
			*why = quota_fields[i].bad;
			return -EINVAL;
		}
	}
	return 0;
}

/* Validate a manifest already parsed as root, found in directory dir_id. Fills rec (may be
 * NULL) and returns 0, or -EINVAL with *why set to a static reason for the log. */
/* What the key may use: providers_enabled, quota, login_access, accounts. */
static int parse_grants(json_t *root, struct auth_key_record *rec, const char **why)
{
	int ret = parse_providers(json_object_get(root, "providers_enabled"), rec, why);

	if (!ret)
		ret = parse_quota(json_object_get(root, "quota"), &rec->quota, why);
	if (!ret)
		ret = parse_login_access(json_object_get(root, "login_access"), rec, why);
	if (!ret)
		ret = parse_accounts(json_object_get(root, "accounts"), rec, why);
	return ret;
}

static int manifest_check(json_t *root, const char *dir_id, struct auth_key_record *rec,
			  const char **why)
{
	struct auth_key_record tmp = { 0 };
	json_t *v;
	const char *s;
	int ret = -EINVAL;

	if (!json_is_object(root)) {
		*why = "not a JSON object";
		goto out_release_tmp;
	}
	v = json_object_get(root, "schema_version");
	if (!json_is_integer(v) || json_integer_value(v) != 1) {
		*why = "schema_version is not 1";
		goto out_release_tmp;
	}
	v = json_object_get(root, "id");
	if (!json_is_string(v) || strcmp(json_string_value(v), dir_id) != 0 ||
	    !auth_id_valid(dir_id)) {
		*why = "id does not match its directory";
		goto out_release_tmp;
	}
	snprintf(tmp.id, sizeof(tmp.id), "%s", dir_id);
	/* Absent means sha256, the only algorithm the Node OLP ever wrote. */
	v = json_object_get(root, "token_hash_algo");
	if (v && !(json_is_string(v) && strcmp(json_string_value(v), "sha256") == 0)) {
		*why = "token_hash_algo is not sha256";
		goto out_release_tmp;
	}
	v = json_object_get(root, "token_hash");
	if (!json_is_string(v) || auth_hash_from_hex(json_string_value(v), tmp.hash) != 0) {
		*why = "token_hash is not 64 hex digits";
		goto out_release_tmp;
	}
	v = json_object_get(root, "owner_tier");
	s = json_is_string(v) ? json_string_value(v) : "";
	if (strcmp(s, "owner") == 0) {
		tmp.tier = AUTH_TIER_OWNER;
	} else if (strcmp(s, "guest") == 0) {
		tmp.tier = AUTH_TIER_GUEST;
	} else {
		*why = "owner_tier is neither \"owner\" nor \"guest\"";
		goto out_release_tmp;
	}
	/* Fail closed: anything but null (or absent) in revoked_at means revoked. */
	v = json_object_get(root, "revoked_at");
	tmp.revoked = v && !json_is_null(v);
	v = json_object_get(root, "name");
	if (v && !json_is_string(v) && !json_is_null(v)) {
		*why = "name is not a string";
		goto out_release_tmp;
	}
	if (json_is_string(v))
		tmp.name = xstrdup(json_string_value(v));
	v = json_object_get(root, "created_at");
	if (json_is_string(v))
		tmp.created_at = xstrdup(json_string_value(v));
	ret = parse_grants(root, &tmp, why);
	if (ret)
		goto out_release_tmp;
	if (rec) {
		*rec = tmp;
		strv_init(&tmp.providers); /* moved to rec */
		strv_init(&tmp.login_access);
		strv_init(&tmp.accounts);
		tmp.name = tmp.created_at = NULL;
	}
out_release_tmp:
	auth_key_record_release(&tmp);
	return ret;
}

/* Read all of fd (at most AUTH_MANIFEST_MAX bytes) into b. */
static int read_fd(int fd, struct buf *b)
{
	ssize_t n;

	for (;;) {
		if (b->len > (size_t)AUTH_MANIFEST_MAX)
			return -EFBIG;
		n = buf_read_once(b, fd, 4096);
		if (n < 0)
			return (int)n;
		if (n == 0)
			return 0;
	}
}

/* Read and validate dirfd/manifest.json, the manifest of key dir_id. */
static int manifest_load_at(int dirfd, const char *dir_id, json_t **root_out,
			    struct auth_key_record *rec, struct auth_file_sig *sig,
			    const char **why)
{
	struct buf text = BUF_INIT;
	struct stat sb;
	json_error_t jerr;
	json_t *root = NULL;
	int fd, ret;

	*why = NULL;
	fd = openat(dirfd, "manifest.json", O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &sb) < 0) {
		ret = -errno;
		goto out_close;
	}
	if (!S_ISREG(sb.st_mode)) {
		*why = "manifest.json is not a regular file";
		ret = -EINVAL;
		goto out_close;
	}
	if (sig)
		auth_file_sig_from_stat(sig, &sb);
	ret = read_fd(fd, &text);
	if (ret == -EFBIG) {
		*why = "manifest.json is too large";
		ret = -EINVAL;
	}
	if (ret)
		goto out_close;
	root = json_loadb(text.data, text.len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		*why = "not valid JSON";
		ret = -EINVAL;
		goto out_close;
	}
	ret = manifest_check(root, dir_id, rec, why);
	if (ret == 0 && root_out)
		*root_out = steal_pointer(&root);
out_close:
	json_decref(root);
	close(fd);
	buf_release(&text);
	return ret;
}

int auth_manifest_parse(const char *text, size_t len, const char *id, json_t **root_out,
			struct auth_key_record *rec, const char **why)
{
	json_error_t jerr;
	json_t *root;
	int ret;

	*why = NULL;
	if (len > (size_t)AUTH_MANIFEST_MAX) {
		*why = "the manifest is too large";
		return -EINVAL;
	}
	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		*why = "not valid JSON";
		return -EINVAL;
	}
	ret = manifest_check(root, id, rec, why);
	if (ret == 0 && root_out)
		*root_out = steal_pointer(&root);
	json_decref(root);
	return ret;
}

static int open_key_dir(const char *keys_dir, const char *id)
{
	char path[4096];
	int fd;

	if (!auth_id_valid(id))
		return -ENOENT;
	if (path_join_buf(path, sizeof(path), keys_dir, id))
		return -ENAMETOOLONG;
	fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	return fd < 0 ? -errno : fd;
}

int auth_manifest_load(const char *keys_dir, const char *id, json_t **root,
		       struct auth_key_record *rec, struct auth_file_sig *sig, const char **why)
{
	int dirfd, ret;

	*why = NULL;
	dirfd = open_key_dir(keys_dir, id);
	if (dirfd < 0)
		return dirfd == -ENOTDIR || dirfd == -ELOOP ? -ENOENT : dirfd;
	ret = manifest_load_at(dirfd, id, root, rec, sig, why);
	close(dirfd);
	return ret;
}

/* Root editing a store it does not own (sudo olp-keys keygen, set-quota, revoke) must leave
 * what it writes readable by the workers that own the store: a root-owned 0600 manifest or
 * 0700 key directory would be a key no worker can read. So fd gets like_fd's owner. */
int auth_chown_like(int fd, int like_fd)
{
	struct stat sb;

	if (geteuid() != 0)
		return 0;
	if (fstat(like_fd, &sb) < 0)
		return -errno;
	if (sb.st_uid == 0 && sb.st_gid == 0)
		return 0;
	return fchown(fd, sb.st_uid, sb.st_gid) < 0 ? -errno : 0;
}

int auth_manifest_write_at(int dirfd, json_t *root)
{
	char tmp[64], rnd[9];
	char *text;
	int fd, ret;

	/* Node writes JSON.stringify(m, null, 2) plus a newline; so do we. */
	text = json_dumps(root, JSON_INDENT(2));
	if (!text)
		return -ENOMEM;
	random_hex(rnd, 4);
	snprintf(tmp, sizeof(tmp), ".manifest.json.%ld.%s.tmp", (long)getpid(), rnd);
	fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0) {
		ret = -errno;
		goto out_free;
	}
	ret = auth_chown_like(fd, dirfd); /* the manifest: its key directory's owner */
	if (!ret)
		ret = write_all(fd, text, strlen(text));
	if (!ret)
		ret = write_all(fd, "\n", 1);
	/* fsync before rename: otherwise a crash can leave a renamed but empty manifest. */
	if (!ret && fsync(fd) < 0)
		ret = -errno;
	if (close(fd) < 0 && !ret)
		ret = -errno;
	if (!ret && renameat(dirfd, tmp, dirfd, "manifest.json") < 0)
		ret = -errno;
	if (ret) {
		unlinkat(dirfd, tmp, 0);
		goto out_free;
	}
	/* The rename is durable only once the directory itself is synced. */
	if (fsync(dirfd) < 0)
		ret = -errno;
out_free:
	free(text);
	return ret;
}

int auth_manifest_update(const char *keys_dir, const char *id,
			 int (*edit)(json_t *root, const struct auth_key_record *rec, void *arg),
			 void *arg)
{
	struct auth_key_record rec = { 0 };
	json_t *root = NULL;
	const char *why;
	int dirfd, ret;

	dirfd = open_key_dir(keys_dir, id);
	if (dirfd < 0)
		return dirfd == -ENOTDIR || dirfd == -ELOOP ? -ENOENT : dirfd;
	/* The lock is on the directory, not on manifest.json: the file is replaced by every
	 * write, the directory stays, and no extra lock file appears in the Node layout. */
	while (flock(dirfd, LOCK_EX) < 0) {
		if (errno != EINTR) {
			ret = -errno;
			goto out_close;
		}
	}
	ret = manifest_load_at(dirfd, id, &root, &rec, NULL, &why);
	if (ret)
		goto out_close; /* closing the fd drops the lock */
	ret = edit(root, &rec, arg);
	if (ret == 1) {
		int w = auth_manifest_write_at(dirfd, root);

		if (w)
			ret = w;
	}
out_close:
	json_decref(root);
	auth_key_record_release(&rec);
	close(dirfd);
	return ret;
}
