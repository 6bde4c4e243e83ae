/* The codex provider: OpenAI's Codex CLI, non-interactive, JSON events.
 *
 *   codex exec --json --skip-git-repo-check --ephemeral
 *              --dangerously-bypass-approvals-and-sandbox --model M -   (prompt on stdin)
 *
 *   "providers": { "openai": { "bin": "…", "max_retries": 1,
 *       "credentials": "~/.codex/auth.json", "config_toml": "~/.codex/config.toml",
 *       "model_provider": "<id of a [model_providers.<id>] table in config.toml>",
 *       "network": { "upstream": "https://api.openai.com/v1",
 *       "set_headers": { "authorization": "Bearer file:/etc/olp/openai.key" } } } }
 *
 * Our sandbox is the boundary: codex's own sandbox would need the user namespaces that
 * ours forbids, so it is switched off inside (the flag codex documents for "externally
 * sandboxed" environments). CODEX_HOME is a writable directory of the scratch home with
 * auth.json and config.toml bound in; TMPDIR stays /tmp, outside CODEX_HOME, because codex
 * refuses to place its helpers under TMPDIR.
 *
 * Output, one JSON object a line: "item.completed" with an "agent_message" item holds
 * the whole answer (codex streams no token deltas), "turn.completed" the usage, and
 * "error" / "turn.failed" a failure. An item of type "error" is a warning (e.g. unknown
 * model metadata), not a failure.
 *
 * The client's function tools (ADR 0019, "codex"): declared through olp-mcp-tools as the
 * MCP server "olp" (the model sees them in the namespace mcp__olp under their own names),
 * with codex's own tools switched off. codex calls an MCP tool itself: the server refuses
 * it, and the same program as a PreModelRequest hook stops codex before it would ask the
 * model again (olp-mcp-tools.c). Each call is an "item.started" line of type
 * "mcp_tool_call" (server, tool, arguments); the output ends there, without a
 * "turn.completed", and the end of output is the end of the calls. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "providers/cli.h"
#include "providers/ndjson.h"
#include "common/banned.h"

#define CODEX_HOME SBX_HOME_PATH "/.codex"

#if defined(__x86_64__)
#define CODEX_ARCH "x64"
#define CODEX_TRIPLE "x86_64-unknown-linux-musl"
#elif defined(__aarch64__)
#define CODEX_ARCH "arm64"
#define CODEX_TRIPLE "aarch64-unknown-linux-musl"
#endif

/* The npm package's bin/codex.js only finds and execs a native binary shipped in a
 * platform package. Run that binary directly: the sandbox then needs no node at all. */
static bool codex_native(const char *real, char *native)
{
#ifdef CODEX_TRIPLE
	/* Relative to the package root: where npm puts the platform package (nested or
	 * hoisted next to it), and where older releases kept the binary. */
	static const char *const where[] = {
		"/node_modules/@openai/codex-linux-" CODEX_ARCH "/vendor/" CODEX_TRIPLE
		"/bin/codex",
		"/../codex-linux-" CODEX_ARCH "/vendor/" CODEX_TRIPLE "/bin/codex",
		"/vendor/" CODEX_TRIPLE "/bin/codex",
	};
	char cand[PATH_MAX];
	size_t rl = strlen(real), sl = strlen("/bin/codex.js");

	if (rl <= sl || strcmp(real + rl - sl, "/bin/codex.js"))
		return false;
	for (size_t i = 0; i < ARRAY_SIZE(where); i++) {
		int n = snprintf(cand, sizeof(cand), "%.*s%s", (int)(rl - sl), real, where[i]);

		if (n > 0 && n < (int)sizeof(cand) && !access(cand, X_OK) && realpath(cand, native))
			return true;
	}
#else
	(void)real;
	(void)native;
#endif
	return false;
}

