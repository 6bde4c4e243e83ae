/* olp-fcgi: the worker process. Spawned by the web server (lighttpd mod_fastcgi, Apache
 * mod_fcgid, spawn-fcgi) with its listening socket on fd 0, it serves requests on N
 * threads, each with its own FCGX_Request. Started any other way (plain CGI), it answers
 * the one request in its environment and exits. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fcgi/worker.h"
#include "common/banned.h"

extern char **environ;

static struct fcgi_app app;

/* FCGX_Accept_r's failures (-errno) that pass: a lack of resources, a connection that went
 * before it was taken. Anything else (the listening socket gone) ends the thread. */
static bool accept_transient(int rc)
{
	switch (-rc) {
	case EMFILE:
	case ENFILE:
	case ENOMEM:
	case ENOBUFS:
	case EINTR:
	case ECONNABORTED:
	case EAGAIN: return true;
	default: return false;
	}
}

static void *serve_thread(void *arg)
{
	FCGX_Request req;
	unsigned accept_failing = 0;

	(void)arg;
	if (FCGX_InitRequest(&req, 0, 0) != 0) {
		log_errx(NULL, "FCGX_InitRequest failed");
		return NULL;
	}
	for (;;) {
		struct fcgi_io io = { .fcgx = &req, .hangup_fd = -1, .held = BUF_INIT };
		int rc;

		/* No lock around it, unlike libfcgi's threaded example (for platforms whose
		 * accept() must be serialised): on Linux threads blocked in accept(2) on one
		 * socket are woken one per connection, and FCGX_Accept_r keeps its state in
		 * req. Under a lock, a thread also held every other out while it waited for
		 * and read its request's parameters: under load, the worker's largest wait. */
		rc = FCGX_Accept_r(&req);
		if (rc < 0 && accept_transient(rc)) {
			/* Out of descriptors or memory for a moment (many runs at once, a
			 * low RLIMIT_NOFILE): a thread that stopped here would never come
			 * back, and a worker with none left holds its socket answering no one.
			 * Wait and take the next connection; say so once per streak. */
			if (!accept_failing++)
				log_warnx(NULL, "FCGX_Accept_r: %s; retrying", strerror(-rc));
			nanosleep(&(struct timespec){ .tv_nsec = 100L * 1000 * 1000 }, NULL);
			continue;
		}
		if (rc < 0) {
			log_warnx(NULL, "FCGX_Accept_r: %d; thread stops", rc);
			break;
		}
		if (accept_failing)
			log_info(NULL, "FCGX_Accept_r: accepting again after %u failures",
				 accept_failing);
		accept_failing = 0;
		io.envp = req.envp;
		io.hangup_fd = req.ipcFd;
		fcgi_handle(&app, &io);
		FCGX_Finish_r(&req);
	}
	FCGX_Free(&req, 1);
	return NULL;
}

/* CGI: read what is left of the request body once the answer is out. Apache's mod_cgid
 * writes the whole body before it reads a byte of the answer, so an answer given without
 * reading the body (401, 413, 415: refused before it is read) would end in a broken pipe
 * there and the client would get no answer at all. Only a request that declared a body
 * (CONTENT_LENGTH, RFC 3875), at most that much and 64 MiB: then the program goes, as it
 * always did (the web servers' own limits stop far below that). */
static void cgi_drain_stdin(void)
{
	static char sink[65536];
	const char *cl = getenv("CONTENT_LENGTH");
	uint64_t left = 0;

	if (!cl || parse_u64(cl, &left))
		return;
	if (left > ((uint64_t)64 << 20))
		left = (uint64_t)64 << 20;
	while (left) {
		ssize_t n = read(STDIN_FILENO, sink, left < sizeof(sink) ? left : sizeof(sink));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		left -= (uint64_t)n;
	}
}

