/* egress: the forwarder between a sandboxed run and the one API it may reach (ADR 0015,
 * ADR 0015).
 *
 * A run lives in a network namespace of its own with only loopback (sbx_netns_init); the
 * worker's forwarder listens there, on a socket made inside the namespace and handed over,
 * and answers from the host's network. The module knows nothing of providers, keys or
 * HTTP frontends: it is given an already-listening TCP socket and a route, and serves
 * every connection on that socket on a thread of its own until egr_stop() or the
 * deadline.
 *
 * Two modes:
 *  - upstream: each HTTP/1.1 request (Content-Length or chunked body, keep-alive) is sent
 *    with libcurl to the route's base URL (http or https, TLS always verified), minus the
 *    placeholder credential headers, plus the headers the caller resolved (the real
 *    credential); the answer streams back as it arrives, each piece written to the client
 *    the moment libcurl hands it over (SSE stays token by token).
 *  - connect: `CONNECT host:port` for the listed names only (a raw IP only when listed as
 *    such), resolved and connected by the worker, never to an address of this machine or
 *    an internal range unless listed, then bytes relayed both ways until either side is
 *    done. For CLIs that must talk TLS to their own servers themselves (OAuth refresh).
 *
 * Threat model: the client is the hostile command. It may send anything, as slowly or as
 * much as it likes, and open as many connections as it likes. It must not reach any host
 * or path the route does not name, must not learn the credential the forwarder adds (it
 * is never echoed, never logged), must not smuggle a second request past the path check,
 * must not spend the credential on another method, path, model or stored object than the
 * route names (EGR_CHECK_BODY), and must not hold more than the limits below. Whatever it
 * spends is counted from the upstream's own answers (egr_usage_get). Nothing a client
 * sends is logged but the method, the path without its query, and the CONNECT
 * authority, cut. */
#ifndef OLP_EGRESS_H
#define OLP_EGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum egr_mode {
	EGR_MODE_UPSTREAM = 0, /* forward HTTP requests to route.upstream */
	EGR_MODE_CONNECT,      /* tunnel CONNECT to route.allow_hosts */
};

/* One header to set on every forwarded request: name → value, already resolved by the
 * caller (read from a file, the environment, ...). */
struct egr_header {
	const char *name;
	const char *value;
};

enum egr_flags {
	/* Connect mode: let an allowed name resolve to any address, this machine's and
	 * internal ranges included (refused by default, so that a listed name whose DNS
	 * points at 127.0.0.1, the host's LAN address or 169.254.169.254 reaches nothing of
	 * the host's or its network's). For tests. */
	EGR_ALLOW_LOCAL_TARGETS = 1 << 0,
	/* Upstream mode: every path and method (but TRACE, TRACK and CONNECT, never) instead
	 * of allow_paths. Only for a run that holds its own credential (no set_headers): the
	 * forwarder adds nothing that a path could spend. */
	EGR_ANY_PATH = 1 << 1,
	/* Upstream mode: every request body must be one JSON object (no Content-Encoding)
	 * whose top-level members pass the checks of route.models and egress/body.c:
	 * "background" and "store" absent, false or null; "previous_response_id" and
	 * "conversation" absent or null; "prompt" not an object. Anything else is refused
	 * (400 or 403) before the body's last byte leaves, so that the upstream never acts
	 * on it. For model APIs (Messages, Responses, Chat Completions). */
	EGR_CHECK_BODY = 1 << 2,
};

/* ---- subscription limits the upstream announces (ratelimit.c) ------------------------ */

enum egr_rl_status {
	EGR_RL_UNKNOWN = 0, /* not said */
	EGR_RL_ALLOWED,
	EGR_RL_WARNING, /* Anthropic's "allowed_warning" */
	EGR_RL_REJECTED,
};

/* The windows, by the names the upstreams give them: Anthropic's five-hour and seven-day
 * ("5h", "7d"), codex's "primary" and "secondary" (their lengths in minutes say which). */
enum egr_rl_window { EGR_RL_5H = 0, EGR_RL_7D, EGR_RL_PRIMARY, EGR_RL_SECONDARY, EGR_RL_NWIN };

struct egr_rl_win {
	bool seen;		   /* the upstream said something of this window */
	enum egr_rl_status status; /* Anthropic's -<w>-status; UNKNOWN for codex's */
	double utilization;	   /* 0..1, or < 0 when not said */
	int64_t reset_s;	   /* when it resets, epoch seconds; 0 = not said */
	uint32_t minutes;	   /* its length; 0 = not said */
};

/* What one answer said of the account's subscription limits: Anthropic's
 * anthropic-ratelimit-unified-* headers, codex's x-codex-{primary,secondary}-* headers,
 * a 429 body with "usage_limit_reached". Every value is checked where it is read (a
 * fixed word, an integer or a decimal in a bounded range); one that is not is ignored,
 * as if it had not been sent. Nothing here identifies the account beyond these values. */
