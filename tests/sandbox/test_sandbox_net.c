/* CUnit suite for the network modes of sbx_run (sandbox/spawn.c, instance.c, netns.c; issue 12): what
 * a run can reach in SBX_NET_LOOPBACK, SBX_NET_HOST and SBX_NET_NONE, seen by olp-probe
 * from inside a real sandbox, cold and warm, and how a loopback run fails closed.
 *
 * The test plays the worker: it locks itself down as olp-fcgi does, keeps a host loopback
 * service (TCP on 127.0.0.1 and ::1) and a FastCGI-like unix socket, and for loopback runs
 * answers "ping" with "pong" on the listener on_listener hands it. CTest runs it as root
 * and, through netns-as-www-data.sh, as www-data. Exits 77 (SKIP) when this host cannot
 * run a sandbox with a user namespace of its own per run, saying why. */
#include "tests/support/cunit.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/common.h"
#include "sandbox/sandbox.h"
#include "common/banned.h"

#define SKIP 77
#define NET_PORT 18080 /* the listener's port inside every loopback run */

static char runtime_dir[] = "/tmp/olp-sbx-net-XXXXXX";
static char unix_dir[] = "/tmp/olp-sbx-fcgi-XXXXXX";
static char unix_path[100];
static int host_fd = -1, host6_fd = -1, unix_fd = -1;
static uint16_t host_port;

/* ---- the test's forwarder: accepts one connection, answers "pong" to "ping" --------- */

struct server {
	int listen_fd;
	uint16_t port;
	int stop[2]; /* written when the run is over: stop waiting */
	pthread_t thread;
	bool started;
	int calls;	 /* on_listener calls */
	int accepted;	 /* connections that said "ping" */
	int refuse;	 /* on_listener's answer when < 0 */
	struct buf *out; /* the probe's stdout */
};

static void *serve(void *arg)
{
	struct server *s = arg;
	struct pollfd pfd[2] = { { .fd = s->listen_fd, .events = POLLIN },
				 { .fd = s->stop[0], .events = POLLIN } };
	char buf[16];
	int c;

	/* Generous: a loaded machine starts sandboxes slowly; the run's end stops us. */
	if (poll(pfd, 2, 60000) <= 0 || !(pfd[0].revents & POLLIN))
		return NULL;
	c = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	if (c < 0)
		return NULL;
	if (read(c, buf, sizeof(buf)) == 5 && !memcmp(buf, "ping\n", 5) &&
	    write(c, "pong\n", 5) == 5)
		s->accepted++;
	close(c);
	return NULL;
}

static int on_listener(void *ctx, int listen_fd, uint16_t port)
{
	struct server *s = ctx;

	s->calls++;
	if (s->refuse) {
		close(listen_fd);
		return s->refuse;
	}
	s->listen_fd = listen_fd;
	s->port = port;
	if (pthread_create(&s->thread, NULL, serve, s)) {
		close(listen_fd);
		s->listen_fd = -1;
		return -EAGAIN;
	}
	s->started = true;
	return 0;
}

static int collect(void *ctx, const char *data, size_t len)
{
	struct server *s = ctx;

	buf_add(s->out, data, len);
	return 0;
}

static struct sbx_policy *net_policy(enum sbx_net net)
{
	struct sbx_policy *p = sbx_policy_new();

	CU_ASSERT_EQUAL(sbx_policy_add_ro(p, OLP_PROBE_PATH), 0);
	sbx_policy_set_timeout_ms(p, 60000);
	sbx_policy_set_net(p, net, NET_PORT);
	return p;
}

/* One run of "olp-probe net" under a policy with mode net; the server answers when the run
 * hands it a listener. Returns sbx_run's value; s->out gets the probe's line. */
