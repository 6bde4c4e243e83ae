/* CUnit suite for the claude, codex and vibe providers: their stream parsers on output
 * recorded from the real CLIs (fixtures/, from docs/providers.md), fed whole, a byte at a
 * time and split at every position; unknown types, garbage, truncated and overlong lines;
 * error mapping; and prov_run with a stand-in CLI under the real sandbox (plan, binds,
 * early answer at the "result" line, status mapping). */
#include "tests/support/cunit.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "providers/providers.h"
#include "sandbox/sandbox.h"
#include "tests/support/recorder.h"
#include "common/banned.h"

/* ---- feeding -------------------------------------------------------------------------- */

struct feed_result {
	int first_stop; /* the first non-zero feed return */
	int finish_ret;
};

/* Feed data in pieces of step bytes (0 = whole), or, when split >= 0, as two pieces cut
 * at split (either may be empty). */
static struct feed_result feed(const char *type, const char *data, size_t len, size_t step,
			       long split, struct ts_rec *r)
{
	struct prov_sink sink = ts_rec_sink(r);
	struct prov_parser *ps = prov_parser_new(type);
	struct feed_result fr = { 0 };
	size_t off = 0;

	CU_ASSERT_FATAL(ps != NULL);
	while (off < len || (split >= 0 && off == 0)) {
		size_t n = split >= 0 ? (off ? len - off : (size_t)split) : step ? step : len;
		int ret;

		if (n > len - off)
			n = len - off;
		ret = prov_parser_feed(ps, data + off, n, &sink);
		if (ret && !fr.first_stop)
			fr.first_stop = ret;
		off += n;
		if (split >= 0 && off == 0)
			split = -1, step = len; /* an empty first piece: then the rest whole */
	}
	fr.finish_ret = prov_parser_finish(ps, &sink);
	prov_parser_free(ps);
	CU_ASSERT_EQUAL(r->malformed, 0);
	return fr;
}

static char *fixture(const char *name, size_t *len)
{
	struct buf b = BUF_INIT;
	char path[4096];

	snprintf(path, sizeof(path), "%s/%s", FIXTURES_DIR, name);
	if (buf_read_file(&b, path, 1 << 20)) {
		CU_FAIL_FATAL("fixture missing");
	}
	return buf_detach(&b, len);
}

/* Whether a split at i is worth trying: every position of a short recording; in a long one
 * (claude's tool calls, 33 KB: every split was a 50 s test under load, at 33,000 parses of
 * the whole file), every position within 16 bytes of a line's end, where the reader's line
 * handling is, and every 7th elsewhere, which still cuts inside every kind of token. */
static bool split_worth_trying(const char *data, size_t len, size_t i)
{
	size_t lo = i > 16 ? i - 16 : 0, hi = i + 16 < len ? i + 16 : len;

	if (len <= 12288 || i % 7 == 0)
		return true;
	return memchr(data + lo, '\n', hi - lo) != NULL;
}

/* Feed data whole, byte by byte and split at every position that matters (above): the
 * events must be the same every time. Leaves the whole-feed events in r and returns its
 * feed result. */
static struct feed_result feed_all_ways(const char *type, const char *data, size_t len,
					struct ts_rec *r)
{
	struct feed_result whole = feed(type, data, len, 0, -1, r), fr;
	struct ts_rec other;

	ts_rec_init(&other);
	fr = feed(type, data, len, 1, -1, &other);
	CU_ASSERT_STRING_EQUAL(other.log.data, r->log.data);
	CU_ASSERT_EQUAL(fr.first_stop, whole.first_stop);
	ts_rec_release(&other);
	for (size_t i = 0; i <= len; i++) {
		if (!split_worth_trying(data, len, i))
			continue;
		ts_rec_init(&other);
		fr = feed(type, data, len, 0, (long)i, &other);
		if (strcmp(other.log.data, r->log.data) || fr.first_stop != whole.first_stop) {
			fprintf(stderr, "\n%s: split at %zu differs:\n%s---\n%s", type, i,
				other.log.data, r->log.data);
			CU_FAIL("split feed differs from whole feed");
			ts_rec_release(&other);
			break;
		}
		ts_rec_release(&other);
	}
	return whole;
}

/* ---- claude --------------------------------------------------------------------------- */

static void test_claude_success(void)
{
	size_t len;
	auto_free char *data = fixture("claude-success.ndjson", &len);
	struct ts_rec r;
	struct feed_result fr;

	ts_rec_init(&r);
	fr = feed_all_ways("claude", data, len, &r);
	CU_ASSERT_STRING_EQUAL(r.text.data, "Hello from the fake Anthropic server!");
	CU_ASSERT_EQUAL(r.ndeltas, 6); /* one per text_delta; the "assistant" repeat is dropped */
	CU_ASSERT_STRING_EQUAL(r.finish, "stop");
	CU_ASSERT_EQUAL(r.usage.prompt_tokens, 10);
	CU_ASSERT_EQUAL(r.usage.completion_tokens, 6);
	CU_ASSERT_EQUAL(r.usage.total_tokens, 16);
	CU_ASSERT_EQUAL(r.usage.cached_tokens, 0);
	CU_ASSERT_EQUAL(r.nerrors, 0);
	CU_ASSERT(fr.first_stop > 0); /* the result line says "done" */
	/* The prompt's count when the message starts (a run cut before its result has spent
	 * it), then the whole run's at the result. */
	CU_ASSERT_STRING_EQUAL(r.log.data, "usage 10 1 11 0 partial\n"
					   "delta Hello\ndelta  from\ndelta  the\ndelta  fake\n"
					   "delta  Anthropic\ndelta  server!\nusage 10 6 16 0\n"
					   "finish stop\n");
	CU_ASSERT_FALSE(r.usage.partial);
	ts_rec_release(&r);
}

/* The model calls two of the client's functions (the real claude 2.1.332 with
 * olp-mcp-tools against the fake upstream): each call's id, name (without claude's
 * mcp__olp__ prefix) and argument pieces, then usage and "tool_calls", and the answer is
 * over at the message's end: what claude does next (permission denied, a second request
 * answered in text) is never read. */
static void test_claude_tool_calls(void)
{
	size_t len;
	auto_free char *data = fixture("claude-tool-calls.ndjson", &len);
	struct ts_rec r;
	struct feed_result fr;

	ts_rec_init(&r);
	fr = feed_all_ways("claude", data, len, &r);
	CU_ASSERT_STRING_EQUAL(r.text.data, "");
	CU_ASSERT_STRING_EQUAL(r.finish, "tool_calls");
	CU_ASSERT_EQUAL(r.nerrors, 0);
	CU_ASSERT(fr.first_stop > 0);
	CU_ASSERT_STRING_EQUAL(r.log.data, "usage 10 1 11 0 partial\n"
					   "tool 0 toolu_fake_1_0 get_weather \n"
					   "tool 0 - - {\"city\":\n"
					   "tool 0 - - \"Paris\"}\n"
					   "tool 1 toolu_fake_1_1 get_time \n"
					   "tool 1 - - {\"n\n"
					   "tool 1 - - \":1}\n"
					   "usage 10 6 16 0\n"
					   "finish tool_calls\n");
	if (r.log.data && !strstr(r.log.data, "finish tool_calls"))
		fprintf(stderr, "%s\n", r.log.data);
	ts_rec_release(&r);
}

