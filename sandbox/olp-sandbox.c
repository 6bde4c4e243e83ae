/* olp-sandbox: run any command in the sandbox olp-fcgi runs provider commands in (for
 * operators, tests and benchmarks), or check whether this host can. The sandbox is the
 * same code (sandbox/: namespaces, mounts, /etc copies, seccomp filter, identity, limits,
 * lockdown); the policy is built from the options below, not from a provider's
 * configuration: a provider's credentials, environment and forwarder are olp-fcgi's.
 *
 *   olp-sandbox [--net] [--network none|host|loopback[:PORT]] [--ro PATH]... [--rw PATH]... [--timeout SECONDS]
 *               [--as-mb MB] [--nproc N] [--disk-mb MB] [--memory-mb MB] [--pids N]
 *               [--cpu-pct PCT] [--cgroup auto|off|PATH] [--identity per_run|shared]
 *               [--uid-range BASE:COUNT] [--runtime-dir DIR] -- COMMAND [ARGS...]
 *   olp-sandbox --doctor [--json]
 *
 * --network loopback gives the run a namespace of its own with only lo, and a socket
 * listening on 127.0.0.1:PORT in it (PORT 0 or none: the kernel picks one; it is printed
 * on stderr). Nothing answers there: connections are queued, never read.
 *
 * Exit status: the command's own; 128+N when it died of signal N; 124 on timeout; 125
 * when the sandbox could not be set up; 2 on a usage error. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "sandbox/sandbox.h"
#include "common/banned.h"

static void usage(FILE *f)
{
	(void)fputs(
		"usage: olp-sandbox [--net] [--ro PATH]... [--rw PATH]...\n"
		"                   [--network none|host|loopback[:PORT]]\n"
		"                   [--timeout SECONDS] [--as-mb MB] [--nproc N] [--disk-mb MB]\n"
		"                   [--memory-mb MB] [--pids N] [--cpu-pct PCT]\n"
		"                   [--cgroup auto|off|PATH] [--identity per_run|shared]\n"
		"                   [--uid-range BASE:COUNT] [--runtime-dir DIR] -- COMMAND "
		"[ARGS...]\n"
		"       olp-sandbox --doctor [--json]\n"
		"\n"
		"Runs COMMAND inside the sandbox olp-fcgi uses for provider commands: bubblewrap\n"
		"with new namespaces, an allowlisted read-only root, a size-limited scratch HOME,\n"
		"a seccomp filter, no capabilities, a host uid of its own, rlimits, and its own\n"
		"cgroup when a cgroup v2 is delegated to it. Only fds 0-2 reach the command.\n"
		"--network: no network (the default), the host's (--net), or a namespace with "
		"only\n"
		"lo and a listener on 127.0.0.1:PORT that nothing answers (its port on stderr).\n"
		"--doctor checks that this host can start that sandbox (exit 0 only if it can).\n",
		f);
}

static int to_stdout(void *ctx, const char *data, size_t len)
{
	(void)ctx;
	return write_all(STDOUT_FILENO, data, len) ? -1 : 0;
}

/* Ctrl-C, SIGTERM, SIGHUP: the run is stopped the way the server stops one (the whole
 * tree killed, its init learnt first so that a sandbox halfway built is not left blocked
 * for ever, then cleaned up), not by dying and leaving bwrap to its death signal. The
 * handler closes the write end of a pipe whose read end is the run's hang-up fd. */
static int stop_pipe[2] = { -1, -1 };
static volatile sig_atomic_t stop_signal;

static void on_stop(int sig)
{
	int saved = errno;

	stop_signal = sig;
	if (stop_pipe[1] >= 0) {
		close(stop_pipe[1]);
		stop_pipe[1] = -1;
	}
	errno = saved;
}

static int catch_stops(void)
{
	struct sigaction sa = { .sa_handler = on_stop };
	static const int sigs[] = { SIGINT, SIGTERM, SIGHUP };

	if (pipe2(stop_pipe, O_CLOEXEC) < 0)
		return -errno;
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < ARRAY_SIZE(sigs); i++)
		if (sigaction(sigs[i], &sa, NULL) < 0)
			return -errno;
	return 0;
}

/* Our exit status for a run that happened (see the top of this file). */
static int exit_code(const struct sbx_result *res)
{
	if (res->end == SBX_END_ABORTED && stop_signal)
		return 128 + stop_signal;
	switch (res->end) {
	case SBX_END_EXITED: return res->exit_status;
	case SBX_END_SIGNALED: return 128 + res->term_signal;
	case SBX_END_TIMEOUT: fprintf(stderr, "olp-sandbox: timed out\n"); return 124;
	default: return 125;
	}
}

