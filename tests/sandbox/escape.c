/* The escape checks of olp-probe: each one tries something a hostile prompt might make a
 * provider client do, and reports whether the sandbox stopped it. One JSON line per check:
 *   {"check":"name","ok":true|false,"detail":"..."}
 * "ok" means the sandbox held. Arguments tell the probe where the host's secrets are:
 *   --keyfile PATH   a key store manifest       --keydir PATH   the key store directory
 *   --runtime PATH   the scratch runtime dir    --hostpid N     a host process id
 *   --unix PATH      a host unix socket path    --tcp HOST:PORT a host TCP listener
 *   --shmid N        a host SysV shm id         --secret VALUE  a secret in the worker env */
#include <stdarg.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/io_uring.h>
#include <linux/keyctl.h>
#include <linux/perf_event.h>
#include <linux/sched.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "escape.h"

static int failures;

static void report(const char *check, bool ok, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void report(const char *check, bool ok, const char *fmt, ...)
{
	char detail[512];
	va_list ap;

	va_start(ap, fmt);
	(void)vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	for (char *c = detail; *c; c++)
		if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
			*c = '\'';
	printf("{\"check\":\"%s\",\"ok\":%s,\"detail\":\"%s\"}\n", check, ok ? "true" : "false",
	       detail);
	(void)fflush(stdout);
	if (!ok)
		failures++;
}

/* The path must not be openable, and the reason must be that it does not exist here. */
static void expect_absent(const char *check, const char *path)
{
	int fd = open(path, O_RDONLY);
	int e = errno;

	if (fd >= 0) {
		char buf[64];
		ssize_t n = read(fd, buf, sizeof(buf));

		close(fd);
		report(check, false, "%s opened (%zd bytes readable)", path, n);
		return;
	}
	report(check, e == ENOENT, "%s: %s", path, strerror(e));
}

/* The path must not be openable: absent here, or (bwrap's init is another uid than ours)
 * not ours to look into. */
static void expect_unreachable(const char *check, const char *path)
{
	int fd = open(path, O_RDONLY);
	int e = errno;

	if (fd >= 0) {
		close(fd);
		report(check, false, "%s opened", path);
		return;
	}
	report(check, e == ENOENT || e == EACCES, "%s: %s", path, strerror(e));
}

static void expect_errno(const char *check, long rc, int want)
{
	int e = errno;

	if (rc >= 0)
		report(check, false, "succeeded (rc %ld)", rc);
	else
		report(check, e == want, "%s (want %s)", strerror(e), strerror(want));
}

static void check_files(const struct escape_args *a)
{
	char path[4096];

	if (a->keyfile) {
		expect_absent("keystore_file", a->keyfile);
		snprintf(path, sizeof(path), "/proc/1/root%s", a->keyfile);
		expect_unreachable("keystore_via_proc1_root", path);
		snprintf(path, sizeof(path), "/proc/self/root%s", a->keyfile);
		expect_absent("keystore_via_proc_self_root", path);
		snprintf(path, sizeof(path), "../../../../../../../..%s", a->keyfile);
		expect_absent("keystore_via_dotdot", path);
		/* A symlink planted in the scratch home resolves inside the sandbox too. */
		unlink("planted-link");
		if (symlink(a->keyfile, "planted-link") == 0)
			expect_absent("keystore_via_planted_symlink", "planted-link");
		else
			report("keystore_via_planted_symlink", false, "symlink: %s",
			       strerror(errno));
	}
	if (a->keydir)
		expect_absent("keystore_dir", a->keydir);
	if (a->runtime) {
		FILE *f = fopen("/proc/self/mountinfo", "r");
		char line[4096];
		bool seen = false;

		expect_absent("other_scratch_dirs", a->runtime);
		/* Where the host keeps the runs' scratch dirs is not ours to know. */
		while (f && fgets(line, sizeof(line), f))
			seen = seen || strstr(line, a->runtime);
		if (f)
			(void)fclose(f);
		report("mountinfo_no_runtime_dir", f && !seen, "%s %s in /proc/self/mountinfo",
		       a->runtime, seen ? "named" : "not named");
	}
	expect_absent("root_home", "/root");
	expect_absent("root_ssh", "/root/.ssh/id_rsa");
	expect_absent("home_dirs", "/home/olp/../../home/root");
	expect_absent("sys_absent", "/sys/kernel");
	expect_absent("host_run_absent", "/run");
	expect_absent("etc_shadow_absent", "/etc/shadow");
	/* The host's TLS keys (0710 root:ssl-cert): a sandbox started by root would pass
	 * their permission bits. */
	expect_absent("etc_ssl_private_absent", "/etc/ssl/private");
}

static void check_env(const struct escape_args *a)
{
	/* The policy's variables, and PWD, which bwrap's --chdir sets. */
	static const char *const allowed[] = { "PATH", "HOME", "LANG", "TMPDIR", "USER", "PWD" };
	extern char **environ;
	bool ok = true;
	char bad[256] = "";
	DIR *d;
	struct dirent *de;

	for (char **e = environ; *e; e++) {
		size_t n = strcspn(*e, "="), i;

		for (i = 0; i < sizeof(allowed) / sizeof(allowed[0]); i++)
			if (strlen(allowed[i]) == n && !strncmp(*e, allowed[i], n))
				break;
		if (i == sizeof(allowed) / sizeof(allowed[0]) &&
		    !(a->extra_env && !strncmp(*e, a->extra_env, n))) {
			ok = false;
			snprintf(bad, sizeof(bad), "%.*s", (int)n, *e);
		}
	}
	report("env_allowlisted", ok, ok ? "only allowlisted names" : "unexpected variable %s",
	       bad);
	if (!a->secret)
		return;
	/* (The secret reaches us hex-encoded, so that our own cmdline does not hold it.) */
	/* The secret is in no process's environment or command line in here. */
	ok = true;
	d = opendir("/proc");
	while (d && (de = readdir(d))) {
		static const char *const files[] = { "environ", "cmdline" };

		if (de->d_name[0] < '0' || de->d_name[0] > '9')
			continue;
		for (int f = 0; f < 2; f++) {
			char path[300], buf[65536];
			int fd;
			ssize_t n;

			snprintf(path, sizeof(path), "/proc/%s/%s", de->d_name, files[f]);
			fd = open(path, O_RDONLY);
			if (fd < 0)
				continue;
			n = read(fd, buf, sizeof(buf) - 1);
			close(fd);
			if (n > 0 && memmem(buf, (size_t)n, a->secret, strlen(a->secret)))
				ok = false;
		}
	}
	if (d)
		closedir(d);
	report("secret_not_in_proc", ok,
	       ok ? "not in any /proc/*/environ or cmdline" : "secret found");
}

static void check_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	struct stat st;
	char list[256] = "";
	size_t len = 0;
	bool ok = true;

	while (d && (de = readdir(d))) {
		int fd = atoi(de->d_name);

		if (de->d_name[0] == '.' || fd == dirfd(d))
			continue;
		if (fd > 2)
			ok = false;
		len += (size_t)snprintf(list + len, sizeof(list) - len, "%d ", fd);
	}
	if (d)
		closedir(d);
	report("only_fds_0_1_2", ok, "fds: %s", list);
	if (fstat(0, &st) < 0)
		report("fd0_not_socket", false, "fstat(0): %s", strerror(errno));
	else
		report("fd0_not_socket", !S_ISSOCK(st.st_mode), "fd 0 mode %o", st.st_mode);
}

