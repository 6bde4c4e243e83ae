/* providers: which models exist, and how a chat request becomes a provider run.
 *
 * A provider is a `const struct provider_ops` table (providers/internal.h): it turns a
 * validated request into a plan (argv, environment, stdin bytes, sandbox needs) and the
 * child's stdout, fed incrementally, into events. The process handling that all providers
 * share (sandbox policy, supervision, outcome mapping) lives once, in run.c. A provider's
 * settings are checked and typed once, when it is loaded (settings.c): a plan never reads
 * JSON, so a bad setting is found at start, not by a request.
 * This module knows nothing of FastCGI or HTTP; it speaks the OpenAI chat shapes only as
 * far as messages and finish reasons go. */
#ifndef OLP_PROVIDERS_H
#define OLP_PROVIDERS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "egress/egress.h"
#include "sandbox/sandbox.h"

/* ---- registry ----------------------------------------------------------------------- */

struct prov_provider; /* opaque: one providers.<name> entry */

/* One model of the registry; plain data owned by the registry. */
struct prov_model {
	const char *id;
	const char *display_name; /* may be NULL */
	int64_t created;	  /* unix seconds; 0 when unknown */
	int64_t context_window;	  /* 0 when unknown */
	const struct prov_provider *provider;
};

struct prov_registry;

/* Check config.json's "providers" object (NULL: there is none) once, at start: "enabled"
 * is an array of provider names; every other member is an object of one provider's
 * overrides whose settings (README, docs/providers.md) have their types. Unknown keys are
 * left alone. 0, or -EINVAL with err set to "providers.<name>.<key>…: <what it must
 * be>" (the caller adds the file's name). */
int prov_config_check(const json_t *providers, struct buf *err);

/* A file whose "providers" object (providers) gives a login's long-lived token
 * (providers.<name>.env or providers.<name>.accounts.<account>.env, claude's
 * CLAUDE_CODE_OAUTH_TOKEN; ADR 0037) holds a secret: path must then be a regular file
 * that others cannot read and the group cannot write (mode 0600 or 0640), as a login
 * file. 0 (also when it gives none), or -EINVAL with err set to "<path>: ..." naming
 * the first such member. */
int prov_config_check_file(const json_t *providers, const char *path, struct buf *err);

/* Load a models registry (Node OLP format plus "command" providers) from path.
 * config_providers is config.json's "providers" object (or NULL): "enabled" and
 * per-provider overrides, which replace the entry's settings of the same name; it must
 * pass prov_config_check, else NULL with that check's message in err. Every setting is
 * checked and typed here, once: an entry of an unknown type, or with a bad setting, is
 * skipped with a warning naming the file and the JSON path (a bad "timeout_s",
 * "max_concurrent" or "limits" field only leaves its default, with a warning). Reads
 * both; keeps neither. NULL on failure with the reason in err. The caller frees the
 * registry with prov_registry_free (NULL is fine). */
struct prov_registry *prov_registry_load(const char *path, const json_t *config_providers,
					 struct buf *err);
void prov_registry_free(struct prov_registry *reg);
/* The models and providers these return, and their strings, belong to the registry:
 * valid until prov_registry_free, never changed, safe to read from any thread.
 * Find a model by id or alias; NULL when unknown. An alias with '*' is a pattern
 * (fnmatch): "claude-opus-*" takes the ids a client brings of its own (Claude Code's,
 * codex's), tried after every exact id and alias, the one with the most literal
 * characters first. */
const struct prov_model *prov_registry_find(const struct prov_registry *reg, const char *id);
size_t prov_registry_model_count(const struct prov_registry *reg);
const struct prov_model *prov_registry_model_at(const struct prov_registry *reg, size_t i);
size_t prov_registry_provider_count(const struct prov_registry *reg);
const struct prov_provider *prov_registry_provider_at(const struct prov_registry *reg, size_t i);

