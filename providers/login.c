/* Logins held by the worker (ADR 0036): "login": "held".
 *
 * A subscription login (claude's ~/.claude/.credentials.json or the long-lived token of
 * `claude setup-token`; codex's ~/.codex/auth.json of a ChatGPT login) copied into a run
 * can be read by the run: a prompt that makes the CLI print its files hands the login to
 * whoever sent it. Held, the run gets instead a file of the CLI's own format whose
 * secrets are placeholders and whose expiry lies a year ahead (the CLI then neither
 * refreshes it nor complains), and the run goes out through the worker's forwarder in
 * upstream mode, which replaces the placeholder's Authorization (and codex's
 * chatgpt-account-id) with the real values on the way out, and masks them in what the
 * upstream answers (egress: set_headers). The worker keeps the login fresh (refresh.c).
 *
 * The facts of each CLI's format were read from the CLIs pinned in tests/provider-clis
 * and checked by running them against fake endpoints (docs/accounts.md, "Logins held by
 * the worker"). Nothing here logs a token or quotes a login file. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "providers/cli.h"
#include "common/banned.h"

/* A placeholder's expiry: far enough that no CLI refreshes it during a run's life. */
#define PLACEHOLDER_LIFE_MS ((int64_t)365 * 24 * 3600 * 1000)
/* Rewrite a placeholder file this often (codex counts its age from last_refresh). */
#define PLACEHOLDER_MAX_AGE_S ((time_t)12 * 3600)
#define HELD_MAX_FILE ((size_t)64 * 1024)

static char *held_dir;

int prov_login_set_dir(const char *state_dir)
{
	char *d = path_join(state_dir, "held");

	if (mkdir(d, 0700) < 0 && errno != EEXIST) {
		int e = errno;

		free(d);
		errno = e;
		return -e;
	}
	free(held_dir);
	held_dir = d;
	return 0;
}

static int held_file(const struct prov_provider *pv, const char *suffix, char *path)
{
	int n;

	if (!held_dir)
		return -ENOENT;
	/* Provider names are checked at registry load to be plain file name parts. */
	if (pv->account) /* an account's own (accounts.c): names are plain too */
		n = snprintf(path, PATH_MAX, "%s/%s@%s.%s", held_dir, pv->name, pv->account,
			     suffix);
	else
		n = snprintf(path, PATH_MAX, "%s/%s.%s", held_dir, pv->name, suffix);
	return n > 0 && n < PATH_MAX ? 0 : -ENAMETOOLONG;
}

int prov_login_state_path(const struct prov_provider *pv, char *path)
{
	return held_file(pv, "state", path);
}

/* ---- the two formats ------------------------------------------------------------------ */

static const char *str_at(const json_t *o, const char *key)
{
	const json_t *v = json_object_get(o, key);

	return json_is_string(v) && json_string_length(v) ? json_string_value(v) : NULL;
}

/* The payload of a JWT, unverified (the worker only reads what it holds), or NULL. */
static json_t *jwt_payload(const char *jwt)
{
	const char *a = jwt ? strchr(jwt, '.') : NULL, *b = a ? strchr(a + 1, '.') : NULL;
	unsigned char bin[8192];
	size_t n = 0;
	json_t *j;

	if (!b || (size_t)(b - a - 1) > sizeof(bin) * 4 / 3)
		return NULL;
	if (sodium_base642bin(bin, sizeof(bin), a + 1, (size_t)(b - a - 1), NULL, &n, NULL,
			      sodium_base64_VARIANT_URLSAFE_NO_PADDING))
		return NULL;
	j = json_loadb((const char *)bin, n, 0, NULL);
	sodium_memzero(bin, sizeof(bin));
	if (!json_is_object(j)) {
		json_decref(j);
		return NULL;
	}
	return j;
}

/* An unsigned JWT ("alg": "none") of payload, which it takes. */
static char *jwt_unsigned(json_t *payload)
{
	static const char head[] = "{\"alg\":\"none\",\"typ\":\"JWT\"}";
	char *body = json_dumps(payload, JSON_COMPACT);
	size_t hl = sodium_base64_ENCODED_LEN(sizeof(head) - 1,
					      sodium_base64_VARIANT_URLSAFE_NO_PADDING);
	size_t bl =
		sodium_base64_ENCODED_LEN(strlen(body), sodium_base64_VARIANT_URLSAFE_NO_PADDING);
	char *h = xmalloc(hl), *p = xmalloc(bl);
	struct buf out = BUF_INIT;

	sodium_bin2base64(h, hl, (const unsigned char *)head, sizeof(head) - 1,
			  sodium_base64_VARIANT_URLSAFE_NO_PADDING);
	sodium_bin2base64(p, bl, (const unsigned char *)body, strlen(body),
			  sodium_base64_VARIANT_URLSAFE_NO_PADDING);
	/* A signature part that is not one: codex reads the claims, it verifies nothing. */
	buf_addf(&out, "%s.%s.b2xwLXBsYWNlaG9sZGVy", h, p);
	free(h);
	free(p);
	free(body);
	json_decref(payload);
	return buf_detach(&out, NULL);
}

