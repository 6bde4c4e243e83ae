/* The models registry: models-registry.json in the Node OLP's format
 *   {"providers": {"<name>": {"displayName", "tier", "models": [{id, displayName,
 *     contextWindow, created}], "aliases": {"alias": "model-id"}, …}}}
 * plus "type" (defaulted from the name for the three CLI providers) and the settings of
 * "command" providers. */
#include <errno.h>
#include <fnmatch.h>
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

/* The provider types: one line each (internal.h, struct provider_ops). */
static const struct provider_ops *const all_ops[] = {
	&prov_command_ops,
	&prov_claude_ops,
	&prov_codex_ops,
	&prov_vibe_ops,
};

const struct provider_ops *prov_ops_at(size_t i)
{
	return i < ARRAY_SIZE(all_ops) ? all_ops[i] : NULL;
}

bool prov_login_token_var(const char *name)
{
	for (size_t i = 0; name && i < ARRAY_SIZE(all_ops); i++)
		if (all_ops[i]->held && all_ops[i]->held->token_env &&
		    !strcmp(all_ops[i]->held->token_env, name))
			return true;
	return false;
}

const struct provider_ops *prov_ops_for_type(const char *type)
{
	for (size_t i = 0; type && i < ARRAY_SIZE(all_ops); i++)
		if (!strcmp(all_ops[i]->type, type))
			return all_ops[i];
	return NULL;
}

/* The Node OLP names its providers, not their types; an entry with "argv" is of the type
 * that reads one. */
static const char *default_type(const char *name, const json_t *entry)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(all_ops); i++)
		if (all_ops[i]->node_name && !strcmp(all_ops[i]->node_name, name))
			return all_ops[i]->type;
	for (i = 0; json_object_get(entry, "argv") && i < ARRAY_SIZE(all_ops); i++)
		if (all_ops[i]->settings & PROV_SET_COMMAND)
			return all_ops[i]->type;
	return NULL;
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

void prov_provider_free(struct prov_provider *pv)
{
	if (!pv)
		return;
	prov_settings_release(pv);
	free(pv->name);
	free(pv->type);
	free(pv->display_name);
	free(pv);
}

/* Build provider name from its registry entry merged with config.json's override (or
 * NULL). path names the entry's file in messages, or is NULL. NULL, with what is wrong in
 * err, when the entry cannot be run. */
static struct prov_provider *provider_new(const char *name, const json_t *entry,
					  const json_t *override, const char *path, struct buf *err)
{
	const char *type = json_string_value(json_object_get(entry, "type"));
	const char *dn = json_string_value(json_object_get(entry, "displayName"));
	struct buf where = BUF_INIT;
	struct prov_provider *pv = NULL;
	json_t *conf;

	if (path)
		buf_addf(&where, "%s: ", path);
	if (!valid_provider_name(name)) {
		buf_addf(err,
			 "%sprovider name \"%.100s\" is not 1-%d characters of [A-Za-z0-9._-] "
			 "starting with a letter or digit",
			 where.data, name, MAX_PROVIDER_NAME);
		goto out_where;
	}
	buf_addf(&where, "providers.%s", name);
	if (!type)
		type = default_type(name, entry);
	if (!type) {
		buf_addf(err, "%s: no \"type\" and no \"argv\"", where.data);
		goto out_where;
	}
	if (!prov_ops_for_type(type)) {
		buf_addf(err, "%s.type: \"%.100s\" is a type this build does not run yet",
			 where.data, type);
		goto out_where;
	}
	pv = xcalloc(1, sizeof(*pv));
	pv->name = xstrdup(name);
	pv->type = xstrdup(type);
	pv->display_name = xstrdup(dn ? dn : name);
	pv->ops = prov_ops_for_type(type);
	/* What runs is the entry with config.json's overrides: read that, not the entry. */
	conf = json_deep_copy(entry);
	if (!conf)
		abort(); /* jansson's allocation failed */
	if (json_is_object(override))
		json_object_update(conf, (json_t *) override);
	if (prov_settings_read(pv, conf, where.data, false, err)) {
		prov_provider_free(pv);
		pv = NULL;
	}
	json_decref(conf);
out_where:
	buf_release(&where);
	return pv;
}

struct prov_provider *prov_provider_from_json(const char *name, const json_t *entry,
					      struct buf *err)
{
	struct prov_provider *pv;

