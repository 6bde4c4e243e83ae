/* usage: the ledger as JSON, written once for its two readers: GET /v1/usage (and the
 * dashboard that reads it) and olp-keys usage --json. Text straight into a struct buf
 * (common.h's JSON string escaping): usage/ links no JSON library, and the answer needs
 * no tree. The shapes are docs/openai-compat.md's and docs/olp-keys.1's. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "usage/usage.h"
#include "common/banned.h"

int usage_day_parse(const char *s, int64_t *ms)
{
	struct tm tm = { 0 }, back;
	char again[16];
	time_t t;

	if (!s || strlen(s) != 10 || strspn(s, "0123456789-") != 10 || s[4] != '-' || s[7] != '-' ||
	    sscanf(s, "%4d-%2d-%2d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday) != 3)
		return -EINVAL;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	t = timegm(&tm);
	/* timegm normalises 2026-02-30 into March: such a day is refused. */
	if (t == (time_t)-1 || !gmtime_r(&t, &back) ||
	    !strftime(again, sizeof(again), "%Y-%m-%d", &back) || strcmp(again, s))
		return -EINVAL;
	*ms = (int64_t)t * 1000;
	return 0;
}

/* Members after the first: ,"name":value (a string; NULL as null), ,"name":integer. */
static void add_str(struct buf *b, const char *name, const char *value)
{
	buf_addf(b, ",\"%s\":", name);
	if (value)
		buf_add_json_str(b, value, strlen(value));
	else
		buf_adds(b, "null");
}

static void add_int(struct buf *b, const char *name, int64_t v)
{
	buf_addf(b, ",\"%s\":%" PRId64, name, v);
}

/* ms (unix) as the string "YYYY-MM-DD", or with the time as JavaScript's toISOString()
 * prints it; null when it is no time gmtime_r can tell. */
static void time_json(struct buf *b, int64_t ms, bool with_time)
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;
	char s[40];

	if (!gmtime_r(&t, &tm)) {
		buf_adds(b, "null");
		return;
	}
	if (!with_time) {
		(void)strftime(s, sizeof(s), "%Y-%m-%d", &tm);
	} else {
		size_t n = strftime(s, sizeof(s), "%Y-%m-%dT%H:%M:%S", &tm);

		snprintf(s + n, sizeof(s) - n, ".%03dZ", (int)(ms % 1000));
	}
	buf_add_json_str(b, s, strlen(s));
}

static void add_time(struct buf *b, const char *name, int64_t ms, bool with_time)
{
	buf_addf(b, ",\"%s\":", name);
	time_json(b, ms, with_time);
}

/* The members both readers share, after "date" (and the key's). */
static void day_sums(struct buf *b, const struct usage_day *d)
{
	add_str(b, "provider", d->provider[0] ? d->provider : NULL);
	add_str(b, "account", d->account[0] ? d->account : NULL);
	add_int(b, "requests", d->requests);
	add_int(b, "errors", d->errors);
	add_int(b, "prompt_tokens", d->prompt_tokens);
	add_int(b, "completion_tokens", d->completion_tokens);
	add_int(b, "cached_tokens", d->cached_tokens);
	add_int(b, "warm", d->warm);
	add_int(b, "prestart", d->prestart);
	add_int(b, "duration_ms", (int64_t)d->duration_ms);
}

void usage_day_json(struct buf *b, const struct usage_day *d, bool with_key, const char *name)
{
	buf_adds(b, "{\"date\":");
	buf_add_json_str(b, d->day, strlen(d->day));
	if (with_key) {
		add_str(b, "key_id", d->key_id);
		add_str(b, "name", name);
	}
	day_sums(b, d);
	buf_addch(b, '}');
}

/* A key's "quota": null without one, else every limit (0: none). */
static void quota_json(struct buf *b, const struct usage_key_info *k)
{
	const struct usage_quota *q = &k->quota;

	if (!k->have_quota || (!usage_quota_any(q) && !k->max_concurrent)) {
		buf_adds(b, ",\"quota\":null");
		return;
	}
	buf_addf(b,
		 ",\"quota\":{\"requests_per_minute\":%" PRId64 ",\"requests_per_day\":%" PRId64
		 ",\"tokens_per_day\":%" PRId64 ",\"max_concurrent\":%" PRId64 "}",
		 q->requests_per_minute, q->requests_per_day, q->tokens_per_day, k->max_concurrent);
}

/* Add d's sums to sum. */
static void sums_add(struct usage_day *sum, const struct usage_day *d)
{
	sum->requests += d->requests;
	sum->errors += d->errors;
	sum->prompt_tokens += d->prompt_tokens;
	sum->completion_tokens += d->completion_tokens;
	sum->cached_tokens += d->cached_tokens;
	sum->warm += d->warm;
	sum->prestart += d->prestart;
}

/* The members of a "totals" object after "requests". */
static void totals_json(struct buf *b, const struct usage_day *sum)
{
	add_int(b, "errors", sum->errors);
	add_int(b, "prompt_tokens", sum->prompt_tokens);
	add_int(b, "completion_tokens", sum->completion_tokens);
	add_int(b, "total_tokens", sum->prompt_tokens + sum->completion_tokens);
	add_int(b, "cached_tokens", sum->cached_tokens);
	add_int(b, "warm", sum->warm);
	add_int(b, "prestart", sum->prestart);
}

