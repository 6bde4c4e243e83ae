/* A run's own network namespace: only loopback, and OLP's forwarder listening in it
 * (ADR 0015).
 *
 * What it stops: a sandboxed command that shares the host's network namespace reaches the
 * host's loopback services (OLP itself among them), cloud metadata at 169.254.169.254 and
 * every private range, can listen on the host's addresses, and reads the host's socket
 * tables in /proc/net. In a namespace of its own with only `lo`, the one thing it can
 * reach is the socket made here, whose other end is the worker's forwarder.
 *
 * Why a helper process and not a thread of the worker:
 *  - the namespace must belong to the run's user namespace (ident.c's per-slot U1), so
 *    that bwrap's child, which joins U1 before it execs bwrap, holds CAP_SYS_ADMIN over
 *    it and may join it (setns(CLONE_NEWNET) asks for that capability both in the
 *    namespace's owner and in the caller's own user namespace). Only a process inside U1
 *    creates a namespace U1 owns, and the kernel refuses setns(CLONE_NEWUSER) to a
 *    process with more than one thread (EINVAL): a worker is threaded;
 *  - a locked-down worker holds no CAP_SYS_ADMIN of its own (lockdown.c), so it could not
 *    unshare a network namespace anyway;
 *  - nothing of the worker's own state changes: the helper switches namespaces, the
 *    worker's threads never do, so no other request's connection could ever be made from
 *    the run's namespace by mistake.
 * The helper is started as posix_spawn starts its child: clone(CLONE_VM | CLONE_VFORK) on
 * a stack of its own, every signal blocked, the calling thread suspended until it exits.
 * Sharing the worker's memory, it makes system calls only and writes nothing but its
 * own stack (and the caller's errno, as posix_spawn's child does): no lock, no
 * allocation, no atfork handler. A fork() would copy the worker's page tables, which
 * cost 10 ms here (a virtual machine) against 0.7 ms for this. It sends the two
 * descriptors back over a socketpair (SCM_RIGHTS) and exits; the namespace lives on
 * through them. */
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/close_range.h>

#include "common/common.h"
#include "sandbox/internal.h"
#include "common/banned.h"

/* The helper's steps, reported with errno when one fails. */
enum {
	NS_STAGE_OK = 0,
	NS_STAGE_FDS,
	NS_STAGE_USERNS,
	NS_STAGE_IDMAP,
	NS_STAGE_UNSHARE,
	NS_STAGE_LO,
	NS_STAGE_SOCKET,
	NS_STAGE_BIND,
	NS_STAGE_LISTEN,
	NS_STAGE_NSFD,
	NS_STAGE_SEND,
};

struct ns_report {
	int stage;
	int err;
	uint16_t port;
};

/* The descriptors the helper sends: the listener, the namespace, and (identity shared)
 * the user namespace it made. */
#define NS_MAX_FDS 3

/* What the helper is told, all of it prepared before it starts (it formats nothing). */
struct ns_args {
	int sock, userns_fd;
	uint16_t port;
	bool own_userns; /* the helper was started in a user namespace of its own */
	char uid_map[32], gid_map[32];
};

#define LISTEN_BACKLOG 128

