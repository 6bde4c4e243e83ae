/* One host uid per run (ADR 0014).
 *
 * Every sandboxed command runs as its own host uid and gid, taken from a range reserved
 * for OLP, never host uid 0, never the worker's uid, never the uid of another run going
 * on at the same time. That is what makes RLIMIT_NPROC a per-run budget (the kernel counts
 * processes per real uid, and exempts uid 0), keeps one run out of another's files and
 * /proc entries, and keeps a root worker's sandbox from owning the host's sysctl files.
 *
 * How a run gets its uid. For each slot of the range the worker makes one user namespace
 * ("U1") whose map is
 *	0       -> the worker's own uid/gid (bwrap's set-up runs as this, as it always did)
 *	SBX_UID -> the slot's host uid/gid  (the command runs as this)
 * with no user namespace allowed below it (user.max_user_namespaces = 0 inside). The
 * spawned child joins U1 (setns) just before it execs bwrap, which then builds the sandbox
 * as U1's root with the worker's access to the host's files; olp-sandbox-exec, the first
 * program inside, gives the home to SBX_UID, switches to it (setresuid drops every
 * capability) and execs the command. U1 is kept per slot for the life of the process.
 *
 * Who may write U1's map: a root worker itself (it keeps CAP_SETUID, CAP_SETGID and
 * CAP_SETFCAP for this, lockdown.c); any other worker through Debian's setuid newuidmap
 * and newgidmap, within the ranges /etc/subuid and /etc/subgid give its user. Those only
 * work from a process without no_new_privs, so lockdown.c forks a helper before setting
 * it: the helper does nothing but run the two tools for a pid the worker names.
 *
 * Which slots are free, host-wide: a slot is taken by an exclusive flock on the file
 * "<uid>.lock" in the slot directory, released when every descriptor of that open file
 * is closed. The worker holds it for the run, and bwrap's init inside the sandbox holds a
 * copy (--sync-fd; bwrap closes it before the command starts, so the command never holds
 * it), so a uid is free again only when the run's last process is gone, even if the worker
 * died. The directory is one only the workers' user can write, so that no other local
 * user can take a slot (an abstract socket name, used before, could be bound by anyone,
 * and a user holding every name stopped every run): for a root worker /run/olp-uid-slots,
 * shared by every root process of the host; for any other user <runtime_dir>/uid-slots,
 * shared by every process of that user with the same runtime_dir (each worker of a
 * deployment; olp-sandbox given the workers' --runtime-dir). Both are 0700 and must belong
 * to the user, or no run gets a uid. Slots are taken from the lowest free one, so that the
 * files are no more than the most runs there ever were at once. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/close_range.h>

#include "common/common.h"
#include "sandbox/internal.h"
#include "common/banned.h"

#define NEWUIDMAP "/usr/bin/newuidmap"
#define NEWGIDMAP "/usr/bin/newgidmap"
/* A root worker whose range no setting or /etc/subuid entry gives: 64 Ki ids high above
 * what Debian's useradd hands out (SUB_UID_MAX 600100000) and systemd's dynamic and
 * container ranges (below 0x70000000). */
#define ROOT_DEFAULT_BASE 0x70000000u
#define RANGE_MAX 65536u
#define CACHE_MAX 256

/* The id-map helper of a non-root worker (forked by sbx_ident_prepare). */
static struct {
	int fd; /* socketpair end, -1 without a helper */
	pid_t pid;
	pthread_mutex_t lock; /* one request at a time */
} helper = { .fd = -1, .lock = PTHREAD_MUTEX_INITIALIZER };

struct map_req {
	pid_t pid;
	uid_t uid;
	gid_t gid;
};

/* A root worker's slot directory: every root process of the host shares it (its parent
 * is writable by root alone). */
#define ROOT_SLOT_DIR "/run/olp-uid-slots"
/* Any other user's, under its runtime_dir. */
#define SLOT_SUBDIR "uid-slots"

/* Where the slots' lock files are (sbx_ident_init). */
static struct {
	int fd; /* O_DIRECTORY, or -1 */
	char path[PATH_MAX];
} slots = { .fd = -1 };

/* The user namespaces made so far, one per slot this process has used. */
static struct {
	pthread_mutex_t lock;
	struct {
		unsigned int slot;
		int fd;
	} e[CACHE_MAX];
	size_t n;
} cache = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* ---- the helper (non-root workers) ---------------------------------------------------- */

