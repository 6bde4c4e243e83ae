/* CUnit suite for the OpenAI Responses API of fcgi/ (fcgi.h, resp_parse.c and
 * resp_encode.c): the translation of every field and input item into a chat completions
 * body (which the chat parser must then take), every refusal naming its field, and the
 * encoders' events in their order, each parsed back with jansson. No I/O. */
#include "tests/support/cunit.h"
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "fcgi/fcgi.h"
#include "common/banned.h"

/* Translate body; the chat body it gives (owned by the caller), after checking that the
 * chat parser takes it too. */
static json_t *translate(const char *body, struct fcgi_resp_request *rr)
{
	struct fcgi_chat_request req;
	struct fcgi_error err;
	json_t *chat;

	if (fcgi_resp_parse(body, strlen(body), rr, &err)) {
		fprintf(stderr, "refused: %s (%s)\n", err.message, err.param);
		return NULL;
	}
	chat = json_deep_copy(rr->chat);
	if (fcgi_chat_parse_json(json_incref(rr->chat), &req, &err)) {
		fprintf(stderr, "chat parser refused: %s (%s)\n", err.message, err.param);
		json_decref(chat);
		return NULL;
	}
	fcgi_chat_release(&req);
	return chat;
}

static void expect_chat(const char *body, const char *want_json)
{
	struct fcgi_resp_request rr;
	json_t *chat = translate(body, &rr), *want = json_loads(want_json, 0, NULL);

	CU_ASSERT_PTR_NOT_NULL_FATAL(want);
	CU_ASSERT_PTR_NOT_NULL(chat);
	if (chat && !json_equal(chat, want)) {
		char *got = json_dumps(chat, JSON_COMPACT | JSON_SORT_KEYS);

		fprintf(stderr, "for %s\n got %s\nwant %s\n", body, got, want_json);
		free(got);
		CU_FAIL("translation differs");
	}
	json_decref(chat);
	json_decref(want);
	fcgi_resp_release(&rr);
}

static void test_translate_input(void)
{
	expect_chat("{\"model\":\"m\",\"input\":\"hi\"}",
		    "{\"model\":\"m\",\"stream\":false,\"messages\":[{\"role\":\"user\","
		    "\"content\":\"hi\"}]}");
	expect_chat("{\"model\":\"m\",\"instructions\":\"Be brief.\",\"input\":\"hi\","
		    "\"stream\":true,\"max_output_tokens\":7}",
		    "{\"model\":\"m\",\"stream\":true,\"max_tokens\":7,\"messages\":["
		    "{\"role\":\"system\",\"content\":\"Be brief.\"},"
		    "{\"role\":\"user\",\"content\":\"hi\"}]}");
	/* Every role; parts; the short form without a type; reasoning passed over. */
	expect_chat("{\"model\":\"m\",\"input\":["
		    "{\"type\":\"message\",\"role\":\"developer\",\"content\":[{\"type\":"
		    "\"input_text\",\"text\":\"d\"}]},"
		    "{\"role\":\"system\",\"content\":\"s\"},"
		    "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[]},"
		    "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":"
		    "\"output_text\",\"text\":\"a\",\"annotations\":[]}]},"
		    "{\"type\":\"message\",\"role\":\"user\",\"id\":\"msg_1\",\"content\":["
		    "{\"type\":\"input_text\",\"text\":\"u\"},{\"type\":\"input_image\","
		    "\"image_url\":\"data:image/gif;base64,R0lGODlhAQABAIAAAAAAAP///"
		    "yH5BAEAAAAALAAAAAABAAEAAAIBRAA7\"}]}]}",
		    "{\"model\":\"m\",\"stream\":false,\"messages\":["
		    "{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"d\"}]},"
		    "{\"role\":\"system\",\"content\":\"s\"},"
		    "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"a\"}]},"
		    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"u\"},"
		    "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/gif;base64,"
		    "R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7\"}}]}]}");
}

