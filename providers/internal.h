/* Private to providers/: the provider table and the registry's layout. */
#ifndef OLP_PROVIDERS_INTERNAL_H
#define OLP_PROVIDERS_INTERNAL_H

#include <pthread.h>

#include "providers/providers.h"
#include "sandbox/sandbox.h"

/* What a provider wants run for one request; built by ops->plan, released by run.c. */
struct prov_plan {
	struct strv argv; /* argv.v is what runs: NULL-terminated once anything is pushed */
	struct buf stdin_data;
	struct sbx_policy *policy;
	/* The run ends at the model's first call of a tool named with this prefix (the
	 * client's, declared through olp-mcp-tools): its forwarder lets no request out after
	 * it (egr_route.stop_after_tool). A static string, or NULL. */
	const char *stop_after_tool;
};

struct prov_held_ops;

/* The settings a type reads beyond those every type reads ("timeout_s", "max_concurrent",
 * "limits", "prestart", "network", "env"): settings.c's table names each one's group. */
enum prov_setting {
	PROV_SET_COMMAND = 1 << 0,	 /* "argv" (then required), "ro_paths", "output" */
	PROV_SET_CLI = 1 << 1,		 /* "bin", "credentials", "credentials_writable",
					    "login", "login_token_url" */
	PROV_SET_MAX_RETRIES = 1 << 2,	 /* "max_retries" */
	PROV_SET_SYSTEM_PROMPT = 1 << 3, /* "system_prompt" */
	PROV_SET_TOOLS = 1 << 4,	 /* "tools" */
	PROV_SET_CONFIG_TOML = 1 << 5,	 /* "config_toml", "model_provider" */
	/* config.json's overrides are checked before their type is known: every setting. */
	PROV_SET_ALL = (1 << 6) - 1,
};

/* Everything OLP knows of one provider type: a new type is its file (the plan and the
 * parser) and one line of registry.c's table. Nothing outside providers/ names a type. */
