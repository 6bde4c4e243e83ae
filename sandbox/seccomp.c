/* The seccomp filter every sandboxed command runs under.
 *
 * Default allow; each rule below refuses a kernel surface that a provider client never
 * needs and that an escaping or snooping process would (the "why" is on each group).
 * System calls of any other architecture (i386 via int 0x80, x32) kill the process:
 * libseccomp's bad-architecture action, since only the native arch is in the filter.
 * The program is built once per process with libseccomp, exported as classic BPF, and
 * each run gets its own memfd copy for bwrap's --seccomp (a shared fd would share its
 * file offset between concurrent runs).
 *
 * olp-sandbox, which runs one command per process, takes the same program built at
 * compile time instead (olp-seccomp-gen, from these rules, with the libseccomp it links
 * statically): building it is a visible share of a run (docs/performance.md). It is
 * used only when the libseccomp linked in is the one that built them. The escape
 * tests run through olp-sandbox, so it is this program whose refusals they check; the
 * server's own build is checked through HTTP (tests/sandbox/escape-http.test.mjs). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <seccomp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/sched.h>

#include "common/common.h"
#include "sandbox/internal.h"
#include "common/banned.h"

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

struct rule {
	const char *name;
	int err; /* errno to return */
};

/* Refused outright with EPERM unless noted. */
static const struct rule plain_rules[] = {
	/* Reading or steering other processes (another tenant's client, the worker). */
	{ "ptrace", EPERM },
	{ "process_vm_readv", EPERM },
	{ "process_vm_writev", EPERM },
	{ "kcmp", EPERM },
	{ "pidfd_getfd", EPERM },
	/* Rearranging the file system view: the allowlisted root must stay as built. */
	{ "mount", EPERM },
	{ "umount2", EPERM },
	{ "pivot_root", EPERM },
	{ "chroot", EPERM },
	{ "open_tree", EPERM },
	{ "move_mount", EPERM },
	{ "fsopen", EPERM },
	{ "fsconfig", EPERM },
	{ "fsmount", EPERM },
	{ "fspick", EPERM },
	{ "mount_setattr", EPERM },
	/* New namespaces are how most container escapes start. */
	{ "unshare", EPERM },
	{ "setns", EPERM },
	/* clone3 passes its flags in memory a filter cannot read: ENOSYS makes libc fall
	 * back to clone, whose flags we can check. */
	{ "clone3", ENOSYS },
	/* Large kernel attack surfaces with no use to a CLI client. */
	{ "bpf", EPERM },
	{ "perf_event_open", EPERM },
	{ "userfaultfd", EPERM },
	{ "io_uring_setup", EPERM },
	{ "io_uring_enter", EPERM },
	{ "io_uring_register", EPERM },
	/* Kernel keyrings are shared per user across namespaces. */
	{ "keyctl", EPERM },
	{ "add_key", EPERM },
	{ "request_key", EPERM },
	/* Host administration. */
	{ "kexec_load", EPERM },
	{ "kexec_file_load", EPERM },
	{ "init_module", EPERM },
	{ "finit_module", EPERM },
	{ "delete_module", EPERM },
	{ "acct", EPERM },
	{ "quotactl", EPERM },
	{ "quotactl_fd", EPERM },
	{ "syslog", EPERM },
	{ "swapon", EPERM },
	{ "swapoff", EPERM },
	{ "reboot", EPERM },
	{ "iopl", EPERM },
	{ "ioperm", EPERM },
	{ "vhangup", EPERM },
	{ "settimeofday", EPERM },
	{ "clock_settime", EPERM },
	{ "clock_adjtime", EPERM },
	{ "adjtimex", EPERM },
	/* File handles bypass the mount view (the "shocker" escape). */
	{ "open_by_handle_at", EPERM },
	{ "name_to_handle_at", EPERM },
	/* Obsolete and risky. */
	{ "modify_ldt", EPERM },
	{ "uselib", EPERM },
};

static const unsigned long ns_flags[] = {
	CLONE_NEWNS,  CLONE_NEWUTS, CLONE_NEWIPC,    CLONE_NEWUSER,
	CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP, CLONE_NEWTIME,
};

/* personality() bits that weaken the address space layout. */
static const unsigned long bad_personality[] = {
	ADDR_NO_RANDOMIZE,
	READ_IMPLIES_EXEC,
	ADDR_COMPAT_LAYOUT,
	MMAP_PAGE_ZERO,
};

static int add(scmp_filter_ctx ctx, int err, const char *name, unsigned n,
	       const struct scmp_arg_cmp *cmp)
{
	int nr = seccomp_syscall_resolve_name(name);

	/* A name this libseccomp or architecture does not know cannot be called here. */
	if (nr == __NR_SCMP_ERROR)
		return 0;
	return seccomp_rule_add_array(ctx, SCMP_ACT_ERRNO((uint32_t)err), nr, n, cmp);
}

/* One argument comparison (libseccomp's SCMP_A* macros leave fields implicit, which clang
 * warns about). */
static struct scmp_arg_cmp cmp(unsigned arg, enum scmp_compare op, scmp_datum_t a, scmp_datum_t b)
{
	struct scmp_arg_cmp c = { .arg = arg, .op = op, .datum_a = a, .datum_b = b };

	return c;
}