static void test_translate_calls(void)
{
	/* Calls join the assistant's message before them; a custom call's input is wrapped
	 * as the one-string argument; outputs are tool messages (text parts joined). */
	expect_chat(
		"{\"model\":\"m\",\"input\":["
		"{\"role\":\"user\",\"content\":\"go\"},"
		"{\"role\":\"assistant\",\"content\":\"on it\"},"
		"{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":"
		"\"{\\\"a\\\":1}\"},"
		"{\"type\":\"custom_tool_call\",\"call_id\":\"c2\",\"name\":\"p\",\"input\":"
		"\"x\\\"y\"},"
		"{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"r1\"},"
		"{\"type\":\"custom_tool_call_output\",\"call_id\":\"c2\",\"output\":["
		"{\"type\":\"input_text\",\"text\":\"r\"},{\"type\":\"input_text\",\"text\":\"2\"}]"
		"},"
		"{\"type\":\"function_call\",\"call_id\":\"c3\",\"name\":\"f\",\"arguments\":\"{}"
		"\"}]}",
		"{\"model\":\"m\",\"stream\":false,\"messages\":["
		"{\"role\":\"user\",\"content\":\"go\"},"
		"{\"role\":\"assistant\",\"content\":\"on it\",\"tool_calls\":["
		"{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
		"\"{\\\"a\\\":1}\"}},"
		"{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"p\",\"arguments\":"
		"\"{\\\"input\\\":\\\"x\\\\\\\"y\\\"}\"}}]},"
		"{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r1\"},"
		"{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"r2\"},"
		"{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
		"{\"id\":\"c3\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
		"\"{}\"}}]}]}");
}

static void test_translate_tools(void)
{
	struct fcgi_resp_request rr;
	json_t *chat, *fn;

	/* function, custom (with its grammar in the description), the passed-over types, the
	 * default namespace's tools from an additional_tools item; tool_choice. */
	chat = translate(
		"{\"model\":\"m\",\"tool_choice\":{\"type\":\"custom\",\"name\":\"apply_patch\"},"
		"\"parallel_tool_calls\":false,\"tools\":["
		"{\"type\":\"function\",\"name\":\"f\",\"description\":\"F\",\"strict\":false,"
		"\"parameters\":{\"type\":\"object\"}},"
		"{\"type\":\"custom\",\"name\":\"apply_patch\",\"description\":\"Patch\","
		"\"format\":{\"type\":\"grammar\",\"syntax\":\"lark\",\"definition\":\"start: "
		"x\"}},"
		"{\"type\":\"web_search\",\"external_web_access\":false},{\"type\":\"tool_search\"}"
		","
		"{\"type\":\"namespace\",\"name\":\"multi_agent_v1\",\"tools\":[{\"type\":"
		"\"function\",\"name\":\"spawn_agent\"}]}],"
		"\"input\":[{\"type\":\"additional_tools\",\"role\":\"developer\",\"tools\":["
		"{\"type\":\"namespace\",\"name\":\"functions\",\"tools\":[{\"type\":\"custom\","
		"\"name\":\"exec\"},{\"type\":\"function\",\"name\":\"wait\"}]},"
		"{\"type\":\"namespace\",\"name\":\"clock\",\"tools\":[]}]},"
		"{\"role\":\"user\",\"content\":\"x\"}]}",
		&rr);
	CU_ASSERT_PTR_NOT_NULL_FATAL(chat);
	CU_ASSERT_EQUAL(json_array_size(json_object_get(chat, "tools")), 4);
	fn = json_object_get(json_array_get(json_object_get(chat, "tools"), 0), "function");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(fn, "name")), "f");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(fn, "description")), "F");
	CU_ASSERT_PTR_NULL(json_object_get(fn, "strict"));
	fn = json_object_get(json_array_get(json_object_get(chat, "tools"), 1), "function");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(fn, "name")), "apply_patch");
	CU_ASSERT_PTR_NOT_NULL(
		strstr(json_string_value(json_object_get(fn, "description")),
		       "Patch\n\nThe input must follow this lark grammar:\nstart: x"));
	CU_ASSERT_TRUE(json_is_string(json_object_get(
		json_object_get(json_object_get(json_object_get(fn, "parameters"), "properties"),
				"input"),
		"type")));
	fn = json_object_get(json_array_get(json_object_get(chat, "tools"), 2), "function");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(fn, "name")), "exec");
	CU_ASSERT_EQUAL(json_array_size(rr.custom), 2); /* apply_patch, exec */
	CU_ASSERT_STRING_EQUAL(
		json_string_value(json_object_get(
			json_object_get(json_object_get(chat, "tool_choice"), "function"), "name")),
		"apply_patch");
	CU_ASSERT_PTR_NULL(json_object_get(chat, "parallel_tool_calls"));
	json_decref(chat);
	fcgi_resp_release(&rr);
}

