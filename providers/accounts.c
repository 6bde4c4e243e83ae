/* A provider's accounts: several named logins of one provider (issue 26 item 1, ADR 0037).
 *
 *   "accounts": {"alice": {"home": "/var/lib/olp/accounts/alice"},
 *                "bob": {"set_headers": {"x-api-key": "file:/etc/olp/bob.key"}}},
 *   "default_account": "alice"
 *
 * An account is a login directory ("home": the "~/" of the provider's credential files,
 * claude's ~/.claude/.credentials.json, codex's ~/.codex/auth.json; for a command, a
 * directory bound read-only into its runs and named by OLP_ACCOUNT_HOME), or, for a
 * provider whose worker sets the credential (network.set_headers), that credential's own
 * sources. Each account is a variant of the provider: a shallow copy that owns only what
 * differs, built once at load, never changed after, so that a run reads it as it reads
 * any provider. The variant's runs have OLP_ACCOUNT=<name> in their environment, which is
 * part of the sandbox pools' key: a warm sandbox or a pre-started process made for one
 * account never serves another. Its held login, its refresher and its limits state are
 * keyed by provider and account too (login.c, limits.c).
 *
 * Without "accounts" a provider has one account, "default", and runs as it always did. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "providers/internal.h"
#include "common/banned.h"

/* More than a household or a team needs; bounds the per-request scans. */
#define ACCOUNTS_MAX 64

bool prov_account_name_ok(const char *s)
{
	size_t n = s ? strlen(s) : 0;

	if (n < 1 || n > PROV_ACCOUNT_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' ||
		      s[i] == '-'))
			return false;
	return true;
}

static void variant_free(struct prov_provider *v)
{
	if (!v)
		return;
	free(v->account);
	free(v->home);
	if (v->own_headers) {
		strv_release(&v->net.hdr_names);
		strv_release(&v->net.hdr_srcs);
	}
	if (v->own_env) {
		for (size_t i = 0; i < v->env_values.n; i++)
			explicit_bzero(v->env_values.v[i], strlen(v->env_values.v[i]));
		strv_release(&v->env_names);
		strv_release(&v->env_values);
	}
	free(v);
}

void prov_accounts_release(struct prov_provider *pv)
{
	for (size_t i = 0; i < pv->naccounts; i++)
		variant_free(pv->accounts[i]);
	free(pv->accounts);
	pv->accounts = NULL;
	pv->naccounts = 0;
}

static struct prov_provider *variant_new(const struct prov_provider *pv, const char *name)
{
	struct prov_provider *v = xmalloc(sizeof(*v));

	*v = *pv;
	v->account = xstrdup(name);
	v->home = NULL;
	v->own_headers = false;
	v->own_env = false;
	v->parent = pv;
	v->accounts = NULL;
	v->naccounts = 0;
	v->default_account = 0;
	v->cli_state_cache = 0;
	return v;
}

/* "home": an absolute directory without "." or ".." parts. */
static int read_home(struct prov_provider *v, const json_t *h, const char *where, bool strict,
		     struct buf *err)
{
	const char *s = json_string_value(h);
	struct stat st;

	if (!s || s[0] != '/' || strlen(s) != json_string_length(h) || strstr(s, "/./") ||
	    strstr(s, "/../") || strstr(s, "//") || strlen(s) >= PATH_MAX - 256) {
		buf_addf(err, "%s.home: must be an absolute directory path", where);
		return -EINVAL;
	}
	v->home = xstrdup(s);
	while (strlen(v->home) > 1 && v->home[strlen(v->home) - 1] == '/')
		v->home[strlen(v->home) - 1] = '\0';
	if (stat(v->home, &st) || !S_ISDIR(st.st_mode)) {
		if (strict) {
			buf_addf(err, "%s.home: %s is not a directory", where, v->home);
			return -EINVAL;
		}
		log_warnx(NULL, "%s.home: %s is not a directory (yet): its runs have no login",
			  where, v->home);
	}
	return 0;
}

/* The variable of pv's login token ("env", ADR 0036), or NULL when its type has none. */
static const char *token_var(const struct prov_provider *pv)
{
	return pv->ops && pv->ops->held ? pv->ops->held->token_env : NULL;
}

/* The token itself: it becomes a header value, where a line break would be a header of
 * its own. "file:/abs" instead: its file, checked (login.c). */
static int check_token(const struct prov_provider *pv, const char *tok, const char *where,
		       const char *name, bool strict, struct buf *err)
{
	struct buf at = BUF_INIT;
	int ret;

	if (!prov_login_token_is_file(tok)) {
		for (const char *c = tok; *c; c++) {
			if ((unsigned char)*c < 0x21 || *c == 0x7f) {
				buf_addf(err, "%s.env.%s: holds a space or control character",
					 where, name);
				return -EINVAL;
			}
		}
		return 0;
	}
	buf_addf(&at, "%s.env.%s", where, name);
	ret = prov_login_token_file_check(pv, tok, at.data, strict, err);
	buf_release(&at);
	return ret;
}

