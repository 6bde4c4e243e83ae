/* Private to egress/: the forwarder's state, one client connection, and the HTTP/1.1
 * request-head parser they share.
 *
 * The files call downwards only: forwarder.c (accepting, dispatching to a mode, start and
 * stop) calls the modes, upstream.c and connect.c; they call conn.c (one connection's
 * waits and I/O), which, like the modes, uses the helpers below it: http.c (the request
 * head), policy.c, body.c, answer.c, jscan.c and addr.c. Nothing calls back up into
 * forwarder.c. */
#ifndef OLP_EGRESS_INTERNAL_H
#define OLP_EGRESS_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/uio.h>

#include "common/common.h"
#include "egress/egress.h"

/* ---- the forwarder ------------------------------------------------------------------- */

enum egr_slot_state { EGR_SLOT_FREE = 0, EGR_SLOT_BUSY, EGR_SLOT_DONE };

struct egr_conn;

struct egr_slot {
	pthread_t thread;
	_Atomic int state; /* enum egr_slot_state: BUSY → DONE by the connection's thread */
	struct egr_conn *conn;
};

struct egr_forwarder {
	/* The route, copied (egr_start). */
	enum egr_mode mode;
	unsigned flags;
	char *rid;		 /* request id for the logs, or NULL */
	char *base;		 /* upstream base URL without a trailing '/' */
	struct strv drop;	 /* lower-case header names */
	struct strv set_names;	 /* the names of the headers set, as given */
	struct strv set_lines;	 /* their "Name: value" lines for libcurl (wiped) */
	struct egr_allow *allow; /* n_allow entries of route.allow_paths, parsed */
	size_t n_allow;
	bool check_models; /* route.models was given: models is what a body may name */
	struct strv models;
	struct strv secrets;	 /* what answer.c masks in answers (wiped) */
	char *ca_file;		 /* or NULL */
	struct strv allow_hosts; /* lower-case "host:port" */
	struct egr_limits lim;	 /* defaults filled in */
	egr_limits_fn on_limits; /* or NULL */
	void *limits_ctx;
	char *stop_tool;	 /* route.stop_after_tool, or NULL */
	_Atomic int tool_called; /* an answer called a stop_tool tool: no more POSTs */

	int listen_fd; /* owned by the acceptor thread once started */
	int stop_fd;   /* eventfd: readable once the forwarder stops, for good */
	pthread_t acceptor;
	struct egr_slot *slots; /* lim.max_conns */
	void *curl_share;	/* CURLSH: DNS and TLS sessions shared by the connections */
	pthread_mutex_t share_lock[8];

	_Atomic uint64_t next_conn;
	_Atomic uint64_t n_conns, n_requests, n_refused, n_upstream_errors, bytes_up, bytes_down;
	_Atomic uint64_t n_answers;
	_Atomic int64_t tok_in, tok_out, tok_cached; /* usage.c */
};

struct egr_req;

/* ---- the route's rules (policy.c) ------------------------------------------------------- */

/* One entry of route.allow_paths. */
struct egr_allow {
	char *method;
	char *path; /* the exact path, or a prefix ending in '/' */
	size_t len;
	bool prefix;
};

/* Parse "METHOD /path" into a (when not NULL; egr_allow_release frees it): 0, or -EINVAL
 * with *why (a static string). */
int egr_allow_parse(const char *entry, struct egr_allow *a, const char **why);
void egr_allow_release(struct egr_allow *a);
/* Methods never forwarded, whatever the route says (TRACE, TRACK, CONNECT). */
bool egr_method_never(const char *method);
/* Whether method and path (len bytes, canonical, no query) are allowed by the n entries
 * of allow: 0, 405 (the path is listed for other methods), or 403. */
int egr_allow_match(const struct egr_allow *allow, size_t n, const char *method, const char *path,
		    size_t len);
/* Whether a client's request header stays here: hop-by-hop (egr_req_hop_by_hop), or one
 * that asks a server or a proxy on the way for another method, URL or client address
 * (X-HTTP-Method-Override, X-Original-URL, X-Forwarded-*, Forwarded, Proxy-*, ...). */
