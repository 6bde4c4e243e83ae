/* The process layer every provider shares: plan → sandbox policy → supervised run →
 * parser → events, and the mapping of how a run ended to an error a client understands. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "egress/egress.h"
#include "providers/internal.h"
#include "common/banned.h"

/* What a secretless run's API-key variable holds: the CLI insists on one, the forwarder
 * drops it (EGR_DEFAULT_DROP) and sets the real one. */
#define NET_PLACEHOLDER_KEY "olp-placeholder-not-a-key"

static const struct {
	const char *code;
	int status;
} errors[] = {
	[PROV_OK] = { "OK", 200 },
	[PROV_ERR_AUTH_MISSING] = { "AUTH_MISSING", 502 },
	[PROV_ERR_SPAWN_FAILED] = { "SPAWN_FAILED", 502 },
	[PROV_ERR_SPAWN_TIMEOUT] = { "SPAWN_TIMEOUT", 504 },
	[PROV_ERR_CONCURRENCY_LIMIT] = { "CONCURRENCY_LIMIT", 429 },
	[PROV_ERR_PROVIDER_ERROR] = { "PROVIDER_ERROR", 502 },
	[PROV_ERR_SANDBOX] = { "SANDBOX_UNAVAILABLE", 503 },
	[PROV_ERR_CLIENT_GONE] = { "CLIENT_GONE", 499 },
	[PROV_ERR_PROMPT_REFUSED] = { "PROMPT_REFUSED", 400 },
};

const char *prov_error_code(enum prov_error e)
{
	return (size_t)e < ARRAY_SIZE(errors) ? errors[e].code : "UNKNOWN";
}

int prov_error_status(enum prov_error e)
{
	return (size_t)e < ARRAY_SIZE(errors) ? errors[e].status : 500;
}

void prov_plan_release(struct prov_plan *plan)
{
	strv_release(&plan->argv);
	buf_release(&plan->stdin_data);
	sbx_policy_free(plan->policy);
	memset(plan, 0, sizeof(*plan));
}

/* ---- parsers ------------------------------------------------------------------------- */

struct prov_parser {
	const struct provider_ops *ops;
	void *st;
};

struct prov_parser *prov_parser_new(const char *type)
{
	const struct provider_ops *ops = prov_ops_for_type(type);
	struct prov_parser *ps;

	if (!ops)
		return NULL;
	ps = xcalloc(1, sizeof(*ps));
	ps->ops = ops;
	ps->st = ops->parser_new(NULL);
	return ps;
}

struct prov_parser *prov_parser_for(const struct prov_provider *pv)
{
	struct prov_parser *ps = xcalloc(1, sizeof(*ps));

	ps->ops = pv->ops;
	ps->st = pv->ops->parser_new(pv);
	return ps;
}

int prov_parser_feed(struct prov_parser *ps, const char *data, size_t len,
		     const struct prov_sink *sink)
{
	return ps->ops->parser_feed(ps->st, data, len, sink);
}

int prov_parser_finish(struct prov_parser *ps, const struct prov_sink *sink)
{
	return ps->ops->parser_finish(ps->st, sink);
}

void prov_parser_free(struct prov_parser *ps)
{
	if (!ps)
		return;
	ps->ops->parser_free(ps->st);
	free(ps);
}

/* ---- a run's way out (upstream and CONNECT modes) ------------------------------------- */

struct net_run {
	struct egr_route route;
	struct egr_header *hdrs;
	struct buf *values; /* the credentials read for this run: wiped once egr copied them */
	size_t n;
	struct strv models; /* route.models */
	/* A held login's headers (prov_login_headers), until copied into values. */
	struct strv held_names, held_values;
	size_t n_held;
	uint64_t deadline_ms;
	struct egr_forwarder *fwd;
};

/* The held login's values, once copied into values; its names stay, route.set_headers
 * points at them. */
static void held_wipe(struct net_run *nr)
{
	for (size_t i = 0; i < nr->held_values.n; i++)
		explicit_bzero(nr->held_values.v[i], strlen(nr->held_values.v[i]));
	strv_release(&nr->held_values);
}

static void net_wipe(struct net_run *nr)
{
	for (size_t i = 0; i < nr->n; i++) {
		if (nr->values[i].len)
			explicit_bzero(nr->values[i].data, nr->values[i].len);
		buf_release(&nr->values[i]);
	}
	free(nr->values);
	free(nr->hdrs);
	strv_release(&nr->models);
	held_wipe(nr);
	strv_release(&nr->held_names);
	nr->route.models = NULL;
	nr->values = NULL;
	nr->hdrs = NULL;
	nr->n = 0;
	nr->n_held = 0;
}

