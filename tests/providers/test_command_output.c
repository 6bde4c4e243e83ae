/* CUnit suite for the command provider's output modes (providers/command.c): "text",
 * "sse" (OpenAI chat.completion.chunk events) and "ndjson" (one chunk object a line), each
 * recorded output fed whole, byte by byte and split at every position, with the same
 * events required every time; then one prov_run of a command printing SSE under the real
 * sandbox. Through providers.h only: a provider in each mode comes from
 * prov_provider_from_json, its parser from prov_parser_for, as prov_run makes it. */
#include "tests/support/cunit.h"
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "providers/providers.h"
#include "sandbox/sandbox.h"
#include "tests/egress/upstream.h"
#include "tests/support/recorder.h"
#include "common/banned.h"

/* ---- a parser in a given mode, made the way prov_run makes it ----------------------- */

struct mode_parser {
	struct prov_provider *pv;
	struct prov_parser *ps;
};

/* A command provider printing in mode (NULL: no "output", the default) and its parser.
 * 0, or -EINVAL when the entry is refused (err says why). */
static int mode_parser_new(struct mode_parser *mp, const char *mode, struct buf *err)
{
	json_t *entry = mode ? json_pack("{s:s,s:[s],s:s}", "type", "command", "argv",
					 "/usr/bin/cat", "output", mode)
			     : json_pack("{s:s,s:[s]}", "type", "command", "argv", "/usr/bin/cat");

	memset(mp, 0, sizeof(*mp));
	CU_ASSERT_PTR_NOT_NULL_FATAL(entry);
	mp->pv = prov_provider_from_json("local", entry, err);
	json_decref(entry);
	if (!mp->pv)
		return -errno;
	mp->ps = prov_parser_for(mp->pv);
	return 0;
}

static void mode_parser_free(struct mode_parser *mp)
{
	prov_parser_free(mp->ps);
	prov_provider_free(mp->pv);
}

struct feed_result {
	int first_stop; /* the first non-zero feed return */
	int finish_ret;
};

/* Feed data in pieces of step bytes (0 = whole), or as two pieces cut at split (>= 0). */
static struct feed_result feed(const char *mode, const char *data, size_t len, size_t step,
			       long split, struct ts_rec *r)
{
	struct prov_sink sink = ts_rec_sink(r);
	struct mode_parser mp;
	struct feed_result fr = { 0, 0 };
	size_t off = 0;
	int pieces = 0;

	CU_ASSERT_FATAL(mode_parser_new(&mp, mode, NULL) == 0);
	while (off < len || pieces == 0) {
		size_t n = split >= 0 ? (pieces ? len - off : (size_t)split) : step ? step : len;
		int ret;

		if (n > len - off)
			n = len - off;
		ret = prov_parser_feed(mp.ps, data + off, n, &sink);
		if (ret && !fr.first_stop)
			fr.first_stop = ret;
		off += n;
		pieces++;
	}
	fr.finish_ret = prov_parser_finish(mp.ps, &sink);
	mode_parser_free(&mp);
	CU_ASSERT_EQUAL(r->malformed, 0);
	return fr;
}

/* Whole, byte by byte, at every split: the same text and events each time. r gets the
 * whole-feed events. */
static struct feed_result feed_all_ways(const char *mode, const char *data, struct ts_rec *r)
{
	size_t len = strlen(data);
	struct feed_result whole, fr;
	struct ts_rec other;

	ts_rec_init(r);
	whole = feed(mode, data, len, 0, -1, r);
	for (long split = -1; split <= (long)len; split++) {
		ts_rec_init(&other);
		fr = split < 0 ? feed(mode, data, len, 1, -1, &other)
			       : feed(mode, data, len, 0, split, &other);
		CU_ASSERT_EQUAL(other.text.len, r->text.len);
		CU_ASSERT_STRING_EQUAL(other.text.data, r->text.data);
		CU_ASSERT_STRING_EQUAL(other.events.data, r->events.data);
		CU_ASSERT_EQUAL(fr.first_stop != 0, whole.first_stop != 0);
		if (strcmp(other.events.data, r->events.data) ||
		    strcmp(other.text.data, r->text.data))
			fprintf(stderr, "mode %s split %ld: got %s [%s], want %s [%s]\n", mode,
				split, other.events.data, other.text.data, r->events.data,
				r->text.data);
		ts_rec_release(&other);
	}
	return whole;
}