/* A provider's strings and limits belong to it. */
const char *prov_provider_name(const struct prov_provider *pv); /* "local", "anthropic" */
const char *prov_provider_type(const struct prov_provider *pv); /* "command", "claude" */
const char *prov_provider_display_name(const struct prov_provider *pv);
uint64_t prov_provider_timeout_ms(const struct prov_provider *pv);
/* What a provider's runs can take beyond text (a request that needs more is the caller's
 * to refuse, naming the field, before any run). */
enum prov_caps {
	PROV_CAP_IMAGES = 1 << 0, /* image_url parts (checked data: URLs) in user messages */
	PROV_CAP_TOOLS = 1 << 1,  /* the client's function tools (prov_request.tools) */
};
unsigned prov_provider_caps(const struct prov_provider *pv);
/* Why pv's runs cannot take cap (PROV_CAP_TOOLS or PROV_CAP_IMAGES) for model, appended to
 * out as the client is told: "model '<model>' (provider type <type>) cannot take tools;
 * only <the types that can> models can", with the type's own reason when it has one. */
void prov_cap_refusal(const struct prov_provider *pv, unsigned cap, const char *model,
		      struct buf *out);
/* Its "prestart": how many processes of a run it keeps started ahead per key (sandbox
 * policy + argv; ADR 0022), 0 = none. */
unsigned prov_provider_prestart(const struct prov_provider *pv);
/* Whether its runs use an account of the owner's upstream (claude, codex, vibe: a login or
 * an API key), as a local command's do not: what anonymous callers get by default. */
bool prov_provider_uses_account(const struct prov_provider *pv);
/* Whether its runs hold its login where a prompt can read it: its CLI runs commands (codex,
 * vibe, claude with its own "tools" on) and credential files are bound into the run (not
 * secretless, not "credentials": []). Such a provider serves only callers that may hold
 * its login (auth_identity_may_hold_login; ADR 0025). From its settings alone. */
bool prov_provider_login_exposed(const struct prov_provider *pv);
/* A provider's login as the owner's /health shows it (ADR 0036). From its settings, its
 * login file (the expiry) and the host's refresh state file; never a token. */
struct prov_login_info {
	const char *mode;	  /* "held", "copy", or NULL: its runs hold no login */
	const char *warning;	  /* why a login is copied into its runs, or NULL */
	int64_t expires_ms;	  /* held: when the access token expires, epoch ms; 0 = unknown */
	int64_t last_refresh_ms;  /* held: the host's last refresh, epoch ms; 0 = none */
	int64_t refresh_failures; /* held: failed refreshes since the last that worked */
	char last_error[160];	  /* held: what the last failure was, or "" */
};
void prov_provider_login_info(const struct prov_provider *pv, struct prov_login_info *out);
/* A held login as a run of pv would get it now (tools and tests; prov_set_state_dir first):
 * the placeholder file the run is given, its path into path (PATH_MAX; written when
 * missing or half a day old) ... */
int prov_provider_held_placeholder(const struct prov_provider *pv, char *path, struct buf *why);
/* ... and the headers its forwarder sets (names and values pushed onto the strvs, the
 * values secrets: wipe them), the login refreshed first when it expires within 15
 * minutes. 0; -ENOENT when the host has no login; -EINVAL when pv does not hold its
 * login; or -errno with why set. */
int prov_provider_held_headers(const struct prov_provider *pv, const char *rid, struct strv *names,
			       struct strv *values, struct buf *why);
/* Its "limits" (0 in a field: the sandbox's default). */
const struct sbx_limits *prov_provider_limits(const struct prov_provider *pv);

/* How a provider's runs reach the network ("network"; docs/providers.md), for /health
 * and the start-up log. The strings belong to the provider. */
struct prov_net_info {
	const char *mode;	   /* "none", "host", "upstream" or "connect" */
	const char *upstream_host; /* upstream mode: "api.anthropic.com", else NULL */
	bool secretless;	   /* the run holds no API credential: the worker adds it */
};
void prov_provider_net_info(const struct prov_provider *pv, struct prov_net_info *out);