static void usage(FILE *f)
{
	(void)fputs(
		"usage: olp-fcgi [--version | --help | --check-config]\n"
		"\n"
		"OpenAI-compatible LLM proxy worker, run by a FastCGI-capable web server\n"
		"(lighttpd mod_fastcgi, Apache mod_fcgid, spawn-fcgi) or as a plain CGI program.\n"
		"\n"
		"Environment: OLP_HOME (default ~/.olp), OLP_OWNER_TOKEN, OLP_THREADS (16),\n"
		"OLP_ROUTE_PREFIX, OLP_REGISTRY, OLP_LOG_LEVEL (debug|info|warn|error),\n"
		"OLP_EXIT_WITH_PARENT (set by lighttpd/olp.conf: exit when the web server does).\n"
		"Configuration: $OLP_HOME/config.json, $OLP_HOME/models-registry.json.\n"
		"--check-config: check them (and the files they name) as a worker starting with\n"
		"this environment and user would, then exit: 0 ready, 1 with the reason.\n",
		f);
}

static void set_log_level(void)
{
	const char *lvl = getenv("OLP_LOG_LEVEL");

	if (!lvl)
		return;
	if (!strcmp(lvl, "debug"))
		log_set_level(LOG_LVL_DEBUG);
	else if (!strcmp(lvl, "warn"))
		log_set_level(LOG_LVL_WARN);
	else if (!strcmp(lvl, "error"))
		log_set_level(LOG_LVL_ERROR);
}

/* config.json, the registry, and the chains that name the registry's models: everything
 * a request reads, checked before anything starts. 0, or -1 with why in err. */
static int load_config(struct buf *err)
{
	struct buf why = BUF_INIT;
	int ret = -1;

	if (fcgi_config_load(&app.cfg, &why)) {
		buf_addf(err, "configuration: %s", why.data);
		goto out_why;
	}
	app.reg = prov_registry_load(app.cfg.registry_path,
				     json_object_get(app.cfg.json, "providers"), &why);
	if (!app.reg) {
		buf_addf(err, "models registry: %s", why.data);
		goto out_why;
	}
	if (fcgi_config_bind(&app.cfg, app.reg, &why)) {
		buf_addf(err, "configuration: %s", why.data);
		goto out_why;
	}
	ret = 0;
out_why:
	buf_release(&why);
	return ret;
}

/* olp-fcgi --check-config: what a worker checks as it starts (config.json, the registry,
 * the provider settings and the key files they name, the key store's directory), as the
 * user running it, with no socket, thread or sandbox. deploy/olp-local serve runs it as
 * the workers' user before it starts the web server: a worker that would exit at start
 * (and be respawned by lighttpd, behind nothing but 503s) is named with its reason instead.
 * Exit status 0 (ready) or 1 (the reason on stderr). */
/* --check-config with a shared store: the passfile as the workers' user reads it, and
 * whether the database answers now (it need not: the workers start either way). */
static int check_store(struct buf *err)
{
	struct store_options so = { .passfile = app.cfg.store_passfile,
				    .max_conns = 1,
				    .application_name = "olp-fcgi" };
	struct store_health h;
	struct store_db *db;

	if (!app.cfg.store_url)
		return 0;
	db = store_open(app.cfg.store_url, &so, err);
	if (!db)
		return -1;
	store_health(db, &h);
	if (h.ok)
		printf("olp-fcgi: the shared store %s answers\n", h.where);
	else
		printf("olp-fcgi: the shared store %s does not answer now (%s): the workers "
		       "start anyway and reach it once it does\n",
		       h.where, h.last_error);
	store_free(db);
	return 0;
}

