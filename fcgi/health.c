/* GET /health, GET /health/live and GET /v1/models. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fcgi/worker.h"
#include "common/banned.h"

static const char *json_bool(bool v)
{
	return v ? "true" : "false";
}

/* ,"name":"value" for a value that needs no escaping (a fixed word of ours). */
static void add_word(struct buf *b, const char *name, const char *value)
{
	buf_adds(b, ",\"");
	buf_adds(b, name);
	buf_adds(b, "\":\"");
	buf_adds(b, value);
	buf_addch(b, '"');
}

/* Pieces, not printf: the owner's /health is polled, and its answer was a tenth of the
 * worker's instructions per request in formatting alone. */
static void sandbox_block_build(struct buf *b)
{
	const struct sbx_status *st = sbx_status_get();

	buf_adds(b, "{\"available\":");
	buf_adds(b, json_bool(st->available));
	buf_adds(b, ",\"active\":");
	buf_adds(b, json_bool(st->active));
	add_word(b, "mode", st->mode);
	buf_adds(b, ",\"platform\":\"linux\",\"missing\":[");
	buf_adds(b, st->bwrap_version ? "" : "\"bubblewrap\"");
	buf_adds(b, "],\"seccomp\":");
	buf_adds(b, json_bool(st->seccomp));
	add_word(b, "cgroup", st->cgroup);
	buf_adds(b, ",\"cgroup_detail\":");
	buf_add_json_str(b, st->cgroup_detail, strlen(st->cgroup_detail));
	/* Whose host uid a run is: "per_run", or loudly "shared" / "unavailable". */
	add_word(b, "identity", st->identity);
	buf_adds(b, ",\"identity_detail\":");
	buf_add_json_str(b, st->identity_detail, strlen(st->identity_detail));
	buf_adds(b, ",\"bwrap_version\":");
	if (st->bwrap_version)
		buf_add_json_str(b, st->bwrap_version, strlen(st->bwrap_version));
	else
		buf_adds(b, "null");
	if (st->message) {
		buf_adds(b, ",\"message\":");
		buf_add_json_str(b, st->message, strlen(st->message));
	}
	buf_addch(b, '}');
}

static struct buf sandbox_block = BUF_INIT;
static pthread_once_t sandbox_block_once = PTHREAD_ONCE_INIT;

static void sandbox_block_init(void)
{
	sandbox_block_build(&sandbox_block);
}

/* The sandbox's status is found once per process (sbx_status_get), so its JSON is built
 * once too: a third of the owner's answer, without escaping its long details each time. */
static void add_sandbox_block(struct buf *b)
{
	pthread_once(&sandbox_block_once, sandbox_block_init);
	buf_add(b, sandbox_block.data, sandbox_block.len);
}

/* How the provider's runs reach the network: "host" is the one to notice. */
static void add_network(struct buf *b, const struct prov_provider *pv)
{
	struct prov_net_info ni;

	prov_provider_net_info(pv, &ni);
	add_word(b, "network", ni.mode);
	if (ni.upstream_host) {
		buf_adds(b, ",\"upstream_host\":");
		buf_add_json_str(b, ni.upstream_host, strlen(ni.upstream_host));
	}
	buf_adds(b, ",\"secretless\":");
	buf_adds(b, json_bool(ni.secretless));
}

/* Whether the provider's client and its credentials are on this host (the dashboard). */
static void add_cli_state(struct buf *b, const struct prov_provider *pv)
{
	struct prov_cli_state cs;

	prov_provider_cli_state(pv, &cs);
	buf_adds(b, ",\"cli_found\":");
	buf_adds(b, json_bool(cs.cli_found));
	add_word(b, "credentials", cs.credentials);
}

static void add_time(struct buf *b, const char *name, int64_t ms)
{
	char iso[32];
	time_t t = (time_t)(ms / 1000);
	struct tm tm;

	buf_addf(b, ",\"%s\":", name);
	if (ms <= 0 || !gmtime_r(&t, &tm)) {
		buf_adds(b, "null");
		return;
	}
	(void)strftime(iso, sizeof(iso), "%Y-%m-%dT%H:%M:%SZ", &tm);
	buf_addf(b, "\"%s\"", iso);
}

/* The provider's login (ADR 0036): "held" by the worker, with its token's expiry and the
 * host's refreshes, or "copy" into every run, with a warning; null when runs hold none. */
