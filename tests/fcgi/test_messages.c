/* CUnit suite for the Anthropic Messages front-end of fcgi/ (fcgi.h): the request's
 * translation into a chat request (every field, every refusal naming its path), the
 * count_tokens estimate, and the answers' encodings, the stream's events checked in
 * Anthropic's order, each parsed back with jansson. No I/O, no FastCGI. */
#include "tests/support/cunit.h"
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "fcgi/fcgi.h"
#include "common/banned.h"

#define PNG                                                                                    \
	"iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJ" \
	"RU5ErkJggg=="

static json_t *load(const char *s)
{
	json_error_t e;
	json_t *v = json_loads(s, JSON_REJECT_DUPLICATES, &e);

	if (!v)
		fprintf(stderr, "bad JSON in the test (%s): %s\n", e.text, s);
	return v;
}

/* v equals the JSON text want. */
static bool jeq(const json_t *v, const char *want)
{
	json_t *w = load(want);
	bool eq = w && json_equal(v, w);

	json_decref(w);
	return eq;
}

/* Translate body (count: count_tokens' rules); NULL on a refusal (err filled). */
static json_t *translate(const char *body, bool count, struct fcgi_error *err)
{
	json_t *root = load(body), *chat;

	CU_ASSERT_PTR_NOT_NULL_FATAL(root);
	chat = fcgi_messages_translate(root, count, err);
	json_decref(root);
	return chat;
}

/* body translates to exactly want, which the chat parser takes as it is. */
static void check_translation(const char *body, const char *want)
{
	struct fcgi_error err = { 0 };
	struct fcgi_chat_request req;
	json_t *chat = translate(body, false, &err), *w = load(want);
	char *got = chat ? json_dumps(chat, JSON_SORT_KEYS | JSON_COMPACT) : NULL;

	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	if (!chat || !json_equal(chat, w))
		fprintf(stderr, "\n  body: %s\n  got:  %s%s\n  want: %s\n", body,
			got ? got : "NULL ", chat ? "" : err.message, want);
	CU_ASSERT_FATAL(chat && json_equal(chat, w));
	free(got);
	json_decref(w);
	CU_ASSERT_EQUAL(fcgi_chat_parse_json(chat, &req, &err), 0);
	fcgi_chat_release(&req);
}