/* ---- recorded outputs ------------------------------------------------------------------ */

/* The recorded outputs read as they are printed. */
/* clang-format off */
#define CHUNK(rest) "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1," \
		    "\"model\":\"m\",\"choices\":[" rest "]}"

static const char sse_output[] =
	": a comment line\n"
	"data: " CHUNK("{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
		       "\"finish_reason\":null}") "\n\n"
	"data: " CHUNK("{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}") "\n\n"
	"event: message\n"
	"data:" CHUNK("{\"index\":0,\"delta\":{\"content\":\"lo, w\\u00f6rld \xe2\x82\xac\"},"
		      "\"finish_reason\":null}") "\r\n\r\n"
	"data: " CHUNK("{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}") "\n\n"
	"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],"
	"\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5,\"total_tokens\":17,"
	"\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n"
	"data: [DONE]\n\n"
	"data: " CHUNK("{\"index\":0,\"delta\":{\"content\":\"after done\"}}") "\n\n";

static void test_sse(void)
{
	struct ts_rec r;
	struct feed_result fr = feed_all_ways("sse", sse_output, &r);

	CU_ASSERT_STRING_EQUAL(r.text.data, "Hello, w\xc3\xb6rld \xe2\x82\xac");
	CU_ASSERT_STRING_EQUAL(r.events.data, "D<F length><U 12 5 17 4>");
	CU_ASSERT_EQUAL(fr.first_stop, 1); /* [DONE] ends the answer early */
	CU_ASSERT_EQUAL(fr.finish_ret, 0);
	ts_rec_release(&r);
}

static const char ndjson_output[] =
	CHUNK("{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}") "\n"
	"not json at all\n"
	CHUNK("{\"index\":0,\"delta\":{\"content\":\"one \"},\"finish_reason\":null}") "\n"
	"\n"
	"{\"unknown\":true}\n"
	CHUNK("{\"index\":0,\"delta\":{\"content\":\"two\"},\"finish_reason\":\"stop\"}") "\r\n"
	"{\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}";
/* clang-format on */

static void test_ndjson(void)
{
	struct ts_rec r;
	struct feed_result fr = feed_all_ways("ndjson", ndjson_output, &r);

	CU_ASSERT_STRING_EQUAL(r.text.data, "one two");
	/* total_tokens is computed when missing; the last line had no "\n". */
	CU_ASSERT_STRING_EQUAL(r.events.data, "D<F stop><U 3 2 5 0>");
	CU_ASSERT_EQUAL(fr.first_stop, 0);
	ts_rec_release(&r);
}

static void test_ndjson_completion_and_done(void)
{
	static const char out[] =
		"{\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
		"\"assistant\",\"content\":\"whole answer\"},\"finish_reason\":\"weird\"}]}\n"
		"[DONE]\n"
		"{\"choices\":[{\"delta\":{\"content\":\"ignored\"}}]}\n";
	struct ts_rec r;
	struct feed_result fr = feed_all_ways("ndjson", out, &r);

	CU_ASSERT_STRING_EQUAL(r.text.data, "whole answer");
	CU_ASSERT_STRING_EQUAL(r.events.data, "D<F stop>"); /* unknown reasons become stop */
	CU_ASSERT_EQUAL(fr.first_stop, 1);
	ts_rec_release(&r);
}