struct egr_ratelimit {
	bool any;		   /* at least one value was read */
	int http_status;	   /* the answer's status */
	enum egr_rl_status status; /* the account's, overall */
	int64_t reset_s;	   /* when the overall limit resets, epoch seconds; 0 = not said */
	char claim[32];		   /* the window that decides (Anthropic's representative
				      claim, [a-z0-9_]), or "" */
	struct egr_rl_win win[EGR_RL_NWIN];
};

/* Called with what an answer said (rl->any is true), from the connection's thread: after
 * the head of an answer that is not a 429, after the whole body of a 429 (its head and
 * body read together). At most once an answer; ctx is egr_route.limits_ctx. */
typedef void (*egr_limits_fn)(void *ctx, const struct egr_ratelimit *rl);

/* "allowed", "allowed_warning", "rejected", or "unknown". */
const char *egr_rl_status_name(enum egr_rl_status s);
/* "5h", "7d", "primary", "secondary". */
const char *egr_rl_window_name(enum egr_rl_window w);
/* Start an answer's reading (everything unknown). */
void egr_rl_init(struct egr_ratelimit *rl, int http_status);
/* Read one response header (name and value, not NUL-terminated, value trimmed) into rl
 * when it is one of the names above; now_s (epoch seconds) turns a relative reset into a
 * time. Whether it was read. */
bool egr_rl_header(struct egr_ratelimit *rl, const char *name, size_t name_len, const char *value,
		   size_t value_len, int64_t now_s);
/* Read a 429 answer's JSON body: {"error":{"type":"usage_limit_reached", "resets_at":
 * epoch seconds, "resets_in_seconds": n}} (or those members at the top), making the
 * account rejected until then. Whether it was such a body. */
bool egr_rl_body(struct egr_ratelimit *rl, const char *body, size_t len, int64_t now_s);
/* After the last header and body: the overall reset, when the upstream named none, from
 * the windows that are full (rejected, or used to 100 %). */
void egr_rl_finish(struct egr_ratelimit *rl);

/* Where a run's traffic may go. Every string and array is copied by egr_start(). */
struct egr_route {
	enum egr_mode mode;
	/* Logged with every line of this forwarder (the run's request id); NULL = none. */
	const char *request_id;

	/* ---- upstream mode ---- */
	/* Base URL: "http(s)://host[:port][/prefix]", no user, query or fragment. A request
	 * for /v1/messages?x goes to <base>/v1/messages?x. */
	const char *upstream;
	/* Header names removed from every request, case-insensitively: the placeholder
	 * credentials the CLI was given. NULL-terminated; NULL = EGR_DEFAULT_DROP. */
	const char *const *drop_headers;
	/* Headers set on every request, replacing any the client sent under that name. No
	 * CR, LF or NUL anywhere; names are HTTP tokens. Each value of 16 bytes or more (the
	 * part after "Scheme " when it has that form) is a secret the run must never read:
	 * a response header that holds one is dropped, and in a response body each copy is
	 * overwritten with '*' (the length stays), so that an upstream that echoes its
	 * request does not hand the credential back. */
	const struct egr_header *set_headers;
	size_t n_set_headers;
	/* The requests allowed, NULL-terminated; NULL or empty = none (see EGR_ANY_PATH).
	 * Each entry is "METHOD /path": the method exactly (case-sensitive, an HTTP token;
	 * never TRACE, TRACK or CONNECT), and the path compared exactly with the request's
	 * path without its query string (a query string is allowed). A path that ends in a
	 * '*' after a '/' is a prefix: it allows every path that starts with what comes
	 * before the '*' (the entry "GET /v1/models/" followed by '*' allows
	 * "/v1/models/a/b"); wide, for operators who write it on purpose. A path listed for
	 * other methods only is refused with 405, any other with 403. Matched after refusing (400) any path that is not in canonical form (a "." or
	 * ".." segment, an empty segment, a backslash or ';', or %2e/%2f/%5c/%00
	 * percent-encoded), so that no upstream normalisation can turn an allowed path into
	 * another. */
	const char *const *allow_paths;
	/* With EGR_CHECK_BODY: the values a body's top-level "model" may have,
	 * NULL-terminated; an entry ending in '*' allows every model that starts with what
	 * comes before it. With a list, a body without "model" is refused too. NULL = the
	 * model is not checked. */
	const char *const *models;
	/* PEM file of the CA(s) that sign the upstream's certificate (a private CA); NULL =
	 * the system store. Verification is never turned off. */
	const char *ca_file;

	/* ---- connect mode ---- */
	/* What a CONNECT may name, NULL-terminated: "host:port" pairs, compared
	 * case-insensitively; the worker connects to none of the name's addresses that is
	 * this machine's (any interface) or internal (loopback, RFC 1918, link-local,
	 * 100.64/10, fc00::/7, ..., and their IPv4-mapped, NAT64 and 6to4 forms). An entry
	 * "a.b.c.d:port" or "[IPv6]:port" lists that address on purpose: a CONNECT may name
	 * it, and a listed name may resolve to it, on that port, whatever its range. Other
	 * numeric forms ("127.1", "2130706433") are refused, listed or not. */
	const char *const *allow_hosts;

