/* CUnit suite for the OpenAI surface of fcgi/ (fcgi.h): routing, every validation rule of
 * a chat request (table-driven), and the JSON / server-sent-event encodings, each output
 * parsed back with jansson. No I/O, no FastCGI. */
#include "tests/support/cunit.h"
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "fcgi/fcgi.h"
#include "common/banned.h"

/* ---- routing ----------------------------------------------------------------------------- */

/* The worker's routes (fcgi/handler.c), without their handlers. */
static const struct fcgi_route routes[] = {
	{ "POST", "/v1/chat/completions", "chat", NULL, 0 },
	{ "GET", "/v1/models", "models", NULL, 0 },
	{ "GET", "/health", "health", NULL, 0 },
	{ "GET", "/health/live", "health_live", NULL, 0 },
	{ "GET", "/v1/usage", "usage", NULL, 0 },
	{ "GET", "/dashboard", "dashboard", NULL, 0 },
	{ "GET", "/metrics", "metrics", NULL, 0 },
};

static void test_route(void)
{
	static const struct {
		const char *method, *uri, *path_info, *prefix;
		const char *route; /* the row's name, "not_found" or "bad_method" */
		const char *allow; /* for "bad_method" */
		const char *path;  /* what pathbuf holds afterwards (NULL: not checked) */
	} cases[] = {
		{ "POST", "/v1/chat/completions", NULL, "", "chat", NULL, "/v1/chat/completions" },
		{ "GET", "/v1/models", NULL, "", "models", NULL, "/v1/models" },
		{ "GET", "/health", NULL, "", "health", NULL, "/health" },
		{ "GET", "/health", NULL, NULL, "health", NULL, "/health" },
		/* the query string never selects a route */
		{ "GET", "/v1/models?x=1", NULL, "", "models", NULL, "/v1/models" },
		{ "POST", "/v1/chat/completions?stream=true&a=/health", NULL, "", "chat", NULL,
		  "/v1/chat/completions" },
		{ "GET", "/health?", NULL, "", "health", NULL, "/health" },
		{ "GET", "/x?/health", NULL, "", "not_found", NULL, NULL },
		{ "GET", "/health#frag", NULL, "", "health", NULL, "/health" },
		/* a mount prefix is stripped, with or without a trailing slash */
		{ "GET", "/api/v1/models", NULL, "/api", "models", NULL, "/v1/models" },
		{ "GET", "/api/v1/models", NULL, "/api/", "models", NULL, "/v1/models" },
		{ "POST", "/api/v1/chat/completions?q", NULL, "/api", "chat", NULL,
		  "/v1/chat/completions" },
		{ "GET", "/olp/api/health", NULL, "/olp/api", "health", NULL, "/health" },
		/* a root mount still works with a prefix configured */
		{ "GET", "/v1/models", NULL, "/api", "models", NULL, "/v1/models" },
		/* a prefix matches whole segments only */
		{ "GET", "/api2/v1/models", NULL, "/api", "not_found", NULL, NULL },
		{ "GET", "/apiv1/models", NULL, "/api", "not_found", NULL, NULL },
		{ "GET", "/api", NULL, "/api", "not_found", NULL, NULL },
		{ "GET", "/api/", NULL, "/api", "not_found", NULL, NULL },
		{ "GET", "/api/api/v1/models", NULL, "/api", "not_found", NULL, NULL },
		/* wrong method: 405 with the method the path takes */
		{ "GET", "/v1/chat/completions", NULL, "", "bad_method", "POST", NULL },
		{ "PUT", "/v1/chat/completions", NULL, "", "bad_method", "POST", NULL },
		{ "POST", "/v1/models", NULL, "", "bad_method", "GET", NULL },
		{ "DELETE", "/health", NULL, "", "bad_method", "GET", NULL },
		{ "post", "/v1/chat/completions", NULL, "", "bad_method", "POST", NULL },
		{ "POST", "/api/health?x", NULL, "/api", "bad_method", "GET", NULL },
		{ NULL, "/health", NULL, "", "bad_method", "GET", NULL },
		/* unknown paths */
		{ "GET", "/x", NULL, "", "not_found", NULL, NULL },
		{ "GET", "/", NULL, "", "not_found", NULL, NULL },
		{ "GET", "", NULL, "", "not_found", NULL, NULL },
		{ "GET", "/V1/models", NULL, "", "not_found", NULL, NULL },
		{ "GET", "/v1/models/extra", NULL, "", "not_found", NULL, NULL },
		{ "GET", "/v1/modelsx", NULL, "", "not_found", NULL, NULL },
		{ "GET", "v1/models", NULL, "", "not_found", NULL, NULL },
		{ "POST", "/v1/chat/completions/../../health", NULL, "", "not_found", NULL, NULL },
		/* REQUEST_URI missing: PATH_INFO is used */
		{ "GET", NULL, "/v1/models", "", "models", NULL, "/v1/models" },
		{ "POST", NULL, "/v1/chat/completions", "/api", "chat", NULL, NULL },
		{ "GET", NULL, "/nope", "", "not_found", NULL, NULL },
		{ "GET", NULL, NULL, "", "not_found", NULL, NULL },
		{ "GET", NULL, NULL, "/api", "not_found", NULL, NULL },
		/* GET /health/live, for web servers' and load balancers' checks */
		{ "GET", "/health/live", NULL, "", "health_live", NULL, "/health/live" },
		{ "HEAD", "/health/live", NULL, "", "health_live", NULL, "/health/live" },
		{ "GET", "/health/live/?x", NULL, "", "health_live", NULL, "/health/live" },
		{ "GET", "/api/health/live", NULL, "/api", "health_live", NULL, "/health/live" },
		{ "POST", "/health/live", NULL, "", "bad_method", "GET", NULL },
		{ "GET", "/health/live/x", NULL, "", "not_found", NULL, NULL },
		{ "GET", "/health/liveness", NULL, "", "not_found", NULL, NULL },
		/* a mount the server split off (Apache ScriptAlias /olp, a CGI alias): REQUEST_URI
		 * keeps it, PATH_INFO is the path below it; no prefix configured */
		{ "GET", "/olp/v1/models?x=1", "/v1/models", "", "models", NULL, "/v1/models" },
		{ "POST", "/olp/v1/chat/completions", "/v1/chat/completions", "", "chat", NULL,
		  "/v1/chat/completions" },
		{ "GET", "/olp/health/live", "/health/live", "", "health_live", NULL,
		  "/health/live" },
		{ "GET", "/a/b/health", "/health", NULL, "health", NULL, "/health" },
		{ "POST", "/olp/v1/models", "/v1/models", "", "bad_method", "GET", NULL },
		/* ... a 404 names the path the client asked for */
		{ "GET", "/olp/x", "/x", "", "not_found", NULL, "/olp/x" },
		{ "GET", "/olp/x?y", "/x", "/api", "not_found", NULL, "/olp/x" },
		/* ... and the request's own path wins when it is a route: a root mount's PATH_INFO
		 * (lighttpd without fix-root-scriptname: /v1 + /models) is never used */
		{ "GET", "/v1/models", "/models", "", "models", NULL, "/v1/models" },
		{ "GET", "/health", "/health", "", "health", NULL, "/health" },
		{ "POST", "/v1/completions", "/completions", "", "not_found", NULL,
		  "/v1/completions" },
		{ "GET", "/v1/chat/completions", "/chat/completions", "", "bad_method", "POST",
		  NULL },
		{ "GET", "/olp/v1/models", "", "", "not_found", NULL, "/olp/v1/models" },
	};
	struct buf path = BUF_INIT;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		const struct fcgi_route *row = NULL;
		enum fcgi_route_result r =
			fcgi_route_match(routes, ARRAY_SIZE(routes), cases[i].method, cases[i].uri,
					 cases[i].path_info, cases[i].prefix, &path, &row);
		const char *got = r == FCGI_ROUTE_FOUND	      ? (row ? row->name : "(null)")
				  : r == FCGI_ROUTE_NOT_FOUND ? "not_found"
							      : "bad_method";

		CU_ASSERT_STRING_EQUAL(got, cases[i].route);
		if (strcmp(got, cases[i].route))
			fprintf(stderr, "route case %zu (%s %s, prefix \"%s\"): %s, want %s\n", i,
				cases[i].method ? cases[i].method : "(null)",
				cases[i].uri ? cases[i].uri : "(null)",
				cases[i].prefix ? cases[i].prefix : "(null)", got, cases[i].route);
		if (r == FCGI_ROUTE_BAD_METHOD) {
			CU_ASSERT_PTR_NOT_NULL(row);
			CU_ASSERT_PTR_NOT_NULL(cases[i].allow);
			if (row && cases[i].allow)
				CU_ASSERT_STRING_EQUAL(row->method, cases[i].allow);
		}
		if (r == FCGI_ROUTE_NOT_FOUND)
			CU_ASSERT_PTR_NULL(row);
		if (cases[i].path)
			CU_ASSERT_STRING_EQUAL(path.data, cases[i].path);
		CU_ASSERT_EQUAL(path.data[path.len], '\0');
	}
	buf_release(&path);
}

