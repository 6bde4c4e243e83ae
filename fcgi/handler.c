/* One request, start to end: route → auth → checks → provider run → answer → log line.
 *
 * Order of checks for a chat completion (each failure is a JSON error with its status):
 * auth (401) → Content-Type (415) → size (413) → JSON object (400) → validation (400) →
 * model (404). Nothing is sent until the answer's first byte exists, so an error before
 * any output is still a proper JSON error with the right status. */
#include <errno.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "fcgi/worker.h"
#include "common/banned.h"

/* A non-streamed answer is held in memory until the provider is done; past this size the
 * request fails rather than exhausting the worker. */
#define MAX_BUFFERED_ANSWER (64u << 20)
/* How long a client has to take an answer that is not a provider run's output (an error,
 * /health, /v1/models) or the end of one once the run is over; a run's output has the
 * run's own deadline (handle_chat). A client still not reading then is dropped. */
#define ANSWER_WRITE_MS 30000
/* The model's function calls kept for one answer; more are dropped with a warning in the
 * log (no model makes that many in one turn). */
#define MAX_CALLS 32

struct fcgi_req {
	struct fcgi_app *app;
	struct fcgi_io *io;
	char rid[17];
	const char *method; /* points into method_buf: the params die with fcgi_io_finish */
	char method_buf[16];
	struct buf path;
	uint64_t t0;
	uint64_t t_first; /* mono_ms() of the answer's first byte (its head), 0 before */
	int status;
	const char *error_code;
	const char *model;
	const char *provider;
	struct auth_identity id;
	bool have_id;
	const struct answer *answer; /* a chat answer under way: adds the X-OLP-* headers */
	/* The usage ledger (issue 14): a chat completion that passed auth gets one row, with
	 * the tokens and start of the run that answered (answer_done). */
	bool chat;
	struct prov_usage usage;
	enum usage_start start;
	int key_slot;		  /* the key's concurrency slot (check_concurrency), or -1 */
	struct usage_claim claim; /* the request's count and token reservation (check_quota) */
};

/* The key's concurrency slot (check_concurrency), when held: free it. */
static void key_slot_release(struct fcgi_req *rc)
{
	slot_release(rc->key_slot);
	rc->key_slot = -1;
}

/* ---- I/O ------------------------------------------------------------------------------- */

const char *fcgi_io_param(struct fcgi_io *io, const char *name)
{
	if (io->finished)
		return NULL;
	if (io->fcgx)
		return FCGX_GetParam(name, io->envp);
	/* Plain CGI: the request is the environment. getenv on a serving thread is safe
	 * because nothing changes the environment once the worker serves (fcgi/main.c). */
	return getenv(name);
}

ssize_t fcgi_io_read(struct fcgi_io *io, char *dst, size_t n)
{
	if (n > (1 << 20))
		n = 1 << 20;
	if (io->fcgx) {
		int got = FCGX_GetStr(dst, (int)n, io->fcgx->in);

		return got < 0 ? -1 : got;
	}
	for (;;) {
		ssize_t got = read(STDIN_FILENO, dst, n);

		if (got < 0 && errno == EINTR)
			continue;
		return got;
	}
}

void fcgi_io_set_deadline(struct fcgi_io *io, uint64_t deadline_ms)
{
	io->deadline = deadline_ms;
}

/* The FastCGI record (the FastCGI 1.0 specification, 3.3) that carries the answer. */
#define FCGI_VERSION_1 1
#define FCGI_STDOUT 6
#define FCGI_MAX_CONTENT 0xffff

/* The answer as FCGI_STDOUT records, written here rather than with FCGX_PutStr: libfcgi
 * writes with a blocking write(2) that waits for the web server to read, past any
 * deadline. Its own stdout stream stays empty, so that FCGX_Finish_r still writes the end
 * of the stream and of the request after ours. 0 or -errno (-ETIMEDOUT: the deadline). */
static int fcgx_write(struct fcgi_io *io, const char *data, size_t len)
{
	struct buf rec = BUF_INIT;
	int id = io->fcgx->requestId, ret = 0;

	while (len && !ret) {
		size_t n = len > FCGI_MAX_CONTENT ? FCGI_MAX_CONTENT : len;
		/* Version, type, request id and content length (big-endian), no padding. */
		unsigned char head[8] = { FCGI_VERSION_1, FCGI_STDOUT, id >> 8, id, n >> 8, n };

		buf_reset(&rec);
		buf_add(&rec, head, sizeof(head));
		buf_add(&rec, data, n);
		ret = write_all_until(io->fcgx->ipcFd, rec.data, rec.len, io->deadline);
		data += n;
		len -= n;
	}
	buf_release(&rec);
	return ret;
}

int fcgi_io_write(struct fcgi_io *io, const char *data, size_t len)
{
	int ret;

	if (io->failed || io->finished)
		return -1;
	/* Pushed to the web server now: SSE must not wait in a buffer. */
	if (io->fcgx)
		ret = fcgx_write(io, data, len);
	else
		ret = write_all_until(STDOUT_FILENO, data, len, io->deadline);
	if (ret) {
		io->failed = true;
		io->stalled = ret == -ETIMEDOUT;
		return -1;
	}
	return 0;
}

void fcgi_io_finish(struct fcgi_io *io)
{
	if (io->finished)
		return;
	io->finished = true;
	io->hangup_fd = -1;
	if (!io->fcgx) {
		close(STDOUT_FILENO); /* CGI: end of the response for the web server */
		return;
	}
	/* FCGX_Finish_r ends the request with a blocking write(2) of 24 bytes (two
	 * records): call it only once the socket has room for them, by the deadline
	 * (POLLOUT: at most a quarter of a unix socket's send buffer in use, or TCP's
	 * minimum write space free). */
	if (!io->failed && wait_writable(io->fcgx->ipcFd, io->deadline) == -ETIMEDOUT)
		io->failed = io->stalled = true;
	/* Drop the client: the web server sees our connection end before the end of the
	 * request (maybe in the middle of a record), and aborts the response instead of
	 * completing it. libfcgi's writes then fail at once. */
	if (io->failed)
		shutdown(io->fcgx->ipcFd, SHUT_RDWR);
	FCGX_Finish_r(io->fcgx); /* END_REQUEST; frees the params and closes the link */
}

/* ---- responses ------------------------------------------------------------------------- */

struct answer;
static void chat_headers(const struct answer *a, int status, struct buf *h);

/* One response header; a list of them ends with a NULL name. */
struct hdr {
	const char *name;
	const char *value;
};

/* Append one header through fcgi_header_add; one it refuses (a control character in a
 * value: header injection) is left out and logged, and the answer goes on without it. */
static void add_header(struct fcgi_req *rc, struct buf *h, const char *name, const char *value)
{
	if (fcgi_header_add(h, name, value))
		log_warnx(rc->rid,
			  "response header %.64s left out: its value holds a control "
			  "character",
			  name);
}

static void send_head(struct fcgi_req *rc, int status, const char *ctype, const struct hdr *extra)
{
	struct buf h = BUF_INIT;

	rc->status = status;
	if (!rc->t_first)
		rc->t_first = mono_ms();
	add_header(rc, &h, "Status", fcgi_status_text(status));
	add_header(rc, &h, "Content-Type", ctype);
	add_header(rc, &h, "X-Request-Id", rc->rid);
	if (rc->answer)
		chat_headers(rc->answer, status, &h);
	for (; extra && extra->name; extra++)
		add_header(rc, &h, extra->name, extra->value);
	buf_adds(&h, "\r\n");
	fcgi_io_write(rc->io, h.data, h.len);
	buf_release(&h);
}

static void send_json(struct fcgi_req *rc, int status, const struct buf *body,
		      const struct hdr *extra)
{
	send_head(rc, status, "application/json", extra);
	fcgi_io_write(rc->io, body->data, body->len);
}

static void send_error(struct fcgi_req *rc, const struct fcgi_error *e, const struct hdr *extra)
{
	struct buf b = BUF_INIT;

	fcgi_error_json(e, &b);
	rc->error_code = e->code ? e->code : e->type;
	send_json(rc, e->status, &b, extra);
	buf_release(&b);
}

