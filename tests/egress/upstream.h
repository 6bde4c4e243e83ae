/* A small HTTP/1.1 upstream for the egress suite and benchmark, on 127.0.0.1, plain or
 * TLS (OpenSSL). Written independently of egress/ (its own parser), so that a bug there
 * cannot hide itself. Keep-alive, Content-Length and chunked request bodies.
 *
 * What it answers, by path:
 *  /stream?n=N&gap=MS[&close=1][&ts=1]  N events "data: i\n\n", the first at once, then
 *                                one every MS ms; chunked, or with close=1 no length and
 *                                the connection closed at the end (as an HTTP/1.0 server);
 *                                ts=1: "data: i t=NS\n\n", NS the mono_ns() it was sent at
 *  /big?bytes=N                  N bytes with a Content-Length
 *  /status/NNN                   status NNN with a small JSON body
 *  /limits/anthropic[?rejected=1]  200 (or 429) with anthropic-ratelimit-unified-* headers
 *                                (5h at 0.42, or rejected at 1.0; 7d at 0.25)
 *  /limits/codex429              429 with x-codex-* headers (primary 100 %, secondary 12.5 %)
 *                                and a usage_limit_reached body, resets_in_seconds 3600
 *  /hang                         nothing, ever (until tu_stop)
 *  /reflect?sse=0|1&piece=N      the request's body as the answer, chunked in pieces of N
 *                                bytes a few ms apart (0: one), as text/event-stream or
 *                                application/json; the request's x-api-key is echoed in a
 *                                header "X-Echo: key=<value>" (a reflecting upstream)
 *  anything else                 200, Content-Length, the body "method=M\npath=P\nbody=LEN\n"
 *                                followed by the request head as received (with ?piece=N:
 *                                chunked instead, in pieces of N bytes) */
#ifndef OLP_TESTS_EGRESS_UPSTREAM_H
#define OLP_TESTS_EGRESS_UPSTREAM_H

#include <stdint.h>

#include "common/common.h"

struct tu_server;

/* Start on 127.0.0.1 (a free port); TLS with cert and key (PEM files) when not NULL. */
struct tu_server *tu_start(const char *cert, const char *key);
uint16_t tu_port(const struct tu_server *s);
/* Connections accepted and requests read so far. */
unsigned tu_connections(struct tu_server *s);
unsigned tu_requests(struct tu_server *s);
/* The head of the last request read (as received) and its body's length. */
void tu_last(struct tu_server *s, struct buf *head, uint64_t *body_len);
void tu_stop(struct tu_server *s);

#endif