static void test_translate_fields(void)
{
	/* The smallest request; stream false is said outright. */
	check_translation("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\","
			  "\"content\":\"hi\"}]}",
			  "{\"model\":\"m\",\"max_tokens\":5,\"stream\":false,"
			  "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
	/* system as a string; stop_sequences as stop; stream; what is ignored on purpose and
	 * metadata leave no trace. */
	check_translation(
		"{\"model\":\"m\",\"max_tokens\":7,\"system\":\"be brief\",\"stream\":true,"
		"\"stop_sequences\":[\"END\",\"##\"],\"temperature\":0.5,\"top_p\":1,\"top_k\":3,"
		"\"thinking\":{\"type\":\"adaptive\"},\"context_management\":{\"edits\":[]},"
		"\"output_config\":{\"effort\":\"low\"},\"metadata\":{\"user_id\":\"u\"},"
		"\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
		"{\"model\":\"m\",\"max_tokens\":7,\"stream\":true,\"stop\":[\"END\",\"##\"],"
		"\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
		"{\"role\":\"user\",\"content\":\"hi\"}]}");
	/* system blocks (cache_control accepted) joined by a newline; a "system" turn among
	 * the messages (Claude Code's, with its output_config) where it stands. */
	check_translation(
		"{\"model\":\"m\",\"max_tokens\":1,\"system\":[{\"type\":\"text\",\"text\":\"a\"},"
		"{\"type\":\"text\",\"text\":\"b\",\"cache_control\":{\"type\":\"ephemeral\"}}],"
		"\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"q\","
		"\"cache_control\":{\"type\":\"ephemeral\"}}]},{\"role\":\"system\",\"content\":"
		"[{\"type\":\"text\",\"text\":\"note\"}],\"output_config\":{\"effort\":\"high\"}}]"
		"}",
		"{\"model\":\"m\",\"max_tokens\":1,\"stream\":false,\"messages\":["
		"{\"role\":\"system\",\"content\":\"a\\nb\"},"
		"{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"q\"}]},"
		"{\"role\":\"system\",\"content\":\"note\"}]}");
	/* An image block as an image_url part with a data: URL. */
	check_translation(
		"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":["
		"{\"type\":\"text\",\"text\":\"what?\"},{\"type\":\"image\",\"source\":{\"type\":"
		"\"base64\",\"media_type\":\"image/png\",\"data\":\"" PNG "\"}}]}]}",
		"{\"model\":\"m\",\"max_tokens\":1,\"stream\":false,\"messages\":[{\"role\":"
		"\"user\","
		"\"content\":[{\"type\":\"text\",\"text\":\"what?\"},{\"type\":\"image_url\","
		"\"image_url\":{\"url\":\"data:image/png;base64," PNG "\"}}]}]}");
}

static void test_translate_tools(void)
{
	/* The history of a tool round trip: the assistant's text and tool_use (thinking left
	 * out) as content and tool_calls; the tool_results as tool messages (is_error
	 * marked, text blocks joined), the user's text after them; an image of a result in
	 * the user message that follows. Tools as function tools; tool_choice any. */
	check_translation(
		"{\"model\":\"m\",\"max_tokens\":9,\"tool_choice\":{\"type\":\"any\"},"
		"\"tools\":[{\"name\":\"Bash\",\"description\":\"run\",\"input_schema\":{\"type\":"
		"\"object\"},\"defer_loading\":true},{\"name\":\"t2\",\"input_schema\":{}}],"
		"\"messages\":[{\"role\":\"user\",\"content\":\"go\"},"
		"{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\","
		"\"signature\":\"s\"},{\"type\":\"text\",\"text\":\"ok\"},{\"type\":\"tool_use\","
		"\"id\":\"tu1\",\"name\":\"Bash\",\"input\":{\"command\":\"ls\"}},{\"type\":"
		"\"tool_use\",\"id\":\"tu2\",\"name\":\"t2\",\"input\":{}}]},"
		"{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"tu1\","
		"\"content\":\"a.txt\",\"is_error\":true},{\"type\":\"tool_result\",\"tool_use_"
		"id\":"
		"\"tu2\",\"content\":[{\"type\":\"text\",\"text\":\"x\"},{\"type\":\"text\","
		"\"text\":"
		"\"y\"},{\"type\":\"image\",\"source\":{\"type\":\"base64\",\"media_type\":"
		"\"image/png\",\"data\":\"" PNG "\"}}]},{\"type\":\"text\",\"text\":\"more\"}]}]}",
		"{\"model\":\"m\",\"max_tokens\":9,\"stream\":false,\"tool_choice\":\"required\","
		"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"Bash\",\"description\":"
		"\"run\",\"parameters\":{\"type\":\"object\"}}},{\"type\":\"function\","
		"\"function\":"
		"{\"name\":\"t2\",\"description\":\"\",\"parameters\":{}}}],\"messages\":["
		"{\"role\":\"user\",\"content\":\"go\"},"
		"{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"ok\"}],"
		"\"tool_calls\":[{\"id\":\"tu1\",\"type\":\"function\",\"function\":{\"name\":"
		"\"Bash\",\"arguments\":\"{\\\"command\\\":\\\"ls\\\"}\"}},{\"id\":\"tu2\","
		"\"type\":"
		"\"function\",\"function\":{\"name\":\"t2\",\"arguments\":\"{}\"}}]},"
		"{\"role\":\"tool\",\"tool_call_id\":\"tu1\",\"content\":\"[error] a.txt\"},"
		"{\"role\":\"tool\",\"tool_call_id\":\"tu2\",\"content\":\"x\\ny\"},"
		"{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"(an image from the "
		"result of tool call tu2)\"},{\"type\":\"image_url\",\"image_url\":{\"url\":"
		"\"data:image/png;base64," PNG "\"}},{\"type\":\"text\",\"text\":\"more\"}]}]}");
	/* Claude Code's tool search: a ToolSearch call answered with tool_reference blocks
	 * (cache_control accepted), one per deferred tool it loads, beside a text block. Each
	 * becomes a line naming the tool; the deferred tool is declared all along. */
	check_translation(
		"{\"model\":\"m\",\"max_tokens\":9,\"tools\":[{\"name\":\"ToolSearch\","
		"\"input_schema\":{}},{\"name\":\"TaskCreate\",\"input_schema\":{},"
		"\"defer_loading\":true}],\"messages\":[{\"role\":\"user\",\"content\":\"go\"},"
		"{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"s1\","
		"\"name\":\"ToolSearch\",\"input\":{\"query\":\"select:TaskCreate\"}}]},"
		"{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":"
		"\"s1\",\"content\":[{\"type\":\"tool_reference\",\"tool_name\":\"TaskCreate\"},"
		"{\"type\":\"tool_reference\",\"tool_name\":\"TaskUpdate\",\"cache_control\":"
		"{\"type\":\"ephemeral\"}},{\"type\":\"text\",\"text\":\"done\"}]}]}]}",
		"{\"model\":\"m\",\"max_tokens\":9,\"stream\":false,\"tools\":[{\"type\":"
		"\"function\",\"function\":{\"name\":\"ToolSearch\",\"description\":\"\","
		"\"parameters\":{}}},{\"type\":\"function\",\"function\":{\"name\":"
		"\"TaskCreate\",\"description\":\"\",\"parameters\":{}}}],\"messages\":["
		"{\"role\":\"user\",\"content\":\"go\"},{\"role\":\"assistant\",\"content\":null,"
		"\"tool_calls\":[{\"id\":\"s1\",\"type\":\"function\",\"function\":{\"name\":"
		"\"ToolSearch\",\"arguments\":\"{\\\"query\\\":\\\"select:TaskCreate\\\"}\"}}]},"
		"{\"role\":\"tool\",\"tool_call_id\":\"s1\",\"content\":\"Tool loaded: TaskCreate "
		"(declared among the tools; call it by name)\\nTool loaded: TaskUpdate (declared "
		"among the tools; call it by name)\\ndone\"}]}");
	/* An assistant turn of tool_use alone: content null. tool_choice tool, auto, none. */
	check_translation(
		"{\"model\":\"m\",\"max_tokens\":1,\"tools\":[{\"name\":\"f\",\"input_schema\":{}}]"
		","
		"\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\",\"disable_parallel_tool_use\":"
		"true},\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\","
		"\"content\":[{\"type\":\"tool_use\",\"id\":\"i\",\"name\":\"f\",\"input\":{}}]}]}",
		"{\"model\":\"m\",\"max_tokens\":1,\"stream\":false,\"tools\":[{\"type\":"
		"\"function\",\"function\":{\"name\":\"f\",\"description\":\"\",\"parameters\":{}}}"
		"],"
		"\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
		"\"messages\":["
		"{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":null,"
		"\"tool_calls\":[{\"id\":\"i\",\"type\":\"function\",\"function\":{\"name\":\"f\","
		"\"arguments\":\"{}\"}}]}]}");
	check_translation(
		"{\"model\":\"m\",\"max_tokens\":1,\"tools\":[{\"name\":\"f\",\"input_schema\":{}}]"
		","
		"\"tool_choice\":{\"type\":\"none\"},\"messages\":[{\"role\":\"user\",\"content\":"
		"\"a\"}]}",
		"{\"model\":\"m\",\"max_tokens\":1,\"stream\":false,\"tools\":[{\"type\":"
		"\"function\",\"function\":{\"name\":\"f\",\"description\":\"\",\"parameters\":{}}}"
		"],"
		"\"tool_choice\":\"none\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}");
	check_translation(
		"{\"model\":\"m\",\"max_tokens\":1,\"tools\":[],\"tool_choice\":{\"type\":"
		"\"auto\"},\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
		"{\"model\":\"m\",\"max_tokens\":1,\"stream\":false,\"tool_choice\":"
		"\"auto\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}");
}

#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
#define REQ(extra) "{\"model\":\"m\",\"max_tokens\":5," extra MSGS "}"
#define USER(blocks)                                                                              \
	"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[" blocks \
	"]}]}"
#define IMG(src) "{\"type\":\"image\",\"source\":" src "}"

static void test_translate_refusals(void)
{
	static const struct {
		const char *body;
		const char *msg; /* the message's start: the path, then why */
	} cases[] = {
		{ "[]", "body: must be a JSON object" },
		{ "{\"max_tokens\":5," MSGS "}", "model: must be a non-empty string" },
		{ "{\"model\":\"\",\"max_tokens\":5," MSGS "}",
		  "model: must be a non-empty string" },
		{ "{\"model\":\"m\"," MSGS "}", "max_tokens: required" },
		{ "{\"model\":\"m\",\"max_tokens\":0," MSGS "}",
		  "max_tokens: must be a positive integer" },
		{ "{\"model\":\"m\",\"max_tokens\":1.5," MSGS "}",
		  "max_tokens: must be a positive integer" },
		{ REQ("\"n\":1,"), "n: unknown field" },
		{ REQ("\"service_tier\":\"auto\","), "service_tier: unknown field" },
		{ REQ("\"mcp_servers\":[],"), "mcp_servers: not supported" },
		{ REQ("\"container\":\"c\","), "container: not supported" },
		{ REQ("\"output_format\":{},"), "output_format: not supported" },
		{ REQ("\"thinking\":true,"), "thinking: must be an object" },
		{ REQ("\"context_management\":[],"), "context_management: must be an object" },
		{ REQ("\"temperature\":1.5,"), "temperature: must be a number between 0 and 1" },
		{ REQ("\"top_p\":\"1\","), "top_p: must be a number between 0 and 1" },
		{ REQ("\"top_k\":-1,"), "top_k: must be a non-negative integer" },
		{ REQ("\"metadata\":[],"), "metadata: must be an object" },
		{ REQ("\"metadata\":{\"x\":1},"), "metadata: unknown field x" },
		{ REQ("\"metadata\":{\"user_id\":1},"), "metadata.user_id: must be a string" },
		{ REQ("\"stream\":1,"), "stream: must be a boolean" },
		{ REQ("\"stop_sequences\":\"x\","), "stop_sequences: must be an array" },
		{ REQ("\"stop_sequences\":[\"a\",\"b\",\"c\",\"d\",\"e\"],"),
		  "stop_sequences: must be an array of up to 4" },
		{ REQ("\"stop_sequences\":[\"a\",\"\"],"), "stop_sequences.1: must be a string" },
		{ REQ("\"system\":5,"), "system: must be a string or an array of text blocks" },
		{ REQ("\"system\":[{\"type\":\"image\"}],"), "system.0: must be a text block" },
		{ REQ("\"system\":[{\"type\":\"text\"}],"), "system.0.text: must be a string" },
		{ REQ("\"system\":[\"x\"],"), "system.0: must be a content block" },
		{ "{\"model\":\"m\",\"max_tokens\":5}", "messages: must be a non-empty array" },
		{ "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[]}",
		  "messages: must be a non-empty array" },
		{ "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[5]}",
		  "messages.0: must be an object" },
		{ "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"tool\",\"content\":"
		  "\"x\"}"
		  "]}",
		  "messages.0.role: must be \"user\" or \"assistant\"" },
		{ "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
		  "\"x\","
		  "\"name\":\"n\"}]}",
		  "messages.0: unknown field name" },
		{ "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\"}]}",
		  "messages.0.content: must be a string or an array" },
		{ "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"system\","
		  "\"content\":"
		  "\"x\"}]}",
		  "messages: must hold a user or assistant turn" },
		{ "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\","
		  "\"content\":"
		  "[{\"type\":\"thinking\",\"thinking\":\"x\"}]}]}",
		  "messages: must hold a user or assistant turn" },
		{ USER("{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"document\"}"),
		  "messages.0.content.1: a user message's blocks must be text, image or "
		  "tool_result "
		  "(not document)" },
		{ USER("{\"text\":\"a\"}"), "messages.0.content.0: must have a \"type\" string" },
		{ USER("{\"type\":\"text\",\"text\":1}"),
		  "messages.0.content.0.text: must be a string" },
		{ USER("{\"type\":\"text\",\"text\":\"a\",\"x\":1}"),
		  "messages.0.content.0: unknown field x" },
		{ USER(IMG("{\"type\":\"url\",\"url\":\"https://a/b.png\"}")),
		  "messages.0.content.0.source.type: url image sources are not fetched" },
		{ USER(IMG("{\"type\":\"file\",\"file_id\":\"f\"}")),
		  "messages.0.content.0.source.type: file image sources are not fetched" },
		{ USER(IMG(
			  "{\"type\":\"base64\",\"media_type\":\"image/tiff\",\"data\":\"AAAA\"}")),
		  "messages.0.content.0.source.media_type: must be image/png" },
		{ USER(IMG("{\"type\":\"base64\",\"media_type\":\"image/png\"}")),
		  "messages.0.content.0.source.data: must be a string" },
		{ USER(IMG("{\"type\":\"base64\",\"media_type\":\"image/png\",\"data\":\"!!!!\"}")),
		  "messages.0.content.0.source.data: the image data is not valid base64" },
		{ USER(IMG("{\"type\":\"base64\",\"media_type\":\"image/gif\",\"data\":\"" PNG
			   "\"}")),
		  "messages.0.content.0.source.data: the data is not a gif image" },
		{ USER(IMG("5")), "messages.0.content.0.source: must be an object" },
		{ USER("{\"type\":\"tool_result\",\"content\":\"x\"}"),
		  "messages.0.content.0.tool_use_id: must be a non-empty string" },
		{ USER("{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"is_error\":1}"),
		  "messages.0.content.0.is_error: must be a boolean" },
		{ USER("{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":5}"),
		  "messages.0.content.0.content: must be a string or an array of text, image and "
		  "tool_reference blocks" },
		{ USER("{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":[{\"type\":"
		       "\"document\"}]}"),
		  "messages.0.content.0.content.0: must be a text, image or tool_reference block "
		  "(not "
		  "document)" },
		{ USER("{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":[{\"type\":"
		       "\"tool_reference\"}]}"),
		  "messages.0.content.0.content.0.tool_name: must be a non-empty string" },
		{ USER("{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":[{\"type\":"
		       "\"tool_reference\",\"tool_name\":\"\"}]}"),
		  "messages.0.content.0.content.0.tool_name: must be a non-empty string" },
		{ USER("{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":[{\"type\":"
		       "\"tool_reference\",\"tool_name\":\"f\",\"x\":1}]}"),
		  "messages.0.content.0.content.0: unknown field x" },
		{ USER("{\"type\":\"tool_reference\",\"tool_name\":\"f\"}"),
		  "messages.0.content.0: a user message's blocks must be text, image or "
		  "tool_result (not tool_reference)" },
		{ USER("{\"type\":\"tool_use\",\"id\":\"i\",\"name\":\"f\",\"input\":{}}"),
		  "messages.0.content.0: a user message's blocks must be text, image or "
		  "tool_result" },
		{ "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\","
		  "\"content\":"
		  "[{\"type\":\"tool_use\",\"id\":\"i\",\"name\":\"f\",\"input\":[]}]}]}",
		  "messages.0.content.0.input: must be an object" },
		{ "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\","
		  "\"content\":"
		  "[{\"type\":\"tool_use\",\"name\":\"f\",\"input\":{}}]}]}",
		  "messages.0.content.0.id: must be a non-empty string" },
		{ "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\","
		  "\"content\":"
		  "[{\"type\":\"image\"}]}]}",
		  "messages.0.content.0: an assistant message's blocks must be text, tool_use" },
		{ REQ("\"tools\":{},"), "tools: must be an array of up to 128 tools" },
		{ REQ("\"tools\":[5],"), "tools.0: must be an object" },
		{ REQ("\"tools\":[{\"type\":\"bash_20250124\",\"name\":\"bash\"}],"),
		  "tools.0: server tools (type bash_20250124) are not supported" },
		{ REQ("\"tools\":[{\"name\":\"a.b\",\"input_schema\":{}}],"),
		  "tools.0.name: must be 1 to 64 of" },
		{ REQ("\"tools\":[{\"name\":\"f\",\"input_schema\":{}},{\"name\":\"f\","
		      "\"input_schema\":{}}],"),
		  "tools.1.name: two tools have the name f" },
		{ REQ("\"tools\":[{\"name\":\"f\",\"description\":3,\"input_schema\":{}}],"),
		  "tools.0.description: must be a string" },
		{ REQ("\"tools\":[{\"name\":\"f\"}],"),
		  "tools.0.input_schema: must be a JSON Schema" },
		{ REQ("\"tools\":[{\"name\":\"f\",\"input_schema\":{},\"x\":1}],"),
		  "tools.0: unknown field x" },
		{ REQ("\"tool_choice\":\"auto\","), "tool_choice: must be {\"type\"" },
		{ REQ("\"tool_choice\":{\"type\":\"sometimes\"},"),
		  "tool_choice.type: must be \"auto\"" },
		{ REQ("\"tool_choice\":{\"type\":\"any\"},"),
		  "tool_choice: asks for a tool call, but there are no tools" },
		{ REQ("\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":{\"type\":"
		      "\"tool\",\"name\":\"g\"},"),
		  "tool_choice.name: must name one of the tools" },
		{ REQ("\"tool_choice\":{\"type\":\"auto\",\"x\":1},"),
		  "tool_choice: unknown field x" },
	};

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		struct fcgi_error err = { 0 };
		json_t *chat = translate(cases[i].body, false, &err);
		bool ok = !chat && err.status == 400 &&
			  !strcmp(err.type, "invalid_request_error") &&
			  !strncmp(err.message, cases[i].msg, strlen(cases[i].msg)) &&
			  !strncmp(err.message, err.param, strlen(err.param));

		if (!ok)
			fprintf(stderr, "\n  case %zu: %s\n  got: %d %s\n  want: %s…\n", i,
				cases[i].body, err.status, chat ? "(accepted)" : err.message,
				cases[i].msg);
		CU_ASSERT(ok);
		json_decref(chat);
	}
}

/* An image over the cap is 413 naming its path; more than FCGI_MAX_IMAGES is 400. */
static void test_translate_image_limits(void)
{
	struct buf body = BUF_INIT;
	struct fcgi_error err = { 0 };
	json_t *chat;
	size_t i, n = (FCGI_MAX_IMAGE_BYTES / 3 + 1) * 4;

	buf_adds(&body, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\","
			"\"content\":[{\"type\":\"image\",\"source\":{\"type\":\"base64\","
			"\"media_type\":\"image/png\",\"data\":\"iVBORw0KGgo");
	for (i = 11; i < n; i++)
		buf_addch(&body, 'A');
	buf_adds(&body, "\"}}]}]}");
	chat = translate(body.data, false, &err);
	CU_ASSERT_PTR_NULL(chat);
	CU_ASSERT_EQUAL(err.status, 413);
	CU_ASSERT_STRING_EQUAL(err.type, "request_too_large");
	CU_ASSERT(!strncmp(err.message, "messages.0.content.0.source.data: the image is ", 47));
	buf_reset(&body);
	buf_adds(
		&body,
		"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[");
	for (i = 0; i <= FCGI_MAX_IMAGES; i++)
		buf_addf(&body,
			 "%s" IMG("{\"type\":\"base64\",\"media_type\":\"image/png\",\"data\":"
				  "\"" PNG "\"}"),
			 i ? "," : "");
	buf_adds(&body, "]}]}");
	chat = translate(body.data, false, &err);
	CU_ASSERT_PTR_NULL(chat);
	CU_ASSERT_EQUAL(err.status, 400);
	CU_ASSERT_STRING_EQUAL(err.param, "messages.0.content.20.source.data");
	buf_release(&body);
}

static void test_count_tokens(void)
{
	struct fcgi_error err = { 0 };
	json_t *chat;

	/* count_tokens takes no max_tokens; /v1/messages requires it. */
	chat = translate(
		"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"12345678\"}]}",
		true, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(chat);
	/* 8 bytes of prompt: 2 tokens. */
	CU_ASSERT_EQUAL(fcgi_messages_count_tokens(json_object_get(chat, "messages"), NULL), 2);
	/* with tools: their declaration's JSON too. */
	{
		json_t *tools = load("[{\"a\":\"bcd\"}]"); /* 13 bytes */

		CU_ASSERT_EQUAL(
			fcgi_messages_count_tokens(json_object_get(chat, "messages"), tools),
			(8 + 13 + 3) / 4);
		json_decref(tools);
	}
	json_decref(chat);
	chat = translate("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
			 "\"text\",\"text\":\"1234\"}," IMG("{\"type\":\"base64\",\"media_type\":"
							    "\"image/png\",\"data\":\"" PNG
							    "\"}") "]}]}",
			 true, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(chat);
	CU_ASSERT_EQUAL(fcgi_messages_count_tokens(json_object_get(chat, "messages"), NULL),
			1 + FCGI_IMAGE_TOKENS);
	json_decref(chat);
	chat = translate("{\"model\":\"m\"," MSGS "}", false, &err);
	CU_ASSERT_PTR_NULL(chat);
	CU_ASSERT(!strncmp(err.message, "max_tokens: required", 20));
}

static void test_stop_reason(void)
{
	CU_ASSERT_STRING_EQUAL(fcgi_messages_stop_reason("stop"), "end_turn");
	CU_ASSERT_STRING_EQUAL(fcgi_messages_stop_reason("length"), "max_tokens");
	CU_ASSERT_STRING_EQUAL(fcgi_messages_stop_reason("tool_calls"), "tool_use");
	CU_ASSERT_STRING_EQUAL(fcgi_messages_stop_reason("content_filter"), "refusal");
}

/* The events in out: each "event: NAME\ndata: JSON\n\n", NAME the data's type. An array
 * of the data objects, or NULL when one is malformed. */
static json_t *sse_events(const struct buf *out)
{
	json_t *evs = json_array();
	const char *p = out->data;

	while (*p) {
		const char *nl = strchr(p, '\n'), *end = strstr(p, "\n\n");
		char name[64];
		json_t *d;

		if (strncmp(p, "event: ", 7) || !nl || !end || strncmp(nl + 1, "data: ", 6) ||
		    (size_t)(nl - p - 7) >= sizeof(name))
			goto fail;
		memcpy(name, p + 7, (size_t)(nl - p - 7));
		name[nl - p - 7] = '\0';
		d = json_loadb(nl + 7, (size_t)(end - nl - 7), 0, NULL);
		if (!d || strcmp(json_string_value(json_object_get(d, "type")) ?: "", name)) {
			json_decref(d);
			goto fail;
		}
		json_array_append_new(evs, d);
		p = end + 2;
	}
	return evs;
fail:
	fprintf(stderr, "\n  bad event stream: %s\n", out->data);
	json_decref(evs);
	return NULL;
}

/* The events' types, space-separated (with the block index of block events). */
static void event_names(const json_t *evs, struct buf *names)
{
	const json_t *e;
	size_t i;

	json_array_foreach(evs, i, e) {
		const json_t *idx = json_object_get(e, "index");

		buf_addf(names, "%s%s", i ? " " : "",
			 json_string_value(json_object_get(e, "type")));
		if (idx)
			buf_addf(names, ":%lld", (long long)json_integer_value(idx));
	}
}

static void check_stream(const struct buf *out, const char *want)
{
	json_t *evs = sse_events(out);
	struct buf names = BUF_INIT;

	CU_ASSERT_PTR_NOT_NULL_FATAL(evs);
	event_names(evs, &names);
	if (strcmp(names.data, want))
		fprintf(stderr, "\n  got:  %s\n  want: %s\n", names.data, want);
	CU_ASSERT_STRING_EQUAL(names.data, want);
	buf_release(&names);
	json_decref(evs);
}

static void test_stream_order(void)
{
	struct prov_usage u = {
		.present = true, .prompt_tokens = 30, .completion_tokens = 7, .cached_tokens = 20
	};
	struct fcgi_msg_stream st;
	struct buf out = BUF_INIT;
	json_t *evs, *e;

	/* text, text, a call in two pieces, a call without arguments, more text, the end */
	fcgi_msg_stream_init(&st, "claude-opus-5-5");
	CU_ASSERT(!strncmp(st.id, "msg_", 4));
	fcgi_msg_sse_text(&st, &out, "Hel", 3);
	fcgi_msg_sse_text(&st, &out, "lo", 2);
	fcgi_msg_sse_tool(&st, &out, 0, "toolu_1", "Bash", "{\"command\":", 11);
	fcgi_msg_sse_tool(&st, &out, 0, NULL, NULL, "\"ls\"}", 5);
	fcgi_msg_sse_ping(&st, &out);
	fcgi_msg_sse_tool(&st, &out, 1, "toolu_2", "Read", "", 0);
	/* a piece of call 0 after call 1 began: its block is closed, the piece dropped */
	fcgi_msg_sse_tool(&st, &out, 0, NULL, NULL, "x", 1);
	fcgi_msg_sse_text(&st, &out, "!", 1);
	fcgi_msg_sse_end(&st, &out, "tool_use", NULL, &u);
	check_stream(&out, "message_start ping content_block_start:0 content_block_delta:0 "
			   "content_block_delta:0 content_block_stop:0 content_block_start:1 "
			   "content_block_delta:1 content_block_delta:1 ping content_block_stop:1 "
			   "content_block_start:2 content_block_stop:2 content_block_start:3 "
			   "content_block_delta:3 content_block_stop:3 message_delta message_stop");
	evs = sse_events(&out);
	CU_ASSERT_PTR_NOT_NULL_FATAL(evs);
	e = json_object_get(json_array_get(evs, 0), "message");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(e, "id")), st.id);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(e, "model")), "claude-opus-5-5");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(e, "role")), "assistant");
	CU_ASSERT(json_is_null(json_object_get(e, "stop_reason")));
	CU_ASSERT_EQUAL(json_array_size(json_object_get(e, "content")), 0);
	e = json_object_get(json_array_get(evs, 2), "content_block");
	CU_ASSERT(jeq(e, "{\"type\":\"text\",\"text\":\"\"}"));
	e = json_object_get(json_array_get(evs, 4), "delta");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(e, "text")), "lo");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(e, "type")), "text_delta");
	e = json_object_get(json_array_get(evs, 6), "content_block");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(e, "type")), "tool_use");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(e, "id")), "toolu_1");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(e, "name")), "Bash");
	CU_ASSERT(json_is_object(json_object_get(e, "input")));
	e = json_object_get(json_array_get(evs, 8), "delta");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(e, "type")), "input_json_delta");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(e, "partial_json")), "\"ls\"}");
	e = json_array_get(evs, json_array_size(evs) - 2);
	CU_ASSERT(jeq(json_object_get(e, "delta"),
		      "{\"stop_reason\":\"tool_use\",\"stop_sequence\":null}"));
	/* cached input apart, as Anthropic counts it */
	CU_ASSERT(jeq(json_object_get(e, "usage"), "{\"input_tokens\":10,\"output_tokens\":7,"
						   "\"cache_read_input_tokens\":20}"));
	json_decref(evs);
	buf_release(&out);
}

