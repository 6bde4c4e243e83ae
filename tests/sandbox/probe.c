/* olp-probe: runs INSIDE the sandbox and reports what it can see, as one JSON line per
 * check on stdout. Built without sanitizers: it must run in the bare sandbox. The sandbox
 * suite (and, later, the escape tests) assert on its output.
 *
 *   olp-probe fds        the descriptors it holds, and whether fd 0 is a socket
 *   olp-probe env        the names of its environment variables
 *   olp-probe read PATH  whether PATH can be opened for reading (errno name when not)
 *   olp-probe write PATH whether PATH can be created/written
 *   olp-probe spin       ignore SIGTERM, fork a grandchild, sleep forever
 *   olp-probe dump PATH... print each file's bytes if it can be read (the HTTP test)
 *   olp-probe forkhold N S  start up to N (at most 1200) sleeping children, hold them S s
 *   olp-probe fill PATH  write PATH until the file system refuses (at most 4 GiB)
 *   olp-probe hog        allocate and touch memory until something stops it
 *   olp-probe cpu MS     busy-loop for MS ms of wall-clock time, print the CPU ms it got
 *   olp-probe mark NAME  create /tmp/NAME, then sleep 3 s
 *   olp-probe peek NAME  report whether /tmp/NAME or another probe is visible
 *   olp-probe net PORT HOSTPORT UNIXPATH
 *                        the network it is in: a round trip with the listener on
 *                        127.0.0.1:PORT ("ping\n" -> its answer), a connect to the host
 *                        service on 127.0.0.1:HOSTPORT, UDP connects to 169.254.169.254,
 *                        10.0.0.1, 192.0.2.1, whether HOSTPORT shows in /proc/net/tcp or
 *                        tcp6 and UNIXPATH in /proc/net/unix, its interfaces
 *                        (/proc/net/dev) and its descriptors
 *   olp-probe escape [--keyfile P] [--keydir P] [--runtime P] [--hostpid N] [--unix P]
 *                    [--tcp HOST:PORT] [--shmid N] [--secret-hex HEX] [--net]
 *                    [--worker-uid N]
 *                        every escape check (escape.c), one JSON line each */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "escape.h"

extern char **environ;

/* "fds":[...],"fd0_socket":BOOL */
static int print_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	struct stat st;
	int first = 1, self;

	if (!d) {
		printf("\"error\":\"opendir: %s\"", strerror(errno));
		return 1;
	}
	self = dirfd(d);
	printf("\"fds\":[");
	while ((de = readdir(d))) {
		int fd;

		if (de->d_name[0] == '.')
			continue;
		fd = atoi(de->d_name);
		if (fd == self)
			continue;
		printf("%s%d", first ? "" : ",", fd);
		first = 0;
	}
	closedir(d);
	printf("],\"fd0_socket\":%s",
	       fstat(0, &st) == 0 && S_ISSOCK(st.st_mode) ? "true" : "false");
	return 0;
}

static int cmd_fds(void)
{
	int rc;

	printf("{");
	rc = print_fds();
	printf("}\n");
	return rc;
}

/* errno as its name, for assertions that read well. */
static const char *err_name(int e)
{
	switch (e) {
	case 0: return "ok";
	case ENETUNREACH: return "ENETUNREACH";
	case ECONNREFUSED: return "ECONNREFUSED";
	case EHOSTUNREACH: return "EHOSTUNREACH";
	case ETIMEDOUT: return "ETIMEDOUT";
	case EACCES: return "EACCES";
	case EPERM: return "EPERM";
	case ENOENT: return "ENOENT";
	default: return "other";
	}
}

/* Connect to 127.0.0.1:port over TCP: the socket, or -1 with errno. */
static int tcp_lo(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), e;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

static int udp_to(const char *ip)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(53) };
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), e = 0;

	if (fd < 0)
		return errno;
	inet_pton(AF_INET, ip, &a.sin_addr);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		e = errno;
	close(fd);
	return e;
}

/* Whether needle occurs in the file (-1: unreadable). */
static int file_has(const char *path, const char *needle)
{
	static char buf[1 << 20];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n, len = 0;

	if (fd < 0)
		return -1;
	while (len < (ssize_t)sizeof(buf) - 1 &&
	       (n = read(fd, buf + len, sizeof(buf) - 1 - (size_t)len)) > 0)
		len += n;
	close(fd);
	buf[len] = '\0';
	return strstr(buf, needle) != NULL;
}

