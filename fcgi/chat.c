/* POST /v1/chat/completions. Its checks, in order, each failure a JSON error with its
 * status (auth.owner_only_endpoints, 401/403, came before: handler.c): auth (401) →
 * Content-Type (415) → size (413) → JSON object and its validation (400) → the model or
 * chain (404) → each hop's provider open to the key (403) → what each hop can do: tools,
 * images (400) → the key's concurrency slot (429; 503 when it cannot be checked) → its
 * quota (429; 503 when the ledger cannot write) → the runs, hop after hop while one fails
 * before any output. Nothing is sent until the answer's first byte exists, so an error
 * before any output is still a proper JSON error with the right status. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "fcgi/worker.h"
#include "common/banned.h"

/* The key's concurrency slot (check_concurrency), when held: free it. */
void fcgi_key_slot_release(struct fcgi_req *rc)
{
	usage_lease_release(rc->app->leases, &rc->key_lease);
}

/* ---- POST /v1/chat/completions ---------------------------------------------------------- */

static bool is_json_type(const char *ct)
{
	size_t n = strlen("application/json");

	if (!ct)
		return false;
	while (*ct == ' ' || *ct == '\t')
		ct++;
	return !strncasecmp(ct, "application/json", n) &&
	       (ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ' || ct[n] == '\t');
}

/* Read the body, refusing more than max bytes: from CONTENT_LENGTH before reading, and
 * while reading (a body may come without a length). 0, or -1 after answering. */
static int read_body(struct fcgi_req *rc, struct buf *body)
{
	const char *cl = fcgi_io_param(rc->io, "CONTENT_LENGTH");
	size_t max = rc->app->cfg.max_body;
	uint64_t declared = 0;

	if (cl && *cl && (parse_u64(cl, &declared) || declared > max)) {
		fcgi_fail(rc, 413, "request_too_large", NULL,
			  "Request body exceeds the limit of %zu bytes", max);
		return -1;
	}
	for (;;) {
		ssize_t n;

		buf_grow(body, 65536);
		n = fcgi_io_read(rc->io, buf_tail(body), 65536);
		if (n < 0) {
			fcgi_fail(rc, 400, "invalid_request_error", NULL,
				  "Could not read the request body");
			return -1;
		}
		if (n == 0)
			break;
		buf_commit(body, (size_t)n);
		if (body->len > max) {
			fcgi_fail(rc, 413, "request_too_large", NULL,
				  "Request body exceeds the limit of %zu bytes", max);
			return -1;
		}
	}
	return 0;
}

/* The hop's process was started (prov_sink.start): a pre-started one or not. */
static void answer_start(void *ctx, enum sbx_start start)
{
	struct fcgi_answer *a = ctx;

	a->start = start;
}

/* The stream's head (200, text/event-stream), once. */
static void stream_start(struct fcgi_answer *a)
{
	if (a->started)
		return;
	fcgi_send_head(a->rc, 200, "text/event-stream",
		       (const struct fcgi_hdr[]){ { "Cache-Control", "no-cache" },
						  { "X-Accel-Buffering", "no" },
						  { 0 } });
	a->started = true;
}

/* a->out on the stream, after the head; the time of the write is kept for heartbeats. */
static int stream_write(struct fcgi_answer *a)
{
	stream_start(a);
	a->role_sent = true;
	a->last_write = mono_ms();
	return fcgi_io_write(a->rc->io, a->out.data, a->out.len);
}

/* The run's tick (prov_sink.tick): the wire's beat when the stream was silent for hb_ms,
 * while the provider runs, while a failed hop's sandbox is torn down and as the next hop
 * starts; on the thread that writes the rest of the answer. The time it is due next, 0
 * once the answer is over (or its client gone). */
static uint64_t answer_tick(void *ctx, uint64_t now)
{
	struct fcgi_answer *a = ctx;

	if (!a->hb_ms || a->answered)
		return 0;
	if (now >= a->last_write + a->hb_ms) {
		/* Before any output this commits the answer to 200 and a stream: a later
		 * failure is told in it, and no next hop of a chain is tried
		 * (docs/openai-compat.md). A silent proxy cutting us off is worse. */
		buf_reset(&a->out);
		a->wire->beat(a, &a->out);
		stream_start(a);
		a->last_write = now;
		if (fcgi_io_write(a->rc->io, a->out.data, a->out.len)) {
			a->hb_ms = 0; /* the client is gone: the run learns it on its own */
			return 0;
		}
	}
	return a->last_write + a->hb_ms;
}

/* Answer text on its way to the client: kept (non-stream) or sent as a chunk. */
static int answer_text(struct fcgi_answer *a, const char *text, size_t len)
{
	if (!len)
		return 0;
	if (!a->req->stream) {
		if (a->text.len + len > FCGI_MAX_BUFFERED_ANSWER) {
			a->too_large = true;
			return -1;
		}
		buf_add(&a->text, text, len);
		return 0;
	}
	if (a->req->format != PROV_FORMAT_TEXT && !a->unchecked) {
		if (a->text.len + len > FCGI_MAX_BUFFERED_ANSWER)
			a->unchecked = true;
		else
			buf_add(&a->text, text, len);
	}
	buf_reset(&a->out);
	a->wire->text(a, &a->out, text, len);
	return stream_write(a);
}

static void stops_init(struct fcgi_answer *a, const json_t *stop)
{
	const json_t *s;
	size_t i;

	if (json_is_string(stop)) {
		a->stops[0] = json_string_value(stop);
		a->stop_lens[0] = json_string_length(stop);
		a->nstops = 1;
	}
	json_array_foreach(stop, i, s) {
		if (a->nstops == FCGI_MAX_STOP)
			break;
		a->stops[a->nstops] = json_string_value(s);
		a->stop_lens[a->nstops++] = json_string_length(s);
	}
	for (i = 0; i < a->nstops; i++)
		if (a->stop_lens[i] > a->stop_max)
			a->stop_max = a->stop_lens[i];
}

/* The text with stop sequences applied: everything before the first one goes out, and the
 * run is ended there (returning < 0 aborts it; answer_done knows it was on purpose). A
 * tail that may start a sequence is held back until the next delta settles it. */
static int answer_delta(struct fcgi_answer *a, const char *text, size_t len)
{
	const char *hit = NULL, *stop = NULL;
	size_t i, keep, ready;
	int ret;

	if (!a->nstops)
		return answer_text(a, text, len);
	buf_add(&a->held, text, len);
	for (i = 0; i < a->nstops; i++) {
		const char *p = memmem(a->held.data, a->held.len, a->stops[i], a->stop_lens[i]);

		if (p && (!hit || p < hit)) {
			hit = p;
			stop = a->stops[i];
		}
	}
	if (hit) {
		ret = answer_text(a, a->held.data, (size_t)(hit - a->held.data));
		buf_reset(&a->held);
		a->stopped = true;
		a->stop_hit = stop;
		return ret ?: -1;
	}
	keep = a->stop_max - 1 < a->held.len ? a->stop_max - 1 : a->held.len;
	ready = a->held.len - keep;
	/* Never cut a UTF-8 sequence: a chunk's text must be whole characters. */
	while (ready && ready < a->held.len && ((unsigned char)a->held.data[ready] & 0xc0) == 0x80)
		ready--;
	ret = answer_text(a, a->held.data, ready);
	buf_consume(&a->held, ready);
	return ret;
}

/* A piece of one of the model's function calls: kept, and streamed as a tool_calls
 * delta. */
static int answer_tool(struct fcgi_answer *a, const struct prov_event *ev)
{
	struct fcgi_call *c;
	int ret;

	/* Text held back for a stop sequence comes before the call. */
	if (a->held.len) {
		ret = answer_text(a, a->held.data, a->held.len);
		buf_reset(&a->held);
		if (ret)
			return ret;
	}
	if (ev->tool_name) {
		if (ev->tool_index != a->ncalls || a->ncalls == FCGI_MAX_CALLS) {
			log_warnx(a->rc->rid, "tool call %u left out (out of order or too many)",
				  ev->tool_index);
			return 0;
		}
		c = &a->calls[a->ncalls++];
		snprintf(c->id, sizeof(c->id), "%s", ev->tool_id ? ev->tool_id : "");
		snprintf(c->name, sizeof(c->name), "%s", ev->tool_name);
		buf_init(&c->args);
	} else if (ev->tool_index >= a->ncalls) {
		return 0;
	}
	c = &a->calls[ev->tool_index];
	if (c->args.len + ev->len > FCGI_MAX_BUFFERED_ANSWER) {
		a->too_large = true;
		return -1;
	}
	buf_add(&c->args, ev->text, ev->len);
	if (!a->req->stream)
		return 0;
	buf_reset(&a->out);
	a->wire->tool(a, &a->out, ev->tool_index, ev->tool_name != NULL, ev->text, ev->len);
	return stream_write(a);
}

static void calls_reset(struct fcgi_answer *a)
{
	for (size_t i = 0; i < a->ncalls; i++)
		buf_release(&a->calls[i].args);
	a->ncalls = 0;
}

static int answer_emit(void *ctx, const struct prov_event *ev)
{
	struct fcgi_answer *a = ctx;

	if (a->stopped)
		return 0;
	if (ev->kind == PROV_EV_TOOL_CALL)
		return answer_tool(a, ev);
	if (ev->kind != PROV_EV_DELTA)
		return 0;
	return answer_delta(a, ev->text, ev->len);
}

/* The end of a stream (no beat after it: answer_tick sees a->answered). */
static void finish_stream(struct fcgi_answer *a, const struct prov_outcome *o)
{
	buf_reset(&a->out);
	a->wire->end(a, &a->out, o);
	(void)stream_write(a);
}

/* ---- the OpenAI chat completions wire ---------------------------------------------------- */

static void chat_text(struct fcgi_answer *a, struct buf *out, const char *text, size_t len)
{
	fcgi_sse_chunk(out, &a->meta, a->role_sent ? NULL : "assistant", text, len, NULL);
}

static void chat_tool(struct fcgi_answer *a, struct buf *out, size_t i, bool first,
		      const char *args, size_t len)
{
	const struct fcgi_call *c = &a->calls[i];

	fcgi_sse_tool_call(out, &a->meta, !a->role_sent, (unsigned)i, first ? c->id : NULL,
			   first ? c->name : NULL, args, len);
}

static void chat_beat(struct fcgi_answer *a, struct buf *out)
{
	(void)a;
	buf_adds(out, ": keep-alive\n\n");
}

static void chat_end(struct fcgi_answer *a, struct buf *out, const struct prov_outcome *o)
{
	if (!a->role_sent)
		fcgi_sse_chunk(out, &a->meta, "assistant", "", 0, NULL);
	/* A call without arguments still has a JSON object of them, as OpenAI sends it. */
	for (size_t i = 0; !o->err && i < a->ncalls; i++)
		if (!a->calls[i].args.len)
			fcgi_sse_tool_call(out, &a->meta, false, (unsigned)i, NULL, NULL, "{}", 2);
	/* An error after output cannot change the status any more: the stream ends with a
	 * final chunk saying so, and [DONE]. */
	fcgi_sse_chunk(out, &a->meta, NULL, NULL, 0, o->err ? "error" : o->finish_reason);
	if (a->req->include_usage)
		fcgi_sse_usage(out, &a->meta, &o->usage);
	fcgi_sse_done(out);
}

static void chat_whole(struct fcgi_answer *a, struct buf *out, const struct prov_outcome *o)
{
	struct fcgi_tool_call calls[FCGI_MAX_CALLS];

	for (size_t i = 0; i < a->ncalls; i++)
		calls[i] = (struct fcgi_tool_call){
			.id = a->calls[i].id,
			.name = a->calls[i].name,
			.args = a->calls[i].args.len ? a->calls[i].args.data : "{}",
			.args_len = a->calls[i].args.len ? a->calls[i].args.len : 2,
		};
	fcgi_completion_json_calls(out, &a->meta, a->text.data, a->text.len, calls, a->ncalls,
				   o->finish_reason, &o->usage);
}

const struct fcgi_wire fcgi_wire_chat = { .text = chat_text,
					  .tool = chat_tool,
					  .beat = chat_beat,
					  .end = chat_end,
					  .whole = chat_whole };

static const char *provider_error_type(enum prov_error e);

void fcgi_chat_headers(const struct fcgi_answer *a, int status, struct buf *h)
{
	const struct prov_model *m = a->cur < a->nhops ? a->hops[a->cur].m : NULL;

	char num[24];

	if (m) {
		fcgi_add_header(a->rc, h, "X-OLP-Provider-Used", prov_provider_name(m->provider));
		fcgi_add_header(a->rc, h, "X-OLP-Model-Used", m->id);
		/* Whether a pre-started process answered (ADR 0022), where there could be one. */
		if (prov_provider_prestart(m->provider))
			fcgi_add_header(a->rc, h, "X-OLP-Prestart",
					a->start == SBX_START_PRESTART ? "hit" : "miss");
	}
	snprintf(num, sizeof(num), "%zu", a->failed);
	fcgi_add_header(a->rc, h, "X-OLP-Fallback-Hops", num);
	snprintf(num, sizeof(num), "%llu", (unsigned long long)(mono_ms() - a->rc->t0));
	fcgi_add_header(a->rc, h, "X-OLP-Latency-Ms", num);
	if (a->exhausted)
		fcgi_add_header(a->rc, h, "X-OLP-Fallback-Exhausted", "true");
	if (status == 429)
		fcgi_add_header(a->rc, h, "Retry-After", "2");
	/* Which providers failed and why is infrastructure detail: the owner's only. */
	if (a->detail.len && fcgi_is_owner(a->rc))
		fcgi_add_header(a->rc, h, "X-OLP-Fallback-Detail", a->detail.data);
}

/* response_format asked for JSON: say so when the answer is not (it still goes out as
 * it is, with its own finish_reason: the model's words are the client's to judge). */
static void check_format(struct fcgi_answer *a, const struct prov_outcome *o)
{
	const char *what =
		a->req->format == PROV_FORMAT_JSON_OBJECT ? "a JSON object" : "valid JSON";

	if (o->err || a->req->format == PROV_FORMAT_TEXT || a->too_large || a->ncalls)
		return;
	if (a->unchecked)
		snprintf(a->warning, sizeof(a->warning),
			 "response_format: the answer is too large to be checked to be %s", what);
	else if (!fcgi_format_satisfied(a->req->format, a->text.data, a->text.len))
		snprintf(a->warning, sizeof(a->warning), "response_format: the answer is not %s",
			 what);
	else
		return;
	a->meta.warning = a->warning;
	log_warnx(a->rc->rid, "%s", a->warning);
}

/* Failures before any output that another provider may not have: worth the next hop. */
static bool worth_next_hop(enum prov_error e)
{
	return e == PROV_ERR_AUTH_MISSING || e == PROV_ERR_SPAWN_FAILED ||
	       e == PROV_ERR_CONCURRENCY_LIMIT || e == PROV_ERR_PROVIDER_ERROR ||
	       e == PROV_ERR_PROMPT_REFUSED;
}

/* A provider that reports no usage (a local command) used no upstream tokens: say 0
 * rather than null, which SDKs reading usage.total_tokens do not expect. A run ended at a
 * stop sequence ended well, whatever its process said. The outcome to answer with:
 * reported, or *fixed. */
static const struct prov_outcome *outcome_fix(const struct fcgi_answer *a,
					      const struct prov_outcome *reported,
					      struct prov_outcome *fixed)
{
	if (reported->usage.present && !a->stopped)
		return reported;
	*fixed = *reported;
	if (!fixed->usage.present)
		fixed->usage = (struct prov_usage){ .present = true };
	if (a->stopped) {
		fixed->err = PROV_OK;
		fixed->status = 0;
		snprintf(fixed->finish_reason, sizeof(fixed->finish_reason), "stop");
	}
	return fixed;
}

/* The chain's next step, decided here only (the run loop follows a->next_hop): when this
 * hop failed before any output — and no heartbeat started the stream — and another is
 * left, note why, move to it and return true. */
static bool answer_next_hop(struct fcgi_answer *a, const struct prov_outcome *o)
{
	const struct prov_model *m = a->hops[a->cur].m;

	if (!o->err || !worth_next_hop(o->err) || o->output_started || a->started)
		return false;
	/* Provider and model names are checked at registry load; codes are ours. */
	buf_addf(&a->detail, "%s%s/%s: %s", a->detail.len ? "; " : "",
		 prov_provider_name(m->provider), m->id, prov_error_code(o->err));
	if (a->cur + 1 >= a->nhops) {
		if (a->nhops > 1)
			a->exhausted = true;
		return false;
	}
	if (o->usage.present) {
		a->passed.prompt_tokens += o->usage.prompt_tokens;
		a->passed.completion_tokens += o->usage.completion_tokens;
		a->passed.cached_tokens += o->usage.cached_tokens;
	}
	a->failed++;
	a->cur++; /* the next hop, whose headers a heartbeat would send */
	buf_reset(&a->text);
	buf_reset(&a->held);
	calls_reset(a);
	return true;
}

/* The request's ledger row: the last hop's tokens plus those of the hops that failed
 * before it, and how its process came to be. */
static void answer_usage(struct fcgi_answer *a, const struct prov_outcome *o)
{
	struct fcgi_req *rc = a->rc;

	rc->usage = o->usage;
	rc->usage.prompt_tokens += a->passed.prompt_tokens;
	rc->usage.completion_tokens += a->passed.completion_tokens;
	rc->usage.cached_tokens += a->passed.cached_tokens;
	rc->start = !o->ran			     ? USAGE_START_NONE
		    : o->start == SBX_START_WARM     ? USAGE_START_WARM
		    : o->start == SBX_START_PRESTART ? USAGE_START_PRESTART
						     : USAGE_START_COLD;
}

/* A non-streamed answer that went well: the API's answer object, whole. */
static void send_whole(struct fcgi_answer *a, const struct prov_outcome *o)
{
	buf_reset(&a->out);
	a->wire->whole(a, &a->out, o);
	fcgi_send_json(
		a->rc, 200, &a->out,
		(const struct fcgi_hdr[]){
			{ a->meta.warning ? "X-OLP-Warning" : NULL, a->meta.warning }, { 0 } });
}

/* The rest of the answer, by how the run ended. */
static void answer_send(struct fcgi_answer *a, const struct prov_outcome *o)
{
	struct fcgi_req *rc = a->rc;

	if (o->err == PROV_ERR_CLIENT_GONE && !a->too_large) {
		rc->status = 499;
		rc->error_code = prov_error_code(o->err);
	} else if (a->req->stream && a->started) {
		finish_stream(a, o);
		if (o->err)
			rc->error_code = prov_error_code(o->err);
	} else if (a->too_large) {
		fcgi_fail(rc, 502, "provider_error", "PROVIDER_ERROR",
			  "The provider's answer exceeds %u bytes; use \"stream\": true",
			  FCGI_MAX_BUFFERED_ANSWER);
	} else if (o->err) {
		fcgi_fail(rc, o->status, provider_error_type(o->err), prov_error_code(o->err), "%s",
			  o->message);
	} else if (a->req->stream) {
		finish_stream(a, o);
	} else {
		send_whole(a, o);
	}
}

/* The outcome is known: finish the answer (the provider's sandbox may still be being torn
 * down; that is not the client's wait) — or, when this hop failed before any output and
 * another is left, note why and let the next one answer. */
static void answer_done(void *ctx, const struct prov_outcome *reported)
{
	struct fcgi_answer *a = ctx;
	struct fcgi_req *rc = a->rc;
	struct prov_outcome fixed;
	const struct prov_outcome *o = outcome_fix(a, reported, &fixed);

	a->next_hop = answer_next_hop(a, o);
	if (a->next_hop)
		return;
	answer_usage(a, o);
	/* The run is over (its slot is free): the rest of the answer has a deadline of its
	 * own. */
	fcgi_io_set_deadline(rc->io, mono_ms() + FCGI_ANSWER_WRITE_MS);
	/* The text held back for a stop sequence that never came is the answer's end. */
	if (a->held.len && o->err != PROV_ERR_CLIENT_GONE)
		(void)answer_text(a, a->held.data, a->held.len);
	buf_reset(&a->held);
	check_format(a, o);
	a->answered = true;
	/* Before the answer's last bytes: a client that asks again as soon as it has them
	 * must find the key's slot free. */
	fcgi_key_slot_release(rc);
	answer_send(a, o);
	/* The answer is complete: the client need not wait for the sandbox's teardown,
	 * which starts once the web server has taken the end (linger): on a busy host
	 * it would take the CPU the web server needs to pass the answer on. */
	rc->io->linger = true;
	fcgi_io_finish(rc->io);
}

static const char *provider_error_type(enum prov_error e)
{
	switch (e) {
	case PROV_ERR_SPAWN_TIMEOUT: return "timeout_error";
	case PROV_ERR_SANDBOX: return "sandbox_unavailable";
	case PROV_ERR_CONCURRENCY_LIMIT: return "rate_limit_error";
	case PROV_ERR_AUTH_MISSING: return "provider_auth_missing";
	case PROV_ERR_PROMPT_REFUSED: return "invalid_request_error";
	default: return "provider_error";
	}
}

/* The hops for the requested model: its routing chain (checked against the registry at
 * start), else the registry model itself. 0, or -1 after answering 404. */
static int plan_hops(struct fcgi_req *rc, const struct fcgi_chat_request *req,
		     struct fcgi_answer *a)
{
	const struct fcgi_chain *chain = fcgi_config_chain(&rc->app->cfg, req->model);
	const struct prov_model *m;
	struct fcgi_error e;

	if (chain) {
		for (a->nhops = 0; a->nhops < chain->nhops; a->nhops++)
			a->hops[a->nhops].m = chain->hops[a->nhops];
		return 0;
	}
	m = prov_registry_find(rc->app->reg, req->model);
	if (m) {
		a->hops[a->nhops++].m = m;
		return 0;
	}
	fcgi_error_set(&e, 404, "model_not_found", "model_not_found", "model",
		       "The model '%.200s' does not exist", req->model);
	fcgi_send_error(rc, &e, NULL);
	return -1;
}

/* Keep the hops this key may use. 0, or -1 after answering 403 when none is left. */
static int check_hop_access(struct fcgi_req *rc, const struct fcgi_chat_request *req,
			    struct fcgi_answer *a)
{
	struct buf wanted = BUF_INIT, mine = BUF_INIT;
	const char *login = NULL;
	size_t i, n = 0;

	for (i = 0; i < a->nhops; i++) {
		const char *p = prov_provider_name(a->hops[i].m->provider);
		enum fcgi_access acc = fcgi_access_check(&rc->id, a->hops[i].m->provider);

		if (acc == FCGI_ACCESS_OK)
			a->hops[n++] = a->hops[i];
		else if (acc == FCGI_ACCESS_LOGIN && !login)
			login = p;
		else if (acc == FCGI_ACCESS_PROVIDER && !strstr(wanted.data, p))
			buf_addf(&wanted, "%s%s", wanted.len ? ", " : "", p);
	}
	if (n || login) {
		a->nhops = n;
		buf_release(&wanted);
	}
	if (n)
		return 0;
	if (login && rc->id.tier == AUTH_TIER_ANONYMOUS) {
		fcgi_fail(rc, 403, "permission_error", "login_owner_only",
			  "Provider '%s' runs commands with its login in the run, so its login is "
			  "owner-only: anonymous callers may not use model '%.200s'",
			  login, req->model);
		return -1;
	}
	if (login) {
		fcgi_fail(
			rc, 403, "permission_error", "login_owner_only",
			"Provider '%s' runs commands with its login in the run, so its login is "
			"owner-only: this key may not use model '%.200s' (the owner can allow it: "
			"olp-keys set-login --id=%s --allow=%s)",
			login, req->model, rc->id.key_id, login);
		return -1;
	}
	for (i = 0; i < rc->id.n_providers; i++)
		buf_addf(&mine, "%s%s", i ? ", " : "", rc->id.providers[i]);
	fcgi_fail(rc, 403, "key_no_provider_access", "key_no_provider_access",
		  "This OLP API key may use providers [%s]; model '%.200s' is served by [%s]",
		  mine.data, req->model, wanted.data);
	buf_release(&wanted);
	buf_release(&mine);
	return -1;
}

/* Keep the hops whose provider can take what the request holds (images, tools). 0, or -1 after
 * answering 400 naming the field when none can. */
static int check_hop_caps(struct fcgi_req *rc, const struct fcgi_chat_request *req,
			  struct fcgi_answer *a)
{
	unsigned need = (req->nimages ? PROV_CAP_IMAGES : 0) | (req->tools ? PROV_CAP_TOOLS : 0);
	const struct prov_provider *pv;
	const char *param;
	struct buf why = BUF_INIT;
	struct fcgi_error e;
	size_t i, n = 0;
	unsigned cap;

	if (!need)
		return 0;
	for (i = 0; i < a->nhops; i++)
		if ((prov_provider_caps(a->hops[i].m->provider) & need) == need)
			a->hops[n++] = a->hops[i];
	if (n) {
		a->nhops = n;
		return 0;
	}
	/* What the type cannot, in its own words (providers/: no type is named here). */
	pv = a->hops[0].m->provider;
	cap = req->tools && !(prov_provider_caps(pv) & PROV_CAP_TOOLS) ? PROV_CAP_TOOLS
								       : PROV_CAP_IMAGES;
	param = cap == PROV_CAP_TOOLS ? "tools" : req->image_param;
	prov_cap_refusal(pv, cap, req->model, &why);
	fcgi_error_set(&e, 400, "invalid_request_error", NULL, param, "%s: %s", param, why.data);
	buf_release(&why);
	fcgi_send_error(rc, &e, NULL);
	return -1;
}

/* The key's quota (ADR 0020), once the request is known to be valid and servable and
 * before any provider starts: a malformed request costs the key nothing. Shared by the
 * workers of the host through the usage store. The request reserves what it may spend of
 * tokens_per_day until its row settles it (record_usage), or until its hops' timeouts
 * have passed when its worker dies. A store that cannot write refuses (503: fcgi/quota.c).
 * 0 to go on, or -1 after answering 429 or 503. */
static int check_quota(struct fcgi_req *rc, size_t body_len, const struct fcgi_chat_request *req,
		       const struct fcgi_answer *a)
{
	struct fcgi_quota_hdr hdr;
	struct fcgi_error e;
	uint64_t ttl = FCGI_ANSWER_WRITE_MS;

	for (size_t i = 0; i < a->nhops; i++)
		ttl += prov_provider_timeout_ms(a->hops[i].m->provider) + FCGI_ANSWER_WRITE_MS;
	rc->claim = (struct usage_claim){ .tokens = fcgi_quota_estimate(body_len, req->max_tokens),
					  .ttl_ms = ttl };
	if (!fcgi_quota_check(rc->app->usage, rc->app->store != NULL, &rc->id, &rc->claim, &e,
			      &hdr))
		return 0;
	fcgi_send_error(rc, &e,
			(const struct fcgi_hdr[]){ { "Retry-After", hdr.retry_after }, { 0 } });
	return -1;
}

/* The key's own cap on chat completions at once (quota max_concurrent), host-wide. The
 * quotas above limit how often runs start; this stops one key from holding every
 * provider slot of the host (each for up to its timeout) while others get 429. Checked
 * just before them: check_quota counts a request it lets through, and a request this
 * refuses (a client retrying each second, as Retry-After says) must not use up the key's
 * requests per minute and day. One of N
 * slots (usage_lease_take: a slot file of the host, whose lock the kernel frees when a
 * worker dies, or a lease of the shared store, which lapses when its host dies), held
 * until the answer's end
 * (answer_done; fcgi_handle for any other way out), across chain hops and fallback. A
 * key without the limit opens nothing. A slot that cannot be taken for any other reason
 * refuses the request: a cap that fails open is no cap. 0 to go on, or -1 after
 * answering. */
static int check_concurrency(struct fcgi_req *rc)
{
	int64_t n = rc->id.quota.max_concurrent;
	struct fcgi_error e;
	int ret;

	if (n <= 0)
		return 0;
	ret = rc->app->leases ? usage_lease_take(rc->app->leases, rc->id.key_id, n, &rc->key_lease)
			      : -ENOENT;
	if (!ret)
		return 0;
	if (ret != -EBUSY && rc->app->store) {
		/* A lease of the shared store (ADR 0034): the database is away. */
		fcgi_error_set(&e, 503, "store_unavailable", "store_unavailable", NULL,
			       "This key's concurrency limit cannot be checked: the shared store "
			       "is unavailable; the request was not run. Try again in %s s",
			       STORE_RETRY_AFTER);
		fcgi_send_error(
			rc, &e,
			(const struct fcgi_hdr[]){ { "Retry-After", STORE_RETRY_AFTER }, { 0 } });
		return -1;
	}
	if (ret != -EBUSY) {
		log_warnx(rc->rid, "key concurrency slot: %s; refused", strerror(-ret));
		fcgi_fail(rc, 503, "server_error", "concurrency_unavailable",
			  "This key's concurrency limit cannot be checked; try again later");
		return -1;
	}
	metrics_quota_rejected("max_concurrent");
	fcgi_error_set(&e, 429, "rate_limit_error", "concurrency_limit_exceeded", NULL,
		       "This key is running its limit of %lld requests at once; retry when one "
		       "finishes",
		       (long long)n);
	fcgi_send_error(rc, &e, (const struct fcgi_hdr[]){ { "Retry-After", "1" }, { 0 } });
	return -1;
}

/* The key's share of pre-started processes (sandbox/pool.c): no more than its runs at once
 * (max_concurrent), so that the one started after each run counts against that; 0 = the
 * host's sandbox.prestart_per_key. */
static unsigned key_prestart_max(const struct fcgi_req *rc)
{
	int64_t n = rc->id.quota.max_concurrent; /* 1..1024 when set (auth/) */

	return n > 0 ? (unsigned)n : 0;
}

/* A provider run's outcome: how its sandbox started, or why it could not. */
static void count_run_outcome(const char *provider, const char *account,
			      const struct prov_outcome *o)
{
	if (o->ran)
		metrics_run_started(provider, sbx_start_name(o->start));
	if (o->ran && account)
		metrics_account_run(provider, account);
	if (o->err == PROV_ERR_SANDBOX)
		metrics_sandbox_failure(provider, "sandbox");
	else if (o->err == PROV_ERR_SPAWN_FAILED)
		metrics_sandbox_failure(provider, "spawn_failed");
}

/* One hop's run: its provider with the request, until its outcome is known (answer_done)
 * and its sandbox is gone. The hop's deadline is computed here, once, and carried down:
 * the run ends there, and a write that waits for the client gives up then (prov_sink). */
static void chat_run_hop(struct fcgi_req *rc, struct fcgi_answer *a, json_t *messages,
			 struct prov_outcome *o)
{
	const struct fcgi_chat_request *req = a->req;
	const struct prov_model *m = a->hops[a->cur].m;
	struct prov_sink sink = { .emit = answer_emit,
				  .done = answer_done,
				  .start = answer_start,
				  .tick = a->hb_ms ? answer_tick : NULL,
				  .ctx = a };
	struct prov_request preq = { .model = m,
				     .model_name = req->model,
				     .messages = messages,
				     .max_tokens = req->max_tokens,
				     .request_id = rc->rid,
				     .account = a->hops[a->cur].account,
				     .tools = req->tools,
				     .tool_choice = req->tool_choice,
				     .tool_name = req->tool_name,
				     .owner = rc->id.key_id,
				     .owner_prestart_max = key_prestart_max(rc),
				     .login_owner = rc->id.tier == AUTH_TIER_OWNER,
				     .deadline_ms =
					     mono_ms() + prov_provider_timeout_ms(m->provider) };

	rc->model = m->id;
	rc->provider = prov_provider_name(m->provider);
	/* prov_run runs a NULL account as the provider's default: the ledger says which. */
	rc->account = preq.account ? preq.account : prov_provider_default_account(m->provider);
	fcgi_io_set_deadline(rc->io, preq.deadline_ms);
	a->next_hop = false;
	/* answer_done sends the end of the answer as soon as the outcome is known; the
	 * sandbox's teardown happens after that, off the client's critical path. */
	metrics_run_begin(rc->provider);
	prov_run(&preq, &sink, rc->io->hangup_fd, o);
	metrics_run_end(rc->provider);
	count_run_outcome(rc->provider, preq.account, o);
}

/* The runs: the chain's hops in turn, for as long as answer_done says the next one is to
 * answer (it decides, from each hop's outcome: answer_next_hop). */
static void chat_run_hops(struct fcgi_req *rc, struct fcgi_answer *a, json_t *messages)
{
	struct prov_outcome o = { 0 };
	bool ran = false;

	a->cur = 0;
	do {
		chat_run_hop(rc, a, messages, &o);
		ran |= o.ran;
	} while (a->next_hop);
	/* Every provider it could go to was at its own max_concurrent: nothing ran, so the
	 * request does not use up one of the key's (ADR 0026). */
	if (!ran && o.err == PROV_ERR_CONCURRENCY_LIMIT)
		fcgi_quota_refund(rc->app->usage, rc->id.key_id, &rc->claim, rc->rid);
}

int fcgi_read_json_body(struct fcgi_req *rc, struct buf *body)
{
	if (!is_json_type(fcgi_io_param(rc->io, "CONTENT_TYPE"))) {
		fcgi_fail(rc, 415, "unsupported_media_type", NULL,
			  "Content-Type must be application/json");
		return -1;
	}
	return read_body(rc, body);
}

void fcgi_chat_serve(struct fcgi_req *rc, const struct fcgi_chat_request *req, size_t body_len,
		     const struct fcgi_wire *wire, void *wire_ctx)
{
	struct fcgi_answer a = { .rc = rc,
				 .req = req,
				 .wire = wire,
				 .wire_ctx = wire_ctx,
				 .text = BUF_INIT,
				 .out = BUF_INIT,
				 .detail = BUF_INIT,
				 .held = BUF_INIT };
	json_t *messages = NULL;

	rc->chat = true;
	if (plan_hops(rc, req, &a) || check_hop_access(rc, req, &a) ||
	    check_hop_caps(rc, req, &a) || fcgi_limits_check(rc, &a) || check_concurrency(rc) ||
	    check_quota(rc, body_len, req, &a))
		goto out;
	fcgi_completion_init(&a.meta, req->model);
	stops_init(&a, req->stop);
	if (req->stream)
		a.hb_ms = rc->app->cfg.heartbeat_ms;
	a.last_write = mono_ms();
	messages = prov_format_messages(req->messages, req->format, req->json_schema);
	rc->answer = &a;
	chat_run_hops(rc, &a, messages);
out:
	json_decref(messages);
	rc->answer = NULL;
	buf_release(&a.text);
	buf_release(&a.out);
	buf_release(&a.detail);
	buf_release(&a.held);
	calls_reset(&a);
}

void fcgi_handle_chat(struct fcgi_req *rc)
{
	struct buf body = BUF_INIT;
	struct fcgi_chat_request req;
	struct fcgi_error err;

	memset(&req, 0, sizeof(req));
	if (fcgi_authenticate(rc, true))
		goto out;
	rc->chat = true;
	if (fcgi_read_json_body(rc, &body))
		goto out;
	if (fcgi_chat_parse(body.data, body.len, &req, &err)) {
		fcgi_send_error(rc, &err, NULL);
		goto out;
	}
	fcgi_chat_serve(rc, &req, body.len, &fcgi_wire_chat, NULL);
out:
	fcgi_chat_release(&req);
	buf_release(&body);
}
