/* CUnit suite for what the forwarder reads of the subscription limits the upstreams
 * announce (egress/ratelimit.c, ADR 0035): the header and body parsers through
 * egress.h, strict about every value, and a real forwarder passing the test upstream's
 * answers (tests/egress/upstream.c /limits/...) to its route's on_limits, a 429's body
 * held until it has been read. */
#include "tests/support/cunit.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <curl/curl.h>

#include "common/common.h"
#include "egress/egress.h"
#include "tests/egress/upstream.h"
#include "common/banned.h"

#define NOW 1800000000LL

static bool hdr(struct egr_ratelimit *rl, const char *name, const char *value)
{
	return egr_rl_header(rl, name, strlen(name), value, strlen(value), NOW);
}

static bool body(struct egr_ratelimit *rl, const char *text)
{
	return egr_rl_body(rl, text, strlen(text), NOW);
}

static void test_anthropic_headers(void)
{
	struct egr_ratelimit rl;

	egr_rl_init(&rl, 200);
	CU_ASSERT(hdr(&rl, "anthropic-ratelimit-unified-status", "allowed_warning"));
	CU_ASSERT(hdr(&rl, "Anthropic-Ratelimit-Unified-Reset", "1800003600"));
	CU_ASSERT(hdr(&rl, "anthropic-ratelimit-unified-representative-claim", "five_hour"));
	CU_ASSERT(hdr(&rl, "anthropic-ratelimit-unified-5h-status", "allowed_warning"));
	CU_ASSERT(hdr(&rl, "anthropic-ratelimit-unified-5h-utilization", "0.91"));
	CU_ASSERT(hdr(&rl, "anthropic-ratelimit-unified-5h-reset", "1800003600"));
	CU_ASSERT(hdr(&rl, "anthropic-ratelimit-unified-7d-utilization", "0.3"));
	CU_ASSERT(hdr(&rl, "anthropic-ratelimit-unified-7d-reset", "1800500000"));
	/* Others are not ours. */
	CU_ASSERT(!hdr(&rl, "anthropic-ratelimit-requests-limit", "50"));
	CU_ASSERT(!hdr(&rl, "content-type", "application/json"));
	egr_rl_finish(&rl);
	CU_ASSERT(rl.any);
	CU_ASSERT_EQUAL(rl.status, EGR_RL_WARNING);
	CU_ASSERT_EQUAL(rl.reset_s, 1800003600);
	CU_ASSERT_STRING_EQUAL(rl.claim, "five_hour");
	CU_ASSERT(rl.win[EGR_RL_5H].seen);
	CU_ASSERT_EQUAL(rl.win[EGR_RL_5H].status, EGR_RL_WARNING);
	CU_ASSERT_DOUBLE_EQUAL(rl.win[EGR_RL_5H].utilization, 0.91, 1e-9);
	CU_ASSERT_EQUAL(rl.win[EGR_RL_5H].reset_s, 1800003600);
	CU_ASSERT_DOUBLE_EQUAL(rl.win[EGR_RL_7D].utilization, 0.3, 1e-9);
	CU_ASSERT(!rl.win[EGR_RL_PRIMARY].seen);
	CU_ASSERT_STRING_EQUAL(egr_rl_status_name(rl.status), "allowed_warning");
	CU_ASSERT_STRING_EQUAL(egr_rl_window_name(EGR_RL_7D), "7d");
}

