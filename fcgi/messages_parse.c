/* The Anthropic Messages request (POST /v1/messages, /v1/messages/count_tokens) checked
 * field by field and translated into a chat completion body, which fcgi_chat_parse_json
 * then takes as any chat request (ADR 0030: one request path for the three APIs).
 *
 * Every refusal names the field by its path as Anthropic's own errors do
 * ("messages.2.content.0.source.data: …"), since the client knows its request, not the
 * translation. A field OLP would not honour is refused, never dropped in silence; the few
 * accepted and ignored on purpose are listed below and in docs/openai-compat.md. No I/O. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fcgi/fcgi.h"
#include "fcgi/fields.h"
#include "common/banned.h"

/* One translation under way: the chat messages built so far, and the error. */
struct tr {
	json_t *msgs;
	struct fcgi_error *err;
	unsigned nimages;
};

static int bad(struct fcgi_error *err, const char *path, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int bad(struct fcgi_error *err, const char *path, const char *fmt, ...)
{
	char why[sizeof(err->message)];
	va_list ap;

	va_start(ap, fmt);
	(void)vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	err->status = 400;
	err->type = "invalid_request_error";
	err->code = NULL;
	snprintf(err->param, sizeof(err->param), "%s", path);
	/* A reason too long for the message is cut: the path at its start is what counts. */
	if (snprintf(err->message, sizeof(err->message), "%.160s: %s", path, why) < 0)
		err->message[0] = '\0';
	return -1;
}

/* jansson allocation failures abort: one OOM policy for the worker. */
static void add(json_t *arr, json_t *v)
{
	if (!v || json_array_append_new(arr, v))
		abort();
}

static void set(json_t *obj, const char *key, json_t *v)
{
	if (!v || json_object_set_new(obj, key, v))
		abort();
}

/* A string without NUL inside (the body may hold "\u0000"). */
static const char *str(const json_t *v)
{
	const char *s = json_string_value(v);

	return s && strlen(s) == json_string_length(v) ? s : NULL;
}

static bool absent(const json_t *v)
{
	return !v || json_is_null(v);
}

/* The keys an object may have (NULL-terminated), others refused by name. */
static int check_keys(const json_t *obj, const char *path, const char *const *known,
		      struct fcgi_error *err)
{
	const char *key;
	const json_t *v;

	json_object_foreach((json_t *)obj, key, v) {
		size_t i;

		for (i = 0; known[i] && strcmp(key, known[i]); i++)
			;
		if (!known[i])
			return bad(err, path, "unknown field %.48s", key);
	}
	return 0;
}

/* ---- top-level fields ----------------------------------------------------------------- */

/* Every top-level field of a Messages request; fcgi_fields_check refuses the others. */
static const struct fcgi_field fields[] = {
	{ "model", FCGI_FIELD_USED, NULL },
	{ "messages", FCGI_FIELD_USED, NULL },
	{ "max_tokens", FCGI_FIELD_USED, NULL },
	{ "system", FCGI_FIELD_USED, NULL },
	{ "stop_sequences", FCGI_FIELD_USED, NULL },
	{ "stream", FCGI_FIELD_USED, NULL },
	{ "tools", FCGI_FIELD_USED, NULL },
	{ "tool_choice", FCGI_FIELD_USED, NULL },
	{ "metadata", FCGI_FIELD_USED, NULL },
	/* The provider CLIs take no sampling knobs and think as they are set up to; Claude
	 * Code sends thinking, context_management and output_config on every request. */
	{ "thinking", FCGI_FIELD_IGNORED, NULL },
	{ "temperature", FCGI_FIELD_IGNORED, NULL },
	{ "top_p", FCGI_FIELD_IGNORED, NULL },
	{ "top_k", FCGI_FIELD_IGNORED, NULL },
	{ "context_management", FCGI_FIELD_IGNORED, NULL },
	{ "output_config", FCGI_FIELD_IGNORED, NULL },
	{ "mcp_servers", FCGI_FIELD_REFUSED, "OLP connects to no MCP server on a client's behalf" },
	{ "container", FCGI_FIELD_REFUSED, "OLP runs no code execution container" },
	{ "output_format", FCGI_FIELD_REFUSED,
	  "structured outputs are not supported; ask for JSON in the prompt" },
	{ NULL, FCGI_FIELD_USED, NULL },
};

static int check_number(const json_t *root, const char *name, double lo, double hi,
			struct fcgi_error *err)
{
	const json_t *v = json_object_get(root, name);
	double d = json_number_value(v);

	if (absent(v))
		return 0;
	if (!json_is_number(v) || !isfinite(d) || d < lo || d > hi)
		return bad(err, name, "must be a number between %g and %g", lo, hi);
	return 0;
}

/* The fields ignored on purpose still have their types: a client's mistake is told. */
static int check_ignored(const json_t *root, struct fcgi_error *err)
{
	static const char *const objects[] = { "thinking", "context_management", "output_config" };
	const json_t *v;
	int64_t n;

	for (size_t i = 0; i < ARRAY_SIZE(objects); i++) {
		v = json_object_get(root, objects[i]);
		if (!absent(v) && !json_is_object(v))
			return bad(err, objects[i], "must be an object");
	}
	v = json_object_get(root, "top_k");
	if (!absent(v) && parse_json_int(v, 0, INT64_MAX, &n))
		return bad(err, "top_k", "must be a non-negative integer");
	return check_number(root, "temperature", 0, 1, err) ||
	       check_number(root, "top_p", 0, 1, err);
}

/* metadata: {"user_id": a string} (accepted; nothing is done with it). */
static int check_metadata(const json_t *root, struct fcgi_error *err)
{
	static const char *const known[] = { "user_id", NULL };
	const json_t *v = json_object_get(root, "metadata"), *uid;

	if (absent(v))
		return 0;
	if (!json_is_object(v))
		return bad(err, "metadata", "must be an object");
	if (check_keys(v, "metadata", known, err))
		return -1;
	uid = json_object_get(v, "user_id");
	if (!absent(uid) && !json_is_string(uid))
		return bad(err, "metadata.user_id", "must be a string");
	return 0;
}

/* model, max_tokens, stream, stop_sequences into chat. */
static int translate_scalars(const json_t *root, bool count, json_t *chat, struct fcgi_error *err)
{
	const json_t *v = json_object_get(root, "model"), *s;
	int64_t n;
	size_t i;

	if (!str(v) || !json_string_length(v))
		return bad(err, "model", "must be a non-empty string");
	set(chat, "model", json_copy((json_t *)v));
	v = json_object_get(root, "max_tokens");
	if (absent(v) && !count)
		return bad(err, "max_tokens", "required (a positive integer)");
	if (!absent(v) && parse_json_int(v, 1, INT64_MAX, &n))
		return bad(err, "max_tokens", "must be a positive integer");
	if (!absent(v))
		set(chat, "max_tokens", json_integer(n));
	v = json_object_get(root, "stream");
	if (!absent(v) && !json_is_boolean(v))
		return bad(err, "stream", "must be a boolean");
	set(chat, "stream", json_boolean(json_is_true(v)));
	v = json_object_get(root, "stop_sequences");
	if (absent(v) || (json_is_array(v) && !json_array_size(v)))
		return 0;
	if (!json_is_array(v) || json_array_size(v) > FCGI_MAX_STOP)
		return bad(err, "stop_sequences", "must be an array of up to %d strings",
			   FCGI_MAX_STOP);
	json_array_foreach(v, i, s) {
		char path[48];

		snprintf(path, sizeof(path), "stop_sequences.%zu", i);
		if (!str(s) || !json_string_length(s) || json_string_length(s) > FCGI_MAX_STOP_LEN)
			return bad(err, path, "must be a string of 1 to %d bytes without NUL",
				   FCGI_MAX_STOP_LEN);
	}
	set(chat, "stop", json_copy((json_t *)v));
	return 0;
}

/* ---- content blocks ------------------------------------------------------------------- */

/* A text block's text, or NULL after refusing it. */
static const json_t *text_block(const json_t *b, const char *path, struct fcgi_error *err)
{
	static const char *const known[] = { "type", "text", "cache_control", "citations", NULL };
	const json_t *t = json_object_get(b, "text");
	char p[240];

	if (check_keys(b, path, known, err))
		return NULL;
	snprintf(p, sizeof(p), "%s.text", path);
	if (!json_is_string(t)) {
		bad(err, p, "must be a string");
		return NULL;
	}
	return t;
}

/* An image block with a base64 source, as an image_url part (a data: URL). Nothing is
 * fetched on a client's behalf: a URL or file source is refused by name. */
static json_t *image_part(struct tr *t, const json_t *b, const char *path)
{
	static const char *const known[] = { "type", "source", "cache_control", NULL };
	static const char *const srckeys[] = { "type", "media_type", "data", NULL };
	static const char *const types[] = { "png", "jpeg", "gif", "webp" };
	const json_t *src = json_object_get(b, "source");
	const char *type, *mt, *data;
	struct buf url = BUF_INIT;
	json_t *part;
	char p[224];
	size_t i;

	if (check_keys(b, path, known, t->err))
		return NULL;
	snprintf(p, sizeof(p), "%s.source", path);
	if (!json_is_object(src)) {
		bad(t->err, p, "must be an object");
		return NULL;
	}
	type = str(json_object_get(src, "type"));
	snprintf(p, sizeof(p), "%s.source.type", path);
	if (type && (!strcmp(type, "url") || !strcmp(type, "file"))) {
		bad(t->err, p,
		    "%s image sources are not fetched (OLP fetches nothing on a client's "
		    "behalf); send the image inline: {\"type\":\"base64\",\"media_type\",\"data\"}",
		    type);
		return NULL;
	}
	if (!type || strcmp(type, "base64")) {
		bad(t->err, p, "must be \"base64\"");
		return NULL;
	}
	snprintf(p, sizeof(p), "%s.source", path);
	if (check_keys(src, p, srckeys, t->err))
		return NULL;
	mt = str(json_object_get(src, "media_type"));
	for (i = 0; mt && i < ARRAY_SIZE(types); i++)
		if (!strncmp(mt, "image/", 6) && !strcmp(mt + 6, types[i]))
			break;
	snprintf(p, sizeof(p), "%s.source.media_type", path);
	if (!mt || i == ARRAY_SIZE(types)) {
		bad(t->err, p, "must be image/png, image/jpeg, image/gif or image/webp");
		return NULL;
	}
	data = str(json_object_get(src, "data"));
	snprintf(p, sizeof(p), "%s.source.data", path);
	if (!data) {
		bad(t->err, p, "must be a string (the image, base64-encoded)");
		return NULL;
	}
	if (fcgi_image_check(types[i], data, strlen(data), p, t->err))
		return NULL;
	if (++t->nimages > FCGI_MAX_IMAGES) {
		bad(t->err, p, "at most %d images a request", FCGI_MAX_IMAGES);
		return NULL;
	}
	buf_addf(&url, "data:%s;base64,", mt);
	buf_adds(&url, data);
	part = json_pack("{s:s, s:{s:s%}}", "type", "image_url", "image_url", "url", url.data,
			 url.len);
	buf_release(&url);
	return part;
}

/* A message's content: a string, or an array of blocks. */
static int content_shape(const json_t *content, const char *path, struct fcgi_error *err)
{
	char p[128];

	snprintf(p, sizeof(p), "%s.content", path);
	if (json_is_string(content) || json_is_array(content))
		return 0;
	return bad(err, p, "must be a string or an array of content blocks");
}

/* A block's type, or NULL after refusing it. */
static const char *block_type(const json_t *b, const char *path, struct fcgi_error *err)
{
	const char *type = json_is_object(b) ? str(json_object_get(b, "type")) : NULL;

	if (!json_is_object(b))
		bad(err, path, "must be a content block (an object with a \"type\")");
	else if (!type)
		bad(err, path, "must have a \"type\" string");
	return type;
}

/* What a walk over content blocks hands each block: its path ("messages.2.content.0"), its
 * type, and a text block's text, checked (NULL for any other type). 0 or -1 (refused). */
typedef int (*block_fn)(struct tr *t, const json_t *b, const char *type, const json_t *text,
			const char *path, void *arg);

/* Each block of blocks (an array, at path) to fn, in order: 0, or -1 at the first
 * refusal: a block that is no object or has no type, a text block of the wrong shape, or
 * one fn refused. */
static int walk_blocks(struct tr *t, const json_t *blocks, const char *path, block_fn fn, void *arg)
{
	const json_t *b, *text;
	const char *type;
	char p[224];
	size_t i;

	json_array_foreach(blocks, i, b) {
		snprintf(p, sizeof(p), "%s.%zu", path, i);
		if (!(type = block_type(b, p, t->err)))
			return -1;
		text = NULL;
		if (!strcmp(type, "text") && !(text = text_block(b, p, t->err)))
			return -1;
		if (fn(t, b, type, text, p, arg))
			return -1;
	}
	return 0;
}

/* A tool_result under way: the tool message's text, and the user message's parts. */
struct result_walk {
	const json_t *id; /* the tool_use_id */
	struct buf text;
	json_t *parts;
	bool any; /* a block's text is in text */
};

static void result_line(struct result_walk *w, const char *s, size_t n)
{
	if (w->any)
		buf_addch(&w->text, '\n');
	buf_add(&w->text, s, n);
	w->any = true;
}

/* A tool_reference block: Claude Code's ToolSearch answers with these, one per deferred
 * tool it loads ({"type":"tool_reference","tool_name":"TaskCreate"}), and Anthropic's API
 * puts that tool's definition into the model's context there. OLP declares every tool the
 * request lists to the provider, deferred ones too (translate_tool), so there is nothing
 * to load: the block becomes a line of the result that names the tool, for the model to
 * read what its search found. */
static int tool_reference(struct tr *t, const json_t *b, const char *path, struct result_walk *w)
{
	static const char *const known[] = { "type", "tool_name", "cache_control", NULL };
	const json_t *name = json_object_get(b, "tool_name");
	struct buf line = BUF_INIT;
	char p[256];

	if (check_keys(b, path, known, t->err))
		return -1;
	snprintf(p, sizeof(p), "%s.tool_name", path);
	if (!str(name) || !json_string_length(name))
		return bad(t->err, p, "must be a non-empty string");
	buf_adds(&line, "Tool loaded: ");
	buf_add(&line, json_string_value(name), json_string_length(name));
	buf_adds(&line, " (declared among the tools; call it by name)");
	result_line(w, line.data, line.len);
	buf_release(&line);
	return 0;
}

static int result_block(struct tr *t, const json_t *b, const char *type, const json_t *text,
			const char *path, void *arg)
{
	struct result_walk *w = arg;
	struct buf note = BUF_INIT;
	json_t *img;

	if (text) {
		result_line(w, json_string_value(text), json_string_length(text));
		return 0;
	}
	if (!strcmp(type, "tool_reference"))
		return tool_reference(t, b, path, w);
	if (strcmp(type, "image"))
		return bad(t->err, path,
			   "must be a text, image or tool_reference block (not %.32s)", type);
	if (!(img = image_part(t, b, path)))
		return -1;
	buf_addf(&note, "(an image from the result of tool call %s)", json_string_value(w->id));
	add(w->parts, json_pack("{s:s, s:s}", "type", "text", "text", note.data));
	add(w->parts, img);
	buf_release(&note);
	return 0;
}

/* A tool_result block as a tool message (its text), its images into parts (the user
 * message that follows: a tool message takes no image). */
static int tool_result(struct tr *t, const json_t *b, const char *path, json_t *parts)
{
	static const char *const known[] = { "type",	 "tool_use_id",	  "content",
					     "is_error", "cache_control", NULL };
	const json_t *c = json_object_get(b, "content"), *e = json_object_get(b, "is_error");
	struct result_walk w = { json_object_get(b, "tool_use_id"), BUF_INIT, parts, false };
	char p[224];

	if (check_keys(b, path, known, t->err))
		return -1;
	snprintf(p, sizeof(p), "%s.tool_use_id", path);
	if (!str(w.id) || !json_string_length(w.id))
		return bad(t->err, p, "must be a non-empty string");
	snprintf(p, sizeof(p), "%s.is_error", path);
	if (!absent(e) && !json_is_boolean(e))
		return bad(t->err, p, "must be a boolean");
	snprintf(p, sizeof(p), "%s.content", path);
	if (!absent(c) && !json_is_string(c) && !json_is_array(c))
		return bad(t->err, p,
			   "must be a string or an array of text, image and tool_reference blocks");
	if (json_is_true(e))
		buf_adds(&w.text, "[error] ");
	if (json_is_string(c))
		buf_add(&w.text, json_string_value(c), json_string_length(c));
	if (walk_blocks(t, c, p, result_block, &w)) {
		buf_release(&w.text);
		return -1;
	}
	add(t->msgs, json_pack("{s:s, s:O, s:s%}", "role", "tool", "tool_call_id", w.id, "content",
			       w.text.data, w.text.len));
	buf_release(&w.text);
	return 0;
}

/* One block of a user message: into parts (a json array), a tool result as its tool
 * message. */
static int user_block(struct tr *t, const json_t *b, const char *type, const json_t *text,
		      const char *path, void *arg)
{
	json_t *parts = arg, *part;

	if (text) {
		add(parts, json_pack("{s:s, s:O}", "type", "text", "text", text));
		return 0;
	}
	if (!strcmp(type, "tool_result"))
		return tool_result(t, b, path, parts);
	if (strcmp(type, "image"))
		return bad(t->err, path,
			   "a user message's blocks must be text, image or tool_result (not %.32s)",
			   type);
	if (!(part = image_part(t, b, path)))
		return -1;
	add(parts, part);
	return 0;
}

/* A user message's blocks (content, at path): tool results first (as tool messages), then
 * the rest as one user message. */
static int user_blocks(struct tr *t, const json_t *content, const char *path)
{
	json_t *parts = json_array();
	int ret = walk_blocks(t, content, path, user_block, parts);

	if (!ret && json_array_size(parts))
		add(t->msgs, json_pack("{s:s, s:O}", "role", "user", "content", parts));
	json_decref(parts);
	return ret;
}

/* A tool_use block of the history as a tool call. */
static json_t *tool_use(struct tr *t, const json_t *b, const char *path)
{
	static const char *const known[] = { "type", "id", "name", "input", "cache_control", NULL };
	const json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name");
	const json_t *input = json_object_get(b, "input");
	char p[224], *args;
	json_t *call;

	if (check_keys(b, path, known, t->err))
		return NULL;
	snprintf(p, sizeof(p), "%s.id", path);
	if (!str(id) || !json_string_length(id)) {
		bad(t->err, p, "must be a non-empty string");
		return NULL;
	}
	snprintf(p, sizeof(p), "%s.name", path);
	if (!str(name) || !json_string_length(name)) {
		bad(t->err, p, "must be a non-empty string");
		return NULL;
	}
	snprintf(p, sizeof(p), "%s.input", path);
	if (!json_is_object(input)) {
		bad(t->err, p, "must be an object");
		return NULL;
	}
	args = json_dumps(input, JSON_COMPACT);
	if (!args)
		abort();
	call = json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function",
			 "name", name, "arguments", args);
	free(args);
	return call;
}

