/* CUnit suite for sbx_netns_init (sandbox/netns.c): a run's own network namespace with
 * only loopback and a listener in it. Public header only.
 *
 * A probe process joins the namespace the way the spawned child will (the user namespace
 * first when there is one, then the network namespace) and reports what it sees: the
 * listener accepts it, `lo` is its only interface, the host's loopback listener and the
 * metadata, private and documentation addresses are out of reach, /proc/net shows none of
 * the host's sockets. Runs as root (with and without a user namespace) and as any other
 * user (with a user namespace the test makes, mapping only its own uid); CTest runs it
 * again as www-data when it is root (netns-as-www-data.sh).
 *
 * Exits 77 (CTest SKIP) when this host cannot make the namespaces at all (a container
 * without CAP_SYS_ADMIN and user namespaces disabled), saying why. */
#include "tests/support/cunit.h"
#include "tests/support/support.h"
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "sandbox/sandbox.h"
#include "common/banned.h"

#define SKIP 77

/* What the probe saw from inside. */
struct probe_report {
	int joined_err;	   /* errno of the setns calls, 0 */
	int connect_err;   /* connect to the namespace's listener */
	int n_ifaces;	   /* interfaces if_nameindex lists */
	char ifaces[128];  /* their names, space-separated */
	int host_lo_err;   /* connect to the host's loopback listener */
	int udp_err[3];	   /* UDP connect to 169.254.169.254, 10.0.0.1, 192.0.2.1 */
	int udp6_err;	   /* UDP connect to 2001:db8::1 */
	int host_in_proc;  /* the host listener's port appears in /proc/net/tcp */
	int sees_listener; /* the namespace's own listener appears there */
};

static int host_listen_fd = -1;
static uint16_t host_port;
static int own_userns = -1; /* a user namespace made by the test, or -1 */

/* ---- helpers ------------------------------------------------------------------------ */

/* A user namespace like ident.c's per-slot one, as far as this process can make it: root
 * maps 0 -> 0 and 1000 -> an unused high uid; anyone else maps 0 -> itself only. Its fd,
 * or -errno. */
static int make_userns(void)
{
	char path[64], map[96];
	int go[2], fd = -1, ret = 0, st;
	pid_t pid;

	if (pipe2(go, O_CLOEXEC) < 0)
		return -errno;
	pid = (pid_t)syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, NULL, NULL, NULL, NULL);
	if (pid == 0) {
		char c;

		close(go[1]);
		_exit(read(go[0], &c, 1) < 0);
	}
	close(go[0]);
	if (pid < 0) {
		close(go[1]);
		return -errno;
	}
	snprintf(path, sizeof(path), "/proc/%d/setgroups", (int)pid);
	if (geteuid() != 0)
		ret = write_control_file(path, "deny");
	snprintf(path, sizeof(path), "/proc/%d/uid_map", (int)pid);
	if (geteuid() == 0)
		snprintf(map, sizeof(map), "0 0 1\n1000 %u 1\n", 0x70000000u + 4242u);
	else
		snprintf(map, sizeof(map), "0 %u 1\n", (unsigned)geteuid());
	if (!ret)
		ret = write_control_file(path, map);
	snprintf(path, sizeof(path), "/proc/%d/gid_map", (int)pid);
	if (geteuid() == 0)
		snprintf(map, sizeof(map), "0 0 1\n1000 %u 1\n", 0x70000000u + 4242u);
	else
		snprintf(map, sizeof(map), "0 %u 1\n", (unsigned)getegid());
	if (!ret)
		ret = write_control_file(path, map);
	if (!ret) {
		snprintf(path, sizeof(path), "/proc/%d/ns/user", (int)pid);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			ret = -errno;
	}
	close(go[1]);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return ret ? ret : fd;
}