static void test_claude_429(void)
{
	size_t len;
	auto_free char *data = fixture("claude-429.ndjson", &len);
	struct ts_rec r;
	struct feed_result fr;

	ts_rec_init(&r);
	fr = feed_all_ways("claude", data, len, &r);
	CU_ASSERT_EQUAL(r.ndeltas, 0); /* "API Error: …" is not the answer */
	CU_ASSERT_EQUAL(r.nerrors, 1);
	CU_ASSERT_EQUAL(r.err, PROV_ERR_PROVIDER_ERROR);
	CU_ASSERT_EQUAL(r.upstream_status, 429);
	CU_ASSERT_PTR_NOT_NULL(strstr(r.message, "429"));
	CU_ASSERT_PTR_NULL(strstr(r.message, "fake 429")); /* never the upstream's own text */
	CU_ASSERT(fr.first_stop > 0);
	ts_rec_release(&r);
}

static void test_claude_not_logged_in(void)
{
	size_t len;
	auto_free char *data = fixture("claude-not-logged-in.ndjson", &len);
	struct ts_rec r;

	ts_rec_init(&r);
	feed_all_ways("claude", data, len, &r);
	CU_ASSERT_EQUAL(r.nerrors, 1);
	CU_ASSERT_EQUAL(r.err, PROV_ERR_AUTH_MISSING);
	CU_ASSERT_PTR_NOT_NULL(strstr(r.message, "log in"));
	CU_ASSERT_PTR_NOT_NULL(strstr(r.message, "ANTHROPIC_API_KEY"));
	CU_ASSERT_EQUAL(r.ndeltas, 0);
	ts_rec_release(&r);
}

/* Recorded lines with garbage, blank lines, CRLF and unknown types in between: the same
 * answer, the odd lines ignored. */
static void test_claude_garbage_and_unknown(void)
{
	size_t len;
	auto_free char *data = fixture("claude-success.ndjson", &len);
	struct buf noisy = BUF_INIT;
	const char *p = data, *nl;
	struct ts_rec r;
	int i = 0;

	while ((nl = memchr(p, '\n', len - (size_t)(p - data)))) {
		switch (i++ % 6) {
		case 0: buf_adds(&noisy, "not json at all\n"); break;
		case 1: buf_adds(&noisy, "{\"type\":\"brand_new_event\",\"x\":[1,2]}\r\n"); break;
		case 2: buf_adds(&noisy, "\n\r\n   \n"); break;
		case 3: buf_adds(&noisy, "[1,2,3]\n{\"type\":\"stream_event\"}\n"); break;
		case 4: buf_adds(&noisy, "{\"broken\": \n"); break;
		case 5:
			buf_adds(&noisy,
				 "{\"type\":\"rate_limit_event\",\"rate_limit_info\":{}}\n");
			break;
		}
		buf_add(&noisy, p, (size_t)(nl - p));
		buf_adds(&noisy, i % 2 ? "\r\n" : "\n");
		p = nl + 1;
	}
	ts_rec_init(&r);
	feed_all_ways("claude", noisy.data, noisy.len, &r);
	CU_ASSERT_STRING_EQUAL(r.text.data, "Hello from the fake Anthropic server!");
	CU_ASSERT_EQUAL(r.ndeltas, 6);
	CU_ASSERT_EQUAL(r.usage.total_tokens, 16);
	CU_ASSERT_EQUAL(r.nerrors, 0);
	ts_rec_release(&r);
	buf_release(&noisy);
}

/* The process died in the middle of the result line: the deltas stand, nothing else. */
static void test_claude_truncated(void)
{
	size_t len;
	auto_free char *data = fixture("claude-success.ndjson", &len);
	const char *last = memmem(data, len, "{\"duration_api_ms\"", 18);
	struct ts_rec r;
	struct feed_result fr;

	CU_ASSERT_FATAL(last != NULL);
	ts_rec_init(&r);
	fr = feed_all_ways("claude", data, (size_t)(last - data) + 200, &r);
	CU_ASSERT_EQUAL(r.ndeltas, 6);
	/* Only the prompt's count from the message's start: prov_run estimates the rest. */
	CU_ASSERT(r.usage.present && r.usage.partial);
	CU_ASSERT_EQUAL(r.usage.prompt_tokens, 10);
	CU_ASSERT_STRING_EQUAL(r.finish, "");
	CU_ASSERT_EQUAL(r.nerrors, 0);
	CU_ASSERT_EQUAL(fr.first_stop, 0);
	ts_rec_release(&r);
	/* Complete but without its final newline: handled at the end of output. */
	ts_rec_init(&r);
	(void)feed("claude", data, len - 1, 0, -1, &r);
	CU_ASSERT_EQUAL(r.usage.total_tokens, 16);
	CU_ASSERT_STRING_EQUAL(r.finish, "stop");
	ts_rec_release(&r);
}

static void test_claude_variants(void)
{
	/* No partial messages: the assistant line is the answer, the result does not repeat
	 * it; cache tokens count into the prompt; max_tokens means "length". */
	static const char a[] =
		"{\"type\":\"assistant\",\"message\":{\"content\":[{\"type\":\"text\",\"text\":"
		"\"Hi \"},"
		"{\"type\":\"tool_use\",\"name\":\"x\"},{\"type\":\"text\",\"text\":\"there\"}]},"
		"\"parent_tool_use_id\":null}\n"
		"{\"type\":\"assistant\",\"message\":{\"content\":[{\"type\":\"text\",\"text\":"
		"\"SUB\"}]},"
		"\"parent_tool_use_id\":\"toolu_1\"}\n"
		"{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"result\":\"Hi "
		"there\","
		"\"stop_reason\":\"max_tokens\",\"usage\":{\"input_tokens\":5,"
		"\"cache_read_input_tokens\":100,\"cache_creation_input_tokens\":20,\"output_"
		"tokens\":7}}\n";
	/* Only a result line: its text is the answer. */
	static const char b[] =
		"{\"type\":\"result\",\"is_error\":false,\"result\":\"Only result\"}\n";
	/* An error subtype without is_error; a 500 status. */
	static const char c[] = "{\"type\":\"result\",\"subtype\":\"error_during_execution\","
				"\"api_error_status\":500,\"is_error\":true}\n";
	struct ts_rec r;

	ts_rec_init(&r);
	feed_all_ways("claude", a, sizeof(a) - 1, &r);
	CU_ASSERT_STRING_EQUAL(r.text.data, "Hi there");
	CU_ASSERT_STRING_EQUAL(r.finish, "length");
	CU_ASSERT_EQUAL(r.usage.prompt_tokens, 125);
	CU_ASSERT_EQUAL(r.usage.cached_tokens, 100);
	CU_ASSERT_EQUAL(r.usage.completion_tokens, 7);
	CU_ASSERT_EQUAL(r.usage.total_tokens, 132);
	ts_rec_release(&r);

	ts_rec_init(&r);
	feed_all_ways("claude", b, sizeof(b) - 1, &r);
	CU_ASSERT_STRING_EQUAL(r.text.data, "Only result");
	CU_ASSERT_STRING_EQUAL(r.finish, "stop");
	ts_rec_release(&r);

	ts_rec_init(&r);
	feed_all_ways("claude", c, sizeof(c) - 1, &r);
	CU_ASSERT_EQUAL(r.err, PROV_ERR_PROVIDER_ERROR);
	CU_ASSERT_EQUAL(r.upstream_status, 500);
	CU_ASSERT_EQUAL(r.ndeltas, 0);
	ts_rec_release(&r);

	/* claude 2.1.332 after the upstream stopped at max_tokens (and its own resumes):
	 * an error result whose api_error says so. For the client: "length", no error. */
	static const char d[] = "{\"type\":\"stream_event\",\"event\":{\"type\":\"content_block_"
				"delta\",\"index\":0,"
				"\"delta\":{\"type\":\"text_delta\",\"text\":\"cut here\"}}}\n"
				"{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":true,"
				"\"api_error\":\"max_output_tokens\",\"api_error_status\":null,"
				"\"terminal_reason\":\"api_error\",\"usage\":{\"input_tokens\":3,"
				"\"output_tokens\":9}}\n";

	ts_rec_init(&r);
	feed_all_ways("claude", d, sizeof(d) - 1, &r);
	CU_ASSERT_EQUAL(r.err, PROV_OK);
	CU_ASSERT_EQUAL(r.nerrors, 0);
	CU_ASSERT_STRING_EQUAL(r.text.data, "cut here");
	CU_ASSERT_STRING_EQUAL(r.finish, "length");
	CU_ASSERT_EQUAL(r.usage.completion_tokens, 9);
	ts_rec_release(&r);
}

