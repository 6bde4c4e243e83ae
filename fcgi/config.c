/* Configuration: OLP_HOME, $OLP_HOME/config.json and a few environment overrides. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fcgi/sizing.h"
#include "fcgi/worker.h"
#include "common/banned.h"

#ifndef OLP_DEFAULT_SANDBOX_EXEC
#define OLP_DEFAULT_SANDBOX_EXEC "/usr/lib/olp/olp-sandbox-exec"
#endif
#ifndef OLP_DEFAULT_REGISTRY
#define OLP_DEFAULT_REGISTRY "/usr/share/olp/models-registry.json"
#endif

static bool file_exists(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* A positive integer from the environment, or dflt. */
static uint64_t env_u64(const char *name, uint64_t dflt)
{
	const char *s = getenv(name);
	uint64_t v;

	return s && !parse_u64(s, &v) && v ? v : dflt;
}

static const char *conf_str(const json_t *root, const char *section, const char *key)
{
	return json_string_value(json_object_get(json_object_get(root, section), key));
}

/* A message about config.json: "<file>: " and then fmt, which starts with the JSON path
 * of the field. Returns -1. */
static int conf_err(const struct fcgi_config *c, struct buf *err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int conf_err(const struct fcgi_config *c, struct buf *err, const char *fmt, ...)
{
	va_list ap;

	buf_addf(err, "%s: ", c->path);
	va_start(ap, fmt);
	buf_vaddf(err, fmt, ap);
	va_end(ap);
	return -1;
}

/* The shape of config.json, checked once at start: a section is an object when present,
 * a setting has its type. A worker that would otherwise run on a default the operator did
 * not choose (a typo, "threads": "8") refuses to start, naming the file and the field.
 * What a setting may hold beyond its type is checked where it is read. */
static const struct {
	const char *section, *key;
	json_type type; /* JSON_OBJECT for a section (key NULL) */
} conf_shape[] = {
	{ "auth", NULL, JSON_OBJECT },
	{ "auth", "allow_anonymous", JSON_TRUE },
	{ "auth", "owner_only_endpoints", JSON_ARRAY },
	{ "auth", "anonymous", JSON_OBJECT },
	{ "server", NULL, JSON_OBJECT },
	{ "server", "route_prefix", JSON_STRING },
	{ "sandbox", NULL, JSON_OBJECT },
	{ "sandbox", "mode", JSON_STRING },
	{ "sandbox", "runtime_dir", JSON_STRING },
	{ "sandbox", "bwrap", JSON_STRING },
	{ "sandbox", "cgroup", JSON_STRING },
	{ "sandbox", "warm", JSON_TRUE },
	{ "sandbox", "identity", JSON_STRING },
	{ "sandbox", "uid_range", JSON_STRING },
	{ "providers", NULL, JSON_OBJECT },
	{ "routing", NULL, JSON_OBJECT },
	{ "routing", "chains", JSON_OBJECT },
	{ "usage", NULL, JSON_OBJECT },
	{ "usage", "enabled", JSON_TRUE },
	{ "audit", NULL, JSON_OBJECT },
};

static const char *type_name(json_type t)
{
	switch (t) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_TRUE:
	case JSON_FALSE: return "true or false";
	default: return "a number";
	}
}

static int check_shape(const struct fcgi_config *c, struct buf *err)
{
	for (size_t i = 0; i < ARRAY_SIZE(conf_shape); i++) {
		const json_t *sec = json_object_get(c->json, conf_shape[i].section);
		const json_t *v = conf_shape[i].key ? json_object_get(sec, conf_shape[i].key) : sec;
		json_type want = conf_shape[i].type, t;

		if (!v)
			continue;
		t = json_typeof(v);
		if (t == want || (want == JSON_TRUE && t == JSON_FALSE))
			continue;
		return conf_err(c, err, "%s%s%s: must be %s", conf_shape[i].section,
				conf_shape[i].key ? "." : "",
				conf_shape[i].key ? conf_shape[i].key : "", type_name(want));
	}
	return 0;
}