static void test_stream_edges(void)
{
	struct fcgi_msg_stream st;
	struct buf out = BUF_INIT;
	struct fcgi_error e = { .status = 504 };
	json_t *evs;

	/* A heartbeat as the first bytes: message_start then its ping; then a stop sequence. */
	fcgi_msg_stream_init(&st, "m");
	fcgi_msg_sse_ping(&st, &out);
	fcgi_msg_sse_ping(&st, &out);
	fcgi_msg_sse_text(&st, &out, "a", 1);
	fcgi_msg_sse_end(&st, &out, "end_turn", "STOP", NULL);
	check_stream(&out, "message_start ping ping content_block_start:0 content_block_delta:0 "
			   "content_block_stop:0 message_delta message_stop");
	evs = sse_events(&out);
	CU_ASSERT_PTR_NOT_NULL_FATAL(evs);
	CU_ASSERT(jeq(json_object_get(json_array_get(evs, 6), "delta"),
		      "{\"stop_reason\":\"stop_sequence\",\"stop_sequence\":\"STOP\"}"));
	CU_ASSERT(jeq(json_object_get(json_array_get(evs, 6), "usage"),
		      "{\"input_tokens\":0,\"output_tokens\":0,"
		      "\"cache_read_input_tokens\":0}"));
	json_decref(evs);
	/* Nothing said at all: still a whole, empty message. */
	buf_reset(&out);
	fcgi_msg_stream_init(&st, "m");
	fcgi_msg_sse_end(&st, &out, "end_turn", NULL, NULL);
	check_stream(&out, "message_start ping message_delta message_stop");
	/* A failure after the start: an error event in Anthropic's shape. */
	buf_reset(&out);
	snprintf(e.message, sizeof(e.message), "Provider timed out");
	fcgi_msg_sse_text(&st, &out, "a", 1);
	buf_reset(&out);
	fcgi_msg_sse_error(&st, &out, &e);
	check_stream(&out, "error");
	evs = sse_events(&out);
	CU_ASSERT_PTR_NOT_NULL_FATAL(evs);
	CU_ASSERT(jeq(json_array_get(evs, 0),
		      "{\"type\":\"error\",\"error\":{\"type\":\"api_error\","
		      "\"message\":\"Provider timed out\"}}"));
	json_decref(evs);
	buf_release(&out);
}

