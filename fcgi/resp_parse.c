/* POST /v1/responses, the request: a Responses body (what codex sends, ADR 0030)
 * translated into a chat completions body, so that the one request path (fcgi_chat_serve)
 * serves it. Every field is honoured, ignored on purpose, or refused by name, as the chat
 * parser does (docs/openai-compat.md is the same list for people); every input item and
 * tool type too. The translation only moves things: fcgi_chat_parse_json checks the
 * result again (content, images, tool names, tool_choice), so an error found there names
 * the chat field, which is the Responses one's translation ("messages[2].content"). No
 * I/O here. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fcgi/fcgi.h"
#include "fcgi/fields.h"
#include "common/banned.h"

static int bad(struct fcgi_error *err, const char *param, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int bad(struct fcgi_error *err, const char *param, const char *fmt, ...)
{
	va_list ap;

	err->status = 400;
	err->type = "invalid_request_error";
	err->code = NULL;
	snprintf(err->param, sizeof(err->param), "%s", param);
	va_start(ap, fmt);
	(void)vsnprintf(err->message, sizeof(err->message), fmt, ap);
	va_end(ap);
	return -1;
}

/* A string without NUL inside ("user\u0000x" is no "user"), or NULL. */
static const char *str(const json_t *v)
{
	const char *s = json_string_value(v);

	return s && strlen(s) == json_string_length(v) ? s : NULL;
}

static bool is(const json_t *v, const char *want)
{
	const char *s = str(v);

	return s && !strcmp(s, want);
}

/* ---- the top-level fields --------------------------------------------------------------- */

/* Every top-level field of a Responses request; fcgi_fields_check refuses the others. */
static const struct fcgi_field fields[] = {
	{ "model", FCGI_FIELD_USED, NULL },
	{ "instructions", FCGI_FIELD_USED, NULL },
	{ "input", FCGI_FIELD_USED, NULL },
	{ "tools", FCGI_FIELD_USED, NULL },
	{ "tool_choice", FCGI_FIELD_USED, NULL },
	/* parallel_tool_calls: the model may make several calls a turn */
	{ "parallel_tool_calls", FCGI_FIELD_USED, NULL },
	{ "stream", FCGI_FIELD_USED, NULL },
	{ "store", FCGI_FIELD_USED, NULL },
	{ "max_output_tokens", FCGI_FIELD_USED, NULL },
	/* No CLI has these knobs; the answer without them is still the one asked for. */
	{ "reasoning", FCGI_FIELD_IGNORED, NULL },
	{ "text", FCGI_FIELD_IGNORED, NULL },
	{ "prompt_cache_key", FCGI_FIELD_IGNORED, NULL },
	{ "service_tier", FCGI_FIELD_IGNORED, NULL },
	{ "include", FCGI_FIELD_IGNORED, NULL },
	{ "client_metadata", FCGI_FIELD_IGNORED, NULL },
	{ "previous_response_id", FCGI_FIELD_REFUSED,
	  "OLP keeps no response (store is false): send the whole conversation in input" },
	{ NULL, FCGI_FIELD_USED, NULL },
};

/* The fields, and the two booleans among them with a rule of their own. */
static int check_fields(const json_t *root, struct fcgi_error *err)
{
	const json_t *v;

	if (fcgi_fields_check(root, fields, FCGI_FIELDS_RESPONSES, err))
		return -1;
	v = json_object_get(root, "store");
	if (v && !json_is_null(v) && !json_is_boolean(v))
		return bad(err, "store", "store must be a boolean");
	if (json_is_true(v))
		return bad(err, "store",
			   "store must be false: OLP keeps no response (send \"store\": false)");
	v = json_object_get(root, "parallel_tool_calls");
	if (v && !json_is_null(v) && !json_is_boolean(v))
		return bad(err, "parallel_tool_calls", "parallel_tool_calls must be a boolean");
	return 0;
}

/* ---- tools -------------------------------------------------------------------------------- */

