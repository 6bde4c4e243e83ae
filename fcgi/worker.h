/* Private to fcgi/: the worker's configuration, its I/O over FastCGI or CGI, and the
 * request handler. */
#ifndef OLP_FCGI_WORKER_H
#define OLP_FCGI_WORKER_H

#include <fcgiapp.h>
#include <jansson.h>

#include "auth/auth.h"
#include "fcgi/fcgi.h"
#include "metrics/metrics.h"
#include "providers/providers.h"
#include "sandbox/sandbox.h"
#include "store/store.h"
#include "usage/usage.h"

/* One routing chain (config.json routing.chains, ADR 0007): the registry models tried
 * in turn for one model name a client asks for. */
#define FCGI_MAX_HOPS 8
struct fcgi_chain {
	char *model;				      /* the name a client asks for */
	const struct prov_model *hops[FCGI_MAX_HOPS]; /* the registry's */
	size_t nhops;
};

/* The worker's configuration: OLP_HOME, config.json and a few environment variables,
 * checked once at start, every field typed. Requests read these fields, never JSON. */
struct fcgi_config {
	char *home;	  /* OLP_HOME */
	char *path;	  /* config.json's, named in every message about it */
	json_t *json;	  /* config.json, or an empty object: for start-up only (the registry
			 load, fcgi_config_bind), released by fcgi_config_bind */
	unsigned threads; /* server.threads or OLP_THREADS (default: sized) */
	size_t max_body;
	char *route_prefix;
	uint64_t heartbeat_ms; /* streaming.heartbeat_interval_ms (default 15000; 0: off) */
	bool allow_anonymous;
	/* auth.anonymous: what anonymous callers may use (ADR 0025). providers_set: its
	 * "providers" was given ("*": anon_all), else the default, bound to the registry by
	 * fcgi_config_bind: the providers that use no account of the owner's (commands). */
	bool anon_providers_set, anon_all;
	struct strv anon_providers;
	struct auth_quota anon_quota;
	struct strv owner_only;	   /* auth.owner_only_endpoints: paths only the owner may call */
	struct fcgi_chain *chains; /* routing.chains, once bound to the registry */
	size_t nchains;
	enum sbx_mode sandbox_mode;
	char *runtime_dir;
	char *bwrap;
	char *sandbox_exec;		  /* olp-sandbox-exec, the first program of every sandbox */
	bool sandbox_warm;		  /* sandbox.warm (default true) */
	unsigned sandbox_warm_per_policy; /* sandbox.warm_per_policy (default: sized) */
	unsigned sandbox_prestart_max;	  /* sandbox.prestart_max (default: sized; 0: none) */
	bool sandbox_prestart_set;	  /* ... was given in config.json */
	uint64_t sandbox_prestart_idle_ms;  /* sandbox.prestart_idle_s (default 300) */
	unsigned sandbox_prestart_per_key;  /* sandbox.prestart_per_key (0: half the max) */
	enum sbx_identity sandbox_identity; /* sandbox.identity */
	char *sandbox_uid_range;	    /* sandbox.uid_range, or NULL */
	char *sandbox_cgroup;		    /* sandbox.cgroup: "auto", "off" or a cgroup path */
	char *registry_path;		    /* the registry actually used */
	bool usage_enabled;		    /* usage.enabled (default true): ledger and quotas */
	unsigned usage_retention_days;	    /* usage.retention_days (0: the store's default) */
	/* The shared PostgreSQL store of several hosts (ADR 0034): OLP_STORE or "store", NULL
	 * for the embedded one (key files, SQLite); its "store_passfile", or NULL. */
	char *store_url;
	char *store_passfile;
	unsigned store_offline_keys_s; /* store_offline_keys_s (default 300; 0: none) */
	unsigned store_buffer_rows;    /* store_buffer_rows (default 10000) */
	uint64_t audit_max_bytes;      /* audit.max_bytes (0: auth's default, 64 MiB) */
	unsigned audit_keep;	       /* audit.keep (0: auth's default, 7) */
	char *metrics_token; /* metrics_token: a bearer token for GET /metrics alone, or NULL */
	char *sizing;	     /* what the machine-sized defaults chose and why (fcgi/sizing.h) */
};

/* Read OLP_HOME, config.json and the environment, checking every setting: 0, or -1 with
 * the reason in err, which names the file and the field ("…/config.json:
 * server.threads: must be a positive integer"). Release c either way. */