/* Recorded from the real claude against fake-anthropic.mjs's "cut" model: the stream
 * broke three times after "Hello from" (each attempt ends in message_stop with
 * "abandoned_blocks"), then claude's non-streaming retry answered in one "assistant"
 * message. The client gets the words once, and only the rest from the retry. */
static void test_claude_cut_and_retry(void)
{
	size_t len;
	auto_free char *data = fixture("claude-cut-retry.ndjson", &len);
	/* A retry that answers differently cannot be stitched to what was sent. */
	static const char diverge[] =
		"{\"type\":\"stream_event\",\"api_message_id\":\"m1\",\"event\":{\"type\":"
		"\"content_block_delta\","
		"\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}}\n"
		"{\"type\":\"stream_event\",\"api_message_id\":\"m1\",\"abandoned_blocks\":{},"
		"\"event\":{\"type\":\"message_stop\"}}\n"
		"{\"type\":\"assistant\",\"message\":{\"id\":\"m2\",\"content\":[{\"type\":"
		"\"text\","
		"\"text\":\"Goodbye\"}]}}\n"
		"{\"type\":\"result\",\"is_error\":false,\"result\":\"Goodbye\"}\n";
	struct ts_rec r;

	ts_rec_init(&r);
	feed_all_ways("claude", data, len, &r);
	CU_ASSERT_STRING_EQUAL(r.text.data, "Hello from the fake Anthropic server!");
	CU_ASSERT_STRING_EQUAL(r.log.data, "usage 10 1 11 0 partial\ndelta Hello\ndelta  from\n"
					   "usage 10 1 11 0 partial\nusage 10 1 11 0 partial\n"
					   "delta  the fake Anthropic server!\n"
					   "usage 40 9 49 0\nfinish stop\n"); /* all 4 attempts */
	CU_ASSERT_EQUAL(r.nerrors, 0);
	ts_rec_release(&r);

	ts_rec_init(&r);
	feed_all_ways("claude", diverge, sizeof(diverge) - 1, &r);
	CU_ASSERT_STRING_EQUAL(r.text.data, "Hello");
	CU_ASSERT_EQUAL(r.nerrors, 1);
	CU_ASSERT_PTR_NOT_NULL(strstr(r.message, "retry"));
	ts_rec_release(&r);
}

/* After the result line the answer is complete: more output is ignored. */
static void test_claude_done_ignores_rest(void)
{
	size_t len;
	auto_free char *data = fixture("claude-success.ndjson", &len);
	struct buf more = BUF_INIT;
	struct ts_rec r;

	buf_add(&more, data, len);
	buf_adds(&more, "{\"type\":\"stream_event\",\"event\":{\"type\":\"content_block_delta\","
			"\"delta\":{\"type\":\"text_delta\",\"text\":\"LATE\"}}}\n");
	ts_rec_init(&r);
	feed_all_ways("claude", more.data, more.len, &r);
	CU_ASSERT_PTR_NULL(strstr(r.text.data, "LATE"));
	ts_rec_release(&r);
	buf_release(&more);
}

static void test_sink_abort(void)
{
	size_t len;
	auto_free char *data = fixture("claude-success.ndjson", &len);
	struct prov_parser *ps = prov_parser_new("claude");
	struct ts_rec r;
	struct prov_sink sink = ts_rec_sink(&r);

	ts_rec_init(&r);
	r.abort_after = 3; /* the prompt's usage, then two deltas */
	CU_ASSERT_EQUAL(prov_parser_feed(ps, data, len, &sink), -1);
	CU_ASSERT_EQUAL(r.ndeltas, 2);
	prov_parser_free(ps);
	ts_rec_release(&r);
}

/* A line that never ends is refused at the bound, with an error a client can read. */
static void test_overlong_line(void)
{
	static const char *const types[] = { "claude", "codex", "vibe" };
	size_t chunk = 1 << 20;
	char *junk = malloc(chunk);

	CU_ASSERT_FATAL(junk != NULL);
	memset(junk, 'a', chunk);
	for (size_t t = 0; t < ARRAY_SIZE(types); t++) {
		struct prov_parser *ps = prov_parser_new(types[t]);
		struct ts_rec r;
		struct prov_sink sink = ts_rec_sink(&r);
		int ret = 0;

		ts_rec_init(&r);
		for (size_t i = 0; i <= PROV_MAX_OUTPUT_LINE / chunk && ret == 0; i++)
			ret = prov_parser_feed(ps, junk, chunk, &sink);
		CU_ASSERT(ret > 0);
		CU_ASSERT_EQUAL(r.nerrors, 1);
		CU_ASSERT_EQUAL(r.err, PROV_ERR_PROVIDER_ERROR);
		CU_ASSERT_PTR_NOT_NULL(strstr(r.message, "longer than"));
		CU_ASSERT(prov_parser_feed(ps, "{}\n", 3, &sink) > 0);
		CU_ASSERT_EQUAL(prov_parser_finish(ps, &sink), 0);
		CU_ASSERT_EQUAL(r.nerrors, 1);
		prov_parser_free(ps);
		ts_rec_release(&r);
	}
	free(junk);
}

/* ---- codex ---------------------------------------------------------------------------- */