/* One "-c key=value" override; value is TOML. */
static void push_config(struct prov_plan *plan, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void push_config(struct prov_plan *plan, const char *fmt, ...)
{
	struct buf kv = BUF_INIT;
	va_list ap;

	va_start(ap, fmt);
	buf_vaddf(&kv, fmt, ap);
	va_end(ap);
	strv_push(&plan->argv, "-c");
	strv_push_take(&plan->argv, buf_detach(&kv, NULL));
}

/* codex's own tools the model would otherwise be offered (features of 0.171, unknown
 * names are passed over as -c features.<name>=false): with the client's tools declared,
 * the model can call those and nothing that runs a command, reads a file or reaches the
 * web. What stays: listing and reading MCP resources (olp-mcp-tools has none) and
 * request_user_input (Plan mode only). */
static const char *const codex_own_tools[] = {
	"unified_exec", "shell_tool",	"view_image",	    "goals",	    "multi_agent",
	"apps",		"plugins",	"image_generation", "tool_suggest", "skill_search",
	"browser_use",	"computer_use", "in_app_browser",   "sleep_tool",
};

/* What the model is told of the client's tools, after the conversation (in stdin, never
 * argv: nothing of the client's reaches the host's /proc/<pid>/cmdline). */
static void codex_tool_instructions(const struct prov_request *req, struct buf *in)
{
	buf_adds(in, "\n\n[System] The API client declared functions you may call: the tools "
		     "in the namespace mcp__olp. Calling one hands the call to the client, which "
		     "runs it and sends you its result in a later message. To call several, make "
		     "all the calls in one reply.");
	if (req->tool_choice == PROV_TOOLS_REQUIRED)
		buf_adds(in, " In this reply you must call at least one of these tools.");
	else if (req->tool_choice == PROV_TOOLS_NAMED)
		buf_addf(in, " In this reply you must call the tool %s.", req->tool_name);
}

static int codex_plan_tools(const struct prov_provider *pv, const struct prov_request *req,
			    struct prov_plan *plan, struct prov_outcome *out)
{
	const char *bin;
	int ret;

	if ((ret = prov_tools_plan(pv, req, plan, out, &bin)))
		return ret;
	/* Its path goes in TOML strings and in a hook's command line, unquoted. */
	if (strpbrk(bin, " \t\n\"'\\$`;&|<>()*?[]{}#~")) {
		snprintf(out->message, sizeof(out->message),
			 "provider %s: the tool lister's path %s holds characters codex cannot "
			 "take in a hook's command line",
			 pv->name, bin);
		return -EINVAL;
	}
	/* The server, required: a run whose tools could not be declared fails (codex exits
	 * before any request) rather than answering without them. */
	push_config(plan, "mcp_servers.olp.command=\"%s\"", bin);
	push_config(plan, "mcp_servers.olp.args=[\"" PROV_TOOLS_INSIDE "\"]");
	push_config(plan, "mcp_servers.olp.required=true");
	/* The hook that ends the run before codex asks the model again with the results of
	 * the client's calls. A hook needs trust, which an ephemeral run cannot record. */
	push_config(plan,
		    "hooks.PreModelRequest=[{hooks=[{type=\"command\",command=\"%s "
		    "--codex-hook " PROV_TOOLS_INSIDE "\"}]}]",
		    bin);
	strv_push(&plan->argv, "--dangerously-bypass-hook-trust");
	for (size_t i = 0; i < ARRAY_SIZE(codex_own_tools); i++)
		push_config(plan, "features.%s=false", codex_own_tools[i]);
	push_config(plan, "web_search=\"disabled\"");
	return 0;
}

/* The model provider codex talks to: in upstream mode the forwarder, and bounded retries. */
static void codex_plan_provider(const struct prov_provider *pv, struct prov_plan *plan)
{
	const char *mp = pv->model_provider;
	long long retries = pv->max_retries >= 0 ? pv->max_retries : 1;

	/* Upstream mode: the model provider's base URL is the forwarder inside the run. The
	 * built-in "openai" provider cannot be pointed elsewhere, so without a configured one
	 * a provider of our own ("olp") is defined here. */
	if (pv->net.mode == PROV_NET_UPSTREAM) {
		bool own = !mp;

		if (own) {
			mp = "olp";
			push_config(plan, "model_providers.olp.name=\"OLP forwarder\"");
			push_config(plan, "model_providers.olp.wire_api=\"responses\"");
		}
		push_config(plan, "model_providers.%s.base_url=\"%s\"", mp, PROV_NET_URL);
		/* With a ChatGPT login codex also reaches chatgpt.com itself (its apps' MCP
		 * server, /backend-api/ps/mcp) and ab.chatgpt.com (analytics), past the base
		 * URL: a run's namespace has no way there, and the attempts held its first
		 * request back by some 25 s (docs/accounts.md). */
		push_config(plan, "features.apps=false");
		push_config(plan, "analytics.enabled=false");
		/* Secretless: the key variable holds a placeholder (run.c); passing through, an
		 * "env" OPENAI_API_KEY, else auth.json (codex login). */
		if (prov_net_secretless(&pv->net) ||
		    (own && strv_find(&pv->env_names, "OPENAI_API_KEY") >= 0))
			push_config(plan, "model_providers.%s.env_key=\"OPENAI_API_KEY\"", mp);
		else if (own)
			push_config(plan, "model_providers.olp.requires_openai_auth=true");
	}
	/* Bounded retries of the model provider, so that an upstream 401 or 500 reaches the
	 * client in seconds. The retry settings belong to a [model_providers.<id>] table
	 * (an id of letters, digits, - and _ only, checked at load). */
	if (mp) {
		push_config(plan, "model_provider=\"%s\"", mp);
		push_config(plan, "model_providers.%s.request_max_retries=%lld", mp, retries);
		push_config(plan, "model_providers.%s.stream_max_retries=%lld", mp, retries);
	}
}

static int codex_plan(const struct prov_provider *pv, const struct prov_request *req,
		      struct prov_plan *plan, struct prov_outcome *out)
{
	char real[PATH_MAX], native[PATH_MAX], toml[sizeof(CODEX_HOME "/config.toml")];
	const char *codex_home = CODEX_HOME;
	int ret;

	if (!prov_cli_find(pv, real) && codex_native(real, native)) {
		strv_push(&plan->argv, native);
		if ((ret = prov_cli_bind_install(plan->policy, native)))
			return ret;
	} else if ((ret = prov_cli_push_program(pv, plan, out))) {
		return ret;
	}
	{
		const char *const args[] = { "exec",
					     "--json",
					     "--skip-git-repo-check",
					     "--ephemeral",
					     "--dangerously-bypass-approvals-and-sandbox",
					     "--model",
					     req->model->id };

		for (size_t i = 0; i < ARRAY_SIZE(args); i++)
			strv_push(&plan->argv, args[i]);
	}
	codex_plan_provider(pv, plan);
	if (req->tools && (ret = codex_plan_tools(pv, req, plan, out)))
		return ret;
	strv_push(&plan->argv, "-");
	prov_flatten_messages(req->messages, &plan->stdin_data);
	if (req->tools)
		codex_tool_instructions(req, &plan->stdin_data);
	/* codex refuses a CODEX_HOME that does not exist, and only a bind makes ~/.codex: a
	 * run that binds no auth.json (secretless, or "credentials": []) and no config.toml
	 * gets the scratch home itself as its CODEX_HOME. */
	if (prov_net_secretless(&pv->net) ||
	    (pv->credentials_set && !pv->cred_host.n && pv->config_toml_off))
		codex_home = SBX_HOME_PATH;
	if ((ret = sbx_policy_setenv(plan->policy, "CODEX_HOME", codex_home)) ||
	    (ret = prov_cli_bind_credentials(pv, req, plan, out)))
		return ret;
	if (pv->config_toml_off)
		return 0;
	snprintf(toml, sizeof(toml), "%s/config.toml", codex_home);
	ret = prov_cli_bind_file(plan, pv->config_toml ? pv->config_toml : "~/.codex/config.toml",
				 toml, false);
	/* The default file may not exist (or HOME may be unknown): then there is none. */
	if (ret && pv->config_toml) {
		snprintf(out->message, sizeof(out->message),
			 "provider %s: its \"config_toml\" cannot be placed (%s)", pv->name,
			 strerror(-ret));
		return ret;
	}
	return 0;
}

/* ---- parser ---------------------------------------------------------------------------- */

struct codex_parser {
	struct prov_lines pl;
	size_t messages;  /* agent messages emitted */
	unsigned ncalls;  /* calls of the client's tools reported */
	char thread[33];  /* the thread id's hex digits (unique per run: a UUIDv7) */
	int error_status; /* from an "error" line, until the turn says how it ended */
	bool error_seen;
};

/* A call of the client's tools: codex starts it as an MCP tool call of our server "olp"
 * (the name is the client's own); reported whole, with an id of ours, made of the run's
 * thread id and the call's number (codex's item ids repeat from one run to the next, and
 * a client pairs results with calls by id). > 0 when the item was one. */
static int on_call(struct codex_parser *xp, const json_t *item, int *ret)
{
	const char *tool = prov_json_str(item, "tool");
	const json_t *args = json_object_get(item, "arguments");
	struct prov_event ev = { .kind = PROV_EV_TOOL_CALL };
	char id[64], *dump;

	*ret = 0;
	if (strcmp(prov_json_str(item, "type") ?: "", "mcp_tool_call") ||
	    strcmp(prov_json_str(item, "server") ?: "", "olp") || !tool || !*tool)
		return 0;
	if (xp->thread[0]) {
		snprintf(id, sizeof(id), "call_%s_%u", xp->thread, xp->ncalls);
	} else {
		char hex[25];

		random_hex(hex, 12);
		snprintf(id, sizeof(id), "call_%s", hex);
	}
	/* Whatever the arguments are (any JSON value, or none): their text. */
	dump = args && !json_is_null(args) ? json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY)
					   : xstrdup("{}");
	if (!dump)
		abort();
	ev.tool_index = xp->ncalls++;
	ev.tool_id = id;
	ev.tool_name = tool;
	ev.text = dump;
	ev.len = strlen(dump);
	*ret = xp->pl.sink->emit(xp->pl.sink->ctx, &ev);
	free(dump);
	return 1;
}

