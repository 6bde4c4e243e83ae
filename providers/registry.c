/* The models registry: models-registry.json in the Node OLP's format
 *   {"providers": {"<name>": {"displayName", "tier", "models": [{id, displayName,
 *     contextWindow, created}], "aliases": {"alias": "model-id"}, …}}}
 * plus "type" (defaulted from the name for the three CLI providers) and the settings of
 * "command" providers. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "providers/internal.h"
#include "common/banned.h"

struct prov_alias {
	char *name;
	size_t model; /* index into models: the array moves while it grows */
};

struct prov_registry {
	struct prov_provider **providers;
	size_t nproviders;
	struct prov_model *models;
	size_t nmodels;
	struct prov_alias *aliases;
	size_t naliases;
};

static const struct provider_ops *const all_ops[] = { &prov_command_ops, &prov_claude_ops,
						      &prov_codex_ops, &prov_vibe_ops };

const struct provider_ops *prov_ops_for_type(const char *type)
{
	for (size_t i = 0; type && i < ARRAY_SIZE(all_ops); i++)
		if (!strcmp(all_ops[i]->type, type))
			return all_ops[i];
	return NULL;
}

/* The Node OLP names its providers, not their types. */
static const char *default_type(const char *name, const json_t *entry)
{
	if (!strcmp(name, "anthropic"))
		return "claude";
	if (!strcmp(name, "openai"))
		return "codex";
	if (!strcmp(name, "mistral"))
		return "vibe";
	return json_object_get(entry, "argv") ? "command" : NULL;
}

/* Registry names reach HTTP response headers (X-OLP-Provider-Used, X-OLP-Model-Used), file
 * names (a provider's concurrency slots, <provider>.<n>.slot) and logs, so each is checked
 * at load and an entry that fails is skipped with a warning: a CR/LF in an id would
 * otherwise let whoever writes the registry add headers (Set-Cookie) to every answer, and
 * a "/" or ".." in a provider name would point its slots outside their directory.
 *  - A model id or alias: 1-128 characters of [A-Za-z0-9._:/@-], the first a letter or a
 *    digit. That covers the ids of OpenAI (gpt-4o-2024-08-06, ft:gpt-4o-mini:org::id),
 *    Anthropic, Mistral, Ollama (qwen2.5:7b) and Hugging Face (org/model).
 *  - A provider name: 1-64 characters of [A-Za-z0-9._-], the first a letter or a digit. */
#define MAX_MODEL_ID 128
#define MAX_PROVIDER_NAME 64

static bool ascii_alnum(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

static bool valid_name(const char *s, size_t max, const char *punct)
{
	size_t n;

	if (!s || !ascii_alnum(s[0]))
		return false;
	for (n = 0; s[n]; n++)
		if (n >= max || (!ascii_alnum(s[n]) && !strchr(punct, s[n])))
			return false;
	return true;
}

static bool valid_model_id(const char *s)
{
	return valid_name(s, MAX_MODEL_ID, "._:/@-");
}

static bool valid_provider_name(const char *s)
{
	return valid_name(s, MAX_PROVIDER_NAME, "._-");
}

static bool is_abs_string(const json_t *v)
{
	return json_is_string(v) && json_string_value(v)[0] == '/';
}

/* Check what a command provider entry must hold; the plan trusts it afterwards. */
static const char *check_command(const json_t *e)
{
	const json_t *argv = json_object_get(e, "argv"), *v, *env, *ro;
	const char *k;
	size_t i;

	if (!json_is_array(argv) || !json_array_size(argv))
		return "\"argv\" must be a non-empty array of strings";
	if (!is_abs_string(json_array_get(argv, 0)))
		return "argv[0] must be an absolute path";
	json_array_foreach(
		argv, i,
		v) if (!json_is_string(v)) return "\"argv\" must be a non-empty array of strings";
	ro = json_object_get(e, "ro_paths");
	if (ro && !json_is_array(ro))
		return "\"ro_paths\" must be an array of absolute paths";
	json_array_foreach(
		ro, i,
		v) if (!is_abs_string(v)) return "\"ro_paths\" must be an array of absolute paths";
	env = json_object_get(e, "env");
	if (env && !json_is_object(env))
		return "\"env\" must be an object of strings";
	json_object_foreach(
		(json_t *)env, k,
		v) if (!json_is_string(v)) return "\"env\" must be an object of strings";
	return NULL;
}

static void provider_free(struct prov_provider *pv)
{
	if (!pv)
		return;
	free(pv->name);
	free(pv->type);
	free(pv->display_name);
	json_decref(pv->conf);
	free(pv);
}

static uint64_t seconds_to_ms(const json_t *v, uint64_t dflt)
{
	double s;

	if (!json_is_number(v))
		return dflt;
	s = json_number_value(v);
	if (!(s > 0) || s > 86400.0 * 7)
		return dflt;
	/* 0 would mean "no limit" to the sandbox: the smallest limit is 1 ms. */
	return s * 1000.0 < 1.0 ? 1 : (uint64_t)(s * 1000.0);
}

/* "limits": {"memory_mb": 2048, "pids": 256, "cpu_pct": 100, "nofile": 4096, "fsize_mb": 1024,
 * "cpu_s": 600, "as_mb": 8192, "nproc": 256, "disk_mb": 1024}: each optional, an integer
 * from 1 to MAX_LIMIT; a bad one is ignored with a warning (the default holds). MAX_LIMIT
 * is far above any host and keeps the sandbox's conversions (MB to bytes, percent to
 * microseconds) from wrapping around to a small limit. */
#define MAX_LIMIT ((int64_t)1 << 40)

static void read_limits(const char *name, const json_t *j, struct sbx_limits *l)
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

	memset(l, 0, sizeof(*l));
	if (!json_is_object(j))
		return;
	for (size_t i = 0; i < ARRAY_SIZE(fields); i++) {
		const json_t *v = json_object_get(j, fields[i].key);
		int64_t n;

		if (!v)
			continue;
		if (parse_json_int(v, 1, MAX_LIMIT, &n)) {
			log_warnx(NULL,
				  "registry: provider %s: limits.%s must be an integer from 1 to "
				  "%lld; the default holds",
				  name, fields[i].key, (long long)MAX_LIMIT);
			continue;
		}
		*(uint64_t *)((char *)l + fields[i].off) = (uint64_t)n;
	}
}