/* An assistant message under way: its text parts and its tool calls. */
struct turn_walk {
	json_t *parts, *calls;
};

static int assistant_block(struct tr *t, const json_t *b, const char *type, const json_t *text,
			   const char *path, void *arg)
{
	struct turn_walk *w = arg;
	json_t *call;

	if (text) {
		add(w->parts, json_pack("{s:s, s:O}", "type", "text", "text", text));
		return 0;
	}
	if (!strcmp(type, "tool_use")) {
		if (!(call = tool_use(t, b, path)))
			return -1;
		add(w->calls, call);
		return 0;
	}
	if (strcmp(type, "thinking") && strcmp(type, "redacted_thinking"))
		return bad(t->err, path,
			   "an assistant message's blocks must be text, tool_use, thinking or "
			   "redacted_thinking (not %.32s)",
			   type);
	return 0;
}

/* An assistant message's blocks (content, at path): its text, and its tool_use blocks as
 * tool_calls. Thinking blocks are left out: they are signed by the API that made them, and
 * no provider takes them back. */
static int assistant_blocks(struct tr *t, const json_t *content, const char *path)
{
	struct turn_walk w = { json_array(), json_array() };
	int ret = walk_blocks(t, content, path, assistant_block, &w);
	json_t *msg;

	if (!ret && (json_array_size(w.parts) || json_array_size(w.calls))) {
		msg = json_pack("{s:s, s:O}", "role", "assistant", "content",
				json_array_size(w.parts) ? w.parts : json_null());
		if (json_array_size(w.calls))
			set(msg, "tool_calls", json_incref(w.calls));
		add(t->msgs, msg);
	}
	json_decref(w.parts);
	json_decref(w.calls);
	return ret;
}

