/* CUnit suite for providers/ through providers.h: prompt flattening, the command
 * provider's incremental text reader (whole, byte by byte, split at every position, with
 * multibyte UTF-8), and the models registry loaded from temporary files. Nothing here
 * spawns a process. */
#include "tests/support/cunit.h"
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "providers/providers.h"
#include "tests/support/support.h"
#include "common/banned.h"

static char tmpdir[] = "/tmp/olp-prov-test-XXXXXX";

static json_t *parse(const char *text)
{
	json_error_t jerr;
	json_t *v = json_loads(text, 0, &jerr);

	if (!v)
		fprintf(stderr, "bad test JSON: %s: %s\n", jerr.text, text);
	CU_ASSERT_PTR_NOT_NULL_FATAL(v);
	return v;
}

/* ---- prov_flatten_messages ------------------------------------------------------------- */

static void test_flatten(void)
{
	static const struct {
		const char *messages;
		const char *prompt;
	} cases[] = {
		{ "[]", "" },
		{ "[{\"role\":\"user\",\"content\":\"hi\"}]", "hi" },
		{ "[{\"role\":\"system\",\"content\":\"be "
		  "brief\"},{\"role\":\"user\",\"content\":\"hi\"}]",
		  "[System] be brief\n\nhi" },
		{ "[{\"role\":\"developer\",\"content\":\"rules\"}]", "[System] rules" },
		{ "[{\"role\":\"assistant\",\"content\":\"sure\"}]", "[Assistant] sure" },
		{ "[{\"role\":\"user\",\"content\":\"q1\"},{\"role\":\"assistant\",\"content\":"
		  "\"a1\"},"
		  "{\"role\":\"user\",\"content\":\"q2\"}]",
		  "q1\n\n[Assistant] a1\n\nq2" },
		/* tool results: name, else tool_call_id, else "tool" */
		{ "[{\"role\":\"tool\",\"name\":\"get_weather\",\"tool_call_id\":\"call_1\","
		  "\"content\":\"sunny\"}]",
		  "[Tool Result (get_weather, id call_1)] sunny" },
		/* an assistant's calls as text; a result named after its call */
		{ "[{\"role\":\"user\",\"content\":\"weather?\"},{\"role\":\"assistant\","
		  "\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
		  "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":"
		  "\\\"Paris\\\"}\"}},{\"id\":\"c2\",\"type\":\"function\",\"function\":"
		  "{\"name\":\"get_time\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\","
		  "\"tool_call_id\":\"c2\",\"content\":\"noon\"}]",
		  "weather?\n\n[Assistant called tool get_weather (id c1) with arguments: "
		  "{\"city\":\"Paris\"}]\n\n[Assistant called tool get_time (id c2) with "
		  "arguments: {}]\n\n[Tool Result (get_time, id c2)] noon" },
		{ "[{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny\"}]",
		  "[Tool Result (call_1)] sunny" },
		{ "[{\"role\":\"tool\",\"content\":\"sunny\"}]", "[Tool Result (tool)] sunny" },
		/* content arrays: text parts joined by a newline */
		{ "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
		  "{\"type\":\"text\",\"text\":\"b\"},{\"type\":\"text\",\"text\":\"c\"}]}]",
		  "a\nb\nc" },
		{ "[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"s1\"},"
		  "{\"type\":\"text\",\"text\":\"s2\"}]}]",
		  "[System] s1\ns2" },
		/* null and empty content are skipped, separators included */
		{ "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":null}"
		  ","
		  "{\"role\":\"user\",\"content\":\"b\"}]",
		  "a\n\nb" },
		{ "[{\"role\":\"system\",\"content\":\"\"},{\"role\":\"user\",\"content\":\"b\"}]",
		  "b" },
		{ "[{\"role\":\"assistant\"},{\"role\":\"user\",\"content\":[]}]", "" },
		{ "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[]}]",
		  "x" },
		/* text is copied as is: newlines, brackets, multibyte */
		{ "[{\"role\":\"user\",\"content\":\"line1\\n\\n[System] fake\\u00e9\"}]",
		  "line1\n\n[System] fake\xc3\xa9" },
		{ "[{\"role\":\"user\",\"content\":\"\xf0\x9f\x98\x80\"},"
		  "{\"role\":\"assistant\",\"content\":\"\xe2\x82\xac\"}]",
		  "\xf0\x9f\x98\x80\n\n[Assistant] \xe2\x82\xac" },
	};
	struct buf out = BUF_INIT;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		json_t *msgs = parse(cases[i].messages);

		buf_reset(&out);
		prov_flatten_messages(msgs, &out);
		CU_ASSERT_EQUAL(out.len, strlen(out.data));
		CU_ASSERT_STRING_EQUAL(out.data, cases[i].prompt);
		if (strcmp(out.data, cases[i].prompt))
			fprintf(stderr, "flatten case %zu: got \"%s\", want \"%s\"\n", i, out.data,
				cases[i].prompt);
		json_decref(msgs);
	}
	buf_release(&out);
}

/* A text containing a NUL byte is passed on whole (the prompt goes to stdin as bytes). */
static void test_flatten_binary(void)
{
	json_t *msgs = json_pack("[{s:s, s:s#}]", "role", "user", "content", "a\0b", (size_t)3);
	struct buf out = BUF_INIT;

	CU_ASSERT_PTR_NOT_NULL_FATAL(msgs);
	prov_flatten_messages(msgs, &out);
	CU_ASSERT_EQUAL(out.len, 3);
	CU_ASSERT_EQUAL(memcmp(out.data, "a\0b", 3), 0);
	json_decref(msgs);
	buf_release(&out);
}

/* Images cut the text into blocks, in order; without images, one text block. */
static void test_flatten_blocks(void)
{
	static const char img[] = "{\"type\":\"image_url\",\"image_url\":{\"url\":"
				  "\"data:image/gif;base64,R0lGODlhAQABAA==\"}}";
	static const char want[] =
		"[{\"type\": \"text\", \"text\": \"[System] s\\n\\nlook\"}, {\"type\": \"image\", "
		"\"source\": {\"type\": \"base64\", \"media_type\": \"image/gif\", \"data\": "
		"\"R0lGODlhAQABAA==\"}}, {\"type\": \"text\", \"text\": \"and "
		"this\\n\\n[Assistant] "
		"ok\"}]";
	struct buf in = BUF_INIT;
	json_t *msgs, *blocks = json_array();
	char *got;

	buf_addf(&in,
		 "[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":["
		 "{\"type\":\"text\",\"text\":\"look\"},%s,{\"type\":\"text\",\"text\":"
		 "\"and this\"}]},{\"role\":\"assistant\",\"content\":\"ok\"}]",
		 img);
	msgs = parse(in.data);
	prov_flatten_blocks(msgs, blocks);
	got = json_dumps(blocks, JSON_PRESERVE_ORDER);
	CU_ASSERT_STRING_EQUAL(got, want);
	if (strcmp(got, want))
		fprintf(stderr, "blocks: %s\n", got);
	free(got);
	/* The text form leaves the image out. */
	buf_reset(&in);
	prov_flatten_messages(msgs, &in);
	CU_ASSERT_STRING_EQUAL(in.data, "[System] s\n\nlook\nand this\n\n[Assistant] ok");
	json_decref(msgs);
	json_decref(blocks);
	buf_release(&in);
}

/* response_format: one system message more, last; the schema in it. */
static void test_format_messages(void)
{
	json_t *msgs = parse("[{\"role\":\"user\",\"content\":\"q\"}]");
	json_t *schema = parse("{\"name\":\"pt\",\"schema\":{\"type\":\"object\"}}");
	json_t *same = prov_format_messages(msgs, PROV_FORMAT_TEXT, NULL);
	json_t *obj = prov_format_messages(msgs, PROV_FORMAT_JSON_OBJECT, NULL);
	json_t *sch = prov_format_messages(msgs, PROV_FORMAT_JSON_SCHEMA, schema);
	const char *t;

	CU_ASSERT_PTR_EQUAL(same, msgs);
	CU_ASSERT_EQUAL(json_array_size(msgs), 1); /* the client's array is left alone */
	CU_ASSERT_EQUAL(json_array_size(obj), 2);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(json_array_get(obj, 1), "role")),
			       "system");
	t = json_string_value(json_object_get(json_array_get(obj, 1), "content"));
	CU_ASSERT_PTR_NOT_NULL(strstr(t, "JSON object"));
	CU_ASSERT_PTR_NULL(strstr(t, "Schema"));
	t = json_string_value(json_object_get(json_array_get(sch, 1), "content"));
	CU_ASSERT_PTR_NOT_NULL(strstr(t, "\"pt\""));
	CU_ASSERT_PTR_NOT_NULL(strstr(t, "{\"type\":\"object\"}"));
	json_decref(same);
	json_decref(obj);
	json_decref(sch);
	json_decref(schema);
	json_decref(msgs);
}

/* ---- the command text reader ---------------------------------------------------------- */

struct collect {
	struct buf all; /* every delta, concatenated */
	size_t ndeltas;
	size_t bad_utf8;  /* deltas that are not valid UTF-8 by themselves */
	size_t empty;	  /* deltas of length 0 */
	size_t non_delta; /* events of another kind */
	int abort_at;	  /* return -abort_ret on this delta (1-based); 0 = never */
	int abort_ret;
};

static int collect_emit(void *ctx, const struct prov_event *ev)
{
	struct collect *c = ctx;

	if (ev->kind != PROV_EV_DELTA) {
		c->non_delta++;
		return 0;
	}
	c->ndeltas++;
	if (!ev->len)
		c->empty++;
	if (!ts_valid_utf8((const unsigned char *)ev->text, ev->len))
		c->bad_utf8++;
	buf_add(&c->all, ev->text, ev->len);
	if (c->abort_at && (int)c->ndeltas == c->abort_at)
		return -c->abort_ret;
	return 0;
}

static void collect_init(struct collect *c)
{
	memset(c, 0, sizeof(*c));
	buf_init(&c->all);
}

/* Feed text in pieces cut at cuts[0..ncuts) (ascending offsets), then finish. */
static void feed_cuts(const char *text, size_t len, const size_t *cuts, size_t ncuts,
		      struct collect *c)
{
	struct prov_parser *ps = prov_parser_new("command");
	struct prov_sink sink = { .emit = collect_emit, .ctx = c };
	size_t at = 0, i;

	CU_ASSERT_PTR_NOT_NULL_FATAL(ps);
	for (i = 0; i <= ncuts; i++) {
		size_t end = i < ncuts ? cuts[i] : len;

		CU_ASSERT_EQUAL(prov_parser_feed(ps, text + at, end - at, &sink), 0);
		at = end;
	}
	CU_ASSERT_EQUAL(prov_parser_finish(ps, &sink), 0);
	prov_parser_free(ps);
}

/* 1-, 2-, 3- and 4-byte characters next to each other and at both ends. */
static const char utf8_text[] =
	"\xf0\x9f\x98\x80 h\xc3\xa9llo \xe2\x82\xac 5, \xe4\xb8\xad\xe6\x96\x87 "
	"\xf0\x9d\x84\x9e\xc3\xa9\xe2\x9c\x93\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd!\n"
	"\xc2\xa0\xef\xbf\xbd\xf4\x8f\xbf\xbf\xe2\x80\x94\xf0\x9f\x98\x80";

static void check_collected(struct collect *c, const char *text, size_t len, bool valid_input,
			    const char *what)
{
	bool same = c->all.len == len && !memcmp(c->all.data, text, len);

	CU_ASSERT(same);
	if (valid_input)
		CU_ASSERT_EQUAL(c->bad_utf8, 0);
	CU_ASSERT_EQUAL(c->empty, 0);
	CU_ASSERT_EQUAL(c->non_delta, 0);
	if (!same || (valid_input && c->bad_utf8))
		fprintf(stderr, "%s: %zu deltas, %zu bytes (want %zu), %zu not UTF-8\n", what,
			c->ndeltas, c->all.len, len, c->bad_utf8);
	buf_release(&c->all);
}