static void fail(struct fcgi_req *rc, int status, const char *type, const char *code,
		 const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void fail(struct fcgi_req *rc, int status, const char *type, const char *code,
		 const char *fmt, ...)
{
	struct fcgi_error e = { .status = status, .type = type, .code = code };
	va_list ap;

	va_start(ap, fmt);
	(void)vsnprintf(e.message, sizeof(e.message), fmt, ap);
	va_end(ap);
	send_error(rc, &e, NULL);
}

/* ---- auth ------------------------------------------------------------------------------ */

/* Identify the caller. required: a missing token is an error (else it yields no
 * identity, as /health allows). Returns 0 to go on. */
static int authenticate(struct fcgi_req *rc, bool required)
{
	const char *authz = fcgi_io_param(rc->io, "HTTP_AUTHORIZATION");
	const char *xkey = fcgi_io_param(rc->io, "HTTP_X_API_KEY");
	enum auth_result r;

	if (rc->have_id)
		return 0;
	if (!required && !authz && !xkey)
		return 0;
	r = auth_check(rc->app->auth, authz, xkey, &rc->id);
	if (r == AUTH_OK) {
		rc->have_id = true;
		return 0;
	}
	fail(rc, 401, auth_error_type(r), auth_error_type(r), "%s", auth_strerror(r));
	return -1;
}

static bool is_owner(const struct fcgi_req *rc)
{
	return rc->have_id && rc->id.tier == AUTH_TIER_OWNER;
}

/* ---- GET /health and GET /v1/models ----------------------------------------------------- */

static void add_sandbox_block(struct buf *b)
{
	const struct sbx_status *st = sbx_status_get();

	buf_addf(b,
		 "{\"available\":%s,\"active\":%s,\"mode\":\"%s\",\"platform\":\"linux\","
		 "\"missing\":[%s],\"seccomp\":%s,\"cgroup\":\"%s\"",
		 st->available ? "true" : "false", st->active ? "true" : "false", st->mode,
		 st->bwrap_version ? "" : "\"bubblewrap\"", st->seccomp ? "true" : "false",
		 st->cgroup);
	buf_adds(b, ",\"cgroup_detail\":");
	buf_add_json_str(b, st->cgroup_detail, strlen(st->cgroup_detail));
	/* Whose host uid a run is: "per_run", or loudly "shared" / "unavailable". */
	buf_addf(b, ",\"identity\":\"%s\",\"identity_detail\":", st->identity);
	buf_add_json_str(b, st->identity_detail, strlen(st->identity_detail));
	buf_adds(b, ",\"bwrap_version\":");
	if (st->bwrap_version)
		buf_add_json_str(b, st->bwrap_version, strlen(st->bwrap_version));
	else
		buf_adds(b, "null");
	if (st->message) {
		buf_adds(b, ",\"message\":");
		buf_add_json_str(b, st->message, strlen(st->message));
	}
	buf_addch(b, '}');
}

/* How the provider's runs reach the network: "host" is the one to notice. */
static void add_network(struct buf *b, const struct prov_provider *pv)
{
	struct prov_net_info ni;

	prov_provider_net_info(pv, &ni);
	buf_addf(b, ",\"network\":\"%s\"", ni.mode);
	if (ni.upstream_host) {
		buf_adds(b, ",\"upstream_host\":");
		buf_add_json_str(b, ni.upstream_host, strlen(ni.upstream_host));
	}
	buf_addf(b, ",\"secretless\":%s", ni.secretless ? "true" : "false");
}

/* Whether the provider's client and its credentials are on this host (the dashboard). */
static void add_cli_state(struct buf *b, const struct prov_provider *pv)
{
	struct prov_cli_state cs;

	prov_provider_cli_state(pv, &cs);
	buf_addf(b, ",\"cli_found\":%s,\"credentials\":\"%s\"", cs.cli_found ? "true" : "false",
		 cs.credentials);
}

/* Pre-started provider processes (ADR 0022): the host's counts from the pool's shared
 * metrics; only when those cannot be had, this worker process's own. */
static void add_prestart_block(struct buf *b)
{
	static const char *const events[] = { "hit", "miss", "expired", "died" };
	struct sbx_prestart_stats st;
	int64_t v;

	if (metrics_is_open()) {
		buf_adds(b, ",\"prestart\":{\"scope\":\"host\"");
		for (size_t i = 0; i < ARRAY_SIZE(events); i++) {
			(void)metrics_value("olp_prestart_events_total",
					    (const char *const[]){ "event", events[i], NULL }, &v);
			buf_addf(b, ",\"%s\":%lld", events[i], (long long)v);
		}
		(void)metrics_value("olp_prestart_idle", NULL, &v);
		buf_addf(b, ",\"idle\":%lld}", (long long)v);
		return;
	}
	sbx_prestart_stats(&st);
	buf_addf(b,
		 ",\"prestart\":{\"scope\":\"process\",\"hit\":%llu,\"miss\":%llu,"
		 "\"expired\":%llu,\"died\":%llu,\"idle\":%zu}",
		 (unsigned long long)st.hit, (unsigned long long)st.miss,
		 (unsigned long long)st.expired, (unsigned long long)st.died, st.idle);
}

static void handle_health(struct fcgi_req *rc)
{
	struct auth_login_grant *grants = NULL;
	struct buf b = BUF_INIT;
	size_t i, j, ngrants = 0;

	if (authenticate(rc, false))
		return;
	buf_adds(&b, "{\"ok\":true,\"version\":\"" OLP_VERSION "\"");
	/* Infrastructure details are for the owner only: the Node OLP's ADR 0014 §3.3 (in
	 * seed/ beside DESIGN.md), not this tree's docs/adr/0014, which is the per-run uid. */
	if (is_owner(rc)) {
		const struct prov_registry *reg = rc->app->reg;

		(void)auth_login_grants(rc->app->auth, &grants, &ngrants);
		buf_adds(&b, ",\"providers\":{");
		for (i = 0; i < prov_registry_provider_count(reg); i++) {
			const struct prov_provider *pv = prov_registry_provider_at(reg, i);
			bool first = true;

			if (i)
				buf_addch(&b, ',');
			buf_add_json_str(&b, prov_provider_name(pv),
					 strlen(prov_provider_name(pv)));
			buf_adds(&b, ":{\"type\":");
			buf_add_json_str(&b, prov_provider_type(pv),
					 strlen(prov_provider_type(pv)));
			buf_adds(&b, ",\"displayName\":");
			buf_add_json_str(&b, prov_provider_display_name(pv),
					 strlen(prov_provider_display_name(pv)));
			add_network(&b, pv);
			add_cli_state(&b, pv);
			fcgi_access_health(&b, pv, grants, ngrants);
			buf_adds(&b, ",\"models\":[");
			for (j = 0; j < prov_registry_model_count(reg); j++) {
				const struct prov_model *m = prov_registry_model_at(reg, j);

				if (m->provider != pv)
					continue;
				if (!first)
					buf_addch(&b, ',');
				buf_add_json_str(&b, m->id, strlen(m->id));
				first = false;
			}
			buf_adds(&b, "]}");
		}
		buf_adds(&b, "},\"sandbox\":");
		add_sandbox_block(&b);
		buf_addf(&b, ",\"audit_failures\":%llu",
			 (unsigned long long)auth_audit_failures(rc->app->auth));
		/* The ledger and quotas: off, or whether its database works right now. */
		buf_adds(&b, ",\"usage\":");
		fcgi_usage_health_json(&b, rc->app->usage);
		add_prestart_block(&b);
	}
	buf_addch(&b, '}');
	send_json(rc, 200, &b, (const struct hdr[]){ { "Cache-Control", "no-store" }, { 0 } });
	buf_release(&b);
	free(grants);
}

/* GET /health/live: the worker is up and takes requests. For web-server and load-balancer
 * checks, polled every few seconds: no credential looked at, no key store, registry or
 * sandbox touched, and (fcgi_handle) no audit record or log line for a 200, so a monitor
 * fills neither the audit log nor the journal. The web server's access log still has
 * every check. */
static void handle_live(struct fcgi_req *rc)
{
	struct buf b = BUF_INIT;

	buf_adds(&b, "{\"ok\":true}");
	send_json(rc, 200, &b, (const struct hdr[]){ { "Cache-Control", "no-store" }, { 0 } });
	buf_release(&b);
}

static void handle_models(struct fcgi_req *rc)
{
	const struct prov_registry *reg = rc->app->reg;
	struct buf b = BUF_INIT;
	size_t i, n = 0;

	if (authenticate(rc, true))
		return;
	buf_adds(&b, "{\"object\":\"list\",\"data\":[");
	for (i = 0; i < prov_registry_model_count(reg); i++) {
		const struct prov_model *m = prov_registry_model_at(reg, i);
		const char *owner = prov_provider_name(m->provider);

		/* Only what this caller may use (issue 22): no model it would be refused. */
		if (fcgi_access_check(&rc->id, m->provider))
			continue;
		if (n++)
			buf_addch(&b, ',');
		buf_adds(&b, "{\"id\":");
		buf_add_json_str(&b, m->id, strlen(m->id));
		buf_addf(&b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":",
			 (long long)m->created);
		buf_add_json_str(&b, owner, strlen(owner));
		buf_addch(&b, '}');
	}
	buf_adds(&b, "]}");
	send_json(rc, 200, &b, NULL);
	buf_release(&b);
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
		fail(rc, 413, "request_too_large", NULL,
		     "Request body exceeds the limit of %zu bytes", max);
		return -1;
	}
	for (;;) {
		ssize_t n;

		buf_grow(body, 65536);
		n = fcgi_io_read(rc->io, buf_tail(body), 65536);
		if (n < 0) {
			fail(rc, 400, "invalid_request_error", NULL,
			     "Could not read the request body");
			return -1;
		}
		if (n == 0)
			break;
		buf_commit(body, (size_t)n);
		if (body->len > max) {
			fail(rc, 413, "request_too_large", NULL,
			     "Request body exceeds the limit of %zu bytes", max);
			return -1;
		}
	}
	return 0;
}

