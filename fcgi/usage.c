/* GET /v1/usage (the ledger, read), GET /dashboard (the owner's page) and GET /metrics
 * (Prometheus text). */
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fcgi/worker.h"
#include "common/banned.h"

/* ---- GET /v1/usage, /dashboard, /metrics (ADR 0020) --------------------------------------- */

#define USAGE_RECENT_DEFAULT 20
#define USAGE_RECENT_MAX 200
#define USAGE_SINCE_DAYS 30

static const char *special_key_name(const char *id, const char **tier)
{
	if (!strcmp(id, "__env_owner__")) {
		*tier = "owner";
		return "owner (OLP_OWNER_TOKEN)";
	}
	if (!strcmp(id, "__anonymous__")) {
		*tier = "anonymous";
		return "anonymous";
	}
	return NULL;
}

static void usage_key_quota(struct usage_key_info *k, const struct auth_quota *q)
{
	k->have_quota = true;
	k->quota = (struct usage_quota){ .requests_per_minute = q->requests_per_minute,
					 .requests_per_day = q->requests_per_day,
					 .tokens_per_day = q->tokens_per_day };
	k->max_concurrent = q->max_concurrent;
}

/* The keys of the store, as the worker's index holds them (auth_store_keys). */
struct usage_store_keys {
	struct auth_key_summary *v;
	size_t n;
};

/* Append key id to keys (once), named as the key store names it. */
static void usage_key_add(struct usage_key_info **keys, size_t *n, const char *id,
			  const struct usage_store_keys *sk)
{
	struct usage_key_info *k;
	size_t i;

	for (i = 0; i < *n; i++)
		if (!strcmp((*keys)[i].id, id))
			return;
	*keys = xreallocarray(*keys, *n + 1, sizeof(**keys));
	k = &(*keys)[(*n)++];
	*k = (struct usage_key_info){ .id = id };
	k->name = special_key_name(id, &k->tier);
	for (i = 0; i < sk->n; i++) {
		if (strcmp(sk->v[i].id, id))
			continue;
		k->name = sk->v[i].name;
		k->tier = auth_tier_name(sk->v[i].tier);
		k->revoked = sk->v[i].revoked;
		usage_key_quota(k, &sk->v[i].quota);
	}
}

/* What GET /v1/usage asks for, from its query string. */
struct usage_query {
	struct buf key, since, recent, account;
	int has_key;	       /* ?key= given */
	struct usage_filter f; /* f.key_id points into key, or at the caller's id */
	uint64_t nrecent;
};

/* 400 for a bad query parameter: msg says what it must be. */
static void usage_bad_param(struct fcgi_req *rc, const char *param, const char *msg)
{
	struct fcgi_error e;

	fcgi_error_set(&e, 400, "invalid_request_error", NULL, param, "%s", msg);
	fcgi_send_error(rc, &e, NULL);
}

/* ?account=NAME into q: an account name as providers.<name>.accounts names them (ADR
 * 0037). Not looked up: an account no provider has, or another person's asked by a key,
 * is an account with no rows of the caller's, answered as such. 0, or -1 after a 400. */
static int usage_query_account(struct fcgi_req *rc, const char *qs, struct usage_query *q)
{
	int r = fcgi_query_get(qs, "account", &q->account);

	if (!r)
		return 0;
	if (r < 0 || strlen(q->account.data) != q->account.len ||
	    !prov_account_name_ok(q->account.data)) {
		char msg[128];

		snprintf(msg, sizeof(msg),
			 "account: must be an account name, 1-%d of [a-z0-9_-] (as "
			 "providers.<name>.accounts names it)",
			 PROV_ACCOUNT_NAME_MAX);
		usage_bad_param(rc, "account", msg);
		return -1;
	}
	q->f.account = q->account.data;
	return 0;
}

/* Read ?key=, ?since=, ?recent= and ?account= into q, and who may see what: 0, or -1
 * after answering (400, or 403 for another key's usage asked by a key not the owner's). */