static void test_whole(void)
{
	struct fcgi_tool_call calls[] = {
		{ .id = "toolu_1", .name = "Bash", .args = "{\"command\":\"ls\"}", .args_len = 16 },
		{ .id = "toolu_2", .name = "Read", .args = "{\"cut", .args_len = 5 },
	};
	struct prov_usage u = { .present = true, .prompt_tokens = 12, .completion_tokens = 3 };
	struct fcgi_msg_stream st;
	struct buf out = BUF_INIT;
	json_t *v, *want;

	fcgi_msg_stream_init(&st, "claude-x");
	fcgi_msg_json(&out, &st, "Sure.", 5, calls, 2, "tool_use", NULL, &u);
	v = load(out.data);
	CU_ASSERT_PTR_NOT_NULL_FATAL(v);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(v, "id")), st.id);
	json_object_del(v, "id");
	/* arguments that are no JSON object (a call cut short) are input {} */
	want = load(
		"{\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-x\",\"content\":"
		"[{\"type\":\"text\",\"text\":\"Sure.\"},{\"type\":\"tool_use\",\"id\":"
		"\"toolu_1\",\"name\":\"Bash\",\"input\":{\"command\":\"ls\"}},{\"type\":"
		"\"tool_use\",\"id\":\"toolu_2\",\"name\":\"Read\",\"input\":{}}],"
		"\"stop_reason\":\"tool_use\",\"stop_sequence\":null,\"usage\":{"
		"\"input_tokens\":12,\"output_tokens\":3,\"cache_read_input_tokens\":0}}");
	CU_ASSERT(json_equal(v, want));
	json_decref(v);
	json_decref(want);
	/* calls only; and text only with a stop sequence */
	buf_reset(&out);
	fcgi_msg_json(&out, &st, "", 0, calls, 1, "tool_use", NULL, &u);
	v = load(out.data);
	CU_ASSERT_PTR_NOT_NULL_FATAL(v);
	CU_ASSERT_EQUAL(json_array_size(json_object_get(v, "content")), 1);
	json_decref(v);
	buf_reset(&out);
	fcgi_msg_json(&out, &st, "one ", 4, NULL, 0, "end_turn", "STOP", NULL);
	v = load(out.data);
	CU_ASSERT_PTR_NOT_NULL_FATAL(v);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(v, "stop_reason")),
			       "stop_sequence");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(v, "stop_sequence")), "STOP");
	json_decref(v);
	buf_release(&out);
}