/* claude: {"claudeAiOauth": {"accessToken", "refreshToken", "expiresAt" (ms), "scopes",
 * "subscriptionType", "rateLimitTier"}}. */
static int claude_parse(json_t *root, struct prov_held_login *l, const char **why)
{
	const json_t *o = json_object_get(root, "claudeAiOauth");
	int64_t exp = 0;

	if (!json_is_object(o) || !(l->access = str_at(o, "accessToken"))) {
		*why = "no claudeAiOauth.accessToken (not a claude OAuth login)";
		return -EINVAL;
	}
	l->refresh = str_at(o, "refreshToken");
	if (json_object_get(o, "expiresAt") &&
	    parse_json_int(json_object_get(o, "expiresAt"), 0, INT64_MAX / 2, &exp)) {
		*why = "claudeAiOauth.expiresAt is not a time in milliseconds";
		return -EINVAL;
	}
	l->expires_ms = exp;
	return 0;
}

static json_t *claude_placeholder(const struct prov_held_login *l, int64_t now_ms)
{
	json_int_t expires = now_ms + PLACEHOLDER_LIFE_MS;
	const json_t *real = l->root ? json_object_get(l->root, "claudeAiOauth") : NULL;
	json_t *o = json_pack("{s:s, s:s, s:I}", "accessToken",
			      "sk-ant-oat01-olp-placeholder-the-worker-holds-this-login",
			      "refreshToken", "sk-ant-ort01-olp-placeholder-never-refreshed",
			      "expiresAt", expires);
	/* What the login may do, not a secret: the CLI chooses its features by it. */
	static const char *const keep[] = { "scopes", "subscriptionType", "rateLimitTier" };

	for (size_t i = 0; real && i < ARRAY_SIZE(keep); i++)
		if (json_object_get(real, keep[i]))
			json_object_set(o, keep[i], json_object_get(real, keep[i]));
	if (!json_object_get(o, "scopes"))
		json_object_set_new(o, "scopes",
				    json_pack("[ss]", "user:inference", "user:profile"));
	return json_pack("{s:o}", "claudeAiOauth", o);
}

static json_t *claude_refresh_body(const struct prov_held_ops *ho, const char *refresh_token)
{
	return json_pack("{s:s, s:s, s:s}", "grant_type", "refresh_token", "refresh_token",
			 refresh_token, "client_id", ho->client_id);
}

/* {"access_token", "refresh_token"?, "expires_in" (s)} into claudeAiOauth. */
static int claude_refreshed(json_t *root, const json_t *answer, int64_t now_ms, const char **why)
{
	json_t *o = json_object_get(root, "claudeAiOauth");
	const char *at = str_at(answer, "access_token"), *rt = str_at(answer, "refresh_token");
	int64_t in = 0;

	if (!at || parse_json_int(json_object_get(answer, "expires_in"), 1,
				  (int64_t)10 * 365 * 86400, &in)) {
		*why = "the token endpoint's answer has no access_token and expires_in";
		return -EINVAL;
	}
	json_object_set_new(o, "accessToken", json_string(at));
	if (rt)
		json_object_set_new(o, "refreshToken", json_string(rt));
	json_object_set_new(o, "expiresAt", json_integer(now_ms + in * 1000));
	return 0;
}

/* codex: {"OPENAI_API_KEY": null, "tokens": {"id_token", "access_token", "refresh_token",
 * "account_id"}, "last_refresh": RFC 3339}. The access token is a JWT whose "exp" is its
 * expiry; the account is "account_id", else the id token's chatgpt_account_id. */