/* A custom (freeform) tool, declared to the model as a function taking one string. */
static json_t *custom_as_function(const json_t *t)
{
	const json_t *fmt = json_object_get(t, "format");
	const char *desc = str(json_object_get(t, "description")), *def;
	struct buf d = BUF_INIT;
	json_t *fn;

	buf_adds(&d, desc ? desc : "");
	def = str(json_object_get(fmt, "definition"));
	if (is(json_object_get(fmt, "type"), "grammar") && def) {
		buf_addf(&d, "%sThe input must follow this %s grammar:\n", d.len ? "\n\n" : "",
			 str(json_object_get(fmt, "syntax")) ?: "");
		buf_adds(&d, def);
	}
	fn = json_pack("{s:s,s:{s:O,s:s%,s:{s:s,s:{s:{s:s,s:s}},s:[s],s:b}}}", "type", "function",
		       "function", "name", json_object_get(t, "name"), "description", d.data, d.len,
		       "parameters", "type", "object", "properties", "input", "type", "string",
		       "description", "The tool's whole input, as free text (not JSON)", "required",
		       "input", "additionalProperties", 0);
	buf_release(&d);
	return fn;
}

/* A function tool: the Responses shape (name at the top) into the chat one. */
static json_t *function_as_chat(const json_t *t)
{
	json_t *fn = json_object(), *v;

	json_object_set(fn, "name", json_object_get(t, "name"));
	if ((v = json_object_get(t, "description")) && !json_is_null(v))
		json_object_set(fn, "description", v);
	if ((v = json_object_get(t, "parameters")) && !json_is_null(v))
		json_object_set(fn, "parameters", v);
	return json_pack("{s:s,s:o}", "type", "function", "function", fn);
}

/* The tool types codex declares that OLP passes over, and why (docs/openai-compat.md). */
static const char *const passed_over[] = {
	"web_search",	      /* the provider CLIs run with their own tools off */
	"web_search_preview", /* ditto */
	"tool_search",	      /* a search over deferred tools: the declared ones are all there */
	"namespace",	      /* codex's sub-agent and clock tools: not through OLP (below) */
};

/* tools[i] (param) into chat (the chat tools array) and custom (names). A namespace is
 * passed over, but for "functions", the default namespace, whose tools are the client's
 * top-level ones (codex's default models declare theirs so, in an additional_tools item). */
static int add_tool(const json_t *t, const char *param, json_t *chat, json_t *custom,
		    struct fcgi_error *err)
{
	const char *type = str(json_object_get(t, "type"));
	const json_t *sub;
	size_t i;

	if (!json_is_object(t) || !type)
		return bad(err, param, "%s must be an object with a \"type\"", param);
	if (!strcmp(type, "function") || !strcmp(type, "custom")) {
		if (!json_is_string(json_object_get(t, "name")))
			return bad(err, param, "%s.name must be a string", param);
		if (!strcmp(type, "custom"))
			json_array_append(custom, json_object_get(t, "name"));
		json_array_append_new(chat, !strcmp(type, "custom") ? custom_as_function(t)
								    : function_as_chat(t));
		return 0;
	}
	if (!strcmp(type, "namespace") && is(json_object_get(t, "name"), "functions")) {
		char sparam[128];

		json_array_foreach(json_object_get(t, "tools"), i, sub) {
			snprintf(sparam, sizeof(sparam), "%s.tools[%zu]", param, i);
			if (add_tool(sub, sparam, chat, custom, err))
				return -1;
		}
		return 0;
	}
	for (i = 0; i < ARRAY_SIZE(passed_over); i++)
		if (!strcmp(type, passed_over[i]))
			return 0;
	return bad(err, param,
		   "%s: tools of type %.40s are not supported (OLP passes function and custom "
		   "tools to the model; the client runs them)",
		   param, type);
}

static int add_tools(const json_t *tools, const char *param, json_t *chat, json_t *custom,
		     struct fcgi_error *err)
{
	char tparam[96];
	const json_t *t;
	size_t i;

	if (!tools || json_is_null(tools))
		return 0;
	if (!json_is_array(tools))
		return bad(err, param, "%s must be an array", param);
	json_array_foreach(tools, i, t) {
		snprintf(tparam, sizeof(tparam), "%s[%zu]", param, i);
		if (add_tool(t, tparam, chat, custom, err))
			return -1;
	}
	return 0;
}

