/* CUnit suite for the addresses a CONNECT tunnel may reach (egress/addr.c, issue 22 item
 * 9), through egress.h, with real name resolution and real addresses.
 *
 * The suite runs in network and mount namespaces of its own (a user namespace too when not
 * root), where it owns everything the forwarder looks at: loopback carries the addresses
 * this "machine" has (198.51.100.7, a public-looking address as a VPS's would be, and
 * 10.0.0.5, 100.100.100.200, fd00:ec2::254), one service listens on all of them at once
 * (bound to [::] / 0.0.0.0, as the was), and /etc/hosts is a file of the suite's,
 * bound over the host's, so that listed names resolve through glibc as they would from DNS.
 * A host that cannot make the namespaces skips the suite (77) and says why. */
#include "tests/support/cunit.h"
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/ipv6.h>

#include "common/common.h"
#include "egress/egress.h"
#include "common/banned.h"

static char hosts_path[] = "/tmp/olp-connect-hosts-XXXXXX";
static int service_fd = -1; /* listens on every address of the namespace */
static uint16_t service_port;
static bool have_v6; /* fd00:ec2::254 could be given to loopback */

/* ---- the namespace ------------------------------------------------------------------ */

static int write_file(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC), ret = 0;

	if (fd < 0)
		return -errno;
	if (write_all(fd, s, strlen(s)))
		ret = -EIO;
	close(fd);
	return ret;
}

/* Network and mount namespaces of our own (and a user namespace that maps us to root in
 * it when we are not root): 0, or -errno. */
static int enter_namespaces(void)
{
	uid_t uid = geteuid();
	gid_t gid = getegid();
	char map[64];

	if (uid == 0)
		return unshare(CLONE_NEWNS | CLONE_NEWNET) < 0 ? -errno : 0;
	if (unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET) < 0)
		return -errno;
	snprintf(map, sizeof(map), "0 %u 1\n", (unsigned)uid);
	if (write_file("/proc/self/uid_map", map) || write_file("/proc/self/setgroups", "deny"))
		return -EPERM;
	snprintf(map, sizeof(map), "0 %u 1\n", (unsigned)gid);
	return write_file("/proc/self/gid_map", map);
}

/* One IPv4 address of ifr's alias (SIOCSIFADDR, SIOCSIFNETMASK...) set to text. */
static int set_v4(int s, unsigned long req, struct ifreq *ifr, const char *text)
{
	struct sockaddr_in a = { .sin_family = AF_INET };

	inet_pton(AF_INET, text, &a.sin_addr);
	memcpy(&ifr->ifr_addr, &a, sizeof(a));
	return ioctl(s, req, ifr) < 0 ? -errno : 0;
}

/* Loopback up, with the IPv4 addresses v4[i]/masks[i] as aliases lo:1..: 0 or -errno. */
static int loopback_setup(const char *const v4[], const char *const masks[], size_t n)
{
	struct ifreq ifr = { .ifr_name = "lo" };
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), ret = 0;

	if (s < 0)
		return -errno;
	if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
		ret = -errno;
	ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
	if (!ret && ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
		ret = -errno;
	for (size_t i = 0; i < n && !ret; i++) {
		memset(&ifr, 0, sizeof(ifr));
		/* A label of a few digits: n is a handful (an unsigned char says so to gcc's
		 * -Wformat-truncation, which the Debug build makes an error). */
		snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo:%u", (unsigned char)(i + 1));
		ret = set_v4(s, SIOCSIFADDR, &ifr, v4[i])
			      ?: set_v4(s, SIOCSIFNETMASK, &ifr, masks[i]);
	}
	close(s);
	return ret;
}

/* fd00:ec2::254/128 on loopback: whether it could be (IPv6 may be off on this host). */
static bool loopback_v6(void)
{
	struct in6_ifreq r = { .ifr6_prefixlen = 128, .ifr6_ifindex = (int)if_nametoindex("lo") };
	int s = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	bool ok;

	if (s < 0)
		return false;
	inet_pton(AF_INET6, "fd00:ec2::254", &r.ifr6_addr);
	ok = ioctl(s, SIOCSIFADDR, &r) == 0;
	close(s);
	return ok;
}