bool egr_req_dropped(const struct egr_req *r, const char *name);
/* Whether model is one of models (an entry ending in '*' is a prefix). */
bool egr_model_allowed(const struct strv *models, const char *model, size_t len);

/* ---- JSON read as it streams (jscan.c) ------------------------------------------------ */

#define EGR_JSCAN_DEPTH 512 /* deeper nesting is an error */
#define EGR_JSCAN_KEY 40    /* longer keys are kept as "too long" */
#define EGR_JSCAN_CAP 4096  /* the largest value captured whole */

/* A strict reader of one JSON text fed in pieces, with no buffering but the values it is
 * asked to capture: RFC 8259 structure, strings with valid escapes and no control bytes,
 * the literals true, false, null and numbers; anything else (comments, trailing commas,
 * NaN, single quotes, a second value) is an error, so that what it calls a member is what
 * any JSON parser calls one. Zero it, set want/got/ctx, feed, finish. */
struct egr_jscan {
	/* Called where a value starts in an object at depth 1 or 2 (1: a member of the
	 * top-level object): key[0] is the top-level member's key, key[1] the key inside it
	 * (depth 2). A key is "" when it held an escape or was too long (key_odd[i] then
	 * says so). 1 to capture the value, 0 not to, < 0 to stop with an error. */
	int (*want)(void *ctx, const struct egr_jscan *s, unsigned depth);
	/* A captured value's JSON text; whole is false when it was longer than the cap (raw
	 * then holds its start). < 0 stops with an error. */
	int (*got)(void *ctx, const struct egr_jscan *s, unsigned depth, const char *raw,
		   size_t len, bool whole);
	void *ctx;

	char key[2][EGR_JSCAN_KEY];
	bool key_odd[2];
	/* private */
	unsigned depth, key_len, lit_len, uni, cap_depth, num;
	int expect;
	bool in_str, str_is_key, esc, in_lit, cap_on, cap_over, failed;
	char lit[8];
	size_t cap_len;
	unsigned char stack[EGR_JSCAN_DEPTH]; /* 1: object, 0: array */
	char cap[EGR_JSCAN_CAP];
};

/* Read the next len bytes: 0, or -1 (not JSON, or a callback stopped it; sticky). */
int egr_jscan_feed(struct egr_jscan *s, const char *data, size_t len);
/* The end of the text: 0 when exactly one complete value was read, else -1. */
int egr_jscan_finish(struct egr_jscan *s);

/* ---- request bodies (body.c) ----------------------------------------------------------- */

/* The check of one request body under EGR_CHECK_BODY. */
struct egr_body {
	struct egr_jscan js;
	const struct strv *models; /* NULL: the model is not checked */
	bool model_seen, finished;
	int status;	 /* when refused: 400 or 403 */
	const char *why; /* ... and the message for the client (static) */
};

/* models (borrowed; NULL: any model) is what the body may name in "model". */
void egr_body_begin(struct egr_body *b, const struct strv *models);
/* The next bytes of the body, before they go upstream: 0, or -1 (refused: status, why). */
int egr_body_feed(struct egr_body *b, const char *data, size_t len);
/* The body's end, before its last bytes go upstream: 0, or -1 (refused). */
int egr_body_finish(struct egr_body *b);

/* ---- answers: usage and echoed secrets (answer.c) -------------------------------------- */

/* The usage count of one answer. */
struct egr_answer {
	struct egr_forwarder *f;
	struct egr_jscan js;
	bool sse, off;
	unsigned line_pos; /* SSE: bytes of the current line seen (0: at its start) */
	char prefix[5];	   /* SSE: the line's first bytes, to find "data:" */
	bool data_line, in_event, cr;
	int64_t in, out, cached; /* the largest seen in this answer, counted already */
	bool counted;
	/* The secrets' partial copies at the end of what was read, held back (echo). */
	struct buf held;
};