/* Every refusal: 400 invalid_request_error naming the field. */
static void test_refusals(void)
{
	static const struct {
		const char *body, *param, *msg;
	} cases[] = {
		{ "[]", "", "must be a JSON object" },
		{ "{\"input\":\"x\"", "", "Invalid JSON" },
		{ "{\"input\":\"x\"}", "model", "model must be" },
		{ "{\"model\":\"m\"}", "input", "input must be" },
		{ "{\"model\":\"m\",\"input\":7}", "input", "input must be" },
		{ "{\"model\":\"m\",\"input\":\"x\",\"previous_response_id\":\"r\"}",
		  "previous_response_id", "not supported" },
		{ "{\"model\":\"m\",\"input\":\"x\",\"store\":true}", "store",
		  "store must be false" },
		{ "{\"model\":\"m\",\"input\":\"x\",\"store\":1}", "store", "boolean" },
		{ "{\"model\":\"m\",\"input\":\"x\",\"top_p\":1}", "top_p", "Unrecognized" },
		{ "{\"model\":\"m\",\"input\":\"x\",\"parallel_tool_calls\":1}",
		  "parallel_tool_calls", "boolean" },
		{ "{\"model\":\"m\",\"input\":\"x\",\"stream\":1}", "stream", "boolean" },
		{ "{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens",
		  "positive" },
		{ "{\"model\":\"m\",\"input\":\"x\",\"instructions\":1}", "instructions",
		  "string" },
		{ "{\"model\":\"m\",\"input\":[1]}", "input[0]", "object" },
		{ "{\"model\":\"m\",\"input\":[{\"type\":\"compaction\"}]}", "input[0].type",
		  "compaction are not supported" },
		{ "{\"model\":\"m\",\"input\":[{\"content\":\"x\"}]}", "input[0].type", "string" },
		{ "{\"model\":\"m\",\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
		  "input[0].role", "one of" },
		{ "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":7}]}",
		  "input[0].content", "string or an array" },
		{ "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
		  "\"input_image\",\"file_id\":\"f\"}]}]}",
		  "input[0].content[0]", "file_id" },
		{ "{\"model\":\"m\",\"input\":[{\"type\":\"function_call\",\"name\":\"f\"}]}",
		  "input[0]", "call_id" },
		{ "{\"model\":\"m\",\"input\":[{\"type\":\"function_call_output\",\"call_id\":"
		  "\"c\","
		  "\"output\":[{\"type\":\"input_image\"}]}]}",
		  "input[0]", "text parts only" },
		{ "{\"model\":\"m\",\"input\":[{\"type\":\"reasoning\"}]}", "input", "no message" },
		{ "{\"model\":\"m\",\"input\":\"x\",\"tools\":{}}", "tools", "array" },
		{ "{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"local_shell\"}]}",
		  "tools[0]", "local_shell are not supported" },
		{ "{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}",
		  "tools[0]", "name" },
		{ "{\"model\":\"m\",\"input\":\"x\",\"tool_choice\":\"maybe\"}", "tool_choice",
		  "tool_choice must be" },
	};
	struct fcgi_resp_request rr;
	struct fcgi_error err;

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		memset(&err, 0, sizeof(err));
		CU_ASSERT_EQUAL(fcgi_resp_parse(cases[i].body, strlen(cases[i].body), &rr, &err),
				-1);
		CU_ASSERT_EQUAL(err.status, 400);
		CU_ASSERT_STRING_EQUAL(err.type, "invalid_request_error");
		if (strcmp(err.param, cases[i].param) || !strstr(err.message, cases[i].msg)) {
			fprintf(stderr, "%s: param %s, message %s\n", cases[i].body, err.param,
				err.message);
			CU_FAIL("wrong refusal");
		}
		CU_ASSERT_PTR_NULL(rr.chat);
	}
}

