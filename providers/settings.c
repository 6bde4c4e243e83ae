/* A provider's settings (providers.<name> of the registry, merged with config.json's
 * providers.<name>), checked and made typed once, when the registry is loaded. Plans and
 * parsers read struct prov_provider only: a setting of the wrong type is found when the
 * worker starts, named by its file and JSON path, not by a request that fails later.
 *
 * What a bad value costs depends on where it is written. In config.json (the operator's
 * own file) it stops the worker (prov_config_check). In a registry entry it skips the
 * provider with a warning, as a bad model id does, except for "timeout_s",
 * "max_concurrent" and a field of "limits", which leave their default with a warning. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "providers/internal.h"
#include "common/banned.h"

/* How one setting is read; every one holds for the provider types whose settings
 * (provider_ops.settings) hold its group; group 0: every type reads it. */
struct reader {
	struct prov_provider *pv;
	const char *where; /* "<file>: providers.<name>" */
	bool strict;
	struct buf *err;
	const json_t *network; /* read last (network.c): its defaults depend on "env" */
	bool login_set;	       /* "login" was given: held that cannot be is an error */
	const json_t *conf;    /* the whole entry (its accounts, for check_login) */
};

static void vsay(struct buf *b, const struct reader *r, const char *key, const char *fmt,
		 va_list ap) __attribute__((format(printf, 4, 0)));
static void vsay(struct buf *b, const struct reader *r, const char *key, const char *fmt,
		 va_list ap)
{
	buf_addf(b, "%s.%s", r->where, key);
	buf_vaddf(b, fmt, ap);
}

