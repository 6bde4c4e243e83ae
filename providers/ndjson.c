/* The NDJSON line framer and the JSON helpers the line-based parsers share. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "providers/providers.h"
#include "providers/ndjson.h"
#include "common/banned.h"

void prov_ndjson_init(struct prov_ndjson *nj, size_t max_line)
{
	memset(nj, 0, sizeof(*nj));
	buf_init(&nj->partial);
	nj->max_line = max_line ? max_line : PROV_NDJSON_MAX_LINE;
}

void prov_ndjson_release(struct prov_ndjson *nj)
{
	buf_release(&nj->partial);
}

static int deliver(struct prov_ndjson *nj, const char *line, size_t len, prov_ndjson_line_fn fn,
		   void *ctx)
{
	if (len && line[len - 1] == '\r')
		len--;
	if (!len)
		return 0;
	nj->lines++;
	return fn(ctx, line, len);
}

int prov_ndjson_feed(struct prov_ndjson *nj, const char *data, size_t len, prov_ndjson_line_fn fn,
		     void *ctx)
{
	const char *end = data + len, *nl;
	int ret;

	while (!nj->overlong && data < end) {
		nl = memchr(data, '\n', (size_t)(end - data));
		if (!nl) {
			/* No end of line yet: keep the piece, within the bound. */
			if (nj->partial.len + (size_t)(end - data) > nj->max_line) {
				nj->overlong = true;
				buf_release(&nj->partial);
				return 0;
			}
			buf_add(&nj->partial, data, (size_t)(end - data));
			return 0;
		}
		if (nj->partial.len + (size_t)(nl - data) > nj->max_line) {
			nj->overlong = true;
			buf_release(&nj->partial);
			return 0;
		}
		if (nj->partial.len) {
			/* The line began in an earlier read: complete it in the buffer. */
			buf_add(&nj->partial, data, (size_t)(nl - data));
			ret = deliver(nj, nj->partial.data, nj->partial.len, fn, ctx);
			buf_reset(&nj->partial);
		} else {
			/* The common case: a whole line inside this read, no copy. */
			ret = deliver(nj, data, (size_t)(nl - data), fn, ctx);
		}
		if (ret)
			return ret;
		data = nl + 1;
	}
	return 0;
}

int prov_ndjson_finish(struct prov_ndjson *nj, prov_ndjson_line_fn fn, void *ctx)
{
	int ret = 0;

	if (!nj->overlong && nj->partial.len)
		ret = deliver(nj, nj->partial.data, nj->partial.len, fn, ctx);
	buf_reset(&nj->partial);
	return ret;
}

json_t *prov_json_object(const char *line, size_t len)
{
	json_t *v;

	/* Cheap refusal of plain-text lines before the parser runs. */
	while (len && (*line == ' ' || *line == '\t')) {
		line++;
		len--;
	}
	if (!len || *line != '{')
		return NULL;
	v = json_loadb(line, len, JSON_REJECT_DUPLICATES, NULL);
	if (v && !json_is_object(v)) {
		json_decref(v);
		v = NULL;
	}
	return v;
}

const char *prov_json_str(const json_t *obj, const char *key)
{
	return json_string_value(json_object_get(obj, key));
}

int64_t prov_json_count(const json_t *obj, const char *key, int64_t dflt)
{
	int64_t v;

	return parse_json_int(json_object_get(obj, key), 0, PROV_MAX_COUNT, &v) ? dflt : v;
}

int prov_json_status(const json_t *obj, const char *key, int dflt)
{
	int64_t v;

	return parse_json_int(json_object_get(obj, key), 100, 599, &v) ? dflt : (int)v;
}

int prov_emit_delta(const struct prov_sink *sink, const char *text, size_t len)
{
	struct prov_event ev = { .kind = PROV_EV_DELTA, .text = text, .len = len };

	return len ? sink->emit(sink->ctx, &ev) : 0;
}

int prov_emit_usage(const struct prov_sink *sink, const struct prov_usage *u)
{
	struct prov_event ev = { .kind = PROV_EV_USAGE, .usage = u };

	return sink->emit(sink->ctx, &ev);
}

int prov_emit_finish(const struct prov_sink *sink, const char *finish_reason)
{
	struct prov_event ev = { .kind = PROV_EV_FINISH, .finish_reason = finish_reason };

	return sink->emit(sink->ctx, &ev);
}

int prov_emit_failure(const struct prov_sink *sink, enum prov_error err, int upstream_status,
		      const char *message)
{
	struct prov_failure f = { .err = err,
				  .upstream_status = upstream_status,
				  .message = message };
	struct prov_event ev = { .kind = PROV_EV_ERROR, .failure = &f };

	return sink->emit(sink->ctx, &ev);
}

int prov_find_status(const char *msg)
{
	const char *p = msg;

	while (p && (p = strstr(p, "status"))) {
		int st = 0, digits = 0;

		p += 6;
		while (*p == ' ' || *p == ':' || *p == '=')
			p++;
		while (*p >= '0' && *p <= '9' && digits < 4) {
			st = st * 10 + (*p++ - '0');
			digits++;
		}
		if (digits == 3 && st >= 100 && st <= 599)
			return st;
	}
	return 0;
}

const char *prov_upstream_text(int status)
{
	switch (status) {
	case 0: return "the provider reported an error";
	case 400: return "the upstream API refused the request as invalid (400)";
	case 401: return "the upstream API rejected the provider's credentials (401)";
	case 403: return "the upstream API denied access (403)";
	case 404: return "the upstream API does not know the model (404)";
	case 413: return "the request is too large for the upstream API (413)";
	case 429: return "the upstream API rate-limited the request (429); retry later";
	case 503:
	case 529: return "the upstream API is overloaded; retry later";
	default:
		return status >= 500 ? "the upstream API failed (5xx)"
				     : "the upstream API refused the request";
	}
}

void prov_lines_init(struct prov_lines *pl)
{
	memset(pl, 0, sizeof(*pl));
	prov_ndjson_init(&pl->nj, 0);
}

void prov_lines_release(struct prov_lines *pl)
{
	prov_ndjson_release(&pl->nj);
}

/* A line too long to frame ends the answer with an error the client can act on. */
static int overlong(struct prov_lines *pl, const struct prov_sink *sink)
{
	char msg[96];
	int ret;

	pl->done = true;
	snprintf(msg, sizeof(msg),
		 "the provider wrote an output line longer than the limit (%zu MiB)",
		 pl->nj.max_line >> 20);
	ret = prov_emit_failure(sink, PROV_ERR_PROVIDER_ERROR, 0, msg);
	return ret < 0 ? ret : 1;
}

int prov_lines_feed(struct prov_lines *pl, const char *data, size_t len,
		    const struct prov_sink *sink, prov_ndjson_line_fn line_fn, void *ctx)
{
	int ret;

	if (pl->done)
		return 1;
	pl->sink = sink;
	ret = prov_ndjson_feed(&pl->nj, data, len, line_fn, ctx);
	pl->sink = NULL;
	if (ret > 0)
		pl->done = true;
	if (!ret && pl->nj.overlong)
		ret = overlong(pl, sink);
	return ret;
}

int prov_lines_finish(struct prov_lines *pl, const struct prov_sink *sink,
		      prov_ndjson_line_fn line_fn, void *ctx)
{
	int ret;

	if (pl->done)
		return 0;
	pl->sink = sink;
	ret = prov_ndjson_finish(&pl->nj, line_fn, ctx);
	pl->sink = NULL;
	if (ret > 0)
		pl->done = true;
	return ret < 0 ? ret : 0;
}