/* ---- fcgi_chat_parse ----------------------------------------------------------------------- */

#define MSG "[{\"role\":\"user\",\"content\":\"hi\"}]"
#define BODY(extra) "{\"model\":\"m\",\"messages\":" MSG extra "}"
#define TOOL(name) "{\"type\":\"function\",\"function\":{\"name\":\"" name "\"}}"
#define IMG(url)                                                                                  \
	"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"," \
	"\"image_url\":{\"url\":" url "}}]}]}"

static void test_parse_failures(void)
{
	static const struct {
		const char *body;
		const char *param;
	} cases[] = {
		/* model */
		{ "{\"messages\":" MSG "}", "model" },
		{ "{\"model\":\"\",\"messages\":" MSG "}", "model" },
		{ "{\"model\":5,\"messages\":" MSG "}", "model" },
		{ "{\"model\":null,\"messages\":" MSG "}", "model" },
		{ "{\"model\":[\"m\"],\"messages\":" MSG "}", "model" },
		{ "{\"model\":true,\"messages\":" MSG "}", "model" },
		{ "{\"model\":\"a\\u0000b\",\"messages\":" MSG "}", "model" },
		/* messages */
		{ "{\"model\":\"m\"}", "messages" },
		{ "{\"model\":\"m\",\"messages\":[]}", "messages" },
		{ "{\"model\":\"m\",\"messages\":null}", "messages" },
		{ "{\"model\":\"m\",\"messages\":{}}", "messages" },
		{ "{\"model\":\"m\",\"messages\":\"hi\"}", "messages" },
		{ "{\"model\":\"m\",\"messages\":{\"role\":\"user\",\"content\":\"hi\"}}",
		  "messages" },
		{ "{\"model\":\"m\",\"messages\":[1]}", "messages[0]" },
		{ "{\"model\":\"m\",\"messages\":[\"hi\"]}", "messages[0]" },
		{ "{\"model\":\"m\",\"messages\":[null]}", "messages[0]" },
		{ "{\"model\":\"m\",\"messages\":[[]]}", "messages[0]" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},7]}",
		  "messages[1]" },
		/* role */
		{ "{\"model\":\"m\",\"messages\":[{\"content\":\"hi\"}]}", "messages[0].role" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"bot\",\"content\":\"hi\"}]}",
		  "messages[0].role" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"User\",\"content\":\"hi\"}]}",
		  "messages[0].role" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"\",\"content\":\"hi\"}]}",
		  "messages[0].role" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":1,\"content\":\"hi\"}]}",
		  "messages[0].role" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":null,\"content\":\"hi\"}]}",
		  "messages[0].role" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
		  "{\"role\":\"admin\",\"content\":\"b\"}]}",
		  "messages[1].role" },
		/* "user\0x" is not "user" (JSON_ALLOW_NUL lets NUL into strings) */
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"user\\u0000x\",\"content\":\"hi\"}]}",
		  "messages[0].role" },
		/* content */
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}",
		  "messages[0].content" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":true}]}",
		  "messages[0].content" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":{\"text\":\"hi\"}}"
		  "]}",
		  "messages[0].content" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
		  "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image_url\","
		  "\"image_url\":{\"url\":\"http://x\"}}]}]}",
		  "messages[0].content[1].image_url.url" },
		/* images: data: URLs of png, jpeg, gif, webp only, checked; nothing fetched */
		{ IMG("\"https://example.com/cat.png\""), "messages[0].content[0].image_url.url" },
		{ IMG("\"HTTPS://example.com/cat.png\""), "messages[0].content[0].image_url.url" },
		{ IMG("\"data:image/bmp;base64,Qk0=\""), "messages[0].content[0].image_url.url" },
		{ IMG("\"data:image/svg+xml;base64,PHN2Zz4=\""),
		  "messages[0].content[0].image_url.url" },
		{ IMG("\"data:image/png,iVBORw0KGgo=\""), "messages[0].content[0].image_url.url" },
		{ IMG("\"data:image/png;base64,iVBORw0KGgo\""),
		  "messages[0].content[0].image_url.url" },
		{ IMG("\"data:image/png;base64,iVBO Rw0KGgo=\""),
		  "messages[0].content[0].image_url.url" },
		{ IMG("\"data:image/png;base64,R0lGODlhAQABAA==\""), /* a GIF named png */
		  "messages[0].content[0].image_url.url" },
		{ IMG("\"data:text/plain;base64,aGk=\""), "messages[0].content[0].image_url.url" },
		{ IMG("\"file:///etc/passwd\""), "messages[0].content[0].image_url.url" },
		{ IMG("5"), "messages[0].content[0].image_url.url" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
		  "[{\"type\":\"image_url\",\"image_url\":\"data:image/gif;base64,"
		  "R0lGODlhAQABAA==\"}]}]}",
		  "messages[0].content[0].image_url.url" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":"
		  "[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/gif;base64,"
		  "R0lGODlhAQABAA==\"}}]}]}",
		  "messages[0].content[0]" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
		  "\"text\"}]}]}",
		  "messages[0].content" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
		  "[{\"type\":\"text\",\"text\":5}]}]}",
		  "messages[0].content" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]"
		  "}]}",
		  "messages[0].content" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[\"a\"]}]}",
		  "messages[0].content" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[null]}]}",
		  "messages[0].content" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
		  "[{\"type\":\"text\\u0000image\",\"text\":\"a\"}]}]}",
		  "messages[0].content" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
		  "{\"role\":\"assistant\",\"content\":1}]}",
		  "messages[1].content" },
		/* max_tokens, max_completion_tokens */
		{ BODY(",\"max_tokens\":0"), "max_tokens" },
		{ BODY(",\"max_tokens\":-1"), "max_tokens" },
		{ BODY(",\"max_tokens\":1.5"), "max_tokens" },
		{ BODY(",\"max_tokens\":\"3\""), "max_tokens" },
		{ BODY(",\"max_tokens\":true"), "max_tokens" },
		{ BODY(",\"max_tokens\":[3]"), "max_tokens" },
		{ BODY(",\"max_tokens\":4e29"), "max_tokens" },
		{ BODY(",\"max_tokens\":9.3e18"), "max_tokens" },
		{ BODY(",\"max_tokens\":-4e29"), "max_tokens" },
		{ BODY(",\"max_completion_tokens\":0"), "max_completion_tokens" },
		{ BODY(",\"max_completion_tokens\":-1"), "max_completion_tokens" },
		{ BODY(",\"max_completion_tokens\":1.5"), "max_completion_tokens" },
		{ BODY(",\"max_completion_tokens\":\"3\""), "max_completion_tokens" },
		/* temperature [0,2], top_p [0,1] */
		{ BODY(",\"temperature\":-0.1"), "temperature" },
		{ BODY(",\"temperature\":2.1"), "temperature" },
		{ BODY(",\"temperature\":2.0000001"), "temperature" },
		{ BODY(",\"temperature\":3"), "temperature" },
		{ BODY(",\"temperature\":\"1\""), "temperature" },
		{ BODY(",\"temperature\":true"), "temperature" },
		{ BODY(",\"top_p\":1.1"), "top_p" },
		{ BODY(",\"top_p\":-0.5"), "top_p" },
		{ BODY(",\"top_p\":2"), "top_p" },
		{ BODY(",\"top_p\":\"0.5\""), "top_p" },
		/* stop */
		{ BODY(",\"stop\":3"), "stop" },
		{ BODY(",\"stop\":[1]"), "stop" },
		{ BODY(",\"stop\":[\"a\",null]"), "stop" },
		{ BODY(",\"stop\":{}"), "stop" },
		{ BODY(",\"stop\":true"), "stop" },
		{ BODY(",\"stop\":\"\""), "stop" },
		{ BODY(",\"stop\":[\"a\",\"\"]"), "stop" },
		{ BODY(",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]"), "stop" },
		{ BODY(",\"stop\":\"a\\u0000b\""), "stop" },
		/* no silent drops: what OLP cannot honour is refused by name */
		{ BODY(",\"n\":2"), "n" },
		{ BODY(",\"n\":0"), "n" },
		{ BODY(",\"n\":\"1\""), "n" },
		{ BODY(",\"logprobs\":true"), "logprobs" },
		{ BODY(",\"top_logprobs\":2"), "top_logprobs" },
		{ BODY(",\"logit_bias\":{\"50256\":-100}"), "logit_bias" },
		{ BODY(",\"modalities\":[\"text\",\"audio\"]"), "modalities" },
		{ BODY(",\"modalities\":\"text\""), "modalities" },
		{ BODY(",\"audio\":{\"voice\":\"alloy\",\"format\":\"mp3\"}"), "audio" },
		{ BODY(",\"prediction\":{\"type\":\"content\",\"content\":\"x\"}"), "prediction" },
		{ BODY(",\"web_search_options\":{\"search_context_size\":\"low\"}"),
		  "web_search_options" },
		{ BODY(",\"functions\":[{\"name\":\"f\"}]"), "functions" },
		/* tools, tool_choice, and the calls of earlier turns */
		{ BODY(",\"tools\":{}"), "tools" },
		{ BODY(",\"tools\":[{\"type\":\"retrieval\"}]"), "tools[0]" },
		{ BODY(",\"tools\":[{\"type\":\"function\"}]"), "tools[0]" },
		{ BODY(",\"tools\":[{\"type\":\"function\",\"function\":{}}]"),
		  "tools[0].function.name" },
		{ BODY(",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]"),
		  "tools[0].function.name" },
		{ BODY(",\"tools\":[" TOOL("f") "," TOOL("f") "]"), "tools[1].function.name" },
		{ BODY(",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
		       "\"parameters\":[]}}]"),
		  "tools[0].function.parameters" },
		{ BODY(",\"tool_choice\":\"required\""), "tool_choice" },
		{ BODY(",\"tools\":[" TOOL("f") "],\"tool_choice\":\"always\""), "tool_choice" },
		{ BODY(",\"tools\":[" TOOL("f") "],\"tool_choice\":{\"type\":\"function\","
						"\"function\":{\"name\":\"g\"}}"),
		  "tool_choice.function.name" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":"
		  "[{\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":{}}}]}]}",
		  "messages[0].tool_calls" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":{}}]}",
		  "messages[0].tool_calls" },
		{ BODY(",\"function_call\":\"auto\""), "function_call" },
		{ BODY(",\"response_format\":\"json\""), "response_format" },
		{ BODY(",\"response_format\":{}"), "response_format" },
		{ BODY(",\"frobnicate\":true"), "frobnicate" },
		{ BODY(",\"Temperature\":1"), "Temperature" },
		/* stream, stream_options */
		{ BODY(",\"stream\":\"yes\""), "stream" },
		{ BODY(",\"stream\":1"), "stream" },
		{ BODY(",\"stream\":\"true\""), "stream" },
		{ BODY(",\"stream\":{}"), "stream" },
		{ BODY(",\"stream\":true,\"stream_options\":\"x\""), "stream_options" },
		{ BODY(",\"stream\":true,\"stream_options\":[]"), "stream_options" },
		{ BODY(",\"stream\":true,\"stream_options\":true"), "stream_options" },
		{ BODY(",\"stream\":true,\"stream_options\":{\"include_usage\":\"true\"}"),
		  "stream_options.include_usage" },
		{ BODY(",\"stream\":true,\"stream_options\":{\"include_usage\":1}"),
		  "stream_options.include_usage" },
		/* not JSON, or not an object: no param */
		{ "", "" },
		{ "{", "" },
		{ "not json", "" },
		{ "{\"model\":\"m\",}", "" },
		{ BODY("") " trailing", "" },
		{ BODY("") BODY(""), "" },
		{ "[]", "" },
		{ "[" BODY("") "]", "" },
		{ "null", "" },
		{ "\"str\"", "" },
		{ "42", "" },
		{ "{\"model\":\"a\",\"model\":\"b\",\"messages\":" MSG "}", "" },
		{ "{\"model\":\"m\",\"messages\":" MSG ",\"max_tokens\":99999999999999999999}",
		  "" },
		{ "{\"model\":\"m\\ud800\",\"messages\":" MSG "}", "" },
		{ "{\"model\":\"\xff\",\"messages\":" MSG "}", "" },
		{ "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\"}]}", "" },
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		struct fcgi_chat_request req;
		struct fcgi_error err;
		int ret;

		memset(&err, 0, sizeof(err));
		memset(&req, 0x5a, sizeof(req));
		ret = fcgi_chat_parse(cases[i].body, strlen(cases[i].body), &req, &err);
		CU_ASSERT_EQUAL(ret, -1);
		if (ret != -1) {
			fprintf(stderr, "accepted: %s\n", cases[i].body);
			fcgi_chat_release(&req);
			continue;
		}
		CU_ASSERT_EQUAL(err.status, 400);
		CU_ASSERT_PTR_NOT_NULL_FATAL(err.type);
		CU_ASSERT_STRING_EQUAL(err.type, "invalid_request_error");
		CU_ASSERT_STRING_EQUAL(err.param, cases[i].param);
		if (strcmp(err.param, cases[i].param))
			fprintf(stderr, "param \"%s\", want \"%s\" for %s\n", err.param,
				cases[i].param, cases[i].body);
		CU_ASSERT(err.message[0] != '\0');
		/* A named field is named in the message too. */
		if (cases[i].param[0])
			CU_ASSERT_PTR_NOT_NULL(strstr(err.message, cases[i].param));
		/* Nothing is left owned after a failure. */
		CU_ASSERT_PTR_NULL(req.root);
		fcgi_chat_release(&req); /* and releasing again is harmless */
	}
}