static void test_errors(void)
{
	static const char sse_err[] = "data: " CHUNK(
		"{\"delta\":{\"content\":\"partial\"}}") "\n\n"
							 "data: {\"error\":{\"message\":\"Rate "
							 "limit reached (http://10.0.0.1/x)\","
							 "\"type\":\"rate_limit\",\"code\":429}}"
							 "\n\n"
							 "data: " CHUNK("{\"delta\":{\"content\":"
									"\"never\"}}") "\n\n";
	static const char nd_err[] = "{\"error\":\"upstream said: last status: 503\"}\n";
	static const char nd_err0[] =
		"{\"error\":{\"message\":\"boom\",\"code\":\"server_error\"}}\n";
	struct ts_rec r;
	struct feed_result fr;

	fr = feed_all_ways("sse", sse_err, &r);
	CU_ASSERT_STRING_EQUAL(r.text.data, "partial");
	CU_ASSERT(strncmp(r.events.data, "D<E PROVIDER_ERROR 429 ", 23) == 0);
	/* OLP's words, never the tool's (which may name internal URLs). */
	CU_ASSERT(strstr(r.events.data, "10.0.0.1") == NULL);
	CU_ASSERT_EQUAL(fr.first_stop, 1);
	ts_rec_release(&r);

	(void)feed_all_ways("ndjson", nd_err, &r);
	CU_ASSERT(strncmp(r.events.data, "<E PROVIDER_ERROR 503 ", 22) == 0);
	ts_rec_release(&r);
	(void)feed_all_ways("ndjson", nd_err0, &r);
	CU_ASSERT(strncmp(r.events.data, "<E PROVIDER_ERROR 0 ", 20) == 0);
	CU_ASSERT(strstr(r.events.data, "boom") == NULL);
	ts_rec_release(&r);
}

static void test_garbage(void)
{
	static const char junk[] = "data: {\"choices\":[{\"delta\":{\"content\":42}}]}\n"
				   "data: {\"choices\":\"x\"}\n"
				   "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"},"
				   "\"finish_reason\":7}]}\n"
				   "data: {truncated\n"
				   "data: [1,2,3]\n"
				   "data\n"
				   "data: [DONE]x\n"
				   "\xff\xfe\n"
				   "data: {\"choices\":[{\"delta\":{\"content\":\"!\"}}]}";
	struct ts_rec r;
	struct feed_result fr = feed_all_ways("sse", junk, &r);

	CU_ASSERT_STRING_EQUAL(r.text.data, "ok!");
	CU_ASSERT_STRING_EQUAL(r.events.data, "D");
	CU_ASSERT_EQUAL(fr.first_stop, 0);
	ts_rec_release(&r);
}

/* Text mode is the default and unchanged: bytes pass through, UTF-8 never split. */
static void test_text_default(void)
{
	static const char out[] = "data: [DONE]\nplain \xe2\x82\xac text\n";
	struct ts_rec r, r2;

	feed_all_ways(NULL, out, &r);
	CU_ASSERT_STRING_EQUAL(r.text.data, out);
	CU_ASSERT_STRING_EQUAL(r.events.data, "D");
	feed_all_ways("text", out, &r2);
	CU_ASSERT_STRING_EQUAL(r2.text.data, out);
	ts_rec_release(&r);
	ts_rec_release(&r2);

	/* A bare prov_parser_new("command") is a text parser even right after an SSE plan
	 * whose parser was never made on this thread... */
	{
		struct mode_parser mp;
		struct prov_parser *ps;
		struct prov_sink sink = ts_rec_sink(&r);

		ts_rec_init(&r);
		CU_ASSERT_EQUAL(mode_parser_new(&mp, "sse", NULL), 0);
		mode_parser_free(&mp);
		ps = prov_parser_new("command");
		CU_ASSERT_FATAL(ps != NULL);
		CU_ASSERT_EQUAL(prov_parser_feed(ps, "data: [DONE]\n", 13, &sink), 0);
		prov_parser_finish(ps, &sink);
		CU_ASSERT_STRING_EQUAL(r.text.data, "data: [DONE]\n");
		prov_parser_free(ps);
		ts_rec_release(&r);
	}
}