/* The run's thread id (a UUID), kept as its hex digits for the calls' ids. */
static void on_thread(struct codex_parser *xp, const char *tid)
{
	size_t n = 0;

	for (; tid && *tid && n + 1 < sizeof(xp->thread); tid++)
		if (strchr("0123456789abcdefABCDEF", *tid))
			xp->thread[n++] = *tid;
	xp->thread[n] = '\0';
}

static int on_item(struct codex_parser *xp, const json_t *o)
{
	const json_t *item = json_object_get(o, "item"), *text = json_object_get(item, "text");
	const char *type = prov_json_str(item, "type");
	int ret;

	if (!type || strcmp(type, "agent_message") || !json_is_string(text)) {
		xp->pl.ignored++; /* reasoning, command_execution, error (a warning), … */
		return 0;
	}
	if (!json_string_length(text))
		return 0;
	/* Several messages in one turn (a preamble, then the answer) read as paragraphs. */
	if (xp->messages++ && (ret = prov_emit_delta(xp->pl.sink, "\n\n", 2)))
		return ret;
	return prov_emit_delta(xp->pl.sink, json_string_value(text), json_string_length(text));
}

static int on_turn_completed(struct codex_parser *xp, const json_t *o)
{
	const json_t *u = json_object_get(o, "usage");
	struct prov_usage usage = { .present = true };
	int ret;

	if (json_is_object(u)) {
		/* As in OpenAI's API: input_tokens include the cached ones, output_tokens the
		 * reasoning ones. */
		usage.prompt_tokens = prov_json_count(u, "input_tokens", 0);
		usage.completion_tokens = prov_json_count(u, "output_tokens", 0);
		usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
		usage.cached_tokens = prov_json_count(u, "cached_input_tokens", 0);
		if ((ret = prov_emit_usage(xp->pl.sink, &usage)))
			return ret;
	}
	return prov_emit_finish(xp->pl.sink, xp->ncalls ? "tool_calls" : "stop") ?: 1;
}

