/* Connect mode: `CONNECT host:port` to the listed names only, then a byte relay.
 *
 * For CLIs that must speak TLS to their own servers themselves (a subscription login whose
 * OAuth token the CLI refreshes): the forwarder sees only the name and the encrypted
 * bytes. What it stops: a run reaching any host but the listed ones. The name is compared
 * with the list as it is sent, a raw IP is refused whether listed or not (the list names
 * hosts, and an address says nothing about which host answers), the worker resolves the
 * name itself, and by default refuses addresses of its own machine or the link-local
 * range (a listed name whose DNS points at 127.0.0.1 or 169.254.169.254 reaches none of
 * the host's services). The relay stops at the deadline whatever the two sides do. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "egress/internal.h"
#include "common/banned.h"

#define RELAY_BUF ((size_t)256 * 1024)

/* An address of this machine, or one no API lives at: loopback, unspecified, link-local
 * (cloud metadata), multicast, broadcast; IPv4-mapped forms too. */
static bool local_addr(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET6) {
		const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;

		if (IN6_IS_ADDR_V4MAPPED(a)) {
			struct sockaddr_in v4 = { .sin_family = AF_INET };

			memcpy(&v4.sin_addr, &a->s6_addr[12], 4);
			return local_addr((const struct sockaddr *)&v4);
		}
		return IN6_IS_ADDR_LOOPBACK(a) || IN6_IS_ADDR_UNSPECIFIED(a) ||
		       IN6_IS_ADDR_LINKLOCAL(a) || IN6_IS_ADDR_MULTICAST(a);
	}
	if (sa->sa_family == AF_INET) {
		uint32_t h = ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr);

		return (h >> 24) == 127 || (h >> 24) == 0 || (h >> 16) == 0xa9fe ||
		       (h >> 28) == 0xe || h == 0xffffffffu;
	}
	return true;
}

/* Connect to one address, waiting as the connection's waits do but no longer than the
 * connect timeout: the socket (non-blocking), or -errno. */
static int connect_one(struct egr_conn *c, const struct addrinfo *ai)
{
	uint64_t until = mono_ms() + c->f->lim.connect_timeout_ms, d = c->f->lim.deadline_ms;
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), err = 0,
	    one = 1;
	socklen_t el = sizeof(err);

	if (fd < 0)
		return -errno;
	if (d && d < until)
		until = d;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		int w;

		if (errno != EINPROGRESS) {
			err = -errno;
			close(fd);
			return err;
		}
		w = egr_conn_wait(c, fd, POLLOUT, until);
		if (w || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err) {
			close(fd);
			return w ? w : err ? -err : -EIO;
		}
	}
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

/* One direction of the relay. */
struct half {
	int from, to;
	char *buf;
	size_t off, len;
	bool eof;  /* from said EOF */
	bool shut; /* ... and to was told (shutdown SHUT_WR) */
	uint64_t bytes;
};

/* Move what can move without waiting. -1 on a failure of either side. */
static int pump(struct half *h)
{
	for (;;) {
		ssize_t n;

		if (h->len) {
			n = send(h->to, h->buf + h->off, h->len, MSG_NOSIGNAL | MSG_DONTWAIT);
			if (n < 0)
				return errno == EAGAIN || errno == EINTR ? 0 : -1;
			h->off += (size_t)n;
			h->len -= (size_t)n;
			h->bytes += (uint64_t)n;
			if (h->len)
				continue;
			h->off = 0;
		}
		if (h->eof) {
			if (!h->shut) {
				(void)shutdown(h->to, SHUT_WR);
				h->shut = true;
			}
			return 0;
		}
		n = recv(h->from, h->buf, RELAY_BUF, MSG_DONTWAIT);
		if (n < 0)
			return errno == EAGAIN || errno == EINTR ? 0 : -1;
		if (n == 0)
			h->eof = true;
		h->len = (size_t)n;
	}
}

/* Relay until both directions are done, either side fails, or the forwarder stops. */
static void relay(struct egr_conn *c, int up, struct half *a, struct half *b)
{
	uint64_t d = c->f->lim.deadline_ms;

	for (;;) {
		struct pollfd p[3] = { { .fd = c->fd },
				       { .fd = up },
				       { .fd = c->f->stop_fd, .events = POLLIN } };
		int timeout = -1, n;

		if (pump(a) || pump(b))
			return;
		if (a->shut && b->shut)
			return;
		/* a: client → upstream, b: upstream → client. */
		p[0].events = (short)((!a->len && !a->eof ? POLLIN : 0) | (b->len ? POLLOUT : 0));
		p[1].events = (short)((!b->len && !b->eof ? POLLIN : 0) | (a->len ? POLLOUT : 0));
		/* A socket we want nothing from is left out: its POLLHUP would spin the loop. */
		for (int i = 0; i < 2; i++)
			if (!p[i].events)
				p[i].fd = -1;
		if (d) {
			uint64_t now = mono_ms();

			if (now >= d)
				return;
			timeout = d - now > 1000000 ? 1000000 : (int)(d - now);
		}
		n = poll(p, 3, timeout);
		if (n < 0 && errno != EINTR)
			return;
		if (n > 0 && p[2].revents)
			return;
	}
}