static void test_parse_valid(void)
{
	static const char *const bodies[] = {
		BODY(""),
		"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":null}]}",
		"{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\"}]}",
		"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\"}]}",
		"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[]}]}",
		"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
		"[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"\"}]}]}",
		"{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
		"{\"role\":\"developer\",\"content\":\"d\"},{\"role\":\"user\",\"content\":\"u\"},"
		"{\"role\":\"assistant\",\"content\":\"a\"},{\"role\":\"tool\",\"content\":\"t\","
		"\"tool_call_id\":\"c1\"},{\"role\":\"function\",\"name\":\"f\",\"content\":\"f\"}]"
		"}",
		BODY(",\"stop\":\"x\""),
		BODY(",\"stop\":[\"a\",\"b\"]"),
		BODY(",\"stop\":[]"),
		BODY(",\"stop\":null"),
		BODY(",\"temperature\":0"),
		BODY(",\"temperature\":2"),
		BODY(",\"temperature\":1.3"),
		BODY(",\"temperature\":null"),
		BODY(",\"top_p\":0"),
		BODY(",\"top_p\":1"),
		BODY(",\"top_p\":0.95"),
		BODY(",\"max_tokens\":null"),
		BODY(",\"stream\":false"),
		BODY(",\"stream\":null"),
		BODY(",\"stream_options\":null"),
		BODY(",\"stream_options\":{}"),
		BODY(",\"n\":1,\"tools\":[],\"user\":\"x\",\"seed\":4,\"metadata\":{\"a\":\"b\"}"),
		/* ignored on purpose, or asked with the default OLP gives anyway */
		BODY(",\"frequency_penalty\":1,\"presence_penalty\":-1,\"store\":false,"
		     "\"service_tier\":\"auto\",\"reasoning_effort\":\"low\","
		     "\"parallel_tool_calls\":true,\"prompt_cache_key\":\"k\","
		     "\"safety_identifier\":\"s\",\"verbosity\":\"low\""),
		BODY(",\"n\":null,\"logprobs\":false,\"logit_bias\":{},\"modalities\":[\"text\"],"
		     "\"top_logprobs\":null,\"audio\":null,\"tool_choice\":\"none\","
		     "\"response_format\":{\"type\":\"text\"}"),
		BODY(",\"tool_choice\":\"auto\",\"functions\":[]"),
		"  \n{\"messages\":" MSG ",\"model\":\"m\"}\n  ",
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(bodies); i++) {
		struct fcgi_chat_request req;
		struct fcgi_error err = { 0 };
		int ret = fcgi_chat_parse(bodies[i], strlen(bodies[i]), &req, &err);

		CU_ASSERT_EQUAL(ret, 0);
		if (ret) {
			fprintf(stderr, "refused (%s: %s): %s\n", err.param, err.message,
				bodies[i]);
			continue;
		}
		CU_ASSERT_PTR_NOT_NULL(req.root);
		CU_ASSERT_STRING_EQUAL(req.model, "m");
		CU_ASSERT(json_is_array(req.messages) && json_array_size(req.messages) >= 1);
		CU_ASSERT_FALSE(req.stream);
		CU_ASSERT_FALSE(req.include_usage);
		CU_ASSERT_EQUAL(req.max_tokens, 0);
		fcgi_chat_release(&req);
		CU_ASSERT_PTR_NULL(req.root);
	}
}