static int system_block(struct tr *t, const json_t *b, const char *type, const json_t *text,
			const char *path, void *arg)
{
	struct buf *out = arg;

	(void)b;
	if (!text)
		return bad(t->err, path, "must be a text block (not %.32s)", type);
	if (out->len)
		buf_addch(out, '\n');
	buf_add(out, json_string_value(text), json_string_length(text));
	return 0;
}

/* system text: a string, or text blocks joined by a newline. As a system message. */
static int system_text(struct tr *t, const json_t *v, const char *path)
{
	struct buf text = BUF_INIT;
	int ret;

	if (json_is_string(v))
		buf_add(&text, json_string_value(v), json_string_length(v));
	else if (!json_is_array(v))
		return bad(t->err, path, "must be a string or an array of text blocks");
	ret = walk_blocks(t, v, path, system_block, &text);
	if (!ret && text.len)
		add(t->msgs,
		    json_pack("{s:s, s:s%}", "role", "system", "content", text.data, text.len));
	buf_release(&text);
	return ret;
}

/* messages[i]: user and assistant turns, and the "system" turns Claude Code puts among
 * them. */
static int translate_message(struct tr *t, const json_t *m, size_t i)
{
	/* output_config: Claude Code's per-turn effort, ignored as the top-level one is. */
	static const char *const known[] = { "role", "content", "output_config", NULL };
	const json_t *content = json_object_get(m, "content");
	const char *role;
	char path[48], p[64];

	snprintf(path, sizeof(path), "messages.%zu", i);
	if (!json_is_object(m))
		return bad(t->err, path, "must be an object");
	if (check_keys(m, path, known, t->err))
		return -1;
	role = str(json_object_get(m, "role"));
	snprintf(p, sizeof(p), "%s.role", path);
	if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system")))
		return bad(t->err, p, "must be \"user\" or \"assistant\"");
	if (content_shape(content, path, t->err))
		return -1;
	snprintf(p, sizeof(p), "%s.content", path);
	if (!strcmp(role, "system"))
		return system_text(t, content, p);
	if (json_is_string(content)) {
		add(t->msgs, json_pack("{s:s, s:O}", "role", role, "content", content));
		return 0;
	}
	return !strcmp(role, "user") ? user_blocks(t, content, p) : assistant_blocks(t, content, p);
}