/* A bad value: fmt continues the setting's path ("[2]: must be …", ": must be …"). */
static int bad(struct reader *r, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int bad(struct reader *r, const char *key, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsay(r->err, r, key, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* A bad value of a setting that has a safe default: an error when strict, else a
 * warning, and the default holds. */
static int soft(struct reader *r, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int soft(struct reader *r, const char *key, const char *fmt, ...)
{
	struct buf msg = BUF_INIT;
	va_list ap;

	va_start(ap, fmt);
	vsay(r->strict ? r->err : &msg, r, key, fmt, ap);
	va_end(ap);
	if (r->strict)
		return -EINVAL;
	log_warnx(NULL, "%s; the default holds", msg.data);
	buf_release(&msg);
	return 0;
}

static int read_timeout(struct reader *r, const char *key, const json_t *v)
{
	double s = json_number_value(v);

	if (!json_is_number(v) || !(s > 0) || s > 86400.0 * 7)
		return soft(r, key, ": must be a number of seconds above 0, at most 604800");
	/* 0 would mean "no limit" to the sandbox: the smallest limit is 1 ms. */
	r->pv->timeout_ms = s * 1000.0 < 1.0 ? 1 : (uint64_t)(s * 1000.0);
	return 0;
}

static int read_max_concurrent(struct reader *r, const char *key, const json_t *v)
{
	int64_t n;

	if (parse_json_int(v, 0, 1024, &n))
		return soft(r, key, ": must be an integer from 0 (no cap) to 1024");
	r->pv->max_concurrent = (unsigned)n;
	return 0;
}

/* How many processes of a run to keep started ahead (ADR 0022): each may be a whole CLI
 * runtime waiting, so a small number. */
static int read_prestart(struct reader *r, const char *key, const json_t *v)
{
	int64_t n;

	if (parse_json_int(v, 0, 8, &n))
		return bad(r, key, ": must be an integer from 0 (none) to 8");
	/* A pre-started process is started with the argv of the run before it; vibe's argv
	 * holds that run's prompt, which the process would send upstream unasked (spending
	 * tokens no request is charged for) and whose hit would tell a guest that someone
	 * sent the same prompt. */
	if (n && r->pv->ops && r->pv->ops->prompt_in_argv)
		return soft(r, key,
			    ": %s takes its prompt on its command line, so a pre-started "
			    "process would run the previous request's prompt; only 0",
			    r->pv->type);
	r->pv->prestart = (unsigned)n;
	return 0;
}

/* Each field an integer from 1 to SBX_LIMIT_MAX, far above any host: the sandbox's
 * conversions (MB to bytes, percent to microseconds) cannot wrap around to a small
 * limit. */
static int read_limits(struct reader *r, const char *key, const json_t *v)
{
	static const struct {
		const char *key;
		size_t off;
	} fields[] = {
		{ "memory_mb", offsetof(struct sbx_limits, memory_mb) },
		{ "pids", offsetof(struct sbx_limits, pids) },
		{ "cpu_pct", offsetof(struct sbx_limits, cpu_pct) },
		{ "nofile", offsetof(struct sbx_limits, nofile) },
		{ "fsize_mb", offsetof(struct sbx_limits, fsize_mb) },
		{ "cpu_s", offsetof(struct sbx_limits, cpu_s) },
		{ "as_mb", offsetof(struct sbx_limits, as_mb) },
		{ "nproc", offsetof(struct sbx_limits, nproc) },
		{ "disk_mb", offsetof(struct sbx_limits, disk_mb) },
	};

	if (!json_is_object(v))
		return soft(r, key, ": must be an object of limits");
	for (size_t i = 0; i < ARRAY_SIZE(fields); i++) {
		const json_t *f = json_object_get(v, fields[i].key);
		int64_t n;

		if (!f)
			continue;
		if (parse_json_int(f, 1, (int64_t)SBX_LIMIT_MAX, &n)) {
			if (soft(r, key, ".%s: must be an integer from 1 to %llu", fields[i].key,
				 (unsigned long long)SBX_LIMIT_MAX))
				return -EINVAL;
			continue;
		}
		*(uint64_t *)((char *)&r->pv->limits + fields[i].off) = (uint64_t)n;
	}
	return 0;
}

static int read_bool(struct reader *r, const char *key, const json_t *v, bool *out)
{
	if (!json_is_boolean(v))
		return bad(r, key, ": must be true or false");
	*out = json_is_true(v);
	return 0;
}

static int read_string(struct reader *r, const char *key, const json_t *v, char **out)
{
	/* A NUL inside would cut the value short where it is used. */
	if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
		return bad(r, key, ": must be a string");
	free(*out);
	*out = xstrdup(json_string_value(v));
	return 0;
}

static bool is_abs_string(const json_t *v)
{
	return json_is_string(v) && json_string_value(v)[0] == '/' &&
	       strlen(json_string_value(v)) == json_string_length(v);
}

/* A variable name the child's environment can hold. */
static bool env_name_ok(const char *s)
{
	return s[0] && !strchr(s, '=');
}

static int read_env(struct reader *r, const char *key, const json_t *v)
{
	const char *name;
	const json_t *val;

	if (!json_is_object(v))
		return bad(r, key, ": must be an object of variable names to strings");
	json_object_foreach((json_t *)v, name, val) {
		if (!env_name_ok(name))
			return bad(r, key, ".%.100s: is not a variable name", name);
		if (!json_is_string(val) ||
		    strlen(json_string_value(val)) != json_string_length(val))
			return bad(r, key, ".%.100s: must be a string", name);
		strv_push(&r->pv->env_names, name);
		strv_push(&r->pv->env_values, json_string_value(val));
	}
	return 0;
}

static int read_argv(struct reader *r, const char *key, const json_t *v)
{
	const json_t *a;
	size_t i;

	if (!json_is_array(v) || !json_array_size(v))
		return bad(r, key, ": must be a non-empty array of strings");
	json_array_foreach(v, i, a) {
		if (!json_is_string(a) || strlen(json_string_value(a)) != json_string_length(a))
			return bad(r, key, "[%zu]: must be a string", i);
		if (!i && !is_abs_string(a))
			return bad(r, key, "[0]: must be an absolute path");
		strv_push(&r->pv->argv, json_string_value(a));
	}
	return 0;
}

static int read_ro_paths(struct reader *r, const char *key, const json_t *v)
{
	const json_t *a;
	size_t i;

	if (!json_is_array(v))
		return bad(r, key, ": must be an array of absolute paths");
	json_array_foreach(v, i, a) {
		if (!is_abs_string(a))
			return bad(r, key, "[%zu]: must be an absolute path", i);
		strv_push(&r->pv->ro_paths, json_string_value(a));
	}
	return 0;
}

static int read_output(struct reader *r, const char *key, const json_t *v)
{
	static const char *const modes[] = { [PROV_OUTPUT_TEXT] = "text",
					     [PROV_OUTPUT_SSE] = "sse",
					     [PROV_OUTPUT_NDJSON] = "ndjson" };
	const char *s = json_string_value(v);

	for (size_t i = 0; s && i < ARRAY_SIZE(modes); i++) {
		if (!strcmp(s, modes[i])) {
			r->pv->output = (enum prov_output)i;
			return 0;
		}
	}
	return bad(r, key, ": must be \"text\", \"sse\" or \"ndjson\"");
}

/* A host path of a credentials file: absolute, or "~/" for the worker's HOME. */
static bool host_path_ok(const char *s)
{
	return s[0] == '/' || (s[0] == '~' && s[1] == '/');
}

/* Where a credentials file goes: relative to the scratch home, or absolute inside it;
 * never through "..". */
static bool inside_path_ok(const char *s)
{
	size_t hl = strlen(SBX_HOME_PATH);

	if (s[0] == '/' && (strncmp(s, SBX_HOME_PATH, hl) || s[hl] != '/' || !s[hl + 1]))
		return false;
	for (const char *c = s; (c = strstr(c, "..")); c += 2)
		if ((c == s || c[-1] == '/') && (c[2] == '/' || c[2] == '\0'))
			return false;
	return s[0] != '\0';
}

static int add_credential(struct reader *r, const char *key, const char *sub, const char *host,
			  const char *inside)
{
	if (!host_path_ok(host))
		return bad(r, key, "%s: must be an absolute path or start with ~/", sub);
	if (inside && !inside_path_ok(inside))
		return bad(r, key, "%s: must be a path in the home (relative, or under %s/)", sub,
			   SBX_HOME_PATH);
	strv_push(&r->pv->cred_host, host);
	strv_push(&r->pv->cred_inside, inside ? inside : "");
	return 0;
}

/* A host path, an array of them, or an object {host path: where inside}; null or false
 * for none at all. */
static int read_credentials(struct reader *r, const char *key, const json_t *v)
{
	const json_t *a;
	const char *host;
	struct buf sub = BUF_INIT;
	size_t i;
	int ret = 0;

	r->pv->credentials_set = true;
	if (json_is_string(v))
		return add_credential(r, key, "", json_string_value(v), NULL);
	if (json_is_array(v)) {
		json_array_foreach(v, i, a) {
			buf_reset(&sub);
			buf_addf(&sub, "[%zu]", i);
			ret = json_is_string(a)
				      ? add_credential(r, key, sub.data, json_string_value(a), NULL)
				      : bad(r, key, "%s: must be a path", sub.data);
			if (ret)
				break;
		}
	} else if (json_is_object(v)) {
		json_object_foreach((json_t *)v, host, a) {
			buf_reset(&sub);
			buf_addf(&sub, ".%.200s", host);
			ret = json_is_string(a)
				      ? add_credential(r, key, sub.data, host, json_string_value(a))
				      : bad(r, key, "%s: must be a path", sub.data);
			if (ret)
				break;
		}
	} else if (!json_is_null(v) && !json_is_false(v)) {
		ret = bad(r, key,
			  ": must be a path, an array of paths, or an object {host path: path "
			  "in the home}");
	}
	buf_release(&sub);
	return ret;
}

static int read_max_retries(struct reader *r, const char *key, const json_t *v)
{
	if (parse_json_int(v, 0, 1000, &r->pv->max_retries))
		return bad(r, key, ": must be an integer from 0 to 1000");
	return 0;
}

static int read_config_toml(struct reader *r, const char *key, const json_t *v)
{
	if (json_is_null(v) || json_is_false(v)) {
		r->pv->config_toml_off = true;
		return 0;
	}
	if (!json_is_string(v) || !host_path_ok(json_string_value(v)))
		return bad(r, key, ": must be an absolute path or start with ~/, or false");
	return read_string(r, key, v, &r->pv->config_toml);
}

/* It goes into a TOML key path (model_providers.<id>): letters, digits, - and _ only. */
static int read_model_provider(struct reader *r, const char *key, const json_t *v)
{
	const char *s = json_string_value(v);
	static const char ok[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-";

	if (!s || !*s || strspn(s, ok) != json_string_length(v) || json_string_length(v) >= 64)
		return bad(r, key, ": must be 1-63 letters, digits, - or _");
	return read_string(r, key, v, &r->pv->model_provider);
}

static int read_network(struct reader *r, const char *key, const json_t *v)
{
	(void)key;
	r->network = v;
	return 0;
}

static int read_writable(struct reader *r, const char *key, const json_t *v)
{
	return read_bool(r, key, v, &r->pv->credentials_writable);
}

static int read_bin(struct reader *r, const char *key, const json_t *v)
{
	if (!json_is_string(v) || !json_string_length(v))
		return bad(r, key, ": must be a program's path or name");
	return read_string(r, key, v, &r->pv->bin);
}

static int read_system_prompt(struct reader *r, const char *key, const json_t *v)
{
	return read_string(r, key, v, &r->pv->system_prompt);
}

static int read_tools(struct reader *r, const char *key, const json_t *v)
{
	int ret = read_string(r, key, v, &r->pv->tools);

	/* Any of claude's own tools (Bash, Read…) lets a prompt reach what the run holds. */
	if (!ret)
		r->pv->own_tools = r->pv->tools[strspn(r->pv->tools, " \t,")] != '\0';
	return ret;
}

static int read_login(struct reader *r, const char *key, const json_t *v)
{
	const char *s = json_string_value(v);

	if (!s || (strcmp(s, "held") && strcmp(s, "copy")))
		return bad(r, key,
			   ": must be \"held\" (the worker holds the login, runs get a "
			   "placeholder) or \"copy\" (runs get a copy of its files)");
	r->pv->login = strcmp(s, "held") ? PROV_LOGIN_COPY : PROV_LOGIN_HELD;
	r->login_set = true;
	return 0;
}

static int read_login_token_url(struct reader *r, const char *key, const json_t *v)
{
	const char *s = json_string_value(v);

	if (!s || (strncmp(s, "https://", 8) && strncmp(s, "http://", 7)) ||
	    strpbrk(s, " \t\r\n#") || strlen(s) != json_string_length(v))
		return bad(r, key, ": must be an http:// or https:// URL");
	return read_string(r, key, v, &r->pv->login_token_url);
}

/* Whether the provider's env, or an account's (accounts.c), gives the token variable tv. */
static bool gives_token(const struct reader *r, const char *tv)
{
	const json_t *accs = json_object_get(r->conf, "accounts"), *a;
	const char *name;

	if (!tv)
		return false;
	if (strv_find(&r->pv->env_names, tv) >= 0)
		return true;
	json_object_foreach((json_t *)accs, name, a) {
		if (json_object_get(json_object_get(a, "env"), tv))
			return true;
	}
	return false;
}

/* "held" needs what lets the worker hold the login: upstream mode (the forwarder sets its
 * headers), no set_headers of the operator's, one login file or the type's token
 * variable (the provider's or its accounts'). Given, anything else is an error; by
 * default, the login stays "copy". */
static int check_login(struct reader *r)
{
	struct prov_provider *pv = r->pv;
	const char *tv = pv->ops && pv->ops->held ? pv->ops->held->token_env : NULL;
	const char *why = NULL;

	if (pv->login != PROV_LOGIN_HELD || !pv->ops)
		return 0;
	if (pv->ops->held && pv->net.mode == PROV_NET_UPSTREAM && !prov_net_secretless(&pv->net) &&
	    !r->strict)
		prov_login_note(pv, r->where);
	if (!pv->ops->held)
		why = ": \"held\" is for the claude and codex types' logins";
	else if (pv->net.mode != PROV_NET_UPSTREAM)
		why = ": \"held\" needs the network's upstream mode (the forwarder sets the "
		      "login's headers)";
	else if (prov_net_secretless(&pv->net))
		why = ": \"held\" and network.set_headers both set the credential; keep one";
	else if (pv->credentials_set && pv->cred_host.n != 1 && !gives_token(r, tv))
		why = ": \"held\" needs exactly one login file in \"credentials\"";
	if (!why)
		return 0;
	if (r->login_set)
		return bad(r, "login", "%s", why);
	pv->login = PROV_LOGIN_COPY;
	return 0;
}

/* The provider's login token as "file:/abs" (accounts.c checks an account's): read by the
 * worker at each run (prov_login_token_file_check). The type not known (config.json
 * checked alone): any type's token variable. */
static int check_token_file(struct reader *r)
{
	const struct prov_provider *pv = r->pv;
	const char *tv = pv->ops && pv->ops->held ? pv->ops->held->token_env : NULL;
	struct buf at = BUF_INIT;
	int ret = 0;

	for (size_t i = 0; !ret && i < pv->env_names.n; i++) {
		const char *name = pv->env_names.v[i];

		if (!prov_login_token_is_file(pv->env_values.v[i]) ||
		    (pv->ops ? !tv || strcmp(name, tv) : !prov_login_token_var(name)))
			continue;
		buf_addf(&at, "%s.env.%s", r->where, name);
		ret = prov_login_token_file_check(pv, pv->env_values.v[i], at.data, r->strict,
						  r->err);
	}
	buf_release(&at);
	return ret;
}

static const struct setting {
	const char *key;
	unsigned group;	 /* enum prov_setting, or 0 for every type */
	bool null_means; /* null is a value ("none"), not the default */
	int (*read)(struct reader *r, const char *key, const json_t *v);
} settings[] = {
	{ "timeout_s", 0, false, read_timeout },
	{ "max_concurrent", 0, false, read_max_concurrent },
	{ "limits", 0, false, read_limits },
	{ "prestart", 0, false, read_prestart },
	{ "network", 0, true, read_network },
	{ "env", 0, false, read_env },
	{ "argv", PROV_SET_COMMAND, false, read_argv },
	{ "ro_paths", PROV_SET_COMMAND, false, read_ro_paths },
	{ "output", PROV_SET_COMMAND, false, read_output },
	{ "bin", PROV_SET_CLI, false, read_bin },
	{ "credentials", PROV_SET_CLI, true, read_credentials },
	{ "credentials_writable", PROV_SET_CLI, false, read_writable },
	{ "max_retries", PROV_SET_MAX_RETRIES, false, read_max_retries },
	{ "system_prompt", PROV_SET_SYSTEM_PROMPT, false, read_system_prompt },
	{ "tools", PROV_SET_TOOLS, false, read_tools },
	{ "config_toml", PROV_SET_CONFIG_TOML, true, read_config_toml },
	{ "model_provider", PROV_SET_CONFIG_TOML, false, read_model_provider },
	{ "login", PROV_SET_CLI, false, read_login },
	{ "login_token_url", PROV_SET_CLI, false, read_login_token_url },
};

int prov_settings_read(struct prov_provider *pv, const json_t *conf, const char *where, bool strict,
		       struct buf *err)
{
	struct reader r = { .pv = pv, .where = where, .strict = strict, .err = err, .conf = conf };
	/* config.json's overrides are checked whatever their type */
	unsigned mask = pv->ops ? pv->ops->settings : PROV_SET_ALL;

	pv->timeout_ms = 600000;
	pv->max_concurrent = 4;
	pv->max_retries = -1;
	pv->prestart = pv->ops ? pv->ops->prestart : 0;
	pv->login = PROV_LOGIN_DEFAULT;
	for (size_t i = 0; i < ARRAY_SIZE(settings); i++) {
		const json_t *v = json_object_get(conf, settings[i].key);

		if ((settings[i].group && !(settings[i].group & mask)) || !v ||
		    (json_is_null(v) && !settings[i].null_means))
			continue;
		if (settings[i].read(&r, settings[i].key, v))
			return -EINVAL;
	}
	if (pv->ops && (pv->ops->settings & PROV_SET_COMMAND) && !pv->argv.n)
		return bad(&r, "argv", ": must be a non-empty array of strings");
	if (prov_net_read(pv, json_is_null(r.network) ? NULL : r.network, where, strict, err))
		return -EINVAL;
	if (check_login(&r) || check_token_file(&r))
		return -EINVAL;
	/* Last: each account's variant copies every other setting. */
	return prov_accounts_read(pv, conf, where, strict, err);
}

void prov_settings_release(struct prov_provider *pv)
{
	prov_accounts_release(pv);
	prov_net_release(&pv->net);
	strv_release(&pv->env_names);
	strv_release(&pv->env_values);
	strv_release(&pv->argv);
	strv_release(&pv->ro_paths);
	strv_release(&pv->cred_host);
	strv_release(&pv->cred_inside);
	free(pv->bin);
	free(pv->system_prompt);
	free(pv->tools);
	free(pv->config_toml);
	free(pv->model_provider);
	free(pv->login_token_url);
}

/* One providers.<name> override of config.json, whatever the provider's type: the
 * settings mean the same for every type that reads them. */
static int check_override(const char *name, const json_t *o, struct buf *err)
{
	struct prov_provider scratch = { 0 };
	struct buf where = BUF_INIT;
	int ret;

	buf_addf(&where, "providers.%.100s", name);
	if (!json_is_object(o)) {
		buf_addf(err, "%s: must be an object of settings", where.data);
		buf_release(&where);
		return -EINVAL;
	}
	ret = prov_settings_read(&scratch, o, where.data, true, err);
	prov_settings_release(&scratch);
	buf_release(&where);
	return ret;
}

int prov_config_check(const json_t *providers, struct buf *err)
{
	const json_t *v, *enabled;
	const char *name;
	size_t i;

	if (!providers)
		return 0;
	if (!json_is_object(providers)) {
		buf_adds(err, "providers: must be an object");
		return -EINVAL;
	}
	enabled = json_object_get(providers, "enabled");
	if (enabled && !json_is_array(enabled)) {
		buf_adds(err, "providers.enabled: must be an array of provider names");
		return -EINVAL;
	}
	json_array_foreach(enabled, i, v) {
		if (!json_is_string(v)) {
			buf_addf(err, "providers.enabled[%zu]: must be a provider name", i);
			return -EINVAL;
		}
	}
	json_object_foreach((json_t *)providers, name, v) {
		if (strcmp(name, "enabled") && check_override(name, v, err))
			return -EINVAL;
	}
	return 0;
}

/* The first token variable of env (an "env" object), or NULL. */
static const char *env_token_var(const json_t *env)
{
	const char *name;
	const json_t *v;

	json_object_foreach((json_t *)env, name, v) {
		/* "file:/abs": the token is in that file (checked when read), not here. */
		if (prov_login_token_var(name) && !prov_login_token_is_file(json_string_value(v)))
			return name;
	}
	return NULL;
}

/* Where providers gives a login token, as "providers.<name>[.accounts.<a>].env.<var>"
 * into at; false when it gives none. */
static bool find_token(const json_t *providers, struct buf *at)
{
	const json_t *pv, *acc;
	const char *name, *aname, *var;

	json_object_foreach((json_t *)providers, name, pv) {
		if ((var = env_token_var(json_object_get(pv, "env")))) {
			buf_addf(at, "providers.%.100s.env.%s", name, var);
			return true;
		}
		json_object_foreach(json_object_get(pv, "accounts"), aname, acc) {
			if ((var = env_token_var(json_object_get(acc, "env")))) {
				buf_addf(at, "providers.%.100s.accounts.%.100s.env.%s", name, aname,
					 var);
				return true;
			}
		}
	}
	return false;
}

int prov_config_check_file(const json_t *providers, const char *path, struct buf *err)
{
	struct buf at = BUF_INIT;
	struct stat st;
	int ret = 0;

	if (!json_is_object(providers) || !find_token(providers, &at))
		goto out;
	/* Every reader of the file could log in as that account: as a login file, the
	 * worker's and its group's only (ADR 0037). */
	if (stat(path, &st) || !S_ISREG(st.st_mode) || (st.st_mode & 0027)) {
		buf_addf(err,
			 "%s: %s is a login token: the file must be readable by its owner (and "
			 "group) only, and writable by its owner only (chmod 0600 or 0640)",
			 path, at.data);
		ret = -EINVAL;
	}
out:
	buf_release(&at);
	return ret;
}
