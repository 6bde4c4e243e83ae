/* The claude provider: Anthropic's Claude Code CLI in print mode, streaming JSON both ways.
 *
 *   claude -p --input-format stream-json --output-format stream-json --verbose
 *          --include-partial-messages --no-session-persistence --model M --tools ""
 *
 *   stdin:  {"type":"control_request","request_id":"olp-init",
 *            "request":{"subtype":"initialize","systemPrompt":S}}
 *           {"type":"user","message":{"role":"user","content":P},…}
 *
 *   "providers": { "anthropic": { "bin": "…", "tools": "", "max_retries": 2,
 *       "credentials": "~/.claude/.credentials.json", "credentials_writable": false,
 *       "env": { "ANTHROPIC_BASE_URL": "…", "ANTHROPIC_API_KEY": "…" },
 *       "system_prompt": "…", "network": { "upstream": "https://api.anthropic.com",
 *       "set_headers": { "x-api-key": "file:/etc/olp/anthropic.key" } } } }
 *
 * The system prompt S goes in the SDK's "initialize" request on stdin, as the Agent SDK
 * sends it, not in argv (--system-prompt): there a client's prompt above 128 KiB
 * (MAX_ARG_STRLEN) failed exec with E2BIG, and any was readable in the host's
 * /proc/<pid>/cmdline. A file for --system-prompt-file would need a bind per request,
 * which no warm sandbox could match. Nothing of the client's reaches argv.
 *
 * Output, one JSON object a line (docs/providers.md has real samples): "stream_event"
 * lines wrap the Messages API stream (text_delta pieces are the answer), "assistant"
 * repeats each message whole, and the last line, "result", carries the stop reason, the
 * usage and whether the request failed; the "control_response" to the initialize request
 * is not read. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "providers/cli.h"
#include "providers/ndjson.h"
#include "common/banned.h"

/* What the model is told before the client's own system messages: it answers an API
 * client, not a developer at a terminal. */
static const char default_system_prompt[] =
	"You are answering a request that arrived through an OpenAI-compatible API. Reply to "
	"the conversation below directly, as a chat assistant would; do not mention tools, "
	"files or a terminal.";

/* The user message's content: the flattened conversation as one string, or, when it holds
 * images, as content blocks (text and image blocks in the conversation's order), which
 * stream-json input passes on to the Messages API as they are. */
static void claude_user_content(const json_t *blocks, struct buf *in)
{
	const json_t *b;
	char *dump;
	size_t i;

	json_array_foreach(blocks, i, b) {
		if (strcmp(prov_json_str(b, "type") ?: "", "image"))
			continue;
		dump = json_dumps(blocks, JSON_COMPACT);
		if (!dump)
			abort(); /* out of memory: one OOM policy */
		buf_adds(in, dump);
		free(dump);
		return;
	}
	/* Text only (at most one block): the string form, as always. */
	b = json_array_get(blocks, 0);
	buf_add_json_str(in, prov_json_str(b, "text") ?: "",
			 json_string_length(json_object_get(b, "text")));
}

/* ---- the client's function tools (ADR 0019) ---------------------------------------------
 * Declared to claude through olp-mcp-tools, a stdio MCP server of ours that lists them and
 * runs nothing; claude shows them to the model as mcp__olp__<name>. Its own tools stay off
 * (--tools ""). When the model calls one, the parser reports the call and ends the run at
 * the end of that message: claude would otherwise be refused permission (print mode) and
 * ask the model again, at the client's cost. */
#define MCP_PREFIX "mcp__olp__"

static int claude_plan_tools(const struct prov_provider *pv, const struct prov_request *req,
			     struct prov_plan *plan, struct prov_outcome *out)
{
	const char *bin;
	json_t *conf;
	char *cdump;
	int ret;

	if ((ret = prov_tools_plan(pv, req, plan, out, &bin)))
		return ret;
	/* Nothing of the client's in argv: the server's path and where its list is. */
	conf = json_pack("{s:{s:{s:s, s:[s]}}}", "mcpServers", "olp", "command", bin, "args",
			 PROV_TOOLS_INSIDE);
	cdump = conf ? json_dumps(conf, JSON_COMPACT) : NULL;
	if (!cdump)
		abort();
	strv_push(&plan->argv, "--mcp-config");
	strv_push(&plan->argv, cdump);
	strv_push(&plan->argv, "--strict-mcp-config");
	/* Ended at the first call: nothing more goes upstream once the model made one. */
	plan->stop_after_tool = MCP_PREFIX;
	free(cdump);
	json_decref(conf);
	return 0;
}