/* The worker's Messages routes (fcgi/handler.c): Claude Code adds ?beta=true. */
static void test_routes(void)
{
	static const struct fcgi_route routes[] = {
		{ "POST", "/v1/chat/completions", "chat", NULL, 0 },
		{ "POST", "/v1/messages", "messages", NULL, FCGI_ROUTE_ANTHROPIC },
		{ "POST", "/v1/messages/count_tokens", "count_tokens", NULL, FCGI_ROUTE_ANTHROPIC },
	};
	const struct fcgi_route *row;
	struct buf path = BUF_INIT;

	CU_ASSERT_EQUAL(fcgi_route_match(routes, 3, "POST", "/v1/messages?beta=true", NULL, "",
					 &path, &row),
			FCGI_ROUTE_FOUND);
	CU_ASSERT_STRING_EQUAL(row->name, "messages");
	CU_ASSERT_EQUAL(fcgi_route_match(routes, 3, "POST",
					 "/api/v1/messages/count_tokens?beta=true", NULL, "/api",
					 &path, &row),
			FCGI_ROUTE_FOUND);
	CU_ASSERT_STRING_EQUAL(row->name, "count_tokens");
	CU_ASSERT_EQUAL(fcgi_route_match(routes, 3, "GET", "/v1/messages", NULL, "", &path, &row),
			FCGI_ROUTE_BAD_METHOD);
	buf_release(&path);
}