void fcgi_health_login(struct buf *b, const struct prov_provider *pv)
{
	struct prov_login_info li;

	prov_provider_login_info(pv, &li);
	buf_adds(b, ",\"login\":");
	if (!li.mode) {
		buf_adds(b, "null");
		return;
	}
	buf_addf(b, "{\"mode\":\"%s\"", li.mode);
	if (li.warning) {
		buf_adds(b, ",\"warning\":");
		buf_add_json_str(b, li.warning, strlen(li.warning));
		buf_addch(b, '}');
		return;
	}
	add_time(b, "expires", li.expires_ms);
	if (li.expires_ms > 0)
		buf_addf(b, ",\"expires_in_s\":%lld",
			 (long long)((li.expires_ms - (int64_t)time(NULL) * 1000) / 1000));
	add_time(b, "last_refresh", li.last_refresh_ms);
	buf_addf(b, ",\"refresh_failures\":%lld", (long long)li.refresh_failures);
	if (li.last_error[0]) {
		buf_adds(b, ",\"last_error\":");
		buf_add_json_str(b, li.last_error, strlen(li.last_error));
	}
	buf_addch(b, '}');
}

/* Pre-started provider processes (ADR 0022): the host's counts from the pool's shared
 * metrics; only when those cannot be had, this worker process's own. */
static void add_prestart_block(struct buf *b)
{
	struct sbx_prestart_stats st;
	struct metrics_prestart mp;

	if (metrics_prestart_counts(&mp) == 0) {
		const int64_t v[] = { mp.hit, mp.miss, mp.expired, mp.died, mp.idle };
		static const char *const names[] = { "hit", "miss", "expired", "died", "idle" };

		buf_adds(b, ",\"prestart\":{\"scope\":\"host\"");
		for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
			buf_adds(b, ",\"");
			buf_adds(b, names[i]);
			buf_adds(b, "\":");
			buf_add_int(b, v[i]);
		}
		buf_addch(b, '}');
		return;
	}
	sbx_prestart_stats(&st);
	buf_addf(b,
		 ",\"prestart\":{\"scope\":\"process\",\"hit\":%llu,\"miss\":%llu,"
		 "\"expired\":%llu,\"died\":%llu,\"idle\":%zu}",
		 (unsigned long long)st.hit, (unsigned long long)st.miss,
		 (unsigned long long)st.expired, (unsigned long long)st.died, st.idle);
}

void fcgi_store_sync(struct store_db *db)
{
	static atomic_int last = -1;
	int now, was;

	if (!db)
		return;
	now = store_available(db);
	was = atomic_exchange(&last, now);

	if (was == -1)
		metrics_ledger_dropped(0); /* a scrape shows the counter at 0 from the start */
	if (was != now)
		metrics_store_available(now);
}

void fcgi_json_since(struct buf *b, int64_t ms)
{
	time_t t = (time_t)(ms / 1000);
	char since[32];
	struct tm tm;

	if (ms <= 0 || !gmtime_r(&t, &tm) ||
	    !strftime(since, sizeof(since), "%Y-%m-%dT%H:%M:%SZ", &tm)) {
		buf_adds(b, "null");
		return;
	}
	buf_addf(b, "\"%s\"", since);
}

/* Whether the accounts' limits and choices are shared through the store, and if not why
 * (ADR 0035, 0037 amendments): a store without the providers schema keeps them per host
 * until olp-keys store init, which the owner must be able to see. */
static void add_accounts_shared(struct buf *b, int shared)
{
	const char *why =
		shared == -ENOENT ? "the store has no providers schema: run olp-keys store init"
		: shared == -EPROTO
			? "the store's providers schema is another version: run olp-keys store init"
		: shared == -EOPNOTSUPP ? "a CGI process: the host's files only"
					: "could not be set up (see the worker's log)";

	if (!shared) {
		buf_adds(b, ",\"accounts_shared\":true");
		return;
	}
	buf_adds(b, ",\"accounts_shared\":false,\"accounts_shared_why\":");
	buf_add_json_str(b, why, strlen(why));
}