/* tool_choice: "auto", "none", "required", or {"type":"function"|"custom","name"}. */
static int tool_choice(const json_t *tc, json_t *chat, struct fcgi_error *err)
{
	const char *type = str(json_object_get(tc, "type"));

	if (!tc || json_is_null(tc))
		return 0;
	if (is(tc, "auto") || is(tc, "none") || is(tc, "required")) {
		json_object_set_new(chat, "tool_choice", json_string(str(tc)));
		return 0;
	}
	if (json_is_object(tc) && type && (!strcmp(type, "function") || !strcmp(type, "custom")) &&
	    json_is_string(json_object_get(tc, "name"))) {
		json_object_set_new(chat, "tool_choice",
				    json_pack("{s:s,s:{s:O}}", "type", "function", "function",
					      "name", json_object_get(tc, "name")));
		return 0;
	}
	return bad(err, "tool_choice",
		   "tool_choice must be \"auto\", \"none\", \"required\" or "
		   "{\"type\":\"function\"|\"custom\",\"name\":…}");
}

/* ---- input ------------------------------------------------------------------------------- */

/* The last chat message when it is an assistant's that calls may join, else a new one. */
static json_t *assistant_for_calls(json_t *msgs)
{
	json_t *last = json_array_get(msgs, json_array_size(msgs) - 1), *m;

	if (last && is(json_object_get(last, "role"), "assistant")) {
		if (!json_object_get(last, "tool_calls"))
			json_object_set_new(last, "tool_calls", json_array());
		return json_object_get(last, "tool_calls");
	}
	m = json_pack("{s:s,s:n,s:[]}", "role", "assistant", "content", "tool_calls");
	json_array_append_new(msgs, m);
	return json_object_get(m, "tool_calls");
}

/* A content part into the chat's: input_text/output_text/refusal → text, input_image →
 * image_url (a data: URL; fcgi_chat_parse_json checks it). */
static int content_part(const json_t *p, const char *param, json_t *parts, struct fcgi_error *err)
{
	const char *type = str(json_object_get(p, "type"));
	const json_t *url = json_object_get(p, "image_url");

	if (type && (!strcmp(type, "input_text") || !strcmp(type, "output_text")) &&
	    json_is_string(json_object_get(p, "text")))
		return json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text",
							      json_object_get(p, "text")));
	if (type && !strcmp(type, "refusal") && json_is_string(json_object_get(p, "refusal")))
		return json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text",
							      json_object_get(p, "refusal")));
	if (type && !strcmp(type, "input_image") && json_is_string(url))
		return json_array_append_new(parts, json_pack("{s:s,s:{s:O}}", "type", "image_url",
							      "image_url", "url", url));
	if (type && !strcmp(type, "input_image"))
		return bad(err, param,
			   "%s: an input_image must have an image_url (a data: URL); file_id is "
			   "not supported",
			   param);
	return bad(err, param,
		   "%s must be an input_text, output_text or input_image part with its field",
		   param);
}

/* content (a string or parts) into the chat's content. */
static int content(const json_t *c, const char *param, json_t **out, struct fcgi_error *err)
{
	char pparam[160];
	const json_t *p;
	json_t *parts;
	size_t i;

	if (json_is_string(c)) {
		*out = json_incref((json_t *)c);
		return 0;
	}
	if (!json_is_array(c))
		return bad(err, param, "%s must be a string or an array of content parts", param);
	parts = json_array();
	json_array_foreach(c, i, p) {
		snprintf(pparam, sizeof(pparam), "%s[%zu]", param, i);
		if (content_part(p, pparam, parts, err)) {
			json_decref(parts);
			return -1;
		}
	}
	*out = parts;
	return 0;
}

static int message_item(const json_t *it, const char *param, json_t *msgs, struct fcgi_error *err)
{
	static const char *const roles[] = { "user", "assistant", "system", "developer" };
	const char *role = str(json_object_get(it, "role"));
	char cparam[128];
	json_t *c = NULL;
	size_t r;

	for (r = 0; role && r < ARRAY_SIZE(roles); r++)
		if (!strcmp(role, roles[r]))
			break;
	snprintf(cparam, sizeof(cparam), "%s.role", param);
	if (!role || r == ARRAY_SIZE(roles))
		return bad(err, cparam, "%s must be one of user, assistant, system, developer",
			   cparam);
	snprintf(cparam, sizeof(cparam), "%s.content", param);
	if (content(json_object_get(it, "content"), cparam, &c, err))
		return -1;
	json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", role, "content", c));
	return 0;
}