/* Every value that is not exactly what the upstreams send is ignored. */
static void test_strict_values(void)
{
	static const char *const bad_util[] = {
		"",    "-0.5", "+0.5", "0.5e1", "nan",
		"inf", "0x1",  ".5",   "5.",	"0,5",
		"1 ",  "11",   "0.5a", "1e-3",	"00000000000000001"
	};
	static const char *const bad_time[] = { "",	      "-1",
						"12",	      "17000000000000000000",
						"1.8e9",      "1800000000 ",
						"0x6b49d200", "2026-12-02T15:00:00Z" };
	static const char *const bad_status[] = { "", "allow", "rejected ", "REJECTEDX", "ok" };
	static const char *const bad_claim[] = { "", "Five Hour", "five-hour", "x\"y",
						 "a_claim_that_is_far_too_long_for_us" };
	static const char *const bad_pct[] = { "", "-5", "1001", "5e1", "50%", " 50" };
	struct egr_ratelimit rl;

	egr_rl_init(&rl, 200);

	for (size_t i = 0; i < ARRAY_SIZE(bad_util); i++)
		CU_ASSERT(!hdr(&rl, "anthropic-ratelimit-unified-5h-utilization", bad_util[i]));
	for (size_t i = 0; i < ARRAY_SIZE(bad_pct); i++)
		CU_ASSERT(!hdr(&rl, "x-codex-primary-used-percent", bad_pct[i]));
	for (size_t i = 0; i < ARRAY_SIZE(bad_time); i++) {
		CU_ASSERT(!hdr(&rl, "anthropic-ratelimit-unified-reset", bad_time[i]));
		CU_ASSERT(!hdr(&rl, "x-codex-secondary-reset-at", bad_time[i]));
	}
	CU_ASSERT(!hdr(&rl, "x-codex-primary-reset-after-seconds", "99999999999"));
	CU_ASSERT(!hdr(&rl, "x-codex-primary-window-minutes", "0"));
	CU_ASSERT(!hdr(&rl, "x-codex-primary-window-minutes", "-300"));
	for (size_t i = 0; i < ARRAY_SIZE(bad_status); i++)
		CU_ASSERT(!hdr(&rl, "anthropic-ratelimit-unified-status", bad_status[i]));
	for (size_t i = 0; i < ARRAY_SIZE(bad_claim); i++)
		CU_ASSERT(!hdr(&rl, "anthropic-ratelimit-unified-representative-claim",
			       bad_claim[i]));
	/* A window we do not know, or a field of none. */
	CU_ASSERT(!hdr(&rl, "anthropic-ratelimit-unified-9d-utilization", "0.5"));
	CU_ASSERT(!hdr(&rl, "anthropic-ratelimit-unified-", "0.5"));
	CU_ASSERT(!hdr(&rl, "x-codex-tertiary-used-percent", "50"));
	egr_rl_finish(&rl);
	CU_ASSERT(!rl.any);
	CU_ASSERT_EQUAL(rl.status, EGR_RL_UNKNOWN);
	/* Above 1 (up to 10) is full. */
	CU_ASSERT(hdr(&rl, "anthropic-ratelimit-unified-7d-utilization", "1.07"));
	CU_ASSERT_DOUBLE_EQUAL(rl.win[EGR_RL_7D].utilization, 1.0, 1e-9);
}