void fcgi_store_health_json(struct buf *b, const struct fcgi_app *app)
{
	struct store_db *db = app->store;
	struct store_health h;

	if (!db) {
		buf_adds(b, "{\"kind\":\"embedded\"}");
		return;
	}
	store_health(db, &h);
	buf_adds(b, "{\"kind\":\"postgresql\",\"where\":");
	buf_add_json_str(b, h.where, strlen(h.where));
	buf_adds(b, h.ok ? ",\"ok\":true" : ",\"ok\":false");
	buf_adds(b, ",\"failing_since\":");
	fcgi_json_since(b, h.failing_since_ms);
	buf_adds(b, ",\"last_error\":");
	if (!h.ok && *h.last_error)
		buf_add_json_str(b, h.last_error, strlen(h.last_error));
	else
		buf_adds(b, "null");
	add_accounts_shared(b, app->accounts_shared);
	buf_addf(b, ",\"offline_keys_s\":%u}", app->cfg.store_offline_keys_s);
}

void fcgi_handle_health(struct fcgi_req *rc)
{
	struct auth_login_grant *grants = NULL;
	struct buf b = BUF_INIT;
	size_t i, j, ngrants = 0;

	if (fcgi_authenticate(rc, false))
		return;
	buf_grow(&b, 2048); /* the owner's answer, at once */
	buf_adds(&b, "{\"ok\":true,\"version\":\"" OLP_VERSION "\"");
	/* Infrastructure details are for the owner only: the Node OLP's ADR 0014 §3.3 (in
	 * seed/ beside DESIGN.md), not this tree's docs/adr/0014, which is the per-run uid. */
	if (fcgi_is_owner(rc)) {
		const struct prov_registry *reg = rc->app->reg;

		(void)auth_login_grants(rc->app->auth, &grants, &ngrants);
		buf_adds(&b, ",\"providers\":{");
		for (i = 0; i < prov_registry_provider_count(reg); i++) {
			const struct prov_provider *pv = prov_registry_provider_at(reg, i), *dpv;
			bool first = true;

			if (i)
				buf_addch(&b, ',');
			buf_add_json_str(&b, prov_provider_name(pv),
					 strlen(prov_provider_name(pv)));
			buf_adds(&b, ":{\"type\":");
			buf_add_json_str(&b, prov_provider_type(pv),
					 strlen(prov_provider_type(pv)));
			buf_adds(&b, ",\"displayName\":");
			buf_add_json_str(&b, prov_provider_display_name(pv),
					 strlen(prov_provider_display_name(pv)));
			add_network(&b, pv);
			/* The login a request that names no account runs with: the default
			 * account's when the provider has accounts (each one's is below). */
			dpv = prov_provider_for_account(pv, NULL);
			add_cli_state(&b, dpv);
			fcgi_health_login(&b, dpv);
			fcgi_access_health(&b, pv, grants, ngrants);
			/* What the upstream last said of each account's limits (ADR 0035). */
			buf_adds(&b, ",\"accounts\":");
			fcgi_limits_accounts_json(&b, pv, NULL);
			buf_adds(&b, ",\"models\":[");
			for (j = 0; j < prov_registry_model_count(reg); j++) {
				const struct prov_model *m = prov_registry_model_at(reg, j);

				if (m->provider != pv)
					continue;
				if (!first)
					buf_addch(&b, ',');
				buf_add_json_str(&b, m->id, strlen(m->id));
				first = false;
			}
			buf_adds(&b, "]}");
		}
		buf_adds(&b, "},\"sandbox\":");
		add_sandbox_block(&b);
		buf_adds(&b, ",\"audit_failures\":");
		buf_add_uint(&b, auth_audit_failures(rc->app->auth));
		/* The ledger and quotas: off, or whether its database works right now. */
		buf_adds(&b, ",\"usage\":");
		fcgi_usage_health_json(&b, rc->app->usage);
		/* Where keys and usage live, and whether it answers (ADR 0034). */
		buf_adds(&b, ",\"store\":");
		fcgi_store_health_json(&b, rc->app);
		fcgi_store_sync(rc->app->store);
		add_prestart_block(&b);
	}
	buf_addch(&b, '}');
	fcgi_send_json(rc, 200, &b,
		       (const struct fcgi_hdr[]){ { "Cache-Control", "no-store" }, { 0 } });
	buf_release(&b);
	free(grants);
}

/* GET /health/live: the worker is up and takes requests. For web-server and load-balancer
 * checks, polled every few seconds: no credential looked at, no key store, registry or
 * sandbox touched, and (fcgi_handle) no audit record or log line for a 200, so a monitor
 * fills neither the audit log nor the journal. The web server's access log still has
 * every check. */