static int run_net(enum sbx_net net, struct server *s, struct sbx_result *res)
{
	struct sbx_policy *p = net_policy(net);
	char port[16], hport[16];
	struct sbx_callbacks cb = { .on_stdout = collect, .on_listener = on_listener, .ctx = s };
	struct sbx_run_options opt = { .hangup_fd = -1 };
	const char *argv[] = { OLP_PROBE_PATH, "net", port, hport, unix_path, NULL };
	int ret;

	snprintf(port, sizeof(port), "%d", NET_PORT);
	snprintf(hport, sizeof(hport), "%u", (unsigned)host_port);
	s->listen_fd = -1;
	CU_ASSERT_FATAL(pipe2(s->stop, O_CLOEXEC) == 0);
	ret = sbx_run(p, argv, &opt, &cb, res);
	if (s->started) {
		(void)!write(s->stop[1], "x", 1);
		pthread_join(s->thread, NULL);
		s->started = false;
	}
	if (s->listen_fd >= 0)
		close(s->listen_fd);
	close(s->stop[0]);
	close(s->stop[1]);
	sbx_policy_free(p);
	return ret;
}

/* The descriptors of this process whose link starts with kind ("socket:", "net:"). */
static int count_kind(const char *kind)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	char path[300], link[128];
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d))) {
		ssize_t l;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		l = readlink(path, link, sizeof(link) - 1);
		if (l > 0) {
			link[l] = '\0';
			n += !strncmp(link, kind, strlen(kind));
		}
	}
	closedir(d);
	return n;
}

/* The integer after "key": in the probe's line, or -100 when it is not there. */
static int json_int(const char *line, const char *key)
{
	char k[64];
	const char *p;

	snprintf(k, sizeof(k), "\"%s\":", key);
	p = strstr(line, k);
	return p ? atoi(p + strlen(k)) : -100;
}

/* The string after "key": in the probe's line, into out. */
static const char *json_str(const char *line, const char *key, char *out, size_t len)
{
	char k[64];
	const char *p;
	size_t n;

	snprintf(k, sizeof(k), "\"%s\":\"", key);
	p = strstr(line, k);
	out[0] = '\0';
	if (!p)
		return out;
	p += strlen(k);
	n = strcspn(p, "\"");
	snprintf(out, len, "%.*s", (int)(n < len ? n : len - 1), p);
	return out;
}

static void own_netns(char *out, size_t len)
{
	ssize_t n = readlink("/proc/self/ns/net", out, len - 1);

	out[n > 0 ? n : 0] = '\0';
}

#define SHOW_ON_FAIL(cond, line)                                         \
	do {                                                             \
		CU_ASSERT(cond);                                         \
		if (!(cond))                                             \
			fprintf(stderr, "\n  probe said: %s\n", (line)); \
	} while (0)

/* What a loopback run must see: the listener and nothing else. */
static void check_loopback(const char *line)
{
	char v[64], host[64];

	SHOW_ON_FAIL(strstr(line, "\"listener\":\"ok\",\"reply\":\"pong\"") != NULL, line);
	/* The host's loopback is another loopback: nothing listens on that port here. */
	SHOW_ON_FAIL(!strcmp(json_str(line, "host_lo", v, sizeof(v)), "ECONNREFUSED"), line);
	SHOW_ON_FAIL(strstr(line, "\"udp\":[\"ENETUNREACH\",\"ENETUNREACH\",\"ENETUNREACH\"]") !=
			     NULL,
		     line);
	SHOW_ON_FAIL(json_int(line, "tcp_host_port") == 0, line);
	SHOW_ON_FAIL(json_int(line, "tcp6_host_port") != 1, line);
	SHOW_ON_FAIL(json_int(line, "unix_host_path") == 0, line);
	SHOW_ON_FAIL(!strcmp(json_str(line, "ifaces", v, sizeof(v)), "lo"), line);
	SHOW_ON_FAIL(strstr(line, "\"fds\":[0,1,2],\"fd0_socket\":false") != NULL, line);
	own_netns(host, sizeof(host));
	SHOW_ON_FAIL(strcmp(json_str(line, "netns", v, sizeof(v)), host) != 0, line);
}

/* Descriptors a worker may hold when it spawns (no close-on-exec, as libfcgi's): fd 0 a
 * listening socket, a file, a socket. None may reach the run. */
struct decoys {
	int saved0, lsock, file, sock;
};

static void decoys_open(struct decoys *d)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };

	d->saved0 = dup(0);
	d->lsock = socket(AF_INET, SOCK_STREAM, 0);
	CU_ASSERT_FATAL(d->lsock >= 0 && bind(d->lsock, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
			listen(d->lsock, 4) == 0);
	CU_ASSERT_FATAL(dup2(d->lsock, 0) == 0);
	d->file = open("/etc/hostname", O_RDONLY);
	d->sock = socket(AF_INET6, SOCK_STREAM, 0);
}