static int failure(struct codex_parser *xp, const struct prov_sink *sink, int status)
{
	if (!status)
		status = xp->error_status;
	if (status == 401 || status == 403)
		/* codex says 401 both for a bad key and for none at all. */
		return prov_emit_failure(
			sink, PROV_ERR_PROVIDER_ERROR, status,
			"the upstream API rejected codex's credentials; check "
			"~/.codex/auth.json (codex login) or this provider's \"env\"");
	return prov_emit_failure(sink, PROV_ERR_PROVIDER_ERROR, status, prov_upstream_text(status));
}

static int codex_line(void *ctx, const char *line, size_t len)
{
	struct codex_parser *xp = ctx;
	json_t *o = prov_json_object(line, len);
	const char *type = prov_json_str(o, "type");
	int ret = 0;

	if (!o) {
		xp->pl.garbage++;
		return 0;
	}
	if (!type) { /* NOLINT(bugprone-branch-clone): ignored as an unknown type */
		xp->pl.ignored++;
	} else if (!strcmp(type, "item.completed")) {
		ret = on_item(xp, o);
	} else if (!strcmp(type, "thread.started")) {
		on_thread(xp, prov_json_str(o, "thread_id"));
	} else if (!strcmp(type, "item.started")) {
		if (!on_call(xp, json_object_get(o, "item"), &ret))
			xp->pl.ignored++; /* command_execution, … */
	} else if (!strcmp(type, "turn.completed")) {
		ret = on_turn_completed(xp, o);
	} else if (!strcmp(type, "turn.failed")) {
		const char *msg = prov_json_str(json_object_get(o, "error"), "message");

		ret = failure(xp, xp->pl.sink, msg ? prov_find_status(msg) : 0) ?: 1;
	} else if (!strcmp(type, "error")) {
		/* Also sent for retries that may still succeed: the turn decides. */
		const char *msg = prov_json_str(o, "message");
		int st = msg ? prov_find_status(msg) : 0;

		xp->error_seen = true;
		if (st)
			xp->error_status = st;
	} else {
		xp->pl.ignored++; /* thread.started, turn.started, item.started, … */
	}
	json_decref(o);
	return ret;
}

