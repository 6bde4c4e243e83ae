/* Routing, validation and encodings of the OpenAI surface. No I/O here. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "fcgi/fcgi.h"
#include "fcgi/fields.h"
#include "common/banned.h"

void fcgi_error_set(struct fcgi_error *e, int status, const char *type, const char *code,
		    const char *param, const char *fmt, ...)
{
	va_list ap;

	e->status = status;
	e->type = type;
	e->code = code;
	snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
	va_start(ap, fmt);
	(void)vsnprintf(e->message, sizeof(e->message), fmt, ap);
	va_end(ap);
}

void fcgi_error_json(const struct fcgi_error *e, struct buf *out)
{
	buf_adds(out, "{\"error\":{\"message\":");
	buf_add_json_str(out, e->message, strlen(e->message));
	buf_adds(out, ",\"type\":");
	buf_add_json_str(out, e->type, strlen(e->type));
	buf_adds(out, ",\"param\":");
	if (e->param[0])
		buf_add_json_str(out, e->param, strlen(e->param));
	else
		buf_adds(out, "null");
	buf_adds(out, ",\"code\":");
	if (e->code)
		buf_add_json_str(out, e->code, strlen(e->code));
	else
		buf_adds(out, "null");
	buf_adds(out, "}}");
}

/* The Anthropic error type for an HTTP status, as the Messages API names them. */
static const char *anthropic_error_type(int status)
{
	switch (status) {
	case 401: return "authentication_error";
	case 403: return "permission_error";
	case 404: return "not_found_error";
	case 413: return "request_too_large";
	case 429: return "rate_limit_error";
	case 503: return "overloaded_error";
	default: return status >= 500 ? "api_error" : "invalid_request_error";
	}
}

void fcgi_error_json_api(const struct fcgi_error *e, enum fcgi_api api, struct buf *out)
{
	const char *type;

	if (api != FCGI_API_ANTHROPIC) {
		fcgi_error_json(e, out);
		return;
	}
	/* Anthropic's error object has a type and a message, which names the field; OLP's
	 * code is in the request's log line. */
	type = anthropic_error_type(e->status);
	buf_adds(out, "{\"type\":\"error\",\"error\":{\"type\":");
	buf_add_json_str(out, type, strlen(type));
	buf_adds(out, ",\"message\":");
	buf_add_json_str(out, e->message, strlen(e->message));
	buf_adds(out, "}}");
}

const char *fcgi_status_text(int status)
{
	switch (status) {
	case 200: return "200 OK";
	case 400: return "400 Bad Request";
	case 401: return "401 Unauthorized";
	case 403: return "403 Forbidden";
	case 404: return "404 Not Found";
	case 405: return "405 Method Not Allowed";
	case 413: return "413 Payload Too Large";
	case 415: return "415 Unsupported Media Type";
	case 429: return "429 Too Many Requests";
	case 499: return "499 Client Closed Request";
	case 500: return "500 Internal Server Error";
	case 502: return "502 Bad Gateway";
	case 503: return "503 Service Unavailable";
	case 504: return "504 Gateway Timeout";
	default: return "500 Internal Server Error";
	}
}

/* ---- response headers ------------------------------------------------------------------ */

/* RFC 9110 token characters: what a header name may be made of. */
static bool is_tchar(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       (c && strchr("!#$%&'*+-.^_`|~", c));
}

int fcgi_header_add(struct buf *h, const char *name, const char *value)
{
	size_t i;

	if (!name || !name[0] || !value)
		return -EINVAL;
	for (i = 0; name[i]; i++)
		if (!is_tchar((unsigned char)name[i]))
			return -EINVAL;
	/* Visible ASCII, space and tab only: a CR or LF would end this header and start
	 * another one (or the body), a NUL would cut it short in the web server. */
	for (i = 0; value[i]; i++)
		if (((unsigned char)value[i] < 0x20 && value[i] != '\t') ||
		    (unsigned char)value[i] >= 0x7f)
			return -EINVAL;
	buf_adds(h, name);
	buf_adds(h, ": ");
	buf_adds(h, value);
	buf_adds(h, "\r\n");
	return 0;
}

int fcgi_header_addf(struct buf *h, const char *name, const char *fmt, ...)
{
	struct buf v = BUF_INIT;
	va_list ap;
	int ret;

	va_start(ap, fmt);
	buf_vaddf(&v, fmt, ap);
	va_end(ap);
	/* A value with a NUL inside would pass the check cut short: refuse it whole. */
	ret = strlen(v.data) == v.len ? fcgi_header_add(h, name, v.data) : -EINVAL;
	buf_release(&v);
	return ret;
}

/* ---- routing --------------------------------------------------------------------------- */

/* pathbuf := src's path (no query string, no fragment), less prefix when it starts with
 * it (whole segments only), less one trailing slash. */