static int codex_parse(json_t *root, struct prov_held_login *l, const char **why)
{
	const json_t *t = json_object_get(root, "tokens");
	json_t *claims;
	int64_t exp = 0;

	if (!json_is_object(t) || !(l->access = str_at(t, "access_token"))) {
		*why = "no tokens.access_token (not a ChatGPT login)";
		return -EINVAL;
	}
	l->refresh = str_at(t, "refresh_token");
	l->account = str_at(t, "account_id");
	if ((claims = jwt_payload(l->access))) {
		if (!parse_json_int(json_object_get(claims, "exp"), 1, INT64_MAX / 2000, &exp))
			l->expires_ms = exp * 1000;
		json_decref(claims);
	}
	if (!l->account && (claims = jwt_payload(str_at(t, "id_token")))) {
		const json_t *auth = json_object_get(claims, "https://api.openai.com/auth");
		const char *acc = str_at(auth, "chatgpt_account_id");

		/* Kept in root, so that it lives as long as the other strings. */
		if (acc) {
			json_object_set_new((json_t *)t, "account_id", json_string(acc));
			l->account = str_at(t, "account_id");
		}
		json_decref(claims);
	}
	return 0;
}

static void rfc3339(int64_t ms, char *out, size_t n)
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;

	gmtime_r(&t, &tm);
	(void)strftime(out, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* A ChatGPT login's: JWTs codex can read, with only the claims it needs. */
static json_t *codex_chatgpt_placeholder(const json_t *t, int64_t now_ms)
{
	json_t *real = jwt_payload(str_at(t, "id_token"));
	const char *plan =
		str_at(json_object_get(real, "https://api.openai.com/auth"), "chatgpt_plan_type");
	json_int_t exp = (json_int_t)((now_ms + PLACEHOLDER_LIFE_MS) / 1000);
	json_t *auth = json_pack("{s:s, s:s, s:s}", "chatgpt_plan_type", plan ? plan : "plus",
				 "chatgpt_account_id", "olp-placeholder-account", "chatgpt_user_id",
				 "olp-placeholder-user");
	char *idt = jwt_unsigned(json_pack("{s:s, s:s, s:I, s:I, s:s, s:b, s:O}", "iss",
					   "https://auth.openai.com", "sub", "olp-placeholder",
					   "iat", (json_int_t)(now_ms / 1000), "exp", exp, "email",
					   "held-login@olp.invalid", "email_verified", 1,
					   "https://api.openai.com/auth", auth));
	char *at = jwt_unsigned(json_pack("{s:s, s:I, s:I, s:o}", "iss", "https://auth.openai.com",
					  "iat", (json_int_t)(now_ms / 1000), "exp", exp,
					  "https://api.openai.com/auth", auth));
	char when[32];
	json_t *out;

	rfc3339(now_ms, when, sizeof(when));
	out = json_pack("{s:n, s:{s:s, s:s, s:s, s:s}, s:s}", "OPENAI_API_KEY", "tokens",
			"id_token", idt, "access_token", at, "refresh_token",
			"olp-placeholder-refresh-token", "account_id", "olp-placeholder-account",
			"last_refresh", when);
	free(idt);
	free(at);
	json_decref(real);
	return out;
}

static json_t *codex_placeholder(const struct prov_held_login *l, int64_t now_ms)
{
	const json_t *t = l->root ? json_object_get(l->root, "tokens") : NULL;

	if (!t)
		return json_pack("{s:s}", "OPENAI_API_KEY",
				 "sk-olp-placeholder-held-by-the-worker");
	return codex_chatgpt_placeholder(t, now_ms);
}

static json_t *codex_refresh_body(const struct prov_held_ops *ho, const char *refresh_token)
{
	return json_pack("{s:s, s:s, s:s, s:s}", "client_id", ho->client_id, "grant_type",
			 "refresh_token", "refresh_token", refresh_token, "scope",
			 "openid profile email");
}

/* {"access_token", "id_token"?, "refresh_token"?} into tokens, and last_refresh. */
static int codex_refreshed(json_t *root, const json_t *answer, int64_t now_ms, const char **why)
{
	json_t *t = json_object_get(root, "tokens");
	static const char *const keys[] = { "access_token", "id_token", "refresh_token" };
	char when[32];

	if (!str_at(answer, "access_token")) {
		*why = "the token endpoint's answer has no access_token";
		return -EINVAL;
	}
	for (size_t i = 0; i < ARRAY_SIZE(keys); i++)
		if (str_at(answer, keys[i]))
			json_object_set_new(t, keys[i], json_string(str_at(answer, keys[i])));
	rfc3339(now_ms, when, sizeof(when));
	json_object_set_new(root, "last_refresh", json_string(when));
	return 0;
}

/* Endpoints and client ids as the pinned CLIs' binaries hold them (docs/accounts.md). */
const struct prov_held_ops prov_held_claude = {
	.token_url = "https://platform.claude.com/v1/oauth/token",
	.client_id = "9d1c250a-e61b-44d9-88ed-5944d1962f5e",
	.token_env = "CLAUDE_CODE_OAUTH_TOKEN",
	.placeholder_env = "sk-ant-oat01-olp-placeholder-the-worker-holds-this-token",
	.parse = claude_parse,
	.placeholder = claude_placeholder,
	.refresh_body = claude_refresh_body,
	.refreshed = claude_refreshed,
};

const struct prov_held_ops prov_held_codex = {
	.token_url = "https://auth.openai.com/oauth/token",
	.client_id = "app_EMoamEEZ73f0CkXaXp7hrann",
	.account_header = "chatgpt-account-id",
	.parse = codex_parse,
	.placeholder = codex_placeholder,
	.refresh_body = codex_refresh_body,
	.refreshed = codex_refreshed,
};

/* ---- reading the login ---------------------------------------------------------------- */

/* The token of "env" (claude setup-token) as given, the token or its "file:" source, or
 * NULL when the login is a file. */
static const char *env_token(const struct prov_provider *pv)
{
	const char *var = pv->ops->held->token_env;
	ssize_t i = var ? strv_find(&pv->env_names, var) : -1;

	return i >= 0 ? pv->env_values.v[i] : NULL;
}

int prov_login_path(const struct prov_provider *pv, char *path)
{
	if (env_token(pv))
		return -ENOENT;
	/* One file: settings.c refuses "held" with more than one. */
	if (pv->credentials_set)
		return pv->cred_host.n == 1
			       ? prov_cli_expand_home_in(pv->home, pv->cred_host.v[0], path)
			       : -ENOENT;
	return prov_cli_expand_home_in(pv->home, pv->ops->credentials[0], path);
}

bool prov_login_token_is_file(const char *src)
{
	return src && !strncmp(src, "file:", 5);
}

int prov_login_token_file_check(const struct prov_provider *pv, const char *src, const char *where,
				bool strict, struct buf *err)
{
	struct buf v = BUF_INIT, why = BUF_INIT;
	int ret = 0;

	/* Read by the worker at each run: a copy would need the token itself in the run. */
	if (pv->ops && pv->login != PROV_LOGIN_HELD) {
		buf_addf(err,
			 "%s: a file: token is read by the worker for its held login; the login "
			 "is \"copy\" (\"login\": \"held\" needs the network's upstream mode)",
			 where);
		return -EINVAL;
	}
	if (src[5] != '/') {
		buf_addf(err, "%s: a file: token needs an absolute path (file:/...)", where);
		return -EINVAL;
	}
	/* The rules of a set_headers file (network.c): the worker's own, mode 0600. */
	if (prov_net_resolve(src, &v, &why)) {
		if (strict) {
			buf_addf(err, "%s: %s", where, why.data);
			ret = -EINVAL;
		} else {
			log_warnx(NULL, "%s: %s: its runs have no login until it can be read",
				  where, why.data);
		}
	}
	explicit_bzero(v.data, v.len);
	buf_release(&v);
	buf_release(&why);
	return ret;
}

/* The token of "env" into l: itself, or read from its file now, so that a renewed token
 * is sent without a restart. */
static int read_env_token(const char *tok, struct prov_held_login *l, struct buf *why)
{
	struct buf v = BUF_INIT;
	int ret;

	if (!prov_login_token_is_file(tok)) {
		l->access = tok; /* long-lived: nothing to refresh */
		return 0;
	}
	if ((ret = prov_net_resolve(tok, &v, why))) {
		buf_release(&v);
		return ret;
	}
	l->token = buf_detach(&v, NULL);
	l->access = l->token;
	return 0;
}

void prov_login_release(struct prov_held_login *l)
{
	if (l->token) {
		explicit_bzero(l->token, strlen(l->token));
		free(l->token);
	}
	json_decref(l->root);
	memset(l, 0, sizeof(*l));
}

static int read_login_file(const char *path, json_t **root, struct buf *why)
{
	struct stat st;
	json_error_t je;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY), ret = 0;
	FILE *f;

	if (fd < 0) {
		buf_addf(why, "login file %s: %s", path, strerror(errno));
		return -errno;
	}
	/* The login the worker sends must be its own, as a set_headers file (network.c). */
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (st.st_mode & 077) ||
	    st.st_uid != geteuid() || (size_t)st.st_size > HELD_MAX_FILE) {
		buf_addf(why,
			 "login file %s: must be the worker's own regular file, mode 0600, "
			 "at most 64 KiB",
			 path);
		close(fd);
		return -EPERM;
	}
	if (!(f = fdopen(fd, "r"))) {
		close(fd);
		return -ENOMEM;
	}
	/* jansson's error text quotes no content beyond a position. */
	if (!(*root = json_loadf(f, JSON_REJECT_DUPLICATES, &je)) || !json_is_object(*root)) {
		buf_addf(why, "login file %s: not a JSON object (line %d)", path, je.line);
		json_decref(*root);
		*root = NULL;
		ret = -EINVAL;
	}
	(void)fclose(f); /* read only: nothing to lose */
	return ret;
}

