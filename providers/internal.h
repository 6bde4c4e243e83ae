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
	/* Build the run for req; 0 or -errno (out->message says why). */
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

struct prov_provider {
	char *name;
	char *type;
	char *display_name;
	const struct provider_ops *ops;
	json_t *conf; /* the registry entry, merged with config.json overrides */
	uint64_t timeout_ms;
	bool network;
	struct sbx_limits limits; /* "limits" of its config; 0 = the sandbox's default */
	unsigned max_concurrent;  /* runs at once across the pool; 0 = no cap */
};

/* Take one of pv's concurrency slots (slots.c): an fd to hand back to prov_slot_release,
 * PROV_SLOT_NONE when there is no cap, -EBUSY when all are taken, -errno on failure. */
#define PROV_SLOT_NONE (-1000)
int prov_slot_acquire(const struct prov_provider *pv);
void prov_slot_release(int fd);

void prov_plan_release(struct prov_plan *plan);

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