static void check_pids(const struct escape_args *a)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	int n = 0, maxpid = 0;

	while (d && (de = readdir(d))) {
		if (de->d_name[0] < '0' || de->d_name[0] > '9')
			continue;
		n++;
		if (atoi(de->d_name) > maxpid)
			maxpid = atoi(de->d_name);
	}
	if (d)
		closedir(d);
	/* bwrap's init, this probe, maybe a shell: a handful of small pids. */
	report("only_sandbox_pids", n <= 4 && maxpid < 100, "%d pids visible, highest %d", n,
	       maxpid);
	if (a->hostpid > 0) {
		long rc = kill(a->hostpid, 0);

		/* ESRCH: no such pid in this namespace (a same-numbered sandbox pid would be
		 * ours, which the pid count above already rules out for large host pids). */
		if (a->hostpid >= 100)
			expect_errno("host_pid_not_signalable", rc, ESRCH);
	}
}

/* The first writable mapping of pid 1 (bwrap's init), from its maps: 0 when unknown. */
static unsigned long pid1_writable_page(void)
{
	FILE *f = fopen("/proc/1/maps", "r");
	char line[512], perms[8];
	unsigned long start = 0, lo, hi;

	while (f && !start && fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && perms[1] == 'w')
			start = lo;
	if (f)
		(void)fclose(f);
	return start;
}

