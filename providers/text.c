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

/* Where the text flattened so far goes when an image part interrupts it. */
struct flat {
	struct buf *out;
	json_t *blocks; /* NULL: images are left out */
};

static void flush_text(struct flat *f)
{
	json_t *b;

	if (!f->blocks || !f->out->len)
		return;
	b = json_pack("{s:s, s:s%}", "type", "text", "text", f->out->data, f->out->len);
	if (!b || json_array_append_new(f->blocks, b))
		abort(); /* jansson's allocation failed */
	buf_reset(f->out);
}

/* An image part (a checked data: URL) as an Anthropic image block. */
static void add_image(struct flat *f, const json_t *part)
{
	const char *url =
		json_string_value(json_object_get(json_object_get(part, "image_url"), "url"));
	const char *semi = url ? strchr(url, ';') : NULL, *comma = url ? strchr(url, ',') : NULL;
	json_t *b;

	if (!f->blocks || !semi || !comma || strncmp(url, "data:", 5))
		return;
	flush_text(f);
	b = json_pack("{s:s, s:{s:s, s:s%, s:s}}", "type", "image", "source", "type", "base64",
		      "media_type", url + 5, (size_t)(semi - url - 5), "data", comma + 1);
	if (!b || json_array_append_new(f->blocks, b))
		abort();
}

/* A message's content: a string, an array of parts (text parts joined by a newline; an
 * image part cuts the text, see prov_flatten_blocks), or null. prefix goes before the
 * first text. */
static void content_flat(struct flat *f, const json_t *content, const char *prefix)
{
	size_t i;
	const json_t *part;
	bool first = true;

	if (json_is_string(content)) {
		if (!json_string_length(content))
			return;
		if (f->out->len)
			buf_adds(f->out, "\n\n");
		buf_adds(f->out, prefix);
		buf_add(f->out, json_string_value(content), json_string_length(content));
		return;
	}
	if (!json_is_array(content))
		return;
	json_array_foreach(content, i, part) {
		const json_t *text = json_object_get(part, "text");
		const char *type = json_string_value(json_object_get(part, "type"));

		if (json_is_string(part))
			text = part;
		if (type && !strcmp(type, "image_url")) {
			add_image(f, part);
			continue;
		}
		if (!json_is_string(text) || !json_string_length(text))
			continue;
		if (first && f->out->len)
			buf_adds(f->out, "\n\n");
		else if (!first && f->out->len)
			buf_addch(f->out, '\n');
		if (first)
			buf_adds(f->out, prefix);
		buf_add(f->out, json_string_value(text), json_string_length(text));
		first = false;
	}
}

/* The function name of the assistant's earlier call with this id, or NULL. */
static const char *call_name(const json_t *messages, size_t before, const char *id)
{
	const json_t *msg, *call;
	size_t i, j;

	if (!id)
		return NULL;
	json_array_foreach(messages, i, msg) {
		if (i >= before)
			break;
		json_array_foreach(json_object_get(msg, "tool_calls"), j, call) {
			const char *cid = json_string_value(json_object_get(call, "id"));

			if (cid && !strcmp(cid, id))
				return json_string_value(
					json_object_get(json_object_get(call, "function"), "name"));
		}
	}
	return NULL;
}

/* An assistant's tool_calls, as text the model reads as its own earlier calls. */
static void calls_flat(struct flat *f, const json_t *calls)
{
	const json_t *call;
	size_t i;

	json_array_foreach(calls, i, call) {
		const json_t *fn = json_object_get(call, "function");
		const char *name = json_string_value(json_object_get(fn, "name"));
		const char *id = json_string_value(json_object_get(call, "id"));
		const json_t *args = json_object_get(fn, "arguments");

		if (f->out->len)
			buf_adds(f->out, "\n\n");
		buf_addf(f->out, "[Assistant called tool %s", name ? name : "?");
		if (id)
			buf_addf(f->out, " (id %s)", id);
		buf_adds(f->out, " with arguments: ");
		if (json_is_string(args))
			buf_add(f->out, json_string_value(args), json_string_length(args));
		buf_addch(f->out, ']');
	}
}

static void flatten(const json_t *messages, struct flat *f)
{
	struct buf prefix = BUF_INIT;
	const json_t *msg;
	size_t i;

	json_array_foreach(messages, i, msg) {
		const char *role = json_string_value(json_object_get(msg, "role"));

		if (!role)
			continue;
		buf_reset(&prefix);
		if (!strcmp(role, "system") || !strcmp(role, "developer")) {
			buf_adds(&prefix, "[System] ");
		} else if (!strcmp(role, "assistant")) {
			buf_adds(&prefix, "[Assistant] ");
		} else if (!strcmp(role, "tool") || !strcmp(role, "function")) {
			const char *id = json_string_value(json_object_get(msg, "tool_call_id"));
			const char *name = json_string_value(json_object_get(msg, "name"));

			if (!name)
				name = call_name(messages, i, id);
			if (name && id)
				buf_addf(&prefix, "[Tool Result (%s, id %s)] ", name, id);
			else
				buf_addf(&prefix, "[Tool Result (%s)] ",
					 name ? name
					 : id ? id
					      : "tool");
		}
		content_flat(f, json_object_get(msg, "content"), prefix.data);
		if (!strcmp(role, "assistant"))
			calls_flat(f, json_object_get(msg, "tool_calls"));
	}
	buf_release(&prefix);
}

void prov_flatten_messages(const json_t *messages, struct buf *out)
{
	struct flat f = { .out = out };

	flatten(messages, &f);
}

void prov_flatten_blocks(const json_t *messages, json_t *blocks)
{
	struct buf text = BUF_INIT;
	struct flat f = { .out = &text, .blocks = blocks };

	flatten(messages, &f);
	flush_text(&f);
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