/* One step of a routing chain: a registry model (and so its provider). */
struct hop {
	const struct prov_model *m;
};

struct answer {
	struct fcgi_req *rc;
	const struct fcgi_chat_request *req;
	struct fcgi_completion meta;
	bool started;	 /* stream: head and first chunk sent */
	bool too_large;	 /* non-stream: answer over MAX_BUFFERED_ANSWER */
	bool answered;	 /* the end of the answer (or its error) was sent */
	struct buf text; /* non-stream: the whole answer */
	struct buf out;	 /* encoding scratch */
	struct hop hops[FCGI_MAX_HOPS];
	size_t nhops;
	size_t cur;	/* the hop running now */
	size_t failed;	/* hops that failed before output and were passed over */
	bool exhausted; /* every hop failed */
	/* What the hops passed over had spent (a prompt read before the failure): the
	 * ledger's and the quota's, not the answer's, whose usage is the answering hop's. */
	struct prov_usage passed;
	struct buf detail; /* "provider/model: CODE; …" of the failed hops (owner only) */
	/* "stop": the sequences, and the text held back because it may be the start of one
	 * (at most the longest sequence less one byte). */
	const char *stops[FCGI_MAX_STOP];
	size_t stop_lens[FCGI_MAX_STOP];
	size_t nstops, stop_max;
	struct buf held;
	bool stopped; /* a stop sequence was seen: the run was ended on purpose */
	/* response_format: a stream's text is kept too (in text), to be checked at the end;
	 * past MAX_BUFFERED_ANSWER it is not kept and the answer counts as unchecked. */
	bool unchecked;
	char warning[128]; /* meta.warning points here when set */
	/* The model's function calls, in the order they started. */
	struct call {
		char id[128];
		char name[72];
		struct buf args;
	} calls[MAX_CALLS];
	size_t ncalls;
	bool role_sent;	      /* stream: the first chunk (with the role) is out */
	enum sbx_start start; /* how the running hop's process came to be (X-OLP-Prestart) */
	/* Heartbeats (streaming.heartbeat_interval_ms): a thread of the request's own writes
	 * ": keep-alive" when nothing was written for hb_ms. lock orders its writes with the
	 * run's (answer_text, answer_tool); answer_done stops it before the end. */
	pthread_mutex_t lock;
	pthread_cond_t cv;
	pthread_t hb;
	bool hb_on, hb_stop;
	uint64_t hb_ms, last_write;
};

/* The hop's process was started (prov_sink.start): a pre-started one or not. */
static void answer_start(void *ctx, enum sbx_start start)
{
	struct answer *a = ctx;

	pthread_mutex_lock(&a->lock);
	a->start = start;
	pthread_mutex_unlock(&a->lock);
}

/* The stream's head (200, text/event-stream), once. */
static void stream_start(struct answer *a)
{
	if (a->started)
		return;
	send_head(a->rc, 200, "text/event-stream",
		  (const struct hdr[]){
			  { "Cache-Control", "no-cache" }, { "X-Accel-Buffering", "no" }, { 0 } });
	a->started = true;
}

/* a->out on the stream, after the head; the time of the write is kept for heartbeats. */
static int stream_write(struct answer *a)
{
	stream_start(a);
	a->role_sent = true;
	a->last_write = mono_ms();
	return fcgi_io_write(a->rc->io, a->out.data, a->out.len);
}

static void *heartbeat_main(void *arg)
{
	static const char beat[] = ": keep-alive\n\n";
	struct answer *a = arg;

	pthread_mutex_lock(&a->lock);
	while (!a->hb_stop) {
		uint64_t now = mono_ms(), due = a->last_write + a->hb_ms;
		struct timespec ts;

		if (now >= due) {
			/* Before any output this commits the answer to 200 and a stream: a
			 * later failure is told in it, and no next hop of a chain is tried
			 * (docs/openai-compat.md). A silent proxy cutting us off is worse. */
			stream_start(a);
			a->last_write = now;
			if (fcgi_io_write(a->rc->io, beat, sizeof(beat) - 1))
				break; /* the client is gone: the run learns it on its own */
			continue;
		}
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += (time_t)((due - now) / 1000);
		ts.tv_nsec += (long)((due - now) % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&a->cv, &a->lock, &ts);
	}
	pthread_mutex_unlock(&a->lock);
	return NULL;
}

static void heartbeat_start(struct answer *a, uint64_t ms)
{
	pthread_condattr_t ca;

	a->hb_ms = ms;
	a->last_write = mono_ms();
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&a->cv, &ca);
	pthread_condattr_destroy(&ca);
	/* No heartbeat thread (out of threads): the answer goes on without heartbeats. */
	a->hb_on = !pthread_create(&a->hb, NULL, heartbeat_main, a);
	if (!a->hb_on) {
		log_warnx(a->rc->rid, "no heartbeat thread; streaming without heartbeats");
		pthread_cond_destroy(&a->cv);
	}
}

static void heartbeat_stop(struct answer *a)
{
	if (!a->hb_on)
		return;
	pthread_mutex_lock(&a->lock);
	a->hb_stop = true;
	pthread_cond_signal(&a->cv);
	pthread_mutex_unlock(&a->lock);
	pthread_join(a->hb, NULL);
	pthread_cond_destroy(&a->cv);
	a->hb_on = false;
}

/* Answer text on its way to the client: kept (non-stream) or sent as a chunk. */
static int answer_text(struct answer *a, const char *text, size_t len)
{
	int ret;

	if (!len)
		return 0;
	if (!a->req->stream) {
		if (a->text.len + len > MAX_BUFFERED_ANSWER) {
			a->too_large = true;
			return -1;
		}
		buf_add(&a->text, text, len);
		return 0;
	}
	if (a->req->format != PROV_FORMAT_TEXT && !a->unchecked) {
		if (a->text.len + len > MAX_BUFFERED_ANSWER)
			a->unchecked = true;
		else
			buf_add(&a->text, text, len);
	}
	pthread_mutex_lock(&a->lock);
	buf_reset(&a->out);
	fcgi_sse_chunk(&a->out, &a->meta, a->role_sent ? NULL : "assistant", text, len, NULL);
	ret = stream_write(a);
	pthread_mutex_unlock(&a->lock);
	return ret;
}