static void test_text_whole(void)
{
	struct collect c;

	collect_init(&c);
	feed_cuts(utf8_text, sizeof(utf8_text) - 1, NULL, 0, &c);
	CU_ASSERT_EQUAL(c.ndeltas, 1); /* nothing held back: one delta */
	check_collected(&c, utf8_text, sizeof(utf8_text) - 1, true, "whole");
}

static void test_text_byte_by_byte(void)
{
	size_t len = sizeof(utf8_text) - 1, cuts[sizeof(utf8_text)], i;
	struct collect c;

	for (i = 0; i < len - 1; i++)
		cuts[i] = i + 1;
	collect_init(&c);
	feed_cuts(utf8_text, len, cuts, len - 1, &c);
	check_collected(&c, utf8_text, len, true, "byte by byte");
	/* One delta per character at most: multibyte ones are held until complete. */
	collect_init(&c);
	feed_cuts("\xf0\x9f\x98\x80\xe2\x82\xac", 7, (size_t[]){ 1, 2, 3, 4, 5, 6 }, 6, &c);
	CU_ASSERT_EQUAL(c.ndeltas, 2);
	check_collected(&c, "\xf0\x9f\x98\x80\xe2\x82\xac", 7, true, "two chars");
}

static void test_text_every_split(void)
{
	size_t len = sizeof(utf8_text) - 1, i, j;
	char what[64];

	/* Two pieces at every position, then three pieces at every pair of positions. */
	for (i = 0; i <= len; i++) {
		struct collect c;

		collect_init(&c);
		feed_cuts(utf8_text, len, &i, 1, &c);
		snprintf(what, sizeof(what), "split at %zu", i);
		check_collected(&c, utf8_text, len, true, what);
	}
	for (i = 0; i <= len; i++) {
		for (j = i; j <= len; j++) {
			struct collect c;
			size_t cuts[2] = { i, j };

			collect_init(&c);
			feed_cuts(utf8_text, len, cuts, 2, &c);
			snprintf(what, sizeof(what), "split at %zu,%zu", i, j);
			check_collected(&c, utf8_text, len, true, what);
		}
	}
}

/* A sequence cut off by the end of output is passed on at finish (the JSON encoder turns it
 * into U+FFFD); nothing is lost. */
static void test_text_truncated_tail(void)
{
	static const struct {
		const char *text;
		size_t len;
		size_t held; /* bytes only finish() gives back */
	} cases[] = {
		{ "ab\xc3", 3, 1 },
		{ "ab\xe2\x82", 4, 2 },
		{ "ab\xf0\x9f\x98", 5, 3 },
		{ "\xf0", 1, 1 },
	};
	size_t i, k;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		struct prov_parser *ps = prov_parser_new("command");
		struct collect c;
		struct prov_sink sink = { .emit = collect_emit, .ctx = &c };

		CU_ASSERT_PTR_NOT_NULL_FATAL(ps);
		collect_init(&c);
		CU_ASSERT_EQUAL(prov_parser_feed(ps, cases[i].text, cases[i].len, &sink), 0);
		CU_ASSERT_EQUAL(c.all.len, cases[i].len - cases[i].held);
		CU_ASSERT_EQUAL(prov_parser_finish(ps, &sink), 0);
		CU_ASSERT_EQUAL(c.all.len, cases[i].len);
		CU_ASSERT_EQUAL(memcmp(c.all.data, cases[i].text, cases[i].len), 0);
		/* Finishing twice gives nothing more. */
		CU_ASSERT_EQUAL(prov_parser_finish(ps, &sink), 0);
		CU_ASSERT_EQUAL(c.all.len, cases[i].len);
		buf_release(&c.all);
		prov_parser_free(ps);

		/* The same, byte by byte. */
		collect_init(&c);
		{
			size_t cuts[8];

			for (k = 0; k + 1 < cases[i].len; k++)
				cuts[k] = k + 1;
			feed_cuts(cases[i].text, cases[i].len, cuts, cases[i].len - 1, &c);
		}
		CU_ASSERT_EQUAL(c.all.len, cases[i].len);
		CU_ASSERT_EQUAL(memcmp(c.all.data, cases[i].text, cases[i].len), 0);
		buf_release(&c.all);
	}
}

/* Invalid input is not the reader's to fix: every byte still comes through, in order,
 * however it is cut. */
static void test_text_invalid_passthrough(void)
{
	static const char text[] = "a\xff"
				   "b\x80\x80"
				   "c\xe2(d\xf0\x9f"
				   "e\xc3\xa9\xed\xa0\x80z\xc3";
	size_t len = sizeof(text) - 1, i, j;

	for (i = 0; i <= len; i++) {
		for (j = i; j <= len; j++) {
			struct collect c;
			size_t cuts[2] = { i, j };

			collect_init(&c);
			feed_cuts(text, len, cuts, 2, &c);
			check_collected(&c, text, len, false, "invalid input");
		}
	}
}

/* A sink that does what the worker does with each delta (one SSE chunk, i.e. one JSON
 * string, per delta) and appends what a client decodes from it to ctx. */
static int client_emit(void *ctx, const struct prov_event *ev)
{
	struct buf enc = BUF_INIT;
	json_t *v;

	if (ev->kind != PROV_EV_DELTA || !ev->len)
		return 0;
	buf_add_json_str(&enc, ev->text, ev->len);
	v = json_loadb(enc.data, enc.len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
	CU_ASSERT_PTR_NOT_NULL(v);
	if (v)
		buf_add(ctx, json_string_value(v), json_string_length(v));
	json_decref(v);
	buf_release(&enc);
	return 0;
}

/* Feed text cut at cuts[] and collect what a client reads into seen. */
static void client_view(const char *text, size_t len, const size_t *cuts, size_t ncuts,
			struct buf *seen)
{
	struct prov_parser *ps = prov_parser_new("command");
	struct prov_sink sink = { .emit = client_emit, .ctx = seen };
	size_t at = 0, i;

	CU_ASSERT_PTR_NOT_NULL_FATAL(ps);
	buf_reset(seen);
	for (i = 0; i <= ncuts; i++) {
		size_t end = i < ncuts ? cuts[i] : len;

		CU_ASSERT_EQUAL(prov_parser_feed(ps, text + at, end - at, &sink), 0);
		at = end;
	}
	CU_ASSERT_EQUAL(prov_parser_finish(ps, &sink), 0);
	prov_parser_free(ps);
}

/* What a client reads must not depend on how the pipe happened to cut the output: a valid
 * character that follows an invalid byte must still arrive whole. */
static void test_text_split_invariant_after_invalid(void)
{
	static const struct {
		const char *text;
		size_t len;
	} cases[] = {
		{ "\xe2"
		  "a\xe2\x82\xac",
		  5 }, /* stray lead, then a euro sign */
		{ "\xf0\x9f"
		  "\xc3\xa9xyz",
		  7 }, /* cut emoji, then e-acute */
		{ "\xc3"
		  "\xf0\x9f\x98\x80!",
		  6 }, /* stray lead, then an emoji */
		{ "ok \xe2\x82"
		  " \xe4\xb8\xad\xe6\x96\x87",
		  12 },
	};
	struct buf whole = BUF_INIT, cut = BUF_INIT;
	size_t i, a, b;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		client_view(cases[i].text, cases[i].len, NULL, 0, &whole);
		for (a = 0; a <= cases[i].len; a++) {
			for (b = a; b <= cases[i].len; b++) {
				size_t cuts[2] = { a, b };
				bool same;

				client_view(cases[i].text, cases[i].len, cuts, 2, &cut);
				same = cut.len == whole.len &&
				       !memcmp(cut.data, whole.data, cut.len);
				CU_ASSERT(same);
				if (!same)
					fprintf(stderr,
						"text case %zu cut at %zu,%zu: client sees %zu "
						"bytes, %zu when fed whole\n",
						i, a, b, cut.len, whole.len);
			}
		}
	}
	buf_release(&whole);
	buf_release(&cut);
}

/* Empty feeds are harmless, also while a sequence is held. */
static void test_text_empty_feeds(void)
{
	struct prov_parser *ps = prov_parser_new("command");
	struct collect c;
	struct prov_sink sink = { .emit = collect_emit, .ctx = &c };

	CU_ASSERT_PTR_NOT_NULL_FATAL(ps);
	collect_init(&c);
	CU_ASSERT_EQUAL(prov_parser_feed(ps, "", 0, &sink), 0);
	CU_ASSERT_EQUAL(prov_parser_feed(ps, "x\xe2", 2, &sink), 0);
	CU_ASSERT_EQUAL(prov_parser_feed(ps, "", 0, &sink), 0);
	CU_ASSERT_EQUAL(prov_parser_feed(ps, "\x82", 1, &sink), 0);
	CU_ASSERT_EQUAL(prov_parser_feed(ps, "", 0, &sink), 0);
	CU_ASSERT_EQUAL(prov_parser_feed(ps, "\xac!", 2, &sink), 0);
	CU_ASSERT_EQUAL(prov_parser_finish(ps, &sink), 0);
	prov_parser_free(ps);
	check_collected(&c, "x\xe2\x82\xac!", 5, true, "empty feeds");
}

static void test_text_sink_abort(void)
{
	struct prov_parser *ps;
	struct collect c;
	struct prov_sink sink = { .emit = collect_emit, .ctx = &c };

	/* Abort on the first delta of a plain feed. */
	ps = prov_parser_new("command");
	CU_ASSERT_PTR_NOT_NULL_FATAL(ps);
	collect_init(&c);
	c.abort_at = 1;
	c.abort_ret = EPIPE;
	CU_ASSERT_EQUAL(prov_parser_feed(ps, "hello", 5, &sink), -EPIPE);
	prov_parser_free(ps);
	buf_release(&c.all);

	/* Abort on the delta that completes a held sequence: the rest is not emitted. */
	ps = prov_parser_new("command");
	collect_init(&c);
	c.abort_at = 2;
	c.abort_ret = 42;
	CU_ASSERT_EQUAL(prov_parser_feed(ps, "a\xe2\x82", 3, &sink), 0);
	CU_ASSERT_EQUAL(prov_parser_feed(ps, "\xac tail", 6, &sink), -42);
	CU_ASSERT_EQUAL(c.ndeltas, 2);
	CU_ASSERT_EQUAL(c.all.len, 4); /* "a" and the euro sign, not " tail" */
	prov_parser_free(ps);
	buf_release(&c.all);

	/* Abort on the delta finish() flushes. */
	ps = prov_parser_new("command");
	collect_init(&c);
	c.abort_at = 2;
	c.abort_ret = 7;
	CU_ASSERT_EQUAL(prov_parser_feed(ps, "a\xf0\x9f", 3, &sink), 0);
	CU_ASSERT_EQUAL(prov_parser_finish(ps, &sink), -7);
	prov_parser_free(ps);
	buf_release(&c.all);
}

/* ---- numbers in provider output --------------------------------------------------------- */

/* The usage and failure events of one whole output. */
struct numbers {
	struct prov_usage usage;
	int nusage;
	int status; /* upstream status of the failure event, -1 when there was none */
};

static int numbers_emit(void *ctx, const struct prov_event *ev)
{
	struct numbers *n = ctx;

	if (ev->kind == PROV_EV_USAGE) {
		n->usage = *ev->usage;
		n->nusage++;
	} else if (ev->kind == PROV_EV_ERROR) {
		n->status = ev->failure->upstream_status;
	}
	return 0;
}

static void feed_numbers(const char *type, const char *out, struct numbers *n)
{
	struct prov_parser *ps = prov_parser_new(type);
	struct prov_sink sink = { .emit = numbers_emit, .ctx = n };

	memset(n, 0, sizeof(*n));
	n->status = -1;
	CU_ASSERT_PTR_NOT_NULL_FATAL(ps);
	CU_ASSERT(prov_parser_feed(ps, out, strlen(out), &sink) >= 0);
	CU_ASSERT(prov_parser_finish(ps, &sink) >= 0);
	prov_parser_free(ps);
}