/* Writing into a mapped page of bwrap's init would take it over. Its memory must not be
 * open to us at all (it is another uid), or the write must fail. The address is a real
 * mapping: a write to an unmapped one fails whatever the sandbox does. */
static void check_proc1_mem(void)
{
	unsigned long page = pid1_writable_page();
	int fd = open("/proc/1/mem", O_RDWR);
	char byte;

	if (fd < 0) {
		report("proc1_mem_write", true, "open /proc/1/mem: %s", strerror(errno));
		return;
	}
	if (!page) {
		close(fd);
		report("proc1_mem_write", false, "/proc/1/mem opened for writing, maps unreadable");
		return;
	}
	/* Write back what is there: a probe that gets through changes nothing. */
	if (pread(fd, &byte, 1, (off_t)page) != 1) {
		report("proc1_mem_write", true, "read at %#lx: %s", page, strerror(errno));
	} else {
		long rc = pwrite(fd, &byte, 1, (off_t)page);

		report("proc1_mem_write", rc < 0, "write at mapped %#lx: %s", page,
		       rc < 0 ? strerror(errno) : "succeeded");
	}
	close(fd);
}

static void check_ptrace(void)
{
	char buf[16] = "", rbuf[16];
	struct iovec local = { rbuf, sizeof(rbuf) }, remote = { buf, sizeof(buf) };
	pid_t child;

	child = fork();
	if (child == 0) {
		pause();
		_exit(0);
	}
	expect_errno("ptrace_attach", ptrace(PTRACE_ATTACH, child, 0, 0), EPERM);
	expect_errno("process_vm_readv", process_vm_readv(child, &local, 1, &remote, 1, 0), EPERM);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	check_proc1_mem();
}

static void check_syscalls(void)
{
	struct clone_args ca = { .flags = 0, .exit_signal = SIGCHLD };
	struct perf_event_attr pea = { .type = PERF_TYPE_SOFTWARE,
				       .size = sizeof(pea),
				       .config = PERF_COUNT_SW_CPU_CLOCK };
	union bpf_attr ba;
	struct io_uring_params up;

	memset(&ba, 0, sizeof(ba));
	memset(&up, 0, sizeof(up));
	expect_errno("unshare_user", unshare(CLONE_NEWUSER), EPERM);
	expect_errno("unshare_mount", unshare(CLONE_NEWNS), EPERM);
	expect_errno("clone_newuser", syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0),
		     EPERM);
	expect_errno("clone3_enosys", syscall(SYS_clone3, &ca, sizeof(ca)), ENOSYS);
	expect_errno("mount_tmpfs", mount("none", "/tmp", "tmpfs", 0, NULL), EPERM);
	expect_errno("keyctl",
		     syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0),
		     EPERM);
	expect_errno("add_key",
		     syscall(SYS_add_key, "user", "olp", "x", 1, KEY_SPEC_PROCESS_KEYRING), EPERM);
	expect_errno("bpf", syscall(SYS_bpf, BPF_PROG_LOAD, &ba, sizeof(ba)), EPERM);
	expect_errno("io_uring_setup", syscall(SYS_io_uring_setup, 4, &up), EPERM);
	expect_errno("userfaultfd", syscall(SYS_userfaultfd, 0), EPERM);
	expect_errno("perf_event_open", syscall(SYS_perf_event_open, &pea, 0, -1, -1, 0), EPERM);
	expect_errno("personality_no_aslr",
		     syscall(SYS_personality, 0x0040000 /* ADDR_NO_RANDOMIZE */), EPERM);
	expect_errno("chroot", chroot("/tmp"), EPERM);
	expect_errno("open_by_handle_at", syscall(SYS_open_by_handle_at, AT_FDCWD, NULL, 0), EPERM);
}