/* The result is known: answer now. Whoever runs us waits for our exit status, not for the
 * sandbox's teardown, so a child of ours stays behind to kill what is left of the tree,
 * wait until it is gone and remove the run's cgroup and scratch dir (the server answers
 * before its teardown the same way, ADR 0003). The child lets go of our stdin and stdout
 * (a pipeline reading them ends now) and of stderr unless it is a terminal or a file. If
 * fork fails, the teardown happens here, before we exit. */
static bool answered; /* in the teardown child: the exit status is out */

static void answer_now(void *ctx, const struct sbx_result *res)
{
	struct stat st;
	int null, code = exit_code(res);
	pid_t pid;

	(void)ctx;
	pid = fork();
	if (pid > 0)
		_exit(code);
	if (pid < 0)
		return;
	answered = true;
	null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null < 0)
		return;
	dup2(null, STDIN_FILENO);
	dup2(null, STDOUT_FILENO);
	if (fstat(STDERR_FILENO, &st) == 0 && !S_ISREG(st.st_mode) && !isatty(STDERR_FILENO))
		dup2(null, STDERR_FILENO);
	close(null);
}

/* Resolve a command name the way a shell would, in the parent (never after fork). */
static char *resolve(const char *cmd)
{
	const char *path = getenv("PATH"), *p;
	char buf[PATH_MAX];

	if (strchr(cmd, '/'))
		return realpath(cmd, NULL);
	for (p = path ? path : "/usr/bin:/bin"; *p;) {
		size_t n = strcspn(p, ":");

		if (n &&
		    (size_t)snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, p, cmd) < sizeof(buf) &&
		    access(buf, X_OK) == 0)
			return realpath(buf, NULL);
		p += n;
		if (*p == ':')
			p++;
	}
	return NULL;
}

static void default_runtime_dir(char *out, size_t n)
{
	const char *x = getenv("XDG_RUNTIME_DIR");

	if (x && *x)
		snprintf(out, n, "%s/olp-sandbox", x);
	else
		snprintf(out, n, "/tmp/olp-sandbox-%ld", (long)getuid());
}

/* ---- doctor --------------------------------------------------------------------------- */

struct check {
	const char *name;
	bool ok;
	char detail[400];
};

/* The field a limit option sets, or NULL. */
static uint64_t *limit_field(struct sbx_limits *l, const char *opt)
{
	if (!strcmp(opt, "--as-mb"))
		return &l->as_mb;
	if (!strcmp(opt, "--nproc"))
		return &l->nproc;
	if (!strcmp(opt, "--memory-mb"))
		return &l->memory_mb;
	if (!strcmp(opt, "--pids"))
		return &l->pids;
	if (!strcmp(opt, "--cpu-pct"))
		return &l->cpu_pct;
	if (!strcmp(opt, "--disk-mb"))
		return &l->disk_mb;
	return NULL;
}

static int read_int_file(const char *path, long *v)
{
	struct buf b = BUF_INIT;
	int ret = buf_read_file(&b, path, 64);

	if (!ret)
		*v = strtol(b.data, NULL, 10);
	buf_release(&b);
	return ret;
}

static int collect(void *ctx, const char *data, size_t len)
{
	buf_add(ctx, data, len);
	return 0;
}

/* The host's cgroup layout, and what the sandbox makes of it. */
static const char *cgroup_mode(const struct sbx_status *st, char *detail, size_t n)
{
	struct stat sb;
	const char *layout = "v1";

	if (stat("/sys/fs/cgroup/cgroup.controllers", &sb) == 0)
		layout = "v2";
	else if (stat("/sys/fs/cgroup/unified/cgroup.controllers", &sb) == 0)
		layout = "hybrid";
	if (!strcmp(st->cgroup, "cgroup2"))
		snprintf(detail, n,
			 "cgroup v2: each run gets its own cgroup below %s (memory, pids, "
			 "cpu limits)",
			 st->cgroup_detail);
	else
		snprintf(detail, n, "%s: %s; limits are rlimits",
			 !strcmp(layout, "v2")	     ? "cgroup v2"
			 : !strcmp(layout, "hybrid") ? "cgroup v1/v2 hybrid"
						     : "cgroup v1 only",
			 st->cgroup_detail);
	return layout;
}