/* Token counts and statuses a provider prints are checked before they become integers:
 * 4e29 (which the fuzzer found: a double cast to int64_t, undefined behaviour), values
 * past INT64_MAX whose sums would overflow, negative and fractional counts, and statuses
 * that are no HTTP status all count as absent. */
static void test_parser_numbers(void)
{
	struct numbers n;

	feed_numbers("claude",
		     "{\"type\":\"result\",\"subtype\":\"success\",\"result\":\"hi\","
		     "\"usage\":{\"input_tokens\":4e29,\"output_tokens\":-3,"
		     "\"cache_read_input_tokens\":9223372036854775807,"
		     "\"cache_creation_input_tokens\":1.5}}\n",
		     &n);
	CU_ASSERT_EQUAL(n.nusage, 1);
	CU_ASSERT_EQUAL(n.usage.prompt_tokens, 0);
	CU_ASSERT_EQUAL(n.usage.completion_tokens, 0);
	CU_ASSERT_EQUAL(n.usage.total_tokens, 0);
	CU_ASSERT_EQUAL(n.usage.cached_tokens, 0);

	/* Integral reals are the integers they equal (a JSON producer may print 12.0). */
	feed_numbers("claude",
		     "{\"type\":\"result\",\"subtype\":\"success\",\"result\":\"hi\","
		     "\"usage\":{\"input_tokens\":12.0,\"output_tokens\":1e2,"
		     "\"cache_read_input_tokens\":3,\"cache_creation_input_tokens\":-4e29}}\n",
		     &n);
	CU_ASSERT_EQUAL(n.usage.prompt_tokens, 15);
	CU_ASSERT_EQUAL(n.usage.completion_tokens, 100);
	CU_ASSERT_EQUAL(n.usage.total_tokens, 115);
	CU_ASSERT_EQUAL(n.usage.cached_tokens, 3);

	feed_numbers("codex",
		     "{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":1e300,"
		     "\"cached_input_tokens\":-1e300,\"output_tokens\":7}}\n",
		     &n);
	CU_ASSERT_EQUAL(n.nusage, 1);
	CU_ASSERT_EQUAL(n.usage.prompt_tokens, 0);
	CU_ASSERT_EQUAL(n.usage.completion_tokens, 7);
	CU_ASSERT_EQUAL(n.usage.total_tokens, 7);
	CU_ASSERT_EQUAL(n.usage.cached_tokens, 0);

	/* A status outside 100-599 is no status: the message is searched instead. */
	feed_numbers("claude",
		     "{\"type\":\"result\",\"subtype\":\"error_during_execution\","
		     "\"is_error\":true,\"api_error_status\":70000,\"result\":\"x\"}\n",
		     &n);
	CU_ASSERT_EQUAL(n.status, 0);
	feed_numbers("claude",
		     "{\"type\":\"result\",\"subtype\":\"error_during_execution\","
		     "\"is_error\":true,\"api_error_status\":429.0,\"result\":\"x\"}\n",
		     &n);
	CU_ASSERT_EQUAL(n.status, 429);
	feed_numbers("vibe",
		     "{\"type\":\"error\",\"status\":4294967725,"
		     "\"message\":\"last status: 503\"}\n",
		     &n);
	CU_ASSERT_EQUAL(n.status, 503);
}

static void test_parser_types(void)
{
	struct prov_parser *ps = prov_parser_new("command");

	CU_ASSERT_PTR_NOT_NULL(ps);
	prov_parser_free(ps);
	CU_ASSERT_PTR_NULL(prov_parser_new("no-such-type"));
	CU_ASSERT_PTR_NULL(prov_parser_new(""));
	prov_parser_free(NULL);
}

/* ---- the registry -------------------------------------------------------------------- */

static const char *write_registry(const char *name, const char *text)
{
	static char path[256];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_FATAL(write_all(fd, text, strlen(text)) == 0);
	close(fd);
	return path;
}

static struct prov_registry *load_text(const char *text, const char *config, struct buf *err)
{
	const char *path = write_registry("registry.json", text);
	json_t *conf = config ? parse(config) : NULL;
	struct prov_registry *reg;

	buf_reset(err);
	reg = prov_registry_load(path, conf, err);
	json_decref(conf);
	unlink(path);
	return reg;
}

static const struct prov_provider *provider_named(const struct prov_registry *reg, const char *name)
{
	for (size_t i = 0; i < prov_registry_provider_count(reg); i++)
		if (!strcmp(prov_provider_name(prov_registry_provider_at(reg, i)), name))
			return prov_registry_provider_at(reg, i);
	return NULL;
}

static void test_registry_command(void)
{
	struct buf err = BUF_INIT;
	struct prov_registry *reg = load_text(
		"{\"version\":1,\"providers\":{\"local\":{\"type\":\"command\","
		"\"displayName\":\"Local\",\"tier\":\"B\",\"argv\":[\"/bin/cat\",\"-u\"],"
		"\"ro_paths\":[\"/etc/hostname\"],\"env\":{\"LANG\":\"C.UTF-8\"},"
		"\"models\":[{\"id\":\"echo\",\"displayName\":\"Echo\",\"created\":1700000000,"
		"\"contextWindow\":8192},{\"id\":\"echo-2\"}],"
		"\"aliases\":{\"e\":\"echo\",\"e2\":\"echo-2\"}}}}",
		NULL, &err);
	const struct prov_model *m, *a;
	const struct prov_provider *pv;

	CU_ASSERT_PTR_NOT_NULL_FATAL(reg);
	CU_ASSERT_EQUAL(err.len, 0);
	CU_ASSERT_EQUAL(prov_registry_provider_count(reg), 1);
	pv = prov_registry_provider_at(reg, 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_STRING_EQUAL(prov_provider_name(pv), "local");
	CU_ASSERT_STRING_EQUAL(prov_provider_type(pv), "command");
	CU_ASSERT_STRING_EQUAL(prov_provider_display_name(pv), "Local");
	CU_ASSERT_EQUAL(prov_provider_timeout_ms(pv), 600000);
	CU_ASSERT_PTR_NULL(prov_registry_provider_at(reg, 1));

	CU_ASSERT_EQUAL(prov_registry_model_count(reg), 2);
	m = prov_registry_find(reg, "echo");
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT_STRING_EQUAL(m->id, "echo");
	CU_ASSERT_STRING_EQUAL(m->display_name, "Echo");
	CU_ASSERT_EQUAL(m->created, 1700000000);
	CU_ASSERT_EQUAL(m->context_window, 8192);
	CU_ASSERT_PTR_EQUAL(m->provider, pv);
	CU_ASSERT_PTR_EQUAL(prov_registry_model_at(reg, 0), m);

	m = prov_registry_find(reg, "echo-2");
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT_PTR_NULL(m->display_name);
	CU_ASSERT_EQUAL(m->created, 0);
	CU_ASSERT_EQUAL(m->context_window, 0);

	/* Aliases resolve to the very model entries. */
	a = prov_registry_find(reg, "e");
	CU_ASSERT_PTR_EQUAL(a, prov_registry_find(reg, "echo"));
	a = prov_registry_find(reg, "e2");
	CU_ASSERT_PTR_EQUAL(a, prov_registry_find(reg, "echo-2"));
	CU_ASSERT_PTR_NULL(prov_registry_find(reg, "nope"));
	CU_ASSERT_PTR_NULL(prov_registry_find(reg, ""));
	CU_ASSERT_PTR_NULL(prov_registry_find(reg, "ECHO"));
	CU_ASSERT_PTR_NULL(prov_registry_model_at(reg, 2));
	prov_registry_free(reg);
	buf_release(&err);
}

/* Without "type", a provider with "argv" is a command provider; displayName defaults to the
 * provider's name. */
static void test_registry_defaults(void)
{
	struct buf err = BUF_INIT;
	struct prov_registry *reg = load_text(
		"{\"providers\":{\"mine\":{\"argv\":[\"/bin/echo\"],\"models\":[{\"id\":\"m\"}]}}}",
		NULL, &err);
	const struct prov_model *m;

	CU_ASSERT_PTR_NOT_NULL_FATAL(reg);
	m = prov_registry_find(reg, "m");
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT_STRING_EQUAL(prov_provider_type(m->provider), "command");
	CU_ASSERT_STRING_EQUAL(prov_provider_display_name(m->provider), "mine");
	prov_registry_free(reg);
	buf_release(&err);
}

static void test_registry_aliases(void)
{
	struct buf err = BUF_INIT;
	struct prov_registry *reg = load_text(
		"{\"providers\":{"
		"\"p1\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"],\"models\":[{\"id\":\"m1\"}],"
		"\"aliases\":{\"ghost\":\"no-such-model\",\"num\":5,\"good\":\"m1\"}},"
		"\"p2\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"],\"models\":[{\"id\":\"m2\"}],"
		"\"aliases\":{\"steal\":\"m1\",\"two\":\"m2\"}}}}",
		NULL, &err);

	CU_ASSERT_PTR_NOT_NULL_FATAL(reg);
	CU_ASSERT_EQUAL(prov_registry_model_count(reg), 2);
	CU_ASSERT_PTR_NULL(prov_registry_find(reg, "ghost"));
	CU_ASSERT_PTR_NULL(prov_registry_find(reg, "num"));
	CU_ASSERT_PTR_EQUAL(prov_registry_find(reg, "good"), prov_registry_find(reg, "m1"));
	CU_ASSERT_PTR_EQUAL(prov_registry_find(reg, "two"), prov_registry_find(reg, "m2"));
	/* An alias names a model of its own provider only. */
	CU_ASSERT_PTR_NULL(prov_registry_find(reg, "steal"));
	prov_registry_free(reg);
	buf_release(&err);
}

/* Alias patterns take the model ids a client brings of its own (Claude Code's, codex's):
 * after every exact id and alias, the most literal pattern first; '*' cannot start one. */
static void test_registry_alias_patterns(void)
{
	struct buf err = BUF_INIT;
	struct prov_registry *reg = load_text(
		"{\"providers\":{"
		"\"p1\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"],"
		"\"models\":[{\"id\":\"big\"},{\"id\":\"small\"},{\"id\":\"claude-opus-x\"}],"
		"\"aliases\":{\"claude-*\":\"small\",\"claude-opus-*\":\"big\","
		"\"*\":\"small\",\"exact\":\"small\",\"claude-opus-exact\":\"small\"}}}}",
		NULL, &err);

	CU_ASSERT_PTR_NOT_NULL_FATAL(reg);
	CU_ASSERT_PTR_EQUAL(prov_registry_find(reg, "claude-opus-5-5"),
			    prov_registry_find(reg, "big"));
	CU_ASSERT_PTR_EQUAL(prov_registry_find(reg, "claude-haiku-9"),
			    prov_registry_find(reg, "small"));
	/* An exact model id and an exact alias come before any pattern. */
	CU_ASSERT_PTR_EQUAL(prov_registry_find(reg, "claude-opus-x"),
			    prov_registry_find(reg, "claude-opus-x"));
	CU_ASSERT_STRING_EQUAL(prov_registry_find(reg, "claude-opus-x")->id, "claude-opus-x");
	CU_ASSERT_STRING_EQUAL(prov_registry_find(reg, "claude-opus-exact")->id, "small");
	/* "*" alone starts with no letter or digit: skipped, so nothing else matches. */
	CU_ASSERT_PTR_NULL(prov_registry_find(reg, "gpt-5"));
	CU_ASSERT_PTR_NULL(prov_registry_find(reg, "claude"));
	prov_registry_free(reg);
	buf_release(&err);
}