int fcgi_config_load(struct fcgi_config *c, struct buf *err);
/* Once the registry is loaded: check routing.chains against it and keep them typed,
 * then release the JSON. 0, or -1 with err as above ("…/config.json:
 * routing.chains.fast[1]: unknown model \"x\""). reg must outlive c's chains. */
int fcgi_config_bind(struct fcgi_config *c, const struct prov_registry *reg, struct buf *err);
void fcgi_config_release(struct fcgi_config *c);
/* The chain configured for a model name, or NULL. */
const struct fcgi_chain *fcgi_config_chain(const struct fcgi_config *c, const char *model);
/* Whether path (after the route prefix) is in auth.owner_only_endpoints. */
bool fcgi_config_owner_only(const struct fcgi_config *c, const char *path);

/* ---- access.c: who may use which provider (providers_enabled, logins; ADR 0025) ---- */
enum fcgi_access {
	FCGI_ACCESS_OK = 0,
	FCGI_ACCESS_PROVIDER, /* not in the caller's providers_enabled */
	FCGI_ACCESS_LOGIN,    /* the provider's runs hold a login the caller may not hold */
};
enum fcgi_access fcgi_access_check(const struct auth_identity *id, const struct prov_provider *pv);
/* The owner's /health: pv's ",\"login_exposed\":…" and, when exposed, ",\"login_access\":
 * [key ids]", the guest keys allowed to hold its login (grants from auth_login_grants). */
void fcgi_access_health(struct buf *b, const struct prov_provider *pv,
			const struct auth_login_grant *grants, size_t n);

struct fcgi_app {
	struct fcgi_config cfg;
	struct prov_registry *reg;
	struct auth_store *auth;
	struct usage_store *usage; /* NULL when usage.enabled is false */
	struct store_db *store;	   /* the shared store, or NULL (the embedded one) */
	/* With a shared store: 0 when the accounts' limits and choices are kept in it
	 * (prov_store_attach), else why not (-ENOENT: no providers schema, -EPROTO: another
	 * version; a CGI process: -EOPNOTSUPP). */
	int accounts_shared;
	/* The keys' concurrency slots (quota max_concurrent): files in <runtime_dir>/keyslots
	 * shared by every process of the host, or leases in the shared store (usage.h); NULL
	 * when they could not be set up (such keys are then refused: fail closed). */
	struct usage_leases *leases;
};

/* ---- health.c: the shared store's state (ADR 0034) ----------------------------------- */
/* What a client is asked to wait while the shared store is away: a few of the store's
 * one-second reconnect attempts. */
#define STORE_RETRY_AFTER "5"
/* olp_store_available from db's state, when it changed (nothing for the embedded store). */
void fcgi_store_sync(struct store_db *db);
/* The owner's /health "store": {"kind":"embedded"} or {"kind":"postgresql","where",
 * "ok","failing_since","last_error","offline_keys_s"}. */
void fcgi_store_health_json(struct buf *b, const struct fcgi_app *app);
/* A wall-clock time in ms as a JSON string "YYYY-MM-DDTHH:MM:SSZ", or null when ms <= 0. */
void fcgi_json_since(struct buf *b, int64_t ms);

/* ---- the accounts' subscription limits (limits.c, ADR 0035) ----------------------------- */
/* {"<account>":{status, limited, retry_after_s, reset, claim, seen, credentials, default,
 * windows:{...}[, login]}, ...}: the provider's accounts ("default" without "accounts") as
 * the upstream last described them (docs/accounts.md); only: that account alone (a key's
 * view), or NULL: every account, each with its login (the owner's view). */
void fcgi_limits_accounts_json(struct buf *b, const struct prov_provider *pv, const char *only);
/* ,"login":{mode, expires, expires_in_s, last_refresh, refresh_failures, last_error} or
 * ,"login":null: pv's login as the owner's /health shows it (health.c, ADR 0036). */
void fcgi_health_login(struct buf *b, const struct prov_provider *pv);
/* {"<provider>":{accounts}, ...}: every provider's for the owner, for a key those of the
 * providers it may use; account (?account=, NULL: none): that account alone, which a key
 * sees only when it is its own (else each provider's object is empty). */
void fcgi_limits_usage_json(struct fcgi_req *rc, const char *account, struct buf *b);
/* Append the olp_account_* families (Prometheus text) to b. */
void fcgi_limits_metrics(const struct prov_registry *reg, struct buf *b);

/* ---- quota.c: a key's quota against the usage store (ADR 0026) ---------------------- */
/* The tokens a chat request is expected to cost, reserved against tokens_per_day while it
 * runs: its body's bytes / 4 (the prompt, a little over) plus its max_tokens, or 1024
 * when it sets none. */
