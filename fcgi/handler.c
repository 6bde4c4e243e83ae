/* One request, start to end: route (the table below) → owner-only check → the route's
 * handler (chat.c; health.c; usage.c) → the end of the answer → log line, audit record,
 * usage row and metrics. The I/O is io.c's, the answers' common layer respond.c's. */
#include <stdio.h>
#include <string.h>

#include "fcgi/worker.h"
#include "common/banned.h"

/* The request is over: count it. The audit failures are counted per process by auth/;
 * the pool's counter gets what this process added since it last looked. */
static void count_request(struct fcgi_req *rc, const char *route)
{
	static uint64_t audit_seen;
	uint64_t now = mono_ms(), failures = auth_audit_failures(rc->app->auth);
	uint64_t prev = __atomic_load_n(&audit_seen, __ATOMIC_RELAXED);

	metrics_request(route, rc->provider, rc->model, rc->status, (now - rc->t0) * 1000,
			rc->t_first ? (int64_t)(rc->t_first - rc->t0) * 1000 : -1);
	/* Threads race here: only the one that moves audit_seen counts the difference. */
	while (failures > prev) {
		if (__atomic_compare_exchange_n(&audit_seen, &prev, failures, false,
						__ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
			metrics_audit_failures(failures - prev);
			break;
		}
	}
}

/* ---- the request ----------------------------------------------------------------------- */

static void log_request(struct fcgi_req *rc)
{
	struct buf l = BUF_INIT;
	uint64_t ms = mono_ms() - rc->t0;
	struct audit_record ar;
	/* Refused without an identity (no key, a bad one, no such route): anyone can send
	 * these as fast as the network allows, so they are counted (metrics; a summary line
	 * in the audit log, auth/audit.c), not written a line each, but at debug level. */
	bool anon_refusal = !rc->have_id && rc->status >= 400 && rc->status < 500;

	if (anon_refusal)
		metrics_unauthenticated(rc->status);
	if (anon_refusal && !log_enabled(LOG_LVL_DEBUG))
		goto out_audit;

	buf_adds(&l, ",\"method\":");
	buf_add_json_str(&l, rc->method, strlen(rc->method));
	buf_adds(&l, ",\"path\":");
	buf_add_json_str(&l, rc->path.data, rc->path.len > 200 ? 200 : rc->path.len);
	buf_adds(&l, ",\"status\":");
	buf_add_int(&l, rc->status);
	buf_adds(&l, ",\"latency_ms\":");
	buf_add_uint(&l, ms);
	if (rc->model) {
		buf_adds(&l, ",\"model\":");
		buf_add_json_str(&l, rc->model, strlen(rc->model));
	}
	if (rc->error_code) {
		buf_adds(&l, ",\"error\":");
		buf_add_json_str(&l, rc->error_code, strlen(rc->error_code));
	}
	if (rc->have_id) {
		buf_adds(&l, ",\"key_id\":");
		buf_add_json_str(&l, rc->id.key_id, strlen(rc->id.key_id));
	}
	log_event("request", rc->rid, l.data);
	buf_release(&l);
out_audit:
	ar = (struct audit_record){
		.key_id = rc->have_id ? rc->id.key_id : NULL,
		.owner_tier = auth_tier_name(rc->have_id ? rc->id.tier : AUTH_TIER_NONE),
		.method = rc->method,
		.path = rc->path.data,
		.provider = rc->provider,
		.model = rc->model,
		.status_code = rc->status,
		.latency_ms = ms,
		.error_code = rc->error_code,
		.request_id = rc->rid,
	};
	auth_audit(rc->app->auth, &ar);
}

/* The request's row in the usage ledger, once the answer is finished (the client never
 * waits for it). What it cost and how it went: never its content. */
static void record_usage(struct fcgi_req *rc)
{
	uint64_t now = mono_ms();
	struct usage_record r = {
		.ts_ms = wall_ms() - (int64_t)(now - rc->t0),
		.key_id = rc->id.key_id,
		.provider = rc->provider,
		.model = rc->model,
		.account = rc->account,
		.status = rc->status,
		.prompt_tokens = rc->usage.prompt_tokens,
		.completion_tokens = rc->usage.completion_tokens,
		.cached_tokens = rc->usage.cached_tokens,
		.duration_ms = now - rc->t0,
		.ttfb_ms = rc->t_first ? rc->t_first - rc->t0 : 0,
		.start = rc->start,
		.hold_id = rc->claim.hold_id, /* settled: the real count replaces it */
	};

	/* A failure is counted and logged by the store (the owner's /health shows it), and
	 * counted for the pool in /metrics. */
	if (rc->app->usage && usage_record_add(rc->app->usage, &r) < 0)
		metrics_ledger_failure();
	fcgi_ledger_sync(rc->app->usage);
	fcgi_store_sync(rc->app->store);
}

/* config.json auth.owner_only_endpoints: paths ("/v1/models", "/health", …) that only
 * the owner may call. Others get 401 without a key (403 when anonymous access is on: the
 * anonymous identity is not the owner) and 403 with a non-owner key. 0 when the caller
 * may go on to the route; else the answer was sent. */
static int check_owner_only(struct fcgi_req *rc)
{
	if (!fcgi_config_owner_only(&rc->app->cfg, rc->path.data))
		return 0;
	if (fcgi_authenticate(rc, true))
		return -1;
	if (fcgi_is_owner(rc))
		return 0;
	fcgi_fail(rc, 403, "owner_only", "owner_only", "%.200s is restricted to the owner",
		  rc->path.data);
	return -1;
}

/* The routes: a new one is a row here plus its handler. RESTRICTABLE: config.json's
 * auth.owner_only_endpoints may name it (/health/live answers probes, /metrics has its
 * own token). QUIET: a 200 writes no log line (the web server's checks, often). */
static const struct fcgi_route routes[] = {
	{ "POST", "/v1/chat/completions", "chat", fcgi_handle_chat, FCGI_ROUTE_RESTRICTABLE },
	{ "POST", "/v1/responses", "responses", fcgi_handle_responses, FCGI_ROUTE_RESTRICTABLE },
	{ "POST", "/v1/messages", "messages", fcgi_handle_messages,
	  FCGI_ROUTE_RESTRICTABLE | FCGI_ROUTE_ANTHROPIC },
	{ "POST", "/v1/messages/count_tokens", "count_tokens", fcgi_handle_count_tokens,
	  FCGI_ROUTE_RESTRICTABLE | FCGI_ROUTE_ANTHROPIC },
	{ "GET", "/v1/models", "models", fcgi_handle_models, FCGI_ROUTE_RESTRICTABLE },
	{ "GET", "/health", "health", fcgi_handle_health, FCGI_ROUTE_RESTRICTABLE },
	{ "GET", "/health/live", "health_live", fcgi_handle_live, FCGI_ROUTE_QUIET },
	{ "GET", "/v1/usage", "usage", fcgi_handle_usage, FCGI_ROUTE_RESTRICTABLE },
	{ "GET", "/dashboard", "dashboard", fcgi_handle_dashboard, FCGI_ROUTE_RESTRICTABLE },
	{ "GET", "/metrics", "metrics", fcgi_handle_metrics, 0 },
};

/* No route for the request: 404, or 405 with the Allow of the path's route. */
static void handle_no_route(struct fcgi_req *rc, enum fcgi_route_result r,
			    const struct fcgi_route *row)
{
	struct fcgi_error e;

	if (r == FCGI_ROUTE_BAD_METHOD && row) {
		fcgi_error_set(&e, 405, "method_not_allowed", NULL, NULL,
			       "Method %.16s not allowed on %.200s", rc->method, rc->path.data);
		fcgi_send_error(rc, &e,
				(const struct fcgi_hdr[]){ { "Allow", row->method }, { 0 } });
	} else {
		fcgi_fail(rc, 404, "not_found", NULL, "Route %.16s %.200s not found", rc->method,
			  rc->path.data);
	}
}

void fcgi_handle(struct fcgi_app *app, struct fcgi_io *io)
{
	struct fcgi_req rc = { .app = app,
			       .io = io,
			       .path = BUF_INIT,
			       .t0 = mono_ms(),
			       .key_lease = USAGE_LEASE_INIT };
	const struct fcgi_route *row = NULL;
	const char *method = fcgi_io_param(io, "REQUEST_METHOD");
	enum fcgi_route_result r;
	unsigned flags;

	unique_hex16(rc.rid); /* the request's id, not a secret: no system call */
	fcgi_io_set_deadline(io, rc.t0 + FCGI_ANSWER_WRITE_MS);
	snprintf(rc.method_buf, sizeof(rc.method_buf), "%s", method ? method : "GET");
	rc.method = rc.method_buf;
	r = fcgi_route_match(routes, ARRAY_SIZE(routes), rc.method,
			     fcgi_io_param(io, "REQUEST_URI"), fcgi_io_param(io, "PATH_INFO"),
			     app->cfg.route_prefix, &rc.path, &row);
	/* A 404 has no row; FOUND and BAD_METHOD have one (said again below for the
	 * analyzer, which cannot know it). */
	flags = row ? row->flags : 0;
	if (flags & FCGI_ROUTE_ANTHROPIC)
		rc.api = FCGI_API_ANTHROPIC;
	if (r != FCGI_ROUTE_FOUND || !row)
		handle_no_route(&rc, r, row);
	else if (!(flags & FCGI_ROUTE_RESTRICTABLE) || !check_owner_only(&rc))
		row->handle(&rc);
	fcgi_io_finish(io);
	/* The answer is finished however it ended: the key's slot, if still held, is free. */
	fcgi_key_slot_release(&rc);
	if (io->stalled) {
		/* Whatever it was sent, the client did not take it: it was dropped. */
		log_warnx(rc.rid, "the client stopped reading; dropped after %llu ms",
			  (unsigned long long)(mono_ms() - rc.t0));
		rc.status = 499;
		rc.error_code = "CLIENT_STALLED";
	}
	if (r != FCGI_ROUTE_FOUND || !(flags & FCGI_ROUTE_QUIET) || rc.status != 200)
		log_request(&rc);
	if (rc.chat)
		record_usage(&rc);
	count_request(&rc, r == FCGI_ROUTE_FOUND && row ? row->name
			   : r == FCGI_ROUTE_NOT_FOUND	? "not_found"
							: "bad_method");
	if (rc.have_id) {
		/* After the answer: last_used_at never delays a response. */
		auth_touch(app->auth, &rc.id);
		auth_identity_release(&rc.id);
	}
	buf_release(&rc.path);
}