static int udp_connect(int family, const char *addr)
{
	struct sockaddr_storage ss = { 0 };
	socklen_t len;
	int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0), err = 0;

	if (fd < 0)
		return errno;
	if (family == AF_INET) {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;

		a->sin_family = AF_INET;
		a->sin_port = htons(53);
		inet_pton(AF_INET, addr, &a->sin_addr);
		len = sizeof(*a);
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;

		a->sin6_family = AF_INET6;
		a->sin6_port = htons(53);
		inet_pton(AF_INET6, addr, &a->sin6_addr);
		len = sizeof(*a);
	}
	if (connect(fd, (struct sockaddr *)&ss, len) < 0)
		err = errno;
	close(fd);
	return err;
}

static int tcp_connect_lo(uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), err = 0;

	if (fd < 0)
		return errno;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		err = errno;
	/* Left open on success: the parent accepts it and reads a byte. */
	if (!err && write(fd, "x", 1) != 1)
		err = errno;
	if (err)
		close(fd);
	return err;
}

/* Whether port appears as a local port in this process's /proc/net/tcp. */
static int port_in_proc(uint16_t port)
{
	struct buf b = BUF_INIT;
	char key[16];
	int found;

	snprintf(key, sizeof(key), ":%04X ", port);
	if (buf_read_file(&b, "/proc/self/net/tcp", 1 << 20)) {
		buf_release(&b);
		return -1;
	}
	found = strstr(b.data, key) != NULL;
	buf_release(&b);
	return found;
}

/* In the forked probe: join as the spawned child will, look around, report. */
static void __attribute__((noreturn)) probe_main(int out, int userns_fd, const struct sbx_netns *ns)
{
	struct probe_report r = { 0 };
	struct if_nameindex *ifs;

	if ((userns_fd >= 0 && setns(userns_fd, CLONE_NEWUSER) < 0) ||
	    setns(ns->netns_fd, CLONE_NEWNET) < 0) {
		r.joined_err = errno;
		goto out;
	}
	r.connect_err = tcp_connect_lo(ns->port);
	ifs = if_nameindex();
	for (struct if_nameindex *i = ifs; i && i->if_index; i++) {
		size_t l = strlen(r.ifaces);

		r.n_ifaces++;
		snprintf(r.ifaces + l, sizeof(r.ifaces) - l, "%s%s", l ? " " : "", i->if_name);
	}
	if (ifs)
		if_freenameindex(ifs);
	r.host_lo_err = tcp_connect_lo(host_port);
	r.udp_err[0] = udp_connect(AF_INET, "169.254.169.254");
	r.udp_err[1] = udp_connect(AF_INET, "10.0.0.1");
	r.udp_err[2] = udp_connect(AF_INET, "192.0.2.1");
	r.udp6_err = udp_connect(AF_INET6, "2001:db8::1");
	r.host_in_proc = port_in_proc(host_port);
	r.sees_listener = port_in_proc(ns->port);
out:
	_exit(write(out, &r, sizeof(r)) == (ssize_t)sizeof(r) ? 0 : 1);
}

static int run_probe(int userns_fd, const struct sbx_netns *ns, struct probe_report *r)
{
	int p[2], st, ret = 0;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	pid = fork();
	if (pid == 0) {
		close(p[0]);
		probe_main(p[1], userns_fd, ns);
	}
	close(p[1]);
	if (pid < 0 || read(p[0], r, sizeof(*r)) != (ssize_t)sizeof(*r))
		ret = -EIO;
	close(p[0]);
	if (pid > 0)
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
	return ret;
}