static bool same_account(const struct usage_day *a, const struct usage_day *b)
{
	return !strcmp(a->provider, b->provider) && !strcmp(a->account, b->account);
}

/* A key's totals by provider and account ("by_account"), in the order each pair first
 * shows in its days. The pairs are few (a key's providers times their accounts): a
 * linear search of them per day. */
static void by_account_json(struct buf *b, const struct usage_key_info *k,
			    const struct usage_report *r)
{
	struct usage_day *sums = NULL;
	size_t n = 0, cap = 0, j;

	for (size_t i = 0; i < r->ndays; i++) {
		const struct usage_day *d = &r->days[i];

		if (strcmp(d->key_id, k->id))
			continue;
		for (j = 0; j < n && !same_account(&sums[j], d); j++)
			;
		if (j == n) {
			if (n == cap) {
				cap = cap ? 2 * cap : 8;
				sums = xreallocarray(sums, cap, sizeof(*sums));
			}
			sums[n] = (struct usage_day){ 0 };
			memcpy(sums[n].provider, d->provider, sizeof(d->provider));
			memcpy(sums[n].account, d->account, sizeof(d->account));
			n++;
		}
		sums_add(&sums[j], d);
	}
	buf_adds(b, ",\"by_account\":[");
	for (j = 0; j < n; j++) {
		buf_adds(b, j ? ",{\"provider\":" : "{\"provider\":");
		if (sums[j].provider[0])
			buf_add_json_str(b, sums[j].provider, strlen(sums[j].provider));
		else
			buf_adds(b, "null");
		add_str(b, "account", sums[j].account[0] ? sums[j].account : NULL);
		add_int(b, "requests", sums[j].requests);
		totals_json(b, &sums[j]);
		buf_addch(b, '}');
	}
	buf_addch(b, ']');
	free(sums);
}

/* One key of the report: who it is, where it stands now, its days and their totals. */
static void key_json(struct buf *b, struct usage_store *st, const struct usage_key_info *k,
		     const struct usage_report *r)
{
	struct usage_day sum = { 0 };
	struct usage_quota_state qs;
	bool first = true;

	buf_adds(b, "{\"key_id\":");
	buf_add_json_str(b, k->id, strlen(k->id));
	add_str(b, "name", k->name);
	add_str(b, "tier", k->tier);
	buf_addf(b, ",\"revoked\":%s", k->revoked ? "true" : "false");
	quota_json(b, k);
	/* A failure here leaves zeros (the store counted it); the rest still answers. */
	(void)usage_quota_state(st, k->id, 0, &qs);
	buf_addf(b,
		 ",\"quota_state\":{\"requests_this_minute\":%" PRId64
		 ",\"requests_today\":%" PRId64 ",\"tokens_today\":%" PRId64
		 ",\"tokens_reserved\":%" PRId64 "},\"days\":[",
		 qs.requests_this_minute, qs.requests_today, qs.tokens_today, qs.tokens_reserved);
	for (size_t i = 0; i < r->ndays; i++) {
		const struct usage_day *d = &r->days[i];

		if (strcmp(d->key_id, k->id))
			continue;
		if (!first)
			buf_addch(b, ',');
		first = false;
		usage_day_json(b, d, false, NULL);
		sums_add(&sum, d);
	}
	buf_addf(b, "],\"totals\":{\"requests\":%" PRId64, sum.requests);
	totals_json(b, &sum);
	buf_addch(b, '}');
	by_account_json(b, k, r);
	buf_addch(b, '}');
}

/* One recent request: no content. */
static void row_json(struct buf *b, const struct usage_row *row)
{
	buf_adds(b, "{\"ts\":");
	time_json(b, row->ts_ms, true);
	add_int(b, "ts_ms", row->ts_ms);
	add_str(b, "key_id", row->key_id);
	add_str(b, "provider", row->provider[0] ? row->provider : NULL);
	add_str(b, "model", row->model[0] ? row->model : NULL);
	add_str(b, "account", row->account[0] ? row->account : NULL);
	add_int(b, "status", row->status);
	add_int(b, "prompt_tokens", row->prompt_tokens);
	add_int(b, "completion_tokens", row->completion_tokens);
	add_int(b, "cached_tokens", row->cached_tokens);
	add_int(b, "duration_ms", (int64_t)row->duration_ms);
	add_int(b, "ttfb_ms", (int64_t)row->ttfb_ms);
	add_str(b, "start", usage_start_name(row->start));
	add_int(b, "count", row->count);
	buf_addch(b, '}');
}

void usage_report_json(struct usage_store *st, const struct usage_report *r, struct buf *b)
{
	buf_adds(b, "{\"object\":\"usage\"");
	add_time(b, "since", r->since_ms, false);
	add_time(b, "generated_at", r->now_ms ? r->now_ms : wall_ms(), true);
	buf_addf(b, ",\"recent_limit\":%zu,\"all_keys\":%s", r->recent_limit,
		 r->all_keys ? "true" : "false");
	add_str(b, "account", r->account);
	buf_adds(b, ",\"keys\":[");
	for (size_t i = 0; i < r->nkeys; i++) {
		if (i)
			buf_addch(b, ',');
		key_json(b, st, &r->keys[i], r);
	}
	buf_adds(b, "],\"recent\":[");
	for (size_t i = 0; i < r->nrows; i++) {
		if (i)
			buf_addch(b, ',');
		row_json(b, &r->rows[i]);
	}
	buf_adds(b, "]}");
}
