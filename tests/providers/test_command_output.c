/* CUnit suite for the command provider's output modes (providers/command.c): "text",
 * "sse" (OpenAI chat.completion.chunk events) and "ndjson" (one chunk object a line), each
 * recorded output fed whole, byte by byte and split at every position, with the same
 * events required every time; then one prov_run of a command printing SSE under the real
 * sandbox, through the public API only.
 *
 * The parsers are made as prov_run makes them: the provider's plan, then its parser
 * constructor (the mode is the provider's configuration, which prov_parser_new(type) does
 * not take), hence the private header. */
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
#include "providers/internal.h"
#include "providers/ndjson.h"
#include "providers/providers.h"
#include "sandbox/sandbox.h"
#include "common/banned.h"

/* ---- recording sink ------------------------------------------------------------------ */

/* Events as one comparable string: deltas are joined (split points may differ), the
 * others are written out as "<U p c t k>", "<F reason>", "<E status message>". */
struct rec {
	struct buf text;   /* the deltas, concatenated */
	struct buf events; /* the event kinds in order, deltas collapsed into one "D" */
	size_t ndeltas;
	bool last_delta;
	int abort_after; /* abort (return -1) at the n-th event when > 0 */
	int nevents;
};

static void rec_init(struct rec *r)
{
	memset(r, 0, sizeof(*r));
	buf_init(&r->text);
	buf_init(&r->events);
}

static void rec_release(struct rec *r)
{
	buf_release(&r->text);
	buf_release(&r->events);
}

static int rec_emit(void *ctx, const struct prov_event *ev)
{
	struct rec *r = ctx;

	r->nevents++;
	switch (ev->kind) {
	case PROV_EV_DELTA:
		CU_ASSERT(ev->len > 0);
		buf_add(&r->text, ev->text, ev->len);
		r->ndeltas++;
		if (!r->last_delta)
			buf_adds(&r->events, "D");
		r->last_delta = true;
		break;
	case PROV_EV_USAGE:
		buf_addf(&r->events, "<U %lld %lld %lld %lld>", (long long)ev->usage->prompt_tokens,
			 (long long)ev->usage->completion_tokens,
			 (long long)ev->usage->total_tokens, (long long)ev->usage->cached_tokens);
		r->last_delta = false;
		break;
	case PROV_EV_FINISH:
		buf_addf(&r->events, "<F %s>", ev->finish_reason);
		r->last_delta = false;
		break;
	case PROV_EV_ERROR:
		buf_addf(&r->events, "<E %d %s>", ev->failure->upstream_status,
			 ev->failure->message ? ev->failure->message : "");
		r->last_delta = false;
		break;
	}
	if (r->abort_after && r->nevents >= r->abort_after)
		return -1;
	return 0;
}

/* ---- a parser in a given mode, made the way prov_run makes it ----------------------- */

struct mode_parser {
	struct prov_provider pv;
	struct prov_plan plan;
	void *st;
};

/* 0, or the plan's -errno (a refused configuration). */
static int mode_parser_new(struct mode_parser *mp, const char *mode)
{
	struct prov_outcome out;
	json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", "hi");
	struct prov_request req = { .messages = msgs, .model_name = "m", .request_id = "t" };
	int ret;

	memset(mp, 0, sizeof(*mp));
	memset(&out, 0, sizeof(out));
	mp->pv.name = "local";
	mp->pv.type = "command";
	mp->pv.ops = &prov_command_ops;
	mp->pv.conf = mode ? json_pack("{s:[s],s:s}", "argv", "/usr/bin/cat", "output", mode)
			   : json_pack("{s:[s]}", "argv", "/usr/bin/cat");
	buf_init(&mp->plan.stdin_data);
	mp->plan.policy = sbx_policy_new();
	CU_ASSERT_FATAL(mp->pv.conf && mp->plan.policy);
	ret = prov_command_ops.plan(&mp->pv, &req, &mp->plan, &out);
	json_decref(msgs);
	if (ret) {
		CU_ASSERT(strstr(out.message, "misconfigured") != NULL);
		return ret;
	}
	mp->st = prov_command_ops.parser_new(&mp->pv);
	CU_ASSERT_FATAL(mp->st != NULL);
	return 0;
}

static void mode_parser_free(struct mode_parser *mp)
{
	if (mp->st)
		prov_command_ops.parser_free(mp->st);
	prov_plan_release(&mp->plan);
	json_decref(mp->pv.conf);
}

struct feed_result {
	int first_stop; /* the first non-zero feed return */
	int finish_ret;
};