static int translate_messages(struct tr *t, const json_t *root)
{
	const json_t *v = json_object_get(root, "system"), *m;
	size_t i;

	if (!absent(v) && system_text(t, v, "system"))
		return -1;
	v = json_object_get(root, "messages");
	if (!json_is_array(v) || !json_array_size(v))
		return bad(t->err, "messages", "must be a non-empty array");
	json_array_foreach(v, i, m)
		if (translate_message(t, m, i))
			return -1;
	/* Only thinking blocks, or a system prompt alone: nothing to answer. */
	for (i = 0; i < json_array_size(t->msgs); i++)
		if (strcmp(json_string_value(json_object_get(json_array_get(t->msgs, i), "role")),
			   "system"))
			return 0;
	return bad(t->err, "messages", "must hold a user or assistant turn with content");
}

/* ---- tools ------------------------------------------------------------------------------ */

/* A name OLP can declare to the model (claude shows it as mcp__olp__<name>). */
static bool tool_name_ok(const json_t *name)
{
	size_t n = json_string_length(name);

	return str(name) && n && n <= 64 &&
	       strspn(json_string_value(name), "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTU"
					       "VWXYZ0123456789_-") == n;
}

/* tools[i] as a function tool. A server tool (web search, code execution…: a "type" of
 * Anthropic's) is refused by name: OLP runs no tool. defer_loading is accepted: the tool
 * is declared all the same. */