void fcgi_handle_live(struct fcgi_req *rc)
{
	struct buf b = BUF_INIT;

	buf_adds(&b, "{\"ok\":true}");
	fcgi_send_json(rc, 200, &b,
		       (const struct fcgi_hdr[]){ { "Cache-Control", "no-store" }, { 0 } });
	buf_release(&b);
}

/* codex's base instructions for the models OLP lists to it (codex_model below): codex
 * puts a model's instructions_template first in every request, in place of its own. */
static const char codex_instructions[] =
	"You are Codex, a coding agent running in the Codex CLI on the user's computer, "
	"answered by a model that OLP serves. You and the user share one workspace: read the "
	"code before you change it, make the smallest change that does the task, and check "
	"your work by running it. Use the tools you are given to run commands and edit "
	"files; they run on the user's machine. Keep the user informed in a few words, ask "
	"only when you cannot go on without an answer, and finish the task before you stop "
	"with a short summary of what you did.";

/* One model in codex's own catalog shape (what `model_catalog_url` asks for, ADR 0030):
 * the fields codex 0.171 requires, so that it takes the list without a warning. priority
 * keeps the registry's order; codex's default model is the first. */
static void codex_model(struct buf *b, const struct prov_model *m, size_t priority)
{
	const char *name = m->display_name ? m->display_name : m->id;

	buf_adds(b, "{\"slug\":");
	buf_add_json_str(b, m->id, strlen(m->id));
	buf_adds(b, ",\"display_name\":");
	buf_add_json_str(b, name, strlen(name));
	buf_adds(b, ",\"description\":");
	buf_add_json_str(b, name, strlen(name));
	buf_addf(b,
		 ",\"shell_type\":\"shell_command\",\"visibility\":\"list\","
		 "\"supported_in_api\":true,\"priority\":%zu,\"support_verbosity\":false,"
		 "\"truncation_policy\":{\"mode\":\"tokens\",\"limit\":10000},"
		 "\"supported_reasoning_levels\":[],\"experimental_supported_tools\":[],"
		 "\"apply_patch_tool_type\":\"freeform\"",
		 priority);
	if (m->context_window > 0)
		buf_addf(b, ",\"context_window\":%lld", (long long)m->context_window);
	buf_adds(b, ",\"model_messages\":{\"instructions_template\":");
	buf_add_json_str(b, codex_instructions, strlen(codex_instructions));
	buf_adds(b, "}}");
}

/* The OpenAI list ("data"); with ?client_version=… (codex asking for its catalog), the
 * same models in codex's shape too ("models"). */
void fcgi_handle_models(struct fcgi_req *rc)
{
	const struct prov_registry *reg = rc->app->reg;
	struct buf b = BUF_INIT, codex = BUF_INIT, v = BUF_INIT;
	bool want_codex =
		fcgi_query_get(fcgi_io_param(rc->io, "QUERY_STRING"), "client_version", &v) == 1;
	size_t i, n = 0;

	if (fcgi_authenticate(rc, true))
		goto out;
	buf_adds(&b, "{\"object\":\"list\",\"data\":[");
	for (i = 0; i < prov_registry_model_count(reg); i++) {
		const struct prov_model *m = prov_registry_model_at(reg, i);
		const char *owner = prov_provider_name(m->provider);

		/* Only what this caller may use (ADR 0025): no model it would be refused. */
		if (fcgi_access_check(&rc->id, m->provider))
			continue;
		if (n++) {
			buf_addch(&b, ',');
			buf_addch(&codex, ',');
		}
		buf_adds(&b, "{\"id\":");
		buf_add_json_str(&b, m->id, strlen(m->id));
		buf_addf(&b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":",
			 (long long)m->created);
		buf_add_json_str(&b, owner, strlen(owner));
		buf_addch(&b, '}');
		if (want_codex)
			codex_model(&codex, m, n);
	}
	buf_adds(&b, "]");
	if (want_codex)
		buf_addf(&b, ",\"models\":[%s]", codex.data);
	buf_addch(&b, '}');
	fcgi_send_json(rc, 200, &b, NULL);
out:
	buf_release(&b);
	buf_release(&codex);
	buf_release(&v);
}