static void test_codex_success(void)
{
	size_t len;
	auto_free char *data = fixture("codex-success.ndjson", &len);
	struct ts_rec r;
	struct feed_result fr;

	ts_rec_init(&r);
	fr = feed_all_ways("codex", data, len, &r);
	CU_ASSERT_STRING_EQUAL(r.text.data, "Hello from the fake OpenAI server!");
	CU_ASSERT_EQUAL(r.ndeltas, 1);
	CU_ASSERT_EQUAL(r.nerrors, 0); /* the model-metadata "error" item is a warning */
	CU_ASSERT_EQUAL(r.usage.prompt_tokens, 10);
	CU_ASSERT_EQUAL(r.usage.completion_tokens, 6);
	CU_ASSERT_EQUAL(r.usage.total_tokens, 16);
	CU_ASSERT_STRING_EQUAL(r.finish, "stop");
	CU_ASSERT(fr.first_stop > 0);
	ts_rec_release(&r);
}

static void test_codex_401(void)
{
	size_t len;
	auto_free char *data = fixture("codex-401.ndjson", &len);
	struct ts_rec r;

	ts_rec_init(&r);
	feed_all_ways("codex", data, len, &r);
	CU_ASSERT_EQUAL(r.nerrors, 1);
	CU_ASSERT_EQUAL(r.err, PROV_ERR_PROVIDER_ERROR);
	CU_ASSERT_EQUAL(r.upstream_status, 401);
	CU_ASSERT_PTR_NULL(strstr(r.message, "127.0.0.1")); /* no upstream URL to clients */
	CU_ASSERT_EQUAL(r.ndeltas, 0);
	ts_rec_release(&r);
}

static void test_codex_command_and_retries(void)
{
	size_t len;
	auto_free char *data = fixture("codex-command.ndjson", &len);
	/* A retry reported as "error" and then a completed turn: not a failure. */
	static const char retry[] =
		"{\"type\":\"turn.started\"}\n"
		"{\"type\":\"error\",\"message\":\"Reconnecting... 1/5 (unexpected status 500)\"}\n"
		"{\"type\":\"item.completed\",\"item\":{\"id\":\"item_1\",\"type\":\"reasoning\","
		"\"text\":\"hmm\"}}\n"
		"{\"type\":\"item.completed\",\"item\":{\"id\":\"item_2\",\"type\":\"agent_"
		"message\",\"text\":\"First.\"}}\n"
		"{\"type\":\"item.completed\",\"item\":{\"id\":\"item_3\",\"type\":\"agent_"
		"message\",\"text\":\"Second.\"}}\n"
		"{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":30,\"cached_input_"
		"tokens\":20,\"output_tokens\":4}}\n";
	/* An error and then the process exits: the failure is reported at the end. */
	static const char died[] = "{\"type\":\"turn.started\"}\n"
				   "{\"type\":\"error\",\"message\":\"exceeded retry limit, last "
				   "status: 429 Too Many Requests\"}\n";
	struct ts_rec r;

	ts_rec_init(&r);
	feed_all_ways("codex", data, len, &r);
	CU_ASSERT_PTR_NOT_NULL(strstr(r.text.data, "hi-from-codex-sandbox"));
	CU_ASSERT_PTR_NULL(strstr(r.text.data, "/bin/bash")); /* the command item is not text */
	CU_ASSERT_EQUAL(r.usage.total_tokens, 40);
	ts_rec_release(&r);

	ts_rec_init(&r);
	feed_all_ways("codex", retry, sizeof(retry) - 1, &r);
	CU_ASSERT_EQUAL(r.nerrors, 0);
	CU_ASSERT_STRING_EQUAL(r.text.data, "First.\n\nSecond.");
	CU_ASSERT_EQUAL(r.usage.prompt_tokens, 30);
	CU_ASSERT_EQUAL(r.usage.cached_tokens, 20);
	ts_rec_release(&r);

	ts_rec_init(&r);
	feed_all_ways("codex", died, sizeof(died) - 1, &r);
	CU_ASSERT_EQUAL(r.nerrors, 1);
	CU_ASSERT_EQUAL(r.upstream_status, 429);
	ts_rec_release(&r);
}

/* The model calls two of the client's functions (the real codex 0.171.0 with
 * olp-mcp-tools and its hook, against the fake upstream): each MCP call of server "olp"
 * whole, with an id made of the thread id, then, at the end of output (the hook stopped
 * codex before it asked the model again: no turn.completed), "tool_calls" and "done". */
static void test_codex_tool_calls(void)
{
	size_t len;
	auto_free char *data = fixture("codex-tool-calls.ndjson", &len);
	/* A turn that completes after a call (no hook: codex asked again and was answered
	 * in text): the calls stand, the text too, and the end is still "tool_calls". An MCP
	 * call of another server is codex's own business. */
	static const char completed[] =
		"{\"type\":\"thread.started\",\"thread_id\":\"01a2-ff\"}\n"
		"{\"type\":\"item.started\",\"item\":{\"id\":\"item_1\",\"type\":\"mcp_tool_"
		"call\",\"server\":\"other\",\"tool\":\"x\",\"arguments\":{}}}\n"
		"{\"type\":\"item.started\",\"item\":{\"id\":\"item_2\",\"type\":\"mcp_tool_"
		"call\",\"server\":\"olp\",\"tool\":\"ping\",\"arguments\":null}}\n"
		"{\"type\":\"item.completed\",\"item\":{\"id\":\"item_3\",\"type\":\"agent_"
		"message\",\"text\":\"Done.\"}}\n"
		"{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":3,\"output_tokens\":"
		"1}}\n";
	struct ts_rec r;
	struct feed_result fr;

	ts_rec_init(&r);
	fr = feed_all_ways("codex", data, len, &r);
	CU_ASSERT_STRING_EQUAL(r.log.data,
			       "tool 0 call_01a23637ae3574c0bf5088f1a80153ac_0 get_weather "
			       "{\"city\":\"Paris\"}\n"
			       "tool 1 call_01a23637ae3574c0bf5088f1a80153ac_1 get_time {\"n\":1}\n"
			       "finish tool_calls\n");
	CU_ASSERT_EQUAL(r.nerrors, 0); /* the hook-trust and metadata "error" items warn */
	CU_ASSERT_EQUAL(fr.first_stop, 0);
	CU_ASSERT(fr.finish_ret > 0); /* complete at the end of output */
	ts_rec_release(&r);

	ts_rec_init(&r);
	fr = feed_all_ways("codex", completed, sizeof(completed) - 1, &r);
	CU_ASSERT_PTR_NOT_NULL(strstr(r.log.data, "tool 0 call_01a2ff_0 ping {}\n"));
	CU_ASSERT_PTR_NULL(strstr(r.log.data, " x "));
	CU_ASSERT_STRING_EQUAL(r.text.data, "Done.");
	CU_ASSERT_STRING_EQUAL(r.finish, "tool_calls");
	CU_ASSERT(fr.first_stop > 0);
	ts_rec_release(&r);
}

/* ---- vibe ----------------------------------------------------------------------------- */