static int usage_query_parse(struct fcgi_req *rc, struct usage_query *q)
{
	const char *qs = fcgi_io_param(rc->io, "QUERY_STRING");
	int r;

	q->has_key = fcgi_query_get(qs, "key", &q->key);
	if (q->has_key < 0 || (q->has_key && (!q->key.len || q->key.len >= AUTH_ID_MAX ||
					      strlen(q->key.data) != q->key.len))) {
		usage_bad_param(rc, "key", "key: must be a key id (as olp-keys list shows it)");
		return -1;
	}
	/* A key's usage (which providers, when, how much) is its owner's business. */
	if (q->has_key && !fcgi_is_owner(rc) && strcmp(q->key.data, rc->id.key_id)) {
		fcgi_fail(rc, 403, "permission_error", "usage_forbidden",
			  "This key may read only its own usage (key %.64s); ?key= names another",
			  rc->id.key_id);
		return -1;
	}
	r = fcgi_query_get(qs, "since", &q->since);
	if (r < 0 || (r > 0 && usage_day_parse(q->since.data, &q->f.since_ms))) {
		usage_bad_param(rc, "since",
				"since: must be a day as YYYY-MM-DD, such as 2026-01-31");
		return -1;
	}
	if (!r) {
		/* The last 30 UTC days, today included. */
		int64_t now = wall_ms();

		q->f.since_ms = now - now % 86400000 - (int64_t)(USAGE_SINCE_DAYS - 1) * 86400000;
	}
	r = fcgi_query_get(qs, "recent", &q->recent);
	if (r < 0 ||
	    (r > 0 && (parse_u64(q->recent.data, &q->nrecent) || q->nrecent > USAGE_RECENT_MAX))) {
		char msg[64];

		snprintf(msg, sizeof(msg), "recent: must be an integer from 0 to %d",
			 USAGE_RECENT_MAX);
		usage_bad_param(rc, "recent", msg);
		return -1;
	}
	if (usage_query_account(rc, qs, q))
		return -1;
	if (!fcgi_is_owner(rc))
		q->f.key_id = rc->id.key_id;
	else if (q->has_key)
		q->f.key_id = q->key.data;
	return 0;
}

/* The keys the answer describes: the one asked for, or every key of the store and of
 * the ledger's rows. Names, tiers and quotas from the store's keys sk. */
static void usage_keys_collect(struct fcgi_req *rc, const struct usage_query *q,
			       const struct usage_store_keys *sk, const struct usage_report *r,
			       struct usage_key_info **keys, size_t *nkeys)
{
	size_t i;

	if (q->f.key_id) {
		usage_key_add(keys, nkeys, q->f.key_id, sk);
		if (!fcgi_is_owner(rc) || !strcmp(q->f.key_id, rc->id.key_id)) {
			/* The caller's own: as it authenticated just now. */
			(*keys)[0].tier = auth_tier_name(rc->id.tier);
			usage_key_quota(&(*keys)[0], &rc->id.quota);
		}
		return;
	}
	/* Every key of the store, or with ?account= those with rows on it. */
	for (i = 0; !q->f.account && i < sk->n; i++)
		usage_key_add(keys, nkeys, sk->v[i].id, sk);
	/* Keys in the ledger but not (or no longer) in the store: the env owner, anonymous,
	 * deleted keys. */
	for (i = 0; i < r->ndays; i++)
		usage_key_add(keys, nkeys, r->days[i].key_id, sk);
	for (i = 0; i < r->nrows; i++)
		usage_key_add(keys, nkeys, r->rows[i].key_id, sk);
}

/* The accounts' subscription limits (ADR 0035) as the report's last member, "accounts":
 * the report is one JSON object, so its closing brace moves after them. */
static void usage_add_accounts(struct fcgi_req *rc, const char *account, struct buf *msg)
{
	while (msg->len && msg->data[msg->len - 1] != '}')
		msg->len--;
	if (!msg->len)
		return;
	msg->data[--msg->len] = '\0';
	buf_adds(msg, ",\"accounts\":");
	fcgi_limits_usage_json(rc, account, msg);
	buf_addch(msg, '}');
}

