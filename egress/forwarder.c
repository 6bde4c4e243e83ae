/* The forwarder's threads: one acceptor per run, one thread per client connection.
 *
 * A thread per connection keeps every wait a plain poll(2) on two descriptors (the
 * client's socket or the upstream's, and the forwarder's stop eventfd), so that a
 * request streams with no buffering and no event loop of our own, and egr_stop() ends
 * every wait at once: the eventfd, written once and never read, stays readable. The
 * number of connections is bounded (limits.max_conns), each thread's stack is small, and
 * the acceptor joins every thread it started before it exits. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <curl/curl.h>

#include "egress/internal.h"
#include "common/banned.h"

#define CONN_STACK ((size_t)512 * 1024)

/* ---- threads ------------------------------------------------------------------------ */

/* Signal every thread of f to stop (idempotent, async-safe: one eventfd write). */
static void raise_stop(struct egr_forwarder *f)
{
	uint64_t one = 1;

	(void)!write(f->stop_fd, &one, sizeof(one));
}

struct conn_arg {
	struct egr_forwarder *f;
	struct egr_slot *slot;
	int fd;
};

static void *conn_main(void *arg)
{
	struct conn_arg a = *(struct conn_arg *)arg;
	struct egr_conn c = { .f = a.f, .fd = a.fd };

	free(arg);
	buf_init(&c.in);
	c.num = atomic_fetch_add(&a.f->next_conn, 1) + 1;
	snprintf(c.tag, sizeof(c.tag), "egress[%llu]", (unsigned long long)c.num);
	if (a.f->mode == EGR_MODE_UPSTREAM) {
		egr_upstream_serve(&c);
		egr_upstream_conn_release(&c);
	} else {
		egr_connect_serve(&c);
	}
	close(c.fd);
	buf_release(&c.in);
	atomic_store(&a.slot->state, EGR_SLOT_DONE);
	return NULL;
}

static void reap(struct egr_forwarder *f, bool all)
{
	for (unsigned i = 0; i < f->lim.max_conns; i++) {
		struct egr_slot *s = &f->slots[i];
		int st = atomic_load(&s->state);

		if (st == EGR_SLOT_DONE || (all && st == EGR_SLOT_BUSY)) {
			pthread_join(s->thread, NULL);
			atomic_store(&s->state, EGR_SLOT_FREE);
		}
	}
}

static struct egr_slot *free_slot(struct egr_forwarder *f)
{
	for (unsigned i = 0; i < f->lim.max_conns; i++)
		if (atomic_load(&f->slots[i].state) == EGR_SLOT_FREE)
			return &f->slots[i];
	return NULL;
}

/* Over the limit: a short 503, best effort, without a thread. */
static void refuse_busy(struct egr_forwarder *f, int fd)
{
	static const char body[] = "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\","
				   "\"message\":\"OLP egress: too many connections\"}}";
	char msg[256];
	int n = snprintf(msg, sizeof(msg),
			 "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
			 "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
			 sizeof(body) - 1, body);

	if (n > 0 && (size_t)n < sizeof(msg))
		(void)!send(fd, msg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
	atomic_fetch_add(&f->n_refused, 1);
	log_warnx(f->rid, "egress: more than %u connections at once: refused one",
		  f->lim.max_conns);
}

static void start_conn(struct egr_forwarder *f, int fd)
{
	struct egr_slot *s;
	struct conn_arg *a;
	pthread_attr_t attr;
	int one = 1, ret;

	reap(f, false);
	s = free_slot(f);
	if (!s) {
		refuse_busy(f, fd);
		close(fd);
		return;
	}
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	a = xmalloc(sizeof(*a));
	*a = (struct conn_arg){ .f = f, .slot = s, .fd = fd };
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, CONN_STACK);
	atomic_store(&s->state, EGR_SLOT_BUSY);
	ret = pthread_create(&s->thread, &attr, conn_main, a);
	pthread_attr_destroy(&attr);
	if (ret) {
		atomic_store(&s->state, EGR_SLOT_FREE);
		free(a);
		errno = ret;
		log_warn(f->rid, "egress: cannot start a connection thread");
		close(fd);
		return;
	}
	atomic_fetch_add(&f->n_conns, 1);
}

