/* The generic "command" provider: a local program configured in the registry gets the
 * flattened prompt on stdin; its stdout is the answer, streamed as it arrives.
 *
 *   "providers": { "local": { "type": "command", "argv": ["/usr/bin/…", "…"],
 *                             "ro_paths": [...], "network": false, "env": {...},
 *                             "output": "text" | "sse" | "ndjson",
 *                             "timeout_s": 60, "models": [{"id": "…"}] } }
 *
 * "output" says how stdout is read:
 *   text    (default) the bytes are the answer, passed on as they arrive;
 *   sse     OpenAI-style server-sent events, as a local OpenAI-compatible tool prints
 *           them: "data: {chat.completion.chunk}" lines, ended by "data: [DONE]";
 *   ndjson  one OpenAI chunk object (or a whole chat.completion) a line.
 * From a chunk: choices[0].delta.content (or .message.content) is a delta,
 * choices[0].finish_reason the finish, "usage" the token counts, "error" a provider error
 * (reported with OLP's own words, never the tool's text). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "providers/internal.h"
#include "providers/ndjson.h"
#include "common/banned.h"

static bool under_usr(const char *path)
{
	char real[PATH_MAX];

	return realpath(path, real) && !strncmp(real, "/usr/", 5);
}

static int command_plan(const struct prov_provider *pv, const struct prov_request *req,
			struct prov_plan *plan, struct prov_outcome *out)
{
	const char *exe = pv->argv.v[0];
	int ret = 0;

	for (size_t i = 0; i < pv->argv.n; i++)
		strv_push(&plan->argv, pv->argv.v[i]);
	/* The program itself must be visible inside the sandbox; /usr (and /bin, a link
	 * into it on merged-/usr systems) already is. */
	if (!under_usr(exe))
		ret = sbx_policy_add_ro(plan->policy, exe);
	for (size_t i = 0; !ret && i < pv->ro_paths.n; i++)
		ret = sbx_policy_add_ro(plan->policy, pv->ro_paths.v[i]);
	if (ret) {
		snprintf(out->message, sizeof(out->message), "provider %s: %s", pv->name,
			 strerror(-ret));
		return ret;
	}
	prov_flatten_messages(req->messages, &plan->stdin_data);
	return 0;
}

/* ---- parser ---------------------------------------------------------------------------- */

struct command_parser {
	enum prov_output mode;
	struct prov_text_reader text; /* PROV_OUTPUT_TEXT */
	struct prov_lines pl;	      /* the line modes */
};

/* Finish reasons a client may see; anything else a tool prints becomes "stop". */
static const char *known_finish(const char *fr)
{
	static const char *const known[] = { "stop", "length", "content_filter", "tool_calls",
					     "function_call" };

	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		if (!strcmp(fr, known[i]))
			return known[i];
	return "stop";
}

static int chunk_usage(struct command_parser *cp, const json_t *u)
{
	struct prov_usage usage = { .present = true };
	const json_t *details = json_object_get(u, "prompt_tokens_details");

	usage.prompt_tokens = prov_json_count(u, "prompt_tokens", 0);
	usage.completion_tokens = prov_json_count(u, "completion_tokens", 0);
	usage.total_tokens =
		prov_json_count(u, "total_tokens", usage.prompt_tokens + usage.completion_tokens);
	usage.cached_tokens = prov_json_count(details, "cached_tokens", 0);
	return prov_emit_usage(cp->pl.sink, &usage);
}