static void test_parse_fields(void)
{
	static const char body[] =
		"{\"model\":\"claude-sonnet\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"}"
		","
		"{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}],"
		"\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_tokens\":256}";
	struct fcgi_chat_request req;
	struct fcgi_error err = { 0 };

	CU_ASSERT_EQUAL_FATAL(fcgi_chat_parse(body, strlen(body), &req, &err), 0);
	CU_ASSERT_STRING_EQUAL(req.model, "claude-sonnet");
	CU_ASSERT_EQUAL(json_array_size(req.messages), 2);
	CU_ASSERT_STRING_EQUAL(
		json_string_value(json_object_get(json_array_get(req.messages, 0), "role")),
		"system");
	CU_ASSERT_TRUE(req.stream);
	CU_ASSERT_TRUE(req.include_usage);
	CU_ASSERT_EQUAL(req.max_tokens, 256);
	fcgi_chat_release(&req);

	/* include_usage false / stream without options */
	CU_ASSERT_EQUAL_FATAL(fcgi_chat_parse(BODY(",\"stream\":true,\"stream_options\":"
						   "{\"include_usage\":false}"),
					      strlen(BODY(",\"stream\":true,\"stream_options\":"
							  "{\"include_usage\":false}")),
					      &req, &err),
			      0);
	CU_ASSERT_TRUE(req.stream);
	CU_ASSERT_FALSE(req.include_usage);
	fcgi_chat_release(&req);

	CU_ASSERT_EQUAL_FATAL(fcgi_chat_parse(BODY(",\"max_completion_tokens\":32"),
					      strlen(BODY(",\"max_completion_tokens\":32")), &req,
					      &err),
			      0);
	CU_ASSERT_EQUAL(req.max_tokens, 32);
	fcgi_chat_release(&req);

	CU_ASSERT_EQUAL_FATAL(fcgi_chat_parse(BODY(",\"max_tokens\":9223372036854775807"),
					      strlen(BODY(",\"max_tokens\":9223372036854775807")),
					      &req, &err),
			      0);
	CU_ASSERT_EQUAL(req.max_tokens, INT64_MAX);
	fcgi_chat_release(&req);

	/* JSON has one number type: 256.0 and 2.56e2 are the integer 256. */
	CU_ASSERT_EQUAL_FATAL(fcgi_chat_parse(BODY(",\"max_tokens\":2.56e2"),
					      strlen(BODY(",\"max_tokens\":2.56e2")), &req, &err),
			      0);
	CU_ASSERT_EQUAL(req.max_tokens, 256);
	fcgi_chat_release(&req);
}

/* ---- response headers ------------------------------------------------------------------ */

static void test_headers(void)
{
	static const char *const bad_values[] = {
		"a\r\nSet-Cookie: sid=1",
		"a\nb",
		"a\rb",
		"\r\n",
		"a\x01",
		"a\x1f",
		"a\x7f",
		"caf\xc3\xa9",
		"\x80",
	};
	static const char *const bad_names[] = {
		"", "X Y", "X:Y", "X\r\nY", "X\n", "X(Y)", "X\"", "X/Y", "\xc3\xa9",
	};
	struct buf h = BUF_INIT;
	size_t i;

	CU_ASSERT_EQUAL(fcgi_header_add(&h, "X-OLP-Model-Used", "gpt-4o:ft/x@1"), 0);
	CU_ASSERT_EQUAL(fcgi_header_add(&h, "Status", "200 OK"), 0);
	CU_ASSERT_EQUAL(fcgi_header_add(&h, "X-Tab", "a\tb ~!"), 0);
	CU_ASSERT_EQUAL(fcgi_header_add(&h, "X-Empty", ""), 0);
	CU_ASSERT_EQUAL(fcgi_header_addf(&h, "X-OLP-Latency-Ms", "%d", 42), 0);
	CU_ASSERT_STRING_EQUAL(h.data, "X-OLP-Model-Used: gpt-4o:ft/x@1\r\nStatus: 200 OK\r\n"
				       "X-Tab: a\tb ~!\r\nX-Empty: \r\nX-OLP-Latency-Ms: 42\r\n");

	/* A refused header leaves the buffer as it was: nothing of it is sent. */
	for (i = 0; i < ARRAY_SIZE(bad_values); i++) {
		buf_reset(&h);
		buf_adds(&h, "A: b\r\n");
		CU_ASSERT_EQUAL(fcgi_header_add(&h, "X-OLP-Model-Used", bad_values[i]), -EINVAL);
		CU_ASSERT_EQUAL(fcgi_header_addf(&h, "X-OLP-Model-Used", "m-%s", bad_values[i]),
				-EINVAL);
		CU_ASSERT_STRING_EQUAL(h.data, "A: b\r\n");
	}
	for (i = 0; i < ARRAY_SIZE(bad_names); i++) {
		buf_reset(&h);
		CU_ASSERT_EQUAL(fcgi_header_add(&h, bad_names[i], "v"), -EINVAL);
		CU_ASSERT_EQUAL(h.len, 0);
	}
	/* A NUL inside a formatted value would hide what follows it from the check. */
	CU_ASSERT_EQUAL(fcgi_header_addf(&h, "X", "a%cb", 0), -EINVAL);
	CU_ASSERT_EQUAL(fcgi_header_add(&h, NULL, "v"), -EINVAL);
	CU_ASSERT_EQUAL(fcgi_header_add(&h, "X", NULL), -EINVAL);
	CU_ASSERT_EQUAL(h.len, 0);
	buf_release(&h);
}