/* function_call and custom_tool_call: a call of an earlier turn, on the assistant's
 * message. A custom call's input goes back as the one-string argument it was declared
 * with. */
static int call_item(const json_t *it, const char *param, bool custom, json_t *msgs,
		     struct fcgi_error *err)
{
	const json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
	const json_t *args = json_object_get(it, custom ? "input" : "arguments");
	struct buf wrapped = BUF_INIT;

	if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args))
		return bad(err, param, "%s must have string call_id, name and %s", param,
			   custom ? "input" : "arguments");
	if (custom) {
		buf_adds(&wrapped, "{\"input\":");
		buf_add_json_str(&wrapped, json_string_value(args), json_string_length(args));
		buf_addch(&wrapped, '}');
	}
	json_array_append_new(assistant_for_calls(msgs),
			      json_pack("{s:O,s:s,s:{s:O,s:o}}", "id", id, "type", "function",
					"function", "name", name, "arguments",
					custom ? json_stringn(wrapped.data, wrapped.len)
					       : json_incref((json_t *)args)));
	buf_release(&wrapped);
	return 0;
}

/* function_call_output and custom_tool_call_output: a tool message (its text). */
static int output_item(const json_t *it, const char *param, json_t *msgs, struct fcgi_error *err)
{
	const json_t *id = json_object_get(it, "call_id"), *out = json_object_get(it, "output");
	struct buf text = BUF_INIT;
	const json_t *p;
	size_t i;

	if (!json_is_string(id))
		return bad(err, param, "%s.call_id must be a string", param);
	if (json_is_array(out)) {
		json_array_foreach(out, i, p) {
			const char *type = str(json_object_get(p, "type"));

			if (!type || (strcmp(type, "input_text") && strcmp(type, "output_text")) ||
			    !json_is_string(json_object_get(p, "text"))) {
				buf_release(&text);
				return bad(err, param,
					   "%s.output[%zu]: a tool's output may hold text parts "
					   "only",
					   param, i);
			}
			buf_add(&text, json_string_value(json_object_get(p, "text")),
				json_string_length(json_object_get(p, "text")));
		}
	} else if (json_is_string(out)) {
		buf_add(&text, json_string_value(out), json_string_length(out));
	} else {
		return bad(err, param, "%s.output must be a string or an array of text parts",
			   param);
	}
	json_array_append_new(msgs, json_pack("{s:s,s:O,s:s%}", "role", "tool", "tool_call_id", id,
					      "content", text.data, text.len));
	buf_release(&text);
	return 0;
}

/* One input item (input[i]) into the chat messages, or into the tools for codex's
 * additional_tools item. */
static int input_item(const json_t *it, size_t i, json_t *msgs, json_t *tools, json_t *custom,
		      struct fcgi_error *err)
{
	const char *type = str(json_object_get(it, "type"));
	char param[64], tparam[80];

	snprintf(param, sizeof(param), "input[%zu]", i);
	if (!json_is_object(it))
		return bad(err, param, "%s must be an object", param);
	/* An item without a type with a role is a message (the SDKs' short form). */
	if ((!type && json_object_get(it, "role")) || (type && !strcmp(type, "message")))
		return message_item(it, param, msgs, err);
	snprintf(tparam, sizeof(tparam), "%s.type", param);
	if (!type)
		return bad(err, tparam, "%s must be a string", tparam);
	if (!strcmp(type, "function_call") || !strcmp(type, "custom_tool_call"))
		return call_item(it, param, !strcmp(type, "custom_tool_call"), msgs, err);
	if (!strcmp(type, "function_call_output") || !strcmp(type, "custom_tool_call_output"))
		return output_item(it, param, msgs, err);
	/* The model's reasoning of an earlier turn: OLP's providers give none back, and the
	 * answer does not need it. */
	if (!strcmp(type, "reasoning"))
		return 0;
	if (!strcmp(type, "additional_tools")) {
		snprintf(tparam, sizeof(tparam), "%s.tools", param);
		return add_tools(json_object_get(it, "tools"), tparam, tools, custom, err);
	}
	return bad(err, tparam,
		   "%s: input items of type %.40s are not supported (message, function_call, "
		   "function_call_output, custom_tool_call, custom_tool_call_output, reasoning)",
		   tparam, type);
}

