/* The accounts' subscription limits, shown and enforced (issue 26 item 2, ADR 0035).
 *
 * The state is what the upstream last said of each (provider, account) (providers/
 * limits.c keeps it for the host). Here it is shown: in the owner's /health (per
 * provider, per account), in /v1/usage (the owner sees every account, a key only those of
 * the providers it may use: their "default" account, until keys are bound to accounts),
 * on the dashboard (from /health) and in /metrics; and enforced: a request whose every
 * hop goes to an account the upstream rejected until a time still to come is answered
 * 429 with Retry-After, before any quota is taken or any CLI started, and the hops whose
 * account is at its limit are skipped when another hop of the chain can answer. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fcgi/worker.h"
#include "common/banned.h"

/* "2026-12-02T15:00:00Z" for epoch seconds, or null. */
static void add_time_s(struct buf *b, int64_t s)
{
	fcgi_json_since(b, s > 0 ? s * 1000 : 0);
}

static void add_window(struct buf *b, const struct prov_limits *st, enum egr_rl_window w,
		       int64_t now_s)
{
	const struct egr_rl_win *win = &st->rl.win[w];

	buf_adds(b, "{\"status\":\"");
	buf_adds(b, egr_rl_status_name(win->status));
	buf_adds(b, "\",\"utilization\":");
	if (win->utilization >= 0)
		buf_addf(b, "%.4f", win->utilization);
	else
		buf_adds(b, "null");
	buf_adds(b, ",\"reset\":");
	add_time_s(b, win->reset_s);
	buf_adds(b, ",\"reset_in_s\":");
	if (win->reset_s > now_s)
		buf_add_int(b, win->reset_s - now_s);
	else
		buf_adds(b, win->reset_s ? "0" : "null");
	buf_adds(b, ",\"window_minutes\":");
	if (win->minutes)
		buf_add_uint(b, win->minutes);
	else
		buf_adds(b, "null");
	buf_adds(b, ",\"seen\":");
	fcgi_json_since(b, st->win_seen_ms[w]);
	buf_addch(b, '}');
}

/* One account's state as JSON: what the upstream said, when, and whether its requests
 * are refused now. */
static void add_account(struct buf *b, const struct prov_provider *apv, int64_t now_s, bool owner)
{
	const char *provider = prov_provider_name(apv), *account = prov_provider_account(apv);
	struct prov_cli_state cs;
	struct prov_limits st;
	int64_t retry = 0;
	bool known = prov_limits_get(provider, account, &st) == 0, first = true;
	bool limited = known && prov_limits_blocked(&st, now_s, &retry);

	buf_add_json_str(b, account, strlen(account));
	buf_adds(b, ":{\"status\":\"");
	buf_adds(b, known ? egr_rl_status_name(st.rl.status) : "unknown");
	buf_adds(b, limited ? "\",\"limited\":true" : "\",\"limited\":false");
	buf_adds(b, ",\"retry_after_s\":");
	if (limited)
		buf_add_int(b, retry);
	else
		buf_adds(b, "null");
	buf_adds(b, ",\"reset\":");
	add_time_s(b, known ? st.rl.reset_s : 0);
	buf_adds(b, ",\"claim\":");
	if (known && st.rl.claim[0])
		buf_add_json_str(b, st.rl.claim, strlen(st.rl.claim));
	else
		buf_adds(b, "null");
	buf_adds(b, ",\"seen\":");
	fcgi_json_since(b, known ? st.seen_ms : 0);
	/* Its login (ADR 0037): whether its files are there, and whether it is the default. */
	prov_provider_cli_state(apv, &cs);
	buf_adds(b, ",\"credentials\":\"");
	buf_adds(b, cs.credentials);
	buf_adds(b, strcmp(account, prov_provider_default_account(apv)) ? "\",\"default\":false"
									: "\",\"default\":true");
	buf_adds(b, ",\"windows\":{");
	for (int w = 0; known && w < EGR_RL_NWIN; w++) {
		if (!st.win_seen_ms[w])
			continue;
		if (!first)
			buf_addch(b, ',');
		first = false;
		buf_addch(b, '"');
		buf_adds(b, egr_rl_window_name((enum egr_rl_window)w));
		buf_adds(b, "\":");
		add_window(b, &st, (enum egr_rl_window)w, now_s);
	}
	buf_addch(b, '}');
	if (owner) /* each account's own held login (ADR 0036, 0037) */
		fcgi_health_login(b, apv);
	buf_addch(b, '}');
}

/* The accounts of pv (only: that one alone; NULL: every one), each with its login when
 * owner. */