static void test_vibe(void)
{
	size_t len;
	auto_free char *deltas = fixture("vibe-deltas.ndjson", &len);
	size_t len2;
	auto_free char *msgs = fixture("vibe-messages.ndjson", &len2);
	static const char err[] = "{\"content\":\"partial\"}\n"
				  "{\"type\":\"error\",\"message\":\"API error: status 429\"}\n";
	struct ts_rec r;
	struct feed_result fr;

	ts_rec_init(&r);
	fr = feed_all_ways("vibe", deltas, len, &r);
	CU_ASSERT_STRING_EQUAL(r.text.data, "Hello from vibe, streaming!");
	CU_ASSERT_EQUAL(r.usage.prompt_tokens, 12);
	CU_ASSERT_EQUAL(r.usage.total_tokens, 17);
	CU_ASSERT_STRING_EQUAL(r.finish, "stop");
	CU_ASSERT(fr.first_stop > 0);
	ts_rec_release(&r);

	ts_rec_init(&r);
	feed_all_ways("vibe", msgs, len2, &r);
	CU_ASSERT_STRING_EQUAL(r.text.data, "Hello from vibe!"); /* not the system or user text */
	ts_rec_release(&r);

	ts_rec_init(&r);
	feed_all_ways("vibe", err, sizeof(err) - 1, &r);
	CU_ASSERT_STRING_EQUAL(r.text.data, "partial");
	CU_ASSERT_EQUAL(r.nerrors, 1);
	CU_ASSERT_EQUAL(r.upstream_status, 429);
	ts_rec_release(&r);
}

/* Each fixture through each parser: the wrong parser must not crash either. */
static void test_cross_feed(void)
{
	static const char *const types[] = { "claude", "codex", "vibe" };
	static const char *const files[] = { "claude-success.ndjson",	"claude-429.ndjson",
					     "codex-success.ndjson",	"codex-401.ndjson",
					     "codex-tool-calls.ndjson", "vibe-deltas.ndjson" };

	for (size_t t = 0; t < ARRAY_SIZE(types); t++)
		for (size_t f = 0; f < ARRAY_SIZE(files); f++) {
			size_t len;
			auto_free char *data = fixture(files[f], &len);
			struct ts_rec r;

			ts_rec_init(&r);
			feed(types[t], data, len, 7, -1, &r);
			ts_rec_release(&r);
		}
	CU_ASSERT_PTR_NULL(prov_parser_new("no-such-type"));
}

/* ---- prov_run with a stand-in CLI under the sandbox ----------------------------------- */

static char tmpdir[] = "/tmp/olp-provcli-test-XXXXXX";

/* A registry with one provider of type, whose "bin" is fixtures/fake-cli.sh, handing it
 * the fixture through a credentials bind, and a writable directory (tmpdir/seen, "seen" in
 * the home) where it leaves what it was given: a directory is bound as it is, so what the
 * stand-in writes there is seen at once, whatever a credentials file's write-back would
 * make of it (issue 22: only a login's owner's run writes one back, in the CLI's format). */
static struct prov_registry *fake_registry(const char *type, const char *output, const char *extra)
{
	struct buf reg = BUF_INIT, err = BUF_INIT, path = BUF_INIT;
	struct prov_registry *r;
	int fd;

	buf_addf(&path, "%s/registry.json", tmpdir);
	buf_addf(&reg,
		 "{\"providers\":{\"p\":{\"type\":\"%s\",\"bin\":\"%s/"
		 "fake-cli.sh\",\"timeout_s\":20,\"network\":false,"
		 "\"credentials\":{\"%s/%s\":\"out.ndjson\",\"%s/seen\":\"seen\"},"
		 "\"credentials_writable\":true,"
		 "\"env\":{\"FAKE_OUTPUT\":\"" SBX_HOME_PATH "/out.ndjson\","
		 "\"FAKE_ARGV_OUT\":\"" SBX_HOME_PATH "/seen/argv.txt\","
		 "\"FAKE_STDIN_OUT\":\"" SBX_HOME_PATH "/seen/stdin.txt\"%s},"
		 "\"models\":[{\"id\":\"m-1\"}]}}}",
		 type, FIXTURES_DIR, FIXTURES_DIR, output, tmpdir, extra);
	fd = open(path.data, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(write_all(fd, reg.data, reg.len), 0);
	close(fd);
	r = prov_registry_load(path.data, NULL, &err);
	if (!r)
		fprintf(stderr, "registry: %s\n", err.data);
	CU_ASSERT_FATAL(r != NULL);
	buf_release(&reg);
	buf_release(&err);
	buf_release(&path);
	return r;
}

/* An empty file in tmpdir/seen for the stand-in (another uid) to write into. */
static void reset_file(const char *name, struct buf *path)
{
	int fd;

	buf_reset(path);
	buf_addf(path, "%s/seen", tmpdir);
	(void)mkdir(path->data, 0777);
	CU_ASSERT_FATAL(chmod(path->data, 0777) == 0);
	buf_addf(path, "/%s", name);
	fd = open(path->data, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT(fchmod(fd, 0666) == 0);
	close(fd);
}

/* The client's tools for the next run_fake_msgs (NULL: none). */
static const json_t *run_tools;

/* One prov_run of the stand-in CLI as provider type, printing output. msgs: the request's
 * messages (NULL: a system and a user message). What the stand-in got: its argv and
 * environment into argv_env, its stdin into stdin_seen (when not NULL). */
static void run_fake_msgs(const char *type, const char *output, const char *extra,
			  const json_t *msgs, struct ts_rec *r, struct prov_outcome *o,
			  struct buf *argv_env, struct buf *stdin_seen)
{
	struct prov_registry *reg = fake_registry(type, output, extra);
	json_t *dflt = json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "system", "content", "Be brief.",
				 "role", "user", "content", "Say hello");
	struct prov_request req = { .model = prov_registry_find(reg, "m-1"),
				    .model_name = "m-1",
				    .messages = msgs ? msgs : dflt,
				    .max_tokens = 99,
				    .request_id = "test",
				    .tools = run_tools,
				    .login_owner = true };
	struct prov_sink sink = ts_rec_sink(r);
	struct buf argv_path = BUF_INIT, stdin_path = BUF_INIT;

	reset_file("argv.txt", &argv_path);
	reset_file("stdin.txt", &stdin_path);
	CU_ASSERT_FATAL(req.model != NULL);
	prov_run(&req, &sink, -1, o);
	buf_reset(argv_env);
	buf_read_file(argv_env, argv_path.data, 1 << 20);
	if (stdin_seen) {
		buf_reset(stdin_seen);
		buf_read_file(stdin_seen, stdin_path.data, 1 << 20);
	}
	json_decref(dflt);
	prov_registry_free(reg);
	buf_release(&argv_path);
	buf_release(&stdin_path);
}

static void run_fake(const char *type, const char *output, const char *extra, struct ts_rec *r,
		     struct prov_outcome *o, struct buf *argv_env)
{
	run_fake_msgs(type, output, extra, NULL, r, o, argv_env, NULL);
}

static void test_run_claude(void)
{
	struct buf argv_env = BUF_INIT, in = BUF_INIT;
	struct prov_outcome o;
	struct ts_rec r;
	uint64_t t = mono_ms();

	/* The stand-in lingers 5 s after the result line: the run must not wait for it. */
	ts_rec_init(&r);
	run_fake_msgs("claude", "claude-success.ndjson", ",\"FAKE_SLEEP\":\"5\"", NULL, &r, &o,
		      &argv_env, &in);
	CU_ASSERT_EQUAL(o.err, PROV_OK);
	CU_ASSERT_STRING_EQUAL(r.text.data, "Hello from the fake Anthropic server!");
	CU_ASSERT_STRING_EQUAL(o.finish_reason, "stop");
	CU_ASSERT(o.usage.present);
	CU_ASSERT_EQUAL(o.usage.total_tokens, 16);
	CU_ASSERT(mono_ms() - t < 4000);
	/* The plan: argv, stdin and environment as docs/providers.md says; the system
	 * prompt on stdin, never in argv. */
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "-p\n--input-format\nstream-json\n"
						     "--output-format\nstream-json\n--verbose\n"
						     "--include-partial-messages\n"
						     "--no-session-persistence\n--model\nm-1\n"
						     "--tools\n\n"));
	CU_ASSERT_PTR_NULL(strstr(argv_env.data, "Be brief."));
	CU_ASSERT_PTR_NULL(strstr(argv_env.data, "--system-prompt"));
	CU_ASSERT_PTR_NOT_NULL(strstr(in.data,
				      "{\"type\":\"control_request\",\"request_id\":"
				      "\"olp-init\",\"request\":{\"subtype\":"
				      "\"initialize\",\"systemPrompt\":\"You are answering"));
	CU_ASSERT_PTR_NOT_NULL(strstr(in.data, "\\n\\nBe brief.\"}}\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(in.data, "\n{\"type\":\"user\",\"message\":{\"role\":"
					       "\"user\",\"content\":\"Say hello\"}"));
	CU_ASSERT_PTR_NOT_NULL(
		strstr(argv_env.data, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "CLAUDE_CODE_MAX_RETRIES=2\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "CLAUDE_CODE_MAX_OUTPUT_TOKENS=99\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "HOME=" SBX_HOME_PATH "\n"));
	CU_ASSERT_PTR_NULL(strstr(argv_env.data, "ANTHROPIC_API_KEY"));
	ts_rec_release(&r);

	ts_rec_init(&r);
	run_fake("claude", "claude-429.ndjson", ",\"FAKE_EXIT\":\"1\"", &r, &o, &argv_env);
	CU_ASSERT_EQUAL(o.err, PROV_ERR_PROVIDER_ERROR);
	CU_ASSERT_EQUAL(o.status, 429);
	CU_ASSERT_EQUAL(o.upstream_status, 429);
	CU_ASSERT_PTR_NOT_NULL(strstr(o.message, "Provider p: "));
	CU_ASSERT_FALSE(o.output_started);
	ts_rec_release(&r);

	ts_rec_init(&r);
	run_fake("claude", "claude-not-logged-in.ndjson", ",\"FAKE_EXIT\":\"1\"", &r, &o,
		 &argv_env);
	CU_ASSERT_EQUAL(o.err, PROV_ERR_AUTH_MISSING);
	CU_ASSERT_STRING_EQUAL(prov_error_code(o.err), "AUTH_MISSING");
	CU_ASSERT_EQUAL(o.status, prov_error_status(PROV_ERR_AUTH_MISSING));
	ts_rec_release(&r);
	buf_release(&argv_env);
	buf_release(&in);
}