/* Feed data in pieces of step bytes (0 = whole), or as two pieces cut at split (>= 0). */
static struct feed_result feed(const char *mode, const char *data, size_t len, size_t step,
			       long split, struct rec *r)
{
	struct prov_sink sink = { .emit = rec_emit, .ctx = r };
	struct mode_parser mp;
	struct feed_result fr = { 0, 0 };
	size_t off = 0;
	int pieces = 0;

	CU_ASSERT_FATAL(mode_parser_new(&mp, mode) == 0);
	while (off < len || pieces == 0) {
		size_t n = split >= 0 ? (pieces ? len - off : (size_t)split) : step ? step : len;
		int ret;

		if (n > len - off)
			n = len - off;
		ret = prov_command_ops.parser_feed(mp.st, data + off, n, &sink);
		if (ret && !fr.first_stop)
			fr.first_stop = ret;
		off += n;
		pieces++;
	}
	fr.finish_ret = prov_command_ops.parser_finish(mp.st, &sink);
	mode_parser_free(&mp);
	return fr;
}

/* Whole, byte by byte, at every split: the same text and events each time. r gets the
 * whole-feed events. */
static struct feed_result feed_all_ways(const char *mode, const char *data, struct rec *r)
{
	size_t len = strlen(data);
	struct feed_result whole, fr;
	struct rec other;

	rec_init(r);
	whole = feed(mode, data, len, 0, -1, r);
	for (long split = -1; split <= (long)len; split++) {
		rec_init(&other);
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
		rec_release(&other);
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
	struct rec r;
	struct feed_result fr = feed_all_ways("sse", sse_output, &r);

	CU_ASSERT_STRING_EQUAL(r.text.data, "Hello, w\xc3\xb6rld \xe2\x82\xac");
	CU_ASSERT_STRING_EQUAL(r.events.data, "D<F length><U 12 5 17 4>");
	CU_ASSERT_EQUAL(fr.first_stop, 1); /* [DONE] ends the answer early */
	CU_ASSERT_EQUAL(fr.finish_ret, 0);
	rec_release(&r);
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
	struct rec r;
	struct feed_result fr = feed_all_ways("ndjson", ndjson_output, &r);

	CU_ASSERT_STRING_EQUAL(r.text.data, "one two");
	/* total_tokens is computed when missing; the last line had no "\n". */
	CU_ASSERT_STRING_EQUAL(r.events.data, "D<F stop><U 3 2 5 0>");
	CU_ASSERT_EQUAL(fr.first_stop, 0);
	rec_release(&r);
}

static void test_ndjson_completion_and_done(void)
{
	static const char out[] =
		"{\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
		"\"assistant\",\"content\":\"whole answer\"},\"finish_reason\":\"weird\"}]}\n"
		"[DONE]\n"
		"{\"choices\":[{\"delta\":{\"content\":\"ignored\"}}]}\n";
	struct rec r;
	struct feed_result fr = feed_all_ways("ndjson", out, &r);

	CU_ASSERT_STRING_EQUAL(r.text.data, "whole answer");
	CU_ASSERT_STRING_EQUAL(r.events.data, "D<F stop>"); /* unknown reasons become stop */
	CU_ASSERT_EQUAL(fr.first_stop, 1);
	rec_release(&r);
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
	struct rec r;
	struct feed_result fr;

	fr = feed_all_ways("sse", sse_err, &r);
	CU_ASSERT_STRING_EQUAL(r.text.data, "partial");
	CU_ASSERT(strncmp(r.events.data, "D<E 429 ", 8) == 0);
	/* OLP's words, never the tool's (which may name internal URLs). */
	CU_ASSERT(strstr(r.events.data, "10.0.0.1") == NULL);
	CU_ASSERT_EQUAL(fr.first_stop, 1);
	rec_release(&r);

	(void)feed_all_ways("ndjson", nd_err, &r);
	CU_ASSERT(strncmp(r.events.data, "<E 503 ", 7) == 0);
	rec_release(&r);
	(void)feed_all_ways("ndjson", nd_err0, &r);
	CU_ASSERT(strncmp(r.events.data, "<E 0 ", 5) == 0);
	CU_ASSERT(strstr(r.events.data, "boom") == NULL);
	rec_release(&r);
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
	struct rec r;
	struct feed_result fr = feed_all_ways("sse", junk, &r);

	CU_ASSERT_STRING_EQUAL(r.text.data, "ok!");
	CU_ASSERT_STRING_EQUAL(r.events.data, "D");
	CU_ASSERT_EQUAL(fr.first_stop, 0);
	rec_release(&r);
}

/* Text mode is the default and unchanged: bytes pass through, UTF-8 never split. */
static void test_text_default(void)
{
	static const char out[] = "data: [DONE]\nplain \xe2\x82\xac text\n";
	struct rec r, r2;

	feed_all_ways(NULL, out, &r);
	CU_ASSERT_STRING_EQUAL(r.text.data, out);
	CU_ASSERT_STRING_EQUAL(r.events.data, "D");
	feed_all_ways("text", out, &r2);
	CU_ASSERT_STRING_EQUAL(r2.text.data, out);
	rec_release(&r);
	rec_release(&r2);

	/* A bare prov_parser_new("command") is a text parser even right after an SSE plan
	 * whose parser was never made on this thread... */
	{
		struct mode_parser mp;
		struct prov_parser *ps;
		struct prov_sink sink = { .emit = rec_emit, .ctx = &r };

		rec_init(&r);
		CU_ASSERT_EQUAL(mode_parser_new(&mp, "sse"), 0);
		mode_parser_free(&mp);
		ps = prov_parser_new("command");
		CU_ASSERT_FATAL(ps != NULL);
		CU_ASSERT_EQUAL(prov_parser_feed(ps, "data: [DONE]\n", 13, &sink), 0);
		prov_parser_finish(ps, &sink);
		CU_ASSERT_STRING_EQUAL(r.text.data, "data: [DONE]\n");
		prov_parser_free(ps);
		rec_release(&r);
	}
}

static void test_bad_mode(void)
{
	struct mode_parser mp;

	CU_ASSERT_EQUAL(mode_parser_new(&mp, "xml"), -EINVAL);
	mode_parser_free(&mp);
}

static void test_sink_abort(void)
{
	struct rec r;
	struct prov_sink sink = { .emit = rec_emit, .ctx = &r };
	struct mode_parser mp;

	rec_init(&r);
	r.abort_after = 1;
	CU_ASSERT_EQUAL(mode_parser_new(&mp, "sse"), 0);
	CU_ASSERT_EQUAL(prov_command_ops.parser_feed(mp.st, sse_output, strlen(sse_output), &sink),
			-1);
	CU_ASSERT_EQUAL(r.nevents, 1);
	mode_parser_free(&mp);
	rec_release(&r);
}

/* An overlong line ends the answer with a provider error. */
static void test_overlong(void)
{
	size_t n = PROV_NDJSON_MAX_LINE + 16;
	char *big = malloc(n);
	struct rec r;
	struct prov_sink sink = { .emit = rec_emit, .ctx = &r };
	struct mode_parser mp;

	CU_ASSERT_FATAL(big != NULL);
	memset(big, 'a', n);
	rec_init(&r);
	CU_ASSERT_EQUAL(mode_parser_new(&mp, "ndjson"), 0);
	CU_ASSERT_EQUAL(prov_command_ops.parser_feed(mp.st, big, n, &sink), 1);
	CU_ASSERT(strncmp(r.events.data, "<E 0 ", 5) == 0);
	mode_parser_free(&mp);
	rec_release(&r);
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
	struct rec rec;
	struct prov_sink sink = { .emit = rec_emit, .ctx = &rec };
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
	rec_init(&rec);
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
	rec_release(&rec);
	json_decref(msgs);
	prov_registry_free(r);
	buf_release(&reg);
	buf_release(&err);
	buf_release(&path);
}

int main(void)
{
	char runtime[] = "/tmp/olp-cmdout-rt-XXXXXX";
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP };
	CU_pSuite s;
	unsigned failed;