/* The namespace as the spec asks, seen by a probe that joined it. */
static void check_namespace(int userns_fd, const struct sbx_netns *ns)
{
	struct probe_report r = { 0 };
	struct pollfd pfd = { .fd = ns->listen_fd, .events = POLLIN };
	char c = 0;
	int conn;

	CU_ASSERT_EQUAL_FATAL(run_probe(userns_fd, ns, &r), 0);
	CU_ASSERT_EQUAL(r.joined_err, 0);
	if (r.joined_err)
		fprintf(stderr, "probe could not join: %s\n", strerror(r.joined_err));
	/* The listener, made before anyone joined, takes the probe's connection. */
	CU_ASSERT_EQUAL(r.connect_err, 0);
	CU_ASSERT_EQUAL(poll(&pfd, 1, 2000), 1);
	conn = accept4(ns->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	CU_ASSERT(conn >= 0);
	if (conn >= 0) {
		CU_ASSERT_EQUAL(read(conn, &c, 1), 1);
		CU_ASSERT_EQUAL(c, 'x');
		close(conn);
	}
	/* Only lo. */
	CU_ASSERT_EQUAL(r.n_ifaces, 1);
	CU_ASSERT_STRING_EQUAL(r.ifaces, "lo");
	/* The host's loopback is another loopback: nothing listens there. */
	CU_ASSERT_EQUAL(r.host_lo_err, ECONNREFUSED);
	/* No route: metadata, a private range, a documentation range, IPv6. */
	CU_ASSERT_EQUAL(r.udp_err[0], ENETUNREACH);
	CU_ASSERT_EQUAL(r.udp_err[1], ENETUNREACH);
	CU_ASSERT_EQUAL(r.udp_err[2], ENETUNREACH);
	CU_ASSERT_EQUAL(r.udp6_err, ENETUNREACH);
	/* /proc/net is the namespace's: its own listener, not the host's. */
	CU_ASSERT_EQUAL(r.host_in_proc, 0);
	CU_ASSERT_EQUAL(r.sees_listener, 1);
}

static ino_t own_netns_ino(void)
{
	struct stat st;

	return stat("/proc/thread-self/ns/net", &st) == 0 ? st.st_ino : 0;
}

/* ---- tests -------------------------------------------------------------------------- */

static void test_with_userns(void)
{
	struct sbx_netns ns;
	ino_t before = own_netns_ino();

	if (own_userns < 0) {
		fprintf(stderr, "(no user namespace on this host: skipped) ");
		return;
	}
	CU_ASSERT_EQUAL_FATAL(sbx_netns_init(&ns, own_userns, 0), 0);
	CU_ASSERT(ns.listen_fd >= 0);
	CU_ASSERT(ns.netns_fd >= 0);
	CU_ASSERT(ns.port != 0);
	/* Close-on-exec: neither may reach a command the worker spawns. */
	CU_ASSERT(fcntl(ns.listen_fd, F_GETFD) & FD_CLOEXEC);
	CU_ASSERT(fcntl(ns.netns_fd, F_GETFD) & FD_CLOEXEC);
	check_namespace(own_userns, &ns);
	/* The caller's own namespace never changed. */
	CU_ASSERT_EQUAL(own_netns_ino(), before);
	sbx_netns_release(&ns);
	CU_ASSERT_EQUAL(ns.listen_fd, -1);
	CU_ASSERT_EQUAL(ns.netns_fd, -1);
}

static void test_root_without_userns(void)
{
	struct sbx_netns ns;

	if (geteuid() != 0) {
		/* Without CAP_SYS_ADMIN and without a user namespace: refused, cleanly. */
		int before = ts_count_fds();

		CU_ASSERT_EQUAL(sbx_netns_init(&ns, -1, 0), -EPERM);
		CU_ASSERT_EQUAL(ns.listen_fd, -1);
		CU_ASSERT_EQUAL(ts_count_fds(), before);
		return;
	}
	CU_ASSERT_EQUAL_FATAL(sbx_netns_init(&ns, -1, 0), 0);
	check_namespace(-1, &ns);
	sbx_netns_release(&ns);
}

/* A fixed port is free in every new namespace: two at once on the same number. */
static void test_same_port_twice(void)
{
	struct sbx_netns a, b;
	int u = geteuid() == 0 ? -1 : own_userns;

	if (geteuid() != 0 && own_userns < 0)
		return;
	CU_ASSERT_EQUAL_FATAL(sbx_netns_init(&a, u, 48123), 0);
	CU_ASSERT_EQUAL(a.port, 48123);
	CU_ASSERT_EQUAL(sbx_netns_init(&b, u, 48123), 0);
	CU_ASSERT_EQUAL(b.port, 48123);
	if (b.netns_fd >= 0)
		check_namespace(u, &b);
	sbx_netns_release(&a);
	sbx_netns_release(&b);
}

/* A descriptor that is no user namespace: -EINVAL, nothing leaked, nothing left. */
static void test_bad_userns(void)
{
	struct sbx_netns ns;
	int fd = open("/dev/null", O_RDONLY | O_CLOEXEC), before = ts_count_fds();

	CU_ASSERT_EQUAL(sbx_netns_init(&ns, fd, 0), -EINVAL);
	CU_ASSERT_EQUAL(ns.listen_fd, -1);
	CU_ASSERT_EQUAL(ns.netns_fd, -1);
	CU_ASSERT_EQUAL(ts_count_fds(), before);
	close(fd);
}

/* Many threads may make namespaces at once; each gets its own. */
#define N_PAR 8
static void *par_one(void *arg)
{
	struct sbx_netns *ns = arg;

	return (void *)(intptr_t)sbx_netns_init(ns, geteuid() == 0 ? -1 : own_userns, 0);
}

static void test_concurrent(void)
{
	struct sbx_netns ns[N_PAR];
	pthread_t t[N_PAR];
	uint64_t t0 = mono_ns();
	struct stat s0, s1;

	if (geteuid() != 0 && own_userns < 0)
		return;
	for (int i = 0; i < N_PAR; i++)
		CU_ASSERT_EQUAL_FATAL(pthread_create(&t[i], NULL, par_one, &ns[i]), 0);
	for (int i = 0; i < N_PAR; i++) {
		void *rv;

		pthread_join(t[i], &rv);
		CU_ASSERT_EQUAL((intptr_t)rv, 0);
	}
	fprintf(stderr, "(%d namespaces in %.2f ms) ", N_PAR, (double)(mono_ns() - t0) / 1e6);
	CU_ASSERT_EQUAL(fstat(ns[0].netns_fd, &s0), 0);
	CU_ASSERT_EQUAL(fstat(ns[1].netns_fd, &s1), 0);
	CU_ASSERT_NOT_EQUAL(s0.st_ino, s1.st_ino);
	for (int i = 0; i < N_PAR; i++)
		sbx_netns_release(&ns[i]);
}

/* ---- main --------------------------------------------------------------------------- */

/* Can this host make a network namespace at all (one way or the other)? */
static int namespaces_possible(const char **why)
{
	struct sbx_netns ns;
	int rc;

	if (geteuid() == 0) {
		rc = sbx_netns_init(&ns, -1, 0);
		if (rc == 0) {
			sbx_netns_release(&ns);
			return 1;
		}
		*why = "root cannot unshare a network namespace here (no CAP_SYS_ADMIN?)";
		return 0;
	}
	if (own_userns < 0) {
		*why = "this user cannot make a user namespace (user.max_user_namespaces, "
		       "kernel.unprivileged_userns_clone or an LSM forbid it)";
		return 0;
	}
	rc = sbx_netns_init(&ns, own_userns, 0);
	if (rc == 0) {
		sbx_netns_release(&ns);
		return 1;
	}
	*why = "a network namespace cannot be made inside a user namespace here";
	return 0;
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "inside a user namespace", test_with_userns },
		{ "without a user namespace", test_root_without_userns },
		{ "the same port in two namespaces", test_same_port_twice },
		{ "not a user namespace", test_bad_userns },
		{ "from several threads at once", test_concurrent },
		{ NULL, NULL },
	};
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t alen = sizeof(a);
	const char *why = NULL;
	int fails;

	/* A host loopback service the probe must not reach. */
	host_listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (host_listen_fd < 0 || bind(host_listen_fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    listen(host_listen_fd, 8) < 0 ||
	    getsockname(host_listen_fd, (struct sockaddr *)&a, &alen) < 0) {
		perror("host listener");
		return 1;
	}
	host_port = ntohs(a.sin_port);
	own_userns = make_userns();
	if (own_userns < 0)
		own_userns = -1;
	if (!namespaces_possible(&why)) {
		printf("SKIP: %s\n", why);
		return SKIP;
	}
	fails = ts_cunit_run("netns", tests);
	if (own_userns >= 0)
		close(own_userns);
	close(host_listen_fd);
	return ts_exit_status(fails);
}
