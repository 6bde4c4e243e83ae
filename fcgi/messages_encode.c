/* The Anthropic Messages answers: a whole Message object, and a stream's server-sent
 * events in the order Anthropic publishes (message_start, ping, per content block
 * content_block_start → content_block_delta* → content_block_stop, message_delta,
 * message_stop; an error event for a failure after the start). The stream's state is the
 * caller's (struct fcgi_msg_stream), so that each piece of the answer becomes whole
 * events as it comes. No I/O. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fcgi/fcgi.h"
#include "common/banned.h"

void fcgi_msg_stream_init(struct fcgi_msg_stream *st, const char *model)
{
	char hex[25];

	memset(st, 0, sizeof(*st));
	random_hex(hex, 12);
	snprintf(st->id, sizeof(st->id), "msg_olp%s", hex);
	st->model = model;
}

const char *fcgi_messages_stop_reason(const char *finish_reason)
{
	if (!strcmp(finish_reason, "length"))
		return "max_tokens";
	if (!strcmp(finish_reason, "tool_calls"))
		return "tool_use";
	if (!strcmp(finish_reason, "content_filter"))
		return "refusal";
	return "end_turn";
}

void fcgi_msg_usage_json(struct buf *out, const struct prov_usage *u)
{
	int64_t cached = u && u->present ? u->cached_tokens : 0;
	int64_t input = u && u->present ? u->prompt_tokens - cached : 0;

	/* OLP's prompt_tokens hold the cached part (OpenAI's way); Anthropic's input_tokens
	 * do not. */
	buf_addf(out,
		 "{\"input_tokens\":%lld,\"output_tokens\":%lld,\"cache_read_input_tokens\":%lld}",
		 (long long)(input > 0 ? input : 0),
		 (long long)(u && u->present ? u->completion_tokens : 0), (long long)cached);
}

static void event_head(struct buf *out, const char *name)
{
	buf_addf(out, "event: %s\ndata: {\"type\":\"%s\"", name, name);
}

static void event_tail(struct buf *out)
{
	buf_adds(out, "}\n\n");
}

/* The Message's head fields: id, type, role, model. */
static void message_head(struct buf *out, const struct fcgi_msg_stream *st)
{
	buf_addf(out,
		 "{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\",\"model\":", st->id);
	buf_add_json_str(out, st->model, strlen(st->model));
}