/* A system prompt far above what one argument may hold (128 KiB) runs, and none of it is
 * on the command line, where the host's /proc/<pid>/cmdline would show it. */
static void test_run_claude_long_system_prompt(void)
{
	size_t n = (size_t)200 * 1024;
	char *big = malloc(n + 1);
	struct buf argv_env = BUF_INIT, in = BUF_INIT;
	struct prov_outcome o;
	struct ts_rec r;
	json_t *msgs;

	CU_ASSERT_FATAL(big != NULL);
	memset(big, 'x', n);
	memcpy(big, "MARKER-", 7);
	big[n] = '\0';
	msgs = json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "system", "content", big, "role", "user",
			 "content", "Say hello");
	CU_ASSERT_FATAL(msgs != NULL);
	ts_rec_init(&r);
	run_fake_msgs("claude", "claude-success.ndjson", "", msgs, &r, &o, &argv_env, &in);
	CU_ASSERT_EQUAL(o.err, PROV_OK);
	if (o.err)
		fprintf(stderr, "run: %s (%s)\n", o.message, o.stderr_tail);
	CU_ASSERT_STRING_EQUAL(r.text.data, "Hello from the fake Anthropic server!");
	CU_ASSERT_PTR_NULL(strstr(argv_env.data, "MARKER-"));
	CU_ASSERT(argv_env.len < 8192);
	CU_ASSERT(in.len > n);
	CU_ASSERT_PTR_NOT_NULL(strstr(in.data, big));
	ts_rec_release(&r);
	json_decref(msgs);
	free(big);
	buf_release(&argv_env);
	buf_release(&in);
}

/* A run cut before its provider said what it used (a stop sequence or a client gone: the
 * sink aborts) still counts: otherwise a stop sequence that matches at once would dodge a
 * key's tokens_per_day. claude's prompt count from the message's start is kept, the rest
 * estimated at 4 bytes a token; codex said nothing, so both are estimates; a run refused
 * before any output spent nothing. (A local command spends no upstream tokens: the HTTP
 * suite checks that its cut runs stay at 0.) */
static void test_run_cut_usage(void)
{
	struct buf argv_env = BUF_INIT, in = BUF_INIT;
	struct prov_outcome o;
	struct ts_rec r;

	ts_rec_init(&r);
	r.abort_after = 2; /* "Hello", " from" (usage never reaches the sink) */
	run_fake_msgs("claude", "claude-success.ndjson", "", NULL, &r, &o, &argv_env, &in);
	CU_ASSERT_EQUAL(o.err, PROV_ERR_CLIENT_GONE);
	CU_ASSERT(o.usage.present && o.usage.estimated && !o.usage.partial);
	CU_ASSERT_EQUAL(o.usage.prompt_tokens, 10);    /* claude's own count */
	CU_ASSERT_EQUAL(o.usage.completion_tokens, 3); /* "Hello from": 10 bytes */

	CU_ASSERT_EQUAL(o.usage.total_tokens, 13);
	ts_rec_release(&r);

	ts_rec_init(&r);
	r.abort_after = 1;
	run_fake_msgs("codex", "codex-success.ndjson", "", NULL, &r, &o, &argv_env, &in);
	CU_ASSERT_EQUAL(o.err, PROV_ERR_CLIENT_GONE);
	CU_ASSERT(o.usage.present && o.usage.estimated);
	/* What codex was given: its stdin and its argv, 4 bytes a token. */
	CU_ASSERT(in.len > 0);
	CU_ASSERT(o.usage.prompt_tokens >= (int64_t)(in.len + 3) / 4);
	CU_ASSERT(o.usage.prompt_tokens < (int64_t)(in.len + 3) / 4 + 200);
	CU_ASSERT_EQUAL(o.usage.completion_tokens,
			(int64_t)(strlen("Hello from the fake OpenAI server!") + 3) / 4);
	ts_rec_release(&r);

	ts_rec_init(&r);
	run_fake("claude", "claude-429.ndjson", ",\"FAKE_EXIT\":\"1\"", &r, &o, &argv_env);
	CU_ASSERT_EQUAL(o.upstream_status, 429);
	CU_ASSERT_FALSE(o.usage.estimated);
	CU_ASSERT_EQUAL(o.usage.total_tokens, 0);
	ts_rec_release(&r);
	buf_release(&argv_env);
	buf_release(&in);
}