struct provider_ops {
	const char *type;
	/* The Node OLP's provider name that implies the type when an entry has no "type"
	 * ("anthropic" for claude), or NULL. */
	const char *node_name;
	unsigned settings; /* enum prov_setting: what its entries may set */
	unsigned prestart; /* "prestart" when not set: processes kept started per key */
	/* A CLI type's program: the variable naming it (OLP_CLAUDE_BIN), and its name on
	 * PATH; NULL for a type whose program is its "argv" (a command). */
	const char *bin_env;
	const char *bin_name;
	/* The credential files a run gets when "credentials" is not set ("~/" paths,
	 * NULL-terminated; of these one is enough to count as present), or NULL. */
	const char *const *credentials;
	/* Its network default (network.c; docs/providers.md, "Network"): the public API its
	 * runs go to in upstream mode, or NULL for none (a command: no network unless set,
	 * legacy true is the host's, and with its own credential any path) ... */
	const char *upstream;
	/* ... the requests the real binary was seen making (tests/provider-clis), which are
	 * all a run may make unless the operator lists others ("METHOD /path", NULL-terminated) */
	const char *const *allow_paths;
	/* ... whether the model in its request bodies is the one OLP names on its command
	 * line (vibe takes its model from its config.toml: not checked) ... */
	bool model_in_argv;
	/* ... model ids the CLI widens itself to "<alias_prefix><id>-..." (claude: "sonnet"),
	 * NULL-terminated, or NULL ... */
	const char *const *model_aliases;
	const char *alias_prefix;
	/* ... and what to tell the operator at start when its runs go upstream and its
	 * program is installed (vibe: where its API base must point; notes.c), or NULL. */
	const char *upstream_note;
	/* Why it lacks a capability, said after "only <types> models can", or NULL. */
	const char *no_tools_why;
	/* Upstream mode: the variable that takes the base URL (claude's ANTHROPIC_BASE_URL),
	 * and the API-key variable the CLI insists on, given a placeholder when the run is
	 * secretless; NULL when the type has none (codex takes its base URL in argv). */
	const char *base_url_env;
	const char *api_key_env;
	unsigned caps; /* enum prov_caps */
	/* Its runs spend an upstream API's tokens (claude, codex, vibe; not a local command):
	 * a run cut before it reported its usage gets an estimate (prov_run). */
	bool upstream_tokens;
	/* The request's prompt is in argv (vibe): never pre-started (ADR 0022). */
	bool prompt_in_argv;
	/* Its CLI runs commands itself, as the model asks (codex's shell, vibe's bash tool):
	 * whatever a run holds, a prompt can have it read and printed. With a login bound
	 * into the run, only keys allowed the login may use it (ADR 0025). claude
	 * runs none unless its "tools" setting turns its own tools on (prov_provider). */
	bool runs_commands;
	/* Whether a run's changed credentials file (credentials_writable) may replace the
	 * host's: inside is where the run saw it, data what it left. Strict on the shape of
	 * the CLI's own format, lenient on extra fields (credentials.c). NULL: never written
	 * back. */
	sbx_writeback_check credentials_ok;
	/* Its login can be held by the worker ("login": "held", ADR 0036): the format of its
	 * login file, its refresh endpoint and the headers the login adds; NULL: it cannot. */
	const struct prov_held_ops *held;
	/* Optional, read at load: the base URL the CLI's own configuration sends it to (codex's
	 * config.toml), which becomes the default upstream as an "env" base_url_env does; a
	 * heap string, or NULL for none. May set what it implies (codex: model_provider).
	 * where names the provider in warnings. */
	char *(*config_upstream)(struct prov_provider *pv, const char *where);
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

/* The table of types (registry.c): the i-th, or NULL past its end; the one named type. */
const struct provider_ops *prov_ops_at(size_t i);
const struct provider_ops *prov_ops_for_type(const char *type);

/* How a provider's runs reach the network ("network"; ADR 0015, ADR 0018). */
enum prov_net {
	PROV_NET_NONE = 0, /* no network at all: false, "none"; a command's default */
	PROV_NET_HOST,	   /* the host's network: "host", an explicit and loud opt-in */
	PROV_NET_UPSTREAM, /* loopback only, the worker forwards to one base URL: the CLIs'
			       default */
	PROV_NET_CONNECT,  /* loopback only, the worker tunnels CONNECT to listed hosts */
};

/* The fixed port the forwarder listens on inside a run's namespace: argv and the
 * environment name it before the run starts, and every run has a namespace of its own,
 * so one port serves all. */
#define PROV_NET_PORT 4180
#define PROV_NET_URL "http://127.0.0.1:4180"

struct prov_network {
	enum prov_net mode;
	char *upstream;		 /* upstream: the base URL */
	char *upstream_host;	 /* upstream: its host[:port], for /health and logs */
	char *ca_file;		 /* upstream: "upstream_ca", or NULL for the system store */
	struct strv hdr_names;	 /* upstream: "set_headers" names (lower case) ... */
	struct strv hdr_srcs;	 /* ... and their sources ("file:/abs", "env:NAME", either
				    maybe after "Bearer "), never the values */
	struct strv allow_paths; /* upstream: "METHOD /path" entries (network.c) */
	bool any_path;		 /* upstream: no list, and the run holds its own credential */
	bool check_body;	 /* upstream: a CLI type's: bodies checked (EGR_CHECK_BODY) */
	bool check_model;	 /* ... and their model must be the run's (prov_net_models) */
	struct strv allow_hosts; /* connect: "host:port" */
};

/* Secretless: the run holds no credential at all, the worker adds it on the way out
 * (upstream mode with set_headers). Then no credentials file is bound either. */
static inline bool prov_net_secretless(const struct prov_network *n)
{
	return n->mode == PROV_NET_UPSTREAM && n->hdr_names.n > 0;
}

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
	unsigned prestart;	  /* "prestart": processes kept started ahead per key */
	struct prov_network net;  /* "network" (network.c) */
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
	bool own_tools;		   /* claude: "tools" turns some of its own tools on */
	char *config_toml;	   /* codex: NULL for ~/.codex/config.toml */
	char *model_provider;	   /* codex: a [model_providers.<id>] of config.toml, or NULL */
	int login;		   /* "login": enum prov_login */
	char *login_token_url;	   /* "login_token_url", or NULL for the CLI's own endpoint */
	/* prov_provider_cli_state's last answer and when (cli.c): read and written with
	 * __atomic builtins by any thread; 0 until the first. */
	uint64_t cli_state_cache;
	/* Accounts ("accounts", "default_account"; accounts.c, ADR 0037). A provider with
	 * named accounts holds one variant per account: a shallow copy of itself (sharing
	 * every setting, owning only the fields below and, with set_headers of its own,
	 * net.hdr_names and net.hdr_srcs), which is what a run of that account uses. A
	 * provider without "accounts" is its own single account, "default". */
	char *account;			    /* a variant's account name; NULL: "default" */
	char *home;			    /* a variant's login dir ("~/" in credential paths,
						bound read-only for a command), or NULL: HOME */
	bool own_headers;		    /* a variant's set_headers are its own */
	bool own_env;			    /* a variant's env_names and env_values are its
						own: the provider's with its login's token */
	const struct prov_provider *parent; /* a variant's provider, else NULL */
	struct prov_provider **accounts;    /* the variants, in name order; NULL: none */
	size_t naccounts;
	size_t default_account; /* index into accounts */
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
/* accounts.c: read "accounts" and "default_account" of conf into pv's variants, after every
 * other setting (a variant copies them). 0, or -EINVAL with err set. */
int prov_accounts_read(struct prov_provider *pv, const json_t *conf, const char *where, bool strict,
		       struct buf *err);
void prov_accounts_release(struct prov_provider *pv);
/* Whether name is the variable of a type's long-lived login token (claude's
 * CLAUDE_CODE_OAUTH_TOKEN: struct prov_held_ops' token_env), of any type. */
bool prov_login_token_var(const char *name);
/* A login token given as "file:/abs/path" in env (the provider's or an account's), read
 * by the worker at every run: whether src is such a source. */
bool prov_login_token_is_file(const char *src);
/* Check that source of pv's token at load: pv's login held, its form, and whether the
 * worker can read it now (an error when strict, else a warning: its runs fail until it
 * can). where names the setting. 0 or -EINVAL with err set (never quoting the file). */
int prov_login_token_file_check(const struct prov_provider *pv, const char *src, const char *where,
				bool strict, struct buf *err);
/* What a run of pv's account adds to its policy: OLP_ACCOUNT (so the pools never mix
 * accounts) and, for a command, its login dir read-only (OLP_ACCOUNT_HOME). 0 or -errno. */
int prov_account_plan(const struct prov_provider *pv, struct sbx_policy *p);
/* network.c: read a "set_headers" object into n's hdr_names and hdr_srcs (both empty
 * before). where names it in messages. 0, or -EINVAL with err set. */
int prov_net_read_headers(struct prov_network *n, const json_t *v, const char *where, bool strict,
			  struct buf *err);

/* ---- network.c ---- */
/* Read "network" (v, or NULL when not given) into pv->net, after the rest of pv's settings
 * (the type's default upstream, the legacy "true"). where: "<file>: providers.<name>";
 * strict: a credential source that cannot be read now is an error, else a warning.
 * 0, or -EINVAL with err set to "<where>.network…: <what it must be>". */
int prov_net_read(struct prov_provider *pv, const json_t *v, const char *where, bool strict,
		  struct buf *err);
void prov_net_release(struct prov_network *n);
/* "none", "host", "upstream", "connect". */
const char *prov_net_mode_name(enum prov_net mode);
/* Read one credential source ("file:/abs" or "env:NAME", maybe after "Bearer ") into
 * value (reset first). 0, or -errno with why set to a message naming the file or the
 * variable, never its content. */
int prov_net_resolve(const char *src, struct buf *value, struct buf *why);
/* The models a run of model id may name in its request bodies (egr_route.models), pushed
 * onto out: none when pv's bodies are not checked for a model. */
void prov_net_models(const struct prov_provider *pv, const char *id, struct strv *out);

/* ---- credentials.c: what a written-back credentials file must look like ---- */
/* The largest credentials file a run may write back: a login is a few KiB. */
#define PROV_CRED_MAX ((size_t)64 * 1024)
bool prov_claude_credentials_ok(const char *inside, const char *data, size_t len, const char **why);
bool prov_codex_credentials_ok(const char *inside, const char *data, size_t len, const char **why);
bool prov_vibe_credentials_ok(const char *inside, const char *data, size_t len, const char **why);

/* ---- login.c, refresh.c: logins held by the worker (ADR 0036) ---- */
enum prov_login {
	PROV_LOGIN_COPY = 0, /* the login's files are copied into each run (ADR 0025) */
	PROV_LOGIN_HELD,     /* the run gets a placeholder; the forwarder adds the login */
};
/* What "login" is when not given, for a type that can hold its login (and whose settings
 * allow it: check_login in settings.c falls back to "copy" quietly). */
#define PROV_LOGIN_DEFAULT PROV_LOGIN_HELD

/* A login as the worker reads it: the strings point into root (or the environment) and
 * live as long as root does. */
struct prov_held_login {
	json_t *root;	     /* the login file's JSON; NULL for a token from "env" */
	char *token;	     /* a token of "env" read from its "file:" source (wiped) */
	const char *access;  /* the access token */
	const char *refresh; /* the refresh token, or NULL */
	const char *account; /* the account the upstream wants named in a header, or NULL */
	int64_t expires_ms;  /* when access expires, epoch ms; 0 = not known */
};

/* What one CLI's login looks like (login.c: claude's and codex's). */
struct prov_held_ops {
	const char *token_url;	     /* the CLI's own refresh endpoint (read from its binary) */
	const char *client_id;	     /* the CLI's OAuth client id, sent with a refresh */
	const char *token_env;	     /* a long-lived token's variable in "env", or NULL */
	const char *account_header;  /* the header that names the account, or NULL */
	const char *placeholder_env; /* what a run's token_env holds instead */
	/* Read root into l (its strings point into root). 0, or -EINVAL with *why set. */
	int (*parse)(json_t *root, struct prov_held_login *l, const char **why);
	/* The placeholder file: the CLI's format, no secret, an expiry far ahead. */
	json_t *(*placeholder)(const struct prov_held_login *l, int64_t now_ms);
	/* The refresh request's JSON body. */
	json_t *(*refresh_body)(const struct prov_held_ops *ho, const char *refresh_token);
	/* Put a refresh answer's tokens into root. 0, or -EINVAL with *why set. */
	int (*refreshed)(json_t *root, const json_t *answer, int64_t now_ms, const char **why);
};
extern const struct prov_held_ops prov_held_claude, prov_held_codex;

/* Refresh this long before the access token expires: a run may take ten minutes. */
#define PROV_HELD_MARGIN_MS ((int64_t)15 * 60 * 1000)

/* <state_dir>/held, made 0700: the placeholders, the refresh locks and states. */
int prov_login_set_dir(const char *state_dir);
/* The host file of pv's held login into path (PATH_MAX), or -ENOENT when it is a token of
 * "env" (token_env). 0 or -errno. */
int prov_login_path(const struct prov_provider *pv, char *path);
/* Replace path with data whole or not at all (a 0600 temp file beside it, fsynced, then
 * renamed over it), given owner's uid and gid when owner is not NULL (a failure to chown
 * counts only when the owner is not this process's user). 0 or -errno. */
struct stat;
int prov_file_replace(const char *path, const char *data, const struct stat *owner);
/* Read pv's held login into l (released with prov_login_release). 0, or -errno with
 * why set (never quoting the file). */
int prov_login_read(const struct prov_provider *pv, struct prov_held_login *l, struct buf *why);
void prov_login_release(struct prov_held_login *l);
/* Bind the placeholder of pv's login into plan instead of the login (cli.c); nothing
 * when the host has no login file. */
int prov_login_bind(const struct prov_provider *pv, const struct prov_request *req,
		    struct prov_plan *plan, struct prov_outcome *out);
/* Said at load: a held ChatGPT login sent to the API's upstream (where: "<file>:
 * providers.<name>"). */
void prov_login_note(const struct prov_provider *pv, const char *where);
/* The run's token_env placeholder, set after "env" (run.c). 0 or -errno. */
int prov_login_env(const struct prov_provider *pv, struct sbx_policy *p);
/* The headers the forwarder sets for a held login (names and values pushed onto the
 * strvs), refreshed first when it is about to expire. 0, -ENOENT when there is no login
 * on the host (the run then holds its own credential, if any, as with "copy"), or -errno
 * with why set. */
int prov_login_headers(const struct prov_provider *pv, const char *rid, struct strv *names,
		       struct strv *values, struct buf *why);
/* refresh.c: refresh pv's login if it expires within PROV_HELD_MARGIN_MS, one worker of
 * the host at a time (a flock), the file replaced atomically (0600, its owner kept). l is
 * read again under the lock and holds the current login after. 0 (fresh, refreshed, or
 * another worker refreshed it), or -errno with why set. */
int prov_login_refresh(const struct prov_provider *pv, const char *rid, struct prov_held_login *l,
		       struct buf *why);
/* The refresh state file of pv (<held dir>/<name>.state) into path (PATH_MAX). */
int prov_login_state_path(const struct prov_provider *pv, char *path);

/* codexconf.c: codex's config.toml, for config_upstream. */
char *prov_codex_config_upstream(struct prov_provider *pv, const char *where);

/* Take one of pv's concurrency slots (slots.c): an fd to hand back to prov_slot_release,
 * PROV_SLOT_NONE when there is no cap, -EBUSY when all are taken, -errno on failure. */
#define PROV_SLOT_NONE (-1000)
int prov_slot_acquire(const struct prov_provider *pv);
void prov_slot_release(int fd);

void prov_plan_release(struct prov_plan *plan);

/* <state_dir>/<name>, made 0700 when missing, into *dir (a heap copy that replaces the
 * old one, under lock) (slots.c): the one place the state dir's parts are made. 0 or
 * -errno. */
int prov_state_subdir(const char *state_dir, const char *name, char **dir, pthread_mutex_t *lock);
/* The unbound callers' account choices (sticky.c): <state_dir>/accounts, 0700. 0 or -errno. */
int prov_sticky_set_dir(const char *state_dir);
/* The accounts' limits files (limits.c): <state_dir>/limits, made 0700. 0 or -errno. */
int prov_limits_set_dir(const char *state_dir);
/* The shared store's side of the limits and the choices (pg.c). All answer -ESTALE when
 * no store is attached or it cannot be used now: the caller uses the host's files. */
/* The store's state of (provider, account) while its cache is fresh: 0, -ENOENT (the
 * store has none) or -ESTALE. may_load: the store's table may be read now (a round trip,
 * once per listener epoch); false on an answer's path. */
int prov_pg_limits_get(const char *provider, const char *account, bool may_load,
		       struct prov_limits *out);
/* Queue st for the store when it differs from what the store holds in a way that
 * matters; waits (1 s at most) only for a new rejection while the database answers. */
void prov_pg_limits_put(const char *provider, const char *account, const struct prov_limits *st);
/* The kept choice of (provider, who): 0 with account (PROV_ACCOUNT_NAME_MAX + 1) and
 * *until, -ENOENT (none yet) or -ESTALE. */
int prov_pg_choice_get(const char *provider, const char *who, char *account, int64_t *until);
/* olp_account_choose: keep account until `until` for (provider, who) unless a choice is
 * kept that has not lapsed at now_s and is not old (the account the caller saw kept and
 * cannot use; NULL: none). The kept choice after it into out and *out_until: 0 or
 * -ESTALE. */
int prov_pg_choose(const char *provider, const char *who, const char *account, int64_t until,
		   int64_t now_s, const char *old, char *out, int64_t *out_until);
/* egr_limits_fn for a run's forwarder: ctx is the run's const struct prov_provider. */
void prov_limits_seen(void *ctx, const struct egr_ratelimit *rl);
/* The tool-list files (toolfile.c): <state_dir>/tools, made 0700. 0 or -errno. */
int prov_toolfile_set_dir(const char *state_dir);
/* The file holding json (a request's tool list), written if it is not there yet; its path
 * into path. -ENOENT when no state dir was set, else 0 or -errno. */
int prov_toolfile_get(const char *json, size_t len, char *path, size_t size);
/* Where a run finds its tool list, the one argument of olp-mcp-tools. */
#define PROV_TOOLS_INSIDE SBX_HOME_PATH "/.olp-tools.json"
/* Declare req->tools to a run through olp-mcp-tools (ADR 0019): the list written to its
 * file (prov_toolfile_get), that file bound at PROV_TOOLS_INSIDE and olp-mcp-tools (the
 * OLP_MCP_TOOLS variable, else the path built in) read-only into plan's sandbox; *bin is
 * that program's path (static or the environment's). 0, or -errno with out->message
 * set: -E2BIG for a list above 1 MiB as JSON (the client's to fix). */
int prov_tools_plan(const struct prov_provider *pv, const struct prov_request *req,
		    struct prov_plan *plan, struct prov_outcome *out, const char **bin);

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