int prov_login_read(const struct prov_provider *pv, struct prov_held_login *l, struct buf *why)
{
	const struct prov_held_ops *ho = pv->ops->held;
	const char *tok = env_token(pv), *what = NULL;
	char path[PATH_MAX];
	int ret;

	memset(l, 0, sizeof(*l));
	if (tok)
		return read_env_token(tok, l, why);
	if ((ret = prov_login_path(pv, path))) {
		buf_addf(why, "its login file: %s", strerror(-ret));
		return ret;
	}
	if ((ret = read_login_file(path, &l->root, why)))
		return ret;
	/* codex logged in with an API key: a key, nothing to refresh. */
	if (!json_object_get(l->root, "tokens") && str_at(l->root, "OPENAI_API_KEY") &&
	    ho == &prov_held_codex) {
		l->access = str_at(l->root, "OPENAI_API_KEY");
		return 0;
	}
	if ((ret = ho->parse(l->root, l, &what))) {
		buf_addf(why, "login file %s: %s", path, what);
		prov_login_release(l);
	}
	return ret;
}

/* ---- what a run gets ------------------------------------------------------------------ */

int prov_file_replace(const char *path, const char *data, const struct stat *owner)
{
	char tmp[PATH_MAX + 16];
	int fd, ret;

	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.olp-XXXXXX", path) >= sizeof(tmp))
		return -ENAMETOOLONG;
	if ((fd = mkostemp(tmp, O_CLOEXEC)) < 0)
		return -errno;
	ret = fchmod(fd, 0600) ? -errno : 0;
	if (!ret && owner && fchown(fd, owner->st_uid, owner->st_gid) && owner->st_uid != geteuid())
		ret = -errno;
	if (!ret)
		ret = write_all(fd, data, strlen(data));
	if (!ret && fsync(fd))
		ret = -errno;
	close(fd);
	if (!ret && rename(tmp, path))
		ret = -errno;
	if (ret)
		unlink(tmp);
	return ret;
}