/* What the model is told about the client's tools, after the system prompt. */
static void claude_tool_instructions(const struct prov_request *req, struct buf *s)
{
	if (!req->tools)
		return;
	buf_adds(s, "\n\nThe API client declared functions you may call; you see them as tools "
		    "named " MCP_PREFIX "<name>. Calling one hands the call to the client, which "
		    "runs it and sends you its result in a later message. To call several, make "
		    "all the calls in one reply.");
	if (req->tool_choice == PROV_TOOLS_REQUIRED)
		buf_adds(s, " In this reply you must call at least one of these tools.");
	else if (req->tool_choice == PROV_TOOLS_NAMED)
		buf_addf(s, " In this reply you must call the tool " MCP_PREFIX "%s.",
			 req->tool_name);
}

/* The run's stdin: the initialize request carrying the system prompt (the configured or
 * built-in one, then the client's system messages, then what to know of the client's
 * tools), then the rest of the conversation, flattened, as one user message. */
static void claude_stdin(const struct prov_provider *pv, const struct prov_request *req,
			 struct buf *in)
{
	struct buf system = BUF_INIT, s = BUF_INIT;
	json_t *blocks = json_array();

	if (!blocks)
		abort();
	prov_cli_split_messages(req->messages, &system, NULL, blocks);
	buf_adds(in, "{\"type\":\"control_request\",\"request_id\":\"olp-init\","
		     "\"request\":{\"subtype\":\"initialize\",\"systemPrompt\":");
	buf_adds(&s, pv->system_prompt ? pv->system_prompt : default_system_prompt);
	if (system.len) {
		buf_adds(&s, "\n\n");
		buf_add(&s, system.data, system.len);
	}
	claude_tool_instructions(req, &s);
	buf_add_json_str(in, s.data, s.len);
	buf_release(&s);
	buf_adds(in, "}}\n{\"type\":\"user\",\"message\":{\"role\":\"user\",\"content\":");
	claude_user_content(blocks, in);
	buf_adds(in, "},\"parent_tool_use_id\":null,\"session_id\":\"\"}\n");
	buf_release(&system);
	json_decref(blocks);
}

static int claude_plan(const struct prov_provider *pv, const struct prov_request *req,
		       struct prov_plan *plan, struct prov_outcome *out)
{
	const char *const args[] = { "-p",
				     "--input-format",
				     "stream-json",
				     "--output-format",
				     "stream-json",
				     "--verbose",
				     "--include-partial-messages",
				     "--no-session-persistence",
				     "--model",
				     req->model->id,
				     "--tools",
				     pv->tools ? pv->tools : "" };
	char num[32];
	int ret;

	if ((ret = prov_cli_push_program(pv, plan, out)))
		return ret;
	for (size_t i = 0; i < ARRAY_SIZE(args); i++)
		strv_push(&plan->argv, args[i]);
	if (req->tools && (ret = claude_plan_tools(pv, req, plan, out)))
		return ret;
	claude_stdin(pv, req, &plan->stdin_data);
	/* No update checks, telemetry or error reports from inside the sandbox; retries
	 * bounded so that an upstream 401 reaches the client in seconds, not minutes. */
	snprintf(num, sizeof(num), "%lld", (long long)(pv->max_retries >= 0 ? pv->max_retries : 2));
	if ((ret = sbx_policy_setenv(plan->policy, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
				     "1")) ||
	    (ret = sbx_policy_setenv(plan->policy, "DISABLE_AUTOUPDATER", "1")) ||
	    (ret = sbx_policy_setenv(plan->policy, "CLAUDE_CODE_MAX_RETRIES", num)))
		return ret;
	if (req->max_tokens > 0) {
		snprintf(num, sizeof(num), "%lld", (long long)req->max_tokens);
		if ((ret = sbx_policy_setenv(plan->policy, "CLAUDE_CODE_MAX_OUTPUT_TOKENS", num)))
			return ret;
	}
	/* Credentials only as configured (prov_run adds the provider's "env"): the sandbox
	 * environment starts empty, so nothing (ANTHROPIC_API_KEY, CLAUDECODE…) leaks in
	 * from the worker's own environment. */
	return prov_cli_bind_credentials(pv, req, plan, out);
}

/* ---- parser ---------------------------------------------------------------------------- */