static int check_config(void)
{
	struct buf err = BUF_INIT;
	char *keys = NULL;
	int ret = 1;

	if (load_config(&err))
		goto out;
	/* Missing is fine (the first key makes it); unreadable is every key refused. */
	keys = path_join(app.cfg.home, "keys");
	if (access(keys, F_OK) == 0 && access(keys, R_OK | X_OK) < 0) {
		buf_addf(&err,
			 "key store %s: %s: every key would be refused (it must belong to "
			 "the user the workers run as)",
			 keys, strerror(errno));
		goto out;
	}
	if (check_store(&err))
		goto out;
	printf("olp-fcgi: configuration ready: %zu models from %s\nolp-fcgi: %s\n",
	       prov_registry_model_count(app.reg), app.cfg.registry_path, app.cfg.sizing);
	ret = 0;
out:
	if (ret)
		(void)fprintf(stderr, "olp-fcgi: %s\n", err.data);
	free(keys);
	buf_release(&err);
	return ret;
}

/* Say loudly when requests will be refused or run without isolation. */
static void report_ready(void)
{
	/* Probes the sandbox now rather than on the first request. */
	const struct sbx_status *st = sbx_status_get();

	if (app.cfg.sandbox_mode == SBX_MODE_OFF)
		log_warnx(NULL, "SANDBOX OFF: %s", st->message);
	else if (!st->available)
		log_errx(NULL, "sandbox unavailable, provider requests will fail with 503: %s",
			 st->message);
	if (!strcmp(st->identity, "shared"))
		log_warnx(NULL, "SANDBOX IDENTITY SHARED: %s", st->identity_detail);
	for (size_t i = 0; i < prov_registry_provider_count(app.reg); i++) {
		const struct prov_provider *pv = prov_registry_provider_at(app.reg, i);
		struct prov_net_info ni;

		prov_provider_net_info(pv, &ni);
		if (!strcmp(ni.mode, "host"))
			log_warnx(NULL,
				  "PROVIDER NETWORK HOST: provider %s runs with the host's whole "
				  "network (loopback services, metadata, private ranges)",
				  prov_provider_name(pv));
		else if ((!strcmp(ni.mode, "upstream") || !strcmp(ni.mode, "connect")) &&
			 app.cfg.sandbox_mode == SBX_MODE_OFF)
			/* No namespace at all in mode off: every run fails closed. */
			log_errx(NULL,
				 "provider %s: network \"%s\" needs the sandbox, which is off: "
				 "its requests fail with 503 (network \"host\" gives it the "
				 "host's network)",
				 prov_provider_name(pv), ni.mode);
	}
	log_info(NULL,
		 "olp-fcgi %s ready: %zu models from %s, %u threads, sandbox %s, limits %s (%s), "
		 "identity %s (%s)",
		 OLP_VERSION, prov_registry_model_count(app.reg), app.cfg.registry_path,
		 app.cfg.threads, st->active ? "active" : "INACTIVE", st->cgroup, st->cgroup_detail,
		 st->identity, st->identity_detail);
}

/* The pool's shared metrics (ADR 0021), in the runtime dir. Without them requests are
 * served as ever and GET /metrics says it cannot answer. */
static void open_metrics(bool cgi)
{
	struct buf err = BUF_INIT;

	if (metrics_open(app.cfg.runtime_dir, &err))
		log_warnx(NULL, "metrics: %s; GET /metrics answers 503", err.data);
	buf_release(&err);
	/* Each provider's gauge at 0 from the start; not once per CGI request. */
	for (size_t i = 0; !cgi && i < prov_registry_provider_count(app.reg); i++)
		metrics_provider_add(prov_provider_name(prov_registry_provider_at(app.reg, i)));
}

/* Pre-started processes are this process's; their counts are the host's (the shared
 * metrics), so that /health says the same whichever worker answers. */
static void on_prestart(enum sbx_prestart_event ev)
{
	metrics_prestart_event(sbx_prestart_event_name(ev), ev == SBX_PRESTART_READY  ? 1
							    : ev == SBX_PRESTART_MISS ? 0
										      : -1);
}

/* The sandbox runtime, the providers' and the keys' concurrency slots: 0, or -1 (logged).
 * cgi: as in app_init. */