static void test_registry_duplicates(void)
{
	struct buf err = BUF_INIT;
	struct prov_registry *reg = load_text(
		"{\"providers\":{"
		"\"first\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"],"
		"\"models\":[{\"id\":\"m\",\"displayName\":\"First\"},{\"id\":\"m\","
		"\"displayName\":\"Again\"},"
		"{\"displayName\":\"no id\"},{\"id\":\"\"},{\"id\":7}]},"
		"\"second\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"],"
		"\"models\":[{\"id\":\"m\",\"displayName\":\"Second\"},{\"id\":\"other\"}]}}}",
		NULL, &err);
	const struct prov_model *m;

	CU_ASSERT_PTR_NOT_NULL_FATAL(reg);
	CU_ASSERT_EQUAL(prov_registry_model_count(reg), 2);
	m = prov_registry_find(reg, "m");
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT_STRING_EQUAL(m->display_name, "First");
	CU_ASSERT_STRING_EQUAL(prov_provider_name(m->provider), "first");
	CU_ASSERT_PTR_NOT_NULL(prov_registry_find(reg, "other"));
	prov_registry_free(reg);
	buf_release(&err);
}

static void test_registry_invalid_commands(void)
{
	static const char *const bad[] = {
		"\"argv\":[\"cat\"]", /* relative argv[0] */
		"\"argv\":[\"./bin/cat\"]",
		"\"argv\":[]",
		"\"argv\":\"/bin/cat\"",
		"\"argv\":[\"/bin/cat\",1]", /* non-string argv */
		"\"argv\":[\"/bin/cat\",null]",
		"\"argv\":[5]",
		"\"argv\":[\"/bin/cat\"],\"ro_paths\":[\"relative/path\"]",
		"\"argv\":[\"/bin/cat\"],\"ro_paths\":[\"/ok\",\"\"]",
		"\"argv\":[\"/bin/cat\"],\"ro_paths\":[\"/ok\",3]",
		"\"argv\":[\"/bin/cat\"],\"ro_paths\":\"/usr\"",
		"\"argv\":[\"/bin/cat\"],\"env\":{\"A\":1}", /* env not strings */
		"\"argv\":[\"/bin/cat\"],\"env\":{\"A\":\"x\",\"B\":null}",
		"\"argv\":[\"/bin/cat\"],\"env\":[\"A=x\"]",
		"\"argv\":[\"/bin/cat\"],\"env\":\"A=x\"",
	};
	struct buf err = BUF_INIT, text = BUF_INIT;
	struct prov_registry *reg;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		buf_reset(&text);
		buf_addf(&text,
			 "{\"providers\":{\"good\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"],"
			 "\"models\":[{\"id\":\"ok\"}]},"
			 "\"bad\":{\"type\":\"command\",%s,\"models\":[{\"id\":\"badmodel\"}],"
			 "\"aliases\":{\"b\":\"badmodel\"}}}}",
			 bad[i]);
		reg = load_text(text.data, NULL, &err);
		CU_ASSERT_PTR_NOT_NULL_FATAL(reg);
		CU_ASSERT_EQUAL(prov_registry_provider_count(reg), 1);
		CU_ASSERT_PTR_NOT_NULL(prov_registry_find(reg, "ok"));
		CU_ASSERT_PTR_NULL(prov_registry_find(reg, "badmodel"));
		CU_ASSERT_PTR_NULL(prov_registry_find(reg, "b"));
		CU_ASSERT_PTR_NULL(provider_named(reg, "bad"));
		if (provider_named(reg, "bad"))
			fprintf(stderr, "invalid command entry accepted: %s\n", bad[i]);
		prov_registry_free(reg);
	}
	buf_release(&err);
	buf_release(&text);
}

/* An entry is loaded only when this build runs its type: claude, codex and vibe are
 * skipped until their providers land (prov_parser_new() says which types exist), whether
 * the type is explicit or follows from the Node OLP's provider names; unknown types,
 * entries with neither "type" nor "argv", and non-objects are always skipped. */
static void test_registry_types_not_run(void)
{
	struct buf err = BUF_INIT;
	struct prov_registry *reg = load_text(
		"{\"providers\":{"
		"\"anthropic\":{\"models\":[{\"id\":\"claude-x\"}],\"aliases\":{\"claude\":"
		"\"claude-x\"}},"
		"\"openai\":{\"models\":[{\"id\":\"gpt-x\"}]},"
		"\"mistral\":{\"models\":[{\"id\":\"devstral-x\"}]},"
		"\"c2\":{\"type\":\"claude\",\"models\":[{\"id\":\"c2m\"}]},"
		"\"x2\":{\"type\":\"codex\",\"models\":[{\"id\":\"x2m\"}]},"
		"\"v2\":{\"type\":\"vibe\",\"argv\":[\"/bin/cat\"],\"models\":[{\"id\":\"v2m\"}]},"
		"\"weird\":{\"type\":\"nonsense\",\"models\":[{\"id\":\"wm\"}]},"
		"\"untyped\":{\"models\":[{\"id\":\"um\"}]},"
		"\"notobj\":[1,2],"
		"\"local\":{\"type\":\"command\",\"argv\":[\"/bin/"
		"cat\"],\"models\":[{\"id\":\"echo\"}]}}}",
		NULL, &err);
	static const struct {
		const char *model, *type;
	} typed[] = {
		{ "claude-x", "claude" }, { "claude", "claude" }, { "c2m", "claude" },
		{ "gpt-x", "codex" },	  { "x2m", "codex" },	  { "devstral-x", "vibe" },
		{ "v2m", "vibe" },
	};
	static const char *const gone[] = { "wm", "um", "nonsense" };
	size_t i, want_models = 1;

	CU_ASSERT_PTR_NOT_NULL_FATAL(reg);
	CU_ASSERT_PTR_NOT_NULL(prov_registry_find(reg, "echo"));
	for (i = 0; i < ARRAY_SIZE(typed); i++) {
		struct prov_parser *ps = prov_parser_new(typed[i].type);
		const struct prov_model *m = prov_registry_find(reg, typed[i].model);

		if (ps) {
			CU_ASSERT_PTR_NOT_NULL(m);
			if (m)
				CU_ASSERT_STRING_EQUAL(prov_provider_type(m->provider),
						       typed[i].type);
			if (strcmp(typed[i].model, "claude")) /* an alias, not a model */
				want_models++;
		} else {
			CU_ASSERT_PTR_NULL(m);
		}
		prov_parser_free(ps);
	}
	for (i = 0; i < ARRAY_SIZE(gone); i++)
		CU_ASSERT_PTR_NULL(prov_registry_find(reg, gone[i]));
	CU_ASSERT_PTR_NULL(provider_named(reg, "weird"));
	CU_ASSERT_PTR_NULL(provider_named(reg, "untyped"));
	CU_ASSERT_PTR_NULL(provider_named(reg, "notobj"));
	CU_ASSERT_EQUAL(prov_registry_model_count(reg), want_models);
	prov_registry_free(reg);
	buf_release(&err);
}

static void test_registry_load_failures(void)
{
	static const struct {
		const char *text;
		const char *in_message;
	} cases[] = {
		{ "{\"providers\":", "registry.json" },
		{ "not json", "registry.json" },
		{ "", "registry.json" },
		{ "{}", "providers" },
		{ "{\"version\":1}", "providers" },
		{ "{\"providers\":[]}", "providers" },
		{ "{\"providers\":\"x\"}", "providers" },
		{ "[]", "providers" },
		{ "{\"providers\":{},\"providers\":{}}", "registry.json" }, /* duplicate key */
	};
	struct buf err = BUF_INIT;
	struct prov_registry *reg;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		reg = load_text(cases[i].text, NULL, &err);
		CU_ASSERT_PTR_NULL(reg);
		CU_ASSERT(err.len > 0);
		CU_ASSERT_PTR_NOT_NULL(strstr(err.data, cases[i].in_message));
		if (!strstr(err.data, cases[i].in_message))
			fprintf(stderr, "registry case %zu: message \"%s\" lacks \"%s\"\n", i,
				err.data, cases[i].in_message);
		prov_registry_free(reg);
	}
	buf_reset(&err);
	reg = prov_registry_load("/nonexistent/olp/models-registry.json", NULL, &err);
	CU_ASSERT_PTR_NULL(reg);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.data, "/nonexistent/olp/models-registry.json"));
	/* An empty providers object is a valid, empty registry. */
	reg = load_text("{\"providers\":{}}", NULL, &err);
	CU_ASSERT_PTR_NOT_NULL(reg);
	if (reg) {
		CU_ASSERT_EQUAL(prov_registry_model_count(reg), 0);
		CU_ASSERT_PTR_NULL(prov_registry_find(reg, "x"));
	}
	prov_registry_free(reg);
	prov_registry_free(NULL);
	buf_release(&err);
}

static uint64_t timeout_for(const char *entry_extra, const char *config)
{
	struct buf err = BUF_INIT, text = BUF_INIT;
	struct prov_registry *reg;
	uint64_t ms = 0;

	buf_addf(&text,
		 "{\"providers\":{\"local\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"]%s,"
		 "\"models\":[{\"id\":\"m\"}]},\"other\":{\"type\":\"command\","
		 "\"argv\":[\"/bin/cat\"],\"models\":[{\"id\":\"o\"}]}}}",
		 entry_extra);
	reg = load_text(text.data, config, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(reg);
	ms = prov_provider_timeout_ms(prov_registry_find(reg, "m")->provider);
	/* The override never leaks into another provider. */
	CU_ASSERT_EQUAL(prov_provider_timeout_ms(prov_registry_find(reg, "o")->provider), 600000);
	prov_registry_free(reg);
	buf_release(&err);
	buf_release(&text);
	return ms;
}

/* config.json's providers object is refused (by the registry as by prov_config_check),
 * with a message naming the field. */
static void check_refused(const char *config, const char *in_message)
{
	static const char text[] = "{\"providers\":{\"local\":{\"type\":\"command\","
				   "\"argv\":[\"/bin/cat\"],\"models\":[{\"id\":\"m\"}]}}}";
	struct buf err = BUF_INIT;
	struct prov_registry *reg = load_text(text, config, &err);
	json_t *conf = parse(config);

	CU_ASSERT_PTR_NULL(reg);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.data, in_message));
	if (!strstr(err.data, in_message))
		fprintf(stderr, "config %s: message \"%s\" lacks \"%s\"\n", config, err.data,
			in_message);
	buf_reset(&err);
	CU_ASSERT_EQUAL(prov_config_check(conf, &err), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.data, in_message));
	prov_registry_free(reg);
	json_decref(conf);
	buf_release(&err);
}

static void test_registry_timeouts(void)
{
	CU_ASSERT_EQUAL(timeout_for("", NULL), 600000);
	CU_ASSERT_EQUAL(timeout_for("", "{}"), 600000);
	CU_ASSERT_EQUAL(timeout_for("", "{\"local\":{\"timeout_s\":5}}"), 5000);
	CU_ASSERT_EQUAL(timeout_for("", "{\"local\":{\"timeout_s\":0.25}}"), 250);
	CU_ASSERT_EQUAL(timeout_for(",\"timeout_s\":2", NULL), 2000);
	/* config.json wins over the registry entry */
	CU_ASSERT_EQUAL(timeout_for(",\"timeout_s\":2", "{\"local\":{\"timeout_s\":30}}"), 30000);
	CU_ASSERT_EQUAL(timeout_for("", "{\"nobody\":{\"timeout_s\":30}}"), 600000);
	/* Nonsense in a registry entry leaves the default (with a warning)... */
	CU_ASSERT_EQUAL(timeout_for(",\"timeout_s\":0", NULL), 600000);
	CU_ASSERT_EQUAL(timeout_for(",\"timeout_s\":-3", NULL), 600000);
	CU_ASSERT_EQUAL(timeout_for(",\"timeout_s\":\"5\"", NULL), 600000);
	CU_ASSERT_EQUAL(timeout_for(",\"timeout_s\":1e12", NULL), 600000);
	/* ... and in config.json, the operator's own file, it is refused at start. */
	check_refused("{\"local\":{\"timeout_s\":0}}", "providers.local.timeout_s: must be");
	check_refused("{\"local\":{\"timeout_s\":-3}}", "providers.local.timeout_s: must be");
	check_refused("{\"local\":{\"timeout_s\":\"5\"}}", "providers.local.timeout_s: must be");
	check_refused("{\"local\":{\"timeout_s\":1e12}}", "providers.local.timeout_s: must be");
	check_refused("{\"nobody\":{\"timeout_s\":1e12}}", "providers.nobody.timeout_s: must be");
	check_refused("{\"local\":5}", "providers.local: must be an object");
	/* A positive timeout must stay a limit: 0 ms means "no limit" to the sandbox. */
	CU_ASSERT(timeout_for("", "{\"local\":{\"timeout_s\":0.0004}}") > 0);
	CU_ASSERT(timeout_for(",\"timeout_s\":1e-9", NULL) > 0);
}

