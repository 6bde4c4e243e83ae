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
/* Check base64 image bytes (standard, padded) of type "png", "jpeg", "gif" or "webp":
 * valid base64, at most FCGI_MAX_IMAGE_BYTES decoded (else 413), and bytes that are that
 * type. 0, or -1 with err naming param ("param: the data is not a png image"). */
int fcgi_image_check(const char *type, const char *data, size_t len, const char *param,
		     struct fcgi_error *err);
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

/* ---- the OpenAI Responses API (POST /v1/responses; resp_parse.c, resp_encode.c) -------
 * A front-end over the chat completions path (ADR 0030): a Responses body is translated
 * into a chat completions body, which fcgi_chat_parse_json then checks as any other, and
 * the answer is encoded as Responses events or a response object. docs/openai-compat.md
 * lists what is honoured, ignored on purpose and refused. */
struct fcgi_resp_request {
	json_t *chat;	/* the chat completions body it translates into (owned; NULL after
			   fcgi_chat_parse_json took it) */
	json_t *custom; /* the names of its custom (freeform) tools: an array of strings,
			   owned; their calls are answered as custom_tool_call items */
	bool stream;
};
/* Parse a Responses body and translate it. 0 (release with fcgi_resp_release), or -1
 * with err filled (400 invalid_request_error, param naming the field: "input[3].type"). */
int fcgi_resp_parse(const char *body, size_t len, struct fcgi_resp_request *out,
		    struct fcgi_error *err);
void fcgi_resp_release(struct fcgi_resp_request *r);

/* The calls one answer may make (as chat.c's FCGI_MAX_CALLS). */
#define FCGI_RESP_MAX_CALLS 32
/* One answer's Responses encoding: its ids, the sequence numbers of its events, its
 * output items so far. Streamed: begin, then text and call pieces in the order they come,
 * then end (response.completed, .incomplete or .failed); whole: the response object. */
struct fcgi_resp_state {
	char id[40]; /* "resp_…" */
	int64_t created;
	const char *model;    /* as the client asked */
	const json_t *custom; /* fcgi_resp_request.custom */
	uint64_t seq;	      /* the next event's sequence_number */
	bool msg_open;	      /* a message item is streaming (its text in text) */
	size_t msg_index;     /* ... its output_index */
	struct buf text;
	json_t *items; /* the output items by output_index (null: a call not done) */
	size_t call_at[FCGI_RESP_MAX_CALLS]; /* call i's output_index */
	size_t ncalls;
};
void fcgi_resp_state_init(struct fcgi_resp_state *s, const char *model, const json_t *custom);
void fcgi_resp_state_release(struct fcgi_resp_state *s);
/* response.created and response.in_progress. */
void fcgi_resp_begin(struct fcgi_resp_state *s, struct buf *out);
/* A piece of the answer's text (opens the message item on its first piece). */
void fcgi_resp_text(struct fcgi_resp_state *s, struct buf *out, const char *text, size_t len);
/* A piece of call i (c: its id and name; first: its first piece, which opens its item). */
void fcgi_resp_call(struct fcgi_resp_state *s, struct buf *out, size_t i,
		    const struct fcgi_tool_call *c, bool first, const char *args, size_t len);
/* The end: the open item closed, every call's item done (calls whole, n of them), then
 * response.completed (response.incomplete when finish is "length"), or response.failed
 * when o->err. */
void fcgi_resp_end(struct fcgi_resp_state *s, struct buf *out, const struct fcgi_tool_call *calls,
		   size_t n, const struct prov_outcome *o);
/* Not streamed: the whole response object. */
void fcgi_resp_whole(struct fcgi_resp_state *s, struct buf *out, const char *text, size_t len,
		     const struct fcgi_tool_call *calls, size_t n, const struct prov_outcome *o);
/* An SSE comment: the stream's heartbeat. */
void fcgi_resp_beat(struct buf *out);

/* ---- the Anthropic Messages API (messages_parse.c, messages_encode.c) -------------------
 * POST /v1/messages is a front-end over the chat request path (ADR 0030): its body is
 * translated into a chat completion body, and its answers are encoded from the same
 * events. docs/openai-compat.md lists what is honoured, ignored on purpose and refused. */