static int init_sandbox(bool cgi)
{
	struct sbx_global_config sc;
	int ret;

	sc = (struct sbx_global_config){ .mode = app.cfg.sandbox_mode,
					 .bwrap_path = app.cfg.bwrap,
					 .runtime_dir = app.cfg.runtime_dir,
					 .exec_stub = app.cfg.sandbox_exec,
					 /* A warm sandbox outlives the run it follows:
					  * a one-request process would only strand it
					  * half-built at exit (ADR 0008). */
					 .warm = app.cfg.sandbox_warm && !cgi,
					 .warm_per_policy = app.cfg.sandbox_warm_per_policy,
					 /* Likewise a pre-started process (ADR 0022). */
					 .prestart_max = cgi ? 0 : app.cfg.sandbox_prestart_max,
					 .prestart_idle_ms = app.cfg.sandbox_prestart_idle_ms,
					 .prestart_per_owner = app.cfg.sandbox_prestart_per_key,
					 .on_prestart = on_prestart,
					 .identity = app.cfg.sandbox_identity,
					 .uid_range = app.cfg.sandbox_uid_range,
					 .cgroup = app.cfg.sandbox_cgroup };
	ret = sbx_global_init(&sc);
	if (ret) {
		log_errx(NULL, "sandbox runtime dir %s: %s", app.cfg.runtime_dir, strerror(-ret));
		return -1;
	}
	/* The concurrency slots live beside the scratch dirs: one place for the whole pool. */
	ret = prov_set_state_dir(app.cfg.runtime_dir);
	if (ret)
		log_warnx(NULL, "concurrency slots in %s: %s; providers run uncapped",
			  app.cfg.runtime_dir, strerror(-ret));
	prov_registry_notes(app.reg, app.cfg.runtime_dir);
	return 0;
}

/* The keys' concurrency slots (quota max_concurrent, usage.h): with the shared store,
 * leases in it, held across hosts; else slot files beside the scratch dirs, in a dir of
 * their own (a key's file names can never meet a provider's). None: such keys are
 * refused (fail closed). */
static void open_leases(void)
{
	app.leases = usage_leases_open(&(struct usage_lease_options){
		.runtime_dir = app.cfg.runtime_dir, .store = app.store });
	if (!app.leases)
		log_warn(NULL,
			 "key concurrency slots in %s/keyslots; keys with max_concurrent are "
			 "refused",
			 app.cfg.runtime_dir);
}

/* The shared store of several hosts, when config.json names one (ADR 0034): 0, or -1
 * (logged) for a URL or passfile it refuses. A database that cannot be reached now is not
 * an error: the worker starts, says so in /health, and reaches it once it answers. */
static int open_store(void)
{
	struct store_options so;
	struct store_health h;
	struct buf err = BUF_INIT;

	if (!app.cfg.store_url)
		return 0;
	so = (struct store_options){ .passfile = app.cfg.store_passfile,
				     .max_conns = app.cfg.threads < 8 ? app.cfg.threads + 1 : 8,
				     .application_name = "olp-fcgi" };
	app.store = store_open(app.cfg.store_url, &so, &err);
	if (!app.store) {
		log_errx(NULL, "store: %s", err.data);
		buf_release(&err);
		return -1;
	}
	store_health(app.store, &h);
	if (h.ok)
		log_info(NULL, "keys and usage in the shared store %s", h.where);
	else
		log_warnx(NULL,
			  "the shared store %s cannot be reached now (%s): keys checked "
			  "before are served for %u s, keys with a quota are refused until it "
			  "answers",
			  h.where, h.last_error, app.cfg.store_offline_keys_s);
	fcgi_store_sync(app.store);
	return 0;
}

/* The accounts' limits and the unbound keys' account choices in the shared store too
 * (ADR 0035 and 0037 amendments), so that every host refuses a rejected account and an
 * unbound key runs on one account whichever host serves it. Before open_auth, which
 * starts the store's listener thread. Not for a CGI process: it answers one request,
 * and has no listener to keep a cache fresh (its host's files are used). Advisory: a
 * failure here leaves each host its own files (logged). */