static void decoys_close(struct decoys *d)
{
	dup2(d->saved0, 0);
	close(d->saved0);
	close(d->lsock);
	if (d->file >= 0)
		close(d->file);
	if (d->sock >= 0)
		close(d->sock);
}

static struct sbx_global_config base_cfg(void)
{
	return (struct sbx_global_config){ .mode = SBX_MODE_BWRAP,
					   .runtime_dir = runtime_dir,
					   .exec_stub = OLP_SANDBOX_EXEC_PATH };
}

/* ---- tests -------------------------------------------------------------------------- */

static void test_loopback_cold(void)
{
	struct buf out = BUF_INIT, out2 = BUF_INIT;
	struct server s = { .out = &out };
	struct sbx_result res;
	struct decoys d;
	char ns1[64], ns2[64];
	int socks = count_kind("socket:"), nets = count_kind("net:");

	decoys_open(&d);
	CU_ASSERT_EQUAL(run_net(SBX_NET_LOOPBACK, &s, &res), 0);
	decoys_close(&d);
	CU_ASSERT_EQUAL(res.end, SBX_END_EXITED);
	CU_ASSERT_EQUAL(res.exit_status, 0);
	CU_ASSERT_EQUAL(res.failure, SBX_FAIL_NONE);
	CU_ASSERT_EQUAL(s.calls, 1);
	CU_ASSERT_EQUAL(s.port, NET_PORT);
	CU_ASSERT_EQUAL(s.accepted, 1);
	if (res.failure)
		fprintf(stderr, "\n  %s: %s; %s\n", res.spawn_stage, strerror(res.spawn_errno),
			res.stderr_tail);
	check_loopback(out.data);
	/* A second run: a namespace of its own, never the first one's. */
	s = (struct server){ .out = &out2 };
	CU_ASSERT_EQUAL(run_net(SBX_NET_LOOPBACK, &s, &res), 0);
	check_loopback(out2.data);
	CU_ASSERT_STRING_NOT_EQUAL(json_str(out.data, "netns", ns1, sizeof(ns1)),
				   json_str(out2.data, "netns", ns2, sizeof(ns2)));
	/* Nothing of the runs' stays open here: listener closed by us, namespace by sbx_run. */
	CU_ASSERT_EQUAL(count_kind("socket:"), socks);
	CU_ASSERT_EQUAL(count_kind("net:"), nets);
	buf_release(&out);
	buf_release(&out2);
}

/* on_listener refuses: nothing runs, and the caller learns why. */
static void check_refused(int refuse, bool no_callback, bool warm)
{
	struct buf out = BUF_INIT;
	struct server s = { .out = &out, .refuse = refuse };
	struct sbx_policy *p = net_policy(SBX_NET_LOOPBACK);
	struct sbx_callbacks cb = { .on_stdout = collect, .on_listener = on_listener, .ctx = &s };
	struct sbx_result res;
	int socks = count_kind("socket:");
	int want = no_callback ? -EINVAL : refuse;

	if (no_callback)
		cb.on_listener = NULL;
	/* A command that would say something if it ran. */
	CU_ASSERT_EQUAL(
		sbx_run(p, (const char *const[]){ "/usr/bin/echo", "ran", NULL }, NULL, &cb, &res),
		want);
	CU_ASSERT_EQUAL(res.end, SBX_END_SPAWN_FAILED);
	CU_ASSERT_EQUAL(res.failure, SBX_FAIL_NETWORK);
	CU_ASSERT_PTR_NOT_NULL_FATAL(res.spawn_stage);
	CU_ASSERT_STRING_EQUAL(res.spawn_stage, "listener");
	CU_ASSERT_EQUAL(res.spawn_errno, -want);
	CU_ASSERT_EQUAL(out.len, 0);
	CU_ASSERT_EQUAL(res.stdout_bytes, 0);
	CU_ASSERT_EQUAL(s.calls, no_callback ? 0 : 1);
	/* Its listener closed; a warm sandbox taken for it is gone too, with its own. */
	if (warm) {
		CU_ASSERT(count_kind("socket:") < socks);
	} else {
		CU_ASSERT_EQUAL(count_kind("socket:"), socks);
	}
	CU_ASSERT_STRING_EQUAL(sbx_failure_str(res.failure), "network");
	sbx_policy_free(p);
	buf_release(&out);
}