/* The placeholder file of pv's login, written when missing or old. */
static int placeholder_file(const struct prov_provider *pv, char *path, struct buf *why)
{
	struct prov_held_login l;
	struct stat st;
	json_t *ph;
	char *text;
	int ret;

	if ((ret = held_file(pv, "placeholder", path))) {
		buf_addf(why, "no state dir for its placeholder: %s", strerror(-ret));
		return ret;
	}
	if (!stat(path, &st) && time(NULL) - st.st_mtime < PLACEHOLDER_MAX_AGE_S)
		return 0;
	/* The real login, for what it may do (a plan type, scopes): no secret is copied. */
	if ((ret = prov_login_read(pv, &l, why)))
		return ret;
	ph = pv->ops->held->placeholder(&l, wall_ms());
	prov_login_release(&l);
	text = json_dumps(ph, JSON_COMPACT);
	json_decref(ph);
	ret = prov_file_replace(path, text, NULL);
	free(text);
	if (ret)
		buf_addf(why, "placeholder %s: %s", path, strerror(-ret));
	return ret;
}

int prov_login_bind(const struct prov_provider *pv, const struct prov_request *req,
		    struct prov_plan *plan, struct prov_outcome *out)
{
	char host[PATH_MAX], ph[PATH_MAX], inside[PATH_MAX + 64];
	const char *rel = pv->credentials_set && pv->cred_inside.n ? pv->cred_inside.v[0] : "";
	struct buf why = BUF_INIT;
	char tmp[PATH_MAX];
	int ret;