/* Run one tool with argv; its exit status, or -1. In the helper: single-threaded. */
static int run_tool(char *const argv[])
{
	static char *const envp[] = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL };
	int st;
	pid_t pid = fork();

	if (pid == 0) {
		int null = open("/dev/null", O_RDWR);

		if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0)
			_exit(126);
		close_range(3, ~0U, 0);
		execve(argv[0], argv, envp);
		_exit(127);
	}
	if (pid < 0)
		return -1;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void __attribute__((noreturn)) helper_main(int fd, uid_t ruid, gid_t rgid)
{
	struct map_req r;
	ssize_t n;

	for (;;) {
		char pid[16], self_u[16], self_g[16], hu[16], hg[16];
		int rc;

		n = read(fd, &r, sizeof(r));
		if (n < 0 && errno == EINTR)
			continue;
		if (n != (ssize_t)sizeof(r))
			_exit(0); /* the worker is gone */
		snprintf(pid, sizeof(pid), "%d", (int)r.pid);
		snprintf(self_u, sizeof(self_u), "%u", (unsigned)ruid);
		snprintf(self_g, sizeof(self_g), "%u", (unsigned)rgid);
		snprintf(hu, sizeof(hu), "%u", (unsigned)r.uid);
		snprintf(hg, sizeof(hg), "%u", (unsigned)r.gid);
		/* newuidmap checks every range against /etc/subuid for our user (and lets a
		 * process map its own id); nothing else needs checking here. */
		rc = run_tool((char *const[]){ NEWUIDMAP, pid, "0", self_u, "1", SBX_STR(SBX_UID),
					       hu, "1", NULL });
		if (rc == 0)
			rc = run_tool((char *const[]){ NEWGIDMAP, pid, "0", self_g, "1",
						       SBX_STR(SBX_GID), hg, "1", NULL });
		if (write(fd, &rc, sizeof(rc)) != (ssize_t)sizeof(rc))
			_exit(0);
	}
}