/* An unknown mode is refused when the provider is made (at load), naming the field. */
static void test_bad_mode(void)
{
	struct buf err = BUF_INIT;
	struct mode_parser mp;

	CU_ASSERT_EQUAL(mode_parser_new(&mp, "xml", &err), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.data, "providers.local.output: must be"));
	mode_parser_free(&mp);
	buf_release(&err);
}

static void test_sink_abort(void)
{
	struct ts_rec r;
	struct prov_sink sink = ts_rec_sink(&r);
	struct mode_parser mp;

	ts_rec_init(&r);
	r.abort_after = 1;
	CU_ASSERT_EQUAL(mode_parser_new(&mp, "sse", NULL), 0);
	CU_ASSERT_EQUAL(prov_parser_feed(mp.ps, sse_output, strlen(sse_output), &sink), -1);
	CU_ASSERT_EQUAL(r.nevents, 1);
	mode_parser_free(&mp);
	ts_rec_release(&r);
}

/* An overlong line ends the answer with a provider error. */
static void test_overlong(void)
{
	size_t n = PROV_MAX_OUTPUT_LINE + 16;
	char *big = malloc(n);
	struct ts_rec r;
	struct prov_sink sink = ts_rec_sink(&r);
	struct mode_parser mp;

	CU_ASSERT_FATAL(big != NULL);
	memset(big, 'a', n);
	ts_rec_init(&r);
	CU_ASSERT_EQUAL(mode_parser_new(&mp, "ndjson", NULL), 0);
	CU_ASSERT_EQUAL(prov_parser_feed(mp.ps, big, n, &sink), 1);
	CU_ASSERT(strncmp(r.events.data, "<E PROVIDER_ERROR 0 ", 20) == 0);
	mode_parser_free(&mp);
	ts_rec_release(&r);
	free(big);
}

/* ---- prov_run of an SSE-printing command under the sandbox --------------------------- */

static char tmpdir[] = "/tmp/olp-cmdout-test-XXXXXX";

static void test_run_sse(void)
{
	static const char script[] =
		"cat >/dev/null\n"
		"printf 'data: {\"choices\":[{\"delta\":{\"content\":\"Hi \"}}]}\\n\\n'\n"
		"printf 'data: {\"choices\":[{\"delta\":{\"content\":\"there\"},"
		"\"finish_reason\":\"length\"}]}\\n\\n'\n"
		"printf 'data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,"
		"\"completion_tokens\":2,\"total_tokens\":9}}\\n\\n'\n"
		"printf 'data: [DONE]\\n\\n'\n"
		"exec sleep 10\n"; /* lingers: the run must end at [DONE], not wait */
	struct buf reg = BUF_INIT, err = BUF_INIT, path = BUF_INIT;
	json_t *regj, *msgs;
	struct prov_registry *r;
	struct prov_outcome o;
	struct ts_rec rec;
	struct prov_sink sink = ts_rec_sink(&rec);
	struct prov_request req = { .model_name = "sse-model", .request_id = "test" };
	uint64_t t0;

	buf_addf(&path, "%s/registry.json", tmpdir);
	regj = json_pack("{s:{s:{s:s,s:[s,s,s],s:s,s:i,s:[{s:s}]}}}", "providers", "local", "type",
			 "command", "argv", "/bin/sh", "-c", script, "output", "sse", "timeout_s",
			 20, "models", "id", "sse-model");
	CU_ASSERT_FATAL(regj != NULL);
	CU_ASSERT_FATAL(json_dump_file(regj, path.data, 0) == 0);
	json_decref(regj);
	r = prov_registry_load(path.data, NULL, &err);
	if (!r)
		fprintf(stderr, "registry: %s\n", err.data);
	CU_ASSERT_FATAL(r != NULL);
	msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", "hello");
	req.model = prov_registry_find(r, "sse-model");
	req.messages = msgs;
	CU_ASSERT_FATAL(req.model != NULL);
	ts_rec_init(&rec);
	t0 = mono_ms();
	prov_run(&req, &sink, -1, &o);
	CU_ASSERT(mono_ms() - t0 < 5000);
	CU_ASSERT_EQUAL(o.err, PROV_OK);
	if (o.err)
		fprintf(stderr, "run: %s (%s)\n", o.message, o.stderr_tail);
	CU_ASSERT_STRING_EQUAL(rec.text.data, "Hi there");
	CU_ASSERT_STRING_EQUAL(o.finish_reason, "length");
	CU_ASSERT(o.usage.present);
	CU_ASSERT_EQUAL(o.usage.prompt_tokens, 7);
	CU_ASSERT_EQUAL(o.usage.completion_tokens, 2);
	CU_ASSERT_EQUAL(o.usage.total_tokens, 9);
	ts_rec_release(&rec);
	json_decref(msgs);
	prov_registry_free(r);
	buf_release(&reg);
	buf_release(&err);
	buf_release(&path);
}