/* server.<key>: absent (dflt), or a positive integer. */
static int conf_count(const struct fcgi_config *c, const char *key, int64_t dflt, int64_t *out,
		      struct buf *err)
{
	const json_t *v = json_object_get(json_object_get(c->json, "server"), key);

	*out = dflt;
	if (!v || !parse_json_int(v, 1, INT64_MAX, out))
		return 0;
	return conf_err(c, err, "server.%s: must be a positive integer", key);
}

/* OLP_HOME, and config.json in it (an empty object when there is none). */
static int load_file(struct fcgi_config *c, struct buf *err)
{
	const char *home = getenv("OLP_HOME"), *s;
	json_error_t jerr;

	if (home && *home) {
		c->home = xstrdup(home);
	} else if ((s = getenv("HOME")) && *s) {
		c->home = path_join(s, ".olp");
	} else {
		buf_adds(err, "OLP_HOME is not set and there is no HOME to default to");
		return -1;
	}
	c->path = path_join(c->home, "config.json");
	if (!file_exists(c->path)) {
		c->json = json_object();
		return 0;
	}
	c->json = json_load_file(c->path, JSON_REJECT_DUPLICATES, &jerr);
	if (!c->json) {
		buf_addf(err, "%s:%d: %s", c->path, jerr.line, jerr.text);
		return -1;
	}
	if (!json_is_object(c->json))
		return conf_err(c, err, "must be a JSON object");
	return 0;
}

static int read_server(struct fcgi_config *c, struct buf *err)
{
	int64_t threads, max_body;
	const char *s;
	uint64_t u;

	/* 0: not set, sized to the machine by size_defaults. */
	if (conf_count(c, "threads", 0, &threads, err) ||
	    conf_count(c, "max_body_bytes", (int64_t)5 * 1024 * 1024, &max_body, err))
		return -1;
	/* Capped before it narrows: OLP_THREADS=4294967296 must not become 0 threads. */
	u = env_u64("OLP_THREADS", (uint64_t)threads);
	c->threads = u > 256 ? 256 : (unsigned)u;
	c->max_body = (size_t)max_body;
	s = getenv("OLP_ROUTE_PREFIX");
	if (!s)
		s = conf_str(c->json, "server", "route_prefix");
	c->route_prefix = xstrdup(s ? s : "");
	return 0;
}

/* streaming.heartbeat_interval_ms, as in the Node OLP: 0 turns heartbeats off. */
static int read_streaming(struct fcgi_config *c, struct buf *err)
{
	const json_t *v =
		json_object_get(json_object_get(c->json, "streaming"), "heartbeat_interval_ms");
	int64_t ms = 15000;

	/* At most a day: a longer silence is no heartbeat. */
	if (v && !json_is_null(v) && parse_json_int(v, 0, 86400000, &ms))
		return conf_err(c, err,
				"streaming.heartbeat_interval_ms: must be an integer from 0 (off) "
				"to 86400000");
	c->heartbeat_ms = (uint64_t)ms;
	return 0;
}

static int read_auth(struct fcgi_config *c, struct buf *err)
{
	const json_t *auth = json_object_get(c->json, "auth"), *v;
	size_t i;

	c->allow_anonymous = json_is_true(json_object_get(auth, "allow_anonymous"));
	json_array_foreach(json_object_get(auth, "owner_only_endpoints"), i, v) {
		/* Matched against the request's path, after the route prefix. */
		if (!json_is_string(v) || json_string_value(v)[0] != '/')
			return conf_err(c, err,
					"auth.owner_only_endpoints[%zu]: must be a path such as "
					"\"/v1/models\"",
					i);
		strv_push(&c->owner_only, json_string_value(v));
	}
	return 0;
}

/* auth.anonymous.quota: the limits of a key's manifest, each null (none) or an integer in
 * its range; anything else, an unknown limit included, stops the worker (a typo must not
 * lift a limit). */