/* The names the suite resolves, bound over /etc/hosts: 0 or -errno. */
static int hosts_setup(void)
{
	static const char hosts[] = "127.0.0.1 localhost\n"
				    "198.51.100.7 lan.test\n"
				    "10.0.0.5 private.test listed.test\n"
				    "172.16.0.1 private172.test\n"
				    "192.168.1.1 private192.test\n"
				    "100.100.100.200 metadata.test\n"
				    "fd00:ec2::254 metadata6.test\n"
				    "::ffff:10.0.0.5 mapped.test\n"
				    "::10.0.0.5 compat.test\n"
				    "64:ff9b::a00:5 nat64.test\n"
				    "2002:a00:5::1 sixtofour.test\n"
				    "203.0.113.9 loprefix.test\n"
				    "198.51.100.9 public.test\n";
	int fd = mkstemp(hosts_path);

	if (fd < 0)
		return -errno;
	if (write_all(fd, hosts, sizeof(hosts) - 1)) {
		close(fd);
		return -EIO;
	}
	close(fd);
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
	    mount(hosts_path, "/etc/hosts", NULL, MS_BIND, NULL) < 0)
		return -errno;
	return 0;
}

/* One TCP service on every address at once: [::] with IPv4 too, or 0.0.0.0. */
static int service_start(void)
{
	struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT };
	struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY) };
	socklen_t l6 = sizeof(a6), l4 = sizeof(a4);
	int off = 0, fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd >= 0 && (setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off)) < 0 ||
			bind(fd, (struct sockaddr *)&a6, sizeof(a6)) < 0 || listen(fd, 16) < 0 ||
			getsockname(fd, (struct sockaddr *)&a6, &l6) < 0)) {
		close(fd);
		fd = -1;
	}
	if (fd >= 0) {
		service_port = ntohs(a6.sin6_port);
	} else {
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0 || bind(fd, (struct sockaddr *)&a4, sizeof(a4)) < 0 ||
		    listen(fd, 16) < 0 || getsockname(fd, (struct sockaddr *)&a4, &l4) < 0)
			return -errno;
		service_port = ntohs(a4.sin_port);
	}
	service_fd = fd;
	return 0;
}

/* ---- a forwarder and one CONNECT ---------------------------------------------------- */

static struct egr_forwarder *fwd(const char *const hosts[], uint16_t *port)
{
	struct egr_route r = { .mode = EGR_MODE_CONNECT,
			       .request_id = "test-connect-addrs",
			       .allow_hosts = hosts };
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 16) < 0 ||
	    getsockname(fd, (struct sockaddr *)&a, &al) < 0) {
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	*port = ntohs(a.sin_port);
	return egr_start(fd, &r, NULL);
}

/* Accept what reached the service, if anything did within ms: the socket or -1. */
static int service_accept(int ms)
{
	struct pollfd p = { .fd = service_fd, .events = POLLIN };

	if (poll(&p, 1, ms) != 1)
		return -1;
	return accept4(service_fd, NULL, NULL, SOCK_CLOEXEC);
}

/* CONNECT host:tport through the forwarder on port: the status it answered with, or -1.
 * With 200, checks that bytes go both ways to the service. */