/* ---- the encoders ------------------------------------------------------------------------- */

/* The events in out: an array of their data objects, after checking each "event:" line
 * names its data's type and the sequence numbers count from first_seq. */
static json_t *events(const struct buf *out, uint64_t first_seq)
{
	json_t *all = json_array();
	const char *p = out->data;

	while (*p) {
		const char *nl = strchr(p, '\n'), *end = strstr(p, "\n\n");
		char type[80];
		json_t *ev;

		CU_ASSERT_FATAL(nl && end && !strncmp(p, "event: ", 7));
		snprintf(type, sizeof(type), "%.*s", (int)(nl - p - 7), p + 7);
		CU_ASSERT_FATAL(!strncmp(nl + 1, "data: ", 6));
		ev = json_loadb(nl + 7, (size_t)(end - nl - 7), 0, NULL);
		CU_ASSERT_PTR_NOT_NULL_FATAL(ev);
		CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(ev, "type")), type);
		CU_ASSERT_EQUAL(json_integer_value(json_object_get(ev, "sequence_number")),
				(json_int_t)(first_seq + json_array_size(all)));
		json_array_append_new(all, ev);
		p = end + 2;
	}
	return all;
}

static void expect_types(const json_t *evs, const char *const *types, size_t n)
{
	CU_ASSERT_EQUAL(json_array_size(evs), n);
	for (size_t i = 0; i < n && i < json_array_size(evs); i++)
		CU_ASSERT_STRING_EQUAL(
			json_string_value(json_object_get(json_array_get(evs, i), "type")),
			types[i]);
}

static struct prov_outcome outcome(const char *finish)
{
	struct prov_outcome o = { .usage = { .present = true,
					     .prompt_tokens = 10,
					     .completion_tokens = 6,
					     .cached_tokens = 2 } };

	snprintf(o.finish_reason, sizeof(o.finish_reason), "%s", finish);
	return o;
}

static void test_stream_text(void)
{
	static const char *const types[] = {
		"response.created",	      "response.in_progress",
		"response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta",
		"response.output_text.done",  "response.content_part.done",
		"response.output_item.done",  "response.completed",
	};
	struct fcgi_resp_state s;
	struct prov_outcome o = outcome("stop");
	struct buf out = BUF_INIT;
	json_t *evs, *done, *r;

	fcgi_resp_state_init(&s, "model-x", NULL);
	fcgi_resp_begin(&s, &out);
	fcgi_resp_text(&s, &out, "Hel", 3);
	fcgi_resp_text(&s, &out, "lo \"x\"", 6);
	fcgi_resp_end(&s, &out, NULL, 0, &o);
	evs = events(&out, 0);
	expect_types(evs, types, ARRAY_SIZE(types));
	r = json_object_get(json_array_get(evs, 0), "response");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(r, "status")), "in_progress");
	CU_ASSERT_EQUAL(json_array_size(json_object_get(r, "output")), 0);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(r, "model")), "model-x");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(json_array_get(evs, 6), "text")),
			       "Hello \"x\"");
	done = json_object_get(json_array_get(evs, 8), "item");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(done, "status")), "completed");
	CU_ASSERT_STRING_EQUAL(
		json_string_value(json_object_get(
			json_array_get(json_object_get(done, "content"), 0), "text")),
		"Hello \"x\"");
	r = json_object_get(json_array_get(evs, 9), "response");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(r, "id")), s.id);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(r, "status")), "completed");
	CU_ASSERT_TRUE(json_equal(json_array_get(json_object_get(r, "output"), 0), done));
	CU_ASSERT_EQUAL(
		json_integer_value(json_object_get(json_object_get(r, "usage"), "total_tokens")),
		16);
	CU_ASSERT_EQUAL(
		json_integer_value(json_object_get(
			json_object_get(json_object_get(r, "usage"), "input_tokens_details"),
			"cached_tokens")),
		2);
	json_decref(evs);
	buf_release(&out);
	fcgi_resp_state_release(&s);
}