static int read_anon_quota(struct fcgi_config *c, const json_t *q, struct buf *err)
{
	static const struct {
		const char *name;
		size_t off;
		int64_t max;
	} limits[] = {
		{ "requests_per_minute", offsetof(struct auth_quota, requests_per_minute),
		  AUTH_QUOTA_MAX },
		{ "requests_per_day", offsetof(struct auth_quota, requests_per_day),
		  AUTH_QUOTA_MAX },
		{ "tokens_per_day", offsetof(struct auth_quota, tokens_per_day), AUTH_QUOTA_MAX },
		{ "max_concurrent", offsetof(struct auth_quota, max_concurrent),
		  AUTH_QUOTA_CONCURRENT_MAX },
	};
	const char *k;
	const json_t *v;

	if (!q || json_is_null(q))
		return 0;
	if (!json_is_object(q))
		return conf_err(c, err, "auth.anonymous.quota: must be an object of limits");
	json_object_foreach((json_t *)q, k, v) {
		size_t i;

		for (i = 0; i < ARRAY_SIZE(limits) && strcmp(k, limits[i].name); i++)
			;
		if (i == ARRAY_SIZE(limits))
			return conf_err(c, err,
					"auth.anonymous.quota.%.100s: unknown limit "
					"(requests_per_minute, requests_per_day, tokens_per_day, "
					"max_concurrent)",
					k);
		if (!json_is_null(v) &&
		    parse_json_int(v, 1, limits[i].max,
				   (int64_t *)((char *)&c->anon_quota + limits[i].off)))
			return conf_err(
				c, err,
				"auth.anonymous.quota.%s: must be null or an integer from 1 "
				"to %lld",
				k, (long long)limits[i].max);
	}
	return 0;
}

/* auth.anonymous: {"providers": "*" or [names], "quota": {…}}, like a key's manifest. */
static int read_anonymous(struct fcgi_config *c, struct buf *err)
{
	const json_t *a = json_object_get(json_object_get(c->json, "auth"), "anonymous");
	const json_t *p = json_object_get(a, "providers"), *v;
	const char *k;
	size_t i;

	json_object_foreach((json_t *)a, k, v) {
		if (strcmp(k, "providers") && strcmp(k, "quota"))
			return conf_err(c, err,
					"auth.anonymous.%.100s: unknown setting (providers, quota)",
					k);
	}
	if (p && !json_is_null(p)) {
		c->anon_providers_set = true;
		c->anon_all = json_is_string(p) && !strcmp(json_string_value(p), "*");
		if (!c->anon_all && !json_is_array(p))
			return conf_err(c, err,
					"auth.anonymous.providers: must be \"*\" or an array of "
					"provider names");
		json_array_foreach(p, i, v) {
			if (!json_is_string(v) || !json_string_length(v))
				return conf_err(c, err,
						"auth.anonymous.providers[%zu]: must be a provider "
						"name",
						i);
			strv_push(&c->anon_providers, json_string_value(v));
		}
	}
	return read_anon_quota(c, json_object_get(a, "quota"), err);
}

/* Once the registry is known: the names given must be providers it serves, and never one
 * whose runs hold a login (anonymous callers never may); without a list, anonymous callers
 * get the providers that use no account of the owner's (local commands), none of the CLIs. */
static int bind_anonymous(struct fcgi_config *c, const struct prov_registry *reg, struct buf *err)
{
	size_t i, j, n = prov_registry_provider_count(reg);

	for (i = 0; !c->anon_providers_set && i < n; i++) {
		const struct prov_provider *pv = prov_registry_provider_at(reg, i);

		if (!prov_provider_uses_account(pv))
			strv_push(&c->anon_providers, prov_provider_name(pv));
	}
	for (i = 0; c->anon_providers_set && i < c->anon_providers.n; i++) {
		const char *name = c->anon_providers.v[i];
		const struct prov_provider *pv = NULL;

		for (j = 0; j < n && !pv; j++)
			if (!strcmp(prov_provider_name(prov_registry_provider_at(reg, j)), name))
				pv = prov_registry_provider_at(reg, j);
		if (!pv)
			return conf_err(
				c, err,
				"auth.anonymous.providers[%zu]: unknown provider \"%.100s\" "
				"(not in %s, or not served)",
				i, name, c->registry_path);
		if (prov_provider_login_exposed(pv))
			return conf_err(
				c, err,
				"auth.anonymous.providers[%zu]: provider \"%.100s\" runs "
				"commands with its login in the run; anonymous callers never "
				"get it",
				i, name);
	}
	return 0;
}

