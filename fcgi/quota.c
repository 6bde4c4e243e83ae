/* A key's quota against the usage store, for the routes (chat.c, health.c, usage.c): the
 * check that counts a request, the tokens it reserves while it runs, the request given
 * back when no provider took it, and what /health and /metrics say of the ledger
 * (issues 14 and 22, ADR 0026).
 *
 * The ledger fails closed for keys with a quota: a request of such a key is served only
 * once its count (and reservation) is written. When the store cannot write (a full disk,
 * a database locked beyond the busy timeout, a file gone), the request is refused with 503
 * usage_unavailable and a Retry-After, the owner's /health says since when, and
 * olp_ledger_available is 0. A key without a quota never touches the store before its run:
 * it is served whatever the store's state (its row, written after the answer, may be lost,
 * which is counted). */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fcgi/worker.h"
#include "common/banned.h"

/* The completion a request is assumed to ask for when it sets no max_tokens: about a page
 * of text, what a chat answer usually stays under. */
#define COMPLETION_ALLOWANCE 1024
/* How long a client is asked to wait before trying again when the ledger fails: about the
 * store's reopen interval (usage.h, 10 s), after which a worker tries the database again. */
#define LEDGER_RETRY_AFTER "10"

int64_t fcgi_quota_estimate(size_t body_len, int64_t max_tokens)
{
	int64_t prompt = (int64_t)(body_len / 4);

	return prompt + (max_tokens > 0 ? max_tokens : COMPLETION_ALLOWANCE);
}

void fcgi_ledger_sync(struct usage_store *st)
{
	/* usage_dropped's count last handed to /metrics (one store per process). */
	static atomic_uint_fast64_t told;
	struct usage_health h;
	uint64_t dropped, before;

	if (!st)
		return;
	usage_health(st, &h);
	metrics_ledger_available(h.ok);
	dropped = usage_dropped(st);
	before = atomic_load(&told);
	if (dropped > before && atomic_compare_exchange_strong(&told, &before, dropped))
		metrics_ledger_dropped(dropped - before);
}

int fcgi_quota_check(struct usage_store *st, bool shared, const struct auth_identity *id,
		     struct usage_claim *claim, struct fcgi_error *e, struct fcgi_quota_hdr *hdr)
{
	const struct auth_quota *aq = &id->quota;
	struct usage_quota q = { .requests_per_minute = aq->requests_per_minute,
				 .requests_per_day = aq->requests_per_day,
				 .tokens_per_day = aq->tokens_per_day };
	struct usage_verdict v;
	int err;

	if (!st || !usage_quota_any(&q))
		return 0;
	err = usage_quota_claim(st, id->key_id, &q, 0, claim, &v);
	fcgi_ledger_sync(st);
	if (v.allowed)
		return 0;
	if (err) {
		/* The store counted and logged why, once a minute at most: not again here. */
		if (shared) {
			/* The shared store is away (ADR 0034): an exact limit across hosts
			 * cannot be checked, so not served. */
			snprintf(hdr->retry_after, sizeof(hdr->retry_after), "%s",
				 STORE_RETRY_AFTER);
			fcgi_error_set(
				e, 503, "store_unavailable", "store_unavailable", NULL,
				"This key's quota cannot be checked: the shared store is "
				"unavailable (%s); the request was not run. Try again in %s s",
				strerror(-err), STORE_RETRY_AFTER);
			return -1;
		}
		snprintf(hdr->retry_after, sizeof(hdr->retry_after), "%s", LEDGER_RETRY_AFTER);
		fcgi_error_set(e, 503, "usage_unavailable", "usage_unavailable", NULL,
			       "This key's quota cannot be checked: the usage ledger cannot be "
			       "written (%s); the request was not run. Try again in %s s",
			       strerror(-err), LEDGER_RETRY_AFTER);
		return -1;
	}
	metrics_quota_rejected(v.limit ? v.limit : "quota");
	snprintf(hdr->retry_after, sizeof(hdr->retry_after), "%u",
		 v.retry_after ? v.retry_after : 1);
	fcgi_error_set(e, 429, "rate_limit_error", "quota_exceeded", NULL,
		       "Quota exceeded: this key's %s is %lld and it has used %lld; try again in "
		       "%s s",
		       v.limit ? v.limit : "quota", (long long)v.limit_value, (long long)v.used,
		       hdr->retry_after);
	return -1;
}

void fcgi_quota_refund(struct usage_store *st, const char *key_id, struct usage_claim *claim,
		       const char *rid)
{
	if (!st || (!claim->counted && claim->hold_id <= 0))
		return;
	if (usage_quota_refund(st, key_id, claim) < 0)
		log_warnx(rid, "the key's request could not be given back to its quota (the "
			       "usage store failed; see its own report)");
	fcgi_ledger_sync(st);
}

void fcgi_usage_health_json(struct buf *b, struct usage_store *st)
{
	struct usage_health h;

	if (!st) {
		buf_adds(b, "{\"enabled\":false,\"available\":false,\"failures\":0}");
		return;
	}
	usage_health(st, &h);
	buf_adds(b, usage_available(st) ? "{\"enabled\":true,\"available\":true"
					: "{\"enabled\":true,\"available\":false");
	buf_adds(b, h.ok ? ",\"ok\":true,\"failing_since\":" : ",\"ok\":false,\"failing_since\":");
	fcgi_json_since(b, h.failing_since_ms);
	buf_adds(b, ",\"last_error\":");
	if (!h.ok && h.last_err) {
		const char *m = strerror(-h.last_err);

		buf_add_json_str(b, m, strlen(m));
	} else {
		buf_adds(b, "null");
	}
	buf_adds(b, ",\"failures\":");
	buf_add_uint(b, h.failures);
	buf_addch(b, '}');
}