static void check_sockets(const struct escape_args *a)
{
	expect_errno("socket_af_unix", socket(AF_UNIX, SOCK_STREAM, 0), EAFNOSUPPORT);
	expect_errno("socket_af_netlink", socket(AF_NETLINK, SOCK_RAW, 0), EAFNOSUPPORT);
	expect_errno("socket_af_packet", socket(AF_PACKET, SOCK_RAW, 0), EAFNOSUPPORT);
	expect_errno("socket_high_bits_unix",
		     syscall(SYS_socket, 0x100000000L | AF_UNIX, SOCK_STREAM, 0), EAFNOSUPPORT);
	if (a->unix_path)
		expect_absent("host_unix_socket_absent", a->unix_path);
}

/* Ask the resolver of /etc/resolv.conf for a name: no answer may come back. (A send may
 * "succeed" when the resolver's address is a loopback one: it lands on the sandbox's own
 * loopback, where nothing listens.) */
static void check_resolver(void)
{
	static const unsigned char query[] = {
		0x12, 0x34, 1,	 0,   0,   1,	0,   0,	  0, 0,	  0,   0, /* id, RD, one question */
		7,    'e',  'x', 'a', 'm', 'p', 'l', 'e', 3, 'c', 'o', 'm', 0, 0, 1, 0, 1,
	};
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(53) };
	char line[256], ns[64] = "127.0.0.53", reply[512];
	FILE *f = fopen("/etc/resolv.conf", "r");
	struct timeval tv = { .tv_sec = 1 };
	int s;
	ssize_t n;

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "nameserver %63s", ns) == 1)
			break;
	if (f)
		(void)fclose(f);
	if (inet_pton(AF_INET, ns, &sin.sin_addr) != 1) {
		report("udp_to_resolver_fails", true, "resolver %s is not IPv4", ns);
		return;
	}
	s = socket(AF_INET, SOCK_DGRAM, 0);
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(s, (struct sockaddr *)&sin, sizeof(sin)) < 0 ||
	    send(s, query, sizeof(query), 0) < 0) {
		report("udp_to_resolver_fails", true, "send to %s:53: %s", ns, strerror(errno));
		close(s);
		return;
	}
	n = recv(s, reply, sizeof(reply), 0);
	report("udp_to_resolver_fails", n < 0, "resolver %s: %s", ns,
	       n < 0 ? strerror(errno) : "answered");
	close(s);
}

static void check_network(const struct escape_args *a)
{
	struct sockaddr_in sin = { .sin_family = AF_INET };
	int s;

	if (a->tcp_host && a->tcp_port) {
		inet_pton(AF_INET, a->tcp_host, &sin.sin_addr);
		sin.sin_port = htons((uint16_t)a->tcp_port);
		s = socket(AF_INET, SOCK_STREAM, 0);
		long rc = connect(s, (struct sockaddr *)&sin, sizeof(sin));
		int e = errno;

		report("tcp_to_host_fails", rc < 0, "connect %s:%d: %s", a->tcp_host, a->tcp_port,
		       rc < 0 ? strerror(e) : "connected");
		close(s);
	}
	check_resolver();
	/* Anything off this host: there is no route (only the sandbox's own loopback). */
	s = socket(AF_INET, SOCK_DGRAM, 0);
	sin.sin_port = htons(53);
	inet_pton(AF_INET, "192.0.2.1", &sin.sin_addr); /* TEST-NET-1 */
	long rc = connect(s, (struct sockaddr *)&sin, sizeof(sin));
	report("no_route_out", rc < 0, "connect 192.0.2.1:53: %s",
	       rc < 0 ? strerror(errno) : "connected");
	close(s);
}