/* A command provider in upstream mode (network.c, run.c): the key file is read for each
 * run, so one that went away fails the run before anything starts (502, the log naming
 * the file, the client's message not); with the key in place the run gets
 * OLP_UPSTREAM_URL, or, where the sandbox cannot give it a namespace of its own, fails
 * closed (503) naming the network mode. */
static void test_run_upstream(void)
{
	struct buf err = BUF_INIT, path = BUF_INIT, key = BUF_INIT, src = BUF_INIT;
	json_t *regj, *msgs;
	struct prov_registry *r;
	struct prov_outcome o;
	struct ts_rec rec;
	struct prov_sink sink = ts_rec_sink(&rec);
	struct prov_request req = { .model_name = "up-model", .request_id = "test-up" };
	int fd;

	buf_addf(&key, "%s/key", tmpdir);
	fd = open(key.data, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(write_all(fd, "sk-run-key\n", 11), 0);
	close(fd);
	buf_addf(&src, "file:%s", key.data);
	buf_addf(&path, "%s/registry-up.json", tmpdir);
	regj = json_pack("{s:{s:{s:s,s:[s,s,s],s:i,s:{s:s,s:{s:s},s:[s]},s:[{s:s}]}}}", "providers",
			 "local", "type", "command", "argv", "/bin/sh", "-c",
			 "cat >/dev/null; printf %s \"$OLP_UPSTREAM_URL\"", "timeout_s", 20,
			 "network", "upstream", "http://127.0.0.1:9", "set_headers", "x-api-key",
			 src.data, "allow_paths", "POST /v1/x", "models", "id", "up-model");
	CU_ASSERT_FATAL(regj != NULL);
	CU_ASSERT_FATAL(json_dump_file(regj, path.data, 0) == 0);
	json_decref(regj);
	r = prov_registry_load(path.data, NULL, &err);
	if (!r)
		fprintf(stderr, "registry: %s\n", err.data);
	CU_ASSERT_FATAL(r != NULL);
	msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", "hello");
	req.model = prov_registry_find(r, "up-model");
	req.messages = msgs;
	CU_ASSERT_FATAL(req.model != NULL);

	ts_rec_init(&rec);
	prov_run(&req, &sink, -1, &o);
	if (o.err == PROV_OK) {
		CU_ASSERT_STRING_EQUAL(rec.text.data, "http://127.0.0.1:4180");
	} else {
		CU_ASSERT_EQUAL(o.err, PROV_ERR_SANDBOX);
		CU_ASSERT_EQUAL(o.status, 503);
		CU_ASSERT_PTR_NOT_NULL(strstr(o.message, "network \"upstream\""));
		fprintf(stderr, "upstream run refused: %s\n", o.message);
	}
	ts_rec_release(&rec);

	unlink(key.data);
	ts_rec_init(&rec);
	prov_run(&req, &sink, -1, &o);
	CU_ASSERT_EQUAL(o.err, PROV_ERR_AUTH_MISSING);
	CU_ASSERT_EQUAL(o.status, 502);
	CU_ASSERT_PTR_NULL(strstr(o.message, key.data));
	CU_ASSERT_PTR_NOT_NULL(strstr(o.message, "credential"));
	CU_ASSERT_EQUAL(rec.text.len, 0);
	ts_rec_release(&rec);

	json_decref(msgs);
	prov_registry_free(r);
	unlink(path.data);
	buf_release(&err);
	buf_release(&path);
	buf_release(&key);
	buf_release(&src);
}

/* A run that calls the API itself, past what its own output reports (issue 22): the
 * command's curl gets an answer whose usage says 1000 and 500 tokens through the
 * forwarder, while the command prints a chunk claiming 3 and 1. The outcome (what the
 * answer, the ledger and tokens_per_day count) holds the upstream's count. Before, it
 * held the command's 3 and 1. */
static void test_run_upstream_usage(void)
{
	static const char answer[] =
		"{\"object\":\"chat.completion\",\"usage\":{\"prompt_tokens\":1000,"
		"\"completion_tokens\":500,\"total_tokens\":1500}}";
	struct buf err = BUF_INIT, path = BUF_INIT, url = BUF_INIT, script = BUF_INIT;
	struct tu_server *up = tu_start(NULL, NULL);
	json_t *regj, *msgs;
	struct prov_registry *r;
	struct prov_outcome o;
	struct ts_rec rec;
	struct prov_sink sink = ts_rec_sink(&rec);
	struct prov_request req = { .model_name = "spend-model", .request_id = "test-spend" };

	CU_ASSERT_PTR_NOT_NULL_FATAL(up);
	buf_addf(&url, "http://127.0.0.1:%u", tu_port(up));
	buf_addf(&script,
		 "cat >/dev/null; /usr/bin/curl -s -o /dev/null --data-binary '%s' "
		 "\"$OLP_UPSTREAM_URL/reflect\"; "
		 "printf 'data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],"
		 "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\\n\\n"
		 "data: [DONE]\\n\\n'",
		 answer);
	buf_addf(&path, "%s/registry-spend.json", tmpdir);
	regj = json_pack("{s:{s:{s:s,s:[s,s,s],s:s,s:i,s:{s:s},s:[{s:s}]}}}", "providers", "local",
			 "type", "command", "argv", "/bin/sh", "-c", script.data, "output", "sse",
			 "timeout_s", 20, "network", "upstream", url.data, "models", "id",
			 "spend-model");
	CU_ASSERT_FATAL(regj != NULL);
	CU_ASSERT_FATAL(json_dump_file(regj, path.data, 0) == 0);
	json_decref(regj);
	r = prov_registry_load(path.data, NULL, &err);
	CU_ASSERT_FATAL(r != NULL);
	msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", "hello");
	req.model = prov_registry_find(r, "spend-model");
	req.messages = msgs;
	CU_ASSERT_FATAL(req.model != NULL);
	ts_rec_init(&rec);
	prov_run(&req, &sink, -1, &o);
	if (o.err == PROV_ERR_SANDBOX) {
		fprintf(stderr, "upstream run refused (%s): the usage hand-off is not tried\n",
			o.message);
	} else {
		CU_ASSERT_EQUAL(o.err, PROV_OK);
		CU_ASSERT_STRING_EQUAL(rec.text.data, "hi");
		CU_ASSERT_EQUAL(tu_requests(up), 1);
		CU_ASSERT_TRUE(o.usage.present);
		CU_ASSERT_EQUAL(o.usage.prompt_tokens, 1000);
		CU_ASSERT_EQUAL(o.usage.completion_tokens, 500);
		CU_ASSERT_EQUAL(o.usage.total_tokens, 1500);
	}
	ts_rec_release(&rec);
	json_decref(msgs);
	prov_registry_free(r);
	unlink(path.data);
	tu_stop(up);
	buf_release(&err);
	buf_release(&path);
	buf_release(&url);
	buf_release(&script);
}

/* The sink's tick (prov_sink.tick) while the command is silent, and the caller's
 * deadline (prov_request.deadline_ms), which beats the provider's longer timeout_s. */
struct tick_count {
	unsigned n;
	uint64_t every;
};

static uint64_t count_tick(void *ctx, uint64_t now)
{
	struct tick_count *t = ctx;

	t->n++;
	return now + t->every;
}

static int no_emit(void *ctx, const struct prov_event *ev)
{
	(void)ctx;
	(void)ev;
	CU_FAIL("the silent command emitted an event");
	return 0;
}

static void test_run_deadline_and_tick(void)
{
	struct buf err = BUF_INIT, path = BUF_INIT;
	json_t *regj, *msgs;
	struct prov_registry *r;
	struct prov_outcome o;
	struct tick_count ticks = { .every = 100 };
	struct prov_sink sink = { .emit = no_emit, .tick = count_tick, .ctx = &ticks };
	struct prov_request req = { .model_name = "slow-model", .request_id = "test-slow" };
	uint64_t t0;

	buf_addf(&path, "%s/registry-slow.json", tmpdir);
	regj = json_pack("{s:{s:{s:s,s:[s,s,s],s:i,s:[{s:s}]}}}", "providers", "local", "type",
			 "command", "argv", "/bin/sh", "-c", "cat >/dev/null; exec sleep 20",
			 "timeout_s", 20, "models", "id", "slow-model");
	CU_ASSERT_FATAL(regj != NULL);
	CU_ASSERT_FATAL(json_dump_file(regj, path.data, 0) == 0);
	json_decref(regj);
	r = prov_registry_load(path.data, NULL, &err);
	CU_ASSERT_FATAL(r != NULL);
	msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", "hello");
	req.model = prov_registry_find(r, "slow-model");
	req.messages = msgs;
	CU_ASSERT_FATAL(req.model != NULL);
	t0 = mono_ms();
	req.deadline_ms = t0 + 1500;
	prov_run(&req, &sink, -1, &o);
	CU_ASSERT_EQUAL(o.err, PROV_ERR_SPAWN_TIMEOUT);
	CU_ASSERT(mono_ms() - t0 >= 1500);
	CU_ASSERT(mono_ms() - t0 < 10000);
	/* 1.5 s of silence at 100 ms: 15 ticks, less what a loaded host delays. */
	CU_ASSERT(ticks.n >= 5);
	json_decref(msgs);
	prov_registry_free(r);
	unlink(path.data);
	buf_release(&err);
	buf_release(&path);
}

/* The sandbox is not there on every host: then the run is not tried. */
static void test_run_sse_if_possible(void)
{
	if (!sbx_status_get()->available) {
		fprintf(stderr, "sandbox not available (%s): prov_run test skipped\n",
			sbx_status_get()->message ? sbx_status_get()->message : "?");
		return;
	}
	test_run_sse();
	test_run_upstream();
	test_run_upstream_usage();
	test_run_deadline_and_tick();
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "sse: chunks, finish, usage, [DONE]", test_sse },
		{ "ndjson: chunks, garbage, CRLF, last line unterminated", test_ndjson },
		{ "ndjson: a whole completion, [DONE]", test_ndjson_completion_and_done },
		{ "error objects", test_errors },
		{ "garbage and odd types", test_garbage },
		{ "text stays the default", test_text_default },
		{ "an unknown mode is refused", test_bad_mode },
		{ "a sink abort stops the feed", test_sink_abort },
		{ "an overlong line", test_overlong },
		{ "prov_run of an sse command under the sandbox", test_run_sse_if_possible },
		{ NULL, NULL },
	};
	char runtime[] = "/tmp/olp-cmdout-rt-XXXXXX";
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP };
	char cmd[160];
	int failed;

	if (!mkdtemp(tmpdir) || !mkdtemp(runtime)) {
		perror("mkdtemp");
		return 1;
	}
	cfg.runtime_dir = runtime;
	if (sbx_global_init(&cfg)) {
		fprintf(stderr, "sbx_global_init failed\n");
		return 1;
	}
	failed = ts_cunit_run("command output modes", tests);
	sbx_global_release();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", tmpdir, runtime);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmpdir);
	return ts_exit_status(failed);
}