static void test_run_codex(void)
{
	struct buf argv_env = BUF_INIT;
	struct prov_outcome o;
	struct ts_rec r;

	ts_rec_init(&r);
	run_fake("codex", "codex-success.ndjson", "", &r, &o, &argv_env);
	CU_ASSERT_EQUAL(o.err, PROV_OK);
	CU_ASSERT_STRING_EQUAL(r.text.data, "Hello from the fake OpenAI server!");
	CU_ASSERT_EQUAL(o.usage.prompt_tokens, 10);
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "exec\n--json\n--skip-git-repo-check\n"
						     "--ephemeral\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "--model\nm-1\n-\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "CODEX_HOME=" SBX_HOME_PATH "/.codex\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "TMPDIR=/tmp\n"));
	ts_rec_release(&r);

	ts_rec_init(&r);
	run_fake("codex", "codex-401.ndjson", ",\"FAKE_EXIT\":\"1\"", &r, &o, &argv_env);
	CU_ASSERT_EQUAL(o.err, PROV_ERR_PROVIDER_ERROR);
	CU_ASSERT_EQUAL(o.upstream_status, 401);
	CU_ASSERT_EQUAL(o.status, 502); /* not a 401: the client's own key is fine */
	ts_rec_release(&r);
	buf_release(&argv_env);
}

/* codex with the client's tools (ADR 0019, "codex"): the MCP server, its hook and
 * codex's own tools off in argv, nothing of the client's there (the list is a file, the
 * instructions in stdin); the stand-in prints the recorded calls and exits 1, as codex
 * interrupted by the hook does: the answer is complete, the run a success. */
static void test_run_codex_tools(void)
{
	struct buf argv_env = BUF_INIT, in = BUF_INIT;
	json_t *tools = json_pack("[{s:s,s:{s:s,s:s}}]", "type", "function", "function", "name",
				  "get_weather", "description", "SECRET-DESCRIPTION");
	struct prov_outcome o;
	struct ts_rec r;

	CU_ASSERT_FATAL(tools != NULL);
	CU_ASSERT_EQUAL_FATAL(prov_set_state_dir(tmpdir), 0);
	run_tools = tools;
	ts_rec_init(&r);
	run_fake_msgs("codex", "codex-tool-calls.ndjson", ",\"FAKE_EXIT\":\"1\"", NULL, &r, &o,
		      &argv_env, &in);
	run_tools = NULL;
	CU_ASSERT_EQUAL(o.err, PROV_OK);
	if (o.err)
		fprintf(stderr, "run: %s (%s)\n", o.message, o.stderr_tail);
	CU_ASSERT_STRING_EQUAL(o.finish_reason, "tool_calls");
	/* No usage line and no forwarder ("network": false): OLP's estimate. */
	CU_ASSERT(o.usage.present && o.usage.estimated && o.usage.prompt_tokens > 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(r.log.data, "get_weather {\"city\":\"Paris\"}\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "-c\nmcp_servers.olp.command=\"/"));
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "-c\nmcp_servers.olp.args=[\"" SBX_HOME_PATH
						     "/.olp-tools.json\"]\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "-c\nmcp_servers.olp.required=true\n"));
	CU_ASSERT_PTR_NOT_NULL(
		strstr(argv_env.data, "--codex-hook " SBX_HOME_PATH "/.olp-tools.json\"}]}]\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "--dangerously-bypass-hook-trust\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "-c\nfeatures.unified_exec=false\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "-c\nfeatures.shell_tool=false\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "-c\nweb_search=\"disabled\"\n"));
	CU_ASSERT_PTR_NULL(strstr(argv_env.data, "get_weather"));
	CU_ASSERT_PTR_NULL(strstr(argv_env.data, "SECRET-DESCRIPTION"));
	CU_ASSERT_PTR_NOT_NULL(strstr(in.data, "Say hello"));
	CU_ASSERT_PTR_NOT_NULL(strstr(in.data, "[System] The API client declared functions"));
	ts_rec_release(&r);

	/* Without tools: none of it. */
	ts_rec_init(&r);
	run_fake("codex", "codex-success.ndjson", "", &r, &o, &argv_env);
	CU_ASSERT_EQUAL(o.err, PROV_OK);
	CU_ASSERT_PTR_NULL(strstr(argv_env.data, "mcp_servers"));
	CU_ASSERT_PTR_NULL(strstr(argv_env.data, "hook"));
	ts_rec_release(&r);
	json_decref(tools);
	buf_release(&argv_env);
	buf_release(&in);
}

/* olp-mcp-tools runs nothing: a tools/call of a tool named like codex's shell, asking
 * for a file to be made, gets an error result and the file is not made; the call leaves
 * the marker its hook reads. The hook then interrupts the process that ran both (here a
 * shell standing for codex), which never gets past it; without a call it lets it go. */
static void test_mcp_tools_runs_nothing(void)
{
	for (int called = 1; called >= 0; called--) {
		struct buf dir = BUF_INIT, file = BUF_INIT, cmd = BUF_INIT, out = BUF_INIT;
		int fd, st;

		buf_addf(&dir, "%s/mcp-%d", tmpdir, called);
		CU_ASSERT_FATAL(mkdir(dir.data, 0700) == 0);
		buf_addf(&file, "%s/tools.json", dir.data);
		fd = open(file.data, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		CU_ASSERT_FATAL(fd >= 0);
		buf_reset(&cmd);
		buf_adds(&cmd, "[{\"name\":\"exec_command\",\"description\":\"\","
			       "\"inputSchema\":{\"type\":\"object\"}}]");
		CU_ASSERT_EQUAL(write_all(fd, cmd.data, cmd.len), 0);
		close(fd);
		buf_reset(&file);
		buf_addf(&file, "%s/req.jsonl", dir.data);
		fd = open(file.data, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		CU_ASSERT_FATAL(fd >= 0);
		buf_reset(&cmd);
		buf_adds(&cmd, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\","
			       "\"params\":{\"protocolVersion\":\"2025-06-18\"}}\n"
			       "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n"
			       "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\"}\n");
		if (called)
			buf_addf(&cmd,
				 "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\","
				 "\"params\":{\"name\":\"exec_command\",\"arguments\":{\"cmd\":"
				 "\"touch %s/pwned\"}}}\n",
				 dir.data);
		CU_ASSERT_EQUAL(write_all(fd, cmd.data, cmd.len), 0);
		close(fd);
		buf_reset(&cmd);
		buf_addf(&cmd,
			 "cd '%s' && '%s' %s/tools.json < req.jsonl > out.jsonl && "
			 "'%s' --codex-hook %s/tools.json < /dev/null; echo survived > survived",
			 dir.data, MCP_TOOLS_BIN, dir.data, MCP_TOOLS_BIN, dir.data);
		st = system(cmd.data);
		buf_reset(&file);
		buf_addf(&file, "%s/out.jsonl", dir.data);
		CU_ASSERT_EQUAL(buf_read_file(&out, file.data, 1 << 20), 0);
		CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "\"tools\":[{\"name\":\"exec_command\""));
		buf_reset(&file);
		buf_addf(&file, "%s/pwned", dir.data);
		CU_ASSERT_NOT_EQUAL(access(file.data, F_OK), 0); /* nothing ran */
		buf_reset(&file);
		buf_addf(&file, "%s/survived", dir.data);
		if (called) {
			CU_ASSERT_PTR_NOT_NULL(strstr(out.data,
						      "\"id\":3,\"result\":{\"content\":"
						      "[{\"type\":\"text\",\"text\":\"This "
						      "tool is run by the API client"));
			CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "\"isError\":true"));
			/* SIGINT, or 10 s later SIGKILL for a parent that waits SIGINT out
			 * (dash does, for its foreground child). */
			CU_ASSERT(WIFSIGNALED(st) &&
				  (WTERMSIG(st) == SIGINT || WTERMSIG(st) == SIGKILL));
			CU_ASSERT_NOT_EQUAL(access(file.data, F_OK), 0);
		} else {
			CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
			CU_ASSERT_EQUAL(access(file.data, F_OK), 0);
		}
		buf_release(&dir);
		buf_release(&file);
		buf_release(&cmd);
		buf_release(&out);
	}
}

