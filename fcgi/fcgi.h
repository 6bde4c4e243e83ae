/* fcgi: the OpenAI HTTP surface of olp-fcgi — routing, request validation, and the JSON
 * and server-sent-event encodings of answers and errors. The worker (main.c, handler.c and its routes)
 * uses these; they are public so that tests and the fuzzer drive them directly. Nothing
 * here does I/O.
 *
 * Names: everything fcgi/ exports, here or in its private worker.h, starts with fcgi_
 * (FCGI_ for constants), after the module's folder, as sbx_ and prov_ do after theirs.
 * libfcgi's own names are FCGX_ (its API) and FCGI_ + a FastCGI record or role name (the
 * specification's constants): none of ours is either. */
#ifndef OLP_FCGI_H
#define OLP_FCGI_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/common.h"
#include "providers/providers.h"

/* An error answer: {"error":{"message","type","param","code"}} with an HTTP status. */
struct fcgi_error {
	int status;
	const char *type; /* static string */
	const char *code; /* static string or NULL */
	char param[128];  /* the offending field, or "" */
	char message[512];
};

void fcgi_error_set(struct fcgi_error *e, int status, const char *type, const char *code,
		    const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Append the error object (JSON) to out. */
void fcgi_error_json(const struct fcgi_error *e, struct buf *out);
/* The client API a request speaks, which decides its errors' shape: OpenAI's (chat
 * completions, Responses, everything else) or Anthropic's (Messages). */
enum fcgi_api { FCGI_API_OPENAI = 0, FCGI_API_ANTHROPIC };
/* Append e in api's shape: fcgi_error_json, or Anthropic's {"type":"error","error":
 * {"type","message"}} with the type its status has there (401 authentication_error, 403
 * permission_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error, 503
 * overloaded_error, other 5xx api_error, other 4xx invalid_request_error). */
void fcgi_error_json_api(const struct fcgi_error *e, enum fcgi_api api, struct buf *out);
/* "200 OK", "404 Not Found", … for a Status: header. */
const char *fcgi_status_text(int status);

/* ---- response headers ------------------------------------------------------------------
 * Every header line of a response is appended through these, so that no value taken from
 * elsewhere (a registry id, a provider name, a client's path) can end its header and start
 * another: CR/LF injection, e.g. a Set-Cookie smuggled in through X-OLP-Model-Used.
 * name must be an HTTP token (RFC 9110); value may hold visible ASCII, spaces and tabs
 * only (no CR, LF, NUL or other control character, nothing from 0x7f up). Appends
 * "name: value\r\n" to h and returns 0, or returns -EINVAL and leaves h as it was. */
int fcgi_header_add(struct buf *h, const char *name, const char *value);
int fcgi_header_addf(struct buf *h, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* ---- routing --------------------------------------------------------------------------- */
/* One route: a new route is one row of the worker's table (fcgi/handler.c) plus its
 * handler. The table is the caller's, so that the matcher is tested without a worker. */
struct fcgi_req; /* one request under way: private to the worker (fcgi/worker.h) */
enum {
	FCGI_ROUTE_RESTRICTABLE = 1 << 0, /* auth.owner_only_endpoints may restrict it */
	FCGI_ROUTE_QUIET = 1 << 1,	  /* a 200 writes no log line (probes) */
	FCGI_ROUTE_ANTHROPIC = 1 << 2,	  /* its errors in Anthropic's shape (FCGI_API_ANTHROPIC) */
};
struct fcgi_route {
	const char *method; /* "GET" also takes HEAD */
	const char *path;   /* below the route prefix */
	const char *name;   /* in /metrics' route label */
	void (*handle)(struct fcgi_req *rq);
	unsigned flags; /* FCGI_ROUTE_* */
};

enum fcgi_route_result {
	FCGI_ROUTE_FOUND,
	FCGI_ROUTE_NOT_FOUND, /* 404 */
	FCGI_ROUTE_BAD_METHOD /* 405: *row is the path's route, whose method is the Allow */
};

/* Route a request by method and path through table (n rows). The path is REQUEST_URI's
 * (uri; query string ignored; NULL or "" falls back to path_info), less prefix ("" or
 * e.g. "/api", from OLP_ROUTE_PREFIX or config) when it starts with it, so a root mount
 * and a configured mount both work. When that path is no route and the server gave a
 * PATH_INFO, PATH_INFO is tried: the path below a mount the server split off itself
 * (Apache's ScriptAlias /olp, an alias to a CGI program), with no prefix to configure.
 * pathbuf receives the path the route was matched on (for a 404, the request's own
 * path); *row the route (NULL for a 404). */
enum fcgi_route_result fcgi_route_match(const struct fcgi_route *table, size_t n,
					const char *method, const char *uri, const char *path_info,
					const char *prefix, struct buf *pathbuf,
					const struct fcgi_route **row);

/* The first value of query parameter name in qs (QUERY_STRING, may be NULL), decoded
 * ('+' is a space, %XX a byte), into out (reset first). 1 when present, 0 when absent,
 * -1 when its value is badly encoded (a '%' without two hex digits, or a NUL byte). */
int fcgi_query_get(const char *qs, const char *name, struct buf *out);

/* ---- chat requests ----------------------------------------------------------------------- */
/* "stop": at most this many sequences (as OpenAI), each 1 to FCGI_MAX_STOP_LEN bytes. */
#define FCGI_MAX_STOP 4
#define FCGI_MAX_STOP_LEN 256
/* image_url parts: at most this many a request, each at most this many bytes decoded
 * (the Anthropic API's own limit per image); above the size, 413. */
#define FCGI_MAX_IMAGES 20
#define FCGI_MAX_IMAGE_BYTES ((size_t)5 << 20)
/* tools: at most this many function tools a request. */
#define FCGI_MAX_TOOLS 128

struct fcgi_chat_request {
	json_t *root; /* the parsed body; owns everything below */
	const char *model;
	const json_t *messages;
	bool stream;
	bool include_usage;
	int64_t max_tokens;	   /* 0 = not set */
	const json_t *stop;	   /* a string, an array of strings (checked), or NULL */
	enum prov_format format;   /* response_format */
	const json_t *json_schema; /* PROV_FORMAT_JSON_SCHEMA: {"name", "schema"?, …} */
	unsigned nimages;	   /* image_url parts (checked data: URLs) */
	char image_param[128];	   /* the first one's param, for a provider that takes none */
	const json_t *tools;	   /* checked, non-empty; NULL for none or tool_choice "none" */
	enum prov_tool_choice tool_choice;
	const char *tool_name; /* PROV_TOOLS_NAMED */
};

/* Parse and validate a chat completion body as the Node OLP does. 0 on success (release
 * with fcgi_chat_release), -1 with err filled (status 400, type invalid_request_error,
 * param naming the field). A field OLP would not honour is refused by name, never dropped
 * in silence: an unknown one, one OLP cannot do (audio, logprobs, n above 1, …); the
 * ones accepted and ignored on purpose (temperature, seed, user, …) are listed in api.c
 * and docs/openai-compat.md. */
int fcgi_chat_parse(const char *body, size_t len, struct fcgi_chat_request *out,
		    struct fcgi_error *err);
/* The same for a body already parsed (a front-end's translation of its own API's request
 * into a chat completion body: fcgi/messages.c, fcgi/responses.c): takes root, which
 * out->root then owns (released with fcgi_chat_release, also on failure). */
int fcgi_chat_parse_json(json_t *root, struct fcgi_chat_request *out, struct fcgi_error *err);
void fcgi_chat_release(struct fcgi_chat_request *req);
/* Whether an answer is what response_format asked for: JSON (an object for json_object),
 * whitespace around it allowed. The schema itself is not checked. Always true for text. */
bool fcgi_format_satisfied(enum prov_format format, const char *text, size_t len);

/* ---- answers --------------------------------------------------------------------------- */
/* The identity of one completion: the same id and created on every chunk. */
struct fcgi_completion {
	char id[48]; /* "chatcmpl-…" */
	int64_t created;
	const char *model; /* as the client asked */
	/* Or NULL: why the answer may not be what the client asked for (response_format
	 * not met). Goes into the whole object and the final chunk as "olp_warning": a
	 * stream's headers are gone by the time it is known (docs/openai-compat.md). */
	const char *warning;
};
void fcgi_completion_init(struct fcgi_completion *m, const char *model);

/* Append "data: {chunk}\n\n" for one streamed chunk. role (or NULL) goes on the first
 * chunk only; content (or NULL) is the delta text; finish_reason (or NULL) closes the
 * choice. */
void fcgi_sse_chunk(struct buf *out, const struct fcgi_completion *m, const char *role,
		    const char *content, size_t len, const char *finish_reason);
/* The usage chunk (choices empty) sent when stream_options.include_usage is set; usage
 * is null when the provider did not report it. */
void fcgi_sse_usage(struct buf *out, const struct fcgi_completion *m, const struct prov_usage *u);
void fcgi_sse_done(struct buf *out);
/* One streamed piece of a function call: first (the answer's first chunk) adds the role;
 * id and name (or NULL) go on the call's first piece; args/len is a piece of its JSON
 * arguments. */
void fcgi_sse_tool_call(struct buf *out, const struct fcgi_completion *m, bool first,
			unsigned index, const char *id, const char *name, const char *args,
			size_t len);
/* A function call of the model's, whole. */
struct fcgi_tool_call {
	const char *id;
	const char *name;
	const char *args; /* JSON text */
	size_t args_len;
};
/* A whole chat.completion object, with the model's calls (content null when it said
 * nothing else). */
void fcgi_completion_json_calls(struct buf *out, const struct fcgi_completion *m,
				const char *content, size_t len, const struct fcgi_tool_call *calls,
				size_t ncalls, const char *finish_reason,
				const struct prov_usage *u);
/* A whole chat.completion object. */
void fcgi_completion_json(struct buf *out, const struct fcgi_completion *m, const char *content,
			  size_t len, const char *finish_reason, const struct prov_usage *u);
/* The OpenAI usage object (or null). */
void fcgi_usage_json(struct buf *out, const struct prov_usage *u);

#endif