int64_t fcgi_quota_estimate(size_t body_len, int64_t max_tokens);
struct fcgi_quota_hdr {
	char retry_after[24]; /* the Retry-After of a refusal */
};
/* Check id's quota and count the request (with claim's reservation: claim->tokens and
 * ttl_ms set by the caller). 0 to go on (also for a key without a quota, or no store);
 * -1 with e and hdr filled: 429 quota_exceeded, or 503 usage_unavailable when the store
 * cannot write (fails closed). */
int fcgi_quota_check(struct usage_store *st, bool shared, const struct auth_identity *id,
		     struct usage_claim *claim, struct fcgi_error *e, struct fcgi_quota_hdr *hdr);
/* Give claim back (a request no provider took): logged when the store fails. */
void fcgi_quota_refund(struct usage_store *st, const char *key_id, struct usage_claim *claim,
		       const char *rid);
/* olp_ledger_available for this worker, from st's health (nothing when st is NULL). */
void fcgi_ledger_sync(struct usage_store *st);
/* The /health "usage" object: enabled, available, ok, failing_since, last_error,
 * failures (st NULL: the ledger is off). */
void fcgi_usage_health_json(struct buf *b, struct usage_store *st);

/* One request's I/O: FastCGI streams, or stdin/stdout/environ in plain CGI mode.
 *
 * Every byte of the answer goes out through fcgi_io_write and fcgi_io_finish, and neither waits
 * for the web server past the request's write deadline: a client that stops reading
 * (its web server stops reading from us once its buffers are full) cannot hold the
 * thread, nor a provider run whose output it is, past that deadline. It is then dropped:
 * the connection to the web server is cut without the end of the request, so the web
 * server aborts the response rather than finishing it. */
struct fcgi_io {
	FCGX_Request *fcgx; /* NULL in CGI mode */
	char **envp;
	int hangup_fd;	   /* the web server connection (POLLRDHUP = it went away), or -1 */
	uint64_t deadline; /* mono_ms() by which writes must be taken (0: none) */
	bool failed;	   /* a write failed: the client is gone (or dropped) */
	bool stalled;	   /* ... because it stopped reading: the deadline passed */
	bool finished;	   /* fcgi_io_finish ran: the answer is complete, nothing more is sent */
	struct buf held;   /* fcgi_io_write_last's bytes, not written yet (BUF_INIT) */
	/* fcgi_io_finish waits for the web server to close its end (libfcgi's close, up
	 * to 2 s) even on a unix socket: for a thread whose work after the answer (a run's
	 * teardown, the next warm sandbox) would take the CPU the web server needs to pass
	 * the answer on. Else the connection is closed at once. */
	bool linger;
};

const char *fcgi_io_param(struct fcgi_io *io, const char *name);
/* Read up to n bytes of the request body: bytes read, 0 at the end, -1 on error. */
ssize_t fcgi_io_read(struct fcgi_io *io, char *dst, size_t n);
/* The deadline of the writes from now on (mono_ms(); 0: none). */
void fcgi_io_set_deadline(struct fcgi_io *io, uint64_t deadline_ms);
/* Write and push to the web server now (no buffering): 0, or -1 once the client is gone
 * or was dropped for not taking it by the deadline. */
int fcgi_io_write(struct fcgi_io *io, const char *data, size_t len);
/* The answer's last bytes (all of a JSON answer): taken from b (left empty) and held, to
 * go with the end of the request in one write when fcgi_io_finish comes (the handler
 * returns), or before the next fcgi_io_write's bytes. 0, or -1 as fcgi_io_write. */
int fcgi_io_write_last(struct fcgi_io *io, struct buf *b);

/* The answer is complete: end the FastCGI request now (the web server closes the HTTP
 * response), though the thread may still have cleanup to do; or, after a failed write or
 * when even the end cannot be sent by the deadline, drop the client. Idempotent. After
 * it, fcgi_io_param and fcgi_io_write must not be used. */
void fcgi_io_finish(struct fcgi_io *io);

/* ---- one request (handler.c; answers: respond.c) ---------------------------------------- */
/* How long a client has to take an answer that is not a provider run's output (an error,
 * /health, /v1/models) or the end of one once the run is over; a run's output has the
 * run's own deadline (fcgi_handle_chat). A client still not reading then is dropped. */
#define FCGI_ANSWER_WRITE_MS 30000

struct fcgi_answer; /* chat.c's */