static void test_listener_refused(void)
{
	check_refused(-ECONNABORTED, false, false);
	check_refused(-EMFILE, false, false);
	check_refused(0, true, false);
}

/* HOST is the host's network: what loopback hides is there, so the checks above can fail. */
static void test_host_sees_host(void)
{
	struct buf out = BUF_INIT;
	struct server s = { .out = &out };
	struct sbx_result res;
	char v[64], host[64];

	CU_ASSERT_EQUAL(run_net(SBX_NET_HOST, &s, &res), 0);
	CU_ASSERT_EQUAL(res.exit_status, 0);
	CU_ASSERT_EQUAL(s.calls, 0);
	SHOW_ON_FAIL(!strcmp(json_str(out.data, "host_lo", v, sizeof(v)), "ok"), out.data);
	SHOW_ON_FAIL(json_int(out.data, "tcp_host_port") == 1, out.data);
	if (host6_fd >= 0) {
		SHOW_ON_FAIL(json_int(out.data, "tcp6_host_port") == 1, out.data);
	}
	SHOW_ON_FAIL(json_int(out.data, "unix_host_path") == 1, out.data);
	own_netns(host, sizeof(host));
	SHOW_ON_FAIL(!strcmp(json_str(out.data, "netns", v, sizeof(v)), host), out.data);
	SHOW_ON_FAIL(strstr(out.data, "\"fds\":[0,1,2],") != NULL, out.data);
	buf_release(&out);
}

/* NONE: a namespace with nothing, not even lo up. */
static void test_none_sees_nothing(void)
{
	struct buf out = BUF_INIT;
	struct server s = { .out = &out };
	struct sbx_result res;
	char v[64];

	CU_ASSERT_EQUAL(run_net(SBX_NET_NONE, &s, &res), 0);
	CU_ASSERT_EQUAL(res.exit_status, 0);
	CU_ASSERT_EQUAL(s.calls, 0);
	SHOW_ON_FAIL(strcmp(json_str(out.data, "listener", v, sizeof(v)), "ok") != 0, out.data);
	SHOW_ON_FAIL(strcmp(json_str(out.data, "host_lo", v, sizeof(v)), "ok") != 0, out.data);
	SHOW_ON_FAIL(strstr(out.data,
			    "\"udp\":[\"ENETUNREACH\",\"ENETUNREACH\",\"ENETUNREACH\"]") != NULL,
		     out.data);
	SHOW_ON_FAIL(json_int(out.data, "tcp_host_port") == 0, out.data);
	SHOW_ON_FAIL(json_int(out.data, "unix_host_path") == 0, out.data);
	SHOW_ON_FAIL(!strcmp(json_str(out.data, "ifaces", v, sizeof(v)), "lo"), out.data);
	buf_release(&out);
}

/* Warm: a loopback sandbox is made in its own namespace ahead of time, keeps its listener
 * until taken, and is never confused with a HOST one (same bwrap argv). */