/* "limits" of a provider: config.json over the entry, bad values ignored, nothing shared
 * with another provider. */
static void test_registry_limits(void)
{
	struct buf err = BUF_INIT;
	struct prov_registry *reg;
	const struct sbx_limits *l;

	reg = load_text("{\"providers\":{\"local\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"],"
			"\"limits\":{\"memory_mb\":512,\"pids\":64,\"as_mb\":4096},"
			"\"models\":[{\"id\":\"m\"}]},\"other\":{\"type\":\"command\","
			"\"argv\":[\"/bin/cat\"],\"models\":[{\"id\":\"o\"}]}}}",
			"{\"local\":{\"limits\":{\"memory_mb\":1024,\"cpu_pct\":50}}}", &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(reg);
	l = prov_provider_limits(prov_registry_find(reg, "m")->provider);
	/* json_object_update replaces the whole "limits" object: config.json's own. */
	CU_ASSERT_EQUAL(l->memory_mb, 1024);
	CU_ASSERT_EQUAL(l->cpu_pct, 50);
	CU_ASSERT_EQUAL(l->pids, 0);
	CU_ASSERT_EQUAL(l->nofile, 0);
	CU_ASSERT_EQUAL(l->as_mb, 0);
	l = prov_provider_limits(prov_registry_find(reg, "o")->provider);
	CU_ASSERT_EQUAL(l->memory_mb, 0);
	CU_ASSERT_EQUAL(l->cpu_pct, 0);
	prov_registry_free(reg);
	reg = load_text("{\"providers\":{\"local\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"],"
			"\"limits\":{\"memory_mb\":512,\"pids\":64},\"models\":[{\"id\":\"m\"}]}}}",
			NULL, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(reg);
	l = prov_provider_limits(prov_registry_find(reg, "m")->provider);
	CU_ASSERT_EQUAL(l->memory_mb, 512);
	CU_ASSERT_EQUAL(l->pids, 64);
	prov_registry_free(reg);
	/* Past 2^40 a limit would wrap around when the sandbox makes bytes of it (memory_mb
	 * 2^44 is 0 bytes): refused, as a real that no integer equals is. An integral real is
	 * the integer it equals. */
	reg = load_text("{\"providers\":{\"local\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"],"
			"\"limits\":{\"memory_mb\":17592186044416,\"fsize_mb\":4e29,"
			"\"as_mb\":1099511627776,\"pids\":1e2,\"nofile\":2.5,\"cpu_s\":-4e29},"
			"\"max_concurrent\":4e29,\"models\":[{\"id\":\"m\",\"created\":4e29,"
			"\"contextWindow\":8192.0}]}}}",
			NULL, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(reg);
	l = prov_provider_limits(prov_registry_find(reg, "m")->provider);
	CU_ASSERT_EQUAL(l->memory_mb, 0);
	CU_ASSERT_EQUAL(l->fsize_mb, 0);
	CU_ASSERT_EQUAL(l->as_mb, (uint64_t)1 << 40);
	CU_ASSERT_EQUAL(l->pids, 100);
	CU_ASSERT_EQUAL(l->nofile, 0);
	CU_ASSERT_EQUAL(l->cpu_s, 0);
	CU_ASSERT_EQUAL(prov_registry_find(reg, "m")->created, 0);
	CU_ASSERT_EQUAL(prov_registry_find(reg, "m")->context_window, 8192);
	prov_registry_free(reg);
	buf_release(&err);
	/* In config.json a bad field is refused at start. */
	check_refused("{\"local\":{\"limits\":{\"pids\":-1}}}",
		      "providers.local.limits.pids: must");
	check_refused("{\"local\":{\"limits\":{\"nofile\":\"9\"}}}",
		      "providers.local.limits.nofile: must");
	check_refused("{\"local\":{\"limits\":[]}}", "providers.local.limits: must");
	check_refused("{\"local\":{\"max_concurrent\":-1}}",
		      "providers.local.max_concurrent: must");
}

/* Run fn with stderr going to a temporary file; what it logged, in out. */
static void capture_stderr(void (*fn)(void *), void *arg, struct buf *out)
{
	char path[64];

	snprintf(path, sizeof(path), "%s/stderr", tmpdir);
	CU_ASSERT_FATAL(ts_capture_stderr(path, fn, arg) == 0);
	buf_reset(out);
	CU_ASSERT_EQUAL(buf_read_file(out, path, 1 << 20), 0);
	unlink(path);
}

struct load_args {
	const char *text;
	struct prov_registry *reg;
	struct buf err;
};

static void load_args_run(void *arg)
{
	struct load_args *a = arg;

	a->reg = load_text(a->text, NULL, &a->err);
}

struct notes_args {
	const struct prov_registry *reg;
};

static void notes_run(void *arg)
{
	prov_registry_notes(((struct notes_args *)arg)->reg, tmpdir);
}

/* vibe's note (its config.toml's api_base must point at the forwarder) is not said at
 * load, by every worker at every start: prov_registry_notes says it once per web server
 * (the workers' parent) across the pool sharing the state dir, and only when vibe's
 * program is installed. The load part fails on the old code, which said it at load
 * whether or not vibe was there. */
static void test_registry_notes(void)
{
	static const char reg_text[] =
		"{\"version\":1,\"providers\":{"
		"\"here\":{\"type\":\"vibe\",\"bin\":\"/bin/true\",\"models\":[{\"id\":\"h\"}]},"
		"\"gone\":{\"type\":\"vibe\",\"bin\":\"/nonexistent/"
		"vibe\",\"models\":[{\"id\":\"g\"}]}"
		"}}";
	struct load_args la = { .text = reg_text, .err = BUF_INIT };
	struct notes_args na;
	struct buf out = BUF_INIT;

	capture_stderr(load_args_run, &la, &out);
	CU_ASSERT_PTR_NOT_NULL_FATAL(la.reg);
	CU_ASSERT_PTR_NULL(strstr(out.data, "config.toml only"));
	na.reg = la.reg;
	capture_stderr(notes_run, &na, &out);
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "providers.here.network: vibe takes its API base "
						"from its config.toml only"));
	CU_ASSERT_PTR_NULL(strstr(out.data, "providers.gone"));
	/* A second worker of the same parent stays quiet. */
	capture_stderr(notes_run, &na, &out);
	CU_ASSERT_EQUAL(out.len, 0);
	prov_registry_free(la.reg);
	buf_release(&la.err);
	buf_release(&out);
}

/* Names that reach response headers and file names are checked at load: an entry with a
 * control character (a CR/LF that would inject a Set-Cookie through X-OLP-Model-Used), a
 * character outside the id charset or a path in a provider name is skipped, with a
 * warning naming it; the rest of the registry loads. */
static void test_registry_names(void)
{
	static const char *const bad_ids[] = {
		"m\\r\\nSet-Cookie: a=b",
		"m\\n",
		"m\\r",
		"m\\u0001x",
		"m\\t1",
		"m 1",
		"m\\u007f",
		"caf\\u00e9",
		"-m",
		".m",
		"/m",
		"m\\\"",
		"m;x",
		"m,x",
	};
	static const char *const good_ids[] = {
		"gpt-4o-2024-08-06",	 "ft:gpt-4o-mini:org::9x8y",   "qwen2.5:7b-instruct_q4",
		"meta-llama/Llama-3-8B", "claude-3-5-sonnet@20240620", "A",
	};
	struct load_args a = { .err = BUF_INIT };
	struct buf text = BUF_INIT, log = BUF_INIT;
	char id[200];
	size_t i;

	for (i = 0; i < ARRAY_SIZE(bad_ids); i++) {
		buf_reset(&text);
		buf_addf(&text,
			 "{\"providers\":{\"p\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"],"
			 "\"models\":[{\"id\":\"%s\"},{\"id\":\"ok\"}],"
			 "\"aliases\":{\"%s\":\"ok\",\"fine\":\"ok\"}}}}",
			 bad_ids[i], bad_ids[i]);
		a.text = text.data;
		capture_stderr(load_args_run, &a, &log);
		CU_ASSERT_PTR_NOT_NULL_FATAL(a.reg);
		/* Only the good model and the good alias are left. */
		CU_ASSERT_EQUAL(prov_registry_model_count(a.reg), 1);
		CU_ASSERT_STRING_EQUAL(prov_registry_model_at(a.reg, 0)->id, "ok");
		CU_ASSERT_PTR_NOT_NULL(prov_registry_find(a.reg, "fine"));
		/* Warned about twice (model and alias), naming it as the log escapes it. */
		CU_ASSERT_PTR_NOT_NULL(strstr(log.data, "model id \\\""));
		CU_ASSERT_PTR_NOT_NULL(strstr(log.data, "alias \\\""));
		snprintf(id, sizeof(id), "\\\"%s\\\"", bad_ids[i]);
		if (!strchr(bad_ids[i], '\\'))
			CU_ASSERT_PTR_NOT_NULL(strstr(log.data, id));
		/* A CR reaches the log escaped, never raw. */
		CU_ASSERT_PTR_NULL(strchr(log.data, '\r'));
		prov_registry_free(a.reg);
	}

	for (i = 0; i < ARRAY_SIZE(good_ids); i++) {
		buf_reset(&text);
		buf_addf(&text,
			 "{\"providers\":{\"p\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"],"
			 "\"models\":[{\"id\":\"%s\"}],\"aliases\":{\"x%s\":\"%s\"}}}}",
			 good_ids[i], good_ids[i], good_ids[i]);
		a.reg = load_text(text.data, NULL, &a.err);
		CU_ASSERT_PTR_NOT_NULL_FATAL(a.reg);
		CU_ASSERT_PTR_NOT_NULL(prov_registry_find(a.reg, good_ids[i]));
		snprintf(id, sizeof(id), "x%s", good_ids[i]);
		CU_ASSERT_PTR_NOT_NULL(prov_registry_find(a.reg, id));
		prov_registry_free(a.reg);
	}

	/* 128 characters is the longest id. */
	memset(id, 'a', 129);
	id[129] = '\0';
	buf_reset(&text);
	buf_addf(&text,
		 "{\"providers\":{\"p\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"],"
		 "\"models\":[{\"id\":\"%s\"},{\"id\":\"%.128s\"}]}}}",
		 id, id);
	a.reg = load_text(text.data, NULL, &a.err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a.reg);
	CU_ASSERT_EQUAL(prov_registry_model_count(a.reg), 1);
	CU_ASSERT_EQUAL(strlen(prov_registry_model_at(a.reg, 0)->id), 128);
	prov_registry_free(a.reg);

	/* Provider names: skipped whole (with their models) when not [A-Za-z0-9._-]. */
	a.text = "{\"providers\":{"
		 "\"bad\\r\\nX-Evil: 1\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"],"
		 "\"models\":[{\"id\":\"m1\"}]},"
		 "\"../../etc\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"],"
		 "\"models\":[{\"id\":\"m2\"}]},"
		 "\"a/b\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"],"
		 "\"models\":[{\"id\":\"m3\"}]},"
		 "\"good_1.x-y\":{\"type\":\"command\",\"argv\":[\"/bin/cat\"],"
		 "\"models\":[{\"id\":\"m4\"}]}}}";
	capture_stderr(load_args_run, &a, &log);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a.reg);
	CU_ASSERT_EQUAL(prov_registry_provider_count(a.reg), 1);
	CU_ASSERT_PTR_NOT_NULL(provider_named(a.reg, "good_1.x-y"));
	CU_ASSERT_EQUAL(prov_registry_model_count(a.reg), 1);
	CU_ASSERT_PTR_NOT_NULL(prov_registry_find(a.reg, "m4"));
	CU_ASSERT_PTR_NOT_NULL(strstr(log.data, "provider name \\\"bad\\r\\nX-Evil: 1\\\""));
	CU_ASSERT_PTR_NOT_NULL(strstr(log.data, "provider name \\\"../../etc\\\""));
	CU_ASSERT_PTR_NOT_NULL(strstr(log.data, "provider name \\\"a/b\\\""));
	prov_registry_free(a.reg);

	buf_release(&text);
	buf_release(&log);
	buf_release(&a.err);
}