/* message_start and a ping, once, before anything else. */
static void start(struct fcgi_msg_stream *st, struct buf *out)
{
	if (st->started)
		return;
	st->started = true;
	event_head(out, "message_start");
	buf_adds(out, ",\"message\":");
	message_head(out, st);
	buf_adds(out, ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":");
	/* Not known before the run's end: message_delta has the counts. */
	fcgi_msg_usage_json(out, NULL);
	buf_addch(out, '}');
	event_tail(out);
	buf_adds(out, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
}

static void block_stop(struct fcgi_msg_stream *st, struct buf *out)
{
	if (st->open == FCGI_MSG_BLOCK_NONE)
		return;
	event_head(out, "content_block_stop");
	buf_addf(out, ",\"index\":%u", st->nblocks - 1);
	event_tail(out);
	st->open = FCGI_MSG_BLOCK_NONE;
}

void fcgi_msg_sse_text(struct fcgi_msg_stream *st, struct buf *out, const char *text, size_t len)
{
	start(st, out);
	if (st->open != FCGI_MSG_BLOCK_TEXT) {
		block_stop(st, out);
		event_head(out, "content_block_start");
		buf_addf(out, ",\"index\":%u,\"content_block\":{\"type\":\"text\",\"text\":\"\"}",
			 st->nblocks++);
		event_tail(out);
		st->open = FCGI_MSG_BLOCK_TEXT;
	}
	event_head(out, "content_block_delta");
	buf_addf(out,
		 ",\"index\":%u,\"delta\":{\"type\":\"text_delta\",\"text\":", st->nblocks - 1);
	buf_add_json_str(out, text, len);
	buf_addch(out, '}');
	event_tail(out);
}

void fcgi_msg_sse_tool(struct fcgi_msg_stream *st, struct buf *out, size_t call, const char *id,
		       const char *name, const char *json, size_t len)
{
	start(st, out);
	if (id && name) {
		block_stop(st, out);
		event_head(out, "content_block_start");
		buf_addf(out, ",\"index\":%u,\"content_block\":{\"type\":\"tool_use\",\"id\":",
			 st->nblocks++);
		buf_add_json_str(out, id, strlen(id));
		buf_adds(out, ",\"name\":");
		buf_add_json_str(out, name, strlen(name));
		buf_adds(out, ",\"input\":{}}");
		event_tail(out);
		st->open = FCGI_MSG_BLOCK_TOOL;
		st->open_call = call;
	} else if (st->open != FCGI_MSG_BLOCK_TOOL || st->open_call != call) {
		return;
	}
	if (!len)
		return;
	event_head(out, "content_block_delta");
	buf_addf(out, ",\"index\":%u,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":",
		 st->nblocks - 1);
	buf_add_json_str(out, json, len);
	buf_addch(out, '}');
	event_tail(out);
}

void fcgi_msg_sse_ping(struct fcgi_msg_stream *st, struct buf *out)
{
	if (!st->started) {
		start(st, out); /* message_start, then its ping */
		return;
	}
	buf_adds(out, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
}

static void stop_fields(struct buf *out, const char *stop_reason, const char *stop_sequence)
{
	buf_adds(out, "\"stop_reason\":");
	buf_add_json_str(out, stop_sequence ? "stop_sequence" : stop_reason,
			 strlen(stop_sequence ? "stop_sequence" : stop_reason));
	buf_adds(out, ",\"stop_sequence\":");
	if (stop_sequence)
		buf_add_json_str(out, stop_sequence, strlen(stop_sequence));
	else
		buf_adds(out, "null");
}

void fcgi_msg_sse_end(struct fcgi_msg_stream *st, struct buf *out, const char *stop_reason,
		      const char *stop_sequence, const struct prov_usage *u)
{
	start(st, out);
	block_stop(st, out);
	event_head(out, "message_delta");
	buf_adds(out, ",\"delta\":{");
	stop_fields(out, stop_reason, stop_sequence);
	buf_adds(out, "},\"usage\":");
	fcgi_msg_usage_json(out, u);
	event_tail(out);
	event_head(out, "message_stop");
	event_tail(out);
}

void fcgi_msg_sse_error(struct fcgi_msg_stream *st, struct buf *out, const struct fcgi_error *e)
{
	(void)st;
	buf_adds(out, "event: error\ndata: ");
	fcgi_error_json_api(e, FCGI_API_ANTHROPIC, out);
	buf_adds(out, "\n\n");
}

/* A call's arguments as the input object: {} when they are not one (a call cut short). */
static void tool_input(struct buf *out, const struct fcgi_tool_call *c)
{
	json_t *v = json_loadb(c->args, c->args_len, 0, NULL);
	char *dump = json_is_object(v) ? json_dumps(v, JSON_COMPACT) : NULL;

	buf_adds(out, dump ? dump : "{}");
	free(dump);
	json_decref(v);
}

void fcgi_msg_json(struct buf *out, const struct fcgi_msg_stream *st, const char *text, size_t len,
		   const struct fcgi_tool_call *calls, size_t ncalls, const char *stop_reason,
		   const char *stop_sequence, const struct prov_usage *u)
{
	message_head(out, st);
	buf_adds(out, ",\"content\":[");
	if (len) {
		buf_adds(out, "{\"type\":\"text\",\"text\":");
		buf_add_json_str(out, text, len);
		buf_addch(out, '}');
	}
	for (size_t i = 0; i < ncalls; i++) {
		buf_adds(out, len || i ? ",{\"type\":\"tool_use\",\"id\":"
				       : "{\"type\":\"tool_use\",\"id\":");
		buf_add_json_str(out, calls[i].id, strlen(calls[i].id));
		buf_adds(out, ",\"name\":");
		buf_add_json_str(out, calls[i].name, strlen(calls[i].name));
		buf_adds(out, ",\"input\":");
		tool_input(out, &calls[i]);
		buf_addch(out, '}');
	}
	buf_adds(out, "],");
	stop_fields(out, stop_reason, stop_sequence);
	buf_adds(out, ",\"usage\":");
	fcgi_msg_usage_json(out, u);
	buf_addch(out, '}');
}