static void test_loopback_warm(void)
{
	struct sbx_global_config cfg = base_cfg();
	struct buf out[4] = { BUF_INIT, BUF_INIT, BUF_INIT, BUF_INIT };
	struct server s;
	struct sbx_result res;
	char ns1[64], ns2[64], v[64];
	int socks = count_kind("socket:"), nets = count_kind("net:");

	cfg.warm = true;
	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	s = (struct server){ .out = &out[0] };
	CU_ASSERT_EQUAL(run_net(SBX_NET_LOOPBACK, &s, &res), 0);
	check_loopback(out[0].data);
	CU_ASSERT(sbx_warm_count() >= 1);
	/* Each waiting loopback sandbox holds its listener here, close-on-exec. */
	CU_ASSERT(count_kind("socket:") > socks);
	usleep(300000); /* let them finish building */
	s = (struct server){ .out = &out[1] };
	CU_ASSERT_EQUAL(run_net(SBX_NET_LOOPBACK, &s, &res), 0);
	CU_ASSERT_EQUAL(s.calls, 1);
	CU_ASSERT_EQUAL(s.accepted, 1);
	check_loopback(out[1].data);
	CU_ASSERT_STRING_NOT_EQUAL(json_str(out[0].data, "netns", ns1, sizeof(ns1)),
				   json_str(out[1].data, "netns", ns2, sizeof(ns2)));
	/* A HOST run never gets a loopback sandbox, nor the other way round. */
	s = (struct server){ .out = &out[2] };
	CU_ASSERT_EQUAL(run_net(SBX_NET_HOST, &s, &res), 0);
	SHOW_ON_FAIL(!strcmp(json_str(out[2].data, "host_lo", v, sizeof(v)), "ok"), out[2].data);
	CU_ASSERT_EQUAL(s.calls, 0);
	usleep(300000);
	s = (struct server){ .out = &out[3] };
	CU_ASSERT_EQUAL(run_net(SBX_NET_LOOPBACK, &s, &res), 0);
	check_loopback(out[3].data);
	/* A warm sandbox whose listener is refused is put down; nothing runs. */
	check_refused(-ECONNABORTED, false, true);
	/* Shut down: every warm sandbox goes, with its listener and namespace. */
	sbx_warm_shutdown();
	CU_ASSERT_EQUAL(sbx_warm_count(), 0);
	CU_ASSERT_EQUAL(count_kind("socket:"), socks);
	CU_ASSERT_EQUAL(count_kind("net:"), nets);
	cfg.warm = false;
	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	for (int i = 0; i < 4; i++)
		buf_release(&out[i]);
}

/* Where no namespace can be had, a loopback run never runs with more network instead. */
static void check_refused_here(const struct sbx_global_config *cfg, const char *stage)
{
	struct buf out = BUF_INIT;
	struct server s = { .out = &out };
	struct sbx_result res;

	CU_ASSERT_FATAL(sbx_global_init(cfg) == 0);
	CU_ASSERT_EQUAL(run_net(SBX_NET_LOOPBACK, &s, &res), -EOPNOTSUPP);
	CU_ASSERT_EQUAL(res.end, SBX_END_SPAWN_FAILED);
	CU_ASSERT_EQUAL(res.failure, SBX_FAIL_NETWORK);
	CU_ASSERT_EQUAL(res.spawn_errno, EOPNOTSUPP);
	CU_ASSERT_PTR_NOT_NULL_FATAL(res.spawn_stage);
	CU_ASSERT_STRING_EQUAL(res.spawn_stage, stage);
	CU_ASSERT_EQUAL(s.calls, 0);
	CU_ASSERT_EQUAL(out.len, 0);
	buf_release(&out);
}

static void test_mode_off_refuses(void)
{
	struct sbx_global_config cfg = base_cfg();

	cfg.mode = SBX_MODE_OFF;
	check_refused_here(&cfg, "netns (sandbox mode off)");
	cfg = base_cfg();
	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
}

/* Identity shared (a non-root worker only): no user namespace of the run's, so the
 * namespace comes with one of its own, which bwrap nests inside. The same view as per run,
 * cold and warm. A root worker refuses shared identity altogether: nothing runs. */