	if (env_token(pv))
		return 0; /* the placeholder is a variable (prov_login_env) */
	if ((ret = prov_login_path(pv, host)) || (ret = placeholder_file(pv, ph, &why))) {
		/* No login on the host: nothing to hold, nothing bound (as with "copy"). */
		if (ret != -ENOENT)
			log_warnx(req->request_id, "provider %s: held login: %s", pv->name,
				  why.len ? why.data : strerror(-ret));
		buf_release(&why);
		if (ret == -ENOENT)
			return 0;
		snprintf(out->message, sizeof(out->message),
			 "provider %s: its login could not be read; the request was not run (the "
			 "worker's log says why)",
			 pv->name);
		return ret;
	}
	buf_release(&why);
	/* Where the CLI looks: the login's place under HOME, or the place it was given. */
	if (rel[0] == '/')
		snprintf(inside, sizeof(inside), "%s", rel);
	else if (rel[0])
		snprintf(inside, sizeof(inside), "%s/%s", SBX_HOME_PATH, rel);
	else if (!prov_cli_expand_home_in(pv->home, "~/", tmp) && !strncmp(host, tmp, strlen(tmp)))
		snprintf(inside, sizeof(inside), "%s/%s", SBX_HOME_PATH, host + strlen(tmp));
	else
		return -EINVAL;
	return sbx_policy_add_bind(plan->policy, ph, inside, false);
}

int prov_login_env(const struct prov_provider *pv, struct sbx_policy *p)
{
	if (pv->login != PROV_LOGIN_HELD || !env_token(pv))
		return 0;
	return sbx_policy_setenv(p, pv->ops->held->token_env, pv->ops->held->placeholder_env);
}

int prov_login_headers(const struct prov_provider *pv, const char *rid, struct strv *names,
		       struct strv *values, struct buf *why)
{
	const struct prov_held_ops *ho = pv->ops->held;
	struct prov_held_login l;
	struct buf v = BUF_INIT;
	int ret;

	if ((ret = prov_login_read(pv, &l, why)))
		return ret;
	if (l.root && (ret = prov_login_refresh(pv, rid, &l, why))) {
		/* An access token still valid serves this run; the next one tries again. */
		if (l.expires_ms && l.expires_ms > wall_ms() + 30000) {
			log_warnx(rid,
				  "provider %s: held login: refresh failed (%s); its token "
				  "is still valid",
				  pv->name, why->data);
			buf_reset(why);
			ret = 0;
		}
	}
	/* A header value with a line break would be a header of the token's choosing. */
	for (const char *c = l.access; !ret && *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f) {
			buf_adds(why, "the login's access token holds a control character");
			ret = -EINVAL;
		}
	for (const char *c = l.account; !ret && c && *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f) {
			buf_adds(why, "the login's account id holds a control character");
			ret = -EINVAL;
		}
	if (!ret) {
		buf_addf(&v, "Bearer %s", l.access);
		strv_push(names, "authorization");
		strv_push_take(values, buf_detach(&v, NULL));
		if (ho->account_header && l.account) {
			strv_push(names, ho->account_header);
			strv_push(values, l.account);
		}
	}
	prov_login_release(&l);
	return ret;
}

int prov_provider_held_placeholder(const struct prov_provider *pv, char *path, struct buf *why)
{
	if (pv->login != PROV_LOGIN_HELD || env_token(pv))
		return -EINVAL;
	return placeholder_file(pv, path, why);
}

int prov_provider_held_headers(const struct prov_provider *pv, const char *rid, struct strv *names,
			       struct strv *values, struct buf *why)
{
	if (pv->login != PROV_LOGIN_HELD)
		return -EINVAL;
	return prov_login_headers(pv, rid, names, values, why);
}

void prov_login_note(const struct prov_provider *pv, const char *where)
{
	struct prov_held_login l;
	struct buf why = BUF_INIT;

	/* A ChatGPT login (an account to name) goes to ChatGPT's backend, not the API. */
	if (pv->login != PROV_LOGIN_HELD || !pv->ops->held->account_header ||
	    !pv->net.upstream_host || strcmp(pv->net.upstream_host, "api.openai.com"))
		return;
	if (!prov_login_read(pv, &l, &why)) {
		if (l.account)
			log_warnx(NULL,
				  "%s: its login is a ChatGPT login, which the API at %s does not "
				  "take; set network.upstream to "
				  "\"https://chatgpt.com/backend-api/codex\" (docs/accounts.md)",
				  where, pv->net.upstream_host);
		prov_login_release(&l);
	}
	buf_release(&why);
}