static void open_shared_accounts(bool cgi)
{
	if (app.store)
		app.accounts_shared = cgi ? -EOPNOTSUPP : prov_store_attach(app.store);
}

/* The key store, with the anonymous access and audit options: 0, or -1 (logged). */
static int open_auth(bool cgi)
{
	struct auth_anonymous anon;
	struct auth_options ao;

	anon = (struct auth_anonymous){ .all_providers = app.cfg.anon_all,
					.providers = (const char *const *)app.cfg.anon_providers.v,
					.n_providers = app.cfg.anon_providers.n,
					.quota = app.cfg.anon_quota };
	ao = (struct auth_options){ .allow_anonymous = app.cfg.allow_anonymous,
				    .env_owner_token = getenv("OLP_OWNER_TOKEN"),
				    .anonymous = &anon,
				    .audit_max_bytes = app.cfg.audit_max_bytes,
				    .audit_keep = app.cfg.audit_keep,
				    /* The shared store's keys (ADR 0034); a CGI process lives for
				     * one request: no LISTEN thread, no cache. */
				    .store = app.store,
				    .store_offline_keys_s = app.cfg.store_offline_keys_s,
				    .store_no_listen = cgi };
	app.auth = auth_store_open(app.cfg.home, &ao);
	if (!app.auth) {
		log_err(NULL, "key store in %s", app.cfg.home);
		return -1;
	}
	/* The token must not linger where a later child or a core dump could see it. This is
	 * the last change to the environment: the serving threads start after it and read
	 * it with getenv (providers/cli.c, CGI mode), which is safe only while nothing calls
	 * setenv, putenv or unsetenv. */
	unsetenv("OLP_OWNER_TOKEN");
	return 0;
}

/* cgi: this process answers one request and exits (plain CGI). */
static int app_init(bool cgi)
{
	struct buf err = BUF_INIT;
	int ret;

	ret = load_config(&err);
	if (ret)
		log_errx(NULL, "%s", err.data);
	buf_release(&err);
	if (ret)
		return -1;
	/* Once per worker: what the defaults were sized to (not once per CGI request). */
	if (!cgi)
		log_info(NULL, "%s", app.cfg.sizing);
	if (init_sandbox(cgi))
		return -1;
	/* The pool's shared metrics, in the same place. */
	open_metrics(cgi);
	if (open_store())
		return -1;
	open_shared_accounts(cgi);
	if (open_auth(cgi))
		return -1;
	open_leases();
	/* The ledger and the quota counters. Opened in CGI mode too: every process of a host
	 * shares the one database (SQLite's locking), so a quota holds whichever way the
	 * worker was started; the cost is one open per CGI request. A database that cannot
	 * be opened still gives a store (it retries): keys without a quota are served, keys
	 * with one refused until it works (ADR 0026). */
	if (app.cfg.usage_enabled) {
		struct usage_options uo = { .retention_days = app.cfg.usage_retention_days,
					    .store = app.store,
					    .store_buffer_rows = app.cfg.store_buffer_rows };

		app.usage = usage_store_open(app.cfg.home, &uo);
		if (!app.usage) {
			log_err(NULL, "usage store in %s", app.cfg.home);
			return -1;
		}
		fcgi_ledger_sync(app.usage); /* olp_ledger_available from the start */
	} else {
		log_info(NULL, "usage ledger and quotas off (config.json usage.enabled)");
	}
	report_ready();
	return 0;
}

/* olp-fcgi --version, --check-config, --help (or a bad argument): the exit status. */
static int run_option(const char *arg)
{
	if (!strcmp(arg, "--version")) {
		printf("olp-fcgi %s\n", OLP_VERSION);
		return 0;
	}
	if (!strcmp(arg, "--check-config")) {
		log_set_program("olp-fcgi");
		set_log_level();
		return check_config();
	}
	usage(strcmp(arg, "--help") ? stderr : stdout);
	return strcmp(arg, "--help") ? 2 : 0;
}