struct claude_parser {
	struct prov_lines pl;
	struct buf sent; /* the answer text emitted so far */
	/* When a stream breaks, claude abandons the partial message and asks again (a new
	 * stream, or at last a non-streaming request). The client already has the first
	 * attempt's text: the retry's text is checked against it and only what goes beyond
	 * is emitted. */
	bool replaying;
	size_t replayed;      /* how much of sent the retry has matched so far */
	char streamed_id[96]; /* the API message whose text came as text_delta pieces */
	int error_status;     /* api_error_status of an "assistant" error message */
	char stop_reason[32]; /* from message_delta, for a result without one */
	/* The client's function calls: content block index → call number + 1 (0: a block
	 * that is not one), and the usage of the message, for a run ended at its end. */
	unsigned call_of[64];
	unsigned ncalls;
	struct prov_usage start_usage;
};

static int emit_tool(const struct prov_sink *sink, unsigned index, const char *id, const char *name,
		     const char *args, size_t len)
{
	struct prov_event ev = { .kind = PROV_EV_TOOL_CALL,
				 .tool_index = index,
				 .tool_id = id,
				 .tool_name = name,
				 .text = args,
				 .len = len };

	return sink->emit(sink->ctx, &ev);
}

/* Anthropic usage → OpenAI's (cached input counts in prompt_tokens there). */
static void usage_from(const json_t *u, struct prov_usage *usage)
{
	int64_t cache_read = prov_json_count(u, "cache_read_input_tokens", 0);

	usage->present = true;
	usage->prompt_tokens = prov_json_count(u, "input_tokens", 0) + cache_read +
			       prov_json_count(u, "cache_creation_input_tokens", 0);
	usage->completion_tokens = prov_json_count(u, "output_tokens", 0);
	usage->total_tokens = usage->prompt_tokens + usage->completion_tokens;
	usage->cached_tokens = cache_read;
}

/* A tool_use block is one of the client's functions when claude names it after our MCP
 * server; any other (an internal tool of claude's) is not the client's business. */
static const char *client_tool(const json_t *block)
{
	const char *type = prov_json_str(block, "type"), *name = prov_json_str(block, "name");

	if (!type || strcmp(type, "tool_use") || !name ||
	    strncmp(name, MCP_PREFIX, strlen(MCP_PREFIX)) || !name[strlen(MCP_PREFIX)])
		return NULL;
	return name + strlen(MCP_PREFIX);
}

/* The message that called the client's functions is over: report the usage and
 * finish_reason "tool_calls", and end the run before claude acts on the calls. */
static int end_with_calls(struct claude_parser *cp, const json_t *usage)
{
	struct prov_usage u = cp->start_usage;
	int ret;

	if (json_is_object(usage)) {
		u.present = true;
		u.completion_tokens = prov_json_count(usage, "output_tokens", 0);
		u.total_tokens = u.prompt_tokens + u.completion_tokens;
	}
	if (u.present && (ret = prov_emit_usage(cp->pl.sink, &u)))
		return ret;
	return prov_emit_finish(cp->pl.sink, "tool_calls") ?: 1;
}

/* The stream events of a function call: its block's start (id, name) and its arguments
 * as input_json_delta pieces. > 0 when the event was one of them. */
static int on_tool_event(struct claude_parser *cp, const char *type, const json_t *ev, int *ret)
{
	const json_t *idx = json_object_get(ev, "index");
	json_int_t i = json_is_integer(idx) ? json_integer_value(idx) : -1;

	*ret = 0;
	if (!strcmp(type, "message_start")) {
		struct prov_usage u;

		usage_from(json_object_get(json_object_get(ev, "message"), "usage"),
			   &cp->start_usage);
		/* Reported now: a run cut before its result (a stop sequence, the client
		 * gone) has spent this prompt all the same. */
		u = cp->start_usage;
		u.partial = true;
		*ret = prov_emit_usage(cp->pl.sink, &u);
		return *ret ? 1 : 0; /* else counted as ignored, as before */
	}
	if (i < 0 || i >= (json_int_t)ARRAY_SIZE(cp->call_of))
		return 0;
	if (!strcmp(type, "content_block_start")) {
		const json_t *cb = json_object_get(ev, "content_block");
		const char *name = client_tool(cb);

		if (!name)
			return 0;
		cp->call_of[i] = ++cp->ncalls;
		*ret = emit_tool(cp->pl.sink, cp->ncalls - 1, prov_json_str(cb, "id") ?: "", name,
				 "", 0);
		return 1;
	}
	if (!strcmp(type, "content_block_delta") && cp->call_of[i]) {
		const json_t *d = json_object_get(ev, "delta"),
			     *pj = json_object_get(d, "partial_json");

		if (strcmp(prov_json_str(d, "type") ?: "", "input_json_delta") ||
		    !json_is_string(pj))
			return 1;
		*ret = emit_tool(cp->pl.sink, cp->call_of[i] - 1, NULL, NULL, json_string_value(pj),
				 json_string_length(pj));
		return 1;
	}
	return 0;
}