static int try_connect(uint16_t port, const char *host, unsigned tport)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_port = htons(port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct timeval tv = { .tv_sec = 10 };
	char target[128], req[320], got[64] = "";
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), status = -1, peer;
	ssize_t n;

	snprintf(target, sizeof(target), "%.100s:%u", host, tport);
	snprintf(req, sizeof(req), "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target);
	(void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || write_all(fd, req, strlen(req)))
		goto out;
	/* The status line's start is all this needs: 12 bytes, "HTTP/1.1 NNN". */
	n = recv(fd, got, 12, MSG_WAITALL);
	if (n < 12 || sscanf(got, "HTTP/1.1 %d", &status) != 1)
		goto out;
	if (status == 200) {
		char echo[8] = "";

		/* The rest of the forwarder's "HTTP/1.1 200 Connection Established\r\n\r\n". */
		CU_ASSERT_EQUAL(recv(fd, got + 12, 27, MSG_WAITALL), 27);

		peer = service_accept(5000);
		CU_ASSERT_TRUE(peer >= 0);
		if (peer >= 0) {
			CU_ASSERT_EQUAL(write_all(fd, "ping", 4), 0);
			CU_ASSERT_EQUAL(recv(peer, echo, 4, MSG_WAITALL), 4);
			CU_ASSERT_STRING_EQUAL(echo, "ping");
			close(peer);
		}
	}
out:
	if (status != 200)
		while ((peer = service_accept(0)) >= 0)
			close(peer); /* what an old forwarder let through */
	if (status < 0 || (status != 200 && status != 403 && status != 502))
		fprintf(stderr, "\n  CONNECT %s: %d (%.40s) ", target, status, got);
	close(fd);
	return status;
}

/* ---- the tests ---------------------------------------------------------------------- */

static const char *const refused_names[] = {
	"lan.test",	 "private.test",   "private172.test", "private192.test",
	"metadata.test", "metadata6.test", "mapped.test",     "compat.test",
	"nat64.test",	 "sixtofour.test", "loprefix.test",   NULL,
};

/* Every listed name that resolves to this machine or an internal address: 403, and the
 * service never sees a connection. */