/* One OpenAI chunk (or completion) object: 0, > 0 when it ended the answer, < 0 abort. */
static int chunk(struct command_parser *cp, const char *line, size_t len)
{
	json_t *o = prov_json_object(line, len);
	const json_t *choice, *text, *err;
	const char *fr;
	int ret = 0;

	if (!o) {
		cp->pl.garbage++;
		return 0;
	}
	err = json_object_get(o, "error");
	if (err && !json_is_null(err) && !json_is_false(err)) {
		const json_t *eo = json_is_object(err) ? err : o;
		const char *msg =
			json_is_string(err) ? json_string_value(err) : prov_json_str(eo, "message");
		int st = prov_json_status(eo, "status", prov_json_status(eo, "code", 0));

		if (st < 100 || st > 599)
			st = msg ? prov_find_status(msg) : 0;
		ret = prov_emit_failure(cp->pl.sink, PROV_ERR_PROVIDER_ERROR, st,
					prov_upstream_text(st))
			      ?: 1;
		goto out_obj;
	}
	choice = json_array_get(json_object_get(o, "choices"), 0);
	text = json_object_get(json_object_get(choice, "delta"), "content");
	if (!json_is_string(text))
		text = json_object_get(json_object_get(choice, "message"), "content");
	if (json_is_string(text) &&
	    (ret = prov_emit_delta(cp->pl.sink, json_string_value(text), json_string_length(text))))
		goto out_obj;
	if ((fr = prov_json_str(choice, "finish_reason")) &&
	    (ret = prov_emit_finish(cp->pl.sink, known_finish(fr))))
		goto out_obj;
	if (json_is_object(json_object_get(o, "usage")) &&
	    (ret = chunk_usage(cp, json_object_get(o, "usage"))))
		goto out_obj;
	if (!json_is_string(text) && !fr && !json_is_object(json_object_get(o, "usage")))
		cp->pl.ignored++;
out_obj:
	json_decref(o);
	return ret;
}

static bool is_done(const char *p, size_t len)
{
	while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
		len--;
	return len == 6 && !memcmp(p, "[DONE]", 6);
}

/* "data: X" carries X; "event:", "id:", "retry:" and ":comment" lines are SSE framing
 * this reader has no use for. One data line holds one whole chunk, as OpenAI sends it. */
static int sse_line(void *ctx, const char *line, size_t len)
{
	struct command_parser *cp = ctx;

	if (len < 5 || memcmp(line, "data:", 5)) {
		cp->pl.ignored++;
		return 0;
	}
	line += 5;
	len -= 5;
	if (len && *line == ' ') {
		line++;
		len--;
	}
	return is_done(line, len) ? 1 : chunk(cp, line, len);
}

static int ndjson_line(void *ctx, const char *line, size_t len)
{
	struct command_parser *cp = ctx;

	return is_done(line, len) ? 1 : chunk(cp, line, len);
}

static void *command_parser_new(const struct prov_provider *pv)
{
	struct command_parser *cp = xcalloc(1, sizeof(*cp));

	cp->mode = pv ? pv->output : PROV_OUTPUT_TEXT;
	if (cp->mode != PROV_OUTPUT_TEXT)
		prov_lines_init(&cp->pl);
	return cp;
}

static int command_feed(void *st, const char *data, size_t len, const struct prov_sink *sink)
{
	struct command_parser *cp = st;

	switch (cp->mode) {
	case PROV_OUTPUT_SSE: return prov_lines_feed(&cp->pl, data, len, sink, sse_line, cp);
	case PROV_OUTPUT_NDJSON: return prov_lines_feed(&cp->pl, data, len, sink, ndjson_line, cp);
	case PROV_OUTPUT_TEXT: break;
	}
	return prov_text_feed(&cp->text, data, len, sink);
}

static int command_finish(void *st, const struct prov_sink *sink)
{
	struct command_parser *cp = st;

	switch (cp->mode) {
	case PROV_OUTPUT_SSE: return prov_lines_finish(&cp->pl, sink, sse_line, cp);
	case PROV_OUTPUT_NDJSON: return prov_lines_finish(&cp->pl, sink, ndjson_line, cp);
	case PROV_OUTPUT_TEXT: break;
	}
	return prov_text_finish(&cp->text, sink);
}

static void command_parser_free(void *st)
{
	struct command_parser *cp = st;

	if (!cp)
		return;
	if (cp->mode != PROV_OUTPUT_TEXT)
		prov_lines_release(&cp->pl);
	free(cp);
}

const struct provider_ops prov_command_ops = {
	.type = "command",
	/* Its program is its "argv"; no network, credentials or pre-start unless set: a
	 * command is the operator's to judge. */
	.settings = PROV_SET_COMMAND,
	.plan = command_plan,
	.parser_new = command_parser_new,
	.parser_feed = command_feed,
	.parser_finish = command_finish,
	.parser_free = command_parser_free,
};