/* config.json's providers object: every setting of every type checked at start; each bad
 * value refused with its JSON path; unknown keys left alone. */
static void test_config_check(void)
{
	static const char good[] =
		"{\"enabled\":[\"a\",\"b\"],\"a\":{\"timeout_s\":1.5,\"max_concurrent\":0,"
		"\"limits\":{\"memory_mb\":64},\"network\":false,\"env\":{\"X\":\"1\"},"
		"\"bin\":\"claude\",\"credentials\":{\"~/.c/x.json\":\".c/x.json\","
		"\"/etc/y\":\"/home/olp/y\"},\"credentials_writable\":true,\"max_retries\":0,"
		"\"system_prompt\":\"\",\"tools\":\"\",\"config_toml\":false,"
		"\"model_provider\":\"my-id_1\",\"argv\":[\"/bin/cat\",\"-u\"],"
		"\"ro_paths\":[\"/etc\"],\"output\":\"sse\",\"displayName\":\"ignored\","
		"\"something_new\":[1]},\"b\":{\"credentials\":null,\"config_toml\":null},"
		"\"c\":{\"credentials\":[\"~/x\",\"/y\"],\"config_toml\":\"~/t.toml\"},"
		"\"d\":{\"credentials\":\"~/x\",\"timeout_s\":null}}";
	static const struct {
		const char *config, *path;
	} bad[] = {
		{ "[]", "providers: must be an object" },
		{ "{\"enabled\":\"a\"}", "providers.enabled: must be" },
		{ "{\"enabled\":[\"a\",1]}", "providers.enabled[1]: must be" },
		{ "{\"a\":[]}", "providers.a: must be an object" },
		{ "{\"a\":{\"network\":\"yes\"}}",
		  "providers.a.network: must be false, \"none\", \"host\", true, or an object" },
		{ "{\"a\":{\"env\":[\"X=1\"]}}", "providers.a.env: must be an object" },
		{ "{\"a\":{\"env\":{\"X\":1}}}", "providers.a.env.X: must be a string" },
		{ "{\"a\":{\"env\":{\"X=Y\":\"1\"}}}", "providers.a.env.X=Y: is not a variable" },
		{ "{\"a\":{\"env\":{\"\":\"1\"}}}", "providers.a.env.: is not a variable" },
		{ "{\"a\":{\"bin\":\"\"}}", "providers.a.bin: must be" },
		{ "{\"a\":{\"bin\":7}}", "providers.a.bin: must be" },
		{ "{\"a\":{\"credentials\":5}}", "providers.a.credentials: must be a path" },
		{ "{\"a\":{\"credentials\":[\"~/x\",3]}}", "providers.a.credentials[1]: must be" },
		{ "{\"a\":{\"credentials\":[\"rel/x\"]}}",
		  "providers.a.credentials[0]: must be an absolute path" },
		{ "{\"a\":{\"credentials\":{\"~/x\":\"../../etc/x\"}}}",
		  "providers.a.credentials.~/x: must be a path in the home" },
		{ "{\"a\":{\"credentials\":{\"~/x\":\"/etc/x\"}}}",
		  "providers.a.credentials.~/x: must be a path in the home" },
		{ "{\"a\":{\"credentials\":{\"~/x\":1}}}", "providers.a.credentials.~/x: must be" },
		{ "{\"a\":{\"credentials_writable\":1}}",
		  "providers.a.credentials_writable: must" },
		{ "{\"a\":{\"max_retries\":-1}}", "providers.a.max_retries: must be an integer" },
		{ "{\"a\":{\"max_retries\":1.5}}", "providers.a.max_retries: must be an integer" },
		{ "{\"a\":{\"system_prompt\":5}}", "providers.a.system_prompt: must be a string" },
		{ "{\"a\":{\"tools\":[]}}", "providers.a.tools: must be a string" },
		{ "{\"a\":{\"config_toml\":\"rel.toml\"}}", "providers.a.config_toml: must be" },
		{ "{\"a\":{\"config_toml\":true}}", "providers.a.config_toml: must be" },
		{ "{\"a\":{\"model_provider\":\"x\\\"]\"}}",
		  "providers.a.model_provider: must be" },
		{ "{\"a\":{\"model_provider\":\"\"}}", "providers.a.model_provider: must be" },
		{ "{\"a\":{\"argv\":[]}}", "providers.a.argv: must be a non-empty array" },
		{ "{\"a\":{\"argv\":[\"cat\"]}}", "providers.a.argv[0]: must be an absolute path" },
		{ "{\"a\":{\"argv\":[\"/bin/cat\",2]}}", "providers.a.argv[1]: must be a string" },
		{ "{\"a\":{\"ro_paths\":[\"/ok\",\"rel\"]}}", "providers.a.ro_paths[1]: must be" },
		{ "{\"a\":{\"output\":\"xml\"}}", "providers.a.output: must be" },
	};
	struct buf err = BUF_INIT;
	json_t *conf = parse(good);

	CU_ASSERT_EQUAL(prov_config_check(conf, &err), 0);
	if (err.len)
		fprintf(stderr, "good config refused: %s\n", err.data);
	CU_ASSERT_EQUAL(prov_config_check(NULL, &err), 0);
	json_decref(conf);
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		conf = parse(bad[i].config);
		buf_reset(&err);
		CU_ASSERT_EQUAL(prov_config_check(conf, &err), -EINVAL);
		CU_ASSERT_PTR_NOT_NULL(strstr(err.data, bad[i].path));
		if (!strstr(err.data, bad[i].path))
			fprintf(stderr, "%s: message \"%s\" lacks \"%s\"\n", bad[i].config,
				err.data, bad[i].path);
		json_decref(conf);
	}
	buf_release(&err);
}

/* ---- "network" (network.c) ------------------------------------------------------------ */

/* A key file in tmpdir with mode (and, as root, owner uid; -1 = ours). */
static void key_file(const char *name, const char *content, mode_t mode, int uid, char *path,
		     size_t n)
{
	int fd;

	snprintf(path, n, "%s/%s", tmpdir, name);
	unlink(path);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(write_all(fd, content, strlen(content)), 0);
	CU_ASSERT_EQUAL(fchmod(fd, mode), 0);
	if (uid >= 0) {
		CU_ASSERT_EQUAL(fchown(fd, (uid_t)uid, (gid_t)-1), 0);
	}
	close(fd);
}

/* The provider name/entry as from_json reads it (a registry entry: a credential that
 * cannot be read now is a warning), and its network as /health shows it. */
static void expect_net(const char *name, const char *entry, const char *mode, const char *host,
		       bool secretless)
{
	json_t *e = parse(entry);
	struct buf err = BUF_INIT;
	struct prov_provider *pv = prov_provider_from_json(name, e, &err);
	struct prov_net_info ni;

	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	prov_provider_net_info(pv, &ni);
	CU_ASSERT_STRING_EQUAL(ni.mode, mode);
	if (host) {
		CU_ASSERT_TRUE(ni.upstream_host && !strcmp(ni.upstream_host, host));
	} else {
		CU_ASSERT_PTR_NULL(ni.upstream_host);
	}
	CU_ASSERT_EQUAL(ni.secretless, secretless);
	if (strcmp(ni.mode, mode) || ni.secretless != secretless ||
	    (host && (!ni.upstream_host || strcmp(ni.upstream_host, host))))
		fprintf(stderr, "%s: got %s %s %d\n", entry, ni.mode,
			ni.upstream_host ? ni.upstream_host : "-", ni.secretless);
	prov_provider_free(pv);
	json_decref(e);
	buf_release(&err);
}

/* Every form of "network", and each type's default. */
static void test_network_forms(void)
{
	char key[256], tmp[1024];

	key_file("key-ok", "sk-real-key\n", 0600, -1, key, sizeof(key));
	/* The defaults: the CLIs in upstream mode with their public API, passing their own
	 * credentials through; a command with no network at all. */
	expect_net("anthropic", "{\"type\":\"claude\"}", "upstream", "api.anthropic.com", false);
	expect_net("openai", "{\"type\":\"codex\"}", "upstream", "api.openai.com", false);
	expect_net("mistral", "{\"type\":\"vibe\"}", "upstream", "api.mistral.ai", false);
	expect_net("local", "{\"argv\":[\"/bin/cat\"]}", "none", NULL, false);
	expect_net("a", "{\"type\":\"claude\",\"network\":false}", "none", NULL, false);
	expect_net("a", "{\"type\":\"claude\",\"network\":\"none\"}", "none", NULL, false);
	expect_net("a", "{\"type\":\"claude\",\"network\":\"host\"}", "host", NULL, false);
	expect_net("a", "{\"argv\":[\"/bin/cat\"],\"network\":\"host\"}", "host", NULL, false);
	/* Legacy true: a CLI's default upstream; a command's host network (deprecated). */
	expect_net("a", "{\"type\":\"codex\",\"network\":true}", "upstream", "api.openai.com",
		   false);
	expect_net("a", "{\"argv\":[\"/bin/cat\"],\"network\":true}", "host", NULL, false);
	/* An old config's ANTHROPIC_BASE_URL stays its upstream. */
	expect_net(
		"a",
		"{\"type\":\"claude\",\"env\":{\"ANTHROPIC_BASE_URL\":\"http://127.0.0.1:9/x\"}}",
		"upstream", "127.0.0.1:9", false);
	/* Upstream mode with the real key added by the worker: secretless. */
	snprintf(tmp, sizeof(tmp),
		 "{\"type\":\"claude\",\"network\":{\"upstream\":\"https://up.example:8443/base\","
		 "\"set_headers\":{\"X-Api-Key\":\"file:%s\"},\"allow_paths\":[\"/v1/messages\"]}}",
		 key);
	expect_net("a", tmp, "upstream", "up.example:8443", true);
	setenv("OLP_TEST_NET_KEY", "sk-env-key", 1);
	expect_net("a",
		   "{\"argv\":[\"/bin/cat\"],\"network\":{\"upstream\":\"http://127.0.0.1:1\","
		   "\"set_headers\":{\"authorization\":\"Bearer env:OLP_TEST_NET_KEY\"},"
		   "\"allow_paths\":[\"POST /v1/chat/completions\"]}}",
		   "upstream", "127.0.0.1:1", true);
	/* Without set_headers the CLI's own credentials pass through: not secretless. */
	expect_net("a", "{\"type\":\"codex\",\"network\":{\"upstream\":\"https://x.example/v1\"}}",
		   "upstream", "x.example", false);
	/* CONNECT mode: the credentials file stays bound, never secretless. */
	expect_net("a",
		   "{\"type\":\"claude\",\"network\":{\"allow_hosts\":[\"api.anthropic.com:443\","
		   "\"console.anthropic.com:443\"]}}",
		   "connect", NULL, false);
	/* A registry entry whose key cannot be read now still loads (with a warning): the
	 * file may be put in place before the first run, which reads it again. */
	expect_net("a",
		   "{\"argv\":[\"/bin/cat\"],\"network\":{\"upstream\":\"http://127.0.0.1:1\","
		   "\"set_headers\":{\"x-api-key\":\"file:/nonexistent/olp-key\"},"
		   "\"allow_paths\":[\"POST /v1/x\",\"/v1/legacy\"]}}",
		   "upstream", "127.0.0.1:1", true);
	/* A command without set_headers holds its own credential: no list needed. */
	expect_net("a",
		   "{\"argv\":[\"/bin/cat\"],\"network\":{\"upstream\":\"http://127.0.0.1:1\"}}",
		   "upstream", "127.0.0.1:1", false);
	/* A secretless command must list what its runs may ask for (issue 22): the worker's
	 * credential is not spent on any path by default. */
	{
		json_t *e = parse("{\"argv\":[\"/bin/cat\"],\"network\":{\"upstream\":"
				  "\"http://127.0.0.1:1\",\"set_headers\":{\"authorization\":"
				  "\"Bearer env:OLP_TEST_NET_KEY\"}}}");
		struct buf err = BUF_INIT;

		CU_ASSERT_PTR_NULL(prov_provider_from_json("a", e, &err));
		CU_ASSERT_PTR_NOT_NULL(strstr(err.data, "a.network.allow_paths: a command"));
		json_decref(e);
		buf_release(&err);
	}
	unsetenv("OLP_TEST_NET_KEY");
	unlink(key);
}