/* Start the count of an answer whose Content-Type is ctype (NULL: none), with
 * Content-Encoding cenc (NULL: none; any other than identity: not read). */
void egr_answer_begin(struct egr_answer *a, struct egr_forwarder *f, const char *ctype,
		      size_t ctype_len, bool encoded);
/* The next bytes of the answer's body: their usage is counted. */
void egr_answer_feed(struct egr_answer *a, const char *data, size_t len);
/* The end of the answer (complete or cut). */
void egr_answer_end(struct egr_answer *a);
void egr_answer_release(struct egr_answer *a);
/* Overwrite every copy of the forwarder's secrets in data with '*' and hold back a tail
 * that may be the start of one: what of held+data may be written now is left in out
 * (which holds it; held keeps the rest). With no secrets out is data itself. */
void egr_echo_mask(struct egr_answer *a, const char *data, size_t len, struct buf *out);
/* Whether a response header's value holds a secret. */
bool egr_echo_in(const struct egr_forwarder *f, const char *value, size_t len);

/* ---- one request head ---------------------------------------------------------------- */

#define EGR_MAX_HEADERS 128

struct egr_hdr {
	char *name;  /* NUL-terminated, as sent */
	char *value; /* NUL-terminated, surrounding whitespace trimmed */
};

struct egr_req {
	char *head; /* the copy every pointer below points into (owned; egr_req_release) */
	char *method;
	char *target;
	size_t path_len; /* the target up to '?' (or its end) */
	int minor;	 /* HTTP/1.minor */
	struct egr_hdr h[EGR_MAX_HEADERS];
	size_t nh;
	bool has_length;
	uint64_t length;
	bool chunked;
	bool keep_alive;
	bool expect_continue;
};

/* Parse the request head (request line + headers + the empty line, exactly len bytes of
 * data, the last four "\r\n\r\n"). Copies it. 0, or the HTTP status to answer with
 * (400, 417, 431, 501, 505); r is usable (and must be released) in both cases. */
int egr_req_parse(struct egr_req *r, const char *data, size_t len);
void egr_req_release(struct egr_req *r);
/* Value of the first header named name (case-insensitive), or NULL. */
const char *egr_req_header(const struct egr_req *r, const char *name);
/* Whether a request header must not be forwarded as it is: hop-by-hop (RFC 9110 7.6.1,
 * and any name the request's Connection header lists) or framing that is redone on the
 * way out (Host, Content-Length, Transfer-Encoding, Expect). */
bool egr_req_hop_by_hop(const struct egr_req *r, const char *name);
/* Whether the comma-separated list value holds token (case-insensitive). */
bool egr_list_has(const char *value, const char *token, size_t token_len);

/* Whether path (len bytes, starting with '/') is in the canonical form egress.h describes. */
bool egr_path_canonical(const char *path, size_t len);
/* The reason phrase of an HTTP status. */
const char *egr_reason(int status);
/* A header name is an HTTP token (RFC 9110 5.6.2). */
bool egr_is_token(const char *s, size_t len);
/* hp is "host:port", the host made of letters, digits, '-' and '.', the port 1-65535;
 * *is_ip tells whether the host is an IPv4 address in any form libc reads as one
 * ("127.1", "0x7f.1", "2130706433") or ends in an all-digit label. */
bool egr_host_port_valid(const char *hp, bool *is_ip);

/* ---- addresses a CONNECT may reach (addr.c) ----------------------------------------- */

struct ifaddrs;
struct sockaddr;

/* One IP address and port. An IPv4-mapped IPv6 address (::ffff:a.b.c.d) is held as the
 * IPv4 address it is, so that both spellings compare equal. */
struct egr_addr {
	int family;    /* AF_INET or AF_INET6 */
	uint8_t a[16]; /* network order; the first 4 bytes for AF_INET, the rest 0 */
	uint16_t port;
};

