/* Configuration: OLP_HOME, $OLP_HOME/config.json and a few environment overrides. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* The shape of config.json, checked once at start: a section is an object when present,
 * a setting has its type. A worker that would otherwise run on a default the operator did
 * not choose (a typo, "threads": "8") refuses to start, naming the file and the field. */
static const struct {
	const char *section, *key;
	json_type type; /* JSON_OBJECT for a section (key NULL) */
} conf_shape[] = {
	{ "auth", NULL, JSON_OBJECT },
	{ "auth", "allow_anonymous", JSON_TRUE },
	{ "auth", "owner_only_endpoints", JSON_ARRAY },
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

static int check_shape(const json_t *root, const char *path, struct buf *err)
{
	for (size_t i = 0; i < ARRAY_SIZE(conf_shape); i++) {
		const json_t *sec = json_object_get(root, conf_shape[i].section);
		const json_t *v = conf_shape[i].key ? json_object_get(sec, conf_shape[i].key) : sec;
		json_type want = conf_shape[i].type, t;

		if (!v)
			continue;
		t = json_typeof(v);
		if (t == want || (want == JSON_TRUE && t == JSON_FALSE))
			continue;
		buf_addf(err, "%s: %s%s%s must be %s", path, conf_shape[i].section,
			 conf_shape[i].key ? "." : "", conf_shape[i].key ? conf_shape[i].key : "",
			 type_name(want));
		return -1;
	}
	return 0;
}

/* server.<key>: absent (dflt), or a positive integer. */
static int conf_count(const json_t *root, const char *key, int64_t dflt, const char *path,
		      int64_t *out, struct buf *err)
{
	const json_t *v = json_object_get(json_object_get(root, "server"), key);

	*out = dflt;
	if (!v || !parse_json_int(v, 1, INT64_MAX, out))
		return 0;
	buf_addf(err, "%s: server.%s must be a positive integer", path, key);
	return -1;
}

int fcgi_config_load(struct fcgi_config *c, struct buf *err)
{
	const char *home = getenv("OLP_HOME"), *s;
	json_error_t jerr;
	char *path;
	int64_t n, m;
	uint64_t u;

	memset(c, 0, sizeof(*c));
	if (home && *home) {
		c->home = strdup(home);
	} else if ((s = getenv("HOME")) && *s) {
		c->home = path_join(s, ".olp");
	} else {
		buf_adds(err, "OLP_HOME is not set and there is no HOME to default to");
		return -1;
	}
	path = path_join(c->home, "config.json");
	if (!path) {
		buf_adds(err, "out of memory");
		return -1;
	}
	if (file_exists(path)) {
		c->json = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
		if (!c->json || !json_is_object(c->json)) {
			buf_addf(err, "%s:%d: %s", path, jerr.line,
				 c->json ? "must be a JSON object" : jerr.text);
			goto fail;
		}
	} else {
		c->json = json_object();
	}
	if (check_shape(c->json, path, err) || conf_count(c->json, "threads", 16, path, &n, err) ||
	    conf_count(c->json, "max_body_bytes", (int64_t)5 * 1024 * 1024, path, &m, err))
		goto fail;
	/* Capped before it narrows: OLP_THREADS=4294967296 must not become 0 threads. */
	u = env_u64("OLP_THREADS", (uint64_t)n);
	c->threads = u > 256 ? 256 : (unsigned)u;
	c->max_body = (size_t)m;
	s = getenv("OLP_ROUTE_PREFIX");
	if (!s)
		s = conf_str(c->json, "server", "route_prefix");
	c->route_prefix = strdup(s ? s : "");
	c->allow_anonymous =
		json_is_true(json_object_get(json_object_get(c->json, "auth"), "allow_anonymous"));

	s = conf_str(c->json, "sandbox", "mode");
	if (s && !strcmp(s, "off")) {
		c->sandbox_mode = SBX_MODE_OFF;
	} else if (s && strcmp(s, "bwrap") && strcmp(s, "on")) {
		buf_addf(err, "%s: sandbox.mode must be \"bwrap\" or \"off\", not \"%s\"", path, s);
		goto fail;
	}
	s = conf_str(c->json, "sandbox", "runtime_dir");
	c->runtime_dir = s ? strdup(s) : path_join(c->home, "run");
	s = conf_str(c->json, "sandbox", "bwrap");
	if (!s)
		s = getenv("OLP_BWRAP");
	c->bwrap = strdup(s ? s : "/usr/bin/bwrap");
	/* Resource control: a delegated cgroup v2 per run ("auto"), rlimits only ("off"), or
	 * a cgroup the operator prepared (docs/sandbox.md). */
	s = conf_str(c->json, "sandbox", "cgroup");
	if (s && strcmp(s, "auto") && strcmp(s, "off") && s[0] != '/') {
		buf_addf(err,
			 "%s: sandbox.cgroup must be \"auto\", \"off\" or an absolute path, not "
			 "\"%s\"",
			 path, s);
		goto fail;
	}
	c->sandbox_cgroup = strdup(s ? s : "auto");
	/* Warm sandboxes (started ahead of the request that needs them) unless turned off. */
	c->sandbox_warm =
		!json_is_false(json_object_get(json_object_get(c->json, "sandbox"), "warm"));
	s = getenv("OLP_SANDBOX_EXEC");
	c->sandbox_exec = strdup(s && *s ? s : OLP_DEFAULT_SANDBOX_EXEC);
	/* Whose uid a run is (ADR 0013): its own ("per_run"), or the worker's ("shared", an
	 * explicit and loudly reported weakening). */
	s = conf_str(c->json, "sandbox", "identity");
	if (s && strcmp(s, "per_run") && strcmp(s, "shared")) {
		buf_addf(err, "%s: sandbox.identity must be \"per_run\" or \"shared\", not \"%s\"",
			 path, s);
		goto fail;
	}
	c->sandbox_identity =
		s && !strcmp(s, "shared") ? SBX_IDENTITY_SHARED : SBX_IDENTITY_PER_RUN;
	s = conf_str(c->json, "sandbox", "uid_range");
	c->sandbox_uid_range = s ? strdup(s) : NULL;

	/* $OLP_HOME/models-registry.json replaces the shipped default when present. */
	c->registry_path = path_join(c->home, "models-registry.json");
	if (!file_exists(c->registry_path)) {
		free(c->registry_path);
		s = getenv("OLP_REGISTRY");
		c->registry_path = strdup(s && *s ? s : OLP_DEFAULT_REGISTRY);
	}
	if (!c->home || !c->route_prefix || !c->runtime_dir || !c->bwrap || !c->registry_path ||
	    !c->sandbox_cgroup) {
		buf_adds(err, "out of memory");
		goto fail;
	}
	free(path);
	return 0;
fail:
	free(path);
	return -1;
}

void fcgi_config_release(struct fcgi_config *c)
{
	free(c->home);
	json_decref(c->json);
	free(c->route_prefix);
	free(c->runtime_dir);
	free(c->bwrap);
	free(c->sandbox_exec);
	free(c->sandbox_uid_range);
	free(c->sandbox_cgroup);
	free(c->registry_path);
	memset(c, 0, sizeof(*c));
}