/* Anthropic's error shape for the statuses a Messages request can get. */
static void test_errors(void)
{
	static const struct {
		int status;
		const char *type;
	} cases[] = { { 400, "invalid_request_error" },
		      { 401, "authentication_error" },
		      { 403, "permission_error" },
		      { 404, "not_found_error" },
		      { 413, "request_too_large" },
		      { 429, "rate_limit_error" },
		      { 502, "api_error" },
		      { 503, "overloaded_error" } };

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		struct fcgi_error e;
		struct buf out = BUF_INIT;
		json_t *v;

		fcgi_error_set(&e, cases[i].status, "x", "code", "param", "the message");
		fcgi_error_json_api(&e, FCGI_API_ANTHROPIC, &out);
		v = load(out.data);
		CU_ASSERT_PTR_NOT_NULL_FATAL(v);
		CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(v, "type")), "error");
		CU_ASSERT_STRING_EQUAL(
			json_string_value(json_object_get(json_object_get(v, "error"), "message")),
			"the message");
		CU_ASSERT_STRING_EQUAL(
			json_string_value(json_object_get(json_object_get(v, "error"), "type")),
			cases[i].type);
		CU_ASSERT_EQUAL(json_object_size(v), 2);
		json_decref(v);
		buf_release(&out);
	}
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "translate: every field", test_translate_fields },
		{ "translate: tools, tool_choice, a tool round trip", test_translate_tools },
		{ "translate: every refusal names its path", test_translate_refusals },
		{ "translate: image size and count", test_translate_image_limits },
		{ "count_tokens", test_count_tokens },
		{ "stop reasons", test_stop_reason },
		{ "stream: events in Anthropic's order", test_stream_order },
		{ "stream: first ping, empty answer, stop sequence, error", test_stream_edges },
		{ "whole message", test_whole },
		{ "routes with ?beta=true", test_routes },
		{ "errors in Anthropic's shape", test_errors },
		{ NULL, NULL },
	};

	return ts_exit_status(ts_cunit_run("messages", tests));
}