/* s is NULL (the setting is absent) or one of the NULL-terminated choices. */
static bool one_of(const char *s, const char *const choices[])
{
	for (size_t i = 0; s && choices[i]; i++)
		if (!strcmp(s, choices[i]))
			return true;
	return !s;
}

/* Pre-started provider processes (ADR 0022): how many may wait idle on the host, and for
 * how long; and how many warm sandboxes wait per policy. Left out, the counts are sized to
 * the machine (size_defaults). */
static int read_prestart(struct fcgi_config *c, const json_t *sbx, struct buf *err)
{
	const json_t *v = json_object_get(sbx, "prestart_max");
	int64_t n = 0;

	if (v && parse_json_int(v, 0, 64, &n))
		return conf_err(c, err,
				"sandbox.prestart_max: must be an integer from 0 (none) to 64");
	c->sandbox_prestart_set = v != NULL;
	c->sandbox_prestart_max = (unsigned)n;
	v = json_object_get(sbx, "prestart_idle_s");
	n = 300;
	if (v && parse_json_int(v, 1, 86400, &n))
		return conf_err(c, err,
				"sandbox.prestart_idle_s: must be an integer of seconds from 1 to "
				"86400");
	c->sandbox_prestart_idle_ms = (uint64_t)n * 1000;
	/* One key's share of them (sandbox/pool.c): a guest's churn cannot take them all. 0:
	 * half of prestart_max, rounded up. When prestart_max is sized, the sandbox caps the
	 * share at it. */
	v = json_object_get(sbx, "prestart_per_key");
	n = 0;
	if (v && (parse_json_int(v, 1, 64, &n) ||
		  (c->sandbox_prestart_set && n > c->sandbox_prestart_max)))
		return conf_err(c, err,
				"sandbox.prestart_per_key: must be an integer from 1 to "
				"sandbox.prestart_max (%u)",
				c->sandbox_prestart_set ? c->sandbox_prestart_max : 64);
	c->sandbox_prestart_per_key = (unsigned)n;
	/* A policy's warm sandboxes: 1 to SBX_WARM_PER_POLICY_MAX, or 0 (not set): sized. */
	v = json_object_get(sbx, "warm_per_policy");
	n = 0;
	if (v && parse_json_int(v, 1, SBX_WARM_PER_POLICY_MAX, &n))
		return conf_err(
			c, err,
			"sandbox.warm_per_policy: must be an integer from 1 to %d (sandbox.warm "
			"false turns them off)",
			SBX_WARM_PER_POLICY_MAX);
	c->sandbox_warm_per_policy = (unsigned)n;
	return 0;
}