static void test_run_vibe(void)
{
	struct buf argv_env = BUF_INIT;
	struct prov_outcome o;
	struct ts_rec r;

	ts_rec_init(&r);
	run_fake("vibe", "vibe-deltas.ndjson", "", &r, &o, &argv_env);
	CU_ASSERT_EQUAL(o.err, PROV_OK);
	CU_ASSERT_STRING_EQUAL(r.text.data, "Hello from vibe, streaming!");
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "--prompt\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(argv_env.data, "--output\nstreaming\n"));
	ts_rec_release(&r);
	buf_release(&argv_env);
}

/* vibe takes its prompt on its command line only: one above the bound is the client's 400,
 * naming the limit, and nothing is started. */
static void test_run_vibe_long_prompt(void)
{
	size_t n = (size_t)200 * 1024;
	char *big = malloc(n + 1);
	struct buf argv_env = BUF_INIT;
	struct prov_outcome o;
	struct ts_rec r;
	json_t *msgs;

	CU_ASSERT_FATAL(big != NULL);
	memset(big, 'y', n);
	big[n] = '\0';
	msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", big);
	CU_ASSERT_FATAL(msgs != NULL);
	ts_rec_init(&r);
	run_fake_msgs("vibe", "vibe-deltas.ndjson", "", msgs, &r, &o, &argv_env, NULL);
	CU_ASSERT_EQUAL(o.err, PROV_ERR_PROMPT_REFUSED);
	CU_ASSERT_EQUAL(o.status, 400);
	CU_ASSERT_STRING_EQUAL(prov_error_code(o.err), "PROMPT_REFUSED");
	CU_ASSERT_PTR_NOT_NULL(strstr(o.message, "at most 120 KiB"));
	CU_ASSERT_EQUAL(argv_env.len, 0); /* never started */
	CU_ASSERT_EQUAL(r.nevents, 0);
	ts_rec_release(&r);
	json_decref(msgs);
	free(big);
	buf_release(&argv_env);
}

/* A missing program is a spawn failure that names what to set. */
static void test_run_missing_bin(void)
{
	struct buf path = BUF_INIT, err = BUF_INIT;
	struct prov_registry *reg;
	struct prov_outcome o;
	struct ts_rec r;
	json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", "x");
	int fd;

	buf_addf(&path, "%s/reg2.json", tmpdir);
	fd = open(path.data, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CU_ASSERT_FATAL(fd >= 0);
	buf_adds(&err, "{\"providers\":{\"anthropic\":{\"bin\":\"/nonexistent/claude\","
		       "\"models\":[{\"id\":\"c\"}]}}}");
	write_all(fd, err.data, err.len);
	close(fd);
	buf_reset(&err);
	reg = prov_registry_load(path.data, NULL, &err);
	CU_ASSERT_FATAL(reg != NULL);
	CU_ASSERT_STRING_EQUAL(prov_provider_type(prov_registry_find(reg, "c")->provider),
			       "claude");
	{
		struct prov_request req = { .model = prov_registry_find(reg, "c"),
					    .messages = msgs,
					    .request_id = "t" };
		struct prov_sink sink = ts_rec_sink(&r);

		ts_rec_init(&r);
		prov_run(&req, &sink, -1, &o);
		CU_ASSERT_EQUAL(o.err, PROV_ERR_SPAWN_FAILED);
		if (!strstr(o.message, "providers.anthropic.bin"))
			fprintf(stderr, "message: %s\n", o.message);
		CU_ASSERT_PTR_NOT_NULL(strstr(o.message, "providers.anthropic.bin"));
		ts_rec_release(&r);
	}
	json_decref(msgs);
	prov_registry_free(reg);
	buf_release(&path);
	buf_release(&err);
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "claude: recorded success, every split", test_claude_success },
		{ "claude: recorded tool calls, every split, ends at the message",
		  test_claude_tool_calls },
		{ "claude: upstream 429", test_claude_429 },
		{ "claude: not logged in", test_claude_not_logged_in },
		{ "claude: garbage, unknown types, CRLF", test_claude_garbage_and_unknown },
		{ "claude: truncated output", test_claude_truncated },
		{ "claude: assistant-only, result-only, errors", test_claude_variants },
		{ "claude: stream cut, retried, stitched", test_claude_cut_and_retry },
		{ "claude: output after result ignored", test_claude_done_ignores_rest },
		{ "sink abort stops the feed", test_sink_abort },
		{ "overlong line refused", test_overlong_line },
		{ "codex: recorded success", test_codex_success },
		{ "codex: upstream 401", test_codex_401 },
		{ "codex: command items, retries, death", test_codex_command_and_retries },
		{ "codex: recorded tool calls, every split, complete at the end",
		  test_codex_tool_calls },
		{ "vibe: tolerant lines", test_vibe },
		{ "every fixture through every parser", test_cross_feed },
		{ "prov_run claude under the sandbox", test_run_claude },
		{ "prov_run codex under the sandbox", test_run_codex },
		{ "prov_run codex with the client's tools", test_run_codex_tools },
		{ "olp-mcp-tools runs nothing; its hook stops codex after a call",
		  test_mcp_tools_runs_nothing },
		{ "prov_run: a cut run's usage", test_run_cut_usage },
		{ "prov_run claude with a 200 KiB system prompt",
		  test_run_claude_long_system_prompt },
		{ "prov_run vibe under the sandbox", test_run_vibe },
		{ "prov_run vibe with a prompt above its bound", test_run_vibe_long_prompt },
		{ "prov_run with a missing program", test_run_missing_bin },
		{ NULL, NULL },
	};
	char runtime[] = "/tmp/olp-provcli-rt-XXXXXX";
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP };
	int fails;
	char cmd[256];

	if (!mkdtemp(tmpdir) || !mkdtemp(runtime))
		return 1;
	cfg.runtime_dir = runtime;
	if (sbx_global_init(&cfg)) {
		fprintf(stderr, "sbx_global_init failed\n");
		return 1;
	}
	fails = ts_cunit_run("provider-clis", tests);
	sbx_global_release();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", tmpdir, runtime);
	if (system(cmd))
		fails++;
	return ts_exit_status(fails);
}