/* A whole message not streamed (claude's non-streaming retry) that calls the client's
 * functions: every call at once, then the end. 0 when it calls none. */
static int on_assistant_calls(struct claude_parser *cp, const json_t *msg)
{
	const json_t *part;
	size_t i;
	int ret;

	if (cp->ncalls)
		return 0; /* streamed already */
	json_array_foreach(json_object_get(msg, "content"), i, part) {
		const char *name = client_tool(part);
		const json_t *input = json_object_get(part, "input");
		char *args;

		if (!name)
			continue;
		/* Whatever the input is (any JSON value, or none): its text, never NULL but
		 * for want of memory. */
		args = input ? json_dumps(input, JSON_COMPACT | JSON_ENCODE_ANY) : xstrdup("{}");
		if (!args)
			abort();
		ret = emit_tool(cp->pl.sink, cp->ncalls++, prov_json_str(part, "id") ?: "", name,
				args, strlen(args));
		free(args);
		if (ret)
			return ret;
	}
	if (!cp->ncalls)
		return 0;
	usage_from(json_object_get(msg, "usage"), &cp->start_usage);
	return end_with_calls(cp, NULL);
}

/* Emit answer text, or match it against what a broken attempt already sent. */
static int emit_text(struct claude_parser *cp, const char *text, size_t len)
{
	if (cp->replaying) {
		size_t n = cp->sent.len - cp->replayed;

		if (n > len)
			n = len;
		if (memcmp(text, cp->sent.data + cp->replayed, n)) {
			int ret = prov_emit_failure(cp->pl.sink, PROV_ERR_PROVIDER_ERROR, 0,
						    "the upstream stream broke mid-answer and the "
						    "retry answered differently");
			return ret ?: 1;
		}
		cp->replayed += n;
		text += n;
		len -= n;
		if (cp->replayed < cp->sent.len)
			return 0;
		cp->replaying = false;
	}
	if (!len)
		return 0;
	buf_add(&cp->sent, text, len);
	return prov_emit_delta(cp->pl.sink, text, len);
}

static const char *finish_for(const char *stop_reason)
{
	if (!stop_reason)
		return "stop";
	if (!strcmp(stop_reason, "max_tokens") ||
	    !strcmp(stop_reason, "model_context_window_exceeded"))
		return "length";
	if (!strcmp(stop_reason, "refusal"))
		return "content_filter";
	return "stop"; /* end_turn, stop_sequence, pause_turn, tool_use (claude ran it) */
}

/* Lines that belong to a sub-agent's conversation, not to the answer. */
static bool from_subagent(const json_t *o)
{
	return json_is_string(json_object_get(o, "parent_tool_use_id"));
}

static int on_stream_event(struct claude_parser *cp, const json_t *o)
{
	const json_t *ev = json_object_get(o, "event"), *delta = json_object_get(ev, "delta");
	const char *type = prov_json_str(ev, "type"), *id = prov_json_str(o, "api_message_id");
	int ret;

	if (!type || from_subagent(o)) {
		cp->pl.ignored++;
		return 0;
	}
	if (json_object_get(o, "abandoned_blocks")) {
		/* This attempt is over; a retry starts again from the first word. */
		cp->replaying = cp->sent.len > 0;
		cp->replayed = 0;
		cp->streamed_id[0] = '\0';
		return 0;
	}
	if (on_tool_event(cp, type, ev, &ret))
		return ret;
	if (!strcmp(type, "content_block_delta")) {
		const char *dt = prov_json_str(delta, "type");
		const json_t *text = json_object_get(delta, "text");

		if (dt && !strcmp(dt, "text_delta") && json_is_string(text)) {
			snprintf(cp->streamed_id, sizeof(cp->streamed_id), "%s", id ? id : "?");
			return emit_text(cp, json_string_value(text), json_string_length(text));
		}
	} else if (!strcmp(type, "message_delta")) {
		const char *sr = prov_json_str(delta, "stop_reason");

		if (sr)
			snprintf(cp->stop_reason, sizeof(cp->stop_reason), "%s", sr);
		if (cp->ncalls)
			return end_with_calls(cp, json_object_get(ev, "usage"));
		return 0;
	}
	cp->pl.ignored++;
	return 0;
}

