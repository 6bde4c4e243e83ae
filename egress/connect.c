/* Connect mode: `CONNECT host:port` to the listed names only, then a byte relay.
 *
 * For CLIs that must speak TLS to their own servers themselves (a subscription login whose
 * OAuth token the CLI refreshes): the forwarder sees only the name and the encrypted
 * bytes. What it stops: a run reaching any host but the listed ones, or, through a listed
 * name, anything but the public internet. The target is compared with the list as it is
 * sent. A raw IP is refused unless an entry lists that very address and port (an address
 * says nothing about which host answers, so only the owner may name one); numeric forms
 * other than a dotted quad or [IPv6] ("127.1", "2130706433") are refused always. The worker
 * resolves a name itself and, by default, connects to none of its addresses that is an
 * address of this machine (any interface, read at each CONNECT), private, link-local,
 * CGNAT, unique-local or otherwise internal (addr.c has the list), unless an entry lists
 * that address: a listed name whose DNS points at 127.0.0.1, the host's LAN address,
 * 169.254.169.254 or fd00:ec2::254 reaches none of them. The relay stops at the deadline
 * whatever the two sides do. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
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

/* Whether the request r read from c names a listed host:port, or an address:port listed
 * as such; refused (answered, logged) if not. */
static bool admit(struct egr_conn *c, const struct egr_req *r)
{
	struct egr_forwarder *f = c->f;
	struct egr_addr addr;
	bool ip, listed = false;

	if (strcmp(r->method, "CONNECT")) {
		refuse(c, 405, "invalid_request_error", "OLP egress: only CONNECT is allowed here",
		       r->target);
		return false;
	}
	if (egr_addr_port_parse(r->target, &addr)) {
		listed = egr_addr_listed(&addr, f->allow_hosts.v);
		if (!listed)
			refuse(c, 403, "permission_error",
			       "OLP egress: raw IP addresses are refused unless listed", r->target);
		return listed;
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
	for (size_t i = 0; i < f->allow_hosts.n && !listed; i++)
		listed = !strcasecmp(f->allow_hosts.v[i], r->target);
	if (!listed)
		refuse(c, 403, "permission_error", "OLP egress: this host is not allowed",
		       r->target);
	return listed;
}

/* Whether the tunnel may go to ai (addr.c), logging a refusal. */
static enum egr_addr_verdict judge(struct egr_conn *c, const char *target,
				   const struct addrinfo *ai, const struct ifaddrs *ifs)
{
	struct egr_addr a;
	enum egr_addr_verdict v;
	char text[INET6_ADDRSTRLEN];

	if (c->f->flags & EGR_ALLOW_LOCAL_TARGETS)
		return EGR_ADDR_OK;
	if (!egr_addr_from_sockaddr(ai->ai_addr, &a))
		return EGR_ADDR_INTERNAL;
	v = egr_addr_judge(&a, c->f->allow_hosts.v, ifs);
	if (v != EGR_ADDR_OK)
		log_warnx(c->f->rid, "%s: CONNECT %.100s: not to %s (%s)", c->tag, target,
			  egr_addr_str(&a, text, sizeof(text)),
			  v == EGR_ADDR_THIS_MACHINE ? "this machine" : "not a public address");
	return v;
}

/* Resolve the admitted "host:port" (or "[IPv6]:port") and connect to it, never to an
 * address addr.c refuses unless it is listed: the socket, or -1 after answering the
 * client (or when the forwarder stops). */
static int open_target(struct egr_conn *c, const char *target)
{
	struct egr_forwarder *f = c->f;
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV },
			*res = NULL;
	const char *colon = strrchr(target, ':');
	struct ifaddrs *ifs = NULL;
	enum egr_addr_verdict worst = EGR_ADDR_OK;
	char host[256];
	int up = -EHOSTUNREACH, gai;

	/* "[fd00::5]:443" is listed on purpose: resolve the address inside the brackets. */
	if (target[0] == '[')
		snprintf(host, sizeof(host), "%.*s", (int)(colon - target - 2), target + 1);
	else
		snprintf(host, sizeof(host), "%.*s", (int)(colon - target), target);
	/* Read at each CONNECT (about 30 us): an address added since start counts too. */
	if (!(f->flags & EGR_ALLOW_LOCAL_TARGETS) && getifaddrs(&ifs) < 0) {
		log_warn(f->rid, "%s: CONNECT %s: cannot list this machine's addresses", c->tag,
			 target);
		egr_conn_error(c, 503, "api_error", "OLP egress: the target cannot be checked");
		return -1;
	}
	gai = getaddrinfo(host, colon + 1, &hints, &res);
	if (gai) {
		log_warnx(f->rid, "%s: CONNECT %s: cannot resolve: %s", c->tag, target,
			  gai_strerror(gai));
		egr_conn_error(c, 502, "api_error", "OLP egress: the host could not be resolved");
		goto out_free_ifs;
	}
	for (const struct addrinfo *ai = res; ai && up < 0; ai = ai->ai_next) {
		enum egr_addr_verdict v = judge(c, target, ai, ifs);

		if (v != EGR_ADDR_OK) {
			worst = worst == EGR_ADDR_THIS_MACHINE ? worst : v;
			continue;
		}
		up = connect_one(c, ai);
		if (up == -ECANCELED)
			break;
	}
	freeaddrinfo(res);
	if (up >= 0 || up == -ECANCELED)
		goto out_free_ifs;
	if (worst != EGR_ADDR_OK) {
		refuse(c, 403, "permission_error",
		       worst == EGR_ADDR_THIS_MACHINE
			       ? "OLP egress: the host resolves to an address of this machine"
			       : "OLP egress: the host resolves to a private or internal address",
		       target);
		goto out_free_ifs;
	}
	errno = -up;
	log_warn(f->rid, "%s: CONNECT %s: cannot connect", c->tag, target);
	egr_conn_error(c, 502, "api_error", "OLP egress: the host could not be reached");
out_free_ifs:
	if (ifs)
		freeifaddrs(ifs);
	return up >= 0 ? up : -1;
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