/* Whether a provider could run here now, for the owner's /health and dashboard: its
 * program found (a CLI's "bin", OLP_<TYPE>_BIN or PATH; a command's argv[0]) and its
 * credentials file(s) present. Looks at the file system (stat), reads nothing; the answer
 * is kept for PROV_CLI_STATE_TTL_MS per provider (a stat per provider and request cost
 * ~3% of a worker's time under a /health load), so a change shows within that. */
#define PROV_CLI_STATE_TTL_MS 1000
struct prov_cli_state {
	bool cli_found;
	const char *credentials; /* "present", "missing", or "not_needed" (a command, or a
				    secretless upstream: the worker holds the credential) */
};
void prov_provider_cli_state(const struct prov_provider *pv, struct prov_cli_state *out);

/* One provider without a registry, for tests, fuzzing and tools: entry is what
 * models-registry.json holds under providers.<name> ("models" and "aliases" are not
 * read), checked as prov_registry_load checks it. Copies what it keeps of name and entry;
 * the caller keeps both. NULL with errno EINVAL and the reason in err when the entry
 * would be skipped. The caller frees the provider with prov_provider_free. */
struct prov_provider *prov_provider_from_json(const char *name, const json_t *entry,
					      struct buf *err);
/* Free a provider from prov_provider_from_json (never one of a registry's); NULL is
 * fine. */
void prov_provider_free(struct prov_provider *pv);

/* ---- accounts (accounts.c, ADR 0037) ---------------------------------------------------- */

/* An account name: 1..PROV_ACCOUNT_NAME_MAX of [a-z0-9_-]. */
#define PROV_ACCOUNT_NAME_MAX 32
bool prov_account_name_ok(const char *s);
/* A provider's accounts ("accounts"; without it one, "default"): how many (>= 1), the
 * i-th name (in the order the configuration lists them; NULL past the end), and the one a
 * request that names none uses ("default_account"). The strings belong to the provider. */
size_t prov_provider_account_count(const struct prov_provider *pv);
const char *prov_provider_account_at(const struct prov_provider *pv, size_t i);
const char *prov_provider_default_account(const struct prov_provider *pv);
/* The account a provider (as prov_provider_for_account returned it) runs with. */
const char *prov_provider_account(const struct prov_provider *pv);
/* The provider as a run of account (NULL: the default) sees it: its own login dir or
 * credential sources, its held login, its limits state. NULL when pv has no such account.
 * Belongs to pv's registry. */
const struct prov_provider *prov_provider_for_account(const struct prov_provider *pv,
						      const char *account);

/* ---- requests and events ------------------------------------------------------------ */

/* tool_choice, when there are tools ("none" means no tools at all: tools is NULL). */
enum prov_tool_choice {
	PROV_TOOLS_AUTO = 0, /* the model may call tools or answer in text */
	PROV_TOOLS_REQUIRED, /* it is told it must call at least one */
	PROV_TOOLS_NAMED,    /* it is told it must call tool_name */
};