static void stops_init(struct answer *a, const json_t *stop)
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
static int answer_delta(struct answer *a, const char *text, size_t len)
{
	const char *hit = NULL;
	size_t i, keep, ready;
	int ret;

	if (!a->nstops)
		return answer_text(a, text, len);
	buf_add(&a->held, text, len);
	for (i = 0; i < a->nstops; i++) {
		const char *p = memmem(a->held.data, a->held.len, a->stops[i], a->stop_lens[i]);

		if (p && (!hit || p < hit))
			hit = p;
	}
	if (hit) {
		ret = answer_text(a, a->held.data, (size_t)(hit - a->held.data));
		buf_reset(&a->held);
		a->stopped = true;
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
static int answer_tool(struct answer *a, const struct prov_event *ev)
{
	struct call *c;
	int ret;

	/* Text held back for a stop sequence comes before the call. */
	if (a->held.len) {
		ret = answer_text(a, a->held.data, a->held.len);
		buf_reset(&a->held);
		if (ret)
			return ret;
	}
	if (ev->tool_name) {
		if (ev->tool_index != a->ncalls || a->ncalls == MAX_CALLS) {
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
	if (c->args.len + ev->len > MAX_BUFFERED_ANSWER) {
		a->too_large = true;
		return -1;
	}
	buf_add(&c->args, ev->text, ev->len);
	if (!a->req->stream)
		return 0;
	pthread_mutex_lock(&a->lock);
	buf_reset(&a->out);
	fcgi_sse_tool_call(&a->out, &a->meta, !a->role_sent, ev->tool_index,
			   ev->tool_name ? c->id : NULL, ev->tool_name ? c->name : NULL, ev->text,
			   ev->len);
	ret = stream_write(a);
	pthread_mutex_unlock(&a->lock);
	return ret;
}

static void calls_reset(struct answer *a)
{
	for (size_t i = 0; i < a->ncalls; i++)
		buf_release(&a->calls[i].args);
	a->ncalls = 0;
}

static int answer_emit(void *ctx, const struct prov_event *ev)
{
	struct answer *a = ctx;

	if (a->stopped)
		return 0;
	if (ev->kind == PROV_EV_TOOL_CALL)
		return answer_tool(a, ev);
	if (ev->kind != PROV_EV_DELTA)
		return 0;
	return answer_delta(a, ev->text, ev->len);
}

/* The end of a stream; the heartbeat thread is stopped already. */
static void finish_stream(struct answer *a, const struct prov_outcome *o)
{
	buf_reset(&a->out);
	if (!a->role_sent)
		fcgi_sse_chunk(&a->out, &a->meta, "assistant", "", 0, NULL);
	/* A call without arguments still has a JSON object of them, as OpenAI sends it. */
	for (size_t i = 0; !o->err && i < a->ncalls; i++)
		if (!a->calls[i].args.len)
			fcgi_sse_tool_call(&a->out, &a->meta, false, (unsigned)i, NULL, NULL, "{}",
					   2);
	/* An error after output cannot change the status any more: the stream ends with a
	 * final chunk saying so, and [DONE]. */
	fcgi_sse_chunk(&a->out, &a->meta, NULL, NULL, 0, o->err ? "error" : o->finish_reason);
	if (a->req->include_usage)
		fcgi_sse_usage(&a->out, &a->meta, &o->usage);
	fcgi_sse_done(&a->out);
	(void)stream_write(a);
}

static const char *provider_error_type(enum prov_error e);

static void chat_headers(const struct answer *a, int status, struct buf *h)
{
	const struct prov_model *m = a->cur < a->nhops ? a->hops[a->cur].m : NULL;

	char num[24];

	if (m) {
		add_header(a->rc, h, "X-OLP-Provider-Used", prov_provider_name(m->provider));
		add_header(a->rc, h, "X-OLP-Model-Used", m->id);
		/* Whether a pre-started process answered (ADR 0022), where there could be one. */
		if (prov_provider_prestart(m->provider))
			add_header(a->rc, h, "X-OLP-Prestart",
				   a->start == SBX_START_PRESTART ? "hit" : "miss");
	}
	snprintf(num, sizeof(num), "%zu", a->failed);
	add_header(a->rc, h, "X-OLP-Fallback-Hops", num);
	snprintf(num, sizeof(num), "%llu", (unsigned long long)(mono_ms() - a->rc->t0));
	add_header(a->rc, h, "X-OLP-Latency-Ms", num);
	if (a->exhausted)
		add_header(a->rc, h, "X-OLP-Fallback-Exhausted", "true");
	if (status == 429)
		add_header(a->rc, h, "Retry-After", "2");
	/* Which providers failed and why is infrastructure detail: the owner's only. */
	if (a->detail.len && is_owner(a->rc))
		add_header(a->rc, h, "X-OLP-Fallback-Detail", a->detail.data);
}

/* response_format asked for JSON: say so when the answer is not (it still goes out as
 * it is, with its own finish_reason: the model's words are the client's to judge). */
static void check_format(struct answer *a, const struct prov_outcome *o)
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

/* The outcome is known: finish the answer (the provider's sandbox may still be being torn
 * down; that is not the client's wait) — or, when this hop failed before any output and
 * another is left, note why and let the next one answer. */
static void answer_done(void *ctx, const struct prov_outcome *reported)
{
	struct answer *a = ctx;
	struct fcgi_req *rc = a->rc;
	const struct prov_model *m = a->hops[a->cur].m;
	struct prov_outcome zeroed;
	const struct prov_outcome *o = reported;
	bool started;

	/* A provider that reports no usage (a local command) used no upstream tokens: say
	 * 0 rather than null, which SDKs reading usage.total_tokens do not expect. A run
	 * ended at a stop sequence ended well, whatever its process said. */
	if (!reported->usage.present || a->stopped) {
		zeroed = *reported;
		if (!zeroed.usage.present)
			zeroed.usage = (struct prov_usage){ .present = true };
		if (a->stopped) {
			zeroed.err = PROV_OK;
			zeroed.status = 0;
			snprintf(zeroed.finish_reason, sizeof(zeroed.finish_reason), "stop");
		}
		o = &zeroed;
	}

	/* Locked: a heartbeat may start the stream, whose head reads the hop fields. */
	pthread_mutex_lock(&a->lock);
	started = a->started;
	if (o->err && worth_next_hop(o->err) && !o->output_started && !started) {
		/* Provider and model names are checked at registry load; codes are ours. */
		buf_addf(&a->detail, "%s%s/%s: %s", a->detail.len ? "; " : "",
			 prov_provider_name(m->provider), m->id, prov_error_code(o->err));
		if (a->cur + 1 < a->nhops) {
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
			pthread_mutex_unlock(&a->lock);
			return;
		}
		if (a->nhops > 1)
			a->exhausted = true;
	}
	pthread_mutex_unlock(&a->lock);
	/* The last hop: from here on one thread writes the answer. */
	heartbeat_stop(a);
	rc->usage = o->usage;
	rc->usage.prompt_tokens += a->passed.prompt_tokens;
	rc->usage.completion_tokens += a->passed.completion_tokens;
	rc->usage.cached_tokens += a->passed.cached_tokens;
	rc->start = !o->ran			     ? USAGE_START_NONE
		    : o->start == SBX_START_WARM     ? USAGE_START_WARM
		    : o->start == SBX_START_PRESTART ? USAGE_START_PRESTART
						     : USAGE_START_COLD;
	/* The run is over (its slot is free): the rest of the answer has a deadline of its
	 * own. */
	fcgi_io_set_deadline(rc->io, mono_ms() + ANSWER_WRITE_MS);
	/* The text held back for a stop sequence that never came is the answer's end. */
	if (a->held.len && o->err != PROV_ERR_CLIENT_GONE)
		(void)answer_text(a, a->held.data, a->held.len);
	buf_reset(&a->held);
	check_format(a, o);
	a->answered = true;
	/* Before the answer's last bytes: a client that asks again as soon as it has them
	 * must find the key's slot free. */
	key_slot_release(rc);
	if (o->err == PROV_ERR_CLIENT_GONE && !a->too_large) {
		rc->status = 499;
		rc->error_code = prov_error_code(o->err);
	} else if (a->req->stream && a->started) {
		finish_stream(a, o);
		if (o->err)
			rc->error_code = prov_error_code(o->err);
	} else if (a->too_large) {
		fail(rc, 502, "provider_error", "PROVIDER_ERROR",
		     "The provider's answer exceeds %u bytes; use \"stream\": true",
		     MAX_BUFFERED_ANSWER);
	} else if (o->err) {
		fail(rc, o->status, provider_error_type(o->err), prov_error_code(o->err), "%s",
		     o->message);
	} else if (a->req->stream) {
		finish_stream(a, o);
	} else {
		struct fcgi_tool_call calls[MAX_CALLS];

		for (size_t i = 0; i < a->ncalls; i++)
			calls[i] = (struct fcgi_tool_call){
				.id = a->calls[i].id,
				.name = a->calls[i].name,
				.args = a->calls[i].args.len ? a->calls[i].args.data : "{}",
				.args_len = a->calls[i].args.len ? a->calls[i].args.len : 2,
			};
		buf_reset(&a->out);
		fcgi_completion_json_calls(&a->out, &a->meta, a->text.data, a->text.len, calls,
					   a->ncalls, o->finish_reason, &o->usage);
		send_json(rc, 200, &a->out,
			  (const struct hdr[]){
				  { a->meta.warning ? "X-OLP-Warning" : NULL, a->meta.warning },
				  { 0 } });
	}
	/* The answer is complete: the client need not wait for the sandbox's teardown. */
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
static int plan_hops(struct fcgi_req *rc, const struct fcgi_chat_request *req, struct answer *a)
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
	send_error(rc, &e, NULL);
	return -1;
}

/* Keep the hops this key may use. 0, or -1 after answering 403 when none is left. */
static int check_hop_access(struct fcgi_req *rc, const struct fcgi_chat_request *req,
			    struct answer *a)
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
		fail(rc, 403, "permission_error", "login_owner_only",
		     "Provider '%s' runs commands with its login in the run, so its login is "
		     "owner-only: anonymous callers may not use model '%.200s'",
		     login, req->model);
		return -1;
	}
	if (login) {
		fail(rc, 403, "permission_error", "login_owner_only",
		     "Provider '%s' runs commands with its login in the run, so its login is "
		     "owner-only: this key may not use model '%.200s' (the owner can allow it: "
		     "olp-keys set-login --id=%s --allow=%s)",
		     login, req->model, rc->id.key_id, login);
		return -1;
	}
	for (i = 0; i < rc->id.n_providers; i++)
		buf_addf(&mine, "%s%s", i ? ", " : "", rc->id.providers[i]);
	fail(rc, 403, "key_no_provider_access", "key_no_provider_access",
	     "This OLP API key may use providers [%s]; model '%.200s' is served by [%s]", mine.data,
	     req->model, wanted.data);
	buf_release(&wanted);
	buf_release(&mine);
	return -1;
}

/* Keep the hops whose provider can take what the request holds (images, tools). 0, or -1 after
 * answering 400 naming the field when none can. */
static int check_hop_caps(struct fcgi_req *rc, const struct fcgi_chat_request *req,
			  struct answer *a)
{
	unsigned need = (req->nimages ? PROV_CAP_IMAGES : 0) | (req->tools ? PROV_CAP_TOOLS : 0);
	struct fcgi_error e;
	size_t i, n = 0;

	if (!need)
		return 0;
	for (i = 0; i < a->nhops; i++)
		if ((prov_provider_caps(a->hops[i].m->provider) & need) == need)
			a->hops[n++] = a->hops[i];
	if (n) {
		a->nhops = n;
		return 0;
	}
	if (req->tools && !(prov_provider_caps(a->hops[0].m->provider) & PROV_CAP_TOOLS)) {
		const char *type = prov_provider_type(a->hops[0].m->provider);

		fcgi_error_set(&e, 400, "invalid_request_error", NULL, "tools",
			       "tools: model '%.200s' (provider type %s) cannot take tools; only "
			       "claude models can%s",
			       req->model, type,
			       strcmp(type, "codex")
				       ? ""
				       : " (codex exec runs every MCP tool it is given itself and "
					 "cannot hand a call back to the client)");
		send_error(rc, &e, NULL);
		return -1;
	}
	fcgi_error_set(&e, 400, "invalid_request_error", NULL, req->image_param,
		       "%s: model '%.200s' (provider type %s) takes no images; only claude "
		       "models do",
		       req->image_param, req->model, prov_provider_type(a->hops[0].m->provider));
	send_error(rc, &e, NULL);
	return -1;
}

/* The key's quota (issue 14), once the request is known to be valid and servable and
 * before any provider starts: a malformed request costs the key nothing. Shared by the
 * workers of the host through the usage store. The request reserves what it may spend of
 * tokens_per_day until its row settles it (record_usage), or until its hops' timeouts
 * have passed when its worker dies. A store that cannot write refuses (503: fcgi/quota.c).
 * 0 to go on, or -1 after answering 429 or 503. */
static int check_quota(struct fcgi_req *rc, size_t body_len, const struct fcgi_chat_request *req,
		       const struct answer *a)
{
	struct fcgi_quota_hdr hdr;
	struct fcgi_error e;
	uint64_t ttl = ANSWER_WRITE_MS;

	for (size_t i = 0; i < a->nhops; i++)
		ttl += prov_provider_timeout_ms(a->hops[i].m->provider) + ANSWER_WRITE_MS;
	rc->claim = (struct usage_claim){ .tokens = fcgi_quota_estimate(body_len, req->max_tokens),
					  .ttl_ms = ttl };
	if (!fcgi_quota_check(rc->app->usage, &rc->id, &rc->claim, &e, &hdr))
		return 0;
	send_error(rc, &e, (const struct hdr[]){ { "Retry-After", hdr.retry_after }, { 0 } });
	return -1;
}

/* The key's own cap on chat completions at once (quota max_concurrent), host-wide. The
 * quotas above limit how often runs start; this stops one key from holding every
 * provider slot of the host (each for up to its timeout) while others get 429. Checked
 * just before them: check_quota counts a request it lets through, and a request this
 * refuses (a client retrying each second, as Retry-After says) must not use up the key's
 * requests per minute and day. One of N
 * slot files <keyslot_dir>/<hex of the key id>.<i>.slot (common.h slot_take: the kernel
 * frees it when a worker dies, so a crash never leaks one), held until the answer's end
 * (answer_done; fcgi_handle for any other way out), across chain hops and fallback. A
 * key without the limit opens nothing. A slot that cannot be taken for any other reason
 * refuses the request: a cap that fails open is no cap. 0 to go on, or -1 after
 * answering. */
static int check_concurrency(struct fcgi_req *rc)
{
	int64_t n = rc->id.quota.max_concurrent;
	char prefix[2 * AUTH_ID_MAX + 1];
	struct fcgi_error e;
	size_t i, len;
	int ret;

	if (n <= 0)
		return 0;
	/* Hex: a file name part for any id ("__env_owner__" too), never a path. */
	len = strnlen(rc->id.key_id, sizeof(rc->id.key_id));
	for (i = 0; i < len; i++)
		snprintf(prefix + 2 * i, 3, "%02x", (unsigned char)rc->id.key_id[i]);
	prefix[2 * len] = '\0';
	ret = rc->app->keyslot_dir ? slot_take(rc->app->keyslot_dir, prefix, (unsigned)n) : -ENOENT;
	if (ret >= 0) {
		rc->key_slot = ret;
		return 0;
	}
	if (ret != -EBUSY) {
		log_warnx(rc->rid, "key concurrency slot: %s; refused", strerror(-ret));
		fail(rc, 503, "server_error", "concurrency_unavailable",
		     "This key's concurrency limit cannot be checked; try again later");
		return -1;
	}
	metrics_quota_rejected("max_concurrent");
	fcgi_error_set(&e, 429, "rate_limit_error", "concurrency_limit_exceeded", NULL,
		       "This key is running its limit of %lld requests at once; retry when one "
		       "finishes",
		       (long long)n);
	send_error(rc, &e, (const struct hdr[]){ { "Retry-After", "1" }, { 0 } });
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
static void count_run_outcome(const char *provider, const struct prov_outcome *o)
{
	if (o->ran)
		metrics_run_started(provider, sbx_start_name(o->start));
	if (o->err == PROV_ERR_SANDBOX)
		metrics_sandbox_failure(provider, "sandbox");
	else if (o->err == PROV_ERR_SPAWN_FAILED)
		metrics_sandbox_failure(provider, "spawn_failed");
}

static void handle_chat(struct fcgi_req *rc)
{
	struct buf body = BUF_INIT;
	struct fcgi_chat_request req;
	struct fcgi_error err;
	struct answer a = { .rc = rc,
			    .req = &req,
			    .text = BUF_INIT,
			    .out = BUF_INIT,
			    .detail = BUF_INIT,
			    .held = BUF_INIT,
			    .lock = PTHREAD_MUTEX_INITIALIZER };
	struct prov_sink sink = {
		.emit = answer_emit, .done = answer_done, .start = answer_start, .ctx = &a
	};
	struct prov_request preq;
	struct prov_outcome o = { 0 };
	json_t *messages = NULL;
	bool ran = false;

	memset(&req, 0, sizeof(req));
	if (authenticate(rc, true))
		goto out_answer;
	rc->chat = true;
	if (!is_json_type(fcgi_io_param(rc->io, "CONTENT_TYPE"))) {
		fail(rc, 415, "unsupported_media_type", NULL,
		     "Content-Type must be application/json");
		goto out_answer;
	}
	if (read_body(rc, &body))
		goto out_answer;
	if (fcgi_chat_parse(body.data, body.len, &req, &err)) {
		send_error(rc, &err, NULL);
		goto out_answer;
	}
	if (plan_hops(rc, &req, &a) || check_hop_access(rc, &req, &a) ||
	    check_hop_caps(rc, &req, &a) || check_concurrency(rc) ||
	    check_quota(rc, body.len, &req, &a))
		goto out_answer;
	fcgi_completion_init(&a.meta, req.model);
	stops_init(&a, req.stop);
	if (req.stream && rc->app->cfg.heartbeat_ms)
		heartbeat_start(&a, rc->app->cfg.heartbeat_ms);
	messages = prov_format_messages(req.messages, req.format, req.json_schema);
	rc->answer = &a;
	/* answer_done moves a.cur to the next hop when this one failed before any output. */
	for (a.cur = 0; a.cur < a.nhops && !a.answered;) {
		const struct prov_model *m = a.hops[a.cur].m;
		size_t hop = a.cur;

		rc->model = m->id;
		rc->provider = prov_provider_name(m->provider);
		preq = (struct prov_request){ .model = m,
					      .model_name = req.model,
					      .messages = messages,
					      .max_tokens = req.max_tokens,
					      .request_id = rc->rid,
					      .tools = req.tools,
					      .tool_choice = req.tool_choice,
					      .tool_name = req.tool_name,
					      .owner = rc->id.key_id,
					      .owner_prestart_max = key_prestart_max(rc),
					      .login_owner = rc->id.tier == AUTH_TIER_OWNER };
		/* The run's output must be taken by the end of the run: a write that waits
		 * for the client cannot outlast the run's timeout (see prov_sink). */
		fcgi_io_set_deadline(rc->io, mono_ms() + prov_provider_timeout_ms(m->provider));
		/* answer_done sends the end of the answer as soon as the outcome is known;
		 * the sandbox's teardown happens after that, off the client's critical path. */
		metrics_run_begin(rc->provider);
		prov_run(&preq, &sink, rc->io->hangup_fd, &o);
		metrics_run_end(rc->provider);
		count_run_outcome(rc->provider, &o);
		ran |= o.ran;
		if (!a.answered && a.cur == hop) /* done never came: never loop on a hop */
			break;
	}
	/* Every provider it could go to was at its own max_concurrent: nothing ran, so the
	 * request does not use up one of the key's (issue 22 item 7). */
	if (!ran && o.err == PROV_ERR_CONCURRENCY_LIMIT)
		fcgi_quota_refund(rc->app->usage, rc->id.key_id, &rc->claim, rc->rid);
out_answer:
	json_decref(messages);
	fcgi_chat_release(&req);
	buf_release(&body);
	rc->answer = NULL;
	buf_release(&a.text);
	buf_release(&a.out);
	buf_release(&a.detail);
	buf_release(&a.held);
	calls_reset(&a);
	heartbeat_stop(&a);
	pthread_mutex_destroy(&a.lock);
}

/* ---- GET /v1/usage, /dashboard, /metrics (issue 14) --------------------------------------- */

static int64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#define USAGE_RECENT_DEFAULT 20
#define USAGE_RECENT_MAX 200
#define USAGE_SINCE_DAYS 30

/* "YYYY-MM-DD" (a real day) into the unix ms of its 00:00 UTC. 0, or -1. */
static int parse_day(const char *s, int64_t *ms)
{
	struct tm tm = { 0 }, back;
	char again[16];
	time_t t;

	if (strlen(s) != 10 || strspn(s, "0123456789-") != 10 || s[4] != '-' || s[7] != '-' ||
	    sscanf(s, "%4d-%2d-%2d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday) != 3)
		return -1;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	t = timegm(&tm);
	/* timegm normalises 2026-02-30 into March: such a day is refused. */
	if (t == (time_t)-1 || !gmtime_r(&t, &back) ||
	    !strftime(again, sizeof(again), "%Y-%m-%d", &back) || strcmp(again, s))
		return -1;
	*ms = (int64_t)t * 1000;
	return 0;
}

static json_t *day_string(int64_t ms, bool with_time)
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;
	char s[40];

	if (!gmtime_r(&t, &tm))
		return json_null();
	if (!with_time) {
		(void)strftime(s, sizeof(s), "%Y-%m-%d", &tm);
	} else {
		size_t n = strftime(s, sizeof(s), "%Y-%m-%dT%H:%M:%S", &tm);

		snprintf(s + n, sizeof(s) - n, ".%03dZ", (int)(ms % 1000));
	}
	return json_string(s);
}

/* One key of the answer: who it is, as the key store says. */
struct usage_key {
	const char *id;
	const char *name; /* NULL: unknown (deleted since) */
	const char *tier; /* NULL: unknown */
	bool revoked;
	bool have_quota; /* the quota is known (the caller's own, or from the store) */
	struct auth_quota quota;
};

static json_t *quota_json(const struct usage_key *k)
{
	if (!k->have_quota || auth_quota_none(&k->quota))
		return json_null();
	return json_pack("{sIsIsIsI}", "requests_per_minute",
			 (json_int_t)k->quota.requests_per_minute, "requests_per_day",
			 (json_int_t)k->quota.requests_per_day, "tokens_per_day",
			 (json_int_t)k->quota.tokens_per_day, "max_concurrent",
			 (json_int_t)k->quota.max_concurrent);
}

static json_t *key_json(struct usage_store *st, const struct usage_key *k,
			const struct usage_day *days, size_t ndays)
{
	struct usage_quota_state qs;
	json_t *o, *arr = json_array();
	int64_t req = 0, errs = 0, pt = 0, ct = 0, cached = 0, warm = 0, pre = 0;

	for (size_t i = 0; i < ndays; i++) {
		const struct usage_day *d = &days[i];

		if (strcmp(d->key_id, k->id))
			continue;
		json_array_append_new(
			arr, json_pack("{sssosIsIsIsIsIsIsIsI}", "date", d->day, "provider",
				       d->provider[0] ? json_string(d->provider) : json_null(),
				       "requests", (json_int_t)d->requests, "errors",
				       (json_int_t)d->errors, "prompt_tokens",
				       (json_int_t)d->prompt_tokens, "completion_tokens",
				       (json_int_t)d->completion_tokens, "cached_tokens",
				       (json_int_t)d->cached_tokens, "warm", (json_int_t)d->warm,
				       "prestart", (json_int_t)d->prestart, "duration_ms",
				       (json_int_t)d->duration_ms));
		req += d->requests;
		errs += d->errors;
		pt += d->prompt_tokens;
		ct += d->completion_tokens;
		cached += d->cached_tokens;
		warm += d->warm;
		pre += d->prestart;
	}
	/* A failure here leaves zeros (the store counted it); the rest still answers. */
	(void)usage_quota_state(st, k->id, 0, &qs);
	o = json_pack("{sssososbsos{sIsIsIsI}}", "key_id", k->id, "name",
		      k->name ? json_string(k->name) : json_null(), "tier",
		      k->tier ? json_string(k->tier) : json_null(), "revoked", k->revoked, "quota",
		      quota_json(k), "quota_state", "requests_this_minute",
		      (json_int_t)qs.requests_this_minute, "requests_today",
		      (json_int_t)qs.requests_today, "tokens_today", (json_int_t)qs.tokens_today,
		      "tokens_reserved", (json_int_t)qs.tokens_reserved);
	json_object_set_new(o, "days", arr);
	json_object_set_new(o, "totals",
			    json_pack("{sIsIsIsIsIsIsIsI}", "requests", (json_int_t)req, "errors",
				      (json_int_t)errs, "prompt_tokens", (json_int_t)pt,
				      "completion_tokens", (json_int_t)ct, "total_tokens",
				      (json_int_t)pt + (json_int_t)ct, "cached_tokens",
				      (json_int_t)cached, "warm", (json_int_t)warm, "prestart",
				      (json_int_t)pre));
	return o;
}

static json_t *recent_json(const struct usage_row *rows, size_t n)
{
	json_t *arr = json_array();

	for (size_t i = 0; i < n; i++) {
		const struct usage_row *r = &rows[i];

		json_array_append_new(
			arr,
			json_pack("{sosIsssososisIsIsIsIsIsssI}", "ts", day_string(r->ts_ms, true),
				  "ts_ms", (json_int_t)r->ts_ms, "key_id", r->key_id, "provider",
				  r->provider[0] ? json_string(r->provider) : json_null(), "model",
				  r->model[0] ? json_string(r->model) : json_null(), "status",
				  r->status, "prompt_tokens", (json_int_t)r->prompt_tokens,
				  "completion_tokens", (json_int_t)r->completion_tokens,
				  "cached_tokens", (json_int_t)r->cached_tokens, "duration_ms",
				  (json_int_t)r->duration_ms, "ttfb_ms", (json_int_t)r->ttfb_ms,
				  "start", usage_start_name(r->start), "count",
				  (json_int_t)r->count));
	}
	return arr;
}
static const char *special_key_name(const char *id, const char **tier)
{
	if (!strcmp(id, "__env_owner__")) {
		*tier = "owner";
		return "owner (OLP_OWNER_TOKEN)";
	}
	if (!strcmp(id, "__anonymous__")) {
		*tier = "anonymous";
		return "anonymous";
	}
	return NULL;
}

/* Append key id to keys (once), named as the key store names it. */
static void usage_key_add(struct usage_key **keys, size_t *n, const char *id,
			  const struct auth_key_list *l)
{
	struct usage_key *k;
	size_t i;

	for (i = 0; i < *n; i++)
		if (!strcmp((*keys)[i].id, id))
			return;
	*keys = xreallocarray(*keys, *n + 1, sizeof(**keys));
	k = &(*keys)[(*n)++];
	*k = (struct usage_key){ .id = id };
	k->name = special_key_name(id, &k->tier);
	for (i = 0; i < l->n; i++) {
		if (strcmp(l->keys[i].id, id))
			continue;
		k->name = l->keys[i].name;
		k->tier = auth_tier_name(l->keys[i].tier);
		k->revoked = l->keys[i].revoked;
		k->have_quota = true;
		k->quota = l->keys[i].quota;
	}
}

/* GET /v1/usage: the ledger, read. A key sees its own usage; the owner sees every key's
 * (or one, ?key=ID). ?since=YYYY-MM-DD (default: 30 days back), ?recent=N (default 20,
 * at most 200) rows of recent requests. docs/openai-compat.md has the shape. */
static void handle_usage(struct fcgi_req *rc)
{
	struct usage_store *st = rc->app->usage;
	const char *qs = fcgi_io_param(rc->io, "QUERY_STRING");
	struct buf key = BUF_INIT, since = BUF_INIT, recent = BUF_INIT, msg = BUF_INIT;
	struct auth_key_list list = { 0 };
	struct usage_key *keys = NULL;
	struct usage_day *days = NULL;
	struct usage_row *rows = NULL;
	size_t nkeys = 0, ndays = 0, nrows = 0, i;
	struct usage_filter f = { 0 };
	uint64_t nrecent = USAGE_RECENT_DEFAULT;
	json_t *root, *karr;
	char *dump;
	int has_key, r;

	if (authenticate(rc, true))
		goto out;
	if (!st) {
		fail(rc, 404, "not_found", "usage_disabled",
		     "The usage ledger is off on this server (config.json usage.enabled)");
		goto out;
	}
	has_key = fcgi_query_get(qs, "key", &key);
	if (has_key < 0 ||
	    (has_key && (!key.len || key.len >= AUTH_ID_MAX || strlen(key.data) != key.len))) {
		struct fcgi_error e;

		fcgi_error_set(&e, 400, "invalid_request_error", NULL, "key",
			       "key: must be a key id (as olp-keys list shows it)");
		send_error(rc, &e, NULL);
		goto out;
	}
	/* A key's usage (which providers, when, how much) is its owner's business. */
	if (has_key && !is_owner(rc) && strcmp(key.data, rc->id.key_id)) {
		fail(rc, 403, "permission_error", "usage_forbidden",
		     "This key may read only its own usage (key %.64s); ?key= names another",
		     rc->id.key_id);
		goto out;
	}
	r = fcgi_query_get(qs, "since", &since);
	if (r < 0 || (r > 0 && parse_day(since.data, &f.since_ms))) {
		struct fcgi_error e;

		fcgi_error_set(&e, 400, "invalid_request_error", NULL, "since",
			       "since: must be a day as YYYY-MM-DD, such as 2026-01-31");
		send_error(rc, &e, NULL);
		goto out;
	}
	if (!r) {
		/* The last 30 UTC days, today included. */
		int64_t now = wall_ms();

		f.since_ms = now - now % 86400000 - (int64_t)(USAGE_SINCE_DAYS - 1) * 86400000;
	}
	r = fcgi_query_get(qs, "recent", &recent);
	if (r < 0 || (r > 0 && (parse_u64(recent.data, &nrecent) || nrecent > USAGE_RECENT_MAX))) {
		struct fcgi_error e;

		fcgi_error_set(&e, 400, "invalid_request_error", NULL, "recent",
			       "recent: must be an integer from 0 to %d", USAGE_RECENT_MAX);
		send_error(rc, &e, NULL);
		goto out;
	}
	if (!is_owner(rc))
		f.key_id = rc->id.key_id;
	else if (has_key)
		f.key_id = key.data;
	if (usage_days(st, &f, &days, &ndays) ||
	    (nrecent && usage_recent(st, &f, nrecent, &rows, &nrows))) {
		fail(rc, 503, "usage_unavailable", "usage_unavailable",
		     "The usage ledger cannot be read right now; try again later");
		goto out;
	}
	/* Names, tiers and quotas; without them (a store that cannot be read) the ids alone. */
	if (auth_key_list(rc->app->cfg.home, &list, &msg) != AUTH_KEY_OK)
		log_warnx(rc->rid, "/v1/usage: key store: %s", msg.data);
	if (f.key_id) {
		usage_key_add(&keys, &nkeys, f.key_id, &list);
		if (!is_owner(rc) || !strcmp(f.key_id, rc->id.key_id)) {
			/* The caller's own: as it authenticated just now. */
			keys[0].tier = auth_tier_name(rc->id.tier);
			keys[0].have_quota = true;
			keys[0].quota = rc->id.quota;
		}
	} else {
		for (i = 0; i < list.n; i++)
			usage_key_add(&keys, &nkeys, list.keys[i].id, &list);
		/* Keys in the ledger but not (or no longer) in the store: the env owner,
		 * anonymous, deleted keys. */
		for (i = 0; i < ndays; i++)
			usage_key_add(&keys, &nkeys, days[i].key_id, &list);
		for (i = 0; i < nrows; i++)
			usage_key_add(&keys, &nkeys, rows[i].key_id, &list);
	}
	karr = json_array();
	for (i = 0; i < nkeys; i++)
		json_array_append_new(karr, key_json(st, &keys[i], days, ndays));
	root = json_pack("{sssososIsbsoso}", "object", "usage", "since",
			 day_string(f.since_ms, false), "generated_at", day_string(wall_ms(), true),
			 "recent_limit", (json_int_t)nrecent, "all_keys", is_owner(rc) && !has_key,
			 "keys", karr, "recent", recent_json(rows, nrows));
	dump = root ? json_dumps(root, JSON_COMPACT) : NULL;
	if (!dump)
		abort(); /* only allocation fails here: the OOM policy */
	buf_reset(&msg);
	buf_adds(&msg, dump);
	free(dump);
	json_decref(root);
	send_json(rc, 200, &msg, (const struct hdr[]){ { "Cache-Control", "no-store" }, { 0 } });
out:
	auth_key_list_release(&list);
	free(keys);
	free(days);
	free(rows);
	buf_release(&key);
	buf_release(&since);
	buf_release(&recent);
	buf_release(&msg);
}

/* The Content-Security-Policy of the dashboard: its one inline <script> and <style>
 * allowed by their SHA-256 (CSP level 2) rather than 'unsafe-inline', so that markup
 * injected into the page, were any to get in, could run nothing; fetches to this origin
 * only (the token goes nowhere else); no frames around it (clickjacking), no form posts,
 * no <base>. Computed once from the embedded file, so that editing it needs no hash. */
static pthread_once_t csp_once = PTHREAD_ONCE_INIT;
static char dashboard_csp[512];

static void add_hash_source(struct buf *b, const char *directive, const char *open,
			    const char *close)
{
	const char *page = (const char *)fcgi_dashboard_html, *start, *end;
	unsigned char digest[crypto_hash_sha256_BYTES];
	char b64[sodium_base64_ENCODED_LEN(crypto_hash_sha256_BYTES,
					   sodium_base64_VARIANT_ORIGINAL)];

	start = strstr(page, open);
	end = start ? strstr(start, close) : NULL;
	if (!end) {
		buf_addf(b, "; %s 'none'", directive);
		return;
	}
	start += strlen(open);
	crypto_hash_sha256(digest, (const unsigned char *)start, (unsigned long long)(end - start));
	sodium_bin2base64(b64, sizeof(b64), digest, sizeof(digest), sodium_base64_VARIANT_ORIGINAL);
	buf_addf(b, "; %s 'sha256-%s'", directive, b64);
}

static void dashboard_csp_init(void)
{
	struct buf b = BUF_INIT;

	buf_adds(&b, "default-src 'none'");
	/* At the start of a line: the page's own elements, not a mention in a comment. */
	add_hash_source(&b, "script-src", "\n<script>", "</script>");
	add_hash_source(&b, "style-src", "\n<style>", "</style>");
	buf_adds(&b, "; connect-src 'self'; img-src 'self'; frame-ancestors 'none'; "
		     "base-uri 'none'; form-action 'none'");
	snprintf(dashboard_csp, sizeof(dashboard_csp), "%s", b.data);
	buf_release(&b);
}

/* GET /dashboard: the owner's page. Served to anyone, with no credential looked at: it
 * holds no data, only the script that asks for the owner's token and reads /health and
 * /v1/usage with it (docs/openai-compat.md). */
static void handle_dashboard(struct fcgi_req *rc)
{
	pthread_once(&csp_once, dashboard_csp_init);
	send_head(rc, 200, "text/html; charset=utf-8",
		  (const struct hdr[]){ { "Content-Security-Policy", dashboard_csp },
					{ "Cache-Control", "no-store" },
					{ "Referrer-Policy", "no-referrer" },
					{ "X-Content-Type-Options", "nosniff" },
					{ "X-Frame-Options", "DENY" },
					{ "Cross-Origin-Opener-Policy", "same-origin" },
					{ 0 } });
	if (strcmp(rc->method, "HEAD"))
		fcgi_io_write(rc->io, (const char *)fcgi_dashboard_html, fcgi_dashboard_html_len);
}

/* Whether the request carries config.json's metrics_token as its bearer token. Compared
 * in constant time (of digests, so that the length does not show either). */
static bool has_metrics_token(struct fcgi_req *rc)
{
	const char *want = rc->app->cfg.metrics_token;
	const char *authz = fcgi_io_param(rc->io, "HTTP_AUTHORIZATION");
	unsigned char h1[crypto_generichash_BYTES], h2[crypto_generichash_BYTES];
	size_t n;

	if (!want || !authz)
		return false;
	while (*authz == ' ' || *authz == '\t')
		authz++;
	if (strncasecmp(authz, "Bearer ", 7))
		return false;
	for (authz += 7; *authz == ' ' || *authz == '\t'; authz++)
		;
	for (n = strlen(authz); n && (authz[n - 1] == ' ' || authz[n - 1] == '\t'); n--)
		;
	crypto_generichash(h1, sizeof(h1), (const unsigned char *)authz, n, NULL, 0);
	crypto_generichash(h2, sizeof(h2), (const unsigned char *)want, strlen(want), NULL, 0);
	return sodium_memcmp(h1, h2, sizeof(h1)) == 0;
}

/* Prometheus text for the whole pool: for the owner, or for config.json's metrics_token
 * (a scraper that holds no key). The token opens this route only, and makes its holder
 * no owner: listing /metrics in auth.owner_only_endpoints changes nothing here. */
static void handle_metrics(struct fcgi_req *rc)
{
	struct buf b = BUF_INIT;

	if (!has_metrics_token(rc)) {
		if (authenticate(rc, true))
			return;
		if (!is_owner(rc)) {
			fail(rc, 403, "owner_only", "owner_only",
			     "%.200s is for the owner or the metrics_token of config.json",
			     rc->path.data);
			return;
		}
	}
	fcgi_ledger_sync(rc->app->usage);
	if (metrics_render(&b)) {
		fail(rc, 503, "metrics_unavailable", "metrics_unavailable",
		     "This worker could not open the pool's shared metrics file (its start-up "
		     "log says why)");
		goto out;
	}
	send_head(rc, 200, "text/plain; version=0.0.4; charset=utf-8",
		  (const struct hdr[]){ { "Cache-Control", "no-store" }, { 0 } });
	fcgi_io_write(rc->io, b.data, b.len);
out:
	buf_release(&b);
}

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
	buf_addf(&l, ",\"status\":%d,\"latency_ms\":%llu", rc->status, (unsigned long long)ms);
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
}

/* config.json auth.owner_only_endpoints: paths ("/v1/models", "/health", …) that only
 * the owner may call. Others get 401 without a key (403 when anonymous access is on: the
 * anonymous identity is not the owner) and 403 with a non-owner key. 0 when the caller
 * may go on to the route; else the answer was sent. */
static int check_owner_only(struct fcgi_req *rc)
{
	if (!fcgi_config_owner_only(&rc->app->cfg, rc->path.data))
		return 0;
	if (authenticate(rc, true))
		return -1;
	if (is_owner(rc))
		return 0;
	fail(rc, 403, "owner_only", "owner_only", "%.200s is restricted to the owner",
	     rc->path.data);
	return -1;
}

/* The routes: a new one is a row here plus its handler. RESTRICTABLE: config.json's
 * auth.owner_only_endpoints may name it (/health/live answers probes, /metrics has its
 * own token). QUIET: a 200 writes no log line (the web server's checks, often). */
static const struct fcgi_route routes[] = {
	{ "POST", "/v1/chat/completions", "chat", handle_chat, FCGI_ROUTE_RESTRICTABLE },
	{ "GET", "/v1/models", "models", handle_models, FCGI_ROUTE_RESTRICTABLE },
	{ "GET", "/health", "health", handle_health, FCGI_ROUTE_RESTRICTABLE },
	{ "GET", "/health/live", "health_live", handle_live, FCGI_ROUTE_QUIET },
	{ "GET", "/v1/usage", "usage", handle_usage, FCGI_ROUTE_RESTRICTABLE },
	{ "GET", "/dashboard", "dashboard", handle_dashboard, FCGI_ROUTE_RESTRICTABLE },
	{ "GET", "/metrics", "metrics", handle_metrics, 0 },
};

/* No route for the request: 404, or 405 with the Allow of the path's route. */
static void handle_no_route(struct fcgi_req *rc, enum fcgi_route_result r,
			    const struct fcgi_route *row)
{
	struct fcgi_error e;

	if (r == FCGI_ROUTE_BAD_METHOD) {
		fcgi_error_set(&e, 405, "method_not_allowed", NULL, NULL,
			       "Method %.16s not allowed on %.200s", rc->method, rc->path.data);
		send_error(rc, &e, (const struct hdr[]){ { "Allow", row->method }, { 0 } });
	} else {
		fail(rc, 404, "not_found", NULL, "Route %.16s %.200s not found", rc->method,
		     rc->path.data);
	}
}

void fcgi_handle(struct fcgi_app *app, struct fcgi_io *io)
{
	struct fcgi_req rc = {
		.app = app, .io = io, .path = BUF_INIT, .t0 = mono_ms(), .key_slot = -1
	};
	const struct fcgi_route *row = NULL;
	enum fcgi_route_result r;

	random_hex(rc.rid, 8);
	fcgi_io_set_deadline(io, rc.t0 + ANSWER_WRITE_MS);
	snprintf(rc.method_buf, sizeof(rc.method_buf), "%s",
		 fcgi_io_param(io, "REQUEST_METHOD") ? fcgi_io_param(io, "REQUEST_METHOD") : "GET");
	rc.method = rc.method_buf;
	r = fcgi_route_match(routes, ARRAY_SIZE(routes), rc.method,
			     fcgi_io_param(io, "REQUEST_URI"), fcgi_io_param(io, "PATH_INFO"),
			     app->cfg.route_prefix, &rc.path, &row);
	if (r != FCGI_ROUTE_FOUND)
		handle_no_route(&rc, r, row);
	else if (!(row->flags & FCGI_ROUTE_RESTRICTABLE) || !check_owner_only(&rc))
		row->handle(&rc);
	fcgi_io_finish(io);
	/* The answer is finished however it ended: the key's slot, if still held, is free. */
	key_slot_release(&rc);
	if (io->stalled) {
		/* Whatever it was sent, the client did not take it: it was dropped. */
		log_warnx(rc.rid, "the client stopped reading; dropped after %llu ms",
			  (unsigned long long)(mono_ms() - rc.t0));
		rc.status = 499;
		rc.error_code = "CLIENT_STALLED";
	}
	if (r != FCGI_ROUTE_FOUND || !(row->flags & FCGI_ROUTE_QUIET) || rc.status != 200)
		log_request(&rc);
	if (rc.chat)
		record_usage(&rc);
	count_request(&rc, r == FCGI_ROUTE_FOUND       ? row->name
			   : r == FCGI_ROUTE_NOT_FOUND ? "not_found"
						       : "bad_method");
	if (rc.have_id) {
		/* After the answer: last_used_at never delays a response. */
		auth_touch(app->auth, &rc.id);
		auth_identity_release(&rc.id);
	}
	buf_release(&rc.path);
}
