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
static void add_account(struct buf *b, const char *provider, const char *account, int64_t now_s)
{
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
	buf_adds(b, "}}");
}

void fcgi_limits_accounts_json(struct buf *b, const struct prov_provider *pv)
{
	buf_addch(b, '{');
	add_account(b, prov_provider_name(pv), PROV_ACCOUNT_DEFAULT, wall_ms() / 1000);
	buf_addch(b, '}');
}

void fcgi_limits_usage_json(struct fcgi_req *rc, struct buf *b)
{
	const struct prov_registry *reg = rc->app->reg;
	bool first = true;

	buf_adds(b, "{");
	for (size_t i = 0; i < prov_registry_provider_count(reg); i++) {
		const struct prov_provider *pv = prov_registry_provider_at(reg, i);
		const char *name = prov_provider_name(pv);

		/* A key sees the accounts its requests use: today, the default account of each
		 * provider it may use (a login it may not hold is not one of them). */
		if (!fcgi_is_owner(rc) && fcgi_access_check(&rc->id, pv) != FCGI_ACCESS_OK)
			continue;
		if (!first)
			buf_addch(b, ',');
		first = false;
		buf_add_json_str(b, name, strlen(name));
		buf_addch(b, ':');
		fcgi_limits_accounts_json(b, pv);
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

/* One family's samples for every provider's accounts that have a state. */
static void metrics_family(const struct prov_registry *reg, enum family fam, int64_t now_s,
			   struct buf *b)
{
	buf_addf(b, "# HELP %s %s\n# TYPE %s gauge\n", families[fam][0], families[fam][1],
		 families[fam][0]);
	for (size_t i = 0; i < prov_registry_provider_count(reg); i++) {
		const char *name = prov_provider_name(prov_registry_provider_at(reg, i));
		struct prov_limits st;
		int64_t retry = 0;

		/* Names of the state files are plain ([A-Za-z0-9_.-]): no label escaping. */
		if (prov_limits_get(name, PROV_ACCOUNT_DEFAULT, &st))
			continue;
		if (fam == FAM_LIMITED) {
			buf_addf(b, "%s{provider=\"%s\",account=\"%s\"} %d\n", families[fam][0],
				 name, PROV_ACCOUNT_DEFAULT,
				 prov_limits_blocked(&st, now_s, &retry) ? 1 : 0);
			continue;
		}
		if (fam == FAM_RESET && st.rl.reset_s > now_s)
			buf_addf(b, "%s{provider=\"%s\",account=\"%s\",window=\"overall\"} %lld\n",
				 families[fam][0], name, PROV_ACCOUNT_DEFAULT,
				 (long long)(st.rl.reset_s - now_s));
		for (int w = 0; w < EGR_RL_NWIN; w++) {
			const struct egr_rl_win *win = &st.rl.win[w];
			const char *wn = egr_rl_window_name((enum egr_rl_window)w);

			if (fam == FAM_UTILIZATION && st.win_seen_ms[w] && win->utilization >= 0)
				buf_addf(b,
					 "%s{provider=\"%s\",account=\"%s\",window=\"%s\"} %.4f\n",
					 families[fam][0], name, PROV_ACCOUNT_DEFAULT, wn,
					 win->utilization);
			else if (fam == FAM_RESET && st.win_seen_ms[w] && win->reset_s)
				buf_addf(b,
					 "%s{provider=\"%s\",account=\"%s\",window=\"%s\"} %lld\n",
					 families[fam][0], name, PROV_ACCOUNT_DEFAULT, wn,
					 (long long)(win->reset_s > now_s ? win->reset_s - now_s
									  : 0));
		}
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

int fcgi_limits_check(struct fcgi_req *rc, struct fcgi_answer *a)
{
	int64_t now_s = wall_ms() / 1000, soonest = 0;
	const char *provider = NULL;
	struct prov_limits st;
	struct fcgi_error e;
	char retry[24], until[32];
	size_t i, n = 0;

	for (i = 0; i < a->nhops; i++) {
		const char *name = prov_provider_name(a->hops[i].m->provider);
		int64_t r;

		if (prov_limits_get(name, PROV_ACCOUNT_DEFAULT, &st) ||
		    !prov_limits_blocked(&st, now_s, &r)) {
			a->hops[n++] = a->hops[i];
			continue;
		}
		log_info(rc->rid, "provider %s: account %s is at its subscription limit for %lld s",
			 name, PROV_ACCOUNT_DEFAULT, (long long)r);
		if (!provider || r < soonest) {
			provider = name;
			soonest = r;
		}
	}
	if (n) {
		a->nhops = n;
		return 0;
	}
	snprintf(retry, sizeof(retry), "%lld", (long long)soonest);
	time_text(now_s + soonest, until, sizeof(until));
	fcgi_error_set(&e, 429, "rate_limit_error", "subscription_limit", NULL,
		       "Provider '%s' (account %s) is at its subscription limit, as its upstream "
		       "said; it resets at %s (retry after %s s)",
		       provider, PROV_ACCOUNT_DEFAULT, until, retry);
	fcgi_send_error(rc, &e, (const struct fcgi_hdr[]){ { "Retry-After", retry }, { 0 } });
	return -1;
}