/* A real sandboxed run of the default policy shows the filter loaded inside. */
static void check_seccomp(const struct sbx_status *st, struct check *c)
{
	struct sbx_policy *p = sbx_policy_new();
	struct buf out = BUF_INIT;
	struct sbx_callbacks cb = { .on_stdout = collect, .ctx = &out };
	struct sbx_result res;

	*c = (struct check){ .name = "seccomp" };
	c->ok = st->available &&
		sbx_run(p,
			(const char *const[]){ "/bin/sh", "-c", "grep ^Seccomp: /proc/self/status",
					       NULL },
			NULL, &cb, &res) == 0 &&
		strstr(out.data, "Seccomp:\t2");
	snprintf(c->detail, sizeof(c->detail), "%s",
		 c->ok ? "filter loaded (Seccomp: 2 inside)"
		       : "filter not seen inside the sandbox");
	buf_release(&out);
	sbx_policy_free(p);
}

/* Known blockers of user namespaces, each with its fix. */
static void check_apparmor(const struct sbx_status *st, struct check *c)
{
	long v;

	*c = (struct check){ .name = "apparmor_userns", .ok = true };
	if (read_int_file("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", &v) == 0 && v) {
		c->ok = st->available;
		snprintf(c->detail, sizeof(c->detail),
			 "kernel.apparmor_restrict_unprivileged_userns=1 (Ubuntu): allow bwrap "
			 "with an "
			 "AppArmor profile (apt-get install apparmor-profiles; see "
			 "docs/sandbox.md) or "
			 "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0");
	} else {
		snprintf(c->detail, sizeof(c->detail), "no AppArmor user-namespace restriction");
	}
}

static void check_max_userns(const struct sbx_status *st, struct check *c)
{
	long v;

	*c = (struct check){ .name = "max_user_namespaces", .ok = true };
	if (read_int_file("/proc/sys/user/max_user_namespaces", &v) == 0 && v == 0) {
		c->ok = false;
		snprintf(c->detail, sizeof(c->detail),
			 "user.max_user_namespaces=0: sysctl -w user.max_user_namespaces=10000");
	} else if (read_int_file("/proc/sys/kernel/unprivileged_userns_clone", &v) == 0 && v == 0) {
		c->ok = st->available;
		snprintf(c->detail, sizeof(c->detail),
			 "kernel.unprivileged_userns_clone=0: sysctl -w "
			 "kernel.unprivileged_userns_clone=1");
	} else {
		snprintf(c->detail, sizeof(c->detail), "user namespaces enabled");
	}
}

static void print_json(const struct check *c, size_t n, bool all, const struct sbx_status *st,
		       const char *cg)
{
	struct buf j = BUF_INIT;

	buf_addf(&j,
		 "{\"ok\":%s,\"mode\":\"%s\",\"cgroup_mode\":\"%s\",\"limits\":\"%s\","
		 "\"identity\":\"%s\",\"checks\":[",
		 all ? "true" : "false", st->mode, cg, st->cgroup, st->identity);
	for (size_t i = 0; i < n; i++) {
		buf_addf(&j, "%s{\"name\":\"%s\",\"ok\":%s,\"detail\":", i ? "," : "", c[i].name,
			 c[i].ok ? "true" : "false");
		buf_add_json_str(&j, c[i].detail, strlen(c[i].detail));
		buf_addch(&j, '}');
	}
	buf_adds(&j, "]}\n");
	(void)fputs(j.data, stdout);
	buf_release(&j);
}

static void print_text(const struct check *c, size_t n, bool all)
{
	for (size_t i = 0; i < n; i++)
		printf("%-20s %-4s %s\n", c[i].name, c[i].ok ? "ok" : "FAIL", c[i].detail);
	printf("%s\n", all ? "sandbox: usable"
			   : "sandbox: NOT usable (provider requests would fail with 503)");
}