static int on_assistant(struct claude_parser *cp, const json_t *o)
{
	const json_t *msg = json_object_get(o, "message"), *part;
	const char *id = prov_json_str(msg, "id");
	size_t i;
	int ret;

	if (from_subagent(o))
		return 0;
	/* A synthetic message carrying an API error ("API Error: Request rejected (429)")
	 * is not the answer; the "result" line after it reports the failure. */
	if (json_is_true(json_object_get(o, "is_api_error_message")) ||
	    json_object_get(o, "error")) {
		cp->error_status = prov_json_status(o, "api_error_status", 0);
		return 0;
	}
	/* The whole of a message already streamed as deltas: nothing new. A message with
	 * another id (no partial messages, or claude's non-streaming retry) is new text. */
	if (cp->streamed_id[0] && (!id || !strcmp(id, cp->streamed_id)))
		return 0;
	if ((ret = on_assistant_calls(cp, msg)))
		return ret;
	json_array_foreach(json_object_get(msg, "content"), i, part) {
		const char *pt = prov_json_str(part, "type");
		const json_t *text = json_object_get(part, "text");

		if (!pt || strcmp(pt, "text") || !json_is_string(text))
			continue;
		if ((ret = emit_text(cp, json_string_value(text), json_string_length(text))))
			return ret;
	}
	return 0;
}

static int on_result_error(struct claude_parser *cp, const json_t *o)
{
	const char *text = prov_json_str(o, "result");
	int status = prov_json_status(o, "api_error_status", cp->error_status);

	if (text && strstr(text, "Not logged in"))
		return prov_emit_failure(
			cp->pl.sink, PROV_ERR_AUTH_MISSING, 0,
			"claude is not logged in. Fix: run `claude` once as the "
			"user OLP runs as and log in (its ~/.claude/.credentials.json "
			"is handed to each run), or set ANTHROPIC_API_KEY in this "
			"provider's \"env\" in config.json");
	return prov_emit_failure(cp->pl.sink, PROV_ERR_PROVIDER_ERROR, status,
				 prov_upstream_text(status));
}

static int on_result(struct claude_parser *cp, const json_t *o)
{
	const json_t *u = json_object_get(o, "usage");
	const char *subtype = prov_json_str(o, "subtype"), *sr = prov_json_str(o, "stop_reason");
	const json_t *text = json_object_get(o, "result");
	struct prov_usage usage = { .present = true };
	int ret;

	/* claude 2.1 reports an answer cut by the output-token limit (after resuming on its
	 * own a few times) as an error result: for the client it is finish_reason "length". */
	const char *api_error = prov_json_str(o, "api_error");
	bool length = api_error && !strcmp(api_error, "max_output_tokens");

	if (!length && (json_is_true(json_object_get(o, "is_error")) ||
			(subtype && !strncmp(subtype, "error", 5))))
		return on_result_error(cp, o) ?: 1;
	/* Print mode without partial messages: the result is the only place of the text. */
	if (!cp->sent.len && json_is_string(text) &&
	    (ret = emit_text(cp, json_string_value(text), json_string_length(text))))
		return ret;
	if (json_is_object(u)) {
		int64_t cache_read = prov_json_count(u, "cache_read_input_tokens", 0);

		/* Anthropic counts cached input apart from input_tokens; OpenAI's
		 * prompt_tokens include it. */
		usage.prompt_tokens = prov_json_count(u, "input_tokens", 0) + cache_read +
				      prov_json_count(u, "cache_creation_input_tokens", 0);
		usage.completion_tokens = prov_json_count(u, "output_tokens", 0);
		usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
		usage.cached_tokens = cache_read;
		if ((ret = prov_emit_usage(cp->pl.sink, &usage)))
			return ret;
	}
	ret = prov_emit_finish(cp->pl.sink,
			       length ? "length"
				      : finish_for(sr			? sr
						   : cp->stop_reason[0] ? cp->stop_reason
									: NULL));
	return ret ?: 1; /* the answer is complete: no need to wait for the exit */
}

/* The init line names the MCP servers and whether each started: when ours (the client's
 * tools) did not, the model cannot see the tools, and answering without them would drop
 * them in silence. Fail the run instead. */