/* The body is len bytes, not a C string: bytes after it are never read, and a NUL inside a
 * string value is allowed where the field is text. */
static void test_parse_len(void)
{
	static const char body[] = BODY("") "garbage that is not JSON";
	struct fcgi_chat_request req;
	struct fcgi_error err = { 0 };
	char *copy;
	size_t n = strlen(BODY(""));

	CU_ASSERT_EQUAL(fcgi_chat_parse(body, n, &req, &err), 0);
	fcgi_chat_release(&req);
	CU_ASSERT_EQUAL(fcgi_chat_parse(body, n - 1, &req, &err), -1);
	CU_ASSERT_EQUAL(err.status, 400);

	/* An exact-size heap copy, no terminating NUL (ASan sees any over-read). */
	copy = malloc(n);
	CU_ASSERT_PTR_NOT_NULL_FATAL(copy);
	memcpy(copy, BODY(""), n);
	CU_ASSERT_EQUAL(fcgi_chat_parse(copy, n, &req, &err), 0);
	fcgi_chat_release(&req);
	free(copy);

	CU_ASSERT_EQUAL(fcgi_chat_parse(NULL, 0, &req, &err), -1);
	CU_ASSERT_EQUAL(err.status, 400);
	CU_ASSERT_STRING_EQUAL(err.type, "invalid_request_error");
}

/* The four image types pass, counted, the first one's param kept; above the size cap, 413. */
static void test_images(void)
{
	static const char *const urls[] = {
		"\"data:image/"
		"png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
		"+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==\"",
		"\"data:image/jpeg;base64,/9j/4AAQSkZJRg==\"",
		"\"data:image/gif;base64,R0lGODlhAQABAA==\"",
		"\"data:image/webp;base64,UklGRiQAAABXRUJQVlA4IA==\"",
	};
	struct fcgi_chat_request req;
	struct fcgi_error err = { 0 };
	struct buf body = BUF_INIT;
	size_t i, n;

	for (i = 0; i < ARRAY_SIZE(urls); i++) {
		buf_reset(&body);
		buf_addf(&body,
			 "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":["
			 "{\"type\":\"text\",\"text\":\"what is it?\"},{\"type\":\"image_url\","
			 "\"image_url\":{\"url\":%s,\"detail\":\"low\"}},{\"type\":\"image_url\","
			 "\"image_url\":{\"url\":%s}}]}]}",
			 urls[i], urls[i]);
		CU_ASSERT_EQUAL(fcgi_chat_parse(body.data, body.len, &req, &err), 0);
		if (!req.root) {
			fprintf(stderr, "refused (%s): %s\n", err.message, urls[i]);
			continue;
		}
		CU_ASSERT_EQUAL(req.nimages, 2);
		CU_ASSERT_STRING_EQUAL(req.image_param, "messages[0].content[1].image_url.url");
		fcgi_chat_release(&req);
	}

	/* One byte above the cap (decoded), as a PNG: 413 naming the part. */
	n = ((size_t)FCGI_MAX_IMAGE_BYTES + 3) / 3 * 4;
	buf_reset(&body);
	buf_adds(&body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":["
			"{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,"
			"iVBORw0KGgo");
	for (i = 11; i < n; i++)
		buf_addch(&body, 'A');
	buf_adds(&body, "\"}}]}]}");
	CU_ASSERT_EQUAL(fcgi_chat_parse(body.data, body.len, &req, &err), -1);
	CU_ASSERT_EQUAL(err.status, 413);
	CU_ASSERT_STRING_EQUAL(err.param, "messages[0].content[0].image_url.url");
	buf_release(&body);
}

/* response_format: what counts as JSON, and as a JSON object. */
static void test_format_satisfied(void)
{
	static const struct {
		const char *text;
		bool object, any;
	} cases[] = {
		{ "{\"a\":1}", true, true },
		{ "  \n{\"a\": [1, 2]}\n ", true, true },
		{ "[1,2]", false, true },
		{ "42", false, true },
		{ "\"s\"", false, true },
		{ "", false, false },
		{ "{\"a\":1} trailing", false, false },
		{ "```json\n{\"a\":1}\n```", false, false },
		{ "Sure: {\"a\":1}", false, false },
		{ "{\"a\":", false, false },
	};

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		size_t n = strlen(cases[i].text);

		CU_ASSERT_EQUAL(fcgi_format_satisfied(PROV_FORMAT_JSON_OBJECT, cases[i].text, n),
				cases[i].object);
		CU_ASSERT_EQUAL(fcgi_format_satisfied(PROV_FORMAT_JSON_SCHEMA, cases[i].text, n),
				cases[i].any);
		CU_ASSERT_TRUE(fcgi_format_satisfied(PROV_FORMAT_TEXT, cases[i].text, n));
	}
}

/* response_format parsed into the request; the warning goes into the whole object and the
 * final chunk only. */
static void test_format_fields(void)
{
	static const char js[] = BODY(",\"response_format\":{\"type\":\"json_schema\","
				      "\"json_schema\":{\"name\":\"r\",\"schema\":{}}}");
	static const char jo[] = BODY(",\"response_format\":{\"type\":\"json_object\"}");
	struct fcgi_chat_request req;
	struct fcgi_error err = { 0 };
	struct fcgi_completion m;
	struct buf out = BUF_INIT;

	CU_ASSERT_EQUAL_FATAL(fcgi_chat_parse(js, strlen(js), &req, &err), 0);
	CU_ASSERT_EQUAL(req.format, PROV_FORMAT_JSON_SCHEMA);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(req.json_schema, "name")), "r");
	fcgi_chat_release(&req);
	CU_ASSERT_EQUAL_FATAL(fcgi_chat_parse(jo, strlen(jo), &req, &err), 0);
	CU_ASSERT_EQUAL(req.format, PROV_FORMAT_JSON_OBJECT);
	CU_ASSERT_PTR_NULL(req.json_schema);
	fcgi_chat_release(&req);
	CU_ASSERT_EQUAL_FATAL(fcgi_chat_parse(BODY(""), strlen(BODY("")), &req, &err), 0);
	CU_ASSERT_EQUAL(req.format, PROV_FORMAT_TEXT);
	fcgi_chat_release(&req);

	fcgi_completion_init(&m, "m");
	CU_ASSERT_PTR_NULL(m.warning);
	m.warning = "not \"JSON\"";
	fcgi_completion_json(&out, &m, "x", 1, "stop", NULL);
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, ",\"olp_warning\":\"not \\\"JSON\\\"\"}"));
	buf_reset(&out);
	fcgi_sse_chunk(&out, &m, "assistant", "x", 1, NULL);
	CU_ASSERT_PTR_NULL(strstr(out.data, "olp_warning"));
	buf_reset(&out);
	fcgi_sse_chunk(&out, &m, NULL, NULL, 0, "stop");
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "\"olp_warning\""));
	buf_release(&out);
}

/* ---- encoders ------------------------------------------------------------------------------ */

static json_t *load(const char *s, size_t len)
{
	json_error_t jerr;
	json_t *v = json_loadb(s, len, JSON_ALLOW_NUL, &jerr);

	if (!v)
		fprintf(stderr, "not JSON (%s): %.*s\n", jerr.text, (int)len, s);
	return v;
}

static const char *sget(const json_t *o, const char *path)
{
	return json_string_value(json_object_get(o, path));
}