static struct prov_provider *provider_new(const char *name, const json_t *entry,
					  const json_t *override)
{
	struct prov_provider *pv;
	const char *type = json_string_value(json_object_get(entry, "type"));
	const char *why, *dn;
	int64_t mc;

	if (!valid_provider_name(name)) {
		log_warnx(NULL,
			  "registry: provider name \"%.100s\" is not 1-%d characters of "
			  "[A-Za-z0-9._-] starting with a letter or digit; skipped",
			  name, MAX_PROVIDER_NAME);
		return NULL;
	}
	if (!type)
		type = default_type(name, entry);
	if (!type) {
		log_warnx(NULL, "registry: provider %s has no \"type\" and no \"argv\"; skipped",
			  name);
		return NULL;
	}
	if (!prov_ops_for_type(type)) {
		log_warnx(NULL,
			  "registry: provider %s has type \"%s\", which this build does not "
			  "run yet; skipped",
			  name, type);
		return NULL;
	}
	pv = xcalloc(1, sizeof(*pv));
	/* What runs is the entry with config.json's overrides: check that, not the entry. */
	pv->conf = json_deep_copy(entry);
	if (!pv->conf)
		abort(); /* jansson's allocation failed */
	if (json_is_object(override))
		json_object_update(pv->conf, (json_t *) override);
	if (!strcmp(type, "command") && (why = check_command(pv->conf))) {
		log_warnx(NULL, "registry: provider %s: %s; skipped", name, why);
		provider_free(pv);
		return NULL;
	}
	pv->name = xstrdup(name);
	pv->type = xstrdup(type);
	dn = json_string_value(json_object_get(entry, "displayName"));
	pv->display_name = xstrdup(dn ? dn : name);
	pv->ops = prov_ops_for_type(type);
	pv->timeout_ms = seconds_to_ms(json_object_get(pv->conf, "timeout_s"), 600000);
	pv->network = json_is_true(json_object_get(pv->conf, "network"));
	read_limits(name, json_object_get(pv->conf, "limits"), &pv->limits);
	pv->max_concurrent =
		parse_json_int(json_object_get(pv->conf, "max_concurrent"), 0, 1024, &mc)
			? 4
			: (unsigned)mc;
	return pv;
}

void prov_registry_free(struct prov_registry *reg)
{
	size_t i;

	if (!reg)
		return;
	for (i = 0; i < reg->nmodels; i++) {
		free((char *)reg->models[i].id);
		free((char *)reg->models[i].display_name);
	}
	for (i = 0; i < reg->naliases; i++)
		free(reg->aliases[i].name);
	for (i = 0; i < reg->nproviders; i++)
		provider_free(reg->providers[i]);
	free(reg->models);
	free(reg->aliases);
	free(reg->providers);
	free(reg);
}

static const struct prov_model *find_id(const struct prov_registry *reg, const char *id)
{
	for (size_t i = 0; i < reg->nmodels; i++)
		if (!strcmp(reg->models[i].id, id))
			return &reg->models[i];
	return NULL;
}

