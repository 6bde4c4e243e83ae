/* POST /v1/responses, the answer: the Responses events of a stream and the response
 * object, as OpenAI sends them and codex reads them. A stream always ends with one
 * response.completed (codex fails a turn without it: "stream closed before
 * response.completed"), response.incomplete (the answer hit max_output_tokens) or
 * response.failed (the run failed after the stream began; its code one codex knows), and
 * every event has its sequence_number. codex takes its history from the items of
 * response.output_item.done, so each is the whole item. No I/O here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fcgi/fcgi.h"
#include "common/banned.h"

void fcgi_resp_state_init(struct fcgi_resp_state *s, const char *model, const json_t *custom)
{
	char hex[25];

	memset(s, 0, sizeof(*s));
	random_hex(hex, 12);
	snprintf(s->id, sizeof(s->id), "resp_%s", hex);
	s->created = (int64_t)time(NULL);
	s->model = model;
	s->custom = custom;
	buf_init(&s->text);
	s->items = json_array();
}

void fcgi_resp_state_release(struct fcgi_resp_state *s)
{
	buf_release(&s->text);
	json_decref(s->items);
	s->items = NULL;
}

/* An item's id: its kind's prefix, the response's id and its output_index. */
static json_t *item_id(const struct fcgi_resp_state *s, const char *prefix, size_t index)
{
	char id[64];

	snprintf(id, sizeof(id), "%s_%s_%zu", prefix, s->id + 5, index);
	return json_string(id);
}

static void add_json(struct buf *out, json_t *v)
{
	char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);

	buf_adds(out, text ? text : "null");
	free(text);
}

/* One event: "event: TYPE" and its data, {"type", "sequence_number", …}: opened here, its
 * other fields appended by the caller, closed by event_close. The hot ones (the deltas)
 * are written straight into out; the rarer ones through jansson (event). */
static void event_open(struct fcgi_resp_state *s, struct buf *out, const char *type)
{
	buf_addf(out, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%llu", type, type,
		 (unsigned long long)s->seq++);
}

static void event_close(struct buf *out)
{
	buf_adds(out, "}\n\n");
}

/* An event whose fields are the members of fields (taken). */
static void event(struct fcgi_resp_state *s, struct buf *out, const char *type, json_t *fields)
{
	const char *key;
	json_t *v;

	event_open(s, out, type);
	json_object_foreach(fields, key, v) {
		buf_addch(out, ',');
		buf_add_json_str(out, key, strlen(key));
		buf_addch(out, ':');
		add_json(out, v);
	}
	event_close(out);
	json_decref(fields);
}

static bool is_custom(const struct fcgi_resp_state *s, const char *name)
{
	const json_t *n;
	size_t i;

	json_array_foreach(s->custom, i, n)
		if (!strcmp(json_string_value(n), name))
			return true;
	return false;
}

/* A call of the model's as its whole item: a function_call with the JSON arguments, or a
 * custom_tool_call with the input the model passed (unwrapped from the one-string
 * function it was declared as; kept whole when it is not that). */
static json_t *call_item(const struct fcgi_resp_state *s, size_t index,
			 const struct fcgi_tool_call *c, const char *status)
{
	json_t *args, *input;

	if (!is_custom(s, c->name))
		return json_pack("{s:o,s:s,s:s,s:s,s:s,s:s%}", "id", item_id(s, "fc", index),
				 "type", "function_call", "status", status, "call_id", c->id,
				 "name", c->name, "arguments", c->args_len ? c->args : "{}",
				 c->args_len ? c->args_len : 2);
	args = json_loadb(c->args, c->args_len, 0, NULL);
	input = json_object_get(args, "input");
	input = json_is_string(input) ? json_incref(input) : json_stringn(c->args, c->args_len);
	json_decref(args);
	return json_pack("{s:o,s:s,s:s,s:s,s:s,s:o}", "id", item_id(s, "ctc", index), "type",
			 "custom_tool_call", "status", status, "call_id", c->id, "name", c->name,
			 "input", input ? input : json_string(""));
}

static json_t *output_text_part(const char *text, size_t len)
{
	return json_pack("{s:s,s:s%,s:[]}", "type", "output_text", "text", text, len,
			 "annotations");
}

static json_t *message_item(const struct fcgi_resp_state *s, size_t index, const char *status,
			    const char *text, size_t len)
{
	return json_pack("{s:o,s:s,s:s,s:s,s:[o]}", "id", item_id(s, "msg", index), "type",
			 "message", "status", status, "role", "assistant", "content",
			 output_text_part(text, len));
}

/* A failure's code and message, in the words codex acts on: rate_limit_exceeded (it
 * waits the "try again in N s" and retries), insufficient_quota and
 * context_length_exceeded (it stops), server_error (it retries). */
