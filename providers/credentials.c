/* Logins (ADR 0025): which providers' runs hold a login a prompt can read, and
 * what a credentials file a run wrote must look like before it replaces the host's.
 *
 * A login is the credential files of a CLI (claude's ~/.claude/.credentials.json, codex's
 * ~/.codex/auth.json, vibe's ~/.vibe/.env) bound into a run. Where the CLI runs commands as
 * the model asks, the model can read those files and print them: the login is then as
 * good as handed to whoever wrote the prompt. fcgi/ lets only callers allowed the login
 * (the owner tier, a guest key whose manifest names the provider) use such a provider.
 *
 * With "credentials_writable", a run's changes to its copy replace the host file when the
 * run ends (the CLI refreshed an OAuth token), for the owner's runs only, and only when
 * what the run left still parses as the CLI's own format and is at most PROV_CRED_MAX
 * bytes: a run that wrote garbage, or a login of someone else's choosing (whose account
 * would then see every later prompt, the owner's too), keeps the host file as it was. The
 * checks are strict on the shape the CLI needs and lenient on extra fields, which CLIs add
 * between versions. They run in the worker, after the run's processes are gone, and never
 * quote the content in what they say. */
#include <ctype.h>
#include <string.h>

#include "providers/internal.h"
#include "common/banned.h"

bool prov_provider_uses_account(const struct prov_provider *pv)
{
	return pv->ops && pv->ops->upstream_tokens;
}

/* Whether the run is given credential files at all: not secretless (the worker adds the
 * credential on the way out), not "credentials": [] or null; a CLI's defaults are its
 * login files, whether they exist now or appear later. */
static bool binds_login(const struct prov_provider *pv)
{
	if (!prov_provider_uses_account(pv) || prov_net_secretless(&pv->net))
		return false;
	/* Held by the worker (ADR 0036): the run gets a placeholder, never the login. */
	if (pv->login == PROV_LOGIN_HELD)
		return false;
	return !pv->credentials_set || pv->cred_host.n > 0;
}

bool prov_provider_login_exposed(const struct prov_provider *pv)
{
	return pv->ops && (pv->ops->runs_commands || pv->own_tools) && binds_login(pv);
}

/* Whether path's last component is name. */
static bool named(const char *path, const char *name)
{
	const char *slash = strrchr(path, '/');

	return !strcmp(slash ? slash + 1 : path, name);
}

/* The JSON object of a credentials file, or NULL with *why set. */
static json_t *cred_object(const char *data, size_t len, const char **why)
{
	json_t *o;

	if (len > PROV_CRED_MAX) {
		*why = "the new file is larger than 64 KiB";
		return NULL;
	}
	o = json_loadb(data, len, JSON_REJECT_DUPLICATES, NULL);
	if (!json_is_object(o)) {
		*why = "the new file is not a JSON object";
		json_decref(o);
		return NULL;
	}
	return o;
}

static bool nonempty_string(const json_t *v)
{
	return json_is_string(v) && json_string_length(v) > 0 &&
	       strlen(json_string_value(v)) == json_string_length(v);
}

/* claude's .credentials.json: {"claudeAiOauth": {"accessToken": "…", "refreshToken": "…",
 * "expiresAt": ms, "scopes": […], …}, …}. */
bool prov_claude_credentials_ok(const char *inside, const char *data, size_t len, const char **why)
{
	const json_t *oauth;
	json_t *o;
	bool ok;

	if (!named(inside, ".credentials.json")) {
		*why = "not claude's .credentials.json: no known format to check it against";
		return false;
	}
	if (!(o = cred_object(data, len, why)))
		return false;
	oauth = json_object_get(o, "claudeAiOauth");
	ok = json_is_object(oauth) && nonempty_string(json_object_get(oauth, "accessToken")) &&
	     nonempty_string(json_object_get(oauth, "refreshToken")) &&
	     json_is_number(json_object_get(oauth, "expiresAt"));
	if (!ok)
		*why = "the new file has no claudeAiOauth {accessToken, refreshToken, expiresAt}";
	json_decref(o);
	return ok;
}

/* codex's auth.json: {"OPENAI_API_KEY": "sk-…" or null, "tokens": {"id_token",
 * "access_token": "…", "refresh_token": "…", "account_id"} or null, "last_refresh": …,
 * …}: an API key, or the tokens of a ChatGPT login, or both. */
bool prov_codex_credentials_ok(const char *inside, const char *data, size_t len, const char **why)
{
	const json_t *key, *tokens;
	json_t *o;
	bool ok;

	if (!named(inside, "auth.json")) {
		*why = "not codex's auth.json: no known format to check it against";
		return false;
	}
	if (!(o = cred_object(data, len, why)))
		return false;
	key = json_object_get(o, "OPENAI_API_KEY");
	tokens = json_object_get(o, "tokens");
	ok = (!key || json_is_null(key) || nonempty_string(key)) &&
	     (!tokens || json_is_null(tokens) ||
	      (json_is_object(tokens) && nonempty_string(json_object_get(tokens, "access_token")) &&
	       nonempty_string(json_object_get(tokens, "refresh_token")))) &&
	     (nonempty_string(key) || json_is_object(tokens));
	if (!ok)
		*why = "the new file holds neither an OPENAI_API_KEY string nor tokens "
		       "{access_token, refresh_token}";
	json_decref(o);
	return ok;
}

/* One line of a .env file: blank, a comment, or [export ]NAME=value. */
static bool env_line_ok(const char *s, size_t n)
{
	size_t i = 0;

	while (i < n && (s[i] == ' ' || s[i] == '\t'))
		i++;
	if (i == n || s[i] == '#')
		return true;
	if (n - i > 7 && !strncmp(s + i, "export ", 7))
		i += 7;
	if (!(isalpha((unsigned char)s[i]) || s[i] == '_'))
		return false;
	while (i < n && (isalnum((unsigned char)s[i]) || s[i] == '_'))
		i++;
	return i < n && s[i] == '=';
}

/* vibe's .env: MISTRAL_API_KEY=… lines (its config.toml is not a login and is never
 * written back). */
bool prov_vibe_credentials_ok(const char *inside, const char *data, size_t len, const char **why)
{
	const char *s = data, *end = data + len;

	if (!named(inside, ".env")) {
		*why = "not vibe's .env: no known format to check it against";
		return false;
	}
	if (len > PROV_CRED_MAX) {
		*why = "the new file is larger than 64 KiB";
		return false;
	}
	if (!utf8_valid(data, len) || memchr(data, '\0', len)) {
		*why = "the new file is not text";
		return false;
	}
	while (s < end) {
		const char *nl = memchr(s, '\n', (size_t)(end - s));
		size_t full = nl ? (size_t)(nl - s) : (size_t)(end - s), n = full;

		if (n && s[n - 1] == '\r')
			n--;
		if (!env_line_ok(s, n)) {
			*why = "the new file has a line that is not NAME=value";
			return false;
		}
		s += full + (nl ? 1 : 0);
	}
	return true;
}