static void test_listed_names_refused(void)
{
	char hosts[16][64];
	const char *list[16];
	size_t n = 0;
	uint16_t port;
	struct egr_forwarder *f;
	struct egr_stats st;

	for (; refused_names[n]; n++) {
		snprintf(hosts[n], sizeof(hosts[n]), "%s:%u", refused_names[n],
			 (unsigned)service_port);
		list[n] = hosts[n];
	}
	snprintf(hosts[n], sizeof(hosts[n]), "public.test:%u", (unsigned)service_port);
	list[n] = hosts[n];
	list[n + 1] = NULL;
	f = fwd(list, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	for (size_t i = 0; refused_names[i]; i++) {
		int status = try_connect(port, refused_names[i], service_port);
		if (status != 403)
			fprintf(stderr, "\n  %s: %d, not 403 ", refused_names[i], status);
		CU_ASSERT_EQUAL(status, 403);
	}
	/* A public address is tried (nothing routes there in this namespace: 502), not
	 * refused. */
	CU_ASSERT_EQUAL(try_connect(port, "public.test", service_port), 502);
	/* An address is no way around the names. */
	CU_ASSERT_EQUAL(try_connect(port, "10.0.0.5", service_port), 403);
	CU_ASSERT_EQUAL(try_connect(port, "198.51.100.7", service_port), 403);
	CU_ASSERT_EQUAL(try_connect(port, "[::ffff:10.0.0.5]", service_port), 403);
	egr_stop(f, &st);
	CU_ASSERT_EQUAL(st.requests, 0);
}

/* An address listed on purpose is served, by name and by address, on its port only; the
 * other internal addresses stay refused. */
static void test_listed_address_served(void)
{
	char name[64], addr[64], addr6[80];
	const char *list[] = { name, addr, addr6, "metadata.test:443", NULL };
	uint16_t port;
	struct egr_forwarder *f;
	struct egr_stats st;

	snprintf(name, sizeof(name), "listed.test:%u", (unsigned)service_port);
	snprintf(addr, sizeof(addr), "10.0.0.5:%u", (unsigned)service_port);
	snprintf(addr6, sizeof(addr6), "[FD00:EC2::254]:%u", (unsigned)service_port);
	f = fwd(list, &port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL(try_connect(port, "listed.test", service_port), 200);
	CU_ASSERT_EQUAL(try_connect(port, "10.0.0.5", service_port), 200);
	CU_ASSERT_EQUAL(try_connect(port, "[::ffff:10.0.0.5]", service_port), 200);
	if (have_v6)
		CU_ASSERT_EQUAL(try_connect(port, "[fd00:ec2::254]", service_port), 200);
	/* Another address, or the listed one on another port: still refused. */
	CU_ASSERT_EQUAL(try_connect(port, "10.0.0.6", service_port), 403);
	CU_ASSERT_EQUAL(try_connect(port, "10.0.0.5", 1), 403);
	CU_ASSERT_EQUAL(try_connect(port, "metadata.test", 443), 403);
	/* Numeric forms other than a dotted quad are no listing. */
	CU_ASSERT_EQUAL(try_connect(port, "10.0.5", service_port), 403);
	CU_ASSERT_EQUAL(try_connect(port, "167772165", service_port), 403);
	egr_stop(f, &st);
	CU_ASSERT_EQUAL(st.requests, have_v6 ? 4 : 3);
}

/* What may be listed: addresses of hosts, never unspecified, multicast or reserved ones. */
static void test_route_check_addresses(void)
{
	static const struct {
		const char *entry;
		bool ok;
	} cases[] = {
		{ "10.0.0.5:443", true },	{ "[fd00:ec2::254]:443", true },
		{ "127.0.0.1:8080", true },	{ "[::ffff:10.0.0.1]:443", true },
		{ "0.0.0.0:443", false },	{ "[::]:443", false },
		{ "224.0.0.1:443", false },	{ "255.255.255.255:443", false },
		{ "[ff02::1]:443", false },	{ "[fe80::1%lo]:443", false },
		{ "10.0.0.5", false },		{ "10.0.0.5:0", false },
		{ "10.0.0.5:+443", false },	{ "010.0.0.5:443", false },
		{ "fd00:ec2::254:443", false }, { "[10.0.0.5]:443", false },
	};

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		const char *one[] = { cases[i].entry, NULL }, *why = NULL;
		struct egr_route r = { .mode = EGR_MODE_CONNECT, .allow_hosts = one };
		int rc = egr_route_check(&r, &why);

		if ((rc == 0) != cases[i].ok)
			fprintf(stderr, "\n  %s: %d (%s) ", cases[i].entry, rc, why ? why : "");
		CU_ASSERT_EQUAL(rc == 0, cases[i].ok);
	}
}

int main(void)
{
	/* 203.0.113.1/24 on loopback makes the whole /24 this machine's (a local route). */
	static const char *const v4[] = { "198.51.100.7", "10.0.0.5", "100.100.100.200",
					  "203.0.113.1" },
				 *const masks[] = { "255.255.255.255", "255.255.255.255",
						    "255.255.255.255", "255.255.255.0" };
	static const struct ts_test tests[] = {
		{ "listed names resolving inside are refused", test_listed_names_refused },
		{ "an address listed on purpose is served", test_listed_address_served },
		{ "which addresses may be listed", test_route_check_addresses },
		{ NULL, NULL },
	};
	int fails, ret;

	(void)signal(SIGPIPE, SIG_IGN);
	log_set_program("test_connect_addrs");
	/* Refusals are logged as warnings by design; the suite checks them itself. */
	log_set_level(LOG_LVL_ERROR);
	ret = enter_namespaces();
	if (ret) {
		fprintf(stderr, "SKIP: cannot make network and mount namespaces here: %s\n",
			strerror(-ret));
		return 77;
	}
	ret = loopback_setup(v4, masks, ARRAY_SIZE(v4));
	if (!ret)
		ret = hosts_setup();
	if (!ret)
		ret = service_start();
	if (ret || egr_global_init()) {
		fprintf(stderr, "cannot set the namespace up: %s\n", strerror(-ret));
		unlink(hosts_path);
		return 1;
	}
	have_v6 = loopback_v6();
	if (!have_v6)
		fprintf(stderr, "note: no IPv6 here, fd00:ec2::254 is refused but not served\n");
	fails = ts_cunit_run("egress connect addresses", tests);
	close(service_fd);
	unlink(hosts_path);
	return ts_exit_status(fails);
}
