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

static char *path_join(const char *a, const char *b)
{
	struct buf p = BUF_INIT;

	buf_addf(&p, "%s/%s", a, b);
	return buf_detach(&p, NULL);
}

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

int olp_config_load(struct olp_config *c, struct buf *err)
{
	const char *home = getenv("OLP_HOME"), *s;
	json_error_t jerr;
	const json_t *server;
	char *path;
	int64_t n;
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
	if (file_exists(path)) {
		c->json = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
		if (!c->json || !json_is_object(c->json)) {
			buf_addf(err, "%s:%d: %s", path, jerr.line,
				 c->json ? "must be a JSON object" : jerr.text);
			free(path);
			return -1;
		}
	} else {
		c->json = json_object();
	}
	free(path);

	server = json_object_get(c->json, "server");
	if (parse_json_int(json_object_get(server, "threads"), 1, INT64_MAX, &n))
		n = 16;
	/* Capped before it narrows: OLP_THREADS=4294967296 must not become 0 threads. */
	u = env_u64("OLP_THREADS", (uint64_t)n);
	c->threads = u > 256 ? 256 : (unsigned)u;
	if (parse_json_int(json_object_get(server, "max_body_bytes"), 1, INT64_MAX, &n))
		n = (int64_t)5 * 1024 * 1024;
	c->max_body = (size_t)n;
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
		buf_addf(err, "config.json: sandbox.mode must be \"bwrap\" or \"off\", not \"%s\"",
			 s);
		return -1;
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
			 "config.json: sandbox.cgroup must be \"auto\", \"off\" or an absolute "
			 "path, not \"%s\"",
			 s);
		return -1;
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
		buf_addf(err,
			 "config.json: sandbox.identity must be \"per_run\" or \"shared\", not "
			 "\"%s\"",
			 s);
		return -1;
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
		return -1;
	}
	return 0;
}

void olp_config_release(struct olp_config *c)
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