	/* Upstream mode: told what each answer says of the subscription's limits
	 * (egr_limits_fn); NULL = not read. */
	egr_limits_fn on_limits;
	void *limits_ctx;

	/* Upstream mode: a tool-name prefix, or NULL. Once an answer has called a tool whose
	 * name starts with it (a streamed content_block of the Messages API), every further
	 * POST is refused (403) without reaching the upstream: the run ends at that call,
	 * and its CLI, which would act on the call and ask the model again at the client's
	 * cost before it is stopped, cannot (ADR 0019). An answer that is not streamed is
	 * not read for it. */
	const char *stop_after_tool;

	unsigned flags; /* enum egr_flags */
};

/* The credential headers dropped when route.drop_headers is NULL. */
#define EGR_DEFAULT_DROP                                                                        \
	((const char *const[]){ "authorization", "x-api-key", "api-key", "proxy-authorization", \
				"x-goog-api-key", NULL })

/* Bounds of one forwarder. 0 in a field takes the default shown. */
struct egr_limits {
	unsigned max_conns;	     /* client connections open at once, 32; more get 503 */
	size_t max_header_bytes;     /* request line + headers, 64 KiB; more get 431 */
	uint64_t max_body_bytes;     /* request body, 32 MiB; more get 413 */
	uint64_t deadline_ms;	     /* absolute, on mono_ms()'s clock: every connection is
					closed and the listener too; 0 = none */
	uint64_t idle_ms;	     /* a keep-alive connection with no request, 300000 */
	uint64_t connect_timeout_ms; /* reaching the upstream or a CONNECT target, 10000 */
};
#define EGR_DEFAULT_MAX_CONNS 32
#define EGR_DEFAULT_MAX_HEADER_BYTES ((size_t)64 * 1024)
#define EGR_DEFAULT_MAX_BODY_BYTES ((uint64_t)32 * 1024 * 1024)
#define EGR_DEFAULT_IDLE_MS 300000
#define EGR_DEFAULT_CONNECT_TIMEOUT_MS 10000

/* The tokens the upstream's answers reported (egr_usage_get). */
struct egr_usage {
	uint64_t answers;      /* answers that carried a usage object */
	int64_t input_tokens;  /* prompt, cached input included */
	int64_t output_tokens; /* completion */
	int64_t cached_tokens; /* of input_tokens, read from a cache */
};

/* What one forwarder did, for the caller's log line. */
struct egr_stats {
	uint64_t conns;		  /* client connections accepted */
	uint64_t requests;	  /* requests forwarded (upstream) or tunnels opened (connect) */
	uint64_t refused;	  /* answered 4xx/503 by the forwarder itself */
	uint64_t upstream_errors; /* answered 502/504, or cut after the answer had begun */
	uint64_t bytes_up;	  /* request body / tunnel bytes, client to upstream */
	uint64_t bytes_down;	  /* response body / tunnel bytes, upstream to client */
	struct egr_usage usage;	  /* what the upstream's answers reported */
};

/* Set up libcurl once for the process (curl_global_init); egr_start() calls it too. Call
 * it early, from the main thread, where start-up failures are reported. 0 or -errno. */
int egr_global_init(void);

/* Whether route could be served: 0, or -EINVAL with *why (a static string) saying what
 * is wrong. For validating the configuration once, at start. */
int egr_route_check(const struct egr_route *route, const char **why);

struct egr_forwarder;

/* Serve listen_fd (a listening TCP socket, e.g. sbx_netns.listen_fd) under route and lim
 * (NULL = every default) on a thread of its own, each client connection on a thread of
 * its own. Takes ownership of listen_fd, also on failure. Copies route and lim. Returns
 * the handle, or NULL with errno set (EINVAL: egr_route_check refused the route). */
struct egr_forwarder *egr_start(int listen_fd, const struct egr_route *route,
				const struct egr_limits *lim);
/* Stop: close the listener and every connection (a request in flight is cut), join every
 * thread, free f. Returns promptly whatever the clients and the upstream do. stats, when
 * not NULL, gets the totals. f may be NULL. */
void egr_stop(struct egr_forwarder *f, struct egr_stats *stats);

/* The tokens the upstream reported so far in the answers this forwarder passed, summed
 * over every request of every connection: the "usage" object of a JSON answer, or of
 * each event of an SSE answer, at the top level or in its "message" or "response"
 * member (the Anthropic Messages, OpenAI Responses and Chat Completions shapes), read
 * as the bytes go by; within one answer the largest count of each kind is kept (the
 * counts of a stream are running totals). input_tokens is "input_tokens" plus Anthropic's
 * "cache_read_input_tokens" and "cache_creation_input_tokens", or "prompt_tokens";
 * output_tokens is "output_tokens" or "completion_tokens". Each count is capped at 10^9
 * an answer. An answer cut before its usage came counts what had come. Safe to call
 * while the forwarder runs. */
void egr_usage_get(struct egr_forwarder *f, struct egr_usage *u);

#endif