int sbx_ident_prepare(void)
{
	int sv[2];
	pid_t pid, parent = getpid();

	if (geteuid() == 0 || helper.fd >= 0 || access(NEWUIDMAP, X_OK) || access(NEWGIDMAP, X_OK))
		return 0; /* root writes maps itself; without the tools, sbx_ident_init says so */
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	pid = fork();
	if (pid < 0) {
		close(sv[0]);
		close(sv[1]);
		return -errno;
	}
	if (pid == 0) {
		int null = open("/dev/null", O_RDONLY | O_CLOEXEC);

		/* Nothing of the worker's but our end of the pair: fd 0 of a FastCGI worker
		 * is its listening socket. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent || null < 0 || dup2(null, 0) < 0)
			_exit(0);
		close(sv[0]);
		if (dup2(sv[1], 3) < 0)
			_exit(0);
		close_range(4, ~0U, 0);
		helper_main(3, getuid(), getgid());
	}
	close(sv[1]);
	helper.fd = sv[0];
	helper.pid = pid;
	return 0;
}

static int helper_map(pid_t pid, uid_t uid, gid_t gid)
{
	struct map_req r = { .pid = pid, .uid = uid, .gid = gid };
	int rc = -1;

	pthread_mutex_lock(&helper.lock);
	if (helper.fd >= 0 && write(helper.fd, &r, sizeof(r)) == (ssize_t)sizeof(r) &&
	    read(helper.fd, &rc, sizeof(rc)) != (ssize_t)sizeof(rc))
		rc = -1;
	pthread_mutex_unlock(&helper.lock);
	return rc == 0 ? 0 : -EPERM;
}

/* ---- ranges --------------------------------------------------------------------------- */

/* The first range /etc/subuid (or subgid) gives user or uid: 0 or -ENOENT. */
static int subid_range(const char *file, const char *user, unsigned long id, unsigned long *base,
		       unsigned long *count)
{
	struct buf b = BUF_INIT;
	char idstr[24];
	const char *line;
	int ret = -ENOENT;

	snprintf(idstr, sizeof(idstr), "%lu", id);
	if (buf_read_file(&b, file, 1 << 20)) {
		buf_release(&b);
		return -ENOENT;
	}
	for (line = b.data; *line && ret; line = strchrnul(line, '\n'), line += !!*line) {
		const char *c1 = strchr(line, ':');
		size_t nl = c1 ? (size_t)(c1 - line) : 0;
		char *end;

		if (!c1 || !((user[0] && strlen(user) == nl && !strncmp(line, user, nl)) ||
			     (strlen(idstr) == nl && !strncmp(line, idstr, nl))))
			continue;
		*base = strtoul(c1 + 1, &end, 10);
		if (*end != ':')
			continue;
		*count = strtoul(end + 1, &end, 10);
		if (*count)
			ret = 0;
	}
	buf_release(&b);
	return ret;
}

/* The name /etc/passwd gives uid, or "" (read by hand: olp-sandbox is linked statically,
 * where getpwuid_r would need glibc's NSS modules at run time). A line is
 * name:password:uid:gid:…, and the password field may hold anything but a colon: "x"
 * (in the shadow file), "*" or "!" (no login), "" or a hash. */
static void user_name(uid_t uid, char *out, size_t n)
{
	struct buf b = BUF_INIT;
	char key[24];
	const char *line;

	out[0] = '\0';
	snprintf(key, sizeof(key), ":%u:", (unsigned)uid);
	if (buf_read_file(&b, "/etc/passwd", 1 << 22) == 0) {
		for (line = b.data; *line; line = strchrnul(line, '\n'), line += !!*line) {
			const char *eol = strchrnul(line, '\n'),
				   *c1 = memchr(line, ':', eol - line);
			const char *c2 = c1 ? memchr(c1 + 1, ':', eol - c1 - 1) : NULL;

			/* c2 starts ":uid:"; the name is all before c1. */
			if (c2 && (size_t)(eol - c2) >= strlen(key) &&
			    !strncmp(c2, key, strlen(key)) && c1 > line &&
			    (size_t)(c1 - line) < n) {
				snprintf(out, n, "%.*s", (int)(c1 - line), line);
				break;
			}
		}
	}
	buf_release(&b);
}

/* No id of the range may be one that means something on the host already. */
static bool range_safe(unsigned long base, unsigned long count, unsigned long self)
{
	return base >= 1000 && count >= 1 && base + count <= 0xFFFFFFFEul &&
	       !(self >= base && self < base + count) && !(65534 >= base && 65534 < base + count);
}

static int parse_range(const char *s, unsigned long *base, unsigned long *count)
{
	char *end;

	errno = 0;
	*base = strtoul(s, &end, 10);
	if (errno || (*end != ':' && *end != '-'))
		return -EINVAL;
	*count = strtoul(end + 1, &end, 10);
	return errno || *end || !*count ? -EINVAL : 0;
}

/* Open the slot directory (see the top of this file) into slots: 0, or -errno with why
 * (n bytes) saying what is wrong. */
static int slot_dir_open(char *why, size_t n)
{
	uid_t self = geteuid();
	struct stat st;
	int fd;

	if (slots.fd >= 0)
		close(slots.fd);
	slots.fd = -1;
	if (self == 0) {
		snprintf(slots.path, sizeof(slots.path), "%s", ROOT_SLOT_DIR);
		if (mkdir(ROOT_SLOT_DIR, 0700) < 0 && errno != EEXIST)
			goto fail;
		fd = open(ROOT_SLOT_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	} else {
		snprintf(slots.path, sizeof(slots.path), "%s/%s", sbx_g.runtime_dir, SLOT_SUBDIR);
		if (mkdirat(sbx_g.runtime_fd, SLOT_SUBDIR, 0700) < 0 && errno != EEXIST)
			goto fail;
		fd = sbx_open_dir_beneath(sbx_g.runtime_fd, SLOT_SUBDIR);
	}
	if (fd < 0)
		goto fail;
	/* Ours alone: whoever else can write it can take every slot. */
	if (fstat(fd, &st) < 0 || st.st_uid != self || (st.st_mode & 077)) {
		close(fd);
		snprintf(why, n, "the uid slot directory %.300s must belong to uid %u, mode 0700",
			 slots.path, (unsigned)self);
		return -EPERM;
	}
	slots.fd = fd;
	return 0;
fail:
	fd = errno;
	snprintf(why, n, "the uid slot directory %.300s: %s", slots.path, strerror(fd));
	return -fd;
}

void sbx_ident_init(enum sbx_identity mode, const char *range)
{
	unsigned long ub = 0, uc = 0, gb = 0, gc = 0;
	char user[256];
	uid_t self = geteuid();

	sbx_g.ident = mode;
	sbx_g.ident_ok = false;
	/* A process that was not locked down (a test, a tool) forks its helper now. */
	if (mode == SBX_IDENTITY_PER_RUN && sbx_ident_prepare())
		log_warn(NULL, "sandbox: cannot start the uid-map helper");
	if (mode == SBX_IDENTITY_SHARED) {
		/* The landed behaviour: every run is the worker's own uid. Never for root,
		 * whose runs would then be host root. */
		sbx_g.ident_ok = self != 0;
		snprintf(sbx_g.ident_reason, sizeof(sbx_g.ident_reason), "%s",
			 self ? "sandbox.identity is \"shared\": every run is the worker's own uid "
				"(no per-run process budget, runs can signal each other)"
			      : "sandbox.identity \"shared\" is refused for a root worker: its "
				"runs would be host root");
		return;
	}
	user_name(self, user, sizeof(user));
	if (range && *range) {
		if (parse_range(range, &ub, &uc)) {
			snprintf(sbx_g.ident_reason, sizeof(sbx_g.ident_reason),
				 "sandbox.uid_range \"%.64s\" is not BASE:COUNT", range);
			return;
		}
		gb = ub;
		gc = uc;
	} else if (subid_range("/etc/subuid", user, self, &ub, &uc) == 0 &&
		   subid_range("/etc/subgid", user, self, &gb, &gc) == 0) {
		/* the user's own ranges */
	} else if (self == 0) {
		ub = gb = ROOT_DEFAULT_BASE;
		uc = gc = RANGE_MAX;
	} else {
		snprintf(sbx_g.ident_reason, sizeof(sbx_g.ident_reason),
			 "no uid range for user %.64s: add one to /etc/subuid and /etc/subgid "
			 "(usermod --add-subuids 2000000-2065535 --add-subgids 2000000-2065535 "
			 "%.64s)",
			 user[0] ? user : "?", user[0] ? user : "USER");
		return;
	}
	uc = uc < gc ? uc : gc;
	if (uc > RANGE_MAX)
		uc = RANGE_MAX;
	if (!range_safe(ub, uc, self) || !range_safe(gb, uc, getegid())) {
		snprintf(sbx_g.ident_reason, sizeof(sbx_g.ident_reason),
			 "uid range %lu:%lu / gid range %lu:%lu overlaps ids in use (0-999, 65534 "
			 "or the worker's own)",
			 ub, uc, gb, uc);
		return;
	}
	sbx_g.uid_base = (uid_t)ub;
	sbx_g.gid_base = (gid_t)gb;
	sbx_g.id_count = (unsigned int)uc;
	if (self != 0 && helper.fd < 0) {
		snprintf(sbx_g.ident_reason, sizeof(sbx_g.ident_reason),
			 "%s and %s are needed to give runs their own uid (apt-get install uidmap)",
			 NEWUIDMAP, NEWGIDMAP);
		return;
	}
	if (slot_dir_open(sbx_g.ident_reason, sizeof(sbx_g.ident_reason)))
		return;
	sbx_g.ident_ok = true;
	snprintf(sbx_g.ident_reason, sizeof(sbx_g.ident_reason),
		 "one host uid per run from %lu-%lu (gids from %lu), %s, slots in %.200s", ub,
		 ub + uc - 1, gb,
		 self == 0 ? "mapped by the root worker" : "mapped with newuidmap/newgidmap",
		 slots.path);
}

void sbx_ident_release_all(void)
{
	pthread_mutex_lock(&cache.lock);
	while (cache.n)
		close(cache.e[--cache.n].fd);
	pthread_mutex_unlock(&cache.lock);
	if (slots.fd >= 0)
		close(slots.fd);
	slots.fd = -1;
}

/* ---- one slot ------------------------------------------------------------------------- */

/* Take slot's host-wide lock: the locked file's fd, -EBUSY when another run has it, or
 * -errno. Never unlocked by hand: the lock goes with the last descriptor of the open file,
 * the sandbox's init's copy included (sbx_ident_release only closes the worker's). */
static int slot_lock(unsigned int slot)
{
	char name[32];
	int fd, ret;

	snprintf(name, sizeof(name), "%u.lock", (unsigned)(sbx_g.uid_base + slot));
	/* O_NOFOLLOW: nobody else can write the directory, but a link is no lock file. */
	fd = openat(slots.fd, name, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -errno;
	if (flock(fd, LOCK_EX | LOCK_NB) == 0)
		return fd;
	ret = errno == EWOULDBLOCK ? -EBUSY : -errno;
	close(fd);
	return ret;
}

/* The holder of a new user namespace: waits until its map is written, then forbids user
 * namespaces below it, and exits (the namespace lives on through the worker's fd). Raw
 * clone, like fork: only system calls here. */
static int holder_main(int go_fd)
{
	char c;
	int fd;

	if (read(go_fd, &c, 1) != 1)
		return 1;
	fd = open("/proc/sys/user/max_user_namespaces", O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "0\n", 2) != 2)
		return 2;
	return 0;
}

/* Make U1 for a slot (see the top of this file): its fd, or -errno. */
static int userns_create(unsigned int slot)
{
	uid_t hu = sbx_g.uid_base + slot;
	gid_t hg = sbx_g.gid_base + slot;
	char path[64], map[96];
	int go[2], fd = -1, ret = 0, st;
	pid_t pid;

	if (pipe2(go, O_CLOEXEC) < 0)
		return -errno;
	pid = (pid_t)syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, NULL, NULL, NULL, NULL);
	if (pid == 0) {
		close(go[1]);
		_exit(holder_main(go[0]));
	}
	close(go[0]);
	if (pid < 0) {
		close(go[1]);
		return -errno;
	}
	if (geteuid() == 0) {
		snprintf(path, sizeof(path), "/proc/%d/uid_map", (int)pid);
		snprintf(map, sizeof(map), "0 %u 1\n%d %u 1\n", (unsigned)geteuid(), SBX_UID,
			 (unsigned)hu);
		ret = write_control_file(path, map);
		snprintf(path, sizeof(path), "/proc/%d/gid_map", (int)pid);
		snprintf(map, sizeof(map), "0 %u 1\n%d %u 1\n", (unsigned)getegid(), SBX_GID,
			 (unsigned)hg);
		if (!ret)
			ret = write_control_file(path, map);
	} else {
		ret = helper_map(pid, hu, hg);
	}
	if (!ret) {
		snprintf(path, sizeof(path), "/proc/%d/ns/user", (int)pid);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			ret = -errno;
	}
	/* Go (or, on failure, EOF: the holder exits). */
	if (!ret && write(go[1], "g", 1) != 1)
		ret = -errno;
	close(go[1]);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (!ret && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
		ret = -EPERM; /* could not forbid nested user namespaces: not this one */
	if (ret) {
		if (fd >= 0)
			close(fd);
		return ret;
	}
	return fd;
}

/* The cached U1 of slot, made on first use; borrowed (do not close). fd or -errno. */
static int userns_get(unsigned int slot, const char *rid)
{
	int fd = -1;

	pthread_mutex_lock(&cache.lock);
	for (size_t i = 0; i < cache.n && fd < 0; i++)
		if (cache.e[i].slot == slot)
			fd = cache.e[i].fd;
	pthread_mutex_unlock(&cache.lock);
	if (fd >= 0)
		return fd;
	fd = userns_create(slot);
	if (fd < 0)
		return fd;
	pthread_mutex_lock(&cache.lock);
	if (cache.n < CACHE_MAX) {
		cache.e[cache.n].slot = slot;
		cache.e[cache.n++].fd = fd;
	} else {
		/* Never reached in practice (a slot per concurrent run): keep it working,
		 * at the cost of a leaked fd per run. */
		log_warnx(rid, "sandbox: more than %d uid slots in use by one process", CACHE_MAX);
	}
	pthread_mutex_unlock(&cache.lock);
	return fd;
}

int sbx_ident_acquire(struct sbx_ident *id, const char *rid)
{
	unsigned int n = sbx_g.id_count, slot = 0, cached[CACHE_MAX];
	size_t nc = 0;
	int lock = -EBUSY;

	*id = (struct sbx_ident){ .lock_fd = -1, .userns_fd = -1 };
	if (!sbx_g.ident_ok)
		return -EPERM; /* fail closed: sbx_g.ident_reason says why */
	if (sbx_g.ident != SBX_IDENTITY_PER_RUN)
		return 0;
	if (!n || slots.fd < 0)
		return -EPERM;
	/* Slots whose namespace this process has made already first. */
	pthread_mutex_lock(&cache.lock);
	for (size_t i = 0; i < cache.n; i++)
		cached[nc++] = cache.e[i].slot;
	pthread_mutex_unlock(&cache.lock);
	for (size_t i = 0; i < nc && lock == -EBUSY; i++)
		if ((lock = slot_lock(cached[i])) >= 0)
			slot = cached[i];
	/* Then the lowest free one: a held slot costs an open and a flock. */
	for (unsigned int i = 0; lock == -EBUSY && i < n && i < 4096; i++) {
		slot = i;
		lock = slot_lock(slot);
	}
	if (lock < 0) {
		if (lock != -EBUSY) {
			errno = -lock;
			log_warn(rid, "sandbox: uid slot %u in %s", (unsigned)slot, slots.path);
		}
		return lock == -EBUSY ? -EAGAIN : lock;
	}
	id->userns_fd = userns_get(slot, rid);
	if (id->userns_fd < 0) {
		int ret = id->userns_fd;

		close(lock);
		id->userns_fd = -1;
		return ret;
	}
	id->lock_fd = lock;
	id->uid = sbx_g.uid_base + slot;
	id->gid = sbx_g.gid_base + slot;
	return 0;
}

void sbx_ident_release(struct sbx_ident *id)
{
	if (id->lock_fd >= 0)
		close(id->lock_fd);
	id->lock_fd = -1;
	id->userns_fd = -1;
}