static void refuse(struct egr_conn *c, int status, const char *type, const char *msg,
		   const char *what)
{
	log_warnx(c->f->rid, "%s: refused CONNECT %.100s: %s", c->tag, what, msg);
	egr_conn_error(c, status, type, msg);
}

/* Whether the request r read from c names a listed host:port; refused (answered,
 * logged) if not. */
static bool admit(struct egr_conn *c, const struct egr_req *r)
{
	struct egr_forwarder *f = c->f;
	bool ip, listed = false;

	if (strcmp(r->method, "CONNECT")) {
		refuse(c, 405, "invalid_request_error", "OLP egress: only CONNECT is allowed here",
		       r->target);
		return false;
	}
	if (!egr_host_port_valid(r->target, &ip)) {
		refuse(c, 403, "permission_error", "OLP egress: not a host name and port",
		       r->target);
		return false;
	}
	if (ip) {
		refuse(c, 403, "permission_error", "OLP egress: raw IP addresses are refused",
		       r->target);
		return false;
	}
	for (size_t i = 0; f->allow_hosts[i] && !listed; i++)
		listed = !strcasecmp(f->allow_hosts[i], r->target);
	if (!listed)
		refuse(c, 403, "permission_error", "OLP egress: this host is not allowed",
		       r->target);
	return listed;
}

/* Resolve the admitted "host:port" and connect to it (never to an address of this
 * machine, unless the route allows local targets): the socket, or -1 after answering
 * the client (or when the forwarder stops). */
static int open_target(struct egr_conn *c, const char *target)
{
	struct egr_forwarder *f = c->f;
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV },
			*res = NULL;
	const char *colon = strrchr(target, ':');
	char host[256];
	bool any_local = false;
	int up = -EHOSTUNREACH, gai;

	snprintf(host, sizeof(host), "%.*s", (int)(colon - target), target);
	gai = getaddrinfo(host, colon + 1, &hints, &res);
	if (gai) {
		log_warnx(f->rid, "%s: CONNECT %s: cannot resolve: %s", c->tag, target,
			  gai_strerror(gai));
		egr_conn_error(c, 502, "api_error", "OLP egress: the host could not be resolved");
		return -1;
	}
	for (const struct addrinfo *ai = res; ai && up < 0; ai = ai->ai_next) {
		if (!(f->flags & EGR_ALLOW_LOCAL_TARGETS) && local_addr(ai->ai_addr)) {
			any_local = true;
			continue;
		}
		up = connect_one(c, ai);
		if (up == -ECANCELED)
			break;
	}
	freeaddrinfo(res);
	if (up >= 0 || up == -ECANCELED)
		return up >= 0 ? up : -1;
	if (any_local) {
		refuse(c, 403, "permission_error",
		       "OLP egress: the host resolves to an address of this machine", target);
		return -1;
	}
	errno = -up;
	log_warn(f->rid, "%s: CONNECT %s: cannot connect", c->tag, target);
	egr_conn_error(c, 502, "api_error", "OLP egress: the host could not be reached");
	return -1;
}

void egr_connect_serve(struct egr_conn *c)
{
	struct egr_forwarder *f = c->f;
	struct half a = { 0 }, b = { 0 };
	struct egr_req r;
	int st, up;
	uint64_t t0;

	st = egr_conn_read_head(c, &r);
	if (st < 0)
		goto out;
	if (st > 0) {
		refuse(c, st, st == 431 ? "request_too_large" : "invalid_request_error",
		       "OLP egress: malformed request", "-");
		goto out;
	}
	if (!admit(c, &r))
		goto out;
	t0 = mono_ms();
	up = open_target(c, r.target);
	if (up < 0)
		goto out;
	if (egr_conn_write(c, c->fd, "HTTP/1.1 200 Connection Established\r\n\r\n", 39))
		goto out_close;
	atomic_fetch_add(&f->n_requests, 1);
	log_info(f->rid, "%s: CONNECT %s: open (%llu ms)", c->tag, r.target,
		 (unsigned long long)(mono_ms() - t0));
	a = (struct half){ .from = c->fd, .to = up, .buf = xmalloc(RELAY_BUF) };
	b = (struct half){ .from = up, .to = c->fd, .buf = xmalloc(RELAY_BUF) };
	/* What the client sent after the head (a TLS ClientHello sent early) goes first. */
	if (c->in.len) {
		if (egr_conn_write(c, up, c->in.data, c->in.len))
			goto out_free;
		a.bytes = c->in.len;
		buf_reset(&c->in);
	}
	relay(c, up, &a, &b);
	atomic_fetch_add(&f->bytes_up, a.bytes);
	atomic_fetch_add(&f->bytes_down, b.bytes);
	log_info(f->rid, "%s: CONNECT %s: closed, %llu bytes up, %llu down, %llu ms", c->tag,
		 r.target, (unsigned long long)a.bytes, (unsigned long long)b.bytes,
		 (unsigned long long)(mono_ms() - t0));
out_free:
	free(a.buf);
	free(b.buf);
out_close:
	close(up);
out:
	egr_req_release(&r);
}