static void route_path(struct buf *pathbuf, const char *src, const char *prefix)
{
	size_t plen = prefix ? strlen(prefix) : 0;

	buf_reset(pathbuf);
	/* Match on the path only: a query string never selects a route. */
	buf_add(pathbuf, src, strcspn(src, "?#"));
	while (plen && prefix[plen - 1] == '/')
		plen--;
	if (plen && !strncmp(pathbuf->data, prefix, plen) &&
	    (pathbuf->data[plen] == '/' || pathbuf->data[plen] == '\0'))
		buf_consume(pathbuf, plen);
	/* One trailing slash is tolerated, as the Node OLP's router does. */
	if (pathbuf->len > 1 && pathbuf->data[pathbuf->len - 1] == '/') {
		pathbuf->data[--pathbuf->len] = '\0';
	}
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = (char)(c | 0x20);
	return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int fcgi_query_get(const char *qs, const char *name, struct buf *out)
{
	size_t nlen = strlen(name);

	buf_reset(out);
	while (qs && *qs) {
		size_t len = strcspn(qs, "&");

		if (len >= nlen && !strncmp(qs, name, nlen) && (len == nlen || qs[nlen] == '=')) {
			for (size_t i = len > nlen ? nlen + 1 : nlen; i < len; i++) {
				int hi, lo;

				if (qs[i] == '+') {
					buf_addch(out, ' ');
				} else if (qs[i] != '%') {
					buf_addch(out, qs[i]);
				} else if (i + 2 < len && (hi = hexval(qs[i + 1])) >= 0 &&
					   (lo = hexval(qs[i + 2])) >= 0 && (hi || lo)) {
					buf_addch(out, (char)(hi << 4 | lo));
					i += 2;
				} else {
					return -1;
				}
			}
			return 1;
		}
		qs += len + (qs[len] == '&');
	}
	return 0;
}

static enum fcgi_route_result route_lookup(const struct fcgi_route *table, size_t n,
					   const char *method, const char *path,
					   const struct fcgi_route **row)
{
	size_t i;

	*row = NULL;
	for (i = 0; i < n; i++) {
		if (strcmp(path, table[i].path))
			continue;
		*row = &table[i];
		if (method && !strcmp(method, table[i].method))
			return FCGI_ROUTE_FOUND;
		if (method && !strcmp(method, "HEAD") && !strcmp(table[i].method, "GET"))
			return FCGI_ROUTE_FOUND;
		return FCGI_ROUTE_BAD_METHOD;
	}
	return FCGI_ROUTE_NOT_FOUND;
}

enum fcgi_route_result fcgi_route_match(const struct fcgi_route *table, size_t n,
					const char *method, const char *uri, const char *path_info,
					const char *prefix, struct buf *pathbuf,
					const struct fcgi_route **row)
{
	bool have_uri = uri && *uri;
	enum fcgi_route_result r;

	route_path(pathbuf, have_uri ? uri : path_info ? path_info : "", prefix);
	r = route_lookup(table, n, method, pathbuf->data, row);
	/* Mounted below a path the web server split off (Apache's ScriptAlias /olp …, an
	 * alias to a CGI program): REQUEST_URI still holds that mount, PATH_INFO is what lies
	 * below it. Only a path that is no route is retried this way, so a root mount routes
	 * exactly as before, whatever PATH_INFO its server makes up (lighttpd without
	 * fix-root-scriptname splits /v1/models into /v1 and /models). */
	if (r == FCGI_ROUTE_NOT_FOUND && have_uri && path_info && *path_info) {
		route_path(pathbuf, path_info, prefix);
		r = route_lookup(table, n, method, pathbuf->data, row);
		if (r == FCGI_ROUTE_NOT_FOUND) /* a 404 names the path the client asked for */
			route_path(pathbuf, uri, prefix);
	}
	return r;
}

/* ---- validation ------------------------------------------------------------------------ */

static const char *const roles[] = {
	"system", "developer", "user", "assistant", "tool", "function"
};

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

static int base64_value(unsigned char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Check standard base64 (padded, no whitespace); *size := the decoded size, and head :=
 * its first bytes (up to head_len, zero-filled). 0 or -1. */
static int base64_check(const char *s, size_t len, size_t *size, unsigned char *head,
			size_t head_len)
{
	size_t pad = 0, i, out = 0;
	uint32_t acc = 0;

	memset(head, 0, head_len);
	if (!len || len % 4)
		return -1;
	if (s[len - 1] == '=')
		pad = s[len - 2] == '=' ? 2 : 1;
	for (i = 0; i < len - pad; i++) {
		int v = base64_value((unsigned char)s[i]);

		if (v < 0)
			return -1;
		acc = (acc << 6) | (uint32_t)v;
		if (i % 4 == 3) {
			for (int k = 2; k >= 0; k--, out++)
				if (out < head_len)
					head[out] = (unsigned char)(acc >> (8 * k));
			acc = 0;
		}
	}
	*size = len / 4 * 3 - pad;
	return 0;
}

/* What an image's first bytes say it is, so that a part whose bytes are not the type it
 * names is refused here rather than by the provider's API in the middle of a run. */
static bool image_magic_ok(const char *type, const unsigned char *h)
{
	if (!strcmp(type, "png"))
		return !memcmp(h, "\x89PNG\r\n\x1a\n", 8);
	if (!strcmp(type, "jpeg"))
		return h[0] == 0xff && h[1] == 0xd8 && h[2] == 0xff;
	if (!strcmp(type, "gif"))
		return !memcmp(h, "GIF87a", 6) || !memcmp(h, "GIF89a", 6);
	return !memcmp(h, "RIFF", 4) && !memcmp(h + 8, "WEBP", 4); /* webp */
}

int fcgi_image_check(const char *type, const char *data, size_t len, const char *param,
		     struct fcgi_error *err)
{
	unsigned char head[16];
	size_t size;

	if (base64_check(data, len, &size, head, sizeof(head)))
		return bad(err, param, "%s: the image data is not valid base64", param);
	if (size > FCGI_MAX_IMAGE_BYTES) {
		bad(err, param, "%s: the image is %zu bytes, above the limit of %zu", param, size,
		    FCGI_MAX_IMAGE_BYTES);
		err->status = 413;
		err->type = "request_too_large";
		return -1;
	}
	if (!image_magic_ok(type, head))
		return bad(err, param, "%s: the data is not a %s image", param, type);
	return 0;
}

/* An image_url part: a data: URL of a PNG, JPEG, GIF or WebP image under the size cap.
 * Nothing is ever fetched on a client's behalf: an http(s) URL is refused. */
static int check_image(const json_t *part, const char *param, struct fcgi_chat_request *out,
		       struct fcgi_error *err)
{
	static const char *const types[] = { "png", "jpeg", "gif", "webp" };
	const json_t *iu = json_object_get(part, "image_url"), *detail;
	const char *url = json_string_value(json_object_get(iu, "url")), *mt, *comma;
	char uparam[128];
	size_t t;

	snprintf(uparam, sizeof(uparam), "%s.image_url.url", param);
	if (!json_is_object(iu) || !url ||
	    strlen(url) != json_string_length(json_object_get(iu, "url")))
		return bad(err, uparam, "%s must be a string (a data: URL)", uparam);
	detail = json_object_get(iu, "detail");
	if (detail && !json_is_null(detail) && !json_is_string(detail))
		return bad(err, param, "%s.image_url.detail must be a string", param);
	if (!strncasecmp(url, "http://", 7) || !strncasecmp(url, "https://", 8))
		return bad(err, uparam,
			   "%s: remote image URLs are not fetched (OLP fetches nothing on a "
			   "client's behalf); send the image inline as a data: URL "
			   "(data:image/png;base64,…)",
			   uparam);
	if (strncmp(url, "data:image/", 11))
		return bad(err, uparam,
			   "%s must be a data: URL of an image (data:image/png;base64,…)", uparam);
	mt = url + 11;
	comma = strchr(mt, ',');
	for (t = 0; t < ARRAY_SIZE(types); t++)
		if (comma && !strncmp(mt, types[t], strlen(types[t])) &&
		    !strncmp(mt + strlen(types[t]), ";base64,", 8))
			break;
	if (t == ARRAY_SIZE(types))
		return bad(err, uparam,
			   "%s: the image must be image/png, image/jpeg, image/gif or image/webp, "
			   "base64-encoded (data:image/png;base64,…)",
			   uparam);
	if (fcgi_image_check(types[t], comma + 1, strlen(comma + 1), uparam, err))
		return -1;
	if (++out->nimages > FCGI_MAX_IMAGES)
		return bad(err, uparam, "at most %d images a request", FCGI_MAX_IMAGES);
	if (out->nimages == 1)
		snprintf(out->image_param, sizeof(out->image_param), "%s", uparam);
	return 0;
}

static int check_content(const json_t *content, size_t i, bool user, struct fcgi_chat_request *out,
			 struct fcgi_error *err)
{
	char param[48], pparam[80];
	const json_t *part;
	size_t j;

	snprintf(param, sizeof(param), "messages[%zu].content", i);
	if (!content || json_is_null(content) || json_is_string(content))
		return 0;
	if (!json_is_array(content))
		return bad(err, param, "%s must be a string, an array of content parts, or null",
			   param);
	json_array_foreach(content, j, part) {
		const json_t *tv = json_object_get(part, "type");
		/* The body may hold NULs: "text\u0000image" is no "text". */
		const char *type = json_is_string(tv) && strlen(json_string_value(tv)) ==
								 json_string_length(tv)
					   ? json_string_value(tv)
					   : NULL;

		snprintf(pparam, sizeof(pparam), "%s[%zu]", param, j);
		if (json_is_object(part) && type && !strcmp(type, "text") &&
		    json_is_string(json_object_get(part, "text")))
			continue;
		if (json_is_object(part) && type && !strcmp(type, "image_url") && user) {
			if (check_image(part, pparam, out, err))
				return -1;
			continue;
		}
		if (json_is_object(part) && type && !strcmp(type, "image_url"))
			return bad(err, pparam, "%s: images may only be in user messages", pparam);
		return bad(err, param,
			   "%s[%zu] must be a text part ({\"type\":\"text\",\"text\":\"…\"}) or, "
			   "in a user message, an image_url part with a data: URL",
			   param, j);
	}
	return 0;
}

/* An assistant message's tool_calls (the history of an earlier turn). */
static int check_tool_calls(const json_t *msg, size_t i, struct fcgi_error *err)
{
	const json_t *calls = json_object_get(msg, "tool_calls"), *c;
	char param[64];
	size_t j;

	if (!calls || json_is_null(calls))
		return 0;
	snprintf(param, sizeof(param), "messages[%zu].tool_calls", i);
	if (!json_is_array(calls))
		return bad(err, param, "%s must be an array", param);
	json_array_foreach(calls, j, c) {
		const json_t *fn = json_object_get(c, "function");

		if (!json_is_object(c) || !json_is_string(json_object_get(c, "id")) ||
		    !json_is_object(fn) || !json_is_string(json_object_get(fn, "name")) ||
		    !json_is_string(json_object_get(fn, "arguments")))
			return bad(err, param,
				   "%s[%zu] must be {\"id\",\"type\":\"function\",\"function\":"
				   "{\"name\",\"arguments\"}} with strings",
				   param, j);
	}
	return 0;
}

static int check_messages(const json_t *messages, struct fcgi_chat_request *out,
			  struct fcgi_error *err)
{
	const json_t *msg;
	size_t i, r;

	if (!json_is_array(messages) || !json_array_size(messages))
		return bad(err, "messages", "messages must be a non-empty array");
	json_array_foreach(messages, i, msg) {
		char param[64];
		const char *role;

		if (!json_is_object(msg)) {
			snprintf(param, sizeof(param), "messages[%zu]", i);
			return bad(err, param, "%s must be an object", param);
		}
		snprintf(param, sizeof(param), "messages[%zu].role", i);
		role = json_string_value(json_object_get(msg, "role"));
		/* The body may hold NULs (JSON_ALLOW_NUL): "user\u0000x" is not "user". */
		if (role && strlen(role) != json_string_length(json_object_get(msg, "role")))
			role = NULL;
		for (r = 0; role && r < ARRAY_SIZE(roles); r++)
			if (!strcmp(role, roles[r]))
				break;
		if (!role || r == ARRAY_SIZE(roles))
			return bad(err, param,
				   "%s must be one of system, developer, user, assistant, "
				   "tool, function",
				   param);
		if (check_content(json_object_get(msg, "content"), i, !strcmp(role, "user"), out,
				  err) ||
		    (!strcmp(role, "assistant") && check_tool_calls(msg, i, err)))
			return -1;
	}
	return 0;
}

static int check_number_range(const json_t *root, const char *name, double lo, double hi,
			      struct fcgi_error *err)
{
	const json_t *v = json_object_get(root, name);
	double d;

	if (!v || json_is_null(v))
		return 0;
	d = json_number_value(v);
	if (!json_is_number(v) || !isfinite(d) || d < lo || d > hi)
		return bad(err, name, "%s must be a number between %g and %g", name, lo, hi);
	return 0;
}

static int check_stop_one(const json_t *s, struct fcgi_error *err)
{
	size_t n = json_string_length(s);

	/* Empty would match at once; a NUL would cut it short in the matcher. */
	if (!n || n > FCGI_MAX_STOP_LEN || strlen(json_string_value(s)) != n)
		return bad(err, "stop", "each stop sequence must be 1 to %d bytes without NUL",
			   FCGI_MAX_STOP_LEN);
	return 0;
}

static int check_stop(const json_t *root, struct fcgi_error *err)
{
	const json_t *v = json_object_get(root, "stop"), *s;
	size_t i;

	if (!v || json_is_null(v))
		return 0;
	if (json_is_string(v))
		return check_stop_one(v, err);
	if (!json_is_array(v) || json_array_size(v) > FCGI_MAX_STOP)
		return bad(err, "stop", "stop must be a string or an array of up to %d strings",
			   FCGI_MAX_STOP);
	json_array_foreach(v, i, s)
		if (!json_is_string(s) || check_stop_one(s, err))
			return bad(err, "stop",
				   "stop must be a string or an array of strings, each 1 to %d "
				   "bytes without NUL",
				   FCGI_MAX_STOP_LEN);
	return 0;
}

static int check_max_tokens(const json_t *root, const char *name, int64_t *out,
			    struct fcgi_error *err)
{
	const json_t *v = json_object_get(root, name);

	if (!v || json_is_null(v))
		return 0;
	if (parse_json_int(v, 1, INT64_MAX, out))
		return bad(err, name, "%s must be a positive integer", name);
	return 0;
}

/* Every top-level field of a chat request, and what OLP does with it (docs/openai-compat.md
 * is the same list for people). A field not listed is refused: a client must never believe
 * that something it asked for was done when it was dropped. FCGI_FIELD_IGNORED: no CLI has
 * the knob, and an answer without it is still the answer the client asked for. */
static const struct fcgi_field fields[] = {
	{ "model", FCGI_FIELD_USED, NULL },
	{ "messages", FCGI_FIELD_USED, NULL },
	{ "stream", FCGI_FIELD_USED, NULL },
	{ "stream_options", FCGI_FIELD_USED, NULL },
	{ "max_tokens", FCGI_FIELD_USED, NULL },
	{ "max_completion_tokens", FCGI_FIELD_USED, NULL },
	{ "stop", FCGI_FIELD_USED, NULL },
	{ "temperature", FCGI_FIELD_IGNORED, NULL },
	{ "top_p", FCGI_FIELD_IGNORED, NULL },
	{ "seed", FCGI_FIELD_IGNORED, NULL },
	{ "user", FCGI_FIELD_IGNORED, NULL },
	{ "frequency_penalty", FCGI_FIELD_IGNORED, NULL },
	{ "presence_penalty", FCGI_FIELD_IGNORED, NULL },
	{ "metadata", FCGI_FIELD_IGNORED, NULL },
	{ "store", FCGI_FIELD_IGNORED, NULL },
	{ "service_tier", FCGI_FIELD_IGNORED, NULL },
	{ "prompt_cache_key", FCGI_FIELD_IGNORED, NULL },
	{ "safety_identifier", FCGI_FIELD_IGNORED, NULL },
	{ "reasoning_effort", FCGI_FIELD_IGNORED, NULL },
	{ "verbosity", FCGI_FIELD_IGNORED, NULL },
	{ "parallel_tool_calls", FCGI_FIELD_IGNORED, NULL },
	{ "n", FCGI_FIELD_DEFAULT, NULL },
	{ "logprobs", FCGI_FIELD_DEFAULT, NULL },
	{ "logit_bias", FCGI_FIELD_DEFAULT, NULL },
	{ "modalities", FCGI_FIELD_DEFAULT, NULL },
	{ "response_format", FCGI_FIELD_DEFAULT, NULL },
	{ "top_logprobs", FCGI_FIELD_REFUSED, "the provider CLIs report no token probabilities" },
	{ "audio", FCGI_FIELD_REFUSED, "OLP answers with text only" },
	{ "prediction", FCGI_FIELD_REFUSED, "the provider CLIs take no predicted output" },
	{ "web_search_options", FCGI_FIELD_REFUSED,
	  "OLP runs the provider CLIs with their own tools (web search among them) off" },
	{ "tools", FCGI_FIELD_USED, NULL },
	{ "tool_choice", FCGI_FIELD_USED, NULL },
	{ "functions", FCGI_FIELD_REFUSED, "the deprecated form; send \"tools\"" },
	{ "function_call", FCGI_FIELD_REFUSED, "the deprecated form; send \"tool_choice\"" },
	{ NULL, FCGI_FIELD_USED, NULL },
};

/* A refused field's value that asks for nothing: null, an empty list or object. */
static bool asks_nothing(enum fcgi_fields_shape shape, const json_t *v)
{
	if (json_is_null(v))
		return true;
	return shape == FCGI_FIELDS_CHAT && ((json_is_array(v) && !json_array_size(v)) ||
					     (json_is_object(v) && !json_object_size(v)));
}

int fcgi_fields_check(const json_t *root, const struct fcgi_field *table,
		      enum fcgi_fields_shape shape, struct fcgi_error *err)
{
	bool anthropic = shape == FCGI_FIELDS_MESSAGES;
	const struct fcgi_field *f;
	const char *key;
	const json_t *v;

	json_object_foreach((json_t *)root, key, v) {
		for (f = table; f->name && strcmp(key, f->name); f++)
			;
		if (!f->name && anthropic)
			return bad(err, key,
				   "%.160s: unknown field (OLP refuses what it would not honour; "
				   "docs/openai-compat.md lists every field)",
				   key);
		if (!f->name)
			return bad(err, key,
				   "Unrecognized request argument supplied: %.48s (OLP refuses "
				   "what it would not honour; docs/openai-compat.md lists every "
				   "field)",
				   key);
		if (f->use != FCGI_FIELD_REFUSED || asks_nothing(shape, v))
			continue;
		if (anthropic)
			return bad(err, key, "%.160s: not supported: %s", key, f->why);
		return bad(err, key, "%s is not supported: %s", key, f->why);
	}
	return 0;
}

/* The fields accepted only with their default (or an equivalent) value. */
static int check_defaults(const json_t *root, struct fcgi_error *err)
{
	const json_t *v;
	int64_t n;
	size_t i;

	v = json_object_get(root, "n");
	if (v && !json_is_null(v)) {
		if (parse_json_int(v, 1, INT64_MAX, &n))
			return bad(err, "n", "n must be a positive integer");
		if (n != 1)
			return bad(err, "n",
				   "n must be 1: a provider CLI gives one answer a run "
				   "(send the request again for another)");
	}
	v = json_object_get(root, "logprobs");
	if (v && !json_is_null(v) && !json_is_false(v))
		return bad(err, "logprobs",
			   "logprobs must be false or absent: the provider CLIs report no token "
			   "probabilities");
	v = json_object_get(root, "logit_bias");
	if (v && !json_is_null(v) && !(json_is_object(v) && !json_object_size(v)))
		return bad(err, "logit_bias",
			   "logit_bias is not supported (only {} or null): the provider CLIs "
			   "take no token biases");
	v = json_object_get(root, "modalities");
	if (v && !json_is_null(v)) {
		const json_t *m;

		if (!json_is_array(v))
			return bad(err, "modalities", "modalities must be an array of strings");
		json_array_foreach(v, i, m)
			if (!json_is_string(m) || strcmp(json_string_value(m), "text"))
				return bad(err, "modalities",
					   "modalities may only hold \"text\": OLP answers with "
					   "text only");
	}
	return 0;
}

/* response_format: text, json_object, or json_schema with {"name", "schema"?, …}. */
static int check_format(const json_t *root, struct fcgi_chat_request *out, struct fcgi_error *err)
{
	const json_t *v = json_object_get(root, "response_format"), *js, *name, *schema;
	const char *t;

	if (!v || json_is_null(v))
		return 0;
	t = json_string_value(json_object_get(v, "type"));
	if (!json_is_object(v) || !t)
		return bad(err, "response_format",
			   "response_format must be an object with a \"type\"");
	if (!strcmp(t, "text"))
		return 0;
	if (!strcmp(t, "json_object")) {
		out->format = PROV_FORMAT_JSON_OBJECT;
		return 0;
	}
	if (strcmp(t, "json_schema"))
		return bad(err, "response_format.type",
			   "response_format.type must be text, json_object or json_schema");
	js = json_object_get(v, "json_schema");
	name = json_object_get(js, "name");
	schema = json_object_get(js, "schema");
	if (!json_is_object(js))
		return bad(err, "response_format.json_schema",
			   "response_format.json_schema must be an object");
	/* The name goes into the model's instruction: a short plain one, as OpenAI allows. */
	if (!json_is_string(name) || !json_string_length(name) || json_string_length(name) > 64 ||
	    strspn(json_string_value(name),
		   "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
		    json_string_length(name))
		return bad(err, "response_format.json_schema.name",
			   "response_format.json_schema.name must be 1 to 64 of a-z, A-Z, 0-9, "
			   "_ and -");
	if (schema && !json_is_null(schema) && !json_is_object(schema))
		return bad(err, "response_format.json_schema.schema",
			   "response_format.json_schema.schema must be an object");
	out->format = PROV_FORMAT_JSON_SCHEMA;
	out->json_schema = js;
	return 0;
}

/* A function name as OpenAI allows it; it is also what claude shows the model
 * (mcp__olp__<name>), so nothing else may pass. */
static bool tool_name_ok(const json_t *name)
{
	size_t n = json_string_length(name);

	return json_is_string(name) && n && n <= 64 &&
	       strspn(json_string_value(name), "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTU"
					       "VWXYZ0123456789_-") == n;
}

/* tools[i] (t): a function tool, its name valid and not one of an earlier tool's. */
static int check_tool(const json_t *tools, size_t i, const json_t *t, struct fcgi_error *err)
{
	const json_t *fn = json_object_get(t, "function"), *v;
	const char *type = json_string_value(json_object_get(t, "type"));
	char param[64];

	snprintf(param, sizeof(param), "tools[%zu]", i);
	if (!json_is_object(t) || !type || strcmp(type, "function") || !json_is_object(fn))
		return bad(err, param,
			   "%s must be {\"type\":\"function\",\"function\":{…}} "
			   "(the only kind of tool OLP passes on)",
			   param);
	snprintf(param, sizeof(param), "tools[%zu].function.name", i);
	if (!tool_name_ok(json_object_get(fn, "name")))
		return bad(err, param, "%s must be 1 to 64 of a-z, A-Z, 0-9, _ and -", param);
	for (size_t j = 0; j < i; j++)
		if (json_equal(
			    json_object_get(fn, "name"),
			    json_object_get(json_object_get(json_array_get(tools, j), "function"),
					    "name")))
			return bad(err, param, "%s: two tools have the name %s", param,
				   json_string_value(json_object_get(fn, "name")));
	v = json_object_get(fn, "description");
	snprintf(param, sizeof(param), "tools[%zu].function.description", i);
	if (v && !json_is_null(v) && !json_is_string(v))
		return bad(err, param, "%s must be a string", param);
	v = json_object_get(fn, "parameters");
	snprintf(param, sizeof(param), "tools[%zu].function.parameters", i);
	if (v && !json_is_null(v) && !json_is_object(v))
		return bad(err, param, "%s must be a JSON Schema object", param);
	return 0;
}

/* tool_choice (tc), once out->tools is known. */
static int check_tool_choice(const json_t *tc, struct fcgi_chat_request *out,
			     struct fcgi_error *err)
{
	const char *choice = json_string_value(tc);
	const json_t *t, *name = NULL;
	size_t i;

	if (!tc || json_is_null(tc) || (choice && !strcmp(choice, "auto")))
		return 0;
	if (choice && !strcmp(choice, "none")) {
		out->tools = NULL; /* declared to no one: the model cannot call any */
		return 0;
	}
	if (choice && !strcmp(choice, "required")) {
		out->tool_choice = PROV_TOOLS_REQUIRED;
	} else if (json_is_object(tc) &&
		   !strcmp(json_string_value(json_object_get(tc, "type")) ?: "", "function")) {
		name = json_object_get(json_object_get(tc, "function"), "name");
		if (!tool_name_ok(name))
			return bad(err, "tool_choice.function.name",
				   "tool_choice.function.name must name one of the tools");
		out->tool_choice = PROV_TOOLS_NAMED;
		out->tool_name = json_string_value(name);
	} else {
		return bad(err, "tool_choice",
			   "tool_choice must be \"none\", \"auto\", \"required\" or "
			   "{\"type\":\"function\",\"function\":{\"name\":…}}");
	}
	if (!out->tools)
		return bad(err, "tool_choice",
			   "tool_choice asks for a tool call, but there are no tools");
	json_array_foreach(out->tools, i, t)
		if (name &&
		    json_equal(name, json_object_get(json_object_get(t, "function"), "name")))
			return 0;
	if (name)
		return bad(err, "tool_choice.function.name",
			   "tool_choice.function.name: there is no tool named %s",
			   json_string_value(name));
	return 0;
}

/* tools and tool_choice. */
static int check_tools(const json_t *root, struct fcgi_chat_request *out, struct fcgi_error *err)
{
	const json_t *tools = json_object_get(root, "tools"), *t;
	size_t i;

	if (tools && !json_is_null(tools)) {
		if (!json_is_array(tools) || json_array_size(tools) > FCGI_MAX_TOOLS)
			return bad(err, "tools",
				   "tools must be an array of up to %d function tools",
				   FCGI_MAX_TOOLS);
		json_array_foreach(tools, i, t)
			if (check_tool(tools, i, t, err))
				return -1;
		if (json_array_size(tools))
			out->tools = tools;
	}
	return check_tool_choice(json_object_get(root, "tool_choice"), out, err);
}

bool fcgi_format_satisfied(enum prov_format format, const char *text, size_t len)
{
	json_error_t jerr;
	json_t *v;
	bool ok;

	if (format == PROV_FORMAT_TEXT)
		return true;
	v = json_loadb(text, len, JSON_DECODE_ANY, &jerr);
	ok = v && (format != PROV_FORMAT_JSON_OBJECT || json_is_object(v));
	json_decref(v);
	return ok;
}

/* stream and stream_options. */
static int check_stream(const json_t *root, struct fcgi_chat_request *out, struct fcgi_error *err)
{
	const json_t *v = json_object_get(root, "stream"), *so;

	if (v && !json_is_null(v) && !json_is_boolean(v))
		return bad(err, "stream", "stream must be a boolean");
	out->stream = json_is_true(v);
	so = json_object_get(root, "stream_options");
	if (!so || json_is_null(so))
		return 0;
	if (!json_is_object(so))
		return bad(err, "stream_options", "stream_options must be an object");
	v = json_object_get(so, "include_usage");
	if (v && !json_is_null(v) && !json_is_boolean(v))
		return bad(err, "stream_options.include_usage",
			   "stream_options.include_usage must be a boolean");
	out->include_usage = json_is_true(v);
	return 0;
}

int fcgi_chat_parse(const char *body, size_t len, struct fcgi_chat_request *out,
		    struct fcgi_error *err)
{
	json_error_t jerr;
	json_t *root;

	memset(out, 0, sizeof(*out));
	root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
	if (!root)
		return bad(err, "", "Invalid JSON body: %s (line %d, column %d)", jerr.text,
			   jerr.line, jerr.column);
	return fcgi_chat_parse_json(root, out, err);
}

int fcgi_chat_parse_json(json_t *root, struct fcgi_chat_request *out, struct fcgi_error *err)
{
	json_t *v;

	memset(out, 0, sizeof(*out));
	out->root = root;
	if (!json_is_object(root)) {
		bad(err, "", "Request body must be a JSON object");
		goto fail_release_req;
	}
	v = json_object_get(root, "model");
	if (!json_is_string(v) || !json_string_length(v) ||
	    strlen(json_string_value(v)) != json_string_length(v)) {
		bad(err, "model", "model must be a non-empty string");
		goto fail_release_req;
	}
	out->model = json_string_value(v);
	out->messages = json_object_get(root, "messages");
	if (fcgi_fields_check(root, fields, FCGI_FIELDS_CHAT, err) ||
	    check_messages(out->messages, out, err) || check_defaults(root, err) ||
	    check_format(root, out, err) || check_tools(root, out, err) ||
	    check_max_tokens(root, "max_tokens", &out->max_tokens, err) ||
	    check_max_tokens(root, "max_completion_tokens", &out->max_tokens, err) ||
	    check_number_range(root, "temperature", 0, 2, err) ||
	    check_number_range(root, "top_p", 0, 1, err) || check_stop(root, err))
		goto fail_release_req;
	out->stop = json_object_get(root, "stop");
	if (json_is_null(out->stop))
		out->stop = NULL;
	if (check_stream(root, out, err))
		goto fail_release_req;
	return 0;
fail_release_req:
	fcgi_chat_release(out);
	return -1;
}

void fcgi_chat_release(struct fcgi_chat_request *req)
{
	json_decref(req->root);
	memset(req, 0, sizeof(*req));
}

/* ---- answers --------------------------------------------------------------------------- */

void fcgi_completion_init(struct fcgi_completion *m, const char *model)
{
	char hex[25];

	random_hex(hex, 12);
	snprintf(m->id, sizeof(m->id), "chatcmpl-%s", hex);
	m->created = (int64_t)time(NULL);
	m->model = model;
	m->warning = NULL;
}

static void meta_head(struct buf *out, const struct fcgi_completion *m, const char *object)
{
	buf_addf(out, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", m->id, object,
		 (long long)m->created);
	buf_add_json_str(out, m->model, strlen(m->model));
}

static void add_warning(struct buf *out, const struct fcgi_completion *m)
{
	if (!m->warning)
		return;
	buf_adds(out, ",\"olp_warning\":");
	buf_add_json_str(out, m->warning, strlen(m->warning));
}

void fcgi_usage_json(struct buf *out, const struct prov_usage *u)
{
	if (!u || !u->present) {
		buf_adds(out, "null");
		return;
	}
	buf_addf(out,
		 "{\"prompt_tokens\":%lld,\"completion_tokens\":%lld,\"total_tokens\":%lld,"
		 "\"prompt_tokens_details\":{\"cached_tokens\":%lld}}",
		 (long long)u->prompt_tokens, (long long)u->completion_tokens,
		 (long long)u->total_tokens, (long long)u->cached_tokens);
}

void fcgi_sse_chunk(struct buf *out, const struct fcgi_completion *m, const char *role,
		    const char *content, size_t len, const char *finish_reason)
{
	buf_adds(out, "data: ");
	meta_head(out, m, "chat.completion.chunk");
	buf_adds(out, ",\"choices\":[{\"index\":0,\"delta\":{");
	if (role) {
		buf_adds(out, "\"role\":");
		buf_add_json_str(out, role, strlen(role));
	}
	if (content) {
		buf_adds(out, role ? ",\"content\":" : "\"content\":");
		buf_add_json_str(out, content, len);
	}
	buf_adds(out, "},\"finish_reason\":");
	if (finish_reason)
		buf_add_json_str(out, finish_reason, strlen(finish_reason));
	else
		buf_adds(out, "null");
	buf_adds(out, "}]");
	if (finish_reason)
		add_warning(out, m);
	buf_adds(out, "}\n\n");
}

void fcgi_sse_tool_call(struct buf *out, const struct fcgi_completion *m, bool first,
			unsigned index, const char *id, const char *name, const char *args,
			size_t len)
{
	buf_adds(out, "data: ");
	meta_head(out, m, "chat.completion.chunk");
	buf_adds(out, ",\"choices\":[{\"index\":0,\"delta\":{");
	if (first)
		buf_adds(out, "\"role\":\"assistant\",");
	buf_addf(out, "\"tool_calls\":[{\"index\":%u,", index);
	if (id) {
		buf_adds(out, "\"id\":");
		buf_add_json_str(out, id, strlen(id));
		buf_adds(out, ",\"type\":\"function\",");
	}
	buf_adds(out, "\"function\":{");
	if (name) {
		buf_adds(out, "\"name\":");
		buf_add_json_str(out, name, strlen(name));
		buf_addch(out, ',');
	}
	buf_adds(out, "\"arguments\":");
	buf_add_json_str(out, args ? args : "", args ? len : 0);
	buf_adds(out, "}}]},\"finish_reason\":null}]}\n\n");
}

void fcgi_sse_usage(struct buf *out, const struct fcgi_completion *m, const struct prov_usage *u)
{
	buf_adds(out, "data: ");
	meta_head(out, m, "chat.completion.chunk");
	buf_adds(out, ",\"choices\":[],\"usage\":");
	fcgi_usage_json(out, u);
	buf_adds(out, "}\n\n");
}

void fcgi_sse_done(struct buf *out)
{
	buf_adds(out, "data: [DONE]\n\n");
}

void fcgi_completion_json(struct buf *out, const struct fcgi_completion *m, const char *content,
			  size_t len, const char *finish_reason, const struct prov_usage *u)
{
	fcgi_completion_json_calls(out, m, content, len, NULL, 0, finish_reason, u);
}

void fcgi_completion_json_calls(struct buf *out, const struct fcgi_completion *m,
				const char *content, size_t len, const struct fcgi_tool_call *calls,
				size_t ncalls, const char *finish_reason,
				const struct prov_usage *u)
{
	meta_head(out, m, "chat.completion");
	buf_adds(out,
		 ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
	/* With calls and no text, content is null, as OpenAI sends it. */
	if (ncalls && !len)
		buf_adds(out, "null");
	else
		buf_add_json_str(out, content, len);
	if (ncalls) {
		buf_adds(out, ",\"tool_calls\":[");
		for (size_t i = 0; i < ncalls; i++) {
			buf_adds(out, i ? ",{\"id\":" : "{\"id\":");
			buf_add_json_str(out, calls[i].id, strlen(calls[i].id));
			buf_adds(out, ",\"type\":\"function\",\"function\":{\"name\":");
			buf_add_json_str(out, calls[i].name, strlen(calls[i].name));
			buf_adds(out, ",\"arguments\":");
			buf_add_json_str(out, calls[i].args, calls[i].args_len);
			buf_adds(out, "}}");
		}
		buf_addch(out, ']');
	}
	buf_adds(out, "},\"finish_reason\":");
	buf_add_json_str(out, finish_reason, strlen(finish_reason));
	buf_adds(out, "}]");
	if (u && u->present) {
		buf_adds(out, ",\"usage\":");
		fcgi_usage_json(out, u);
	}
	add_warning(out, m);
	buf_addch(out, '}');
}