enum egr_addr_verdict {
	EGR_ADDR_OK = 0,       /* the public internet, or listed on purpose */
	EGR_ADDR_THIS_MACHINE, /* an address of one of this machine's interfaces */
	EGR_ADDR_INTERNAL,     /* loopback, private, link-local, CGNAT, multicast, reserved */
};

/* *out from an AF_INET or AF_INET6 sockaddr: true, or false for another family. */
bool egr_addr_from_sockaddr(const struct sockaddr *sa, struct egr_addr *out);
/* hp is exactly "a.b.c.d:port" (a dotted quad) or "[IPv6]:port", the port 1-65535 in
 * plain digits: true with *out set; false otherwise (names, "127.1", zones, no port). */
bool egr_addr_port_parse(const char *hp, struct egr_addr *out);
/* Whether an allow_hosts entry may list a: not unspecified, multicast or 240/4. */
bool egr_addr_listable(const struct egr_addr *a);
/* Whether an entry of allow (NULL-terminated "host:port" strings) is a's address and
 * port. */
bool egr_addr_listed(const struct egr_addr *a, char *const *allow);
/* Whether a CONNECT may reach a (addr.c says which ranges are refused and why): listed in
 * allow, or neither an address of this machine (ifs, from getifaddrs) nor internal. */
enum egr_addr_verdict egr_addr_judge(const struct egr_addr *a, char *const *allow,
				     const struct ifaddrs *ifs);
/* a's address as text in out (n bytes, INET6_ADDRSTRLEN is enough): out. */
const char *egr_addr_str(const struct egr_addr *a, char *out, size_t n);

/* ---- one client connection (conn.c) ---------------------------------------------------- */

struct egr_conn {
	struct egr_forwarder *f;
	int fd;		  /* the client's socket, non-blocking */
	uint64_t num;	  /* for the logs */
	char tag[96];	  /* "egress[<num>]" */
	struct buf in;	  /* bytes read from the client and not consumed yet */
	void *mode_state; /* upstream.c's per-connection state */
};

/* The time a wait of this connection gives up: the deadline, or now + idle_ms. */
uint64_t egr_conn_until(const struct egr_conn *c);
/* Wait until fd has events (POLLIN / POLLOUT), no later than until_ms (mono_ms; 0 = no
 * limit) and only while the forwarder runs: 0, -ETIMEDOUT, -ECANCELED (stopped) or
 * -errno. */
int egr_conn_wait(struct egr_conn *c, int fd, short events, uint64_t until_ms);
/* Append what the client sends next to c->in (one read of up to hint bytes), waiting
 * until egr_conn_until(): bytes read, 0 at EOF, or -errno as egr_conn_wait. */
ssize_t egr_conn_fill(struct egr_conn *c, size_t hint);
/* Write all of iov to fd (non-blocking), waiting as egr_conn_wait: 0 or -errno. */
int egr_conn_writev(struct egr_conn *c, int fd, struct iovec *iov, int n);
int egr_conn_write(struct egr_conn *c, int fd, const void *data, size_t len);
/* Read the next request head from the client: 0 (r is set), an HTTP status to answer
 * with (r set as far as it could be parsed), -ENODATA (the client closed between
 * requests), or -errno. */
int egr_conn_read_head(struct egr_conn *c, struct egr_req *r);
/* Answer with the forwarder's own JSON error and count it; the connection should then be
 * closed. */
void egr_conn_error(struct egr_conn *c, int status, const char *type, const char *msg);

/* ---- the modes (upstream.c, connect.c), which forwarder.c calls ------------------------ */

/* Serve one connection in upstream mode until it should be closed. */
void egr_upstream_serve(struct egr_conn *c);
/* Free what upstream mode kept for the connection (its libcurl handles). */
void egr_upstream_conn_release(struct egr_conn *c);
/* Set up / tear down the forwarder's libcurl share. 0 or -errno. */
int egr_upstream_init(struct egr_forwarder *f);
void egr_upstream_release(struct egr_forwarder *f);
/* Serve one connection in connect mode: one CONNECT, then the tunnel. */
void egr_connect_serve(struct egr_conn *c);

#endif