static void check_tty(void)
{
	char c = 'x';

	/* fd 0 is a pipe: without the filter this would be ENOTTY, with it EPERM. */
	expect_errno("tiocsti", ioctl(0, TIOCSTI, &c), EPERM);
	expect_errno("tiocsti_high_bits", syscall(SYS_ioctl, 0, 0x100000000UL | TIOCSTI, &c),
		     EPERM);
}

static void check_ipc(const struct escape_args *a)
{
	if (a->shmid >= 0) {
		void *p = shmat(a->shmid, NULL, SHM_RDONLY);

		report("host_shm_invisible", p == (void *)-1, "shmat(%d): %s", a->shmid,
		       p == (void *)-1 ? strerror(errno) : "attached");
	}
}

static void read_status(const char *field, char *out, size_t n)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];

	out[0] = '\0';
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, field, strlen(field)) && line[strlen(field)] == ':') {
			snprintf(out, n, "%s",
				 line + strlen(field) + 1 +
					 strspn(line + strlen(field) + 1, " \t"));
			out[strcspn(out, "\n")] = '\0';
		}
	if (f)
		(void)fclose(f);
}

static void check_creds(void)
{
	static const struct {
		const char *field, *want;
	} want[] = {
		{ "CapEff", "0000000000000000" },
		{ "CapPrm", "0000000000000000" },
		{ "CapBnd", "0000000000000000" },
		{ "CapAmb", "0000000000000000" },
		{ "NoNewPrivs", "1" },
		{ "Seccomp", "2" },
	};
	char v[64], name[64];

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		read_status(want[i].field, v, sizeof(v));
		snprintf(name, sizeof(name), "status_%s", want[i].field);
		report(name, !strcmp(v, want[i].want), "%s=%s", want[i].field, v);
	}
}

/* Fill path until the file system refuses; report whether it stopped with ENOSPC below
 * 1 GiB (a size-limited tmpfs) rather than taking the host's memory. */
static void expect_size_limited(const char *check, const char *path)
{
	char chunk[1 << 16];
	long total = 0;
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	if (fd < 0) {
		report(check, false, "open %s: %s", path, strerror(errno));
		return;
	}
	memset(chunk, 'x', sizeof(chunk));
	for (;;) {
		ssize_t n = write(fd, chunk, sizeof(chunk));

		if (n <= 0) {
			report(check, n < 0 && errno == ENOSPC && total < (1L << 30),
			       "stopped after %ld MiB: %s", total >> 20,
			       n < 0 ? strerror(errno) : "eof");
			break;
		}
		total += n;
		if (total > (2L << 30)) {
			report(check, false, "wrote 2 GiB into %s", path);
			break;
		}
	}
	close(fd);
	unlink(path);
}

static void expect_read_only(const char *check, const char *path)
{
	int fd = open(path, O_WRONLY | O_CREAT, 0600);

	if (fd >= 0) {
		close(fd);
		unlink(path);
		report(check, false, "created %s", path);
	} else {
		report(check, errno == EROFS, "%s", strerror(errno));
	}
}

static void check_writes(void)
{
	expect_read_only("usr_read_only", "/usr/olp-escape");
	/* bwrap's own root and /dev are tmpfs with no size limit: writable, they would let
	 * a child fill the host's memory. */
	expect_read_only("root_read_only", "/olp-escape");
	expect_read_only("etc_read_only", "/etc/olp-escape");
	expect_read_only("dev_read_only", "/dev/olp-escape");
	expect_size_limited("tmp_size_limited", "/tmp/fill");
	expect_size_limited("home_size_limited", "/home/olp/fill");
	expect_size_limited("dev_shm_size_limited", "/dev/shm/fill");
}