static int cmd_net(int port, int host_port, const char *unix_path)
{
	static const char *const ips[] = { "169.254.169.254", "10.0.0.1", "192.0.2.1" };
	char reply[64] = "", key[16], line[256], ns[64];
	ssize_t n;
	int fd = tcp_lo(port), e = fd < 0 ? errno : 0, first = 1;
	FILE *dev;

	if (fd >= 0) {
		if (write(fd, "ping\n", 5) == 5 && (n = read(fd, reply, sizeof(reply) - 1)) > 0) {
			reply[n] = '\0';
			reply[strcspn(reply, "\n\"\\")] = '\0';
		}
		close(fd);
	}
	printf("{\"listener\":\"%s\",\"reply\":\"%s\"", err_name(e), reply);
	fd = tcp_lo(host_port);
	printf(",\"host_lo\":\"%s\"", err_name(fd < 0 ? errno : 0));
	if (fd >= 0)
		close(fd);
	printf(",\"udp\":[");
	for (size_t i = 0; i < sizeof(ips) / sizeof(ips[0]); i++)
		printf("%s\"%s\"", i ? "," : "", err_name(udp_to(ips[i])));
	snprintf(key, sizeof(key), ":%04X ", (unsigned)host_port);
	printf("],\"tcp_host_port\":%d,\"tcp6_host_port\":%d,\"unix_host_path\":%d",
	       file_has("/proc/net/tcp", key), file_has("/proc/net/tcp6", key),
	       file_has("/proc/net/unix", unix_path));
	/* /proc/net/dev: two header lines, then "  name: counters" per interface. */
	printf(",\"ifaces\":\"");
	dev = fopen("/proc/net/dev", "re");
	for (int i = 0; dev && fgets(line, sizeof(line), dev); i++) {
		char *colon = strchr(line, ':'), *name = line;

		if (i < 2 || !colon)
			continue;
		*colon = '\0';
		name += strspn(name, " ");
		printf("%s%s", first ? "" : " ", name);
		first = 0;
	}
	if (dev)
		fclose(dev);
	printf("\",");
	/* Which namespace: the test compares runs with each other and with its own. */
	n = readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
	ns[n > 0 ? n : 0] = '\0';
	printf("\"netns\":\"%s\",", ns);
	fd = print_fds();
	printf("}\n");
	return fd;
}

static int cmd_env(void)
{
	char **e;
	int first = 1;

	printf("{\"env\":[");
	for (e = environ; *e; e++) {
		printf("%s\"%.*s\"", first ? "" : ",", (int)strcspn(*e, "="), *e);
		first = 0;
	}
	printf("]}\n");
	return 0;
}

static int cmd_read(const char *path)
{
	int fd = open(path, O_RDONLY);

	if (fd < 0) {
		printf("{\"path\":\"%s\",\"ok\":false,\"errno\":%d}\n", path, errno);
		return 0;
	}
	printf("{\"path\":\"%s\",\"ok\":true}\n", path);
	close(fd);
	return 0;
}

static int cmd_write(const char *path)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	if (fd < 0 || write(fd, "x", 1) != 1) {
		printf("{\"path\":\"%s\",\"ok\":false,\"errno\":%d}\n", path, errno);
		return 0;
	}
	printf("{\"path\":\"%s\",\"ok\":true}\n", path);
	close(fd);
	return 0;
}

static int __attribute__((noreturn)) cmd_spin(void)
{
	(void)signal(SIGTERM, SIG_IGN);
	if (fork() == 0) {
		setsid(); /* try to escape the process group */
		for (;;)
			pause();
	}
	printf("{\"spinning\":true}\n");
	(void)fflush(stdout);
	for (;;)
		pause();
}

static int cmd_dump(int argc, char **argv)
{
	for (int i = 0; i < argc; i++) {
		char buf[65536];
		int fd = open(argv[i], O_RDONLY);
		ssize_t n;

		if (fd < 0) {
			printf("%s: %s\n", argv[i], strerror(errno));
			continue;
		}
		while ((n = read(fd, buf, sizeof(buf))) > 0)
			(void)fwrite(buf, 1, (size_t)n, stdout);
		close(fd);
	}
	return 0;
}