static json_t *translate_tool(const json_t *tools, size_t i, struct fcgi_error *err)
{
	static const char *const known[] = { "type",	      "name",
					     "description",   "input_schema",
					     "cache_control", "defer_loading",
					     "strict",	      NULL };
	const json_t *tl = json_array_get(tools, i), *name, *desc, *schema;
	const char *type;
	char p[64];

	snprintf(p, sizeof(p), "tools.%zu", i);
	if (!json_is_object(tl)) {
		bad(err, p, "must be an object");
		return NULL;
	}
	type = json_string_value(json_object_get(tl, "type"));
	if (type && strcmp(type, "custom")) {
		bad(err, p,
		    "server tools (type %.48s) are not supported: OLP declares the client's own "
		    "tools ({\"name\",\"description\",\"input_schema\"}) and runs none",
		    type);
		return NULL;
	}
	if (check_keys(tl, p, known, err))
		return NULL;
	name = json_object_get(tl, "name");
	snprintf(p, sizeof(p), "tools.%zu.name", i);
	if (!tool_name_ok(name)) {
		bad(err, p, "must be 1 to 64 of a-z, A-Z, 0-9, _ and -");
		return NULL;
	}
	for (size_t j = 0; j < i; j++)
		if (json_equal(name, json_object_get(json_array_get(tools, j), "name"))) {
			bad(err, p, "two tools have the name %s", json_string_value(name));
			return NULL;
		}
	desc = json_object_get(tl, "description");
	snprintf(p, sizeof(p), "tools.%zu.description", i);
	if (!absent(desc) && !json_is_string(desc)) {
		bad(err, p, "must be a string");
		return NULL;
	}
	schema = json_object_get(tl, "input_schema");
	snprintf(p, sizeof(p), "tools.%zu.input_schema", i);
	if (!json_is_object(schema)) {
		bad(err, p, "must be a JSON Schema object");
		return NULL;
	}
	return json_pack("{s:s, s:{s:O, s:o, s:O}}", "type", "function", "function", "name", name,
			 "description",
			 absent(desc) ? json_string("") : json_incref((json_t *)desc), "parameters",
			 schema);
}