/* "env": {"<token variable>": "<token>"}, the account's own login as a long-lived token
 * (claude's `setup-token`): the variant's environment is the provider's with that
 * variable set, so that the held login (login.c) reads it as it reads the provider's.
 * Only the login's variable: every other setting of a run is the provider's. The type
 * is not known when config.json is checked alone (pv->ops NULL): any type's token
 * variable is taken then, and the provider's own checked when the registry loads. */
static int read_env(struct prov_provider *pv, struct prov_provider *v, const json_t *e,
		    const char *where, bool strict, struct buf *err)
{
	const char *tv = token_var(pv), *name, *tok;
	const json_t *val;

	if (!json_is_object(e) || json_object_size(e) != 1) {
		buf_addf(err, "%s.env: must be an object of one variable, the login's token (%s)",
			 where, tv ? tv : "a type with a token login: claude's");
		return -EINVAL;
	}
	json_object_foreach((json_t *)e, name, val) {
		if (pv->ops ? !tv || strcmp(name, tv) : !prov_login_token_var(name)) {
			buf_addf(err,
				 "%s.env.%.100s: an account's env holds only its login's token "
				 "(%s)",
				 where, name, tv ? tv : "none for this type");
			return -EINVAL;
		}
		tok = json_string_value(val);
		if (!tok || !*tok || strlen(tok) != json_string_length(val)) {
			buf_addf(err, "%s.env.%s: must be the token, a non-empty string", where,
				 name);
			return -EINVAL;
		}
		if (check_token(pv, tok, where, name, strict, err))
			return -EINVAL;
		memset(&v->env_names, 0, sizeof(v->env_names));
		memset(&v->env_values, 0, sizeof(v->env_values));
		v->own_env = true;
		for (size_t i = 0; i < pv->env_names.n; i++) {
			if (strcmp(pv->env_names.v[i], name)) {
				strv_push(&v->env_names, pv->env_names.v[i]);
				strv_push(&v->env_values, pv->env_values.v[i]);
			}
		}
		strv_push(&v->env_names, name);
		strv_push(&v->env_values, tok);
	}
	return 0;
}

/* An account's login: at most one of "home", "set_headers" and "env"; and "home" not
 * under a token the provider's env gives, which would be the login instead (login.c
 * reads the token first). */
static int check_one_login(const struct prov_provider *pv, const json_t *o, const char *where,
			   struct buf *err)
{
	const char *tv = token_var(pv);
	int n = !!json_object_get(o, "home") + !!json_object_get(o, "set_headers") +
		!!json_object_get(o, "env");

	if (n > 1) {
		buf_addf(err,
			 "%s: \"home\", \"set_headers\" and \"env\" each name the login; keep "
			 "one",
			 where);
		return -EINVAL;
	}
	if (json_object_get(o, "home") && tv && strv_find(&pv->env_names, tv) >= 0) {
		buf_addf(err,
			 "%s.home: the provider's env.%s would be this account's login, not its "
			 "home's; give each account its own (home, or env.%s) and remove the "
			 "provider's",
			 where, tv, tv);
		return -EINVAL;
	}
	return 0;
}

static int read_account(struct prov_provider *pv, struct prov_provider *v, const json_t *o,
			const char *where, bool strict, struct buf *err)
{
	const json_t *h = json_object_get(o, "home"), *sh = json_object_get(o, "set_headers");
	const json_t *e = json_object_get(o, "env");
	const char *key;
	const json_t *val;

	if (!json_is_object(o)) {
		buf_addf(err,
			 "%s: must be an object ({\"home\": DIR}, {\"env\": {...}} or "
			 "{\"set_headers\": {...}})",
			 where);
		return -EINVAL;
	}
	json_object_foreach((json_t *)o, key, val) {
		if (strcmp(key, "home") && strcmp(key, "set_headers") && strcmp(key, "env")) {
			buf_addf(err, "%s.%.100s: unknown setting (home, env, set_headers)", where,
				 key);
			return -EINVAL;
		}
	}
	if (check_one_login(pv, o, where, err))
		return -EINVAL;
	if (e)
		return read_env(pv, v, e, where, strict, err);
	for (size_t i = 0; h && pv->credentials_set && i < pv->cred_host.n; i++) {
		if (pv->cred_host.v[i][0] == '/') {
			buf_addf(err,
				 "%s.home: the provider's credentials name %s, the same file for "
				 "every account; give them as \"~/...\" paths (under each home)",
				 where, pv->cred_host.v[i]);
			return -EINVAL;
		}
	}
	if (h)
		return read_home(v, h, where, strict, err);
	if (!sh)
		return 0;
	if (!prov_net_secretless(&pv->net)) {
		buf_addf(err,
			 "%s.set_headers: needs the provider's network.set_headers (the worker "
			 "sets the credential); give this account a \"home\" instead",
			 where);
		return -EINVAL;
	}
	memset(&v->net.hdr_names, 0, sizeof(v->net.hdr_names));
	memset(&v->net.hdr_srcs, 0, sizeof(v->net.hdr_srcs));
	v->own_headers = true;
	if (prov_net_read_headers(&v->net, sh, where, strict, err))
		return -EINVAL;
	if (!v->net.hdr_names.n) {
		buf_addf(err, "%s.set_headers: must name at least one header", where);
		return -EINVAL;
	}
	return 0;
}

