/* POST /v1/responses: the OpenAI Responses API (what codex speaks to a custom provider)
 * as a front-end over the one request path (ADR 0030). The body is translated
 * into a chat completions request (resp_parse.c) and served by fcgi_chat_serve, so keys,
 * quotas, chains, heartbeats and the ledger are those of /v1/chat/completions; only the
 * answer's encoding is this API's (resp_encode.c), through the wire below. Errors are
 * OpenAI's shape (the route's default). */
#include <string.h>

#include "fcgi/worker.h"
#include "common/banned.h"

_Static_assert(FCGI_RESP_MAX_CALLS >= FCGI_MAX_CALLS, "a call the answer keeps has its item");

static struct fcgi_tool_call call_of(const struct fcgi_answer *a, size_t i)
{
	const struct fcgi_call *c = &a->calls[i];

	return (struct fcgi_tool_call){
		.id = c->id, .name = c->name, .args = c->args.data, .args_len = c->args.len
	};
}

/* The stream's first events (response.created, response.in_progress), before its first
 * piece, heartbeat or end. */
static struct fcgi_resp_state *begun(struct fcgi_answer *a, struct buf *out)
{
	struct fcgi_resp_state *s = a->wire_ctx;

	if (!s->seq)
		fcgi_resp_begin(s, out);
	return s;
}

static void resp_text(struct fcgi_answer *a, struct buf *out, const char *text, size_t len)
{
	fcgi_resp_text(begun(a, out), out, text, len);
}

static void resp_tool(struct fcgi_answer *a, struct buf *out, size_t i, bool first,
		      const char *args, size_t len)
{
	struct fcgi_tool_call c = call_of(a, i);

	fcgi_resp_call(begun(a, out), out, i, &c, first, args, len);
}

static void resp_beat(struct fcgi_answer *a, struct buf *out)
{
	(void)begun(a, out);
	fcgi_resp_beat(out);
}

static void resp_end(struct fcgi_answer *a, struct buf *out, const struct prov_outcome *o)
{
	struct fcgi_tool_call calls[FCGI_MAX_CALLS];

	for (size_t i = 0; i < a->ncalls; i++)
		calls[i] = call_of(a, i);
	fcgi_resp_end(begun(a, out), out, calls, a->ncalls, o);
}

static void resp_whole(struct fcgi_answer *a, struct buf *out, const struct prov_outcome *o)
{
	struct fcgi_tool_call calls[FCGI_MAX_CALLS];

	for (size_t i = 0; i < a->ncalls; i++)
		calls[i] = call_of(a, i);
	fcgi_resp_whole(a->wire_ctx, out, a->text.data, a->text.len, calls, a->ncalls, o);
}

static const struct fcgi_wire wire_responses = { .text = resp_text,
						 .tool = resp_tool,
						 .beat = resp_beat,
						 .end = resp_end,
						 .whole = resp_whole };

void fcgi_handle_responses(struct fcgi_req *rc)
{
	struct buf body = BUF_INIT;
	struct fcgi_resp_request rr;
	struct fcgi_chat_request req;
	struct fcgi_resp_state st;
	struct fcgi_error err;
	json_t *chat;

	memset(&rr, 0, sizeof(rr));
	memset(&req, 0, sizeof(req));
	if (fcgi_authenticate(rc, true))
		goto out;
	rc->chat = true;
	if (fcgi_read_json_body(rc, &body))
		goto out;
	if (fcgi_resp_parse(body.data, body.len, &rr, &err)) {
		fcgi_send_error(rc, &err, NULL);
		goto out;
	}
	chat = rr.chat;
	rr.chat = NULL; /* the chat request owns it now, also when it refuses it */
	if (fcgi_chat_parse_json(chat, &req, &err)) {
		fcgi_send_error(rc, &err, NULL);
		goto out;
	}
	fcgi_resp_state_init(&st, req.model, rr.custom);
	fcgi_chat_serve(rc, &req, body.len, &wire_responses, &st);
	fcgi_resp_state_release(&st);
out:
	fcgi_chat_release(&req);
	fcgi_resp_release(&rr);
	buf_release(&body);
}