static json_t *error_json(const struct prov_outcome *o)
{
	char msg[320];
	const char *code = "server_error";

	snprintf(msg, sizeof(msg), "%s", o->message[0] ? o->message : "The provider failed");
	if (o->err == PROV_ERR_CONCURRENCY_LIMIT || o->upstream_status == 429) {
		code = "rate_limit_exceeded";
		snprintf(msg, sizeof(msg), "Rate limit reached: %.200s. Please try again in 2s.",
			 o->message[0] ? o->message : "the provider is busy");
	} else if (o->upstream_status == 402) {
		code = "insufficient_quota";
	} else if (o->err == PROV_ERR_PROMPT_REFUSED) {
		code = "context_length_exceeded";
	}
	return json_pack("{s:s,s:s}", "code", code, "message", msg);
}

static void add_usage(struct buf *out, const struct prov_usage *u)
{
	buf_addf(out,
		 "{\"input_tokens\":%lld,\"input_tokens_details\":{\"cached_tokens\":%lld},"
		 "\"output_tokens\":%lld,\"output_tokens_details\":{\"reasoning_tokens\":0},"
		 "\"total_tokens\":%lld}",
		 (long long)u->prompt_tokens, (long long)u->cached_tokens,
		 (long long)u->completion_tokens,
		 (long long)u->prompt_tokens + (long long)u->completion_tokens);
}

/* The response object; status "in_progress", "completed", "incomplete" or "failed"; o
 * NULL before the end. Its output: the items done (the calls not done yet left out). */
static void add_response(const struct fcgi_resp_state *s, struct buf *out, const char *status,
			 const struct prov_outcome *o)
{
	const json_t *it;
	size_t i, n = 0;

	buf_addf(out,
		 "{\"id\":\"%s\",\"object\":\"response\",\"created_at\":%lld,\"status\":\"%s\","
		 "\"model\":",
		 s->id, (long long)s->created, status);
	buf_add_json_str(out, s->model, strlen(s->model));
	buf_adds(out, ",\"error\":");
	if (o && o->err) {
		json_t *e = error_json(o);

		add_json(out, e);
		json_decref(e);
	} else {
		buf_adds(out, "null");
	}
	buf_adds(out, ",\"incomplete_details\":");
	buf_adds(out, o && !o->err && !strcmp(o->finish_reason, "length")
			      ? "{\"reason\":\"max_output_tokens\"}"
			      : "null");
	buf_adds(out, ",\"output\":[");
	json_array_foreach(s->items, i, it) {
		if (json_is_null(it))
			continue;
		if (n++)
			buf_addch(out, ',');
		add_json(out, (json_t *)it);
	}
	buf_adds(out, "],\"parallel_tool_calls\":true,\"tool_choice\":\"auto\",\"tools\":[],"
		      "\"store\":false,\"text\":{\"format\":{\"type\":\"text\"}},\"usage\":");
	if (o)
		add_usage(out, &o->usage);
	else
		buf_adds(out, "null");
	buf_addch(out, '}');
}

/* response.created, .in_progress, .completed, .incomplete or .failed. */
static void response_event(struct fcgi_resp_state *s, struct buf *out, const char *type,
			   const char *status, const struct prov_outcome *o)
{
	event_open(s, out, type);
	buf_adds(out, ",\"response\":");
	add_response(s, out, status, o);
	event_close(out);
}

void fcgi_resp_begin(struct fcgi_resp_state *s, struct buf *out)
{
	response_event(s, out, "response.created", "in_progress", NULL);
	response_event(s, out, "response.in_progress", "in_progress", NULL);
}

/* The open message item's end: its text done, its part done, the item done. */
static void message_close(struct fcgi_resp_state *s, struct buf *out)
{
	json_t *item, *id;
	size_t i = s->msg_index;

	if (!s->msg_open)
		return;
	id = item_id(s, "msg", i);
	event(s, out, "response.output_text.done",
	      json_pack("{s:O,s:I,s:i,s:s%,s:[]}", "item_id", id, "output_index", (json_int_t)i,
			"content_index", 0, "text", s->text.data, s->text.len, "logprobs"));
	event(s, out, "response.content_part.done",
	      json_pack("{s:O,s:I,s:i,s:o}", "item_id", id, "output_index", (json_int_t)i,
			"content_index", 0, "part", output_text_part(s->text.data, s->text.len)));
	item = message_item(s, i, "completed", s->text.data, s->text.len);
	json_array_set(s->items, i, item);
	event(s, out, "response.output_item.done",
	      json_pack("{s:I,s:o}", "output_index", (json_int_t)i, "item", item));
	json_decref(id);
	s->msg_open = false;
	buf_reset(&s->text);
}