static int translate_input(const json_t *root, json_t *msgs, json_t *tools, json_t *custom,
			   struct fcgi_error *err)
{
	const json_t *ins = json_object_get(root, "instructions"), *input, *it;
	size_t i;

	if (ins && !json_is_null(ins) && !json_is_string(ins))
		return bad(err, "instructions", "instructions must be a string");
	if (json_is_string(ins) && json_string_length(ins))
		json_array_append_new(msgs,
				      json_pack("{s:s,s:O}", "role", "system", "content", ins));
	input = json_object_get(root, "input");
	if (json_is_string(input)) {
		json_array_append_new(msgs,
				      json_pack("{s:s,s:O}", "role", "user", "content", input));
		return 0;
	}
	if (!json_is_array(input) || !json_array_size(input))
		return bad(err, "input", "input must be a string or a non-empty array of items");
	json_array_foreach(input, i, it)
		if (input_item(it, i, msgs, tools, custom, err))
			return -1;
	if (!json_array_size(msgs))
		return bad(err, "input", "input holds no message");
	return 0;
}

/* ---- the body ------------------------------------------------------------------------------ */

static int translate(const json_t *root, struct fcgi_resp_request *out, struct fcgi_error *err)
{
	json_t *chat = out->chat, *msgs = json_array(), *tools = json_array(), *v;
	int64_t n;

	json_object_set_new(chat, "messages", msgs);
	if (add_tools(json_object_get(root, "tools"), "tools", tools, out->custom, err) ||
	    translate_input(root, msgs, tools, out->custom, err)) {
		json_decref(tools);
		return -1;
	}
	if (json_array_size(tools))
		json_object_set_new(chat, "tools", tools);
	else
		json_decref(tools);
	if (tool_choice(json_object_get(root, "tool_choice"), chat, err))
		return -1;
	v = json_object_get(root, "max_output_tokens");
	if (v && !json_is_null(v) && parse_json_int(v, 1, INT64_MAX, &n))
		return bad(err, "max_output_tokens",
			   "max_output_tokens must be a positive integer");
	if (v && !json_is_null(v))
		json_object_set_new(chat, "max_tokens", json_integer((json_int_t)n));
	v = json_object_get(root, "stream");
	if (v && !json_is_null(v) && !json_is_boolean(v))
		return bad(err, "stream", "stream must be a boolean");
	out->stream = json_is_true(v);
	json_object_set_new(chat, "stream", json_boolean(out->stream));
	return 0;
}

int fcgi_resp_parse(const char *body, size_t len, struct fcgi_resp_request *out,
		    struct fcgi_error *err)
{
	json_error_t jerr;
	json_t *root, *model;

	memset(out, 0, sizeof(*out));
	root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
	if (!root)
		return bad(err, "", "Invalid JSON body: %s (line %d, column %d)", jerr.text,
			   jerr.line, jerr.column);
	if (!json_is_object(root)) {
		bad(err, "", "Request body must be a JSON object");
		goto fail_release_root;
	}
	model = json_object_get(root, "model");
	if (!str(model) || !json_string_length(model)) {
		bad(err, "model", "model must be a non-empty string");
		goto fail_release_root;
	}
	if (check_fields(root, err))
		goto fail_release_root;
	out->chat = json_pack("{s:O}", "model", model);
	out->custom = json_array();
	if (translate(root, out, err))
		goto fail_release_root;
	json_decref(root);
	return 0;
fail_release_root:
	json_decref(root);
	fcgi_resp_release(out);
	return -1;
}

void fcgi_resp_release(struct fcgi_resp_request *r)
{
	json_decref(r->chat);
	json_decref(r->custom);
	memset(r, 0, sizeof(*r));
}