static void accounts_json(struct buf *b, const struct prov_provider *pv, const char *only,
			  bool owner)
{
	int64_t now_s = wall_ms() / 1000;
	bool first = true;

	buf_addch(b, '{');
	for (size_t i = 0; i < prov_provider_account_count(pv); i++) {
		const char *name = prov_provider_account_at(pv, i);

		if (only && strcmp(only, name))
			continue;
		if (!first)
			buf_addch(b, ',');
		first = false;
		add_account(b, prov_provider_for_account(pv, name), now_s, owner);
	}
	buf_addch(b, '}');
}

void fcgi_limits_accounts_json(struct buf *b, const struct prov_provider *pv, const char *only)
{
	accounts_json(b, pv, only, !only);
}

void fcgi_limits_usage_json(struct fcgi_req *rc, const char *account, struct buf *b)
{
	const struct prov_registry *reg = rc->app->reg;
	bool first = true;

	buf_adds(b, "{");
	for (size_t i = 0; i < prov_registry_provider_count(reg); i++) {
		const struct prov_provider *pv = prov_registry_provider_at(reg, i);
		const char *name = prov_provider_name(pv);

		const char *only = NULL;
		int64_t r;

		/* A key sees the accounts its requests use: of each provider it may use (a login
		 * it may not hold is not one of them), the account it is bound to or was given
		 * (ADR 0037). */
		if (!fcgi_is_owner(rc) && fcgi_access_check(&rc->id, pv) != FCGI_ACCESS_OK)
			continue;
		if (!fcgi_is_owner(rc) && !(only = auth_identity_account(&rc->id, name)) &&
		    prov_account_choose(pv, rc->id.key_id, wall_ms() / 1000, &only, &r))
			only = prov_provider_default_account(pv);
		if (!first)
			buf_addch(b, ',');
		first = false;
		buf_add_json_str(b, name, strlen(name));
		buf_addch(b, ':');
		/* ?account=: that account alone; for a key, only when it is its own, else as
		 * for an account the provider does not have (an empty object): another
		 * person's account is neither named nor described. */
		if (account && only && strcmp(only, account))
			buf_adds(b, "{}");
		else
			accounts_json(b, pv, account ? account : only, fcgi_is_owner(rc));
	}
	buf_addch(b, '}');
}

/* ---- /metrics ------------------------------------------------------------------------ */

enum family { FAM_UTILIZATION = 0, FAM_LIMITED, FAM_RESET };

static const char *const families[][2] = {
	{ "olp_account_utilization",
	  "Share of a subscription window used, as the upstream last said (0 to 1)" },
	{ "olp_account_limited",
	  "1 while the upstream has rejected the account until a reset still to come" },
	{ "olp_account_reset_seconds",
	  "Seconds until the window (or, window=\"overall\", the account's limit) resets" },
};

/* One family's samples of one account, when it has a state. Names of the state files are
 * plain ([A-Za-z0-9_.-]): no label escaping. */
static void metrics_account(const char *name, const char *acc, enum family fam, int64_t now_s,
			    struct buf *b)
{
	const char *f = families[fam][0];
	struct prov_limits st;
	int64_t retry = 0;

	if (prov_limits_get(name, acc, &st))
		return;
	if (fam == FAM_LIMITED) {
		buf_addf(b, "%s{provider=\"%s\",account=\"%s\"} %d\n", f, name, acc,
			 prov_limits_blocked(&st, now_s, &retry) ? 1 : 0);
		return;
	}
	if (fam == FAM_RESET && st.rl.reset_s > now_s)
		buf_addf(b, "%s{provider=\"%s\",account=\"%s\",window=\"overall\"} %lld\n", f, name,
			 acc, (long long)(st.rl.reset_s - now_s));
	for (int w = 0; w < EGR_RL_NWIN; w++) {
		const struct egr_rl_win *win = &st.rl.win[w];
		const char *wn = egr_rl_window_name((enum egr_rl_window)w);

		if (fam == FAM_UTILIZATION && st.win_seen_ms[w] && win->utilization >= 0)
			buf_addf(b, "%s{provider=\"%s\",account=\"%s\",window=\"%s\"} %.4f\n", f,
				 name, acc, wn, win->utilization);
		else if (fam == FAM_RESET && st.win_seen_ms[w] && win->reset_s)
			buf_addf(b, "%s{provider=\"%s\",account=\"%s\",window=\"%s\"} %lld\n", f,
				 name, acc, wn,
				 (long long)(win->reset_s > now_s ? win->reset_s - now_s : 0));
	}
}