/* Add the models of one provider; duplicates keep the first definition. */
static void add_models(struct prov_registry *reg, struct prov_provider *pv, const json_t *models)
{
	const json_t *m;
	size_t i;

	json_array_foreach(models, i, m)
	{
		const char *id = json_string_value(json_object_get(m, "id"));
		const char *dn = json_string_value(json_object_get(m, "displayName"));
		struct prov_model *nm;

		if (!id || !*id) {
			log_warnx(NULL, "registry: provider %s: a model without \"id\"; skipped",
				  pv->name);
			continue;
		}
		if (!valid_model_id(id)) {
			log_warnx(NULL,
				  "registry: provider %s: model id \"%.150s\" is not 1-%d "
				  "characters of [A-Za-z0-9._:/@-] starting with a letter or "
				  "digit; skipped",
				  pv->name, id, MAX_MODEL_ID);
			continue;
		}
		if (find_id(reg, id)) {
			log_warnx(NULL, "registry: model %s defined twice; the first one is used",
				  id);
			continue;
		}
		reg->models = xreallocarray(reg->models, reg->nmodels + 1, sizeof(*nm));
		nm = &reg->models[reg->nmodels++];
		*nm = (struct prov_model){
			.id = xstrdup(id),
			.display_name = dn ? xstrdup(dn) : NULL,
			.provider = pv,
		};
		/* Both optional: 0 (unknown) unless a non-negative integer. */
		(void)parse_json_int(json_object_get(m, "created"), 0, INT64_MAX, &nm->created);
		(void)parse_json_int(json_object_get(m, "contextWindow"), 0, INT64_MAX,
				     &nm->context_window);
	}
}

static void add_aliases(struct prov_registry *reg, const struct prov_provider *pv,
			const json_t *aliases)
{
	const char *alias;
	const json_t *target;

	json_object_foreach((json_t *)aliases, alias, target)
	{
		const struct prov_model *m =
			json_is_string(target) ? find_id(reg, json_string_value(target)) : NULL;
		struct prov_alias *na;

		if (!valid_model_id(alias)) {
			log_warnx(NULL,
				  "registry: provider %s: alias \"%.150s\" is not 1-%d characters "
				  "of [A-Za-z0-9._:/@-] starting with a letter or digit; skipped",
				  pv->name, alias, MAX_MODEL_ID);
			continue;
		}
		if (!m || m->provider != pv) {
			log_warnx(NULL,
				  "registry: alias %s of provider %s names no model of it; "
				  "skipped",
				  alias, pv->name);
			continue;
		}
		reg->aliases = xreallocarray(reg->aliases, reg->naliases + 1, sizeof(*na));
		na = &reg->aliases[reg->naliases++];
		na->name = xstrdup(alias);
		na->model = (size_t)(m - reg->models);
	}
}

static bool name_in(const json_t *list, const char *name)
{
	const json_t *v;
	size_t i;

	json_array_foreach(list, i, v) if (json_is_string(v) &&
					   !strcmp(json_string_value(v), name)) return true;
	return false;
}

struct prov_registry *prov_registry_load(const char *path, const json_t *config_providers,
					 struct buf *err)
{
	struct prov_registry *reg;
	json_error_t jerr;
	json_t *root, *providers, *entry;
	const json_t *enabled;
	const char *name;

	root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		buf_addf(err, "%s:%d: %s", path, jerr.line, jerr.text);
		return NULL;
	}
	providers = json_object_get(root, "providers");
	if (!json_is_object(providers)) {
		buf_addf(err, "%s: no \"providers\" object", path);
		json_decref(root);
		return NULL;
	}
	reg = xcalloc(1, sizeof(*reg));
	enabled = json_object_get(config_providers, "enabled");
	json_object_foreach(providers, name, entry)
	{
		struct prov_provider *pv;

		if (!json_is_object(entry))
			continue;
		if (json_is_array(enabled) && !name_in(enabled, name)) {
			log_info(NULL, "registry: provider %s is not in providers.enabled; skipped",
				 name);
			continue;
		}
		pv = provider_new(name, entry, json_object_get(config_providers, name));
		if (!pv)
			continue;
		reg->providers =
			xreallocarray(reg->providers, reg->nproviders + 1, sizeof(*reg->providers));
		reg->providers[reg->nproviders++] = pv;
		add_models(reg, pv, json_object_get(entry, "models"));
		add_aliases(reg, pv, json_object_get(entry, "aliases"));
	}
	json_decref(root);
	return reg;
}

const struct prov_model *prov_registry_find(const struct prov_registry *reg, const char *id)
{
	const struct prov_model *m = find_id(reg, id);

	for (size_t i = 0; !m && i < reg->naliases; i++)
		if (!strcmp(reg->aliases[i].name, id))
			m = &reg->models[reg->aliases[i].model];
	return m;
}

size_t prov_registry_model_count(const struct prov_registry *reg)
{
	return reg->nmodels;
}

const struct prov_model *prov_registry_model_at(const struct prov_registry *reg, size_t i)
{
	return i < reg->nmodels ? &reg->models[i] : NULL;
}

size_t prov_registry_provider_count(const struct prov_registry *reg)
{
	return reg->nproviders;
}

const struct prov_provider *prov_registry_provider_at(const struct prov_registry *reg, size_t i)
{
	return i < reg->nproviders ? reg->providers[i] : NULL;
}

const char *prov_provider_name(const struct prov_provider *pv)
{
	return pv->name;
}

const char *prov_provider_type(const struct prov_provider *pv)
{
	return pv->type;
}

const char *prov_provider_display_name(const struct prov_provider *pv)
{
	return pv->display_name;
}

uint64_t prov_provider_timeout_ms(const struct prov_provider *pv)
{
	return pv->timeout_ms;
}

const struct sbx_limits *prov_provider_limits(const struct prov_provider *pv)
{
	return &pv->limits;
}