static void test_stream_calls(void)
{
	static const char *const types[] = {
		"response.created",
		"response.in_progress",
		"response.output_item.added", /* the message */
		"response.content_part.added",
		"response.output_text.delta",
		"response.output_text.done",
		"response.content_part.done",
		"response.output_item.done",
		"response.output_item.added", /* f */
		"response.function_call_arguments.delta",
		"response.function_call_arguments.delta",
		"response.output_item.added", /* p (custom): its input at the end */
		"response.function_call_arguments.done",
		"response.output_item.done",
		"response.custom_tool_call_input.delta",
		"response.custom_tool_call_input.done",
		"response.output_item.done",
		"response.completed",
	};
	json_t *custom = json_pack("[s]", "p"), *evs, *r, *out0;
	struct fcgi_tool_call calls[] = {
		{ .id = "c1", .name = "f", .args = "{\"a\":1}", .args_len = 7 },
		{ .id = "c2", .name = "p", .args = "{\"input\":\"*** patch\"}", .args_len = 21 },
	};
	struct prov_outcome o = outcome("tool_calls");
	struct fcgi_resp_state s;
	struct buf out = BUF_INIT;

	fcgi_resp_state_init(&s, "m", custom);
	fcgi_resp_begin(&s, &out);
	fcgi_resp_text(&s, &out, "Let me.", 7);
	fcgi_resp_call(&s, &out, 0, &calls[0], true, "{\"a\"", 4);
	fcgi_resp_call(&s, &out, 0, &calls[0], false, ":1}", 3);
	fcgi_resp_call(&s, &out, 1, &calls[1], true, "{\"input\":", 9);
	fcgi_resp_call(&s, &out, 1, &calls[1], false, "\"*** patch\"}", 12);
	fcgi_resp_end(&s, &out, calls, 2, &o);
	evs = events(&out, 0);
	expect_types(evs, types, ARRAY_SIZE(types));
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(json_array_get(evs, 8), "output_index")),
			1);
	r = json_object_get(json_array_get(evs, 17), "response");
	out0 = json_object_get(r, "output");
	CU_ASSERT_EQUAL(json_array_size(out0), 3);
	CU_ASSERT_STRING_EQUAL(
		json_string_value(json_object_get(json_array_get(out0, 1), "arguments")),
		"{\"a\":1}");
	CU_ASSERT_STRING_EQUAL(
		json_string_value(json_object_get(json_array_get(out0, 1), "call_id")), "c1");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(json_array_get(out0, 2), "type")),
			       "custom_tool_call");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(json_array_get(out0, 2), "input")),
			       "*** patch");
	json_decref(evs);
	json_decref(custom);
	buf_release(&out);
	fcgi_resp_state_release(&s);
}