/* Hold as many processes as the sandbox lets us start, up to want (never more than
 * FORK_CAP, whatever the sandbox does: a broken limit must not take the host's pid space),
 * for hold_s seconds; report how many there were. Each child only sleeps. */
#define FORK_CAP 1200
static int cmd_forkhold(long want, long hold_s)
{
	static pid_t kids[FORK_CAP];
	long n = 0;
	int err = 0;

	if (want > FORK_CAP)
		want = FORK_CAP;
	while (n < want) {
		pid_t p = fork();

		if (p == 0) {
			sleep((unsigned)hold_s + 5);
			_exit(0);
		}
		if (p < 0) {
			err = errno;
			break;
		}
		kids[n++] = p;
	}
	printf("{\"forkhold\":%ld,\"stopped_by\":\"%s\"}\n", n, err ? strerror(err) : "count");
	(void)fflush(stdout);
	sleep((unsigned)hold_s);
	for (long i = 0; i < n; i++)
		kill(kids[i], SIGKILL);
	while (wait(NULL) > 0)
		;
	return 0;
}

/* Fill the home until the file system refuses: how far it got. */
static int cmd_fill(const char *path)
{
	static char chunk[1 << 20];
	long total = 0;
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600), err = 0;

	memset(chunk, 'x', sizeof(chunk));
	while (fd >= 0 && total < (4L << 30)) {
		ssize_t w = write(fd, chunk, sizeof(chunk));

		if (w <= 0) {
			err = w < 0 ? errno : EIO;
			break;
		}
		total += w;
	}
	printf("{\"filled_mib\":%ld,\"stopped_by\":\"%s\"}\n", total >> 20,
	       fd < 0 ? strerror(errno)
	       : err  ? strerror(err)
		      : "count");
	return 0;
}

static int cmd_hog(void)
{
	/* Kept, and read back: an allocation nobody uses may be optimised away (clang
	 * does), and the loop would then never stop. */
	static char *kept[4096];
	static volatile char sink;
	size_t total = 0;

	for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++) {
		char *p = malloc(64 << 20);

		if (!p) {
			printf("{\"hog_stopped_at_mib\":%zu}\n", total >> 20);
			return 3;
		}
		memset(p, 1, 64 << 20);
		sink = (char)(sink + p[i % (64 << 20)]);
		kept[i] = p;
		total += 64 << 20;
	}
	printf("{\"hog_never_stopped_mib\":%zu}\n", total >> 20);
	return 4;
}

static long now_ms(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000;
}

/* Burn CPU for ms of wall-clock time; under cpu.max it gets only its share. "work" is
 * the number of 10000-iteration rounds done: unlike cpu_ms, it does not count time the
 * CPU was taken away (a VM's vCPU descheduled by a busy host is charged as CPU time). */
static int cmd_cpu(const char *ms)
{
	long start = now_ms(CLOCK_MONOTONIC), end = start + atol(ms);
	volatile unsigned long spin = 0;
	unsigned long rounds = 0;

	while (now_ms(CLOCK_MONOTONIC) < end) {
		for (int i = 0; i < 10000; i++)
			spin++;
		rounds++;
	}
	printf("{\"cpu_ms\":%ld,\"wall_ms\":%ld,\"work\":%lu}\n", now_ms(CLOCK_PROCESS_CPUTIME_ID),
	       now_ms(CLOCK_MONOTONIC) - start, rounds);
	return 0;
}

static int cmd_mark(const char *name)
{
	char path[300];
	int fd;

	snprintf(path, sizeof(path), "/tmp/%s", name);
	fd = open(path, O_WRONLY | O_CREAT, 0600);
	printf("{\"marked\":%s}\n", fd >= 0 ? "true" : "false");
	(void)fflush(stdout);
	sleep(3);
	return 0;
}