static void ns_send(int sock, int stage, int err, uint16_t port, const int *fds, int nfds)
{
	struct ns_report r = { .stage = stage, .err = err, .port = port };
	struct iovec iov = { .iov_base = &r, .iov_len = sizeof(r) };
	union {
		char buf[CMSG_SPACE(NS_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (nfds > 0) {
		struct cmsghdr *c;

		memset(&u, 0, sizeof(u));
		msg.msg_control = u.buf;
		msg.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
		memcpy(CMSG_DATA(c), fds, (size_t)nfds * sizeof(int));
	}
	while (sendmsg(sock, &msg, MSG_NOSIGNAL) < 0 && errno == EINTR)
		;
}

static void __attribute__((noreturn)) ns_fail(int sock, int stage)
{
	ns_send(sock, stage, errno, 0, NULL, 0);
	_exit(1);
}

/* Write text to a /proc file of our own; false on failure (errno set). */
static bool ns_write(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	size_t len = strlen(text);
	bool ok;

	if (fd < 0)
		return false;
	ok = write(fd, text, len) == (ssize_t)len;
	close(fd);
	return ok;
}

/* A new namespace has `lo`, down, and nothing else. Up, it carries 127.0.0.1/8 (and ::1):
 * the only addresses the run will have. A step of ns_helper: system calls only. */
static void ns_lo_up(int sock)
{
	struct ifreq ifr;
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	if (s < 0)
		ns_fail(sock, NS_STAGE_LO);
	memset(&ifr, 0, sizeof(ifr));
	memcpy(ifr.ifr_name, "lo", 3);
	if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
		ns_fail(sock, NS_STAGE_LO);
	ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
	if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
		ns_fail(sock, NS_STAGE_LO);
	close(s);
}

/* The helper, between fork and _exit: system calls only (the worker may hold any lock). */
static void __attribute__((noreturn)) ns_helper(const struct ns_args *a)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(a->port) };
	socklen_t salen = sizeof(sa);
	int fds[NS_MAX_FDS], nfds = 2, s, u = -1, sock = a->sock, userns_fd = a->userns_fd;

	/* Nothing of the worker's but our two descriptors, for as long as we live: another
	 * thread's pipe whose EOF it waits for must not stay open here. */
	s = fcntl(sock, F_DUPFD_CLOEXEC, 3);
	if (userns_fd >= 0)
		u = fcntl(userns_fd, F_DUPFD_CLOEXEC, 3);
	if (s < 0 || (userns_fd >= 0 && u < 0) || dup3(s, 0, O_CLOEXEC) < 0 ||
	    (u >= 0 && dup3(u, 1, O_CLOEXEC) < 0))
		ns_fail(sock, NS_STAGE_FDS);
	sock = 0;
	userns_fd = u >= 0 ? 1 : -1;
	(void)close_range(u >= 0 ? 2 : 1, ~0U, 0);

	/* Into the run's user namespace first: the namespace made next then belongs to it,
	 * and we hold CAP_SYS_ADMIN and CAP_NET_ADMIN there for what follows. */
	if (userns_fd >= 0 && setns(userns_fd, CLONE_NEWUSER) < 0)
		ns_fail(sock, NS_STAGE_USERNS);
	if (a->own_userns) {
		/* Started in a user namespace and a network namespace of our own (identity
		 * shared: the run has no user namespace for it to belong to). Its root is the
		 * worker's uid and gid, and nothing else: the one map an unprivileged process
		 * may write for itself, setgroups denied first. */
		if (!ns_write("/proc/self/setgroups", "deny") ||
		    !ns_write("/proc/self/uid_map", a->uid_map) ||
		    !ns_write("/proc/self/gid_map", a->gid_map))
			ns_fail(sock, NS_STAGE_IDMAP);
	} else if (unshare(CLONE_NEWNET) < 0) {
		ns_fail(sock, NS_STAGE_UNSHARE);
	}
	ns_lo_up(sock);

	fds[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fds[0] < 0)
		ns_fail(sock, NS_STAGE_SOCKET);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fds[0], (struct sockaddr *)&sa, sizeof(sa)) < 0)
		ns_fail(sock, NS_STAGE_BIND);
	if (listen(fds[0], LISTEN_BACKLOG) < 0 ||
	    getsockname(fds[0], (struct sockaddr *)&sa, &salen) < 0)
		ns_fail(sock, NS_STAGE_LISTEN);
	/* We are single-threaded: self is this very task, now in the new namespace. */
	fds[1] = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
	if (fds[1] < 0)
		ns_fail(sock, NS_STAGE_NSFD);
	if (a->own_userns) {
		fds[nfds] = open("/proc/self/ns/user", O_RDONLY | O_CLOEXEC);
		if (fds[nfds++] < 0)
			ns_fail(sock, NS_STAGE_NSFD);
	}
	ns_send(sock, NS_STAGE_OK, 0, ntohs(sa.sin_port), fds, nfds);
	_exit(0);
}

static const char *ns_stage_name(int stage)
{
	switch (stage) {
	case NS_STAGE_FDS: return "descriptors";
	case NS_STAGE_USERNS: return "setns(user)";
	case NS_STAGE_IDMAP: return "id maps";
	case NS_STAGE_UNSHARE: return "unshare(net)";
	case NS_STAGE_LO: return "lo up";
	case NS_STAGE_SOCKET: return "socket";
	case NS_STAGE_BIND: return "bind";
	case NS_STAGE_LISTEN: return "listen";
	case NS_STAGE_NSFD: return "open ns/net";
	case NS_STAGE_SEND: return "send";
	default: return "?";
	}
}