/* config.json's "network": every bad form refused with its JSON path, and a credential
 * source the worker could not use refused with why (never the value). */
static void test_network_errors(void)
{
	char k644[256], kother[256], knl[256], klink[256], kok[256];
	struct {
		char config[1024];
		const char *path;
	} bad[40];
	size_t n = 0;
	struct buf err = BUF_INIT;

	key_file("key-644", "sk-secret-644\n", 0644, -1, k644, sizeof(k644));
	key_file("key-nl", "sk-a\nX-Evil: 1\n", 0600, -1, knl, sizeof(knl));
	key_file("key-ok2", "sk-secret-ok\n", 0600, -1, kok, sizeof(kok));
	snprintf(klink, sizeof(klink), "%s/key-link", tmpdir);
	unlink(klink);
	CU_ASSERT_EQUAL(symlink(kok, klink), 0);
	unsetenv("OLP_TEST_UNSET_VAR");
#define NET_BAD(path_, ...)                                    \
	do {                                                   \
		snprintf(bad[n].config, sizeof(bad[n].config), \
			 "{\"a\":{\"network\":" __VA_ARGS__);  \
		bad[n++].path = (path_);                       \
	} while (0)
#define UP "{\"upstream\":\"https://api.example\","
	NET_BAD("providers.a.network.set_headers.x-api-key: file ",
		UP "\"set_headers\":{\"x-api-key\":\"file:%s\"}}}}", k644);
	NET_BAD("mode 0644 lets group or others in; must be 0600",
		UP "\"set_headers\":{\"x-api-key\":\"file:%s\"}}}}", k644);
	NET_BAD("providers.a.network.set_headers.x-api-key: file /nonexistent/k: No such file",
		UP "\"set_headers\":{\"x-api-key\":\"file:/nonexistent/k\"}}}}");
	NET_BAD("providers.a.network.set_headers.x-api-key: file ",
		UP "\"set_headers\":{\"x-api-key\":\"file:%s\"}}}}", klink);
	NET_BAD("holds a line break or control character",
		UP "\"set_headers\":{\"x-api-key\":\"file:%s\"}}}}", knl);
	NET_BAD("providers.a.network.set_headers.x-api-key: variable OLP_TEST_UNSET_VAR is not set",
		UP "\"set_headers\":{\"x-api-key\":\"env:OLP_TEST_UNSET_VAR\"}}}}");
	NET_BAD("providers.a.network.set_headers.x-api-key: must be \"file:",
		UP "\"set_headers\":{\"x-api-key\":\"sk-inline-key\"}}}}");
	NET_BAD("providers.a.network.set_headers.x-api-key: a file: source needs an absolute",
		UP "\"set_headers\":{\"x-api-key\":\"file:rel/k\"}}}}");
	NET_BAD("providers.a.network.set_headers.bad name: is not a header name",
		UP "\"set_headers\":{\"bad name\":\"env:HOME\"}}}}");
	NET_BAD("providers.a.network.set_headers: must be an object", UP "\"set_headers\":[]}}}");
	NET_BAD("providers.a.network.upstream: must be an http:// or https:// URL",
		"{\"upstream\":\"ftp://api.example\"}}}");
	NET_BAD("providers.a.network.upstream: must be an http:// or https:// URL",
		"{\"upstream\":\"api.example\"}}}");
	NET_BAD("providers.a.network.upstream: must not hold a user",
		"{\"upstream\":\"https://u:p@api.example\"}}}");
	NET_BAD("providers.a.network.upstream: must not hold a query",
		"{\"upstream\":\"https://api.example/v1?x=1\"}}}");
	NET_BAD("providers.a.network.upstream: names no host", "{\"upstream\":\"https:///v1\"}}}");
	NET_BAD("providers.a.network.upstream: must be a base URL", "{\"upstream\":5}}}");
	NET_BAD("providers.a.network.allow_paths[0]: an allowed request is not \"METHOD /path\"",
		UP "\"allow_paths\":[\"v1/messages\"]}}}");
	NET_BAD("providers.a.network.allow_paths[1]: TRACE, TRACK and CONNECT are never allowed",
		UP "\"allow_paths\":[\"POST /v1/messages\",\"TRACE /v1/messages\"]}}}");
	NET_BAD("providers.a.network.allow_paths[0]: an allowed request's path is not",
		UP "\"allow_paths\":[\"GET /v1/*/batches\"]}}}");
	NET_BAD("providers.a.network.allow_paths[0]: an allowed request's path is not",
		UP "\"allow_paths\":[\"POST /v1/messages?beta=true\"]}}}");
	NET_BAD("providers.a.network.allow_paths[0]: an allowed request's path is not",
		UP "\"allow_paths\":[\"/v1/../files\"]}}}");
	NET_BAD("providers.a.network.upstream_ca: must be an absolute path",
		UP "\"upstream_ca\":\"ca.pem\"}}}");
	NET_BAD("providers.a.network.upstream_ca: /nonexistent/ca.pem:",
		UP "\"upstream_ca\":\"/nonexistent/ca.pem\"}}}");
	/* An address is listed on purpose, in its plain spelling only, never 0.0.0.0 or ::. */
	NET_BAD("providers.a.network.allow_hosts[0]:", "{\"allow_hosts\":[\"127.1:443\"]}}}");
	NET_BAD("providers.a.network.allow_hosts[1]:",
		"{\"allow_hosts\":[\"api.example:443\",\"[::]:443\"]}}}");
	NET_BAD("providers.a.network.allow_hosts[0]:", "{\"allow_hosts\":[\"api.example\"]}}}");
	NET_BAD("providers.a.network.allow_hosts: must list", "{\"allow_hosts\":[]}}}");
	NET_BAD("providers.a.network: an object needs \"upstream\"", "{}}}");
	NET_BAD("providers.a.network: an object needs \"upstream\"",
		UP "\"allow_hosts\":[\"api.example:443\"]}}}");
	NET_BAD("providers.a.network.set_header: unknown setting",
		UP "\"set_header\":{\"x-api-key\":\"env:HOME\"}}}}");
	NET_BAD("providers.a.network: must be false", "\"everything\"}}");
	NET_BAD("providers.a.network: must be false", "1}}");
	if (geteuid() == 0) {
		key_file("key-other", "sk-secret-other\n", 0600, 65534, kother, sizeof(kother));
		NET_BAD("owned by uid 65534, not by the worker's uid 0",
			UP "\"set_headers\":{\"x-api-key\":\"file:%s\"}}}}", kother);
	} else {
		fprintf(stderr, "not root: the wrong-owner case is not tried\n");
	}
#undef UP
#undef NET_BAD
	CU_ASSERT_FATAL(n <= ARRAY_SIZE(bad));
	for (size_t i = 0; i < n; i++) {
		json_t *conf = parse(bad[i].config);

		buf_reset(&err);
		CU_ASSERT_EQUAL(prov_config_check(conf, &err), -EINVAL);
		CU_ASSERT_PTR_NOT_NULL(strstr(err.data, bad[i].path));
		if (!strstr(err.data, bad[i].path))
			fprintf(stderr, "%s: message \"%s\" lacks \"%s\"\n", bad[i].config,
				err.data, bad[i].path);
		/* No message ever holds a key. */
		CU_ASSERT_PTR_NULL(strstr(err.data, "sk-secret"));
		CU_ASSERT_PTR_NULL(strstr(err.data, "sk-a"));
		json_decref(conf);
	}
	/* The same file, 0600 and the worker's: accepted. */
	{
		char ok[512];
		json_t *conf;

		snprintf(ok, sizeof(ok),
			 "{\"a\":{\"network\":{\"upstream\":\"https://api.example\","
			 "\"set_headers\":{\"x-api-key\":\"file:%s\"}}}}",
			 kok);
		conf = parse(ok);
		buf_reset(&err);
		CU_ASSERT_EQUAL(prov_config_check(conf, &err), 0);
		if (err.len)
			fprintf(stderr, "refused: %s\n", err.data);
		json_decref(conf);
	}
	unlink(k644);
	unlink(knl);
	unlink(kok);
	unlink(klink);
	if (geteuid() == 0)
		unlink(kother);
	buf_release(&err);
}

/* A CLI entry of the registry with a bad setting is skipped with a warning that names the
 * file and the JSON path; the rest of the registry loads. */
static void test_registry_bad_settings(void)
{
	static const char *const bad[] = {
		"\"env\":{\"ANTHROPIC_API_KEY\":5}",
		"\"credentials\":7",
		"\"system_prompt\":[]",
		"\"network\":\"yes\"",
		"\"max_retries\":\"2\"",
		"\"bin\":\"\"",
	};
	struct load_args a = { .err = BUF_INIT };
	struct buf text = BUF_INIT, log = BUF_INIT;

	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		buf_reset(&text);
		buf_addf(&text,
			 "{\"providers\":{\"anthropic\":{%s,\"models\":[{\"id\":\"c\"}]},"
			 "\"local\":{\"argv\":[\"/bin/cat\"],\"models\":[{\"id\":\"ok\"}]}}}",
			 bad[i]);
		a.text = text.data;
		capture_stderr(load_args_run, &a, &log);
		CU_ASSERT_PTR_NOT_NULL_FATAL(a.reg);
		CU_ASSERT_PTR_NULL(prov_registry_find(a.reg, "c"));
		CU_ASSERT_PTR_NOT_NULL(prov_registry_find(a.reg, "ok"));
		CU_ASSERT_PTR_NOT_NULL(strstr(log.data, "registry.json: providers.anthropic."));
		CU_ASSERT_PTR_NOT_NULL(strstr(log.data, "; skipped"));
		prov_registry_free(a.reg);
	}
	buf_release(&text);
	buf_release(&log);
	buf_release(&a.err);
}

/* What a type can take and why not, as the client is told (prov_cap_refusal): the types
 * that can come from the table, the type's own reason after them; and the type facts a
 * provider gets from the table when its entry sets nothing (prestart, network). */