/* tool_choice {type: auto | any | tool (name) | none} as OpenAI's. */
static int translate_tool_choice(const json_t *root, json_t *chat, struct fcgi_error *err)
{
	static const char *const known[] = { "type", "name", "disable_parallel_tool_use", NULL };
	const json_t *tc = json_object_get(root, "tool_choice"), *tools, *name, *t;
	const char *type;
	size_t i;

	if (absent(tc))
		return 0;
	type = json_is_object(tc) ? str(json_object_get(tc, "type")) : NULL;
	if (!type)
		return bad(err, "tool_choice",
			   "must be {\"type\": \"auto\", \"any\", \"tool\" or "
			   "\"none\"}");
	if (check_keys(tc, "tool_choice", known, err))
		return -1;
	t = json_object_get(tc, "disable_parallel_tool_use");
	if (!absent(t) && !json_is_boolean(t))
		return bad(err, "tool_choice.disable_parallel_tool_use", "must be a boolean");
	if (!strcmp(type, "auto") || !strcmp(type, "none")) {
		set(chat, "tool_choice", json_string(type));
		return 0;
	}
	tools = json_object_get(chat, "tools");
	if (strcmp(type, "any") && strcmp(type, "tool"))
		return bad(err, "tool_choice.type",
			   "must be \"auto\", \"any\", \"tool\" or \"none\"");
	if (!json_array_size(tools))
		return bad(err, "tool_choice", "asks for a tool call, but there are no tools");
	if (!strcmp(type, "any")) {
		set(chat, "tool_choice", json_string("required"));
		return 0;
	}
	name = json_object_get(tc, "name");
	json_array_foreach(tools, i, t)
		if (str(name) &&
		    json_equal(name, json_object_get(json_object_get(t, "function"), "name"))) {
			set(chat, "tool_choice",
			    json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name",
				      name));
			return 0;
		}
	return bad(err, "tool_choice.name", "must name one of the tools");
}