/* A request already validated by the caller. Borrowed pointers, valid during prov_run. */
struct prov_request {
	const struct prov_model *model;
	const char *model_name; /* as the client asked (alias or id) */
	const json_t *messages; /* array of {role, content[, name, tool_call_id, tool_calls]} */
	int64_t max_tokens;	/* 0 = not set */
	const char *request_id;
	/* The provider's account the run uses (prov_provider_account_at's names); NULL: its
	 * default account. A name the provider does not have fails the run (AUTH_MISSING). */
	const char *account;
	/* The client's function tools, checked: a non-empty array of {"type":"function",
	 * "function":{"name","description"?,"parameters"?}} with distinct names of
	 * [a-zA-Z0-9_-]{1,64}; NULL for none. Only a provider with PROV_CAP_TOOLS gets any.
	 * It declares them to the model, never runs one: a call the model makes is reported
	 * (PROV_EV_TOOL_CALL) and the run ends with finish_reason "tool_calls". */
	const json_t *tools;
	enum prov_tool_choice tool_choice;
	const char *tool_name; /* PROV_TOOLS_NAMED: one of tools' names */
	/* Who asked (the API key's id; NULL = nobody in particular), for the sandbox's pools:
	 * the processes a run leaves started ahead serve only later runs of the same owner,
	 * and each owner has a share of them (sbx_run_options.owner_tag). */
	const char *owner;
	/* > 0: that owner's share of pre-started processes is at most this (its
	 * max_concurrent), so that the one started after each run counts against it. */
	unsigned owner_prestart_max;
	/* The caller owns the provider's login (the owner tier): only its runs write a
	 * changed credentials file back ("credentials_writable"); every other run gets a
	 * copy that is dropped with the run. */
	bool login_owner;
	/* The run's deadline (mono_ms), computed once by the caller when the run starts
	 * (its write deadline for the answer is the same): the process is ended there
	 * (PROV_ERR_SPAWN_TIMEOUT), its forwarder gives up then, and a cold run after a
	 * failed pre-started one gets what is left of it. 0: prov_run takes the provider's
	 * timeout from its own start. */
	uint64_t deadline_ms;
};

struct prov_usage {
	bool present;
	/* Reported before the end: the prompt's count as the provider's API gave it when the
	 * message started (claude's message_start); completion_tokens is not known yet. A
	 * later report replaces it. */
	bool partial;
	/* Some of the counts are OLP's estimate, 4 bytes a token of what the CLI was given
	 * and what it wrote: the run was cut (a stop sequence, the client gone, the timeout)
	 * or failed after output, before its provider said what it used (prov_run). The
	 * ledger and the quotas count them as they count reported ones. */
	bool estimated;
	int64_t prompt_tokens;
	int64_t completion_tokens;
	int64_t total_tokens;
	int64_t cached_tokens;
};

enum prov_error {
	PROV_OK = 0,
	PROV_ERR_AUTH_MISSING,	/* the provider client has no credentials */
	PROV_ERR_SPAWN_FAILED,	/* the command could not be started */
	PROV_ERR_SPAWN_TIMEOUT, /* the wall-clock limit was reached */
	PROV_ERR_CONCURRENCY_LIMIT,
	PROV_ERR_PROVIDER_ERROR, /* the command failed (non-zero exit, error event) */
	PROV_ERR_SANDBOX,	 /* the sandbox could not start: fail closed */
	PROV_ERR_CLIENT_GONE,	 /* the sink aborted: nobody is listening any more */
	PROV_ERR_PROMPT_REFUSED, /* the request cannot be given to this provider (a prompt
				    longer than its command line takes): the client's to fix */
};

/* A failure the provider reported in its own output (an upstream 429, "Not logged in"),
 * as opposed to one seen from outside (exit status, timeout). */
struct prov_failure {
	enum prov_error err; /* PROV_ERR_PROVIDER_ERROR or PROV_ERR_AUTH_MISSING */
	int upstream_status; /* the provider API's HTTP status when the output names it
				     (401, 429, 500…), else 0 */
	const char *message; /* client-safe, written by the parser: never the upstream's
				     own error text, which may name internal URLs */
};

enum prov_event_kind {
	PROV_EV_DELTA,	/* text: a piece of the answer, valid UTF-8, never split mid-character */
	PROV_EV_USAGE,	/* usage: token counts reported by the provider */
	PROV_EV_FINISH, /* finish_reason: "stop", "length", … */
	PROV_EV_ERROR,	/* failure: the provider reported that the request failed */
	/* A piece of a function call of the model's: the first piece of call tool_index
	 * (0, 1, … in the order the calls start) carries tool_id and tool_name (the client's
	 * own name); text/len hold a piece of its JSON arguments (maybe empty). */
	PROV_EV_TOOL_CALL,
};