static void test_codex(void)
{
	static const char limit_body[] = "{\"error\":{\"type\":\"usage_limit_reached\",\"message\":"
					 "\"You've hit your usage limit\",\"plan_type\":\"plus\","
					 "\"resets_in_seconds\":1200}}";
	struct egr_ratelimit rl;

	egr_rl_init(&rl, 200);
	CU_ASSERT(hdr(&rl, "x-codex-primary-used-percent", "42.5"));
	CU_ASSERT(hdr(&rl, "x-codex-primary-window-minutes", "300"));
	CU_ASSERT(hdr(&rl, "x-codex-primary-reset-after-seconds", "600"));
	CU_ASSERT(hdr(&rl, "x-codex-secondary-used-percent", "100"));
	CU_ASSERT(hdr(&rl, "x-codex-secondary-window-minutes", "10080"));
	CU_ASSERT(hdr(&rl, "x-codex-secondary-reset-at", "1800090000"));
	egr_rl_finish(&rl);
	CU_ASSERT_EQUAL(rl.status, EGR_RL_ALLOWED); /* the answer came: not refused */
	CU_ASSERT_DOUBLE_EQUAL(rl.win[EGR_RL_PRIMARY].utilization, 0.425, 1e-9);
	CU_ASSERT_EQUAL(rl.win[EGR_RL_PRIMARY].minutes, 300);
	CU_ASSERT_EQUAL(rl.win[EGR_RL_PRIMARY].reset_s, NOW + 600);
	CU_ASSERT_EQUAL(rl.win[EGR_RL_SECONDARY].reset_s, 1800090000);

	/* A 429's body: rejected until the reset it names. */
	egr_rl_init(&rl, 429);
	CU_ASSERT(body(&rl, limit_body));
	egr_rl_finish(&rl);
	CU_ASSERT_EQUAL(rl.status, EGR_RL_REJECTED);
	CU_ASSERT_EQUAL(rl.reset_s, NOW + 1200);
	egr_rl_init(&rl, 429);
	CU_ASSERT(body(&rl, "{\"type\":\"usage_limit_reached\",\"resets_at\":1800007200}"));
	CU_ASSERT_EQUAL(rl.reset_s, 1800007200);
	/* Without a reset: rejected, and no time to give. */
	egr_rl_init(&rl, 429);
	CU_ASSERT(body(&rl, "{\"error\":{\"code\":\"usage_limit_reached\","
			    "\"resets_at\":\"soon\"}}"));
	CU_ASSERT_EQUAL(rl.reset_s, 0);
	/* Other bodies: nothing. */
	egr_rl_init(&rl, 429);
	CU_ASSERT(!body(&rl, "{\"error\":{\"type\":\"rate_limit_error\"}}"));
	CU_ASSERT(!body(&rl, "not json"));
	CU_ASSERT(!body(&rl, "[\"usage_limit_reached\"]"));
	CU_ASSERT(!rl.any);
	/* A rejected window without an overall reset gives its own. */
	egr_rl_init(&rl, 429);
	CU_ASSERT(hdr(&rl, "anthropic-ratelimit-unified-7d-status", "rejected"));
	CU_ASSERT(hdr(&rl, "anthropic-ratelimit-unified-7d-reset", "1800500000"));
	CU_ASSERT(hdr(&rl, "anthropic-ratelimit-unified-5h-reset", "1800003600"));
	egr_rl_finish(&rl);
	CU_ASSERT_EQUAL(rl.status, EGR_RL_REJECTED);
	CU_ASSERT_EQUAL(rl.reset_s, 1800500000);
}

/* ---- through a forwarder ---------------------------------------------------------------- */

struct seen {
	pthread_mutex_t lock;
	int calls;
	struct egr_ratelimit last;
};

static void on_limits(void *ctx, const struct egr_ratelimit *rl)
{
	struct seen *s = ctx;

	pthread_mutex_lock(&s->lock);
	s->calls++;
	s->last = *rl;
	pthread_mutex_unlock(&s->lock);
}

static int listener(uint16_t *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 16) ||
	    getsockname(fd, (struct sockaddr *)&a, &len)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	*port = ntohs(a.sin_port);
	return fd;
}

static size_t collect(char *p, size_t size, size_t n, void *ud)
{
	buf_add(ud, p, size * n);
	return size * n;
}

/* GET path through the forwarder: the status, the body in body. */
static long get(uint16_t port, const char *path, struct buf *body)
{
	CURL *e = curl_easy_init();
	char url[256];
	long status = 0;

	buf_reset(body);
	snprintf(url, sizeof(url), "http://127.0.0.1:%u%s", port, path);
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, body);
	curl_easy_setopt(e, CURLOPT_TIMEOUT, 10L);
	if (curl_easy_perform(e) == CURLE_OK)
		curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_cleanup(e);
	return status;
}