static int cmd_peek(const char *name)
{
	char path[300];
	struct stat st;
	DIR *d = opendir("/proc");
	struct dirent *de;
	int others = 0;

	snprintf(path, sizeof(path), "/tmp/%s", name);
	while (d && (de = readdir(d))) {
		char cpath[300], cmd[256] = "";
		FILE *f;

		if (de->d_name[0] < '0' || de->d_name[0] > '9' || atoi(de->d_name) == getpid())
			continue;
		snprintf(cpath, sizeof(cpath), "/proc/%s/cmdline", de->d_name);
		f = fopen(cpath, "r");
		if (f) {
			size_t n = fread(cmd, 1, sizeof(cmd) - 1, f);

			cmd[n] = '\0';
			(void)fclose(f);
		}
		if (strstr(cmd, "olp-probe"))
			others++;
	}
	if (d)
		closedir(d);
	printf("{\"other_tmp_visible\":%s,\"other_probes_visible\":%d}\n",
	       stat(path, &st) == 0 ? "true" : "false", others);
	return 0;
}

static int cmd_escape(int argc, char **argv)
{
	struct escape_args a = { .hostpid = -1, .shmid = -1, .worker_uid = -1 };

	for (int i = 0; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(argv[i], "--net")) {
			a.network = true;
			continue;
		}
		if (!v)
			return 2;
		if (!strcmp(argv[i], "--keyfile"))
			a.keyfile = v;
		else if (!strcmp(argv[i], "--keydir"))
			a.keydir = v;
		else if (!strcmp(argv[i], "--runtime"))
			a.runtime = v;
		else if (!strcmp(argv[i], "--hostpid"))
			a.hostpid = atoi(v);
		else if (!strcmp(argv[i], "--unix"))
			a.unix_path = v;
		else if (!strcmp(argv[i], "--shmid"))
			a.shmid = atoi(v);
		else if (!strcmp(argv[i], "--worker-uid"))
			a.worker_uid = atol(v);
		else if (!strcmp(argv[i], "--secret-hex")) {
			static char secret[256];
			size_t n = strlen(v) / 2;

			if (n >= sizeof(secret))
				return 2;
			for (size_t k = 0; k < n; k++) {
				unsigned int byte;

				if (sscanf(v + 2 * k, "%2x", &byte) != 1)
					return 2;
				secret[k] = (char)byte;
			}
			secret[n] = '\0';
			a.secret = secret;
		} else if (!strcmp(argv[i], "--extra-env"))
			a.extra_env = v;
		else if (!strcmp(argv[i], "--tcp")) {
			static char host[64];
			const char *colon = strrchr(v, ':');

			if (!colon)
				return 2;
			snprintf(host, sizeof(host), "%.*s", (int)(colon - v), v);
			a.tcp_host = host;
			a.tcp_port = atoi(colon + 1);
		} else {
			return 2;
		}
		i++;
	}
	return escape_main(&a);
}

int main(int argc, char **argv)
{
	(void)setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 2 && !strcmp(argv[1], "fds"))
		return cmd_fds();
	if (argc >= 2 && !strcmp(argv[1], "env"))
		return cmd_env();
	if (argc >= 3 && !strcmp(argv[1], "read"))
		return cmd_read(argv[2]);
	if (argc >= 3 && !strcmp(argv[1], "write"))
		return cmd_write(argv[2]);
	if (argc >= 2 && !strcmp(argv[1], "spin"))
		return cmd_spin();
	if (argc >= 2 && !strcmp(argv[1], "dump"))
		return cmd_dump(argc - 2, argv + 2);
	if (argc >= 4 && !strcmp(argv[1], "forkhold"))
		return cmd_forkhold(atol(argv[2]), atol(argv[3]));
	if (argc >= 3 && !strcmp(argv[1], "fill"))
		return cmd_fill(argv[2]);
	if (argc >= 2 && !strcmp(argv[1], "hog"))
		return cmd_hog();
	if (argc >= 3 && !strcmp(argv[1], "cpu"))
		return cmd_cpu(argv[2]);
	if (argc >= 3 && !strcmp(argv[1], "mark"))
		return cmd_mark(argv[2]);
	if (argc >= 3 && !strcmp(argv[1], "peek"))
		return cmd_peek(argv[2]);
	if (argc >= 5 && !strcmp(argv[1], "net"))
		return cmd_net(atoi(argv[2]), atoi(argv[3]), argv[4]);
	if (argc >= 2 && !strcmp(argv[1], "escape"))
		return cmd_escape(argc - 2, argv + 2);
	fprintf(stderr, "usage: olp-probe fds|env|read PATH|write PATH|spin\n");
	return 2;
}