/* Serve FastCGI requests on the configured threads until a signal of stop comes. */
static int serve(const sigset_t *stop)
{
	pthread_t *threads;
	unsigned i, started = 0;
	int sig;

	threads = xcalloc(app.cfg.threads, sizeof(*threads));
	for (i = 0; i < app.cfg.threads; i++)
		if (pthread_create(&threads[started], NULL, serve_thread, NULL) == 0)
			started++;
	if (!started) {
		log_errx(NULL, "no serving thread could start");
		return 1;
	}
	/* Stopped by the web server: put the warm sandboxes down properly (their bwrap
	 * would otherwise die halfway through building one), then go. Runs in flight die
	 * with us (PR_SET_PDEATHSIG, bwrap --die-with-parent). */
	while (sigwait(stop, &sig) != 0)
		;
	log_info(NULL, "signal %d: stopping", sig);
	sbx_warm_shutdown();
	/* The usage store is not closed here: serving threads may be inside a transaction
	 * right now, and a committed one is durable in SQLite's WAL without a close (an
	 * unfinished one is rolled back by the next opener). */
	_exit(0);
}

int main(int argc, char **argv)
{
	/* Who started us, before anything else can happen to it (see below). */
	pid_t parent = getppid();
	sigset_t stop;
	bool cgi;

	if (argc > 1)
		return run_option(argv[1]);
	log_set_program("olp-fcgi");
	set_log_level();
	if (FCGX_Init() != 0) {
		log_errx(NULL, "FCGX_Init failed");
		return 1;
	}
	/* libfcgi catches SIGTERM to set a flag it only reads between requests, so a worker
	 * blocked in accept() never stops: let SIGTERM end the process (in-flight children
	 * die with it through PR_SET_PDEATHSIG and bwrap's --die-with-parent). */
	(void)signal(SIGTERM, SIG_DFL);
	/* SIGTERM and SIGINT go to the main thread alone, through sigwait() (serve), once
	 * start-up is over: app_init() starts a real sandbox (the status probe), and a worker
	 * killed while bwrap builds it leaves the sandbox's init blocked for ever, out of
	 * everyone's reach (lighttpd -tt, or Ctrl-C on olp-local serve, stop workers that
	 * have just started). Blocked now, a stop waits for the probe to be cleaned up. The
	 * serving threads inherit the mask. */
	sigemptyset(&stop);
	sigaddset(&stop, SIGTERM);
	sigaddset(&stop, SIGINT);
	pthread_sigmask(SIG_BLOCK, &stop, NULL);
	/* Under lighttpd (bin-path) the web server is our parent: when it goes, so do we.
	 * Not by default: spawn-fcgi's parent exits right after starting us. */
	if (getenv("OLP_EXIT_WITH_PARENT")) {
		/* lighttpd may respawn a worker while it shuts down (Ctrl-C reaches the
		 * workers too): if it is gone already, so are we. */
		if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent || parent == 1)
			return 1;
	}
	/* Before anything else runs: a worker started as root keeps no privilege. */
	if (sbx_lockdown_self() < 0) {
		log_err(NULL, "cannot drop privileges");
		return 1;
	}
	/* fd 0 not a listening socket: started as plain CGI (lighttpd mod_cgi, Apache
	 * mod_cgid), not by a FastCGI process manager. */
	cgi = FCGX_IsCGI();
	if (app_init(cgi))
		return 1;

	if (cgi) {
		/* Plain CGI: one request from the environment, then exit. The web server's
		 * SIGTERM (a timeout, a client gone) ends us as it always did. */
		struct fcgi_io io = {
			.fcgx = NULL, .envp = environ, .hangup_fd = -1, .held = BUF_INIT
		};

		pthread_sigmask(SIG_UNBLOCK, &stop, NULL);
		fcgi_handle(&app, &io);
		cgi_drain_stdin();
		usage_store_free(app.usage);
		usage_leases_free(app.leases);
		store_free(app.store);
		return 0;
	}
	return serve(&stop);
}
