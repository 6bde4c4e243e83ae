/* olp-sandbox: run any command under exactly the policy olp-fcgi uses for provider
 * commands (for operators, tests and benchmarks), or check whether this host can.
 *
 *   olp-sandbox [--profile NAME] [--net] [--ro PATH]... [--rw PATH]... [--timeout SECONDS]
 *               [--as-mb MB] [--nproc N] [--disk-mb MB] [--memory-mb MB] [--pids N]
 *               [--cpu-pct PCT] [--cgroup auto|off|PATH] [--identity per_run|shared]
 *               [--uid-range BASE:COUNT] [--runtime-dir DIR] -- COMMAND [ARGS...]
 *   olp-sandbox --doctor [--json]
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
		"usage: olp-sandbox [--profile command|cli] [--net] [--ro PATH]... [--rw PATH]...\n"
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

static int doctor(bool json)
{
	struct check c[7];
	const struct sbx_status *st = sbx_status_get();
	struct sbx_policy *p = sbx_policy_new();
	struct buf out = BUF_INIT;
	struct sbx_callbacks cb = { .on_stdout = collect, .ctx = &out };
	struct sbx_result res;
	const char *cg;
	long v;
	size_t i, n = 0;
	bool all = true;

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
	c[n] = (struct check){ .name = "seccomp", .ok = false };
	if (st->available &&
	    sbx_run(p,
		    (const char *const[]){ "/bin/sh", "-c", "grep ^Seccomp: /proc/self/status",
					   NULL },
		    NULL, &cb, &res) == 0 &&
	    strstr(out.data, "Seccomp:\t2")) {
		c[n].ok = true;
		snprintf(c[n].detail, sizeof(c[n].detail), "filter loaded (Seccomp: 2 inside)");
	} else {
		snprintf(c[n].detail, sizeof(c[n].detail), "filter not seen inside the sandbox");
	}
	n++;
	/* Whose uid the runs are (ADR 0014): their own, or why not. */
	c[n] = (struct check){ .name = "identity", .ok = strcmp(st->identity, "unavailable") != 0 };
	snprintf(c[n].detail, sizeof(c[n].detail), "%s: %s", st->identity, st->identity_detail);
	n++;
	c[n] = (struct check){ .name = "cgroup", .ok = true };
	cg = cgroup_mode(st, c[n].detail, sizeof(c[n].detail));
	n++;
	/* Known blockers, each with its fix. */
	c[n] = (struct check){ .name = "apparmor_userns", .ok = true };
	if (read_int_file("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", &v) == 0 && v) {
		c[n].ok = st->available;
		snprintf(c[n].detail, sizeof(c[n].detail),
			 "kernel.apparmor_restrict_unprivileged_userns=1 (Ubuntu): allow bwrap "
			 "with an "
			 "AppArmor profile (apt-get install apparmor-profiles; see "
			 "docs/sandbox.md) or "
			 "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0");
	} else {
		snprintf(c[n].detail, sizeof(c[n].detail),
			 "no AppArmor user-namespace restriction");
	}
	n++;
	c[n] = (struct check){ .name = "max_user_namespaces", .ok = true };
	if (read_int_file("/proc/sys/user/max_user_namespaces", &v) == 0 && v == 0) {
		c[n].ok = false;
		snprintf(c[n].detail, sizeof(c[n].detail),
			 "user.max_user_namespaces=0: sysctl -w user.max_user_namespaces=10000");
	} else if (read_int_file("/proc/sys/kernel/unprivileged_userns_clone", &v) == 0 && v == 0) {
		c[n].ok = st->available;
		snprintf(c[n].detail, sizeof(c[n].detail),
			 "kernel.unprivileged_userns_clone=0: sysctl -w "
			 "kernel.unprivileged_userns_clone=1");
	} else {
		snprintf(c[n].detail, sizeof(c[n].detail), "user namespaces enabled");
	}
	n++;

	for (i = 0; i < n; i++)
		all = all && c[i].ok;
	all = all && st->available;
	if (json) {
		struct buf j = BUF_INIT;

		buf_addf(&j,
			 "{\"ok\":%s,\"mode\":\"%s\",\"cgroup_mode\":\"%s\",\"limits\":\"%s\","
			 "\"identity\":\"%s\",\"checks\":[",
			 all ? "true" : "false", st->mode, cg, st->cgroup, st->identity);
		for (i = 0; i < n; i++) {
			buf_addf(&j, "%s{\"name\":\"%s\",\"ok\":%s,\"detail\":", i ? "," : "",
				 c[i].name, c[i].ok ? "true" : "false");
			buf_add_json_str(&j, c[i].detail, strlen(c[i].detail));
			buf_addch(&j, '}');
		}
		buf_adds(&j, "]}\n");
		(void)fputs(j.data, stdout);
		buf_release(&j);
	} else {
		for (i = 0; i < n; i++)
			printf("%-20s %-4s %s\n", c[i].name, c[i].ok ? "ok" : "FAIL", c[i].detail);
		printf("%s\n", all ? "sandbox: usable"
				   : "sandbox: NOT usable (provider requests would fail with 503)");
	}
	buf_release(&out);
	sbx_policy_free(p);
	return all ? 0 : 1;
}