/* GET /v1/usage: the ledger, read. A key sees its own usage; the owner sees every key's
 * (or one, ?key=ID). ?since=YYYY-MM-DD (default: 30 days back), ?recent=N (default 20,
 * at most 200) rows of recent requests, ?account=NAME only that account's rows (and the
 * keys that have some). docs/openai-compat.md has the shape (usage_report_json writes
 * it). */
void fcgi_handle_usage(struct fcgi_req *rc)
{
	struct usage_store *st = rc->app->usage;
	struct usage_query q = { .key = BUF_INIT,
				 .since = BUF_INIT,
				 .recent = BUF_INIT,
				 .account = BUF_INIT,
				 .nrecent = USAGE_RECENT_DEFAULT };
	struct buf msg = BUF_INIT;
	struct usage_store_keys sk = { 0 };
	struct usage_key_info *keys = NULL;
	struct usage_day *days = NULL;
	struct usage_row *rows = NULL;
	struct usage_report r = { 0 };
	size_t ndays = 0, nrows = 0, nkeys = 0;

	if (fcgi_authenticate(rc, true))
		goto out;
	if (!st) {
		fcgi_fail(rc, 404, "not_found", "usage_disabled",
			  "The usage ledger is off on this server (config.json usage.enabled)");
		goto out;
	}
	if (usage_query_parse(rc, &q))
		goto out;
	if (usage_days(st, &q.f, &days, &ndays) ||
	    (q.nrecent && usage_recent(st, &q.f, q.nrecent, &rows, &nrows))) {
		fcgi_fail(rc, 503, "usage_unavailable", "usage_unavailable",
			  "The usage ledger cannot be read right now; try again later");
		goto out;
	}
	r.days = days;
	r.ndays = ndays;
	r.rows = rows;
	r.nrows = nrows;
	r.since_ms = q.f.since_ms;
	r.recent_limit = q.nrecent;
	r.all_keys = fcgi_is_owner(rc) && !q.has_key;
	r.account = q.f.account;
	/* Names, tiers and quotas: the worker's index of the key store, brought in step with
	 * keys/ (a key made or revoked since shows), not a parse of every manifest. */
	(void)auth_store_keys(rc->app->auth, &sk.v, &sk.n);
	usage_keys_collect(rc, &q, &sk, &r, &keys, &nkeys);
	r.keys = keys;
	r.nkeys = nkeys;
	usage_report_json(st, &r, &msg);
	usage_add_accounts(rc, q.f.account, &msg);
	fcgi_send_json(rc, 200, &msg,
		       (const struct fcgi_hdr[]){ { "Cache-Control", "no-store" }, { 0 } });
out:
	auth_key_summaries_free(sk.v, sk.n);
	free(keys);
	free(days);
	free(rows);
	buf_release(&q.key);
	buf_release(&q.since);
	buf_release(&q.recent);
	buf_release(&q.account);
	buf_release(&msg);
}

/* The Content-Security-Policy of the dashboard: its one inline <script> and <style>
 * allowed by their SHA-256 (CSP level 2) rather than 'unsafe-inline', so that markup
 * injected into the page, were any to get in, could run nothing; fetches to this origin
 * only (the token goes nowhere else); no frames around it (clickjacking), no form posts,
 * no <base>. Computed once from the embedded file, so that editing it needs no hash. */
static pthread_once_t csp_once = PTHREAD_ONCE_INIT;
static char dashboard_csp[512];

static void add_hash_source(struct buf *b, const char *directive, const char *open,
			    const char *close)
{
	const char *page = (const char *)fcgi_dashboard_html, *start, *end;
	unsigned char digest[crypto_hash_sha256_BYTES];
	char b64[sodium_base64_ENCODED_LEN(crypto_hash_sha256_BYTES,
					   sodium_base64_VARIANT_ORIGINAL)];

	start = strstr(page, open);
	end = start ? strstr(start, close) : NULL;
	if (!end) {
		buf_addf(b, "; %s 'none'", directive);
		return;
	}
	start += strlen(open);
	crypto_hash_sha256(digest, (const unsigned char *)start, (unsigned long long)(end - start));
	sodium_bin2base64(b64, sizeof(b64), digest, sizeof(digest), sodium_base64_VARIANT_ORIGINAL);
	buf_addf(b, "; %s 'sha256-%s'", directive, b64);
}