static void test_error_json(void)
{
	struct fcgi_error e;
	struct buf out = BUF_INIT;
	json_t *v, *eo;
	char longmsg[700];
	size_t i;

	fcgi_error_set(&e, 404, "not_found", NULL, NULL, "Route %s %s not found", "GET", "/x");
	CU_ASSERT_EQUAL(e.status, 404);
	fcgi_error_json(&e, &out);
	v = load(out.data, out.len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(v);
	CU_ASSERT_EQUAL(json_object_size(v), 1);
	eo = json_object_get(v, "error");
	CU_ASSERT_FATAL(json_is_object(eo));
	CU_ASSERT_STRING_EQUAL(sget(eo, "message"), "Route GET /x not found");
	CU_ASSERT_STRING_EQUAL(sget(eo, "type"), "not_found");
	CU_ASSERT(json_is_null(json_object_get(eo, "param")));
	CU_ASSERT(json_is_null(json_object_get(eo, "code")));
	json_decref(v);

	buf_reset(&out);
	fcgi_error_set(&e, 404, "invalid_request_error", "model_not_found", "model",
		       "The model \"%s\" does not exist\n\tor you lack access \xff", "x\\y");
	fcgi_error_json(&e, &out);
	v = load(out.data, out.len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(v);
	eo = json_object_get(v, "error");
	CU_ASSERT_STRING_EQUAL(
		sget(eo, "message"),
		"The model \"x\\y\" does not exist\n\tor you lack access \xef\xbf\xbd");
	CU_ASSERT_STRING_EQUAL(sget(eo, "type"), "invalid_request_error");
	CU_ASSERT_STRING_EQUAL(sget(eo, "param"), "model");
	CU_ASSERT_STRING_EQUAL(sget(eo, "code"), "model_not_found");
	json_decref(v);

	/* A message longer than the struct holds is cut, possibly mid-character: the JSON
	 * stays valid all the same. */
	for (i = 0; i + 2 < sizeof(longmsg); i += 2)
		memcpy(longmsg + i, "\xc3\xa9", 2);
	longmsg[i] = '\0';
	buf_reset(&out);
	fcgi_error_set(&e, 400, "invalid_request_error", NULL, "messages[0].content", "%s",
		       longmsg);
	fcgi_error_json(&e, &out);
	v = load(out.data, out.len);
	CU_ASSERT_PTR_NOT_NULL(v);
	CU_ASSERT(strlen(e.message) < sizeof(e.message));
	json_decref(v);

	/* What fcgi_chat_parse fills encodes the same way. */
	{
		struct fcgi_chat_request req;

		buf_reset(&out);
		CU_ASSERT_EQUAL(fcgi_chat_parse("{\"model\":1}", 11, &req, &e), -1);
		fcgi_error_json(&e, &out);
		v = load(out.data, out.len);
		CU_ASSERT_PTR_NOT_NULL_FATAL(v);
		eo = json_object_get(v, "error");
		CU_ASSERT_STRING_EQUAL(sget(eo, "type"), "invalid_request_error");
		CU_ASSERT_STRING_EQUAL(sget(eo, "param"), "model");
		CU_ASSERT(json_is_null(json_object_get(eo, "code")));
		json_decref(v);

		buf_reset(&out);
		CU_ASSERT_EQUAL(fcgi_chat_parse("{", 1, &req, &e), -1);
		fcgi_error_json(&e, &out);
		v = load(out.data, out.len);
		CU_ASSERT_PTR_NOT_NULL_FATAL(v);
		CU_ASSERT(json_is_null(json_object_get(json_object_get(v, "error"), "param")));
		json_decref(v);
	}
	buf_release(&out);
}

static void test_status_text(void)
{
	static const int codes[] = {
		200, 400, 401, 403, 404, 405, 413, 415, 429, 500, 502, 503, 504
	};
	char want[8];
	size_t i;

	for (i = 0; i < ARRAY_SIZE(codes); i++) {
		snprintf(want, sizeof(want), "%d ", codes[i]);
		CU_ASSERT_EQUAL(strncmp(fcgi_status_text(codes[i]), want, 4), 0);
		CU_ASSERT(strlen(fcgi_status_text(codes[i])) > 4);
	}
	CU_ASSERT_STRING_EQUAL(fcgi_status_text(405), "405 Method Not Allowed");
}

static void test_meta(void)
{
	struct fcgi_completion a, b;
	time_t now = time(NULL);
	size_t i;

	fcgi_completion_init(&a, "model-a");
	fcgi_completion_init(&b, "model-a");
	CU_ASSERT_EQUAL(strncmp(a.id, "chatcmpl-", 9), 0);
	CU_ASSERT(strlen(a.id) > 9 + 8);
	CU_ASSERT(strlen(a.id) < sizeof(a.id));
	for (i = 9; a.id[i]; i++)
		CU_ASSERT(strchr("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
				 a.id[i]) != NULL);
	CU_ASSERT_STRING_NOT_EQUAL(a.id, b.id);
	CU_ASSERT(a.created >= now - 5 && a.created <= now + 5);
	CU_ASSERT_STRING_EQUAL(a.model, "model-a");
}

/* Split "data: X\n\n" events; each X goes to events[]. Returns the count, or -1 when the
 * framing is wrong (an event without its blank line, or a stray newline inside X). */
static int split_sse(const struct buf *b, char **events, int max)
{
	const char *p = b->data, *end = b->data + b->len;
	int n = 0;

	while (p < end) {
		const char *nl;

		if ((size_t)(end - p) < 6 || memcmp(p, "data: ", 6))
			return -1;
		p += 6;
		nl = memchr(p, '\n', (size_t)(end - p));
		if (!nl || nl + 1 >= end || nl[1] != '\n')
			return -1;
		if (n < max)
			events[n] = strndup(p, (size_t)(nl - p));
		n++;
		p = nl + 2;
	}
	return n;
}

static void check_chunk_head(const json_t *c, const struct fcgi_completion *m)
{
	CU_ASSERT_STRING_EQUAL(sget(c, "id"), m->id);
	CU_ASSERT_STRING_EQUAL(sget(c, "object"), "chat.completion.chunk");
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(c, "created")), m->created);
	CU_ASSERT(json_is_integer(json_object_get(c, "created")));
	CU_ASSERT_STRING_EQUAL(sget(c, "model"), m->model);
}

static void test_sse_chunks(void)
{
	struct fcgi_completion m;
	struct buf out = BUF_INIT;
	char *ev[8] = { 0 };
	json_t *c, *ch, *d;
	int n, i;
	static const char text[] = "line one\nline \"two\"\r\n\t\\ \xe2\x82\xac\x01";

	fcgi_completion_init(&m, "echo \"model\"");
	fcgi_sse_chunk(&out, &m, "assistant", "", 0, NULL); /* role only, empty content */
	fcgi_sse_chunk(&out, &m, NULL, text, sizeof(text) - 1, NULL);
	fcgi_sse_chunk(&out, &m, NULL, "abcdef", 3, NULL); /* len, not strlen */
	fcgi_sse_chunk(&out, &m, NULL, NULL, 0, "stop");   /* final chunk */
	fcgi_sse_chunk(&out, &m, "assistant", "x", 1, "length");
	fcgi_sse_done(&out);
	n = split_sse(&out, ev, 8);
	CU_ASSERT_EQUAL_FATAL(n, 6);
	CU_ASSERT_STRING_EQUAL(ev[5], "[DONE]");
	CU_ASSERT_EQUAL(out.len >= 14 && !memcmp(out.data + out.len - 14, "data: [DONE]\n\n", 14),
			1);

	for (i = 0; i < 5; i++) {
		c = load(ev[i], strlen(ev[i]));
		CU_ASSERT_PTR_NOT_NULL_FATAL(c);
		check_chunk_head(c, &m);
		ch = json_object_get(c, "choices");
		CU_ASSERT_FATAL(json_is_array(ch) && json_array_size(ch) == 1);
		ch = json_array_get(ch, 0);
		CU_ASSERT_EQUAL(json_integer_value(json_object_get(ch, "index")), 0);
		CU_ASSERT(json_is_integer(json_object_get(ch, "index")));
		d = json_object_get(ch, "delta");
		CU_ASSERT_FATAL(json_is_object(d));
		CU_ASSERT_PTR_NOT_NULL(json_object_get(ch, "finish_reason"));
		switch (i) {
		case 0:
			CU_ASSERT_STRING_EQUAL(sget(d, "role"), "assistant");
			CU_ASSERT_STRING_EQUAL(sget(d, "content"), "");
			CU_ASSERT(json_is_null(json_object_get(ch, "finish_reason")));
			break;
		case 1:
			CU_ASSERT_PTR_NULL(json_object_get(d, "role"));
			CU_ASSERT_STRING_EQUAL(sget(d, "content"), text);
			CU_ASSERT(json_is_null(json_object_get(ch, "finish_reason")));
			break;
		case 2:
			CU_ASSERT_PTR_NULL(json_object_get(d, "role"));
			CU_ASSERT_STRING_EQUAL(sget(d, "content"), "abc");
			break;
		case 3:
			CU_ASSERT_EQUAL(json_object_size(d), 0);
			CU_ASSERT_STRING_EQUAL(sget(ch, "finish_reason"), "stop");
			break;
		case 4:
			CU_ASSERT_STRING_EQUAL(sget(d, "role"), "assistant");
			CU_ASSERT_STRING_EQUAL(sget(d, "content"), "x");
			CU_ASSERT_STRING_EQUAL(sget(ch, "finish_reason"), "length");
			break;
		}
		json_decref(c);
	}
	for (i = 0; i < 8; i++)
		free(ev[i]);
	buf_release(&out);
}