static void *acceptor_main(void *arg)
{
	struct egr_forwarder *f = arg;
	struct pollfd p[2] = { { .fd = f->listen_fd, .events = POLLIN },
			       { .fd = f->stop_fd, .events = POLLIN } };

	for (;;) {
		uint64_t now = mono_ms(), d = f->lim.deadline_ms;
		int timeout = -1, n, fd;

		if (d) {
			if (now >= d) {
				log_info(f->rid,
					 "egress: deadline reached: closing every connection");
				/* The listener first, so that nothing new gets in
				 * while the open connections are cut. */
				close(f->listen_fd);
				f->listen_fd = -1;
				raise_stop(f);
				break;
			}
			timeout = d - now > INT_MAX ? INT_MAX : (int)(d - now);
		}
		n = poll(p, 2, timeout);
		if (n < 0 && errno != EINTR) {
			log_warn(f->rid, "egress: poll");
			raise_stop(f);
			break;
		}
		if (n > 0 && p[1].revents)
			break;
		if (n <= 0 || !(p[0].revents & POLLIN))
			continue;
		fd = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOMEM ||
			    errno == ENOBUFS)
				(void)poll(NULL, 0, 10); /* let a connection end first */
			continue;
		}
		start_conn(f, fd);
	}
	/* New connections are refused from now on (a client in the namespace gets
	 * ECONNREFUSED); those open are cut by the stop signal. */
	if (f->listen_fd >= 0)
		close(f->listen_fd);
	f->listen_fd = -1;
	reap(f, true);
	return NULL;
}

/* ---- the route ------------------------------------------------------------------------- */

static char *dup_lower(const char *s)
{
	char *d = xstrdup(s);

	for (char *p = d; *p; p++)
		*p = (char)((*p >= 'A' && *p <= 'Z') ? *p - 'A' + 'a' : *p);
	return d;
}

/* Append a copy of each string of the NULL-terminated v (NULL: none) to to, lower-cased
 * when asked. */
static void push_all(struct strv *to, const char *const *v, bool lower)
{
	for (size_t i = 0; v && v[i]; i++) {
		if (lower)
			strv_push_take(to, dup_lower(v[i]));
		else
			strv_push(to, v[i]);
	}
}

/* Overwrite each string of v with zeros, then free v. */
static void wipe_release(struct strv *v)
{
	for (size_t i = 0; i < v->n; i++)
		explicit_bzero(v->v[i], strlen(v->v[i]));
	strv_release(v);
}

/* The upstream URL: http or https, without a user, a query or a fragment. */
static int upstream_url_check(const char *url, const char **why)
{
	CURLU *u;
	char *scheme = NULL, *extra = NULL;
	int ret = 0;

	if (!url || !*url) {
		*why = "upstream mode needs an upstream URL";
		return -EINVAL;
	}
	u = curl_url();
	if (!u)
		return -ENOMEM;
	if (curl_url_set(u, CURLUPART_URL, url, 0) ||
	    curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) ||
	    (strcmp(scheme, "http") && strcmp(scheme, "https"))) {
		*why = "the upstream is not an http:// or https:// URL";
		ret = -EINVAL;
	} else if (!curl_url_get(u, CURLUPART_USER, &extra, 0) ||
		   !curl_url_get(u, CURLUPART_QUERY, &extra, 0) ||
		   !curl_url_get(u, CURLUPART_FRAGMENT, &extra, 0)) {
		*why = "the upstream URL may not carry a user, a query or a fragment";
		ret = -EINVAL;
	}
	curl_free(scheme);
	curl_free(extra);
	curl_url_cleanup(u);
	return ret;
}

/* The headers to set and to drop: names that are tokens, values without CR or LF. */
static int upstream_headers_check(const struct egr_route *r, const char **why)
{
	for (size_t i = 0; i < r->n_set_headers; i++) {
		const struct egr_header *h = &r->set_headers[i];

		if (!h->name || !h->value || !egr_is_token(h->name, strlen(h->name)) ||
		    strpbrk(h->value, "\r\n")) {
			*why = "a header to set has no name, a name that is not a token, or a "
			       "CR or LF in its value";
			return -EINVAL;
		}
	}
	for (size_t i = 0; r->drop_headers && r->drop_headers[i]; i++)
		if (!egr_is_token(r->drop_headers[i], strlen(r->drop_headers[i]))) {
			*why = "a header to drop is not a header name";
			return -EINVAL;
		}
	return 0;
}