static int read_sandbox(struct fcgi_config *c, struct buf *err)
{
	const json_t *sbx = json_object_get(c->json, "sandbox");
	const char *mode = conf_str(c->json, "sandbox", "mode");
	const char *cgroup = conf_str(c->json, "sandbox", "cgroup");
	const char *ident = conf_str(c->json, "sandbox", "identity"), *s;

	if (!one_of(mode, (const char *const[]){ "bwrap", "on", "off", NULL }))
		return conf_err(c, err,
				"sandbox.mode: must be \"bwrap\" or \"off\", not \"%.100s\"", mode);
	/* Resource control: a delegated cgroup v2 per run ("auto"), rlimits only ("off"), or
	 * a cgroup the operator prepared (docs/sandbox.md). */
	if (cgroup && !one_of(cgroup, (const char *const[]){ "auto", "off", NULL }) &&
	    cgroup[0] != '/')
		return conf_err(
			c, err,
			"sandbox.cgroup: must be \"auto\", \"off\" or an absolute path, not "
			"\"%.100s\"",
			cgroup);
	/* Whose uid a run is (ADR 0014): its own ("per_run"), or the worker's ("shared", an
	 * explicit and loudly reported weakening). */
	if (!one_of(ident, (const char *const[]){ "per_run", "shared", NULL }))
		return conf_err(
			c, err,
			"sandbox.identity: must be \"per_run\" or \"shared\", not \"%.100s\"",
			ident);
	c->sandbox_mode = mode && !strcmp(mode, "off") ? SBX_MODE_OFF : SBX_MODE_BWRAP;
	c->sandbox_cgroup = xstrdup(cgroup ? cgroup : "auto");
	c->sandbox_identity =
		ident && !strcmp(ident, "shared") ? SBX_IDENTITY_SHARED : SBX_IDENTITY_PER_RUN;
	s = conf_str(c->json, "sandbox", "runtime_dir");
	c->runtime_dir = s ? xstrdup(s) : path_join(c->home, "run");
	s = conf_str(c->json, "sandbox", "bwrap");
	if (!s)
		s = getenv("OLP_BWRAP");
	c->bwrap = xstrdup(s ? s : "/usr/bin/bwrap");
	/* Warm sandboxes (started ahead of the request that needs them) unless turned off. */
	c->sandbox_warm = !json_is_false(json_object_get(sbx, "warm"));
	if (read_prestart(c, sbx, err))
		return -1;
	s = getenv("OLP_SANDBOX_EXEC");
	c->sandbox_exec = xstrdup(s && *s ? s : OLP_DEFAULT_SANDBOX_EXEC);
	s = conf_str(c->json, "sandbox", "uid_range");
	c->sandbox_uid_range = s ? xstrdup(s) : NULL;
	return 0;
}

/* usage: the ledger and the quotas (ADR 0020). On unless turned off: a quota in a key's
 * manifest must not go unenforced because a setting was forgotten. */
static int read_usage(struct fcgi_config *c, struct buf *err)
{
	const json_t *u = json_object_get(c->json, "usage");
	const json_t *v = json_object_get(u, "retention_days");
	int64_t days = 0;

	c->usage_enabled = !json_is_false(json_object_get(u, "enabled"));
	/* A century at most: the number must fit the store's day arithmetic. */
	if (v && parse_json_int(v, 1, 36500, &days))
		return conf_err(c, err,
				"usage.retention_days: must be an integer from 1 to 36500 (days of "
				"ledger rows kept)");
	c->usage_retention_days = (unsigned)days;
	return 0;
}

/* store: the shared PostgreSQL store of several hosts (ADR 0034), where store/ says it
 * is (OLP_STORE over config.json "store", no password in it), and what a worker does
 * while it is away. */
static int read_store(struct fcgi_config *c, struct buf *err)
{
	const json_t *v;
	struct buf why = BUF_INIT;
	int64_t n;

	if (store_url_resolve(c->home, &c->store_url, &c->store_passfile, &why)) {
		/* The message names config.json already when the file is at fault. */
		buf_addf(err, "%s", why.data);
		buf_release(&why);
		return -1;
	}
	c->store_offline_keys_s = 300;
	c->store_buffer_rows = 10000;
	v = json_object_get(c->json, "store_offline_keys_s");
	n = 0;
	if (v && parse_json_int(v, 0, 86400, &n))
		return conf_err(c, err,
				"store_offline_keys_s: must be an integer from 0 to 86400 (seconds "
				"a key checked before the store went away keeps working)");
	if (v)
		c->store_offline_keys_s = (unsigned)n;
	v = json_object_get(c->json, "store_buffer_rows");
	if (v && parse_json_int(v, 1, 1000000, &n))
		return conf_err(
			c, err,
			"store_buffer_rows: must be an integer from 1 to 1000000 (ledger rows "
			"kept while the store is away)");
	if (v)
		c->store_buffer_rows = (unsigned)n;
	return 0;
}

/* audit: how large logs/audit.ndjson grows before it is rotated, and how many rotated files
 * are kept (ADR 0026: the log's disk use is bounded, about max_bytes * (keep + 1)). Strict:
 * a typo must not leave the log unbounded. */