static int translate_tools(const json_t *root, json_t *chat, struct fcgi_error *err)
{
	const json_t *tools = json_object_get(root, "tools");
	json_t *out;
	size_t i;

	if (!absent(tools) && (!json_is_array(tools) || json_array_size(tools) > FCGI_MAX_TOOLS))
		return bad(err, "tools", "must be an array of up to %d tools", FCGI_MAX_TOOLS);
	if (json_array_size(tools)) {
		out = json_array();
		set(chat, "tools", out);
		for (i = 0; i < json_array_size(tools); i++) {
			json_t *f = translate_tool(tools, i, err);

			if (!f)
				return -1;
			add(out, f);
		}
	}
	return translate_tool_choice(root, chat, err);
}

json_t *fcgi_messages_translate(const json_t *root, bool count, struct fcgi_error *err)
{
	json_t *chat = json_object();
	struct tr t = { .msgs = json_array(), .err = err };

	if (!chat || !t.msgs)
		abort();
	set(chat, "messages", t.msgs);
	if (!json_is_object(root)) {
		bad(err, "body", "must be a JSON object");
		goto fail;
	}
	if (fcgi_fields_check(root, fields, FCGI_FIELDS_MESSAGES, err) ||
	    check_ignored(root, err) || check_metadata(root, err) ||
	    translate_scalars(root, count, chat, err) || translate_messages(&t, root) ||
	    translate_tools(root, chat, err))
		goto fail;
	return chat;
fail:
	json_decref(chat);
	return NULL;
}

/* ---- count_tokens ----------------------------------------------------------------------- */

int64_t fcgi_messages_count_tokens(const json_t *messages, const json_t *tools)
{
	struct buf prompt = BUF_INIT;
	const json_t *m, *part;
	size_t i, j, bytes, images = 0;
	char *decl;

	prov_flatten_messages(messages, &prompt);
	bytes = prompt.len;
	buf_release(&prompt);
	if (tools) {
		decl = json_dumps(tools, JSON_COMPACT);
		if (!decl)
			abort();
		bytes += strlen(decl);
		free(decl);
	}
	json_array_foreach(messages, i, m)
		json_array_foreach(json_object_get(m, "content"), j, part)
			images += !strcmp(json_string_value(json_object_get(part, "type")) ?: "",
					  "image_url");
	return (int64_t)((bytes + 3) / 4 + images * FCGI_IMAGE_TOKENS) ?: 1;
}