static void test_identity_shared(void)
{
	struct sbx_global_config cfg = base_cfg();
	struct buf out[3] = { BUF_INIT, BUF_INIT, BUF_INIT };
	struct server s = { .out = &out[0] };
	struct sbx_result res;
	int socks = count_kind("socket:"), nets = count_kind("net:"), users;

	cfg.identity = SBX_IDENTITY_SHARED;
	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	users = count_kind("user:");
	if (geteuid() == 0) {
		CU_ASSERT_NOT_EQUAL(run_net(SBX_NET_LOOPBACK, &s, &res), 0);
		CU_ASSERT_EQUAL(res.end, SBX_END_SPAWN_FAILED);
		CU_ASSERT_EQUAL(s.calls, 0);
		CU_ASSERT_EQUAL(out[0].len, 0);
		goto out;
	}
	CU_ASSERT_EQUAL(run_net(SBX_NET_LOOPBACK, &s, &res), 0);
	CU_ASSERT_EQUAL(res.exit_status, 0);
	CU_ASSERT_EQUAL(s.accepted, 1);
	if (res.failure)
		fprintf(stderr, "\n  %s: %s; %s\n", res.spawn_stage, strerror(res.spawn_errno),
			res.stderr_tail);
	check_loopback(out[0].data);
	/* The user namespace made for it is the run's only: none stays open here. */
	CU_ASSERT_EQUAL(count_kind("user:"), users);
	cfg.warm = true;
	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	s = (struct server){ .out = &out[1] };
	CU_ASSERT_EQUAL(run_net(SBX_NET_LOOPBACK, &s, &res), 0);
	check_loopback(out[1].data);
	usleep(300000);
	s = (struct server){ .out = &out[2] };
	CU_ASSERT_EQUAL(run_net(SBX_NET_LOOPBACK, &s, &res), 0);
	CU_ASSERT_EQUAL(s.accepted, 1);
	check_loopback(out[2].data);
	sbx_warm_shutdown();
	CU_ASSERT_EQUAL(count_kind("socket:"), socks);
	CU_ASSERT_EQUAL(count_kind("net:"), nets);
out:
	cfg = base_cfg();
	CU_ASSERT_FATAL(sbx_global_init(&cfg) == 0);
	for (int i = 0; i < 3; i++)
		buf_release(&out[i]);
}

/* ---- main --------------------------------------------------------------------------- */

static int host_services(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
	struct sockaddr_un u = { .sun_family = AF_UNIX };
	socklen_t alen = sizeof(a);

	host_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (host_fd < 0 || bind(host_fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    listen(host_fd, 8) < 0 || getsockname(host_fd, (struct sockaddr *)&a, &alen) < 0)
		return -1;
	host_port = ntohs(a.sin_port);
	/* The same port on ::1, when the host has IPv6: /proc/net/tcp6 must not show it. */
	a6.sin6_port = a.sin_port;
	host6_fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (host6_fd >= 0 &&
	    (bind(host6_fd, (struct sockaddr *)&a6, sizeof(a6)) < 0 || listen(host6_fd, 8) < 0)) {
		close(host6_fd);
		host6_fd = -1;
	}
	if (!mkdtemp(unix_dir))
		return -1;
	snprintf(unix_path, sizeof(unix_path), "%s/fcgi.sock", unix_dir);
	memcpy(u.sun_path, unix_path, sizeof(unix_path));
	unix_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (unix_fd < 0 || bind(unix_fd, (struct sockaddr *)&u, sizeof(u)) < 0 ||
	    listen(unix_fd, 8) < 0)
		return -1;
	return 0;
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "loopback, cold", test_loopback_cold },
		{ "on_listener refuses: nothing runs", test_listener_refused },
		{ "host sees the host", test_host_sees_host },
		{ "none sees nothing", test_none_sees_nothing },
		{ "loopback, warm", test_loopback_warm },
		{ "mode off refuses loopback", test_mode_off_refuses },
		{ "identity shared", test_identity_shared },
		{ NULL, NULL },
	};
	struct sbx_global_config cfg;
	const struct sbx_status *st;
	int fails;

	if (!mkdtemp(runtime_dir) || host_services()) {
		perror("setup");
		return 1;
	}
	cfg = base_cfg();
	if (sbx_global_init(&cfg)) {
		fprintf(stderr, "sbx_global_init failed\n");
		return 1;
	}
	/* As the worker does: before any thread, the uid-map helper forked first. */
	if (sbx_lockdown_self()) {
		fprintf(stderr, "sbx_lockdown_self failed\n");
		return 1;
	}
	st = sbx_status_get();
	if (!st->available || strcmp(st->identity, "per_run")) {
		printf("SKIP: no sandbox with a uid per run here: %s\n",
		       st->message ? st->message : st->identity_detail);
		return SKIP;
	}
	fails = ts_cunit_run("sandbox network", tests);
	sbx_global_release();
	rmdir(runtime_dir);
	close(unix_fd);
	unlink(unix_path);
	rmdir(unix_dir);
	return ts_exit_status(fails);
}