struct prov_event {
	enum prov_event_kind kind;
	const char *text;
	size_t len;
	unsigned tool_index;
	const char *tool_id;   /* PROV_EV_TOOL_CALL: set on a call's first piece, else NULL */
	const char *tool_name; /* ditto */
	const struct prov_usage *usage;
	const char *finish_reason;
	const struct prov_failure *failure;
};

/* Where events go. emit returns 0 to go on, < 0 to abort the run (client gone). emit runs
 * on the run's own thread, and the run's clock is not looked at while it runs: an emit
 * that waits (for a slow client) must give up by the run's deadline — the request's
 * deadline_ms, or timeout_ms (prov_provider_timeout_ms) after prov_run was called — and
 * abort, or the run, its process tree and its concurrency slot outlast the timeout. Every
 * callback runs on the thread that called prov_run. */
struct prov_outcome;
struct prov_sink {
	int (*emit)(void *ctx, const struct prov_event *ev);
	/* Optional: called exactly once by prov_run with the final outcome, as soon as it is
	 * known — possibly before the provider's sandbox is torn down — so that the answer
	 * can be finished without waiting for the cleanup. */
	void (*done)(void *ctx, const struct prov_outcome *o);
	/* Optional: how the provider's process came to be (cold, warm, or pre-started), once
	 * per process and before any event of it; again (cold) when a pre-started run that
	 * failed before any output is run again cold. */
	void (*start)(void *ctx, enum sbx_start start);
	/* Optional: the caller's periodic work (a keep-alive to its client), with the time
	 * (mono_ms), while the provider's process runs and while its sandbox is torn down
	 * (sbx_callbacks.on_tick): first as the process starts, then whenever the time it
	 * returned last has come. Returns the next time it wants, 0 for never. It waits as
	 * emit does (by the run's deadline at most). */
	uint64_t (*tick)(void *ctx, uint64_t now_ms);
	void *ctx;
};

/* ---- parsers (a provider's stdout → events), exposed for tests and fuzzing ------------ */
/* The longest line a line-based output (claude, codex, vibe, a command's sse or ndjson)
 * may have: claude repeats the whole answer in its "assistant" and "result" lines,
 * JSON-escaped, and this is far above any real answer. A longer line ends the answer
 * with a provider error: a client that never sends "\n" must not make a worker buffer its
 * whole output. */
#define PROV_MAX_OUTPUT_LINE ((size_t)8 << 20)

struct prov_parser;
/* A parser for a provider type ("command") in its default configuration, or NULL when
 * the type is unknown. The caller frees a parser with prov_parser_free. */
struct prov_parser *prov_parser_new(const char *type);
/* A parser for pv's output, configured as pv's runs are (a command provider's "output"
 * mode). pv must outlive it. Never NULL. */
struct prov_parser *prov_parser_for(const struct prov_provider *pv);
/* Feed the next bytes of stdout; events go to sink. Returns the sink's < 0 value when it
 * aborted; > 0 when the answer is complete (e.g. claude's "result" line): the rest of the
 * output is not needed and the caller may end the run now (prov_run does, which saves
 * waiting for the client to exit); else 0. Once it returned > 0, further bytes are
 * ignored. */
int prov_parser_feed(struct prov_parser *ps, const char *data, size_t len,
		     const struct prov_sink *sink);
/* End of output: flush what is held back (e.g. a trailing partial UTF-8 sequence).
 * > 0 when the end of output completed the answer (codex stopped at the client's tool
 * calls): prov_run then takes the run for a success whatever its exit status; else 0, or
 * the sink's < 0. */
int prov_parser_finish(struct prov_parser *ps, const struct prov_sink *sink);
void prov_parser_free(struct prov_parser *ps);