/* The upstream mode's part of egr_route_check. */
static int upstream_route_check(const struct egr_route *r, const char **why)
{
	int ret = upstream_url_check(r->upstream, why);

	if (!ret)
		ret = upstream_headers_check(r, why);
	for (size_t i = 0; !ret && r->allow_paths && r->allow_paths[i]; i++)
		ret = egr_allow_parse(r->allow_paths[i], NULL, why);
	for (size_t i = 0; !ret && r->models && r->models[i]; i++)
		if (!r->models[i][0] || strpbrk(r->models[i], "\r\n")) {
			*why = "a model to allow is empty or holds a line break";
			ret = -EINVAL;
		}
	return ret;
}

int egr_route_check(const struct egr_route *r, const char **why)
{
	const char *dummy;

	if (!why)
		why = &dummy;
	if (!r) {
		*why = "no route";
		return -EINVAL;
	}
	if (r->mode == EGR_MODE_UPSTREAM)
		return upstream_route_check(r, why);
	if (r->mode == EGR_MODE_CONNECT) {
		if (!r->allow_hosts || !r->allow_hosts[0]) {
			*why = "connect mode needs allow_hosts";
			return -EINVAL;
		}
		for (size_t i = 0; r->allow_hosts[i]; i++) {
			struct egr_addr a;
			bool ip;

			/* An address listed on purpose (connect.c, addr.c). */
			if (egr_addr_port_parse(r->allow_hosts[i], &a)) {
				if (egr_addr_listable(&a))
					continue;
				*why = "an allowed address is unspecified, multicast or reserved";
				return -EINVAL;
			}
			if (!egr_host_port_valid(r->allow_hosts[i], &ip) || ip) {
				*why = "an allowed host is not \"name:port\", \"a.b.c.d:port\" or "
				       "\"[IPv6]:port\"";
				return -EINVAL;
			}
		}
		return 0;
	}
	*why = "unknown mode";
	return -EINVAL;
}

/* ---- start and stop -------------------------------------------------------------------- */

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static int global_ret;

static void global_init_once(void)
{
	global_ret = curl_global_init(CURL_GLOBAL_DEFAULT) ? -EIO : 0;
}

int egr_global_init(void)
{
	pthread_once(&global_once, global_init_once);
	return global_ret;
}

static void forwarder_free(struct egr_forwarder *f)
{
	if (f->mode == EGR_MODE_UPSTREAM)
		egr_upstream_release(f);
	if (f->listen_fd >= 0)
		close(f->listen_fd);
	if (f->stop_fd >= 0)
		close(f->stop_fd);
	free(f->rid);
	free(f->base);
	strv_release(&f->drop);
	strv_release(&f->set_names);
	wipe_release(&f->set_lines);
	for (size_t i = 0; i < f->n_allow; i++)
		egr_allow_release(&f->allow[i]);
	free(f->allow);
	strv_release(&f->models);
	wipe_release(&f->secrets);
	free(f->ca_file);
	free(f->stop_tool);
	strv_release(&f->allow_hosts);
	free(f->slots);
	free(f);
}

/* What answer.c masks: each header value set, or its part after "Scheme " (a token and a
 * space: "Bearer sk-..."), when 16 bytes or longer; shorter values are not secrets
 * ("2023-06-01") and masking them would garble answers. */
static void secrets_of(const struct egr_route *r, struct strv *out)
{
	for (size_t i = 0; i < r->n_set_headers; i++) {
		const char *val = r->set_headers[i].value, *sp = strchr(val, ' ');

		if (sp && egr_is_token(val, (size_t)(sp - val)) && sp[1])
			val = sp + 1;
		if (strlen(val) >= 16)
			strv_push(out, val);
	}
}