/* One family's samples for every provider's accounts that have a state. */
static void metrics_family(const struct prov_registry *reg, enum family fam, int64_t now_s,
			   struct buf *b)
{
	buf_addf(b, "# HELP %s %s\n# TYPE %s gauge\n", families[fam][0], families[fam][1],
		 families[fam][0]);
	for (size_t i = 0; i < prov_registry_provider_count(reg); i++) {
		const struct prov_provider *pv = prov_registry_provider_at(reg, i);

		for (size_t j = 0; j < prov_provider_account_count(pv); j++)
			metrics_account(prov_provider_name(pv), prov_provider_account_at(pv, j),
					fam, now_s, b);
	}
}

void fcgi_limits_metrics(const struct prov_registry *reg, struct buf *b)
{
	int64_t now_s = wall_ms() / 1000;

	for (size_t f = 0; f < ARRAY_SIZE(families); f++)
		metrics_family(reg, (enum family)f, now_s, b);
}

/* ---- before a run -------------------------------------------------------------------- */

/* "2026-12-02T15:00:00Z" into out, for a message. */
static void time_text(int64_t s, char *out, size_t size)
{
	time_t t = (time_t)s;
	struct tm tm;

	if (!gmtime_r(&t, &tm) || !strftime(out, size, "%Y-%m-%dT%H:%M:%SZ", &tm))
		snprintf(out, size, "%lld", (long long)s);
}

/* The account hop's run uses, into hop->account: the key's bound one (ADR 0037), else
 * its sticky choice. 0; -EBUSY when that is rejected until a reset (*retry_s); -ENOENT
 * when the key is bound to an account the provider does not have. */
static int hop_account(struct fcgi_req *rc, struct fcgi_hop *hop, int64_t now_s, int64_t *retry_s)
{
	const struct prov_provider *pv = hop->m->provider, *apv;
	const char *bound = auth_identity_account(&rc->id, prov_provider_name(pv));

	if (!bound)
		return prov_account_choose(pv, rc->id.key_id, now_s, &hop->account, retry_s);
	if (!(apv = prov_provider_for_account(pv, bound)))
		return -ENOENT;
	hop->account = prov_provider_account(apv);
	return prov_account_blocked(pv, hop->account, now_s, retry_s) ? -EBUSY : 0;
}

/* No hop left: the key's account unknown (403), or every account at its limit (429). */
static void limits_refuse(struct fcgi_req *rc, const char *provider, const char *account,
			  int64_t now_s, int64_t soonest)
{
	char retry[24], until[32];
	struct fcgi_error e;

	if (!soonest) {
		fcgi_fail(rc, 403, "permission_error", "account_unknown",
			  "This key is bound to account '%s' of provider '%s', which the provider "
			  "does not have; ask the owner to bind it again (olp-keys set-account)",
			  account, provider);
		return;
	}
	snprintf(retry, sizeof(retry), "%lld", (long long)soonest);
	time_text(now_s + soonest, until, sizeof(until));
	fcgi_error_set(&e, 429, "rate_limit_error", "subscription_limit", NULL,
		       "Provider '%s' (account %s) is at its subscription limit, as its upstream "
		       "said; it resets at %s (retry after %s s)",
		       provider, account, until, retry);
	fcgi_send_error(rc, &e, (const struct fcgi_hdr[]){ { "Retry-After", retry }, { 0 } });
}

int fcgi_limits_check(struct fcgi_req *rc, struct fcgi_answer *a)
{
	int64_t now_s = wall_ms() / 1000, soonest = 0;
	const char *provider = NULL, *account = NULL;
	size_t i, n = 0;

	for (i = 0; i < a->nhops; i++) {
		const struct prov_provider *pv = a->hops[i].m->provider;
		const char *name = prov_provider_name(pv);
		int64_t r = 0;
		int ret = hop_account(rc, &a->hops[i], now_s, &r);

		if (!ret) {
			a->hops[n++] = a->hops[i];
			continue;
		}
		if (ret == -ENOENT) {
			log_info(rc->rid, "provider %s: the key's account %s is not configured",
				 name, auth_identity_account(&rc->id, name));
			if (!provider) {
				provider = name;
				account = auth_identity_account(&rc->id, name);
			}
			continue;
		}
		if (!a->hops[i].account)
			a->hops[i].account = prov_provider_default_account(pv);
		log_info(rc->rid, "provider %s: account %s is at its subscription limit for %lld s",
			 name, a->hops[i].account, (long long)r);
		if (!soonest || r < soonest) {
			provider = name;
			account = a->hops[i].account;
			soonest = r;
		}
	}
	if (n) {
		a->nhops = n;
		return 0;
	}
	limits_refuse(rc, provider, account, now_s, soonest);
	return -1;
}
