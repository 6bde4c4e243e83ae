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
 *       "system_prompt": "…", "network": true } }
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

/* The run's stdin: the initialize request carrying the system prompt (the configured or
 * built-in one, then the client's system messages), then the rest of the conversation,
 * flattened, as one user message. */
static void claude_stdin(const struct prov_provider *pv, const json_t *messages, struct buf *in)
{
	struct buf system = BUF_INIT;
	json_t *blocks = json_array();

	if (!blocks)
		abort();
	prov_cli_split_messages(messages, &system, NULL, blocks);
	buf_adds(in, "{\"type\":\"control_request\",\"request_id\":\"olp-init\","
		     "\"request\":{\"subtype\":\"initialize\",\"systemPrompt\":");
	if (system.len) {
		struct buf s = BUF_INIT;

		buf_adds(&s, pv->system_prompt ? pv->system_prompt : default_system_prompt);
		buf_adds(&s, "\n\n");
		buf_add(&s, system.data, system.len);
		buf_add_json_str(in, s.data, s.len);
		buf_release(&s);
	} else {
		const char *dflt = pv->system_prompt ? pv->system_prompt : default_system_prompt;

		buf_add_json_str(in, dflt, strlen(dflt));
	}
	buf_adds(in, "}}\n{\"type\":\"user\",\"message\":{\"role\":\"user\",\"content\":");
	claude_user_content(blocks, in);
	buf_adds(in, "},\"parent_tool_use_id\":null,\"session_id\":\"\"}\n");
	buf_release(&system);
	json_decref(blocks);
}

static int claude_plan(const struct prov_provider *pv, const struct prov_request *req,
		       struct prov_plan *plan, struct prov_outcome *out)
{
	static const char *const creds[] = { "~/.claude/.credentials.json", NULL };
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

	if ((ret = prov_cli_push_program(pv, "OLP_CLAUDE_BIN", "claude", plan, out)))
		return ret;
	for (size_t i = 0; i < ARRAY_SIZE(args); i++)
		strv_push(&plan->argv, args[i]);
	claude_stdin(pv, req->messages, &plan->stdin_data);
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
	return prov_cli_bind_credentials(pv, creds, plan, out);
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
};

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
	.caps = PROV_CAP_IMAGES,
	.plan = claude_plan,
	.parser_new = claude_parser_new,
	.parser_feed = claude_feed,
	.parser_finish = claude_finish,
	.parser_free = claude_parser_free,
};
