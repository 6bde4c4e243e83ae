/* fcgi: the OpenAI HTTP surface of olp-fcgi — routing, request validation, and the JSON
 * and server-sent-event encodings of answers and errors. The worker (main.c, handler.c)
 * uses these; they are public so that tests and the fuzzer drive them directly. Nothing
 * here does I/O. */
#ifndef OLP_FCGI_H
#define OLP_FCGI_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/common.h"
#include "providers/providers.h"

/* An error answer: {"error":{"message","type","param","code"}} with an HTTP status. */
struct api_error {
	int status;
	const char *type; /* static string */
	const char *code; /* static string or NULL */
	char param[64];	  /* the offending field, or "" */
	char message[512];
};

void api_error_set(struct api_error *e, int status, const char *type, const char *code,
		   const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Append the error object (JSON) to out. */
void api_error_json(const struct api_error *e, struct buf *out);
/* "200 OK", "404 Not Found", … for a Status: header. */
const char *api_status_text(int status);

/* ---- response headers ------------------------------------------------------------------
 * Every header line of a response is appended through these, so that no value taken from
 * elsewhere (a registry id, a provider name, a client's path) can end its header and start
 * another: CR/LF injection, e.g. a Set-Cookie smuggled in through X-OLP-Model-Used.
 * name must be an HTTP token (RFC 9110); value may hold visible ASCII, spaces and tabs
 * only (no CR, LF, NUL or other control character, nothing from 0x7f up). Appends
 * "name: value\r\n" to h and returns 0, or returns -EINVAL and leaves h as it was. */
int api_header_add(struct buf *h, const char *name, const char *value);
int api_header_addf(struct buf *h, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* ---- routing --------------------------------------------------------------------------- */
enum api_route {
	ROUTE_CHAT,	 /* POST /v1/chat/completions */
	ROUTE_MODELS,	 /* GET /v1/models */
	ROUTE_HEALTH,	 /* GET /health */
	ROUTE_NOT_FOUND, /* 404 */
	ROUTE_BAD_METHOD /* 405; *allow says which method the path takes */
};

/* Route a request by method and path. uri is REQUEST_URI (query string ignored; NULL
 * falls back to path_info); prefix ("" or e.g. "/api", from OLP_ROUTE_PREFIX or config)
 * is stripped first, so a ScriptAlias mount and a root mount both work. *path receives the
 * path the route was matched on (a pointer into a static or into uri's copy in pathbuf). */
enum api_route api_route(const char *method, const char *uri, const char *path_info,
			 const char *prefix, struct buf *pathbuf, const char **allow);

/* ---- chat requests ----------------------------------------------------------------------- */
struct chat_request {
	json_t *root; /* the parsed body; owns everything below */
	const char *model;
	const json_t *messages;
	bool stream;
	bool include_usage;
	int64_t max_tokens; /* 0 = not set */
};

/* Parse and validate a chat completion body as the Node OLP does. 0 on success (release
 * with chat_request_release), -1 with err filled (status 400, type invalid_request_error,
 * param naming the field). */
int api_parse_chat(const char *body, size_t len, struct chat_request *out, struct api_error *err);
void chat_request_release(struct chat_request *req);

/* ---- answers --------------------------------------------------------------------------- */
/* The identity of one completion: the same id and created on every chunk. */
struct completion_meta {
	char id[48]; /* "chatcmpl-…" */
	int64_t created;
	const char *model; /* as the client asked */
};
void completion_meta_init(struct completion_meta *m, const char *model);

/* Append "data: {chunk}\n\n" for one streamed chunk. role (or NULL) goes on the first
 * chunk only; content (or NULL) is the delta text; finish_reason (or NULL) closes the
 * choice. */
void api_sse_chunk(struct buf *out, const struct completion_meta *m, const char *role,
		   const char *content, size_t len, const char *finish_reason);
/* The usage chunk (choices empty) sent when stream_options.include_usage is set; usage
 * is null when the provider did not report it. */
void api_sse_usage(struct buf *out, const struct completion_meta *m, const struct prov_usage *u);
void api_sse_done(struct buf *out);
/* A whole chat.completion object. */
void api_completion_json(struct buf *out, const struct completion_meta *m, const char *content,
			 size_t len, const char *finish_reason, const struct prov_usage *u);
/* The OpenAI usage object (or null). */
void api_usage_json(struct buf *out, const struct prov_usage *u);

#endif