static void policy_freep(struct sbx_policy **p)
{
	sbx_policy_free(*p);
}

int main(int argc, char **argv)
{
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP };
	struct sbx_run_options opt = { .pass_stdin = true, .pass_stderr = true, .hangup_fd = -1 };
	struct sbx_callbacks cb = { .on_stdout = to_stdout, .on_result = answer_now };
	struct sbx_result res;
	/* Freed on every way out, so that a sanitizer build exits clean. */
	struct sbx_policy *p __attribute__((cleanup(policy_freep))) = NULL;
	char runtime[PATH_MAX], *real, auto_free *exe = NULL;
	const char *profile = "command";
	struct sbx_limits limits = { 0 };
	bool net = false, do_doctor = false, json = false;
	double timeout = 0;
	uint64_t *lim;
	int i, ret, first_cmd = -1;

	log_set_program("olp-sandbox");
	/* The same lockdown as the worker's, so the policy is exactly the server's. */
	if (sbx_lockdown_self() < 0) {
		perror("olp-sandbox: cannot drop privileges");
		return 125;
	}
	default_runtime_dir(runtime, sizeof(runtime));
	p = sbx_policy_new();
	for (i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (!strcmp(a, "--")) {
			first_cmd = i + 1;
			break;
		} else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(a, "--doctor")) {
			do_doctor = true;
		} else if (!strcmp(a, "--json")) {
			json = true;
		} else if (!strcmp(a, "--net")) {
			net = true;
		} else if ((!strcmp(a, "--ro") || !strcmp(a, "--rw")) && i + 1 < argc) {
			real = realpath(argv[i + 1], NULL);
			if (!real) {
				fprintf(stderr, "olp-sandbox: %s: %s\n", argv[i + 1],
					strerror(errno));
				return 2;
			}
			ret = !strcmp(a, "--ro") ? sbx_policy_add_ro(p, real)
						 : sbx_policy_add_rw(p, real);
			free(real);
			if (ret)
				return 2;
			i++;
		} else if (!strcmp(a, "--profile") && i + 1 < argc) {
			profile = argv[++i];
		} else if (!strcmp(a, "--timeout") && i + 1 < argc) {
			char *end;

			timeout = strtod(argv[++i], &end);
			if (*end || timeout < 0) {
				fprintf(stderr, "olp-sandbox: --timeout takes seconds\n");
				return 2;
			}
		} else if ((lim = limit_field(&limits, a)) && i + 1 < argc) {
			if (parse_u64(argv[i + 1], lim) || !*lim) {
				fprintf(stderr, "olp-sandbox: %s takes a positive number\n", a);
				return 2;
			}
			i++;
		} else if (!strcmp(a, "--cgroup") && i + 1 < argc) {
			cfg.cgroup = argv[++i];
		} else if (!strcmp(a, "--identity") && i + 1 < argc) {
			i++;
			if (strcmp(argv[i], "per_run") && strcmp(argv[i], "shared")) {
				fprintf(stderr, "olp-sandbox: --identity is per_run or shared\n");
				return 2;
			}
			cfg.identity = !strcmp(argv[i], "shared") ? SBX_IDENTITY_SHARED
								  : SBX_IDENTITY_PER_RUN;
		} else if (!strcmp(a, "--uid-range") && i + 1 < argc) {
			cfg.uid_range = argv[++i];
		} else if (!strcmp(a, "--runtime-dir") && i + 1 < argc) {
			snprintf(runtime, sizeof(runtime), "%s", argv[++i]);
		} else {
			usage(stderr);
			return 2;
		}
	}
	if (sbx_policy_apply_profile(p, profile)) {
		fprintf(stderr, "olp-sandbox: unknown profile %s (command, cli)\n", profile);
		return 2;
	}
	if (net)
		sbx_policy_set_network(p, true);
	sbx_policy_set_limits(p, &limits);
	if (timeout > 0)
		sbx_policy_set_timeout_ms(p, (uint64_t)(timeout * 1000));
	cfg.runtime_dir = runtime;
	ret = sbx_global_init(&cfg);
	if (ret) {
		fprintf(stderr, "olp-sandbox: runtime dir %s: %s\n", runtime, strerror(-ret));
		return 125;
	}
	if (do_doctor)
		return doctor(json);
	if (first_cmd < 0 || first_cmd >= argc) {
		usage(stderr);
		return 2;
	}
	exe = resolve(argv[first_cmd]);
	if (!exe) {
		fprintf(stderr, "olp-sandbox: %s: command not found\n", argv[first_cmd]);
		return 127;
	}
	/* As for command providers: the program itself is visible, read-only. */
	if (strncmp(exe, "/usr/", 5))
		sbx_policy_add_ro(p, exe);
	argv[first_cmd] = exe;
	if ((ret = catch_stops())) {
		fprintf(stderr, "olp-sandbox: signals: %s\n", strerror(-ret));
		return 125;
	}
	opt.hangup_fd = stop_pipe[0];
	ret = sbx_run(p, (const char *const *)argv + first_cmd, &opt, &cb, &res);
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