/* Translate a Messages request body (root, parsed; the caller keeps it) into a new chat
 * completion body: system (a string or text blocks) and "system" messages as system
 * messages; text and base64 image blocks as text and image_url (data: URL) parts;
 * tool_use blocks as tool_calls, tool_result blocks as tool messages (their images follow
 * in a user message); tools (input_schema) as function tools; tool_choice auto, any, tool,
 * none as "auto", "required", {function}, "none"; max_tokens, stop_sequences (as stop),
 * stream. thinking, temperature, top_p, top_k, context_management and output_config are
 * accepted and ignored on purpose; any other field is refused by name. count: the body of
 * /v1/messages/count_tokens, where max_tokens is not required. The new body, or NULL with
 * err filled (400 invalid_request_error, 413 for an image over the cap), its message
 * starting with the field's path as Anthropic writes it ("messages.2.content.0.source.data:
 * …"), which param holds too. */
json_t *fcgi_messages_translate(const json_t *root, bool count, struct fcgi_error *err);
/* What /v1/messages/count_tokens answers for a translated, parsed request: OLP's estimate
 * of the prompt (ADR 0024's 4 bytes a token) over what the provider would be given: the
 * flattened conversation (prov_flatten_messages) and the tools' declarations (their
 * JSON), plus FCGI_IMAGE_TOKENS for each image. At least 1. */
#define FCGI_IMAGE_TOKENS 1600
int64_t fcgi_messages_count_tokens(const json_t *messages, const json_t *tools);

/* Anthropic's stop_reason for an answer's finish_reason ("stop", "length", "tool_calls",
 * "content_filter"): end_turn, max_tokens, tool_use, refusal. */
const char *fcgi_messages_stop_reason(const char *finish_reason);

/* A streamed Message, in Anthropic's order: message_start and a ping with the first
 * bytes, then for each content block content_block_start, content_block_delta
 * (text_delta, or input_json_delta for a tool_use block), content_block_stop, and at the
 * end message_delta (stop_reason, stop_sequence, usage) and message_stop; or an error
 * event. Each function appends whole events to out. */
enum fcgi_msg_block { FCGI_MSG_BLOCK_NONE = 0, FCGI_MSG_BLOCK_TEXT, FCGI_MSG_BLOCK_TOOL };
struct fcgi_msg_stream {
	char id[40];	   /* "msg_…": the same in the stream and in a whole message */
	const char *model; /* as the client asked */
	bool started;	   /* message_start is out */
	enum fcgi_msg_block open;
	size_t open_call; /* FCGI_MSG_BLOCK_TOOL: the call it is */
	unsigned nblocks; /* blocks started: the next block's index */
};
void fcgi_msg_stream_init(struct fcgi_msg_stream *st, const char *model);
/* A piece of the answer's text (len > 0). */
void fcgi_msg_sse_text(struct fcgi_msg_stream *st, struct buf *out, const char *text, size_t len);
/* A piece of call's JSON input: id and name on its first piece (a new tool_use block),
 * NULL after. A piece of a call whose block was closed (the model went on to another) is
 * dropped: a block cannot be reopened. */
void fcgi_msg_sse_tool(struct fcgi_msg_stream *st, struct buf *out, size_t call, const char *id,
		       const char *name, const char *json, size_t len);
/* The heartbeat: a ping (with message_start first when nothing was sent yet). */
void fcgi_msg_sse_ping(struct fcgi_msg_stream *st, struct buf *out);
/* The end: the open block closed, message_delta and message_stop. stop_sequence: the one
 * that ended the answer (stop_reason "stop_sequence"), or NULL. */
void fcgi_msg_sse_end(struct fcgi_msg_stream *st, struct buf *out, const char *stop_reason,
		      const char *stop_sequence, const struct prov_usage *u);
/* A failure after the stream began: an error event with e in Anthropic's shape. */
void fcgi_msg_sse_error(struct fcgi_msg_stream *st, struct buf *out, const struct fcgi_error *e);
/* Anthropic's usage object: input_tokens (without the cached part), output_tokens,
 * cache_read_input_tokens (OLP's cached_tokens); zeros when u has none. */
void fcgi_msg_usage_json(struct buf *out, const struct prov_usage *u);
/* A whole Message: id and model from st, content blocks (the text when there is some,
 * then each call as a tool_use block whose input is its arguments as a JSON object: {}
 * when they are not one), stop_reason, stop_sequence and usage. */
void fcgi_msg_json(struct buf *out, const struct fcgi_msg_stream *st, const char *text, size_t len,
		   const struct fcgi_tool_call *calls, size_t ncalls, const char *stop_reason,
		   const char *stop_sequence, const struct prov_usage *u);

#endif