static int read_default(struct prov_provider *pv, const json_t *d, const char *where,
			struct buf *err)
{
	const char *s = json_string_value(d);

	if (!d || json_is_null(d)) {
		/* "default" when one is named so, else the first listed. */
		for (size_t i = 0; i < pv->naccounts; i++)
			if (!strcmp(pv->accounts[i]->account, PROV_ACCOUNT_DEFAULT))
				pv->default_account = i;
		return 0;
	}
	for (size_t i = 0; s && i < pv->naccounts; i++) {
		if (!strcmp(pv->accounts[i]->account, s)) {
			pv->default_account = i;
			return 0;
		}
	}
	buf_addf(err, "%s.default_account: must name one of \"accounts\"", where);
	return -EINVAL;
}

int prov_accounts_read(struct prov_provider *pv, const json_t *conf, const char *where, bool strict,
		       struct buf *err)
{
	const json_t *accs = json_object_get(conf, "accounts"), *o;
	const json_t *d = json_object_get(conf, "default_account");
	struct buf at = BUF_INIT;
	const char *name;
	int ret = 0;

	if (!accs || json_is_null(accs)) {
		if (d && !json_is_null(d) &&
		    (!json_is_string(d) || strcmp(json_string_value(d), PROV_ACCOUNT_DEFAULT))) {
			buf_addf(err,
				 "%s.default_account: there is no \"accounts\": the one account "
				 "is \"default\"",
				 where);
			return -EINVAL;
		}
		return 0;
	}
	if (!json_is_object(accs) || !json_object_size(accs) ||
	    json_object_size(accs) > ACCOUNTS_MAX) {
		buf_addf(err, "%s.accounts: must be an object of 1 to %d account names to objects",
			 where, ACCOUNTS_MAX);
		return -EINVAL;
	}
	pv->accounts = xcalloc(json_object_size(accs), sizeof(struct prov_provider *));
	json_object_foreach((json_t *)accs, name, o) {
		if (!prov_account_name_ok(name)) {
			buf_addf(err, "%s.accounts.%.100s: an account name is 1-%d of [a-z0-9_-]",
				 where, name, PROV_ACCOUNT_NAME_MAX);
			ret = -EINVAL;
			break;
		}
		pv->accounts[pv->naccounts] = variant_new(pv, name);
		buf_reset(&at);
		buf_addf(&at, "%s.accounts.%s", where, name);
		if ((ret = read_account(pv, pv->accounts[pv->naccounts++], o, at.data, strict,
					err)))
			break;
	}
	buf_release(&at);
	if (!ret)
		ret = read_default(pv, d, where, err);
	if (ret)
		prov_accounts_release(pv);
	return ret;
}

size_t prov_provider_account_count(const struct prov_provider *pv)
{
	return pv->naccounts ? pv->naccounts : 1;
}

const char *prov_provider_account_at(const struct prov_provider *pv, size_t i)
{
	if (!pv->naccounts)
		return i ? NULL : prov_provider_account(pv);
	return i < pv->naccounts ? pv->accounts[i]->account : NULL;
}

const char *prov_provider_default_account(const struct prov_provider *pv)
{
	if (pv->parent)
		pv = pv->parent;
	return pv->naccounts ? pv->accounts[pv->default_account]->account : PROV_ACCOUNT_DEFAULT;
}

const char *prov_provider_account(const struct prov_provider *pv)
{
	return pv->account ? pv->account : PROV_ACCOUNT_DEFAULT;
}

const struct prov_provider *prov_provider_for_account(const struct prov_provider *pv,
						      const char *account)
{
	if (pv->parent)
		pv = pv->parent;
	if (!pv->naccounts)
		return !account || !strcmp(account, PROV_ACCOUNT_DEFAULT) ? pv : NULL;
	if (!account)
		return pv->accounts[pv->default_account];
	for (size_t i = 0; i < pv->naccounts; i++)
		if (!strcmp(pv->accounts[i]->account, account))
			return pv->accounts[i];
	return NULL;
}

int prov_account_plan(const struct prov_provider *pv, struct sbx_policy *p)
{
	int ret;

	if (!pv->account)
		return 0;
	/* In the environment, and so in the pools' key: no process crosses accounts. */
	if ((ret = sbx_policy_setenv(p, "OLP_ACCOUNT", pv->account)))
		return ret;
	if (!pv->home || !(pv->ops->settings & PROV_SET_COMMAND))
		return 0;
	/* A command's login dir: read-only at its own path, named by OLP_ACCOUNT_HOME. */
	return sbx_policy_add_ro(p, pv->home) ?: sbx_policy_setenv(p, "OLP_ACCOUNT_HOME", pv->home);
}