/* Read the helper's report; on success take the descriptors (the user namespace's, when
 * it made one, to *userns_fd). 0 or -errno. */
static int ns_receive(int sock, struct sbx_netns *ns, int *userns_fd)
{
	struct ns_report r = { .stage = NS_STAGE_SEND, .err = EPROTO };
	struct iovec iov = { .iov_base = &r, .iov_len = sizeof(r) };
	union {
		char buf[CMSG_SPACE(NS_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr msg = { .msg_iov = &iov,
			      .msg_iovlen = 1,
			      .msg_control = u.buf,
			      .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *c;
	int fds[NS_MAX_FDS] = { -1, -1, -1 }, want = userns_fd ? 3 : 2;
	ssize_t n;

	do
		n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	for (c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
		    c->cmsg_len == CMSG_LEN((size_t)want * sizeof(int)))
			memcpy(fds, CMSG_DATA(c), (size_t)want * sizeof(int));
	if (n != (ssize_t)sizeof(r) || (msg.msg_flags & MSG_CTRUNC) || r.stage != NS_STAGE_OK ||
	    fds[0] < 0 || fds[1] < 0 || (userns_fd && fds[2] < 0)) {
		for (int i = 0; i < NS_MAX_FDS; i++)
			if (fds[i] >= 0)
				close(fds[i]);
		if (n == (ssize_t)sizeof(r) && r.stage != NS_STAGE_OK) {
			log_msg(LOG_LVL_DEBUG, 0, NULL, "sandbox: netns: %s: %s",
				ns_stage_name(r.stage), strerror(r.err));
			return r.err > 0 ? -r.err : -EPROTO;
		}
		return -EPROTO;
	}
	ns->listen_fd = fds[0];
	ns->netns_fd = fds[1];
	ns->port = r.port;
	if (userns_fd)
		*userns_fd = fds[2];
	return 0;
}

static int ns_helper_start(void *arg)
{
	ns_helper(arg);
}

#define HELPER_STACK ((size_t)64 * 1024)

/* userns_out NULL: the namespace belongs to userns_fd's user namespace (or ours); else to
 * a user namespace the helper is started in, whose fd goes to *userns_out. */
static int netns_make(struct sbx_netns *ns, int userns_fd, int *userns_out, uint16_t port)
{
	struct ns_args a = { .userns_fd = userns_fd,
			     .port = port,
			     .own_userns = userns_out != NULL };
	int sv[2], ret, st, flags = CLONE_VM | CLONE_VFORK | SIGCHLD;
	sigset_t all, old;
	char *stack;
	pid_t pid;

	*ns = (struct sbx_netns)SBX_NETNS_INIT;
	if (userns_out) {
		/* A process may unshare a user namespace only while it shares its memory with
		 * no other (the kernel's rule): the helper is cloned into both instead. */
		*userns_out = -1;
		flags |= CLONE_NEWUSER | CLONE_NEWNET;
		snprintf(a.uid_map, sizeof(a.uid_map), "0 %u 1\n", (unsigned)geteuid());
		snprintf(a.gid_map, sizeof(a.gid_map), "0 %u 1\n", (unsigned)getegid());
	}
	stack = malloc(HELPER_STACK);
	if (!stack)
		return -ENOMEM;
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		free(stack);
		return -errno;
	}
	a.sock = sv[1];
	/* No handler of the worker's may run in the helper. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	/* The stack grows down on every architecture this runs on. */
	pid = clone(ns_helper_start, stack + HELPER_STACK, flags, &a);
	ret = pid < 0 ? -errno : 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	free(stack);
	close(sv[1]);
	if (!ret)
		ret = ns_receive(sv[0], ns, userns_out);
	close(sv[0]);
	if (pid > 0)
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
	return ret;
}

int sbx_netns_init(struct sbx_netns *ns, int userns_fd, uint16_t port)
{
	return netns_make(ns, userns_fd, NULL, port);
}

int sbx_netns_init_userns(struct sbx_netns *ns, int *userns_fd, uint16_t port)
{
	return netns_make(ns, -1, userns_fd, port);
}

void sbx_netns_release(struct sbx_netns *ns)
{
	if (ns->listen_fd >= 0)
		close(ns->listen_fd);
	if (ns->netns_fd >= 0)
		close(ns->netns_fd);
	*ns = (struct sbx_netns)SBX_NETNS_INIT;
}
