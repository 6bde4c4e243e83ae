/* POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API, the one
 * Claude Code speaks (ANTHROPIC_BASE_URL). A front-end over the chat request path (ADR
 * 0030): the body is checked and translated (messages_parse.c) into a chat request, which
 * fcgi_chat_serve serves as any other (keys, quotas, chains, heartbeats, the ledger), and
 * the answer goes out through this file's wire in Anthropic's shapes (messages_encode.c).
 * The routes are flagged FCGI_ROUTE_ANTHROPIC: every error of theirs, from the 401 on, is
 * Anthropic's error object. anthropic-version and anthropic-beta are accepted whatever
 * they say: the answer is the same. */
#include <stdio.h>
#include <string.h>

#include "fcgi/worker.h"
#include "common/banned.h"

/* ---- the wire: fcgi_answer's events as Anthropic's ---------------------------------------- */

/* A call's id as the model gave it (claude: "toolu_…"); a provider that gave none gets
 * one, since a tool_result must name it. */
static void call_id(struct fcgi_call *c)
{
	char hex[25];

	if (c->id[0])
		return;
	random_hex(hex, 12);
	snprintf(c->id, sizeof(c->id), "toolu_olp%s", hex);
}

static void msg_text(struct fcgi_answer *a, struct buf *out, const char *text, size_t len)
{
	fcgi_msg_sse_text(a->wire_ctx, out, text, len);
}

static void msg_tool(struct fcgi_answer *a, struct buf *out, size_t i, bool first, const char *args,
		     size_t len)
{
	struct fcgi_call *c = &a->calls[i];

	if (first)
		call_id(c);
	fcgi_msg_sse_tool(a->wire_ctx, out, i, first ? c->id : NULL, first ? c->name : NULL, args,
			  len);
}

static void msg_beat(struct fcgi_answer *a, struct buf *out)
{
	fcgi_msg_sse_ping(a->wire_ctx, out);
}

static void msg_end(struct fcgi_answer *a, struct buf *out, const struct prov_outcome *o)
{
	struct fcgi_error e = { .status = o->status ? o->status : 502 };

	if (!o->err) {
		fcgi_msg_sse_end(a->wire_ctx, out, fcgi_messages_stop_reason(o->finish_reason),
				 a->stopped ? a->stop_hit : NULL, &o->usage);
		return;
	}
	/* The status can no longer change: the failure is an error event, its type the
	 * one its status has in Anthropic's API (504 api_error, 429 rate_limit_error…). */
	snprintf(e.message, sizeof(e.message), "%s", o->message);
	fcgi_msg_sse_error(a->wire_ctx, out, &e);
}

static void msg_whole(struct fcgi_answer *a, struct buf *out, const struct prov_outcome *o)
{
	struct fcgi_tool_call calls[FCGI_MAX_CALLS];

	for (size_t i = 0; i < a->ncalls; i++) {
		call_id(&a->calls[i]);
		calls[i] = (struct fcgi_tool_call){ .id = a->calls[i].id,
						    .name = a->calls[i].name,
						    .args = a->calls[i].args.data,
						    .args_len = a->calls[i].args.len };
	}
	fcgi_msg_json(out, a->wire_ctx, a->text.data, a->text.len, calls, a->ncalls,
		      fcgi_messages_stop_reason(o->finish_reason), a->stopped ? a->stop_hit : NULL,
		      &o->usage);
}

static const struct fcgi_wire wire_messages = {
	.text = msg_text, .tool = msg_tool, .beat = msg_beat, .end = msg_end, .whole = msg_whole
};

/* ---- the routes --------------------------------------------------------------------------- */

/* Authenticate, read and translate the body into req (parsed as a chat request). 0, or -1
 * after answering (401, 415, 413, 400). body holds the raw body either way. */
static int messages_request(struct fcgi_req *rc, bool count, struct buf *body,
			    struct fcgi_chat_request *req)
{
	struct fcgi_error err;
	json_error_t jerr;
	json_t *root, *chat;

	if (fcgi_authenticate(rc, true))
		return -1;
	/* A request that passed auth gets its ledger row, as a chat completion does. */
	rc->chat = !count;
	if (fcgi_read_json_body(rc, body))
		return -1;
	root = json_loadb(body->data, body->len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
	if (!root) {
		fcgi_fail(rc, 400, "invalid_request_error", NULL,
			  "Invalid JSON body: %s (line %d, column %d)", jerr.text, jerr.line,
			  jerr.column);
		return -1;
	}
	chat = fcgi_messages_translate(root, count, &err);
	json_decref(root);
	/* fcgi_chat_parse_json checks the translation again, as any chat request: a valid
	 * Messages request passes; what fails still names its field. */
	if (!chat || fcgi_chat_parse_json(chat, req, &err)) {
		fcgi_send_error(rc, &err, NULL);
		return -1;
	}
	return 0;
}

void fcgi_handle_messages(struct fcgi_req *rc)
{
	struct buf body = BUF_INIT;
	struct fcgi_chat_request req = { 0 };
	struct fcgi_msg_stream st;

	if (!messages_request(rc, false, &body, &req)) {
		fcgi_msg_stream_init(&st, req.model);
		fcgi_chat_serve(rc, &req, body.len, &wire_messages, &st);
	}
	fcgi_chat_release(&req);
	buf_release(&body);
}

/* Whether the caller may use model (a chain: one of its hops), as fcgi_chat_serve checks
 * before a run. */
static bool model_open_to(struct fcgi_req *rc, const char *model)
{
	const struct fcgi_chain *chain = fcgi_config_chain(&rc->app->cfg, model);
	const struct prov_model *m;

	if (chain) {
		for (size_t i = 0; i < chain->nhops; i++)
			if (fcgi_access_check(&rc->id, chain->hops[i]->provider) == FCGI_ACCESS_OK)
				return true;
		return false;
	}
	m = prov_registry_find(rc->app->reg, model);
	return m && fcgi_access_check(&rc->id, m->provider) == FCGI_ACCESS_OK;
}

/* count_tokens starts no run and counts against no quota: it needs a key and a model
 * this server has (404 otherwise, as /v1/messages would answer). */
void fcgi_handle_count_tokens(struct fcgi_req *rc)
{
	struct buf body = BUF_INIT, out = BUF_INIT;
	struct fcgi_chat_request req = { 0 };

	if (messages_request(rc, true, &body, &req))
		goto out;
	if (!fcgi_config_chain(&rc->app->cfg, req.model) &&
	    !prov_registry_find(rc->app->reg, req.model)) {
		fcgi_fail(rc, 404, "model_not_found", "model_not_found",
			  "model: the model '%.200s' does not exist", req.model);
		goto out;
	}
	/* A key counts only for what it could send: the same 403 as /v1/messages. */
	if (!model_open_to(rc, req.model)) {
		fcgi_fail(rc, 403, "permission_error", "key_no_provider_access",
			  "model: this OLP API key may not use model '%.200s'", req.model);
		goto out;
	}
	buf_addf(&out, "{\"input_tokens\":%lld}",
		 (long long)fcgi_messages_count_tokens(req.messages, req.tools));
	fcgi_send_json(rc, 200, &out, NULL);
out:
	fcgi_chat_release(&req);
	buf_release(&body);
	buf_release(&out);
}