static void test_stream_ends(void)
{
	struct fcgi_resp_state s;
	struct prov_outcome o = outcome("length");
	struct buf out = BUF_INIT;
	json_t *evs, *r;

	/* The answer hit max_output_tokens: response.incomplete. */
	fcgi_resp_state_init(&s, "m", NULL);
	fcgi_resp_text(&s, &out, "a", 1); /* no begin: the wire's job; numbering still */
	fcgi_resp_end(&s, &out, NULL, 0, &o);
	evs = events(&out, 0);
	r = json_object_get(json_array_get(evs, json_array_size(evs) - 1), "response");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(r, "status")), "incomplete");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(
				       json_object_get(r, "incomplete_details"), "reason")),
			       "max_output_tokens");
	json_decref(evs);
	fcgi_resp_state_release(&s);

	/* Failures: codes codex acts on. */
	static const struct {
		enum prov_error err;
		int upstream;
		const char *code, *msg;
	} fails[] = {
		{ PROV_ERR_PROVIDER_ERROR, 429, "rate_limit_exceeded", "try again in 2s" },
		{ PROV_ERR_CONCURRENCY_LIMIT, 0, "rate_limit_exceeded", "try again in 2s" },
		{ PROV_ERR_PROVIDER_ERROR, 402, "insufficient_quota", "boom" },
		{ PROV_ERR_PROMPT_REFUSED, 0, "context_length_exceeded", "boom" },
		{ PROV_ERR_SPAWN_TIMEOUT, 0, "server_error", "boom" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(fails); i++) {
		static const char *const types[] = { "response.created", "response.in_progress",
						     "response.failed" };

		o = outcome("stop");
		o.err = fails[i].err;
		o.upstream_status = fails[i].upstream;
		snprintf(o.message, sizeof(o.message), "boom");
		buf_reset(&out);
		fcgi_resp_state_init(&s, "m", NULL);
		fcgi_resp_begin(&s, &out);
		fcgi_resp_end(&s, &out, NULL, 0, &o);
		evs = events(&out, 0);
		expect_types(evs, types, ARRAY_SIZE(types));
		r = json_object_get(json_array_get(evs, 2), "response");
		CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(r, "status")), "failed");
		CU_ASSERT_STRING_EQUAL(
			json_string_value(json_object_get(json_object_get(r, "error"), "code")),
			fails[i].code);
		CU_ASSERT_PTR_NOT_NULL(strstr(
			json_string_value(json_object_get(json_object_get(r, "error"), "message")),
			fails[i].msg));
		json_decref(evs);
		fcgi_resp_state_release(&s);
	}
	buf_release(&out);
}

static void test_whole(void)
{
	json_t *custom = json_pack("[s]", "p"), *r, *output;
	struct fcgi_tool_call calls[] = {
		{ .id = "c1", .name = "f", .args = "", .args_len = 0 },
		{ .id = "c2", .name = "p", .args = "not json", .args_len = 8 },
	};
	struct prov_outcome o = outcome("stop");
	struct fcgi_resp_state s;
	struct buf out = BUF_INIT;

	fcgi_resp_state_init(&s, "m", custom);
	fcgi_resp_whole(&s, &out, "hi", 2, calls, 2, &o);
	r = json_loads(out.data, 0, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(r, "object")), "response");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(r, "status")), "completed");
	CU_ASSERT_TRUE(json_is_false(json_object_get(r, "store")));
	output = json_object_get(r, "output");
	CU_ASSERT_EQUAL(json_array_size(output), 3);
	CU_ASSERT_STRING_EQUAL(
		json_string_value(json_object_get(json_array_get(output, 0), "type")), "message");
	/* A call without arguments has an empty object of them; a custom call's input that
	 * is not the wrapped form is passed whole. */
	CU_ASSERT_STRING_EQUAL(
		json_string_value(json_object_get(json_array_get(output, 1), "arguments")), "{}");
	CU_ASSERT_STRING_EQUAL(
		json_string_value(json_object_get(json_array_get(output, 2), "input")), "not json");
	json_decref(r);
	json_decref(custom);
	buf_release(&out);
	fcgi_resp_state_release(&s);

	/* No text and no call: still one (empty) message. */
	buf_init(&out);
	fcgi_resp_state_init(&s, "m", NULL);
	fcgi_resp_whole(&s, &out, "", 0, NULL, 0, &o);
	r = json_loads(out.data, 0, NULL);
	CU_ASSERT_EQUAL(json_array_size(json_object_get(r, "output")), 1);
	json_decref(r);
	buf_release(&out);
	fcgi_resp_state_release(&s);
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "translate: input, instructions, stream, max_output_tokens",
		  test_translate_input },
		{ "translate: calls and their outputs", test_translate_calls },
		{ "translate: tools and tool_choice", test_translate_tools },
		{ "refusals: 400 naming the field", test_refusals },
		{ "stream: a text answer's events in order", test_stream_text },
		{ "stream: text then function and custom calls", test_stream_calls },
		{ "stream: incomplete and failed ends", test_stream_ends },
		{ "whole: the response object", test_whole },
		{ NULL, NULL },
	};

	return ts_exit_status(ts_cunit_run("responses", tests));
}