static int on_system(struct claude_parser *cp, const json_t *o)
{
	const json_t *srv;
	size_t i;

	cp->pl.ignored++; /* as before: nothing of the answer */
	if (strcmp(prov_json_str(o, "subtype") ?: "", "init"))
		return 0;
	json_array_foreach(json_object_get(o, "mcp_servers"), i, srv) {
		const char *status = prov_json_str(srv, "status");

		/* "failed" only: a server still starting ("pending") may yet connect. */
		if (strcmp(prov_json_str(srv, "name") ?: "", "olp") || !status ||
		    strcmp(status, "failed"))
			continue;
		return prov_emit_failure(cp->pl.sink, PROV_ERR_PROVIDER_ERROR, 0,
					 "the client's tools could not be declared to claude "
					 "(olp-mcp-tools did not start)")
			       ?: 1;
	}
	return 0;
}

static int claude_line(void *ctx, const char *line, size_t len)
{
	struct claude_parser *cp = ctx;
	json_t *o = prov_json_object(line, len);
	const char *type = prov_json_str(o, "type");
	int ret = 0;

	if (!o) {
		cp->pl.garbage++;
		return 0;
	}
	if (!type)
		cp->pl.ignored++; /* NOLINT(bugprone-branch-clone): as an unknown type */
	else if (!strcmp(type, "stream_event"))
		ret = on_stream_event(cp, o);
	else if (!strcmp(type, "assistant"))
		ret = on_assistant(cp, o);
	else if (!strcmp(type, "result"))
		ret = on_result(cp, o);
	else if (!strcmp(type, "system"))
		ret = on_system(cp, o);
	else
		cp->pl.ignored++; /* system, user, rate_limit_event, and types to come */
	json_decref(o);
	return ret;
}

static void *claude_parser_new(const struct prov_provider *pv)
{
	struct claude_parser *cp = xcalloc(1, sizeof(*cp));

	(void)pv;
	prov_lines_init(&cp->pl);
	buf_init(&cp->sent);
	return cp;
}

static int claude_feed(void *st, const char *data, size_t len, const struct prov_sink *sink)
{
	struct claude_parser *cp = st;

	return prov_lines_feed(&cp->pl, data, len, sink, claude_line, cp);
}

static int claude_finish(void *st, const struct prov_sink *sink)
{
	struct claude_parser *cp = st;
	int ret = prov_lines_finish(&cp->pl, sink, claude_line, cp);

	/* An API error message and then no "result" (the process died): still say why. */
	if (!ret && !cp->pl.done && cp->error_status)
		ret = prov_emit_failure(sink, PROV_ERR_PROVIDER_ERROR, cp->error_status,
					prov_upstream_text(cp->error_status));
	return ret;
}

static void claude_parser_free(void *st)
{
	struct claude_parser *cp = st;

	if (!cp)
		return;
	prov_lines_release(&cp->pl);
	buf_release(&cp->sent);
	free(cp);
}

const struct provider_ops prov_claude_ops = {
	.type = "claude",
	.node_name = "anthropic",
	.settings = PROV_SET_CLI | PROV_SET_MAX_RETRIES | PROV_SET_SYSTEM_PROMPT | PROV_SET_TOOLS,
	/* Measured (docs/performance.md, "Pre-started clients"): the CLI's own start-up is
	 * most of claude's first-token wait, so one is kept started by default. */
	.prestart = 1,
	.bin_env = "OLP_CLAUDE_BIN",
	.bin_name = "claude",
	.credentials = (const char *const[]){ "~/.claude/.credentials.json", NULL },
	.upstream = "https://api.anthropic.com",
	.allow_paths = (const char *const[]){ "POST /v1/messages", "POST /v1/messages/count_tokens",
					      NULL },
	.model_in_argv = true,
	/* claude maps an alias ("sonnet") to a full id itself. */
	.model_aliases = (const char *const[]){ "sonnet", "opus", "haiku", NULL },
	.alias_prefix = "claude-",
	.upstream_tokens = true,
	.credentials_ok = prov_claude_credentials_ok,
	.held = &prov_held_claude,
	.base_url_env = "ANTHROPIC_BASE_URL",
	.api_key_env = "ANTHROPIC_API_KEY",
	.caps = PROV_CAP_IMAGES | PROV_CAP_TOOLS,
	.plan = claude_plan,
	.parser_new = claude_parser_new,
	.parser_feed = claude_feed,
	.parser_finish = claude_finish,
	.parser_free = claude_parser_free,
};