/* Flatten chat messages into one prompt as the Node OLP does: parts joined by a blank
 * line, user text as is, "[System] …", "[Assistant] …", "[Tool Result (name, id)] …"
 * (the name from the message, else from the assistant call of that id). An assistant's
 * tool_calls become "[Assistant called tool NAME (id ID) with arguments: ARGS]". Image
 * parts have no text form and are left out. */
void prov_flatten_messages(const json_t *messages, struct buf *out);
/* The same prompt as Anthropic content blocks, appended to the array blocks: the text as
 * text blocks, cut where an image part of a user message stands, which becomes an image
 * block ({"type":"image","source":{"type":"base64","media_type","data"}}). The image
 * parts must be checked data: URLs (fcgi_chat_parse does). */
void prov_flatten_blocks(const json_t *messages, json_t *blocks);

/* response_format: what the answer must be. */
enum prov_format {
	PROV_FORMAT_TEXT = 0,
	PROV_FORMAT_JSON_OBJECT, /* one JSON object */
	PROV_FORMAT_JSON_SCHEMA, /* JSON matching a client's schema */
};

/* No CLI has a JSON mode a run can switch on, so the format is asked for in words, as
 * the Node OLP does: messages plus a last system message saying to answer with JSON only
 * (for PROV_FORMAT_JSON_SCHEMA, with schema — {"name", "schema", …} as the client sent
 * it — in it). A new reference (the caller decrefs it); messages itself when format is
 * PROV_FORMAT_TEXT (a new reference too). Never NULL (allocation failure aborts). */
json_t *prov_format_messages(const json_t *messages, enum prov_format format, const json_t *schema);

/* Where the pool's worker processes share state (the per-provider concurrency slots, in
 * <dir>/slots; the accounts' subscription limits, in <dir>/limits): the same directory for every process of the pool. Without it there is no
 * concurrency cap. 0 or -errno. */
int prov_set_state_dir(const char *dir);
/* Say what the operator should know of the providers' configuration at start (vibe: where
 * its config.toml's api_base must point), once per web server run across the workers that
 * share dir (the same dir as above; NULL: say it), and only for a program that is
 * installed (notes.c). */
void prov_registry_notes(const struct prov_registry *reg, const char *dir);

/* ---- subscription limits, per account (limits.c, ADR 0035) -------------------------- */

/* The account a provider's runs use. Today each provider has one set of credentials, its
 * "default" account; the state below is keyed by provider and account so that named
 * accounts (issue 26 item 1) only add keys. */
#define PROV_ACCOUNT_DEFAULT "default"

/* The latest the upstream said of an account's limits, as every worker of the host sees
 * it: one small file per account in <state dir>/limits, replaced whole (rename) with
 * each answer that announced something, so that a reader sees one answer's state or the
 * one before, never a mix. */
struct prov_limits {
	/* What the last answer said; a window it did not name keeps an earlier answer's
	 * values (win_seen_ms says when each was named). */
	struct egr_ratelimit rl;
	int64_t seen_ms;		  /* when the last answer was read, wall clock ms */
	int64_t win_seen_ms[EGR_RL_NWIN]; /* when each window was last named (0: never) */
};

/* The state of provider's account: 0, -ENOENT (nothing seen yet, or no state dir), or
 * -errno. Cheap (one small file read): called before each run. */
int prov_limits_get(const char *provider, const char *account, struct prov_limits *out);
/* Merge what one answer said into the account's state (egress calls this through the
 * run's forwarder; tests call it directly). 0 or -errno. provider and account are plain
 * file name parts ([A-Za-z0-9_.-], not starting with '.', 64 bytes at most): -EINVAL
 * otherwise. */
int prov_limits_put(const char *provider, const char *account, const struct egr_ratelimit *rl);
/* Whether the upstream refused the account until a time still to come (status
 * "rejected", reset after now_s): true with *retry_s, the seconds until then (>= 1). A
 * rejection without a reset, or whose reset has passed, blocks nothing. */
