/* Private to providers/: the provider table and the registry's layout. */
#ifndef OLP_PROVIDERS_INTERNAL_H
#define OLP_PROVIDERS_INTERNAL_H

#include "providers/providers.h"
#include "sandbox/sandbox.h"

/* What a provider wants run for one request; built by ops->plan, released by run.c. */
struct prov_plan {
	struct strv argv; /* argv.v is what runs: NULL-terminated once anything is pushed */
	struct buf stdin_data;
	struct sbx_policy *policy;
};

struct provider_ops {
	const char *type;
	unsigned caps; /* enum prov_caps */
	/* Build the run for req; 0 or -errno (out->message says why). -E2BIG: the request
	 * cannot be given to this provider (PROV_ERR_PROMPT_REFUSED, a 400); any other
	 * error is the provider's (PROV_ERR_SPAWN_FAILED). */
	int (*plan)(const struct prov_provider *pv, const struct prov_request *req,
		    struct prov_plan *plan, struct prov_outcome *out);
	/* Stream parser state for one run; never NULL (allocation failure aborts).
	 * pv: the provider whose output this parses (its configuration may choose the
	 * format), or NULL for the type's default (tests, fuzzing). */
	void *(*parser_new)(const struct prov_provider *pv);
	int (*parser_feed)(void *st, const char *data, size_t len, const struct prov_sink *sink);
	int (*parser_finish)(void *st, const struct prov_sink *sink);
	void (*parser_free)(void *st);
};

extern const struct provider_ops prov_command_ops;
extern const struct provider_ops prov_claude_ops, prov_codex_ops, prov_vibe_ops;

const struct provider_ops *prov_ops_for_type(const char *type);

/* How a command provider's stdout is read ("output"). */
enum prov_output { PROV_OUTPUT_TEXT, PROV_OUTPUT_SSE, PROV_OUTPUT_NDJSON };

/* One provider: its registry entry merged with config.json's overrides, checked and made
 * typed once, when it is loaded (settings.c); no plan or parser reads its JSON. Never
 * changed after that: the runs of many threads read it at once. The README and
 * docs/providers.md say what each setting means. */
struct prov_provider {
	char *name;
	char *type;
	char *display_name;
	const struct provider_ops *ops;
	uint64_t timeout_ms;	  /* "timeout_s" */
	struct sbx_limits limits; /* "limits"; 0 in a field: the sandbox's default */
	unsigned max_concurrent;  /* runs at once across the pool; 0 = no cap */
	bool network;		  /* "network": off by default for a command, on for a CLI */
	struct strv env_names;	  /* "env": the variables set in the child ... */
	struct strv env_values;	  /* ... and their values, in the same order */
	/* The command provider. */
	struct strv argv;     /* "argv": argv[0] is an absolute path */
	struct strv ro_paths; /* "ro_paths": absolute paths */
	enum prov_output output;
	/* The CLI providers (claude, codex, vibe). */
	bool credentials_set;	   /* "credentials" was given: else the type's defaults */
	bool credentials_writable; /* "credentials_writable" */
	bool config_toml_off;	   /* codex: "config_toml" false or null: none at all */
	char *bin;		   /* "bin", or NULL: OLP_<TYPE>_BIN, then PATH */
	struct strv cred_host;	   /* "credentials": host paths (absolute, or "~/" for HOME) ... */
	struct strv cred_inside;   /* ... and where each goes in the scratch home ("": its
				      place relative to HOME) */
	int64_t max_retries;	   /* claude, codex: "max_retries", or -1 for the default */
	char *system_prompt;	   /* claude: NULL for the built-in one */
	char *tools;		   /* claude: NULL for none ("") */
	char *config_toml;	   /* codex: NULL for ~/.codex/config.toml */
	char *model_provider;	   /* codex: a [model_providers.<id>] of config.toml, or NULL */
};

/* Read conf (the entry merged with its override) into pv's settings, whose type (pv->type)
 * is set; where starts every message ("<file>: providers.<name>"). A bad "timeout_s",
 * "max_concurrent" or "limits" field leaves its default with a warning unless strict;
 * any other bad setting, or any at all when strict, is an error: -EINVAL with err set to
 * "<where>.<key>…: <what it must be>". */
int prov_settings_read(struct prov_provider *pv, const json_t *conf, const char *where, bool strict,
		       struct buf *err);
/* Free what prov_settings_read allocated in pv. */
void prov_settings_release(struct prov_provider *pv);

/* Take one of pv's concurrency slots (slots.c): an fd to hand back to prov_slot_release,
 * PROV_SLOT_NONE when there is no cap, -EBUSY when all are taken, -errno on failure. */
#define PROV_SLOT_NONE (-1000)
int prov_slot_acquire(const struct prov_provider *pv);
void prov_slot_release(int fd);

void prov_plan_release(struct prov_plan *plan);

/* The tool-list files (toolfile.c): <state_dir>/tools, made 0700. 0 or -errno. */
int prov_toolfile_set_dir(const char *state_dir);
/* The file holding json (a request's tool list), written if it is not there yet; its path
 * into path. -ENOENT when no state dir was set, else 0 or -errno. */
int prov_toolfile_get(const char *json, size_t len, char *path, size_t size);

/* The text reader shared by plain-text outputs: emits deltas as bytes arrive, holding
 * back only an incomplete trailing UTF-8 sequence (at most 3 bytes). */
struct prov_text_reader {
	unsigned char held[4];
	size_t nheld;
};
int prov_text_feed(struct prov_text_reader *tr, const char *data, size_t len,
		   const struct prov_sink *sink);
int prov_text_finish(struct prov_text_reader *tr, const struct prov_sink *sink);

#endif