static int doctor(bool json)
{
	const struct sbx_status *st = sbx_status_get();
	struct check c[7];
	const char *cg;
	size_t n = 0;
	bool all = st->available;

	c[n] = (struct check){ .name = "bwrap", .ok = st->bwrap_version != NULL };
	snprintf(c[n].detail, sizeof(c[n].detail), "%s %s", st->bwrap_path,
		 st->bwrap_version ? st->bwrap_version : "not found (apt-get install bubblewrap)");
	n++;
	c[n] = (struct check){ .name = "user_namespaces", .ok = st->available };
	snprintf(c[n].detail, sizeof(c[n].detail), "%s",
		 st->available ? "a real sandboxed spawn worked"
		 : st->message ? st->message
			       : "failed");
	n++;
	check_seccomp(st, &c[n++]);
	/* Whose uid the runs are (ADR 0014): their own, or why not. */
	c[n] = (struct check){ .name = "identity", .ok = strcmp(st->identity, "unavailable") != 0 };
	snprintf(c[n].detail, sizeof(c[n].detail), "%s: %s", st->identity, st->identity_detail);
	n++;
	c[n] = (struct check){ .name = "cgroup", .ok = true };
	cg = cgroup_mode(st, c[n].detail, sizeof(c[n].detail));
	n++;
	check_apparmor(st, &c[n++]);
	check_max_userns(st, &c[n++]);
	for (size_t i = 0; i < n; i++)
		all = all && c[i].ok;
	if (json)
		print_json(c, n, all, st, cg);
	else
		print_text(c, n, all);
	return all ? 0 : 1;
}

static void policy_freep(struct sbx_policy **p)
{
	sbx_policy_free(*p);
}

/* The command line. */
struct options {
	struct sbx_global_config cfg;
	struct sbx_limits limits;
	char runtime[PATH_MAX];
	double timeout; /* seconds, 0 = none */
	int network;	/* --network: an enum sbx_net, or -1 for none (or --net) */
	uint16_t port;	/* --network loopback:PORT */
	bool net, doctor, json;
	int first_cmd; /* argv index of COMMAND, or -1 */
};

/* --ro PATH, --rw PATH: the real path, bound. 0 or the exit status. */
static int add_path(struct sbx_policy *p, const char *opt, const char *path)
{
	char *real = realpath(path, NULL);
	int ret;

	if (!real) {
		fprintf(stderr, "olp-sandbox: %s: %s\n", path, strerror(errno));
		return 2;
	}
	ret = !strcmp(opt, "--ro") ? sbx_policy_add_ro(p, real) : sbx_policy_add_rw(p, real);
	free(real);
	return ret ? 2 : 0;
}

/* --network none|host|loopback[:PORT]: 0 or the exit status. */
static int network_option(struct options *o, const char *v)
{
	uint64_t port = 0;

	if (!strcmp(v, "none")) {
		o->network = SBX_NET_NONE;
	} else if (!strcmp(v, "host")) {
		o->network = SBX_NET_HOST;
	} else if (!strncmp(v, "loopback", 8) &&
		   (!v[8] || (v[8] == ':' && !parse_u64(v + 9, &port) && port <= 65535))) {
		o->network = SBX_NET_LOOPBACK;
		o->port = (uint16_t)port;
	} else {
		fprintf(stderr, "olp-sandbox: --network is none, host or loopback[:PORT]\n");
		return 2;
	}
	return 0;
}

/* An option that takes a value, argv[i] with its value v: 0 or the exit status. */
static int value_option(struct options *o, struct sbx_policy *p, const char *a, const char *v)
{
	uint64_t *lim = limit_field(&o->limits, a);
	char *end;

	if (!strcmp(a, "--ro") || !strcmp(a, "--rw"))
		return add_path(p, a, v);
	if (lim) {
		if (parse_u64(v, lim) || !*lim) {
			fprintf(stderr, "olp-sandbox: %s takes a positive number\n", a);
			return 2;
		}
	} else if (!strcmp(a, "--timeout")) {
		o->timeout = strtod(v, &end);
		if (*end || o->timeout < 0) {
			fprintf(stderr, "olp-sandbox: --timeout takes seconds\n");
			return 2;
		}
	} else if (!strcmp(a, "--network")) {
		return network_option(o, v);
	} else if (!strcmp(a, "--cgroup")) {
		o->cfg.cgroup = v;
	} else if (!strcmp(a, "--identity")) {
		if (strcmp(v, "per_run") && strcmp(v, "shared")) {
			fprintf(stderr, "olp-sandbox: --identity is per_run or shared\n");
			return 2;
		}
		o->cfg.identity = !strcmp(v, "shared") ? SBX_IDENTITY_SHARED : SBX_IDENTITY_PER_RUN;
	} else if (!strcmp(a, "--uid-range")) {
		o->cfg.uid_range = v;
	} else if (!strcmp(a, "--runtime-dir")) {
		snprintf(o->runtime, sizeof(o->runtime), "%s", v);
	} else {
		usage(stderr);
		return 2;
	}
	return 0;
}