static int read_audit(struct fcgi_config *c, struct buf *err)
{
	static const char *const known[] = { "max_bytes", "keep" };
	const json_t *a = json_object_get(c->json, "audit"), *v;
	const char *k;
	int64_t n;

	json_object_foreach((json_t *)a, k, v) {
		size_t i = 0;

		while (i < ARRAY_SIZE(known) && strcmp(k, known[i]))
			i++;
		if (i == ARRAY_SIZE(known))
			return conf_err(c, err, "audit.%.64s: unknown setting (max_bytes, keep)",
					k);
	}
	/* 64 KiB at least (a few dozen lines), 1 TiB at most. */
	v = json_object_get(a, "max_bytes");
	if (v && parse_json_int(v, 65536, INT64_C(1) << 40, &n))
		return conf_err(c, err,
				"audit.max_bytes: must be an integer of bytes from 65536 to "
				"1099511627776");
	c->audit_max_bytes = v ? (uint64_t)n : 0;
	v = json_object_get(a, "keep");
	if (v && parse_json_int(v, 1, 10000, &n))
		return conf_err(c, err,
				"audit.keep: must be an integer from 1 to 10000 (rotated files "
				"kept)");
	c->audit_keep = v ? (unsigned)n : 0;
	return 0;
}

/* metrics_token: lets a Prometheus server scrape GET /metrics without the owner's token.
 * Long enough not to be guessed, and only characters a header carries as they are. */
static int read_metrics(struct fcgi_config *c, struct buf *err)
{
	const json_t *v = json_object_get(c->json, "metrics_token");
	const char *s;

	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v))
		return conf_err(c, err, "metrics_token: must be a string");
	s = json_string_value(v);
	if (json_string_length(v) < 32)
		return conf_err(c, err, "metrics_token: must be at least 32 characters");
	for (const char *p = s; *p || p < s + json_string_length(v); p++)
		if (*p <= ' ' || *p > '~')
			return conf_err(c, err,
					"metrics_token: must be printable ASCII without spaces");
	c->metrics_token = xstrdup(s);
	return 0;
}

/* What was left out of threads, warm sandboxes and pre-started clients, sized to the machine;
 * what was chosen and why goes into c->sizing, for the start-up log. */
static void size_defaults(struct fcgi_config *c)
{
	struct fcgi_sizing set = { .threads = c->threads,
				   .warm_per_policy = c->sandbox_warm_per_policy,
				   .prestart_max = c->sandbox_prestart_max,
				   .prestart_set = c->sandbox_prestart_set },
			   out;
	struct fcgi_machine m;
	struct buf why = BUF_INIT;

	fcgi_machine_probe("/proc", "/sys/fs/cgroup", &m);
	fcgi_size(&m, &set, &out, &why);
	c->threads = out.threads;
	c->sandbox_warm_per_policy = out.warm_per_policy;
	c->sandbox_prestart_max = out.prestart_max;
	c->sizing = buf_detach(&why, NULL);
}

int fcgi_config_load(struct fcgi_config *c, struct buf *err)
{
	struct buf why = BUF_INIT;
	const char *s;

	memset(c, 0, sizeof(*c));
	strv_init(&c->owner_only);
	strv_init(&c->anon_providers);
	if (load_file(c, err) || check_shape(c, err))
		return -1;
	/* The providers' settings, whose meaning providers/ knows. */
	if (prov_config_check(json_object_get(c->json, "providers"), &why)) {
		conf_err(c, err, "%s", why.data);
		buf_release(&why);
		return -1;
	}
	/* A login token in it: the file must be as private as a login file (ADR 0037). */
	if (prov_config_check_file(json_object_get(c->json, "providers"), c->path, err))
		return -1;
	if (read_server(c, err) || read_streaming(c, err) || read_auth(c, err) ||
	    read_anonymous(c, err) || read_sandbox(c, err) || read_usage(c, err) ||
	    read_audit(c, err) || read_metrics(c, err) || read_store(c, err))
		return -1;
	size_defaults(c);
	/* $OLP_HOME/models-registry.json replaces the shipped default when present. */
	c->registry_path = path_join(c->home, "models-registry.json");
	if (!file_exists(c->registry_path)) {
		free(c->registry_path);
		s = getenv("OLP_REGISTRY");
		c->registry_path = xstrdup(s && *s ? s : OLP_DEFAULT_REGISTRY);
	}
	return 0;
}