static void dashboard_csp_init(void)
{
	struct buf b = BUF_INIT;

	buf_adds(&b, "default-src 'none'");
	/* At the start of a line: the page's own elements, not a mention in a comment. */
	add_hash_source(&b, "script-src", "\n<script>", "</script>");
	add_hash_source(&b, "style-src", "\n<style>", "</style>");
	buf_adds(&b, "; connect-src 'self'; img-src 'self'; frame-ancestors 'none'; "
		     "base-uri 'none'; form-action 'none'");
	snprintf(dashboard_csp, sizeof(dashboard_csp), "%s", b.data);
	buf_release(&b);
}

/* GET /dashboard: the owner's page. Served to anyone, with no credential looked at: it
 * holds no data, only the script that asks for the owner's token and reads /health and
 * /v1/usage with it (docs/openai-compat.md). */
void fcgi_handle_dashboard(struct fcgi_req *rc)
{
	pthread_once(&csp_once, dashboard_csp_init);
	fcgi_send_head(rc, 200, "text/html; charset=utf-8",
		       (const struct fcgi_hdr[]){ { "Content-Security-Policy", dashboard_csp },
						  { "Cache-Control", "no-store" },
						  { "Referrer-Policy", "no-referrer" },
						  { "X-Content-Type-Options", "nosniff" },
						  { "X-Frame-Options", "DENY" },
						  { "Cross-Origin-Opener-Policy", "same-origin" },
						  { 0 } });
	if (strcmp(rc->method, "HEAD"))
		fcgi_io_write(rc->io, (const char *)fcgi_dashboard_html, fcgi_dashboard_html_len);
}

/* Whether the request carries config.json's metrics_token as its bearer token (read as
 * auth reads a key's: auth_token_extract). Compared in constant time (of digests, so that
 * the length does not show either). */
static bool has_metrics_token(struct fcgi_req *rc)
{
	const char *want = rc->app->cfg.metrics_token, *tok;
	unsigned char h1[crypto_generichash_BYTES], h2[crypto_generichash_BYTES];
	size_t n;

	if (!want)
		return false;
	auth_token_extract(fcgi_io_param(rc->io, "HTTP_AUTHORIZATION"), NULL, &tok, &n);
	if (!tok)
		return false;
	crypto_generichash(h1, sizeof(h1), (const unsigned char *)tok, n, NULL, 0);
	crypto_generichash(h2, sizeof(h2), (const unsigned char *)want, strlen(want), NULL, 0);
	return sodium_memcmp(h1, h2, sizeof(h1)) == 0;
}

/* Prometheus text for the whole pool: for the owner, or for config.json's metrics_token
 * (a scraper that holds no key). The token opens this route only, and makes its holder
 * no owner: listing /metrics in auth.owner_only_endpoints changes nothing here. */
void fcgi_handle_metrics(struct fcgi_req *rc)
{
	struct buf b = BUF_INIT;

	if (!has_metrics_token(rc)) {
		if (fcgi_authenticate(rc, true))
			return;
		if (!fcgi_is_owner(rc)) {
			fcgi_fail(rc, 403, "owner_only", "owner_only",
				  "%.200s is for the owner or the metrics_token of config.json",
				  rc->path.data);
			return;
		}
	}
	fcgi_ledger_sync(rc->app->usage);
	if (metrics_render(&b)) {
		fcgi_fail(rc, 503, "metrics_unavailable", "metrics_unavailable",
			  "This worker could not open the pool's shared metrics file (its start-up "
			  "log says why)");
		goto out;
	}
	/* The accounts' subscription limits, from their state files (ADR 0035). */
	fcgi_limits_metrics(rc->app->reg, &b);
	fcgi_send_head(rc, 200, "text/plain; version=0.0.4; charset=utf-8",
		       (const struct fcgi_hdr[]){ { "Cache-Control", "no-store" }, { 0 } });
	fcgi_io_write(rc->io, b.data, b.len);
out:
	buf_release(&b);
}