static void test_forwarder(void)
{
	struct tu_server *up = tu_start(NULL, NULL);
	struct seen s = { .lock = PTHREAD_MUTEX_INITIALIZER };
	char base[64];
	struct egr_route r = { .mode = EGR_MODE_UPSTREAM,
			       .request_id = "test-ratelimit",
			       .upstream = base,
			       .flags = EGR_ANY_PATH,
			       .on_limits = on_limits,
			       .limits_ctx = &s };
	struct egr_forwarder *f;
	struct buf body = BUF_INIT;
	uint16_t port = 0;
	int fd;

	CU_ASSERT_PTR_NOT_NULL_FATAL(up);
	snprintf(base, sizeof(base), "http://127.0.0.1:%u", tu_port(up));
	fd = listener(&port);
	CU_ASSERT_FATAL(fd >= 0);
	f = egr_start(fd, &r, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);

	/* No limit headers: not called. */
	CU_ASSERT_EQUAL(get(port, "/plain", &body), 200);
	CU_ASSERT_EQUAL(s.calls, 0);
	CU_ASSERT_EQUAL(get(port, "/limits/anthropic", &body), 200);
	CU_ASSERT_EQUAL(s.calls, 1);
	CU_ASSERT_EQUAL(s.last.status, EGR_RL_ALLOWED);
	CU_ASSERT_DOUBLE_EQUAL(s.last.win[EGR_RL_5H].utilization, 0.42, 1e-9);
	CU_ASSERT_DOUBLE_EQUAL(s.last.win[EGR_RL_7D].utilization, 0.25, 1e-9);
	CU_ASSERT_EQUAL(s.last.win[EGR_RL_7D].reset_s, 4102999999LL);
	CU_ASSERT_EQUAL(s.last.http_status, 200);
	/* A 429: told before the client has its body, which arrives whole. */
	CU_ASSERT_EQUAL(get(port, "/limits/anthropic?rejected=1", &body), 429);
	CU_ASSERT_EQUAL(s.calls, 2);
	CU_ASSERT_EQUAL(s.last.status, EGR_RL_REJECTED);
	CU_ASSERT_EQUAL(s.last.reset_s, 4102444800LL);
	CU_ASSERT_PTR_NOT_NULL(strstr(body.data, "rate_limit_error"));
	CU_ASSERT_EQUAL(get(port, "/limits/codex429", &body), 429);
	CU_ASSERT_EQUAL(s.calls, 3);
	CU_ASSERT_EQUAL(s.last.status, EGR_RL_REJECTED);
	CU_ASSERT(s.last.reset_s >= wall_ms() / 1000 + 3590 &&
		  s.last.reset_s <= wall_ms() / 1000 + 3600);
	CU_ASSERT_DOUBLE_EQUAL(s.last.win[EGR_RL_PRIMARY].utilization, 1.0, 1e-9);
	CU_ASSERT_EQUAL(s.last.win[EGR_RL_PRIMARY].minutes, 300);
	CU_ASSERT_DOUBLE_EQUAL(s.last.win[EGR_RL_SECONDARY].utilization, 0.125, 1e-9);
	CU_ASSERT_PTR_NOT_NULL(strstr(body.data, "\"resets_in_seconds\":3600}}"));
	/* An ordinary 429 (no limit words): not called. */
	CU_ASSERT_EQUAL(get(port, "/status/429", &body), 429);
	CU_ASSERT_EQUAL(s.calls, 3);
	CU_ASSERT_PTR_NOT_NULL(strstr(body.data, "\"status\""));
	egr_stop(f, NULL);
	tu_stop(up);
	buf_release(&body);
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "Anthropic's unified headers", test_anthropic_headers },
		{ "bad values ignored", test_strict_values },
		{ "codex's headers and 429 bodies", test_codex },
		{ "a forwarder tells what its answers said", test_forwarder },
		{ NULL, NULL },
	};

	log_set_program("test_ratelimit");
	log_set_level(LOG_LVL_ERROR);
	if (egr_global_init())
		return 1;
	return ts_exit_status(ts_cunit_run("egress_ratelimit", tests));
}
