/* The vibe provider: Mistral's Vibe CLI, streaming output.
 *
 *   vibe --prompt P --output streaming
 *
 *   "providers": { "mistral": { "bin": "…", "credentials": ["~/.vibe/.env"],
 *       "network": { "upstream": "https://api.mistral.ai", "set_headers": {…} } } }
 *
 * The prompt travels in argv (vibe takes it nowhere else), so it is bounded
 * (prov_cli_push_bounded_arg): a longer one is the client's 400. The output is read as
 * tolerantly as the Node OLP does: one JSON object a line, the text in
 * "choices[0].delta.content", "text", "content" or "delta"; "type":"stop" or "done":true
 * ends it. Messages of other roles (the system
 * prompt, the user's own message, tool results) are not the answer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "providers/cli.h"
#include "providers/ndjson.h"
#include "common/banned.h"

static int vibe_plan(const struct prov_provider *pv, const struct prov_request *req,
		     struct prov_plan *plan, struct prov_outcome *out)
{
	struct buf prompt = BUF_INIT;
	int ret;

	if ((ret = prov_cli_push_program(pv, plan, out)))
		return ret;
	/* vibe reads its prompt from its command line only. */
	prov_flatten_messages(req->messages, &prompt);
	ret = prov_cli_push_bounded_arg(pv, plan, "--prompt", &prompt, out);
	buf_release(&prompt);
	if (ret)
		return ret;
	strv_push(&plan->argv, "--output");
	strv_push(&plan->argv, "streaming");
	if ((ret = sbx_policy_setenv(plan->policy, "VIBE_HOME", SBX_HOME_PATH "/.vibe")))
		return ret;
	return prov_cli_bind_credentials(pv, req, plan, out);
}

/* ---- parser ---------------------------------------------------------------------------- */

struct vibe_parser {
	struct prov_lines pl;
};

static const json_t *text_of(const json_t *o)
{
	const json_t *choice = json_array_get(json_object_get(o, "choices"), 0);
	const json_t *delta = json_object_get(o, "delta"), *v;

	if (choice) {
		v = json_object_get(json_object_get(choice, "delta"), "content");
		if (!json_is_string(v))
			v = json_object_get(json_object_get(choice, "message"), "content");
		if (!json_is_string(v))
			v = json_object_get(choice, "text");
		return json_is_string(v) ? v : NULL;
	}
	if (json_is_string(v = json_object_get(o, "text")) ||
	    json_is_string(v = json_object_get(o, "content")))
		return v;
	if (json_is_string(delta))
		return delta;
	if (json_is_string(v = json_object_get(delta, "content")) ||
	    json_is_string(v = json_object_get(delta, "text")))
		return v;
	return NULL;
}

static int on_usage(struct vibe_parser *vp, const json_t *u)
{
	struct prov_usage usage = { .present = true };

	usage.prompt_tokens =
		prov_json_count(u, "prompt_tokens", prov_json_count(u, "input_tokens", 0));
	usage.completion_tokens =
		prov_json_count(u, "completion_tokens", prov_json_count(u, "output_tokens", 0));
	usage.total_tokens =
		prov_json_count(u, "total_tokens", usage.prompt_tokens + usage.completion_tokens);
	return prov_emit_usage(vp->pl.sink, &usage);
}

/* An error line ({"type":"error"} or an "error" member that is set): 1 after emitting the
 * failure (or its emit's error), 0 when o is no error. */
static int vibe_error(struct vibe_parser *vp, const json_t *o)
{
	const char *type = prov_json_str(o, "type");
	const json_t *err = json_object_get(o, "error"), *where;
	const char *msg;
	int st;

	if (!(type && !strcmp(type, "error")) &&
	    !(err && !json_is_null(err) && !json_is_false(err)))
		return 0;
	where = json_is_object(err) ? err : o;
	msg = json_is_string(err) ? json_string_value(err) : prov_json_str(where, "message");
	st = prov_json_status(where, "status", 0);
	if (!st && msg)
		st = prov_find_status(msg);
	return prov_emit_failure(vp->pl.sink, PROV_ERR_PROVIDER_ERROR, st, prov_upstream_text(st))
		       ?: 1;
}