void fcgi_resp_text(struct fcgi_resp_state *s, struct buf *out, const char *text, size_t len)
{
	if (!s->msg_open) {
		s->msg_index = json_array_size(s->items);
		s->msg_open = true;
		json_array_append_new(s->items, json_null());
		event(s, out, "response.output_item.added",
		      json_pack("{s:I,s:{s:o,s:s,s:s,s:s,s:[]}}", "output_index",
				(json_int_t)s->msg_index, "item", "id",
				item_id(s, "msg", s->msg_index), "type", "message", "status",
				"in_progress", "role", "assistant", "content"));
		event(s, out, "response.content_part.added",
		      json_pack("{s:o,s:I,s:i,s:o}", "item_id", item_id(s, "msg", s->msg_index),
				"output_index", (json_int_t)s->msg_index, "content_index", 0,
				"part", output_text_part("", 0)));
	}
	buf_add(&s->text, text, len);
	event_open(s, out, "response.output_text.delta");
	buf_addf(out,
		 ",\"item_id\":\"msg_%s_%zu\",\"output_index\":%zu,\"content_index\":0,\"delta\":",
		 s->id + 5, s->msg_index, s->msg_index);
	buf_add_json_str(out, text, len);
	buf_adds(out, ",\"logprobs\":[]");
	event_close(out);
}

void fcgi_resp_call(struct fcgi_resp_state *s, struct buf *out, size_t i,
		    const struct fcgi_tool_call *c, bool first, const char *args, size_t len)
{
	size_t at;

	if (first) {
		if (i != s->ncalls || i >= FCGI_RESP_MAX_CALLS)
			return;
		message_close(s, out); /* the text before the call is whole */
		at = s->call_at[s->ncalls++] = json_array_size(s->items);
		json_array_append_new(s->items, json_null());
		event(s, out, "response.output_item.added",
		      json_pack("{s:I,s:o}", "output_index", (json_int_t)at, "item",
				call_item(s, at,
					  &(struct fcgi_tool_call){ .id = c->id,
								    .name = c->name,
								    .args = "",
								    .args_len = 0 },
					  "in_progress")));
	}
	/* A custom call's input is known once its arguments are whole: it goes at the end. */
	if (i >= s->ncalls || !len || is_custom(s, c->name))
		return;
	at = s->call_at[i];
	event_open(s, out, "response.function_call_arguments.delta");
	buf_addf(out, ",\"item_id\":\"fc_%s_%zu\",\"output_index\":%zu,\"delta\":", s->id + 5, at,
		 at);
	buf_add_json_str(out, args, len);
	event_close(out);
}

/* Call i's end: its arguments (or input) done, the item done. */
static void call_close(struct fcgi_resp_state *s, struct buf *out, size_t i,
		       const struct fcgi_tool_call *c)
{
	size_t at = s->call_at[i];
	json_t *item = call_item(s, at, c, "completed");
	bool custom = is_custom(s, c->name);

	if (custom) {
		event(s, out, "response.custom_tool_call_input.delta",
		      json_pack("{s:O,s:I,s:O}", "item_id", json_object_get(item, "id"),
				"output_index", (json_int_t)at, "delta",
				json_object_get(item, "input")));
		event(s, out, "response.custom_tool_call_input.done",
		      json_pack("{s:O,s:I,s:O}", "item_id", json_object_get(item, "id"),
				"output_index", (json_int_t)at, "input",
				json_object_get(item, "input")));
	} else {
		event(s, out, "response.function_call_arguments.done",
		      json_pack("{s:O,s:I,s:O}", "item_id", json_object_get(item, "id"),
				"output_index", (json_int_t)at, "arguments",
				json_object_get(item, "arguments")));
	}
	json_array_set(s->items, at, item);
	event(s, out, "response.output_item.done",
	      json_pack("{s:I,s:o}", "output_index", (json_int_t)at, "item", item));
}

void fcgi_resp_end(struct fcgi_resp_state *s, struct buf *out, const struct fcgi_tool_call *calls,
		   size_t n, const struct prov_outcome *o)
{
	const char *status = "completed", *type = "response.completed";

	if (o->err) {
		status = "failed";
		type = "response.failed";
	} else {
		message_close(s, out);
		for (size_t i = 0; i < n && i < s->ncalls; i++)
			call_close(s, out, i, &calls[i]);
		if (!strcmp(o->finish_reason, "length")) {
			status = "incomplete";
			type = "response.incomplete";
		}
	}
	response_event(s, out, type, status, o);
}

void fcgi_resp_whole(struct fcgi_resp_state *s, struct buf *out, const char *text, size_t len,
		     const struct fcgi_tool_call *calls, size_t n, const struct prov_outcome *o)
{
	const char *status = !strcmp(o->finish_reason, "length") ? "incomplete" : "completed";

	if (len || !n)
		json_array_append_new(s->items, message_item(s, json_array_size(s->items),
							     "completed", text, len));
	for (size_t i = 0; i < n; i++)
		json_array_append_new(
			s->items, call_item(s, json_array_size(s->items), &calls[i], "completed"));
	add_response(s, out, status, o);
}

void fcgi_resp_beat(struct buf *out)
{
	buf_adds(out, ": keep-alive\n\n");
}