/* One request under way: what fcgi_handle, the answers' layer and the handlers share. */
struct fcgi_req {
	struct fcgi_app *app;
	struct fcgi_io *io;
	enum fcgi_api api; /* its errors' shape: from its route */
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
	/* The provider's account of the run that answered (the hop's, ADR 0037), for the
	 * ledger's row; NULL when no provider ran. The provider's string. */
	const char *account;
	struct auth_identity id;
	bool have_id;
	const struct fcgi_answer *answer; /* a chat answer under way: adds the X-OLP-* headers */
	/* The usage ledger (ADR 0020): a chat completion that passed auth gets one row, with
	 * the tokens and start of the run that answered (answer_done). */
	bool chat;
	struct prov_usage usage;
	enum usage_start start;
	struct usage_lease key_lease; /* the key's concurrency slot (check_concurrency) */
	struct usage_claim claim;     /* the request's count and token reservation (check_quota) */
};

/* One response header; a list of them ends with a NULL name. */
struct fcgi_hdr {
	const char *name;
	const char *value;
};

/* Append one header through fcgi_header_add; one it refuses (a control character in a
 * value: header injection) is left out and logged, and the answer goes on without it. */
void fcgi_add_header(struct fcgi_req *rc, struct buf *h, const char *name, const char *value);
void fcgi_send_head(struct fcgi_req *rc, int status, const char *ctype,
		    const struct fcgi_hdr *extra);
/* A whole JSON answer: its bytes go with the end of the request (fcgi_io_write_last), so
 * the handler returns soon after, or writes more (which sends them at once). */
void fcgi_send_json(struct fcgi_req *rc, int status, const struct buf *body,
		    const struct fcgi_hdr *extra);
/* e as an OpenAI-style error object; its code (or type) is the request's log error. */
void fcgi_send_error(struct fcgi_req *rc, const struct fcgi_error *e, const struct fcgi_hdr *extra);
void fcgi_fail(struct fcgi_req *rc, int status, const char *type, const char *code, const char *fmt,
	       ...) __attribute__((format(printf, 5, 6)));
/* Identify the caller. required: a missing token is an error (else it yields no
 * identity, as /health allows). 0 to go on; else the 401 was sent. */
int fcgi_authenticate(struct fcgi_req *rc, bool required);
bool fcgi_is_owner(const struct fcgi_req *rc);

/* The routes' handlers: each answers its request whole (fcgi_handle does the rest). */
void fcgi_handle_chat(struct fcgi_req *rc);
void fcgi_handle_responses(struct fcgi_req *rc); /* responses.c: POST /v1/responses */
void fcgi_handle_health(struct fcgi_req *rc);
void fcgi_handle_live(struct fcgi_req *rc);
void fcgi_handle_models(struct fcgi_req *rc);
void fcgi_handle_usage(struct fcgi_req *rc);
void fcgi_handle_dashboard(struct fcgi_req *rc);
void fcgi_handle_metrics(struct fcgi_req *rc);
/* messages.c: POST /v1/messages and /v1/messages/count_tokens (Anthropic's API). */
void fcgi_handle_messages(struct fcgi_req *rc);
void fcgi_handle_count_tokens(struct fcgi_req *rc);
/* ---- chat.c: one answer of a provider run, in any of the client APIs ------------------ */
/* A non-streamed answer is held in memory until the provider is done; past this size the
 * request fails rather than exhausting the worker. */
#define FCGI_MAX_BUFFERED_ANSWER (64u << 20)
/* The model's function calls kept for one answer; more are dropped with a warning in the
 * log (no model makes that many in one turn). */
#define FCGI_MAX_CALLS 32

/* One step of a routing chain: a registry model (and so its provider). */
struct fcgi_hop {
	const struct prov_model *m;
	/* The provider's account the hop's run uses (ADR 0037), chosen by fcgi_limits_check:
	 * the key's bound one, else its sticky choice. The provider's string; NULL before. */
	const char *account;
};

/* How an answer is written in one client API (ADR 0030): OpenAI chat completions (chat.c),
 * Anthropic Messages (messages.c), OpenAI Responses (responses.c). The request path is
 * one (fcgi_chat_serve): keys, quotas, chains, heartbeats and the ledger are the same for
 * all three; only these encodings differ. Each op appends to out what goes to the client;
 * the caller writes it (after the stream's head), always on the request's own thread. */