/* Whether o says the answer is over ({"type":"stop"|"done"} or "done": true). */
static bool vibe_done(const json_t *o)
{
	const char *type = prov_json_str(o, "type");

	return (type && (!strcmp(type, "stop") || !strcmp(type, "done"))) ||
	       json_is_true(json_object_get(o, "done"));
}

/* One line's text, usage and finish: 0 to go on, 1 at the answer's end, < 0 to stop. */
static int vibe_content(struct vibe_parser *vp, const json_t *o)
{
	const json_t *choice = json_array_get(json_object_get(o, "choices"), 0), *text;
	const char *fr = prov_json_str(choice, "finish_reason");
	int ret;

	if ((text = text_of(o)) &&
	    (ret = prov_emit_delta(vp->pl.sink, json_string_value(text), json_string_length(text))))
		return ret;
	if (json_is_object(json_object_get(o, "usage")) &&
	    (ret = on_usage(vp, json_object_get(o, "usage"))))
		return ret;
	if (fr && (ret = prov_emit_finish(vp->pl.sink, !strcmp(fr, "length") ? "length" : "stop")))
		return ret;
	if (vibe_done(o))
		return (fr ? 0 : prov_emit_finish(vp->pl.sink, "stop")) ?: 1;
	if (!text && !fr)
		vp->pl.ignored++;
	return 0;
}

static int vibe_line(void *ctx, const char *line, size_t len)
{
	struct vibe_parser *vp = ctx;
	json_t *o = prov_json_object(line, len);
	const char *role = prov_json_str(o, "role");
	int ret;

	if (!o) {
		vp->pl.garbage++;
		return 0;
	}
	if (role && strcmp(role, "assistant")) {
		vp->pl.ignored++;
		ret = 0;
	} else {
		ret = vibe_error(vp, o) ?: vibe_content(vp, o);
	}
	json_decref(o);
	return ret;
}

static void *vibe_parser_new(const struct prov_provider *pv)
{
	struct vibe_parser *vp = xcalloc(1, sizeof(*vp));

	(void)pv;
	prov_lines_init(&vp->pl);
	return vp;
}

static int vibe_feed(void *st, const char *data, size_t len, const struct prov_sink *sink)
{
	struct vibe_parser *vp = st;

	return prov_lines_feed(&vp->pl, data, len, sink, vibe_line, vp);
}

static int vibe_finish(void *st, const struct prov_sink *sink)
{
	struct vibe_parser *vp = st;

	return prov_lines_finish(&vp->pl, sink, vibe_line, vp);
}

static void vibe_parser_free(void *st)
{
	struct vibe_parser *vp = st;

	if (!vp)
		return;
	prov_lines_release(&vp->pl);
	free(vp);
}

const struct provider_ops prov_vibe_ops = {
	.type = "vibe",
	.node_name = "mistral",
	.settings = PROV_SET_CLI,
	/* Not pre-started: its prompt is in argv (ADR 0022); its start-up was not measured. */
	.bin_env = "OLP_VIBE_BIN",
	.bin_name = "vibe",
	/* vibe reads its key from either. */
	.credentials = (const char *const[]){ "~/.vibe/.env", "~/.vibe/config.toml", NULL },
	.upstream = "https://api.mistral.ai",
	.allow_paths = (const char *const[]){ "POST /v1/chat/completions", NULL },
	.upstream_note = "vibe takes its API base from its config.toml only: its provider's "
			 "api_base must be " PROV_NET_URL "/v1 (docs/providers.md)",
	.upstream_tokens = true,
	/* vibe --prompt runs its tools (bash, read_file…) without asking. */
	.runs_commands = true,
	.credentials_ok = prov_vibe_credentials_ok,
	.prompt_in_argv = true,
	/* vibe takes its API base from its config.toml only (docs/providers.md). */
	.api_key_env = "MISTRAL_API_KEY",
	.plan = vibe_plan,
	.parser_new = vibe_parser_new,
	.parser_feed = vibe_feed,
	.parser_finish = vibe_finish,
	.parser_free = vibe_parser_free,
};