static int build(scmp_filter_ctx ctx)
{
	size_t i;
	int ret = 0, fam;

	for (i = 0; !ret && i < ARRAY_SIZE(plain_rules); i++)
		ret = add(ctx, plain_rules[i].err, plain_rules[i].name, 0, NULL);
	for (i = 0; !ret && i < ARRAY_SIZE(ns_flags); i++) {
		struct scmp_arg_cmp c = cmp(0, SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]);

		ret = add(ctx, EPERM, "clone", 1, &c);
	}
	for (i = 0; !ret && i < ARRAY_SIZE(bad_personality); i++) {
		struct scmp_arg_cmp c =
			cmp(0, SCMP_CMP_MASKED_EQ, bad_personality[i], bad_personality[i]);

		ret = add(ctx, EPERM, "personality", 1, &c);
	}
	/* Typing into the controlling terminal (TIOCSTI) and the console (TIOCLINUX). The
	 * kernel truncates the request to 32 bits, so the comparison must too. */
	if (!ret) {
		struct scmp_arg_cmp c = cmp(1, SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCSTI);

		ret = add(ctx, EPERM, "ioctl", 1, &c);
	}
	if (!ret) {
		struct scmp_arg_cmp c = cmp(1, SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCLINUX);

		ret = add(ctx, EPERM, "ioctl", 1, &c);
	}
	/* Sockets: AF_INET and AF_INET6 only. AF_UNIX too is refused: a read-only bind does
	 * not stop connect() on a socket path, and with the host network shared the host's
	 * abstract unix sockets are reachable. AF_NETLINK, AF_PACKET… are kernel surface. */
	for (fam = 0; !ret && fam < AF_INET6; fam++) {
		struct scmp_arg_cmp c = cmp(0, SCMP_CMP_MASKED_EQ, 0xffffffffu, (scmp_datum_t)fam);

		if (fam == AF_INET)
			continue;
		ret = add(ctx, EAFNOSUPPORT, "socket", 1, &c);
	}
	if (!ret) {
		/* Anything above AF_INET6, including values with high bits set. */
		struct scmp_arg_cmp c = cmp(0, SCMP_CMP_GT, AF_INET6, 0);

		ret = add(ctx, EAFNOSUPPORT, "socket", 1, &c);
	}
	return ret;
}

int sbx_seccomp_export(void **out, size_t *len)
{
	scmp_filter_ctx ctx;
	int fd = -1, ret;
	off_t size;

	ctx = seccomp_init(SCMP_ACT_ALLOW);
	if (!ctx)
		return -ENOMEM;
	/* bwrap sets no_new_privs itself before loading the program. */
	ret = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0);
	if (!ret)
		ret = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
	if (!ret)
		ret = build(ctx);
	if (ret)
		goto out_release_filter;
	fd = memfd_create("olp-seccomp-export", MFD_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		goto out_release_filter;
	}
	ret = seccomp_export_bpf(ctx, fd);
	if (ret)
		goto out_release_filter;
	size = lseek(fd, 0, SEEK_END);
	if (size <= 0) {
		ret = size < 0 ? -errno : -EIO;
		goto out_release_filter;
	}
	*out = xmalloc((size_t)size);
	if (pread(fd, *out, (size_t)size, 0) != size) {
		free(*out);
		*out = NULL;
		ret = -EIO;
		goto out_release_filter;
	}
	*len = (size_t)size;
out_release_filter:
	if (fd >= 0)
		close(fd);
	seccomp_release(ctx);
	return ret;
}

/* The program, built on first use. */
static struct prog {
	pthread_once_t once;
	void *bpf;
	size_t len;
	int err;
} prog = { .once = PTHREAD_ONCE_INIT };

#ifdef SBX_EMBEDDED_BPF
#include "seccomp_bpf.h"

/* The compile-time program, if the libseccomp linked in built it. */
static bool embedded(struct prog *pg)
{
	const struct scmp_version *v = seccomp_version();

	if (!v || v->major != SBX_BPF_LIBSECCOMP_MAJOR || v->minor != SBX_BPF_LIBSECCOMP_MINOR ||
	    v->micro != SBX_BPF_LIBSECCOMP_MICRO)
		return false;
	pg->len = sizeof(sbx_bpf);
	pg->bpf = xmalloc(pg->len);
	memcpy(pg->bpf, sbx_bpf, pg->len);
	return true;
}
#else
static bool embedded(struct prog *pg)
{
	(void)pg;
	return false;
}
#endif

static void build_once(void)
{
	if (!embedded(&prog))
		prog.err = sbx_seccomp_export(&prog.bpf, &prog.len);
}

int sbx_seccomp_fd(void)
{
	struct prog *pg = &prog;
	int fd, ret;

	pthread_once(&pg->once, build_once);
	if (pg->err)
		return pg->err;
	fd = memfd_create("olp-seccomp", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	ret = write_all(fd, pg->bpf, pg->len);
	if (!ret && lseek(fd, 0, SEEK_SET) < 0)
		ret = -errno;
	/* Nobody may change the program between here and bwrap reading it. */
	if (!ret &&
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0)
		ret = -errno;
	if (ret) {
		close(fd);
		return ret;
	}
	return fd;
}

int sbx_seccomp_prepare(void)
{
	pthread_once(&prog.once, build_once);
	return prog.err;
}