/* Host-wide kernel knobs: not one may be opened for writing. core_pattern makes the
 * kernel run a program as host root on the next crash. */
static void check_proc_knobs(void)
{
	static const char *const knobs[] = {
		"/proc/sys/kernel/core_pattern",
		"/proc/sys/kernel/printk_ratelimit_burst",
		"/proc/sys/kernel/modprobe",
		"/proc/sys/vm/drop_caches",
		"/proc/sys/net/ipv4/ip_forward",
		"/proc/sys/net/core/somaxconn",
		"/proc/sys/fs/protected_symlinks",
		"/proc/sysrq-trigger",
		"/proc/sys/kernel/sched_rt_runtime_us",
	};
	char name[96];

	for (size_t i = 0; i < sizeof(knobs) / sizeof(knobs[0]); i++) {
		int fd = open(knobs[i], O_WRONLY);
		int e = errno;

		snprintf(name, sizeof(name), "proc_knob_%s", strrchr(knobs[i], '/') + 1);
		if (fd >= 0) {
			close(fd);
			report(name, false, "%s opened for writing", knobs[i]);
		} else {
			report(name, true, "%s: %s", knobs[i], strerror(e));
		}
	}
}

/* Files under /proc that are the host's, not this sandbox's processes', and that we
 * could write. PSI trigger files are world-writable by design and per-sandbox harmless. */
static void scan_writable(const char *dir, int depth, char *found, size_t n)
{
	DIR *d = opendir(dir);
	struct dirent *de;

	while (d && (de = readdir(d))) {
		char path[600];
		struct stat st;

		if (de->d_name[0] == '.' ||
		    (depth == 0 &&
		     ((de->d_name[0] >= '0' && de->d_name[0] <= '9') ||
		      !strcmp(de->d_name, "self") || !strcmp(de->d_name, "thread-self") ||
		      !strcmp(de->d_name, "pressure"))))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		if (lstat(path, &st) < 0 || S_ISLNK(st.st_mode))
			continue;
		if (S_ISDIR(st.st_mode)) {
			if (depth < 6)
				scan_writable(path, depth + 1, found, n);
		} else if (access(path, W_OK) == 0) {
			size_t len = strlen(found);

			snprintf(found + len, n - len, "%s ", path);
		}
	}
	if (d)
		closedir(d);
}

static void check_proc_writable(void)
{
	static char found[4096];

	found[0] = '\0';
	scan_writable("/proc", 0, found, sizeof(found));
	report("proc_nothing_host_writable", !found[0], "%s", found[0] ? found : "none");
}

/* The run is its own host uid: never host root, never the worker's. */
static void check_identity(const struct escape_args *a)
{
	FILE *f = fopen("/proc/self/uid_map", "r");
	unsigned long in, out, n, host = 0;
	bool found = false;

	while (f && fscanf(f, "%lu %lu %lu", &in, &out, &n) == 3)
		if (getuid() >= in && getuid() < in + n) {
			host = out + (getuid() - in);
			found = true;
		}
	if (f)
		(void)fclose(f);
	report("run_uid_not_host_root", found && host != 0, "uid %u is host uid %lu",
	       (unsigned)getuid(), host);
	if (a->worker_uid >= 0)
		report("run_uid_not_worker", found && host != (unsigned long)a->worker_uid,
		       "host uid %lu, worker %ld", host, a->worker_uid);
}

int escape_main(const struct escape_args *a)
{
	check_files(a);
	check_env(a);
	check_fds();
	check_pids(a);
	check_ptrace();
	check_syscalls();
	check_sockets(a);
	if (!a->network)
		check_network(a);
	check_tty();
	check_ipc(a);
	check_creds();
	check_writes();
	check_proc_knobs();
	check_proc_writable();
	check_identity(a);
	printf("{\"summary\":true,\"failures\":%d}\n", failures);
	return failures ? 1 : 0;
}