/* A delta cut mid-character by a provider still gives a valid event. */
static void test_sse_chunk_invalid_utf8(void)
{
	struct fcgi_completion m;
	struct buf out = BUF_INIT;
	char *ev[2] = { 0 };
	json_t *c;

	fcgi_completion_init(&m, "m");
	fcgi_sse_chunk(&out, &m, NULL, "ok\xf0\x9f\x98", 5, NULL);
	CU_ASSERT_EQUAL_FATAL(split_sse(&out, ev, 2), 1);
	c = load(ev[0], strlen(ev[0]));
	CU_ASSERT_PTR_NOT_NULL(c);
	if (c) {
		const char *s = sget(
			json_object_get(json_array_get(json_object_get(c, "choices"), 0), "delta"),
			"content");

		CU_ASSERT_PTR_NOT_NULL(s);
		if (s)
			CU_ASSERT_EQUAL(strncmp(s, "ok\xef\xbf\xbd", 5), 0);
	}
	json_decref(c);
	free(ev[0]);
	buf_release(&out);
}

static void test_sse_usage(void)
{
	struct fcgi_completion m;
	struct prov_usage u = { .present = true,
				.prompt_tokens = 12,
				.completion_tokens = 30,
				.total_tokens = 42,
				.cached_tokens = 5 };
	struct prov_usage absent = { .present = false, .prompt_tokens = 99 };
	struct buf out = BUF_INIT;
	char *ev[4] = { 0 };
	json_t *c, *us;
	int i;

	fcgi_completion_init(&m, "m");
	fcgi_sse_usage(&out, &m, &u);
	fcgi_sse_usage(&out, &m, NULL);
	fcgi_sse_usage(&out, &m, &absent);
	CU_ASSERT_EQUAL_FATAL(split_sse(&out, ev, 4), 3);
	for (i = 0; i < 3; i++) {
		c = load(ev[i], strlen(ev[i]));
		CU_ASSERT_PTR_NOT_NULL_FATAL(c);
		check_chunk_head(c, &m);
		CU_ASSERT(json_is_array(json_object_get(c, "choices")));
		CU_ASSERT_EQUAL(json_array_size(json_object_get(c, "choices")), 0);
		us = json_object_get(c, "usage");
		CU_ASSERT_PTR_NOT_NULL_FATAL(us);
		if (i == 0) {
			CU_ASSERT(json_is_object(us));
			CU_ASSERT_EQUAL(json_integer_value(json_object_get(us, "prompt_tokens")),
					12);
			CU_ASSERT_EQUAL(
				json_integer_value(json_object_get(us, "completion_tokens")), 30);
			CU_ASSERT_EQUAL(json_integer_value(json_object_get(us, "total_tokens")),
					42);
			CU_ASSERT_EQUAL(json_integer_value(json_object_get(
						json_object_get(us, "prompt_tokens_details"),
						"cached_tokens")),
					5);
		} else {
			CU_ASSERT(json_is_null(us));
		}
		json_decref(c);
	}
	for (i = 0; i < 4; i++)
		free(ev[i]);

	buf_reset(&out);
	fcgi_sse_done(&out);
	CU_ASSERT_STRING_EQUAL(out.data, "data: [DONE]\n\n");

	buf_reset(&out);
	fcgi_usage_json(&out, NULL);
	CU_ASSERT_STRING_EQUAL(out.data, "null");
	buf_reset(&out);
	fcgi_usage_json(&out, &absent);
	CU_ASSERT_STRING_EQUAL(out.data, "null");
	buf_reset(&out);
	fcgi_usage_json(&out, &u);
	c = load(out.data, out.len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(c, "total_tokens")), 42);
	json_decref(c);
	buf_release(&out);
}

