/* Plain-text output → delta events, and prompt flattening. */
#include <stdlib.h>
#include <string.h>

#include "providers/internal.h"
#include "common/banned.h"

/* Expected length of a UTF-8 sequence from its lead byte; 1 for ASCII and stray bytes. */
static size_t utf8_len(unsigned char c)
{
	if (c >= 0xf0 && c <= 0xf4)
		return 4;
	if (c >= 0xe0 && c < 0xf0)
		return 3;
	if (c >= 0xc2 && c < 0xe0)
		return 2;
	return 1;
}

/* How many bytes at the end of p[0..n) start a sequence that is not complete yet. */
static size_t incomplete_tail(const unsigned char *p, size_t n)
{
	size_t back;

	for (back = 1; back <= 3 && back <= n; back++) {
		unsigned char c = p[n - back];

		if ((c & 0xc0) == 0x80)
			continue; /* a continuation byte: keep looking for its lead */
		return utf8_len(c) > back ? back : 0;
	}
	return 0;
}

static int emit_delta(const struct prov_sink *sink, const char *text, size_t len)
{
	struct prov_event ev = { .kind = PROV_EV_DELTA, .text = text, .len = len };

	return len ? sink->emit(sink->ctx, &ev) : 0;
}

int prov_text_feed(struct prov_text_reader *tr, const char *data, size_t len,
		   const struct prov_sink *sink)
{
	const unsigned char *p = (const unsigned char *)data;
	size_t hold;
	int ret;

	if (tr->nheld) {
		/* Complete the held sequence from the front of data, with continuation bytes
		 * only: anything else means it was never going to be valid, and it goes out
		 * as it is (the encoder replaces it) without swallowing what follows. */
		size_t need = utf8_len(tr->held[0]) - tr->nheld, take = 0;
		unsigned char seq[4];

		memcpy(seq, tr->held, tr->nheld);
		while (take < need && take < len && (p[take] & 0xc0) == 0x80) {
			seq[tr->nheld + take] = p[take];
			take++;
		}
		if (take < need && take == len) {
			memcpy(tr->held, seq, tr->nheld + take);
			tr->nheld += take;
			return 0;
		}
		if ((ret = emit_delta(sink, (const char *)seq, tr->nheld + take)))
			return ret;
		tr->nheld = 0;
		p += take;
		len -= take;
	}
	hold = incomplete_tail(p, len);
	if ((ret = emit_delta(sink, (const char *)p, len - hold)))
		return ret;
	memcpy(tr->held, p + len - hold, hold);
	tr->nheld = hold;
	return 0;
}

int prov_text_finish(struct prov_text_reader *tr, const struct prov_sink *sink)
{
	size_t n = tr->nheld;

	/* A truncated sequence at the very end: pass it on; the encoder replaces it. */
	tr->nheld = 0;
	return emit_delta(sink, (const char *)tr->held, n);
}

/* ---- prompt flattening --------------------------------------------------------------- */

/* The text of a message's content: a string, an array of parts (text parts joined by a
 * newline; other part types have no text form here), or null. */
static void content_text(const json_t *content, struct buf *out)
{
	size_t i;
	const json_t *part;
	bool first = true;

	if (json_is_string(content)) {
		buf_add(out, json_string_value(content), json_string_length(content));
		return;
	}
	if (!json_is_array(content))
		return;
	json_array_foreach(content, i, part) {
		const json_t *text = json_object_get(part, "text");

		if (json_is_string(part))
			text = part;
		if (!json_is_string(text))
			continue;
		if (!first)
			buf_addch(out, '\n');
		buf_add(out, json_string_value(text), json_string_length(text));
		first = false;
	}
}

void prov_flatten_messages(const json_t *messages, struct buf *out)
{
	struct buf text = BUF_INIT;
	const json_t *msg;
	size_t i;

	json_array_foreach(messages, i, msg) {
		const char *role = json_string_value(json_object_get(msg, "role"));

		buf_reset(&text);
		content_text(json_object_get(msg, "content"), &text);
		if (!role || !text.len)
			continue;
		if (out->len)
			buf_adds(out, "\n\n");
		if (!strcmp(role, "system") || !strcmp(role, "developer")) {
			buf_adds(out, "[System] ");
		} else if (!strcmp(role, "assistant")) {
			buf_adds(out, "[Assistant] ");
		} else if (!strcmp(role, "tool") || !strcmp(role, "function")) {
			const char *name = json_string_value(json_object_get(msg, "name"));

			if (!name)
				name = json_string_value(json_object_get(msg, "tool_call_id"));
			buf_addf(out, "[Tool Result (%s)] ", name ? name : "tool");
		}
		buf_add(out, text.data, text.len);
	}
	buf_release(&text);
}

/* ---- response_format ------------------------------------------------------------------ */

static const char json_only[] =
	"Respond with one valid JSON object and nothing else: no text before or after it, "
	"no Markdown code fences. The whole reply must parse as JSON.";

json_t *prov_format_messages(const json_t *messages, enum prov_format format, const json_t *schema)
{
	struct buf text = BUF_INIT;
	json_t *out, *msg;

	if (format == PROV_FORMAT_TEXT)
		return json_incref((json_t *)messages);
	buf_adds(&text, json_only);
	if (format == PROV_FORMAT_JSON_SCHEMA) {
		const json_t *body = json_object_get(schema, "schema");
		const char *name = json_string_value(json_object_get(schema, "name"));
		const char *desc = json_string_value(json_object_get(schema, "description"));
		char *dump = body ? json_dumps(body, JSON_COMPACT) : NULL;

		if (name)
			buf_addf(&text, " The JSON describes \"%s\"", name);
		if (name && desc)
			buf_addf(&text, " (%s)", desc);
		if (name)
			buf_addch(&text, '.');
		if (dump) {
			buf_adds(&text, " It must conform to this JSON Schema:\n");
			buf_adds(&text, dump);
			free(dump);
		} else if (body) {
			abort(); /* json_dumps fails only when out of memory: one OOM policy */
		}
	}
	out = json_copy((json_t *)messages); /* shallow: the messages themselves are shared */
	msg = json_pack("{s:s, s:s%}", "role", "system", "content", text.data, text.len);
	if (!out || !msg || json_array_append_new(out, msg))
		abort();
	buf_release(&text);
	return out;
}