struct fcgi_wire {
	/* Streamed: a piece of the answer's text (len > 0). */
	void (*text)(struct fcgi_answer *a, struct buf *out, const char *text, size_t len);
	/* Streamed: a piece of call i's JSON arguments (a->calls[i]); first on the call's
	 * first piece, whose id and name are then set. */
	void (*tool)(struct fcgi_answer *a, struct buf *out, size_t i, bool first, const char *args,
		     size_t len);
	/* Streamed: a heartbeat, which may be the stream's first bytes. */
	void (*beat)(struct fcgi_answer *a, struct buf *out);
	/* Streamed: the end; o->err set when the run failed after the stream began. */
	void (*end)(struct fcgi_answer *a, struct buf *out, const struct prov_outcome *o);
	/* Not streamed: the whole answer (status 200, JSON). */
	void (*whole)(struct fcgi_answer *a, struct buf *out, const struct prov_outcome *o);
};

/* The OpenAI chat completions wire (chat.c). */
extern const struct fcgi_wire fcgi_wire_chat;

struct fcgi_answer {
	struct fcgi_req *rc;
	const struct fcgi_chat_request *req;
	const struct fcgi_wire *wire;
	void *wire_ctx;		     /* the wire's own state */
	struct fcgi_completion meta; /* the answer's id, created, the model asked for */
	bool started;		     /* stream: head sent */
	bool too_large;		     /* non-stream: answer over FCGI_MAX_BUFFERED_ANSWER */
	bool answered;		     /* the end of the answer (or its error) was sent */
	bool exhausted;		     /* every hop failed */
	bool next_hop;		     /* answer_done moved to the next hop: the loop starts it */
	struct buf text;	     /* non-stream: the whole answer */
	struct buf out;		     /* encoding scratch */
	struct fcgi_hop hops[FCGI_MAX_HOPS];
	size_t nhops;
	size_t cur;    /* the hop running now */
	size_t failed; /* hops that failed before output and were passed over */
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
	const char *stop_hit; /* the stop sequence seen (one of stops[]), when stopped */
	bool stopped;	      /* a stop sequence was seen: the run was ended on purpose */
	/* response_format: a stream's text is kept too (in text), to be checked at the end;
	 * past FCGI_MAX_BUFFERED_ANSWER it is not kept and the answer counts as unchecked. */
	bool unchecked;
	char warning[128]; /* meta.warning points here when set */
	/* The model's function calls, in the order they started. */
	struct fcgi_call {
		char id[128];
		char name[72];
		struct buf args;
	} calls[FCGI_MAX_CALLS];
	size_t ncalls;
	bool role_sent;	      /* stream: the answer's first piece (text or call) is out */
	enum sbx_start start; /* how the running hop's process came to be (X-OLP-Prestart) */
	/* Heartbeats (streaming.heartbeat_interval_ms; 0: none): the wire's beat when nothing
	 * was written for hb_ms, from the run's tick (chat.c answer_tick), on the thread that
	 * writes the rest of the answer: no thread or lock of their own. */
	uint64_t hb_ms, last_write;
};

/* Read a JSON request body: 415 unless Content-Type is application/json, 413 past
 * max_body. 0, or -1 after answering. */
int fcgi_read_json_body(struct fcgi_req *rc, struct buf *body);
/* Serve a parsed chat request (fcgi_chat_parse or a front-end's translation into it):
 * the model or chain (404), each hop's provider open to the key (403), what each hop can
 * do (400), the key's concurrency slot and quota (429/503), then the runs, answered
 * through wire (wire_ctx its state). rc is authenticated, rc->api set. */
void fcgi_chat_serve(struct fcgi_req *rc, const struct fcgi_chat_request *req, size_t body_len,
		     const struct fcgi_wire *wire, void *wire_ctx);

/* chat.c: the X-OLP-* headers of the chat answer a under way. */
void fcgi_chat_headers(const struct fcgi_answer *a, int status, struct buf *h);
/* The key's concurrency slot (quota max_concurrent), when held: free it. */
void fcgi_key_slot_release(struct fcgi_req *rc);

void fcgi_handle(struct fcgi_app *app, struct fcgi_io *io);

/* fcgi/dashboard.html, built in (fcgi/embed.cmake): len bytes, then a NUL. */
extern const unsigned char fcgi_dashboard_html[];
extern const size_t fcgi_dashboard_html_len;

/* Skip the hops whose account the upstream rejected until a reset still to come
 * (limits.c): 0 to go on with the others, or -1 after answering 429 (rate_limit_error,
 * code "subscription_limit", Retry-After the seconds to the soonest reset) when none is
 * left. Before the key's concurrency and quota: a refused request costs the key nothing. */
int fcgi_limits_check(struct fcgi_req *rc, struct fcgi_answer *a);

#endif