/* One hop of routing.chains.<name>: {"model": id or alias, "provider": optional, and then
 * the model's own}. */
static int bind_hop(const struct fcgi_config *c, const struct prov_registry *reg, const char *name,
		    size_t i, const json_t *hop, struct fcgi_chain *ch, struct buf *err)
{
	const json_t *p = json_object_get(hop, "provider");
	const char *model = json_string_value(json_object_get(hop, "model"));
	const struct prov_model *m;

	if (!json_is_object(hop) || !model)
		return conf_err(c, err,
				"routing.chains.%.100s[%zu]: must be an object {\"provider\": …, "
				"\"model\": …}",
				name, i);
	if (p && !json_is_string(p))
		return conf_err(c, err, "routing.chains.%.100s[%zu].provider: must be a string",
				name, i);
	m = prov_registry_find(reg, model);
	if (!m)
		return conf_err(c, err,
				"routing.chains.%.100s[%zu]: unknown model \"%.200s\" (not in %s, "
				"or its provider is not served)",
				name, i, model, c->registry_path);
	if (p && strcmp(json_string_value(p), prov_provider_name(m->provider)))
		return conf_err(
			c, err,
			"routing.chains.%.100s[%zu]: model \"%.200s\" is served by provider "
			"\"%s\", not \"%.100s\"",
			name, i, model, prov_provider_name(m->provider), json_string_value(p));
	ch->hops[ch->nhops++] = m;
	return 0;
}

static int bind_chain(struct fcgi_config *c, const struct prov_registry *reg, const char *name,
		      const json_t *hops, struct buf *err)
{
	struct fcgi_chain *ch;
	const json_t *hop;
	size_t i;

	if (!json_is_array(hops) || !json_array_size(hops) || json_array_size(hops) > FCGI_MAX_HOPS)
		return conf_err(c, err, "routing.chains.%.100s: must be an array of 1 to %d hops",
				name, FCGI_MAX_HOPS);
	c->chains = xreallocarray(c->chains, c->nchains + 1, sizeof(*c->chains));
	ch = &c->chains[c->nchains++];
	*ch = (struct fcgi_chain){ .model = xstrdup(name) };
	json_array_foreach(hops, i, hop) {
		if (bind_hop(c, reg, name, i, hop, ch, err))
			return -1;
	}
	return 0;
}

int fcgi_config_bind(struct fcgi_config *c, const struct prov_registry *reg, struct buf *err)
{
	const json_t *chains = json_object_get(json_object_get(c->json, "routing"), "chains");
	const json_t *hops;
	const char *name;
	int ret = bind_anonymous(c, reg, err);

	json_object_foreach((json_t *)chains, name, hops) {
		if (ret || (ret = bind_chain(c, reg, name, hops, err)))
			break;
	}
	json_decref(c->json);
	c->json = NULL;
	return ret;
}

const struct fcgi_chain *fcgi_config_chain(const struct fcgi_config *c, const char *model)
{
	for (size_t i = 0; i < c->nchains; i++)
		if (!strcmp(c->chains[i].model, model))
			return &c->chains[i];
	return NULL;
}

bool fcgi_config_owner_only(const struct fcgi_config *c, const char *path)
{
	return strv_find(&c->owner_only, path) >= 0;
}

void fcgi_config_release(struct fcgi_config *c)
{
	for (size_t i = 0; i < c->nchains; i++)
		free(c->chains[i].model);
	free(c->chains);
	strv_release(&c->owner_only);
	strv_release(&c->anon_providers);
	free(c->home);
	free(c->path);
	json_decref(c->json);
	free(c->route_prefix);
	free(c->runtime_dir);
	free(c->bwrap);
	free(c->sandbox_exec);
	free(c->sandbox_uid_range);
	free(c->sandbox_cgroup);
	free(c->registry_path);
	free(c->sizing);
	if (c->metrics_token)
		explicit_bzero(c->metrics_token, strlen(c->metrics_token));
	free(c->metrics_token);
	free(c->store_url);
	free(c->store_passfile);
	memset(c, 0, sizeof(*c));
}