	if (!json_is_object(entry)) {
		buf_addf(err, "providers.%.100s: must be an object", name);
		errno = EINVAL;
		return NULL;
	}
	pv = provider_new(name, entry, NULL, NULL, err);
	if (!pv)
		errno = EINVAL;
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
		prov_provider_free(reg->providers[i]);
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

/* Add the models of one provider; duplicates keep the first definition. path: the
 * registry's, for messages. */
static void add_models(struct prov_registry *reg, struct prov_provider *pv, const json_t *models,
		       const char *path)
{
	const json_t *m;
	size_t i;

	json_array_foreach(models, i, m) {
		const char *id = json_string_value(json_object_get(m, "id"));
		const char *dn = json_string_value(json_object_get(m, "displayName"));
		struct prov_model *nm;

		if (!id || !*id) {
			log_warnx(NULL, "%s: providers.%s.models[%zu]: no \"id\"; skipped", path,
				  pv->name, i);
			continue;
		}
		if (!valid_model_id(id)) {
			log_warnx(NULL,
				  "%s: providers.%s.models[%zu]: model id \"%.150s\" is not 1-%d "
				  "characters of [A-Za-z0-9._:/@-] starting with a letter or "
				  "digit; skipped",
				  path, pv->name, i, id, MAX_MODEL_ID);
			continue;
		}
		if (find_id(reg, id)) {
			log_warnx(NULL,
				  "%s: providers.%s.models[%zu]: model %s defined twice; the first "
				  "one is used",
				  path, pv->name, i, id);
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
			const json_t *aliases, const char *path)
{
	const char *alias;
	const json_t *target;

	json_object_foreach((json_t *)aliases, alias, target) {
		const struct prov_model *m =
			json_is_string(target) ? find_id(reg, json_string_value(target)) : NULL;
		struct prov_alias *na;

		if (!valid_name(alias, MAX_MODEL_ID, "._:/@-*")) {
			log_warnx(NULL,
				  "%s: providers.%s.aliases: alias \"%.150s\" is not 1-%d "
				  "characters of [A-Za-z0-9._:/@-*] starting with a letter or "
				  "digit; skipped",
				  path, pv->name, alias, MAX_MODEL_ID);
			continue;
		}
		if (!m || m->provider != pv) {
			log_warnx(NULL,
				  "%s: providers.%s.aliases.%s: names no model of this provider; "
				  "skipped",
				  path, pv->name, alias);
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

	json_array_foreach(list, i, v)
		if (json_is_string(v) && !strcmp(json_string_value(v), name))
			return true;
	return false;
}

struct prov_registry *prov_registry_load(const char *path, const json_t *config_providers,
					 struct buf *err)
{
	struct buf why = BUF_INIT;
	struct prov_registry *reg;
	json_error_t jerr;
	json_t *root, *providers, *entry;
	const json_t *enabled;
	const char *name;

	if (prov_config_check(config_providers, err))
		return NULL;
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
	if (prov_config_check_file(providers, path, err)) {
		json_decref(root);
		return NULL;
	}
	reg = xcalloc(1, sizeof(*reg));
	enabled = json_object_get(config_providers, "enabled");
	json_object_foreach(providers, name, entry) {
		struct prov_provider *pv, **np;

		if (!json_is_object(entry)) {
			log_warnx(NULL, "%s: providers.%.100s: must be an object; skipped", path,
				  name);
			continue;
		}
		if (json_is_array(enabled) && !name_in(enabled, name)) {
			log_info(NULL, "%s: provider %s is not in providers.enabled; skipped", path,
				 name);
			continue;
		}
		buf_reset(&why);
		pv = provider_new(name, entry, json_object_get(config_providers, name), path, &why);
		if (!pv) {
			log_warnx(NULL, "%s; skipped", why.data);
			continue;
		}
		/* NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers */
		np = xreallocarray(reg->providers, reg->nproviders + 1, sizeof(*np));
		reg->providers = np;
		reg->providers[reg->nproviders++] = pv;
		add_models(reg, pv, json_object_get(entry, "models"), path);
		add_aliases(reg, pv, json_object_get(entry, "aliases"), path);
	}
	buf_release(&why);
	json_decref(root);
	return reg;
}

/* The alias pattern (a name with '*') that matches id with the most literal characters
 * (the first such when two tie), or NULL. */
static const struct prov_alias *find_pattern(const struct prov_registry *reg, const char *id)
{
	const struct prov_alias *best = NULL;
	size_t best_len = 0;

	for (size_t i = 0; i < reg->naliases; i++) {
		const struct prov_alias *al = &reg->aliases[i];
		size_t lit = 0;

		if (!strchr(al->name, '*') || fnmatch(al->name, id, 0))
			continue;
		for (const char *p = al->name; *p; p++)
			lit += *p != '*';
		if (!best || lit > best_len) {
			best = al;
			best_len = lit;
		}
	}
	return best;
}

const struct prov_model *prov_registry_find(const struct prov_registry *reg, const char *id)
{
	const struct prov_model *m = find_id(reg, id);
	const struct prov_alias *al;

	for (size_t i = 0; !m && i < reg->naliases; i++)
		if (!strcmp(reg->aliases[i].name, id))
			m = &reg->models[reg->aliases[i].model];
	if (!m && (al = find_pattern(reg, id)))
		m = &reg->models[al->model];
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

unsigned prov_provider_caps(const struct prov_provider *pv)
{
	return pv->ops->caps;
}

void prov_cap_refusal(const struct prov_provider *pv, unsigned cap, const char *model,
		      struct buf *out)
{
	bool tools = cap == PROV_CAP_TOOLS;
	const char *sep = "";

	buf_addf(out, "model '%.200s' (provider type %s) %s; only ", model, pv->type,
		 tools ? "cannot take tools" : "takes no images");
	for (size_t i = 0; i < ARRAY_SIZE(all_ops); i++)
		if (all_ops[i]->caps & cap) {
			buf_addf(out, "%s%s", sep, all_ops[i]->type);
			sep = " or ";
		}
	buf_adds(out, tools ? " models can" : " models do");
	if (tools && pv->ops->no_tools_why)
		buf_addf(out, " (%s)", pv->ops->no_tools_why);
}

const char *prov_provider_display_name(const struct prov_provider *pv)
{
	return pv->display_name;
}

uint64_t prov_provider_timeout_ms(const struct prov_provider *pv)
{
	return pv->timeout_ms;
}

unsigned prov_provider_prestart(const struct prov_provider *pv)
{
	return pv->prestart;
}

const struct sbx_limits *prov_provider_limits(const struct prov_provider *pv)
{
	return &pv->limits;
}