/* The route for this run, with each credential read now (a rotated key is picked up). A
 * credential that cannot be read fails the run before anything starts; the log names the
 * file or variable, never what it holds. 0, or -1 after failing out. */
static int net_prepare(const struct prov_provider *pv, const struct prov_request *req,
		       uint64_t deadline_ms, struct net_run *nr, struct prov_outcome *out);

/* The forwarder's stats, one line per run: counts only, never a header, path or key. */
static void net_finish(const struct prov_provider *pv, const char *rid, struct net_run *nr)
{
	struct egr_stats st = { 0 };

	net_wipe(nr);
	if (!nr->fwd)
		return;
	egr_stop(nr->fwd, &st);
	nr->fwd = NULL;
	log_info(rid,
		 "provider %s: network %s%s%s: %llu connections, %llu requests, %llu refused, "
		 "%llu upstream errors, %llu bytes up, %llu bytes down",
		 pv->name, prov_net_mode_name(pv->net.mode), pv->net.upstream_host ? " " : "",
		 pv->net.upstream_host ? pv->net.upstream_host : "", (unsigned long long)st.conns,
		 (unsigned long long)st.requests, (unsigned long long)st.refused,
		 (unsigned long long)st.upstream_errors, (unsigned long long)st.bytes_up,
		 (unsigned long long)st.bytes_down);
}

/* ---- one run ------------------------------------------------------------------------- */

struct run_ctx {
	const struct prov_request *req;
	int slot;		      /* concurrency slot fd, or < 0 */
	bool concluded;		      /* the outcome is final */
	bool done_sent;		      /* sink->done was called */
	const struct prov_sink *sink; /* the caller's: gets deltas only */
	struct prov_sink inner;	      /* what parsers emit into */
	struct prov_parser parser;
	struct prov_outcome *out;
	/* The first failure the provider reported in its output (PROV_EV_ERROR). */
	enum prov_error failure;
	int upstream_status;
	char failure_msg[200];
	struct net_run net;
	bool retry; /* a pre-started run failed before any output: run again, cold */
	bool retried;
	size_t given_bytes; /* what the CLI was given: stdin and argv (estimate_usage) */
	size_t out_bytes;   /* what reached the sink: answer text, call arguments */
};

/* Deltas go through at once (no buffering here); usage and finish are kept for the
 * caller, which closes the answer when the run is over. */
static int inner_emit(void *ctx, const struct prov_event *ev)
{
	struct run_ctx *rc = ctx;

	switch (ev->kind) {
	case PROV_EV_DELTA:
	case PROV_EV_TOOL_CALL: /* a function call of the model's is output too */
		rc->out->output_started = true;
		rc->out_bytes += ev->len;
		return rc->sink->emit(rc->sink->ctx, ev);
	case PROV_EV_USAGE:
		rc->out->usage = *ev->usage;
		rc->out->usage.present = true;
		return 0;
	case PROV_EV_FINISH:
		snprintf(rc->out->finish_reason, sizeof(rc->out->finish_reason), "%s",
			 ev->finish_reason);
		return 0;
	case PROV_EV_ERROR:
		if (rc->failure == PROV_OK && ev->failure) {
			rc->failure = ev->failure->err ? ev->failure->err : PROV_ERR_PROVIDER_ERROR;
			rc->upstream_status = ev->failure->upstream_status;
			snprintf(rc->failure_msg, sizeof(rc->failure_msg), "%s",
				 ev->failure->message ? ev->failure->message : "request failed");
		}
		return 0;
	}
	return 0;
}

/* The status a client gets for an upstream API error the provider reported: a rate limit
 * stays a rate limit (the client should back off and retry), an overloaded upstream is a
 * 503; anything else, the upstream rejecting our credentials included, is the gateway's
 * problem (502), never a 401 that would make the client doubt its own OLP key. */
static int status_for_upstream(int upstream)
{
	switch (upstream) {
	case 429: return 429;
	case 503:
	case 529: return 503;
	default: return 502;
	}
}

static int on_stdout(void *ctx, const char *data, size_t len)
{
	struct run_ctx *rc = ctx;

	return prov_parser_feed(&rc->parser, data, len, &rc->inner);
}