static void test_completion_json(void)
{
	struct fcgi_completion m;
	struct prov_usage u = {
		.present = true, .prompt_tokens = 1, .completion_tokens = 2, .total_tokens = 3
	};
	struct buf out = BUF_INIT;
	static const char text[] = "Hello \"you\"\n\xf0\x9f\x98\x80 \\ end";
	json_t *c, *ch, *msg, *us;

	fcgi_completion_init(&m, "local-echo");
	fcgi_completion_json(&out, &m, text, sizeof(text) - 1, "stop", &u);
	c = load(out.data, out.len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_STRING_EQUAL(sget(c, "id"), m.id);
	CU_ASSERT_EQUAL(strncmp(sget(c, "id"), "chatcmpl-", 9), 0);
	CU_ASSERT_STRING_EQUAL(sget(c, "object"), "chat.completion");
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(c, "created")), m.created);
	CU_ASSERT_STRING_EQUAL(sget(c, "model"), "local-echo");
	ch = json_object_get(c, "choices");
	CU_ASSERT_FATAL(json_is_array(ch) && json_array_size(ch) == 1);
	ch = json_array_get(ch, 0);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(ch, "index")), 0);
	CU_ASSERT_STRING_EQUAL(sget(ch, "finish_reason"), "stop");
	msg = json_object_get(ch, "message");
	CU_ASSERT_STRING_EQUAL(sget(msg, "role"), "assistant");
	CU_ASSERT_STRING_EQUAL(sget(msg, "content"), text);
	us = json_object_get(c, "usage");
	CU_ASSERT_FATAL(json_is_object(us));
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(us, "prompt_tokens")), 1);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(us, "completion_tokens")), 2);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(us, "total_tokens")), 3);
	json_decref(c);

	/* Without usage the member is absent; an empty answer is an empty string. */
	buf_reset(&out);
	fcgi_completion_json(&out, &m, "", 0, "length", NULL);
	c = load(out.data, out.len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_PTR_NULL(json_object_get(c, "usage"));
	ch = json_array_get(json_object_get(c, "choices"), 0);
	CU_ASSERT_STRING_EQUAL(sget(ch, "finish_reason"), "length");
	CU_ASSERT_STRING_EQUAL(sget(json_object_get(ch, "message"), "content"), "");
	json_decref(c);

	buf_reset(&out);
	u.present = false;
	fcgi_completion_json(&out, &m, "x", 1, "stop", &u);
	c = load(out.data, out.len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_PTR_NULL(json_object_get(c, "usage"));
	json_decref(c);
	buf_release(&out);
}

/* The chunks of one answer share id and created; another answer has another id. */
static void test_same_id(void)
{
	struct fcgi_completion m, other;
	struct prov_usage u = { .present = true, .total_tokens = 1 };
	struct buf out = BUF_INIT;
	char *ev[8] = { 0 };
	json_t *c;
	int n, i;

	fcgi_completion_init(&m, "m");
	fcgi_completion_init(&other, "m");
	fcgi_sse_chunk(&out, &m, "assistant", "a", 1, NULL);
	fcgi_sse_chunk(&out, &m, NULL, "b", 1, NULL);
	fcgi_sse_chunk(&out, &m, NULL, NULL, 0, "stop");
	fcgi_sse_usage(&out, &m, &u);
	n = split_sse(&out, ev, 8);
	CU_ASSERT_EQUAL_FATAL(n, 4);
	for (i = 0; i < n; i++) {
		c = load(ev[i], strlen(ev[i]));
		CU_ASSERT_PTR_NOT_NULL_FATAL(c);
		CU_ASSERT_STRING_EQUAL(sget(c, "id"), m.id);
		CU_ASSERT_STRING_NOT_EQUAL(sget(c, "id"), other.id);
		CU_ASSERT_EQUAL(json_integer_value(json_object_get(c, "created")), m.created);
		json_decref(c);
		free(ev[i]);
	}
	buf_release(&out);
}

/* tools into the request; tool_choice none drops them; calls encoded as OpenAI does. */
static void test_tools(void)
{
	static const char named[] = BODY(",\"tools\":[" TOOL("a") "," TOOL(
		"b") "],\"tool_choice\":{\"type\":"
		     "\"function\",\"function\":{\"name\":\"b\"}}");
	static const char none[] = BODY(",\"tools\":[" TOOL("a") "],\"tool_choice\":\"none\"");
	static const char req_[] = BODY(",\"tools\":[" TOOL("a") "],\"tool_choice\":\"required\"");
	struct fcgi_tool_call calls[2] = { { "call_1", "a", "{\"x\":1}", 7 },
					   { "call_2", "b", "{}", 2 } };
	struct fcgi_chat_request req;
	struct fcgi_error err = { 0 };
	struct fcgi_completion m;
	struct buf out = BUF_INIT;
	json_t *c, *msg;

	CU_ASSERT_EQUAL_FATAL(fcgi_chat_parse(named, strlen(named), &req, &err), 0);
	CU_ASSERT_EQUAL(json_array_size(req.tools), 2);
	CU_ASSERT_EQUAL(req.tool_choice, PROV_TOOLS_NAMED);
	CU_ASSERT_STRING_EQUAL(req.tool_name, "b");
	fcgi_chat_release(&req);
	CU_ASSERT_EQUAL_FATAL(fcgi_chat_parse(none, strlen(none), &req, &err), 0);
	CU_ASSERT_PTR_NULL(req.tools);
	fcgi_chat_release(&req);
	CU_ASSERT_EQUAL_FATAL(fcgi_chat_parse(req_, strlen(req_), &req, &err), 0);
	CU_ASSERT_EQUAL(req.tool_choice, PROV_TOOLS_REQUIRED);
	fcgi_chat_release(&req);

	fcgi_completion_init(&m, "m");
	fcgi_completion_json_calls(&out, &m, "", 0, calls, 2, "tool_calls", NULL);
	c = load(out.data, out.len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	msg = json_object_get(json_array_get(json_object_get(c, "choices"), 0), "message");
	CU_ASSERT_TRUE(json_is_null(json_object_get(msg, "content")));
	CU_ASSERT_EQUAL(json_array_size(json_object_get(msg, "tool_calls")), 2);
	CU_ASSERT_STRING_EQUAL(
		sget(json_object_get(json_array_get(json_object_get(msg, "tool_calls"), 0),
				     "function"),
		     "arguments"),
		"{\"x\":1}");
	json_decref(c);
	buf_reset(&out);
	fcgi_sse_tool_call(&out, &m, true, 1, "call_2", "b", "{\"", 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "\"delta\":{\"role\":\"assistant\",\"tool_calls\":"
						"[{\"index\":1,\"id\":\"call_2\",\"type\":"
						"\"function\",\"function\":{\"name\":\"b\","
						"\"arguments\":\"{\\\"\"}}]}"));
	buf_reset(&out);
	fcgi_sse_tool_call(&out, &m, false, 0, NULL, NULL, "1}", 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "\"delta\":{\"tool_calls\":[{\"index\":0,"
						"\"function\":{\"arguments\":\"1}\"}}]}"));
	buf_release(&out);
}

/* The query string of GET /v1/usage: decoded, first match, whole names only. */
static void test_query(void)
{
	struct buf v = BUF_INIT;

	CU_ASSERT_EQUAL(fcgi_query_get(NULL, "key", &v), 0);
	CU_ASSERT_EQUAL(fcgi_query_get("", "key", &v), 0);
	CU_ASSERT_EQUAL(fcgi_query_get("keys=a&key=b&key=c", "key", &v), 1);
	CU_ASSERT_STRING_EQUAL(v.data, "b");
	CU_ASSERT_EQUAL(fcgi_query_get("since=2026-01-31&recent=5", "recent", &v), 1);
	CU_ASSERT_STRING_EQUAL(v.data, "5");
	CU_ASSERT_EQUAL(fcgi_query_get("a=x%2By+z%41", "a", &v), 1);
	CU_ASSERT_STRING_EQUAL(v.data, "x+y zA");
	CU_ASSERT_EQUAL(fcgi_query_get("key", "key", &v), 1);
	CU_ASSERT_EQUAL(v.len, 0);
	CU_ASSERT_EQUAL(fcgi_query_get("key=", "key", &v), 1);
	CU_ASSERT_EQUAL(v.len, 0);
	CU_ASSERT_EQUAL(fcgi_query_get("other=1", "key", &v), 0);
	CU_ASSERT_EQUAL(v.len, 0);
	/* Bad encodings, and a NUL, which would cut the value short. */
	CU_ASSERT_EQUAL(fcgi_query_get("key=%zz", "key", &v), -1);
	CU_ASSERT_EQUAL(fcgi_query_get("key=%4", "key", &v), -1);
	CU_ASSERT_EQUAL(fcgi_query_get("key=a%", "key", &v), -1);
	CU_ASSERT_EQUAL(fcgi_query_get("key=%00", "key", &v), -1);
	/* Only the parameter asked for is decoded: another's bad encoding is not ours. */
	CU_ASSERT_EQUAL(fcgi_query_get("x=%zz&key=k", "key", &v), 1);
	CU_ASSERT_STRING_EQUAL(v.data, "k");
	buf_release(&v);
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "route", test_route },
		{ "query string parameters", test_query },
		{ "parse: every failure is 400 naming the field", test_parse_failures },
		{ "parse: valid forms", test_parse_valid },
		{ "parse: fields set", test_parse_fields },
		{ "parse: body length honoured", test_parse_len },
		{ "parse: response_format into the request, olp_warning out", test_format_fields },
		{ "response_format: what is JSON", test_format_satisfied },
		{ "images: data: URLs checked and counted, 413 above the cap", test_images },
		{ "tools: parsed, tool_choice, calls encoded", test_tools },
		{ "error object", test_error_json },
		{ "status text", test_status_text },
		{ "response headers refuse control characters", test_headers },
		{ "completion meta", test_meta },
		{ "SSE chunks", test_sse_chunks },
		{ "SSE chunk with a cut character", test_sse_chunk_invalid_utf8 },
		{ "SSE usage and DONE", test_sse_usage },
		{ "completion object", test_completion_json },
		{ "same id on the chunks of one answer", test_same_id },
		{ NULL, NULL },
	};

	return ts_exit_status(ts_cunit_run("api", tests));
}