static void *codex_parser_new(const struct prov_provider *pv)
{
	struct codex_parser *xp = xcalloc(1, sizeof(*xp));

	(void)pv;
	prov_lines_init(&xp->pl);
	return xp;
}

static int codex_feed(void *st, const char *data, size_t len, const struct prov_sink *sink)
{
	struct codex_parser *xp = st;

	return prov_lines_feed(&xp->pl, data, len, sink, codex_line, xp);
}

static int codex_finish(void *st, const struct prov_sink *sink)
{
	struct codex_parser *xp = st;
	int ret = prov_lines_finish(&xp->pl, sink, codex_line, xp);

	if (ret || xp->pl.done)
		return ret;
	/* Calls of the client's tools and then no end of turn: the hook stopped codex after
	 * the model's answer (olp-mcp-tools.c). The answer is complete, whatever the exit. */
	if (xp->ncalls)
		return prov_emit_finish(sink, "tool_calls") ?: 1;
	/* An error and then no end of turn (the process exited): that error is the end. */
	if (xp->error_seen)
		ret = failure(xp, sink, 0);
	return ret;
}

static void codex_parser_free(void *st)
{
	struct codex_parser *xp = st;

	if (!xp)
		return;
	prov_lines_release(&xp->pl);
	free(xp);
}

const struct provider_ops prov_codex_ops = {
	.type = "codex",
	.node_name = "openai",
	.settings = PROV_SET_CLI | PROV_SET_MAX_RETRIES | PROV_SET_CONFIG_TOML,
	/* Measured (docs/performance.md, "Pre-started clients"): a third of codex's
	 * first-token wait is its own start-up. */
	.prestart = 1,
	.bin_env = "OLP_CODEX_BIN",
	.bin_name = "codex",
	.credentials = (const char *const[]){ "~/.codex/auth.json", NULL },
	.upstream = "https://api.openai.com/v1",
	.allow_paths = (const char *const[]){ "POST /responses", NULL },
	.model_in_argv = true,
	.upstream_tokens = true,
	/* codex exec runs shell commands itself (with its own sandbox off: ours is the
	 * boundary), so a prompt can read what the run holds. */
	.runs_commands = true,
	.credentials_ok = prov_codex_credentials_ok,
	.held = &prov_held_codex,
	/* A config.toml's model provider base_url is where the owner sends codex. */
	.config_upstream = prov_codex_config_upstream,
	/* codex ignores OPENAI_BASE_URL: its base URL goes in argv (codex_plan). */
	.api_key_env = "OPENAI_API_KEY",
	.caps = PROV_CAP_TOOLS,
	.plan = codex_plan,
	.parser_new = codex_parser_new,
	.parser_feed = codex_feed,
	.parser_finish = codex_finish,
	.parser_free = codex_parser_free,
};