/* The options before "--": -1 to go on, else the exit status (--help, a usage error). */
static int parse_options(struct options *o, struct sbx_policy *p, int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int ret;

		if (!strcmp(a, "--")) {
			o->first_cmd = i + 1;
			break;
		} else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(a, "--doctor")) {
			o->doctor = true;
		} else if (!strcmp(a, "--json")) {
			o->json = true;
		} else if (!strcmp(a, "--net")) {
			o->net = true;
		} else if (i + 1 < argc) {
			if ((ret = value_option(o, p, a, argv[++i])))
				return ret;
		} else {
			usage(stderr);
			return 2;
		}
	}
	return -1;
}

/* The policy and the process-wide settings the options give: -1 to go on, else the exit
 * status. */
static int apply_options(struct options *o, struct sbx_policy *p)
{
	int ret;

	if (o->net)
		sbx_policy_set_network(p, true);
	if (o->network >= 0)
		sbx_policy_set_net(p, (enum sbx_net)o->network, o->port);
	sbx_policy_set_limits(p, &o->limits);
	if (o->timeout > 0)
		sbx_policy_set_timeout_ms(p, (uint64_t)(o->timeout * 1000));
	o->cfg.runtime_dir = o->runtime;
	ret = sbx_global_init(&o->cfg);
	if (ret) {
		fprintf(stderr, "olp-sandbox: runtime dir %s: %s\n", o->runtime, strerror(-ret));
		return 125;
	}
	return -1;
}

/* --network loopback: say where the listener is and keep it, unanswered, for the run. */
static int listener_fd = -1;

static int on_listener(void *ctx, int fd, uint16_t port)
{
	(void)ctx;
	listener_fd = fd;
	fprintf(stderr, "olp-sandbox: the run's listener: 127.0.0.1:%u (nothing answers)\n",
		(unsigned)port);
	return 0;
}

/* Run COMMAND (argv[first]...) under p: our exit status. */
static int run_command(struct sbx_policy *p, char **argv, int first)
{
	struct sbx_run_options opt = { .pass_stdin = true, .pass_stderr = true, .hangup_fd = -1 };
	struct sbx_callbacks cb = { .on_stdout = to_stdout,
				    .on_result = answer_now,
				    .on_listener = on_listener };
	struct sbx_result res;
	char auto_free *exe = resolve(argv[first]);
	int ret;

	if (!exe) {
		fprintf(stderr, "olp-sandbox: %s: command not found\n", argv[first]);
		return 127;
	}
	/* As for command providers: the program itself is visible, read-only. */
	if (strncmp(exe, "/usr/", 5))
		sbx_policy_add_ro(p, exe);
	argv[first] = exe;
	if ((ret = catch_stops())) {
		fprintf(stderr, "olp-sandbox: signals: %s\n", strerror(-ret));
		return 125;
	}
	opt.hangup_fd = stop_pipe[0];
	ret = sbx_run(p, (const char *const *)argv + first, &opt, &cb, &res);
	if (listener_fd >= 0)
		close(listener_fd);
	sbx_global_release();
	if (ret) {
		fprintf(stderr, "olp-sandbox: cannot start: %s (%s)\n", strerror(-ret),
			res.spawn_stage ? res.spawn_stage : "?");
		return 125;
	}
	/* The teardown child: its status goes nowhere. */
	if (answered)
		return 0;
	return exit_code(&res);
}

int main(int argc, char **argv)
{
	struct options o = { .cfg = { .mode = SBX_MODE_BWRAP }, .network = -1, .first_cmd = -1 };
	/* Freed on every way out, so that a sanitizer build exits clean. */
	struct sbx_policy *p __attribute__((cleanup(policy_freep))) = NULL;
	int ret;

	log_set_program("olp-sandbox");
	/* The same lockdown as the worker's, so that the sandbox is the server's. */
	if (sbx_lockdown_self() < 0) {
		perror("olp-sandbox: cannot drop privileges");
		return 125;
	}
	default_runtime_dir(o.runtime, sizeof(o.runtime));
	p = sbx_policy_new();
	if ((ret = parse_options(&o, p, argc, argv)) >= 0 || (ret = apply_options(&o, p)) >= 0)
		return ret;
	if (o.doctor)
		return doctor(o.json);
	if (o.first_cmd < 0 || o.first_cmd >= argc) {
		usage(stderr);
		return 2;
	}
	return run_command(p, argv, o.first_cmd);
}