bool prov_limits_blocked(const struct prov_limits *st, int64_t now_s, int64_t *retry_s);

/* ---- which account a request uses (sticky.c, ADR 0037) --------------------------------- */

/* How long an unbound caller keeps the account it was given (while that is not rejected). */
#define PROV_STICKY_S ((int64_t)6 * 3600)
/* Whether the upstream rejected pv's account until a time after now_s (prov_limits_blocked
 * of its state): true with *retry_s. */
bool prov_account_blocked(const struct prov_provider *pv, const char *account, int64_t now_s,
			  int64_t *retry_s);
/* The account a request of caller who (a key id; NULL: nobody in particular) that is not
 * bound to one uses: the one it was given before, kept for every worker of the host
 * (<state dir>/accounts), while that is not rejected and for PROV_STICKY_S; else the next
 * of pv's accounts not rejected, which becomes the kept one. 0 with *account (pv's
 * string), or -EBUSY when every account is rejected, with *retry_s the soonest reset. */
int prov_account_choose(const struct prov_provider *pv, const char *who, int64_t now_s,
			const char **account, int64_t *retry_s);

/* ---- the shared store of several hosts (pg.c; ADR 0034, 0035 and 0037 amendments) ---- */

struct store_db;     /* store/store.h */
struct store_schema; /* store/store.h */

/* The "providers" schema of the shared store (olp_account_limits, olp_account_choices),
 * for olp-keys store init. */
const struct store_schema *prov_pg_schema(void);
/* Keep the accounts' limits and the unbound keys' account choices in db as well as in
 * the state dir, for every host that uses db. Registers the store's LISTEN channel
 * olp_providers, so call it before the listener thread starts (auth_store_open starts
 * it); until that thread answers, reads use the host's files. Starts this process's
 * writer thread. 0; -ENOENT or -EPROTO when db has no providers schema or another
 * version (logged: nothing is shared until olp-keys store init); -EINVAL (attached
 * already) or -EBUSY (the listener runs). A database away is no error. db must outlive
 * prov_store_detach. */
int prov_store_attach(struct store_db *db);
/* Stop the writer (a state still queued is dropped: the host's file has it) and the
 * notifications; reads use the files again. */
void prov_store_detach(void);

/* ---- running ------------------------------------------------------------------------- */

/* The error code as in the Node OLP ("SPAWN_TIMEOUT", …). */
const char *prov_error_code(enum prov_error e);
/* The HTTP status that best tells a client what happened (502, 503, 504, 429…). */
int prov_error_status(enum prov_error e);

struct prov_outcome {
	enum prov_error err;
	int status;		/* HTTP status for err (0 when PROV_OK) */
	char message[256];	/* client-safe message; never stderr, never the prompt */
	char finish_reason[32]; /* "stop" unless the provider said otherwise */
	struct prov_usage usage;
	int upstream_status; /* the provider API's HTTP status when its output named one
				       (see struct prov_failure), else 0; for logs and routing */
	bool output_started; /* at least one delta reached the sink */
	bool ran;	     /* a provider process was started (start says how) */
	enum sbx_start start;
	bool retried_cold; /* a pre-started process failed before any output (a credential
			      refused, or it had died): this is the outcome of the cold run
			      that followed */
	int exit_status;
	uint64_t duration_ms;
	char stderr_tail[512]; /* for the operator's log only (cut) */
};

/* Run one request through its model's provider, streaming events into sink. Blocks until
 * the provider's process tree is gone. hangup_fd: see sbx_run_options (-1 for none). With
 * "prestart" the run may take a pre-started process (outcome start SBX_START_PRESTART);
 * one that fails before any output reached the sink with AUTH_MISSING, an upstream 401,
 * or having written nothing at all (it died) is run again once, cold, and the sink sees
 * only that run's events and outcome. */
void prov_run(const struct prov_request *req, const struct prov_sink *sink, int hangup_fd,
	      struct prov_outcome *out);

#endif