static void test_provider_caps(void)
{
	static const struct {
		const char *type;
		const char *says;
		const char *upstream_host;
		unsigned cap;
		unsigned prestart;
	} cases[] = {
		{ .type = "codex",
		  .cap = PROV_CAP_TOOLS,
		  .says = "model 'm' (provider type codex) cannot take tools; only claude models "
			  "can (codex exec runs every MCP tool it is given itself and cannot "
			  "hand a call back to the client)",
		  .prestart = 1,
		  .upstream_host = "api.openai.com" },
		{ .type = "vibe",
		  .cap = PROV_CAP_TOOLS,
		  .says = "model 'm' (provider type vibe) cannot take tools; "
			  "only claude models can",
		  .prestart = 0,
		  .upstream_host = "api.mistral.ai" },
		{ .type = "vibe",
		  .cap = PROV_CAP_IMAGES,
		  .says = "model 'm' (provider type vibe) takes no images; only claude models do",
		  .prestart = 0,
		  .upstream_host = "api.mistral.ai" },
		{ .type = "claude",
		  .cap = 0,
		  .says = NULL,
		  .prestart = 1,
		  .upstream_host = "api.anthropic.com" },
	};
	struct buf err = BUF_INIT, why = BUF_INIT;

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		struct buf entry = BUF_INIT;
		struct prov_provider *pv;
		struct prov_net_info ni;
		json_t *e;

		buf_addf(&entry, "{\"type\":\"%s\"}", cases[i].type);
		e = parse(entry.data);
		pv = prov_provider_from_json("p", e, &err);
		CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
		CU_ASSERT_EQUAL(prov_provider_prestart(pv), cases[i].prestart);
		prov_provider_net_info(pv, &ni);
		CU_ASSERT_STRING_EQUAL(ni.mode, "upstream");
		CU_ASSERT_STRING_EQUAL(ni.upstream_host, cases[i].upstream_host);
		if (cases[i].cap) {
			CU_ASSERT_FALSE(prov_provider_caps(pv) & cases[i].cap);
			buf_reset(&why);
			prov_cap_refusal(pv, cases[i].cap, "m", &why);
			CU_ASSERT_STRING_EQUAL(why.data, cases[i].says);
		} else {
			CU_ASSERT_EQUAL(prov_provider_caps(pv), PROV_CAP_TOOLS | PROV_CAP_IMAGES);
		}
		prov_provider_free(pv);
		json_decref(e);
		buf_release(&entry);
	}
	buf_release(&why);
	buf_release(&err);
}

/* prov_provider_from_json: a provider without a registry, checked as the registry checks
 * an entry; it copies what it keeps. */
static void test_provider_from_json(void)
{
	struct buf err = BUF_INIT;
	json_t *e = parse("{\"type\":\"command\",\"displayName\":\"Cat\",\"argv\":[\"/bin/cat\"],"
			  "\"timeout_s\":3,\"limits\":{\"pids\":9},\"output\":\"ndjson\"}");
	struct prov_provider *pv = prov_provider_from_json("cat", e, &err);
	struct prov_parser *ps;
	json_t *claude;

	json_decref(e); /* the provider keeps copies */
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_EQUAL(err.len, 0);
	CU_ASSERT_STRING_EQUAL(prov_provider_name(pv), "cat");
	CU_ASSERT_STRING_EQUAL(prov_provider_type(pv), "command");
	CU_ASSERT_STRING_EQUAL(prov_provider_display_name(pv), "Cat");
	CU_ASSERT_EQUAL(prov_provider_timeout_ms(pv), 3000);
	CU_ASSERT_EQUAL(prov_provider_limits(pv)->pids, 9);
	/* Its parser reads ndjson, not text: a chunk line becomes its content. */
	ps = prov_parser_for(pv);
	{
		struct collect c;
		struct prov_sink sink = { .emit = collect_emit, .ctx = &c };
		static const char line[] = "{\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n";

		collect_init(&c);
		CU_ASSERT_EQUAL(prov_parser_feed(ps, line, strlen(line), &sink), 0);
		CU_ASSERT_EQUAL(prov_parser_finish(ps, &sink), 0);
		CU_ASSERT_STRING_EQUAL(c.all.data, "hi");
		buf_release(&c.all);
	}
	prov_parser_free(ps);
	prov_provider_free(pv);
	prov_provider_free(NULL);

	/* The Node OLP's names give the type; a CLI's settings are read. */
	claude = parse("{\"env\":{\"ANTHROPIC_BASE_URL\":\"http://x\"},\"credentials\":[]}");
	pv = prov_provider_from_json("anthropic", claude, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_STRING_EQUAL(prov_provider_type(pv), "claude");
	prov_provider_free(pv);
	json_decref(claude);

	/* vibe is never pre-started: its argv holds the prompt of the run before (a warning,
	 * and the default, 0, holds); claude may be. */
	e = parse("{\"type\":\"vibe\",\"prestart\":2}");
	pv = prov_provider_from_json("vibe", e, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_EQUAL(prov_provider_prestart(pv), 0);
	prov_provider_free(pv);
	json_decref(e);
	e = parse("{\"type\":\"claude\",\"prestart\":2}");
	pv = prov_provider_from_json("claude", e, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_EQUAL(prov_provider_prestart(pv), 2);
	prov_provider_free(pv);
	json_decref(e);

	/* Refused: what the registry would skip, with errno EINVAL and the reason. */
	static const struct {
		const char *name, *entry, *why;
	} bad[] = {
		{ "x", "[]", "providers.x: must be an object" },
		{ "x", "{\"models\":[]}", "providers.x: no \"type\" and no \"argv\"" },
		{ "x", "{\"type\":\"teleport\"}", "providers.x.type: \"teleport\"" },
		{ "a/b", "{\"argv\":[\"/bin/cat\"]}", "provider name \"a/b\"" },
		{ "x", "{\"type\":\"command\"}", "providers.x.argv: must be" },
		{ "x", "{\"argv\":[\"/bin/cat\"],\"output\":1}", "providers.x.output: must be" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		e = parse(bad[i].entry);
		buf_reset(&err);
		errno = 0;
		CU_ASSERT_PTR_NULL(prov_provider_from_json(bad[i].name, e, &err));
		CU_ASSERT_EQUAL(errno, EINVAL);
		CU_ASSERT_PTR_NOT_NULL(strstr(err.data, bad[i].why));
		if (!strstr(err.data, bad[i].why))
			fprintf(stderr, "%s: \"%s\" lacks \"%s\"\n", bad[i].entry, err.data,
				bad[i].why);
		json_decref(e);
	}
	buf_release(&err);
}

static void test_registry_shipped_default(void)
{
	struct buf err = BUF_INIT;
	struct prov_registry *reg = prov_registry_load(OLP_DEFAULT_REGISTRY, NULL, &err);
	size_t i;

	CU_ASSERT_PTR_NOT_NULL_FATAL(reg);
	CU_ASSERT(prov_registry_model_count(reg) >= 1);
	for (i = 0; i < prov_registry_model_count(reg); i++) {
		const struct prov_model *m = prov_registry_model_at(reg, i);

		CU_ASSERT_PTR_NOT_NULL_FATAL(m);
		CU_ASSERT(m->id[0] != '\0');
		CU_ASSERT_PTR_EQUAL(prov_registry_find(reg, m->id), m);
		CU_ASSERT_PTR_NOT_NULL(m->provider);
	}
	prov_registry_free(reg);
	buf_release(&err);
}

/* Whether a provider's program and credentials are on this host, as the owner's /health
 * (and the dashboard) shows them. */
static void expect_cli_state(const char *entry, bool found, const char *creds)
{
	json_t *e = parse(entry);
	struct buf err = BUF_INIT;
	struct prov_provider *pv = prov_provider_from_json("p", e, &err);
	struct prov_cli_state cs;

	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	prov_provider_cli_state(pv, &cs);
	CU_ASSERT_EQUAL(cs.cli_found, found);
	CU_ASSERT_STRING_EQUAL(cs.credentials, creds);
	if (cs.cli_found != found || strcmp(cs.credentials, creds))
		fprintf(stderr, "%s: got %d %s\n", entry, cs.cli_found, cs.credentials);
	prov_provider_free(pv);
	json_decref(e);
	buf_release(&err);
}

static void test_cli_state(void)
{
	char exe[256], cred[256], key[256], entry[2048];

	key_file("fake-cli", "#!/bin/sh\n", 0700, -1, exe, sizeof(exe));
	key_file("cred.json", "{}", 0600, -1, cred, sizeof(cred));
	key_file("api-key", "sk-test\n", 0600, -1, key, sizeof(key));
	/* A command: its argv[0] executable; no credentials of its own. */
	expect_cli_state("{\"argv\":[\"/bin/cat\"]}", true, "not_needed");
	snprintf(entry, sizeof(entry), "{\"argv\":[\"%s\"]}", cred); /* not executable */
	expect_cli_state(entry, false, "not_needed");
	/* A CLI: its "bin"; its configured credentials, every one of them. */
	snprintf(entry, sizeof(entry),
		 "{\"type\":\"claude\",\"bin\":\"%s\",\"credentials\":[\"%s\"]}", exe, cred);
	expect_cli_state(entry, true, "present");
	snprintf(entry, sizeof(entry),
		 "{\"type\":\"codex\",\"bin\":\"%s/none\",\"credentials\":[\"%s\",\"%s/"
		 "gone.json\"]}",
		 tmpdir, cred, tmpdir);
	expect_cli_state(entry, false, "missing");
	/* Secretless upstream: the worker holds the credential, the run needs none. */
	snprintf(entry, sizeof(entry),
		 "{\"type\":\"claude\",\"bin\":\"%s\",\"network\":{\"upstream\":"
		 "\"https://api.anthropic.com\",\"set_headers\":{\"authorization\":\"Bearer "
		 "file:%s\"}}}",
		 exe, key);
	expect_cli_state(entry, true, "not_needed");
	unlink(exe);
	unlink(cred);
	unlink(key);
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "flatten messages", test_flatten },
		{ "flatten keeps binary bytes", test_flatten_binary },
		{ "flatten into content blocks, images in place", test_flatten_blocks },
		{ "response_format messages", test_format_messages },
		{ "text reader: whole", test_text_whole },
		{ "text reader: byte by byte", test_text_byte_by_byte },
		{ "text reader: every split", test_text_every_split },
		{ "text reader: truncated tail flushed", test_text_truncated_tail },
		{ "text reader: invalid bytes pass through", test_text_invalid_passthrough },
		{ "text reader: client view independent of cuts",
		  test_text_split_invariant_after_invalid },
		{ "text reader: empty feeds", test_text_empty_feeds },
		{ "text reader: sink abort propagates", test_text_sink_abort },
		{ "parser types", test_parser_types },
		{ "parsers: numbers checked before they become integers", test_parser_numbers },
		{ "registry: command provider", test_registry_command },
		{ "registry: defaults", test_registry_defaults },
		{ "registry: aliases", test_registry_aliases },
		{ "registry: alias patterns", test_registry_alias_patterns },
		{ "registry: duplicate ids keep the first", test_registry_duplicates },
		{ "registry: invalid command entries skipped", test_registry_invalid_commands },
		{ "registry: types not run yet skipped", test_registry_types_not_run },
		{ "registry: load failures", test_registry_load_failures },
		{ "registry: timeouts", test_registry_timeouts },
		{ "registry: limits", test_registry_limits },
		{ "registry: names checked at load", test_registry_names },
		{ "registry: bad settings of an entry skip it", test_registry_bad_settings },
		{ "config.json providers checked at start", test_config_check },
		{ "network: every form, and each type's default", test_network_forms },
		{ "network: bad forms and unusable credentials refused", test_network_errors },
		{ "a provider from JSON, without a registry", test_provider_from_json },
		{ "a type's capabilities and defaults, from the table", test_provider_caps },
		{ "start-up notes: once per pool, only for an installed program",
		  test_registry_notes },
		{ "CLI and credentials found or not (/health)", test_cli_state },
		{ "registry: shipped default loads", test_registry_shipped_default },
		{ NULL, NULL },
	};
	int fails;

	if (!mkdtemp(tmpdir))
		return 1;
	fails = ts_cunit_run("providers", tests);
	rmdir(tmpdir);
	return ts_exit_status(fails);
}