static void fail(struct prov_outcome *out, enum prov_error e, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void fail(struct prov_outcome *out, enum prov_error e, const char *fmt, ...)
{
	va_list ap;

	out->err = e;
	out->status = prov_error_status(e);
	va_start(ap, fmt);
	/* va_start is right above: the analyzer's report here is a false positive. */
	/* NOLINTNEXTLINE(clang-analyzer-valist.Uninitialized) */
	(void)vsnprintf(out->message, sizeof(out->message), fmt, ap);
	va_end(ap);
}

/* A spawn that failed for want of the worker's own resources (descriptors, memory,
 * processes), which no provider could have had either. */
static bool worker_exhausted(int err)
{
	return err == EMFILE || err == ENFILE || err == ENOMEM || err == EAGAIN;
}

/* Turn how the process ended into the outcome a client sees. */
static void map_result(const struct prov_provider *pv, const struct sbx_result *res,
		       struct prov_outcome *out)
{
	out->exit_status = res->exit_status;
	out->duration_ms = res->duration_ms;
	out->ran = res->end != SBX_END_SPAWN_FAILED;
	out->start = res->start;
	{
		/* The last bytes are the ones that say what went wrong. */
		size_t len = strlen(res->stderr_tail), keep = sizeof(out->stderr_tail) - 1;

		if (len < keep)
			keep = len;
		memcpy(out->stderr_tail, res->stderr_tail + len - keep, keep);
		out->stderr_tail[keep] = '\0';
	}
	switch (res->end) {
	case SBX_END_EXITED:
		if (res->failure == SBX_FAIL_EXEC) {
			fail(out, PROV_ERR_SPAWN_FAILED,
			     "Provider %s: its command could not be started", pv->name);
		} else if (res->failure != SBX_FAIL_NONE) { /* the sandbox's own */
			fail(out, PROV_ERR_SANDBOX,
			     "The sandbox for provider %s could not start; "
			     "the request was not run",
			     pv->name);
		} else if (res->exit_status) {
			fail(out, PROV_ERR_PROVIDER_ERROR, "Provider %s failed (exit status %d)",
			     pv->name, res->exit_status);
		}
		break;
	case SBX_END_SIGNALED:
		fail(out, PROV_ERR_PROVIDER_ERROR, "Provider %s was killed by signal %d", pv->name,
		     res->term_signal);
		break;
	case SBX_END_TIMEOUT:
		fail(out, PROV_ERR_SPAWN_TIMEOUT, "Provider %s timed out after %llu ms", pv->name,
		     (unsigned long long)pv->timeout_ms);
		break;
	case SBX_END_ABORTED: fail(out, PROV_ERR_CLIENT_GONE, "The client went away"); break;
	case SBX_END_STOPPED: break;
	case SBX_END_SPAWN_FAILED:
		if (res->failure == SBX_FAIL_NETWORK) {
			/* Fail closed: without its own namespace the run would have the host's. */
			fail(out, PROV_ERR_SANDBOX,
			     "The network namespace for provider %s (network \"%s\") could not "
			     "be set up (%s: %s); the request was not run",
			     pv->name, prov_net_mode_name(pv->net.mode),
			     res->spawn_stage ? res->spawn_stage : "netns",
			     res->spawn_errno ? strerror(res->spawn_errno) : "refused");
			break;
		}
		if (worker_exhausted(res->spawn_errno)) {
			/* The worker's own resources, not the provider: no run can start here
			 * now, whichever provider it is (503, as for a sandbox that cannot). */
			fail(out, PROV_ERR_SANDBOX,
			     "The sandbox for provider %s could not be set up (%s: %s); retry "
			     "shortly",
			     pv->name, res->spawn_stage ? res->spawn_stage : "spawn",
			     strerror(res->spawn_errno));
			break;
		}
		fail(out, PROV_ERR_SPAWN_FAILED,
		     "Provider %s: its command could not be started (%s)", pv->name,
		     res->spawn_stage ? res->spawn_stage : "spawn");
		break;
	}
}

static int64_t tokens_of(size_t bytes)
{
	return (int64_t)((bytes + 3) / 4);
}

/* A run cut before its provider said what it used (ended at a stop sequence or by a
 * client gone, at the timeout, or failing after output) has spent upstream tokens all the
 * same: counted as none, a stop sequence that matches at once would dodge a key's
 * tokens_per_day. What the provider did report (claude's prompt count when the message
 * started) is kept; the rest is estimated at 4 bytes a token. A run that failed before
 * any output and reported nothing (a refused login, a 429) spent nothing. */
static void estimate_usage(struct run_ctx *rc, const struct sbx_result *res, bool ended)
{
	const struct prov_provider *pv = rc->req->model->provider;
	struct prov_outcome *out = rc->out;
	struct prov_usage *u = &out->usage;
	/* ended: complete at the end of output, where no usage line came (codex stopped at
	 * the client's calls); the forwarder, when there is one, counted it (net_usage). */
	bool cut = res->end == SBX_END_ABORTED || res->end == SBX_END_TIMEOUT ||
		   (out->err && out->output_started) || (ended && !rc->net.fwd);

	if (!pv->ops->upstream_tokens || !out->ran || !(u->partial || (!u->present && cut)))
		return;
	if (!u->present || !u->prompt_tokens)
		u->prompt_tokens = tokens_of(rc->given_bytes);
	if (u->completion_tokens < tokens_of(rc->out_bytes))
		u->completion_tokens = tokens_of(rc->out_bytes);
	u->total_tokens = u->prompt_tokens + u->completion_tokens;
	u->present = true;
	u->partial = false;
	u->estimated = true;
}

/* What the upstream itself reported through the forwarder beats a smaller report of the
 * CLI's (ADR 0027): a run that called the API past its CLI, or a CLI that under-reports,
 * is billed for what the upstream counted. Read before the outcome is handed on, while the
 * forwarder still runs: every answer the CLI read had gone through its count first. */
static void net_usage(struct run_ctx *rc)
{
	struct prov_usage *u = &rc->out->usage;
	struct egr_usage e;

	if (!rc->net.fwd)
		return;
	egr_usage_get(rc->net.fwd, &e);
	if (!e.answers ||
	    (e.input_tokens <= u->prompt_tokens && e.output_tokens <= u->completion_tokens))
		return;
	if (u->present)
		log_warnx(rc->req->request_id,
			  "provider %s: the upstream counted %lld input and %lld output tokens in "
			  "%llu answers, the CLI reported %lld and %lld: the larger are billed",
			  rc->req->model->provider->name, (long long)e.input_tokens,
			  (long long)e.output_tokens, (unsigned long long)e.answers,
			  (long long)u->prompt_tokens, (long long)u->completion_tokens);
	if (e.input_tokens > u->prompt_tokens)
		u->prompt_tokens = e.input_tokens;
	if (e.output_tokens > u->completion_tokens)
		u->completion_tokens = e.output_tokens;
	if (e.cached_tokens > u->cached_tokens)
		u->cached_tokens = e.cached_tokens;
	u->total_tokens = u->prompt_tokens + u->completion_tokens;
	u->present = true;
	u->partial = false;
}

/* Everything known about the run: turn it into the outcome, once. */
static void conclude(struct run_ctx *rc, const struct sbx_result *res)
{
	const struct prov_provider *pv = rc->req->model->provider;
	struct prov_outcome *out = rc->out;

	struct sbx_result r = *res;
	bool ended = false;

	if (rc->concluded)
		return;
	rc->concluded = true;
	/* A parser that found the answer complete at the end of output (codex ended by its
	 * hook at the client's tool calls) makes the run a success, whatever the exit. */
	if ((res->end == SBX_END_EXITED || res->end == SBX_END_STOPPED) &&
	    prov_parser_finish(&rc->parser, &rc->inner) > 0) {
		r.end = SBX_END_STOPPED;
		ended = true;
	}
	map_result(pv, &r, out);
	/* What the provider said about its own failure beats the exit status it ended with
	 * (a timeout, a client gone or a sandbox that never started stay what they are). */
	if (rc->failure != PROV_OK &&
	    (out->err == PROV_OK || out->err == PROV_ERR_PROVIDER_ERROR)) {
		fail(out, rc->failure, "Provider %s: %s", pv->name, rc->failure_msg);
		out->upstream_status = rc->upstream_status;
		if (rc->failure == PROV_ERR_PROVIDER_ERROR && rc->upstream_status)
			out->status = status_for_upstream(rc->upstream_status);
	}
	estimate_usage(rc, res, ended);
	net_usage(rc);
	if (out->err && out->err != PROV_ERR_CLIENT_GONE)
		log_warnx(rc->req->request_id,
			  "provider %s: %s (%s, exit %d, upstream %d, %zu bytes "
			  "out)%s%.200s",
			  pv->name, prov_error_code(out->err), sbx_end_name(res->end),
			  res->exit_status, out->upstream_status, res->stdout_bytes,
			  out->stderr_tail[0] ? "; stderr: " : "", out->stderr_tail);
}

/* A pre-started process that failed before any output reached the client, in a way a
 * process started now may not: a credential that expired while it waited (AUTH_MISSING,
 * an upstream 401), or a process that had died (it wrote nothing at all). Once. */
static bool retry_cold(const struct run_ctx *rc, const struct sbx_result *res)
{
	const struct prov_outcome *o = rc->out;

	if (res->start != SBX_START_PRESTART || o->output_started || rc->retried)
		return false;
	return o->err == PROV_ERR_AUTH_MISSING || o->upstream_status == 401 ||
	       (o->err == PROV_ERR_PROVIDER_ERROR && !res->stdout_bytes);
}

static void on_result(void *ctx, const struct sbx_result *res)
{
	struct run_ctx *rc = ctx;

	conclude(rc, res);
	/* The client hears nothing of it: the cold run that follows keeps the slot. */
	if (retry_cold(rc, res)) {
		rc->retry = true;
		return;
	}
	/* The command is gone: its slot is free for the next request already. */
	prov_slot_release(rc->slot);
	rc->slot = -1;
	if (rc->sink->done) {
		rc->done_sent = true;
		rc->sink->done(rc->sink->ctx, rc->out);
	}
}

/* The variables that lead a run to the forwarder, set after "env" so that they win: the
 * namespace has no other way out anyway, and a secretless run must hold the placeholder,
 * never a key of "env". */
static int net_env(const struct prov_provider *pv, struct sbx_policy *p)
{
	int ret = 0;

	switch (pv->net.mode) {
	case PROV_NET_UPSTREAM:
		ret = sbx_policy_setenv(p, "OLP_UPSTREAM_URL", PROV_NET_URL);
		if (!ret && pv->ops->base_url_env)
			ret = sbx_policy_setenv(p, pv->ops->base_url_env, PROV_NET_URL);
		if (!ret && pv->ops->api_key_env && prov_net_secretless(&pv->net))
			ret = sbx_policy_setenv(p, pv->ops->api_key_env, NET_PLACEHOLDER_KEY);
		if (!ret)
			ret = prov_login_env(pv, p);
		break;
	case PROV_NET_CONNECT:
		if (!(ret = sbx_policy_setenv(p, "HTTPS_PROXY", PROV_NET_URL)))
			ret = sbx_policy_setenv(p, "https_proxy", PROV_NET_URL);
		break;
	default: break;
	}
	return ret;
}

static void on_start(void *ctx, enum sbx_start start)
{
	struct run_ctx *rc = ctx;

	if (rc->sink->start)
		rc->sink->start(rc->sink->ctx, start);
}

static uint64_t on_tick(void *ctx, uint64_t now_ms)
{
	struct run_ctx *rc = ctx;

	return rc->sink->tick(rc->sink->ctx, now_ms);
}

static int on_listener(void *ctx, int listen_fd, uint16_t port)
{
	struct run_ctx *rc = ctx;
	struct egr_limits lim = { .deadline_ms = rc->net.deadline_ms };
	int ret = 0;

	(void)port;
	rc->net.fwd = egr_start(listen_fd, &rc->net.route, &lim);
	if (!rc->net.fwd) {
		ret = -errno;
		log_warnx(rc->req->request_id, "provider %s: the forwarder could not start: %s",
			  rc->req->model->provider->name, strerror(errno));
	}
	net_wipe(&rc->net); /* egr_start copied what it keeps */
	return ret;
}

/* The sandbox policy every provider gets, the provider's own plan, and its "env" on top
 * (set last: it may replace what the plan set). 0, or -errno after failing out. */
static int make_plan(const struct prov_provider *pv, const struct prov_request *req,
		     struct prov_plan *plan, struct prov_outcome *out)
{
	int ret;

	plan->policy = sbx_policy_new();
	switch (pv->net.mode) {
	case PROV_NET_NONE: sbx_policy_set_net(plan->policy, SBX_NET_NONE, 0); break;
	case PROV_NET_HOST: sbx_policy_set_net(plan->policy, SBX_NET_HOST, 0); break;
	case PROV_NET_UPSTREAM:
	case PROV_NET_CONNECT:
		sbx_policy_set_net(plan->policy, SBX_NET_LOOPBACK, PROV_NET_PORT);
		break;
	}
	sbx_policy_set_timeout_ms(plan->policy, pv->timeout_ms);
	sbx_policy_set_limits(plan->policy, &pv->limits);
	ret = pv->ops->plan(pv, req, plan, out);
	for (size_t i = 0; !ret && i < pv->env_names.n; i++)
		ret = sbx_policy_setenv(plan->policy, pv->env_names.v[i], pv->env_values.v[i]);
	if (!ret)
		ret = net_env(pv, plan->policy);
	if (!ret)
		ret = prov_account_plan(pv, plan->policy);
	if (ret) {
		/* A copy: fail() formats into out->message, which must not also be its source. */
		char why[sizeof(out->message)];

		snprintf(why, sizeof(why), "%s", out->message[0] ? out->message : strerror(-ret));
		fail(out, ret == -E2BIG ? PROV_ERR_PROMPT_REFUSED : PROV_ERR_SPAWN_FAILED, "%s",
		     why);
	}
	return ret;
}

static int net_held(const struct prov_provider *pv, const struct prov_request *req,
		    struct net_run *nr, struct prov_outcome *out);

static int net_prepare(const struct prov_provider *pv, const struct prov_request *req,
		       uint64_t deadline_ms, struct net_run *nr, struct prov_outcome *out)
{
	/* Passing through (no set_headers): the CLI's own credentials go out as it sent them. */
	static const char *const drop_nothing[] = { NULL };
	const struct prov_network *n = &pv->net;
	struct buf why = BUF_INIT;

	nr->deadline_ms = deadline_ms;
	nr->route.request_id = req->request_id;
	if (n->mode == PROV_NET_CONNECT) {
		nr->route.mode = EGR_MODE_CONNECT;
		nr->route.allow_hosts = (const char *const *)n->allow_hosts.v;
		return 0;
	}
	nr->route.mode = EGR_MODE_UPSTREAM;
	nr->route.upstream = n->upstream;
	/* What the answers say of the account's subscription limits, kept for the host. */
	nr->route.on_limits = prov_limits_seen;
	nr->route.limits_ctx = (void *)pv;
	nr->route.ca_file = n->ca_file;
	nr->route.allow_paths = n->allow_paths.n ? (const char *const *)n->allow_paths.v : NULL;
	nr->route.flags = (n->any_path ? EGR_ANY_PATH : 0) | (n->check_body ? EGR_CHECK_BODY : 0);
	/* The run's own model only: a secretless run must not spend on another one. */
	strv_init(&nr->models);
	prov_net_models(pv, req->model->id, &nr->models);
	nr->route.models = nr->models.n ? (const char *const *)nr->models.v : NULL;
	nr->route.drop_headers = n->hdr_names.n ? NULL : drop_nothing;
	if (pv->login == PROV_LOGIN_HELD && net_held(pv, req, nr, out))
		return -1;
	nr->n = n->hdr_names.n;
	nr->hdrs = xcalloc(nr->n + nr->n_held + 1, sizeof(*nr->hdrs));
	nr->values = xcalloc(nr->n + nr->n_held + 1, sizeof(*nr->values));
	/* The held login's headers (net_held) after the operator's (none: settings.c). */
	for (size_t i = 0; i < nr->n_held; i++) {
		buf_init(&nr->values[nr->n + i]);
		buf_adds(&nr->values[nr->n + i], nr->held_values.v[i]);
		nr->hdrs[nr->n + i] =
			(struct egr_header){ nr->held_names.v[i], nr->values[nr->n + i].data };
	}
	held_wipe(nr);
	for (size_t i = 0; i < nr->n; i++) {
		buf_init(&nr->values[i]);
		if (prov_net_resolve(n->hdr_srcs.v[i], &nr->values[i], &why)) {
			log_warnx(
				req->request_id,
				"provider %s: network.set_headers.%s: %s; the request was not run",
				pv->name, n->hdr_names.v[i], why.data);
			fail(out, PROV_ERR_AUTH_MISSING,
			     "Provider %s: the credential the worker adds for it could not be "
			     "read; the request was not run (the worker's log says which)",
			     pv->name);
			buf_release(&why);
			net_wipe(nr);
			return -1;
		}
		nr->hdrs[i] = (struct egr_header){ n->hdr_names.v[i], nr->values[i].data };
	}
	nr->n += nr->n_held;
	nr->route.set_headers = nr->hdrs;
	nr->route.n_set_headers = nr->n;
	buf_release(&why);
	return 0;
}

/* A held login (ADR 0036): the headers the forwarder sets in place of the run's
 * placeholder, read now (and refreshed when about to expire). With no login on the host
 * the run keeps what it holds itself, as with "copy". 0, or -1 after failing out. */
static int net_held(const struct prov_provider *pv, const struct prov_request *req,
		    struct net_run *nr, struct prov_outcome *out)
{
	struct buf why = BUF_INIT;
	int ret;

	strv_init(&nr->held_names);
	strv_init(&nr->held_values);
	ret = prov_login_headers(pv, req->request_id, &nr->held_names, &nr->held_values, &why);
	if (ret && ret != -ENOENT) {
		log_warnx(req->request_id, "provider %s: held login: %s; the request was not run",
			  pv->name, why.data);
		fail(out, PROV_ERR_AUTH_MISSING,
		     "Provider %s: the login the worker holds for it could not be read or "
		     "refreshed; the request was not run (the worker's log says why)",
		     pv->name);
		held_wipe(nr);
		buf_release(&why);
		net_wipe(nr);
		return -1;
	}
	nr->n_held = nr->held_names.n;
	/* The run's own credential headers are placeholders: dropped, the real ones set. */
	if (nr->n_held)
		nr->route.drop_headers = NULL;
	buf_release(&why);
	return 0;
}

/* Forget the failed pre-started run (its forwarder, parser state and outcome) and set up
 * the same run again, cold, within what is left of the deadline (opt->deadline_ms). 0, or
 * -1 when no time is left (the failed run's outcome then stands, done still to be sent). */
static int run_again_cold(struct run_ctx *rc, struct sbx_run_options *opt)
{
	const struct prov_provider *pv = rc->req->model->provider;
	struct prov_outcome *out = rc->out;
	uint64_t now = mono_ms(), deadline_ms = opt->deadline_ms;

	log_info(rc->req->request_id,
		 "provider %s: the pre-started process failed before any output (%s, upstream "
		 "%d); running it cold",
		 pv->name, prov_error_code(out->err), out->upstream_status);
	rc->retry = false;
	rc->retried = true;
	if (now + 1000 >= deadline_ms)
		return -1;
	net_finish(pv, rc->req->request_id, &rc->net);
	pv->ops->parser_free(rc->parser.st);
	rc->parser.st = pv->ops->parser_new(pv);
	rc->concluded = false;
	rc->failure = PROV_OK;
	rc->upstream_status = 0;
	rc->failure_msg[0] = '\0';
	rc->out_bytes = 0;
	memset(out, 0, sizeof(*out));
	snprintf(out->finish_reason, sizeof(out->finish_reason), "stop");
	opt->prestart = 0; /* cold: neither take one nor start more for now */
	if ((pv->net.mode == PROV_NET_UPSTREAM || pv->net.mode == PROV_NET_CONNECT) &&
	    net_prepare(pv, rc->req, deadline_ms, &rc->net, out))
		return -1;
	return 0;
}

/* Fail closed where the sandbox cannot give the run what it needs: true after failing
 * out. */
static bool sandbox_refused(const struct prov_provider *pv, bool own_net, struct prov_outcome *out)
{
	if (sbx_global_mode() == SBX_MODE_BWRAP && !sbx_status_get()->available) {
		/* Never fall back to running unsandboxed. */
		fail(out, PROV_ERR_SANDBOX,
		     "The sandbox is not available on this host (%s); "
		     "the request was not run",
		     sbx_status_get()->message ? sbx_status_get()->message : "unknown reason");
		return true;
	}
	if (own_net && sbx_global_mode() == SBX_MODE_OFF) {
		/* With the sandbox off there is no namespace of the run's own, and its only
		 * network would be the host's. */
		fail(out, PROV_ERR_SANDBOX,
		     "Provider %s has network \"%s\", which needs the sandbox (sandbox.mode is "
		     "\"off\"); the request was not run. Set its network to \"host\" to give "
		     "it the host's network",
		     pv->name, prov_net_mode_name(pv->net.mode));
		return true;
	}
	return false;
}

/* The request as its account's variant runs it (accounts.c): model and request copied
 * with the provider replaced. NULL when the provider has no such account. */
static const struct prov_request *for_account(const struct prov_request *req,
					      struct prov_request *r, struct prov_model *m)
{
	const struct prov_provider *pv =
		prov_provider_for_account(req->model->provider, req->account);

	if (!pv)
		return NULL;
	*m = *req->model;
	m->provider = pv;
	*r = *req;
	r->model = m;
	return r;
}

void prov_run(const struct prov_request *oreq, const struct prov_sink *sink, int hangup_fd,
	      struct prov_outcome *out)
{
	struct prov_request areq;
	struct prov_model amodel;
	const struct prov_request *req = for_account(oreq, &areq, &amodel) ?: oreq;
	const struct prov_provider *pv = req->model->provider;
	struct prov_plan plan = { .argv = STRV_INIT, .stdin_data = BUF_INIT };
	struct run_ctx rc = { .sink = sink, .out = out, .req = req, .slot = -1 };
	struct sbx_run_options opt = { .hangup_fd = hangup_fd, .request_id = req->request_id };
	struct sbx_callbacks cb = { .on_stdout = on_stdout,
				    .on_result = on_result,
				    .on_listener = on_listener,
				    .on_start = on_start,
				    .on_tick = sink->tick ? on_tick : NULL,
				    .ctx = &rc };
	struct sbx_result *res = NULL;
	/* The one deadline of the run: the caller's, else the provider's timeout from now. */
	uint64_t deadline_ms = req->deadline_ms ? req->deadline_ms : mono_ms() + pv->timeout_ms;
	bool own_net = pv->net.mode == PROV_NET_UPSTREAM || pv->net.mode == PROV_NET_CONNECT;

	memset(out, 0, sizeof(*out));
	snprintf(out->finish_reason, sizeof(out->finish_reason), "stop");
	if (req == oreq && oreq->account &&
	    !prov_provider_for_account(oreq->model->provider, oreq->account)) {
		fail(out, PROV_ERR_AUTH_MISSING, "Provider %s has no account %.40s", pv->name,
		     oreq->account);
		goto out_run;
	}
	if (sandbox_refused(pv, own_net, out))
		goto out_run;
	rc.slot = prov_slot_acquire(pv);
	if (rc.slot == -EBUSY) {
		fail(out, PROV_ERR_CONCURRENCY_LIMIT,
		     "Provider %s is running its limit of %u requests; retry shortly", pv->name,
		     pv->max_concurrent);
		goto out_run;
	}
	if (rc.slot < 0 && rc.slot != PROV_SLOT_NONE)
		log_warnx(req->request_id, "provider %s: concurrency slot: %s; running uncapped",
			  pv->name, strerror(-rc.slot));
	if (make_plan(pv, req, &plan, out))
		goto out_run;
	/* net_prepare leaves it, so a cold rerun's route (run_again_cold) keeps it too. */
	rc.net.route.stop_after_tool = plan.stop_after_tool;
	if (own_net && net_prepare(pv, req, deadline_ms, &rc.net, out))
		goto out_run;
	res = xmalloc(sizeof(*res));
	rc.inner.emit = inner_emit;
	rc.inner.ctx = &rc;
	rc.parser.ops = pv->ops;
	rc.parser.st = pv->ops->parser_new(pv);
	opt.stdin_data = plan.stdin_data.data;
	opt.stdin_len = plan.stdin_data.len;
	rc.given_bytes = plan.stdin_data.len;
	for (size_t i = 1; i < plan.argv.n; i++) /* vibe takes its prompt here */
		rc.given_bytes += strlen(plan.argv.v[i]);
	opt.prestart = pv->ops->prompt_in_argv ? 0 : pv->prestart;
	opt.owner_tag = req->owner;
	opt.owner_prestart_max = req->owner_prestart_max;
	opt.deadline_ms = deadline_ms;
	sbx_run(plan.policy, (const char *const *)plan.argv.v, &opt, &cb, res);
	/* Spawn failures never reach on_result. */
	conclude(&rc, res);
	if (rc.retry && run_again_cold(&rc, &opt) == 0) {
		out->retried_cold = true; /* before on_result hands the outcome on */
		sbx_run(plan.policy, (const char *const *)plan.argv.v, &opt, &cb, res);
		conclude(&rc, res);
	}
out_run:
	net_finish(pv, req->request_id, &rc.net);
	prov_slot_release(rc.slot);
	if (!rc.done_sent && sink->done)
		sink->done(sink->ctx, out);
	if (rc.parser.st)
		pv->ops->parser_free(rc.parser.st);
	free(res);
	prov_plan_release(&plan);
}