	if (!mkdtemp(tmpdir) || !mkdtemp(runtime)) {
		perror("mkdtemp");
		return 1;
	}
	cfg.runtime_dir = runtime;
	if (sbx_global_init(&cfg)) {
		fprintf(stderr, "sbx_global_init failed\n");
		return 1;
	}
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	s = CU_add_suite("command output modes", NULL, NULL);
	CU_add_test(s, "sse: chunks, finish, usage, [DONE]", test_sse);
	CU_add_test(s, "ndjson: chunks, garbage, CRLF, last line unterminated", test_ndjson);
	CU_add_test(s, "ndjson: a whole completion, [DONE]", test_ndjson_completion_and_done);
	CU_add_test(s, "error objects", test_errors);
	CU_add_test(s, "garbage and odd types", test_garbage);
	CU_add_test(s, "text stays the default", test_text_default);
	CU_add_test(s, "an unknown mode is refused", test_bad_mode);
	CU_add_test(s, "a sink abort stops the feed", test_sink_abort);
	CU_add_test(s, "an overlong line", test_overlong);
	if (sbx_status_get()->available)
		CU_add_test(s, "prov_run of an sse command under the sandbox", test_run_sse);
	else
		fprintf(stderr, "sandbox not available (%s): prov_run test skipped\n",
			sbx_status_get()->message ? sbx_status_get()->message : "?");
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	failed = CU_get_number_of_failures();
	CU_cleanup_registry();
	sbx_global_release();
	{
		char cmd[160];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", tmpdir, runtime);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", tmpdir);
	}
	return failed ? 1 : 0;
}