/* The route was checked (egr_route_check): every entry parses. */
static void copy_route(struct egr_forwarder *f, const struct egr_route *r)
{
	const char *why;

	f->mode = r->mode;
	f->flags = r->flags;
	f->on_limits = r->on_limits;
	f->limits_ctx = r->limits_ctx;
	f->stop_tool = r->stop_after_tool ? xstrdup(r->stop_after_tool) : NULL;
	f->rid = r->request_id ? xstrdup(r->request_id) : NULL;
	if (r->mode == EGR_MODE_UPSTREAM) {
		size_t n;

		f->base = xstrdup(r->upstream);
		n = strlen(f->base);
		while (n && f->base[n - 1] == '/')
			f->base[--n] = '\0';
		push_all(&f->drop, r->drop_headers ? r->drop_headers : EGR_DEFAULT_DROP, true);
		for (size_t i = 0; i < r->n_set_headers; i++) {
			const struct egr_header *h = &r->set_headers[i];

			strv_push(&f->set_names, h->name);
			/* libcurl's way of sending a header with an empty value: "Name;". */
			if (h->value[0])
				strv_pushf(&f->set_lines, "%s: %s", h->name, h->value);
			else
				strv_pushf(&f->set_lines, "%s;", h->name);
		}
		while (r->allow_paths && r->allow_paths[f->n_allow])
			f->n_allow++;
		f->allow = xcalloc(f->n_allow + 1, sizeof(*f->allow));
		for (size_t i = 0; r->allow_paths && r->allow_paths[i]; i++)
			(void)egr_allow_parse(r->allow_paths[i], &f->allow[i], &why);
		f->check_models = r->models != NULL;
		push_all(&f->models, r->models, false);
		secrets_of(r, &f->secrets);
		f->ca_file = r->ca_file ? xstrdup(r->ca_file) : NULL;
	} else {
		push_all(&f->allow_hosts, r->allow_hosts, true);
	}
}

struct egr_forwarder *egr_start(int listen_fd, const struct egr_route *route,
				const struct egr_limits *lim)
{
	struct egr_forwarder *f;
	const char *why;
	int ret;

	if (egr_global_init()) {
		close(listen_fd);
		errno = EIO;
		return NULL;
	}
	if (listen_fd < 0 || egr_route_check(route, &why)) {
		if (listen_fd >= 0)
			close(listen_fd);
		errno = EINVAL;
		return NULL;
	}
	f = xcalloc(1, sizeof(*f));
	f->listen_fd = listen_fd;
	f->stop_fd = -1;
	copy_route(f, route);
	if (lim)
		f->lim = *lim;
	if (!f->lim.max_conns)
		f->lim.max_conns = EGR_DEFAULT_MAX_CONNS;
	if (!f->lim.max_header_bytes)
		f->lim.max_header_bytes = EGR_DEFAULT_MAX_HEADER_BYTES;
	if (!f->lim.max_body_bytes)
		f->lim.max_body_bytes = EGR_DEFAULT_MAX_BODY_BYTES;
	if (!f->lim.idle_ms)
		f->lim.idle_ms = EGR_DEFAULT_IDLE_MS;
	if (!f->lim.connect_timeout_ms)
		f->lim.connect_timeout_ms = EGR_DEFAULT_CONNECT_TIMEOUT_MS;
	f->slots = xcalloc(f->lim.max_conns, sizeof(*f->slots));
	f->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (f->stop_fd < 0) {
		ret = -errno;
		goto out_free;
	}
	/* The acceptor polls the listener; accept4 must not block if a client left. */
	if (fcntl(listen_fd, F_SETFL, fcntl(listen_fd, F_GETFL) | O_NONBLOCK) < 0) {
		ret = -errno;
		goto out_free;
	}
	if (f->mode == EGR_MODE_UPSTREAM && (ret = egr_upstream_init(f)))
		goto out_free;
	ret = -pthread_create(&f->acceptor, NULL, acceptor_main, f);
	if (ret)
		goto out_free;
	return f;

out_free:
	forwarder_free(f);
	errno = -ret;
	return NULL;
}

void egr_stop(struct egr_forwarder *f, struct egr_stats *stats)
{
	if (!f)
		return;
	raise_stop(f);
	pthread_join(f->acceptor, NULL);
	if (stats)
		*stats = (struct egr_stats){ .conns = atomic_load(&f->n_conns),
					     .requests = atomic_load(&f->n_requests),
					     .refused = atomic_load(&f->n_refused),
					     .upstream_errors = atomic_load(&f->n_upstream_errors),
					     .bytes_up = atomic_load(&f->bytes_up),
					     .bytes_down = atomic_load(&f->bytes_down) };
	if (stats)
		egr_usage_get(f, &stats->usage);
	forwarder_free(f);
}

void egr_usage_get(struct egr_forwarder *f, struct egr_usage *u)
{
	*u = (struct egr_usage){ .answers = atomic_load(&f->n_answers),
				 .input_tokens = atomic_load(&f->tok_in),
				 .output_tokens = atomic_load(&f->tok_out),
				 .cached_tokens = atomic_load(&f->tok_cached) };
}
