/* What the upstream says of the account's subscription limits, read from its answers
 * (issue 26 item 2, ADR 0035).
 *
 * Anthropic announces the state of a subscription's windows on every answer
 * (anthropic-ratelimit-unified-*), codex's backend on its own (x-codex-primary-* and
 * -secondary-*), and a codex 429 says in its body when the limit resets. The forwarder
 * sees every answer of a run and hands what it read to the provider layer, which keeps the
 * latest state per account for the workers of the host.
 *
 * Every value comes from the network and is read strictly: a fixed word, an integer of
 * bounded digits, a plain decimal (no sign, no exponent) in a bounded range. A value that
 * is not is ignored, as if it had not been sent, and nothing read here sizes an
 * allocation or indexes an array: the window a header names is one of four fixed
 * names. */
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "egress/internal.h"
#include "common/banned.h"

/* Epoch seconds accepted as a reset: 2001 to 5138. */
#define EPOCH_MIN 1000000000LL
#define EPOCH_MAX 99999999999LL
/* A relative reset, and a window's length: a year at most. */
#define SECONDS_MAX (366LL * 86400)
#define MINUTES_MAX (366LL * 1440)

static const char *const status_names[] = { "unknown", "allowed", "allowed_warning", "rejected" };
static const char *const window_names[] = { "5h", "7d", "primary", "secondary" };

const char *egr_rl_status_name(enum egr_rl_status s)
{
	return (unsigned)s < ARRAY_SIZE(status_names) ? status_names[s] : "unknown";
}

const char *egr_rl_window_name(enum egr_rl_window w)
{
	return (unsigned)w < ARRAY_SIZE(window_names) ? window_names[w] : "";
}

void egr_rl_init(struct egr_ratelimit *rl, int http_status)
{
	memset(rl, 0, sizeof(*rl));
	rl->http_status = http_status;
	for (size_t i = 0; i < EGR_RL_NWIN; i++)
		rl->win[i].utilization = -1;
}

/* 1 to 18 digits, nothing else, within [min, max]. */
static bool read_int(const char *v, size_t len, int64_t min, int64_t max, int64_t *out)
{
	int64_t n = 0;

	if (!len || len > 18)
		return false;
	for (size_t i = 0; i < len; i++) {
		if (v[i] < '0' || v[i] > '9')
			return false;
		n = n * 10 + (v[i] - '0');
	}
	if (n < min || n > max)
		return false;
	*out = n;
	return true;
}

/* A plain decimal: digits, optionally a '.' and more digits (at most 9 before and 12
 * after), within [0, max]. */
static bool read_dec(const char *v, size_t len, double max, double *out)
{
	double n = 0, scale = 1;
	size_t i = 0, before = 0, after = 0;

	while (i < len && v[i] >= '0' && v[i] <= '9' && before < 9) {
		n = n * 10 + (v[i++] - '0');
		before++;
	}
	if (!before)
		return false;
	if (i < len && v[i] == '.') {
		for (i++; i < len && v[i] >= '0' && v[i] <= '9' && after < 12; i++, after++) {
			scale /= 10;
			n += (v[i] - '0') * scale;
		}
		if (!after)
			return false;
	}
	if (i != len || n > max)
		return false;
	*out = n;
	return true;
}

static bool read_status(const char *v, size_t len, enum egr_rl_status *out)
{
	for (size_t s = EGR_RL_ALLOWED; s < ARRAY_SIZE(status_names); s++)
		if (strlen(status_names[s]) == len && !strncasecmp(v, status_names[s], len)) {
			*out = (enum egr_rl_status)s;
			return true;
		}
	return false;
}

/* Anthropic's representative claim: a short word of [a-z0-9_] ("five_hour"). */
static bool read_claim(const char *v, size_t len, char *out, size_t size)
{
	if (!len || len >= size)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!((v[i] >= 'a' && v[i] <= 'z') || (v[i] >= '0' && v[i] <= '9') || v[i] == '_'))
			return false;
	memcpy(out, v, len);
	out[len] = '\0';
	return true;
}

/* name starts with prefix (case-insensitively): what follows it, or NULL. */
static const char *after(const char *name, size_t len, const char *prefix, size_t *rest)
{
	size_t pl = strlen(prefix);

	if (len <= pl || strncasecmp(name, prefix, pl))
		return NULL;
	*rest = len - pl;
	return name + pl;
}

static bool is(const char *s, size_t len, const char *word)
{
	return strlen(word) == len && !strncasecmp(s, word, len);
}

/* An overall or per-window utilization: a 0-1 fraction (above 1, up to 10, read as 1). */
static bool set_util(struct egr_rl_win *w, double v)
{
	w->utilization = v > 1 ? 1 : v;
	w->seen = true;
	return true;
}

/* anthropic-ratelimit-unified-<rest>. */
static bool anthropic(struct egr_ratelimit *rl, const char *rest, size_t rl_len, const char *v,
		      size_t len)
{
	enum egr_rl_window w;
	int64_t n;
	double d;

	if (is(rest, rl_len, "status"))
		return read_status(v, len, &rl->status);
	if (is(rest, rl_len, "reset"))
		return read_int(v, len, EPOCH_MIN, EPOCH_MAX, &rl->reset_s);
	if (is(rest, rl_len, "representative-claim"))
		return read_claim(v, len, rl->claim, sizeof(rl->claim));
	if (rl_len > 3 && !strncasecmp(rest, "5h-", 3))
		w = EGR_RL_5H;
	else if (rl_len > 3 && !strncasecmp(rest, "7d-", 3))
		w = EGR_RL_7D;
	else
		return false;
	rest += 3;
	rl_len -= 3;
	if (is(rest, rl_len, "status") && read_status(v, len, &rl->win[w].status))
		return (rl->win[w].seen = true);
	if (is(rest, rl_len, "utilization") && read_dec(v, len, 10, &d))
		return set_util(&rl->win[w], d);
	if (is(rest, rl_len, "reset") && read_int(v, len, EPOCH_MIN, EPOCH_MAX, &n)) {
		rl->win[w].reset_s = n;
		return (rl->win[w].seen = true);
	}
	return false;
}

/* x-codex-<primary|secondary>-<rest>. */
static bool codex(struct egr_ratelimit *rl, enum egr_rl_window w, const char *rest, size_t rl_len,
		  const char *v, size_t len, int64_t now_s)
{
	struct egr_rl_win *win = &rl->win[w];
	int64_t n;
	double d;

	if (is(rest, rl_len, "used-percent") && read_dec(v, len, 1000, &d))
		return set_util(win, d / 100);
	if (is(rest, rl_len, "window-minutes") && read_int(v, len, 1, MINUTES_MAX, &n))
		win->minutes = (uint32_t)n;
	else if (is(rest, rl_len, "reset-at") && read_int(v, len, EPOCH_MIN, EPOCH_MAX, &n))
		win->reset_s = n;
	else if (is(rest, rl_len, "reset-after-seconds") && read_int(v, len, 0, SECONDS_MAX, &n))
		win->reset_s = now_s + n;
	else
		return false;
	return (win->seen = true);
}

bool egr_rl_header(struct egr_ratelimit *rl, const char *name, size_t name_len, const char *value,
		   size_t value_len, int64_t now_s)
{
	const char *rest;
	size_t n;
	bool ok = false;

	if ((rest = after(name, name_len, "anthropic-ratelimit-unified-", &n)))
		ok = anthropic(rl, rest, n, value, value_len);
	else if ((rest = after(name, name_len, "x-codex-primary-", &n)))
		ok = codex(rl, EGR_RL_PRIMARY, rest, n, value, value_len, now_s);
	else if ((rest = after(name, name_len, "x-codex-secondary-", &n)))
		ok = codex(rl, EGR_RL_SECONDARY, rest, n, value, value_len, now_s);
	rl->any |= ok;
	return ok;
}

static bool json_word(const json_t *o, const char *key, const char *word)
{
	const char *s = json_string_value(json_object_get(o, key));

	return s && !strcmp(s, word);
}

static bool json_int(const json_t *o, const char *key, int64_t min, int64_t max, int64_t *out)
{
	const json_t *v = json_object_get(o, key);

	if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
		return false;
	*out = (int64_t)json_integer_value(v);
	return true;
}

bool egr_rl_body(struct egr_ratelimit *rl, const char *body, size_t len, int64_t now_s)
{
	json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
	const json_t *e = json_object_get(root, "error");
	int64_t n;
	bool ok = false;

	if (!json_is_object(e))
		e = root;
	if (json_is_object(e) && (json_word(e, "type", "usage_limit_reached") ||
				  json_word(e, "code", "usage_limit_reached"))) {
		rl->status = EGR_RL_REJECTED;
		if (json_int(e, "resets_at", EPOCH_MIN, EPOCH_MAX, &n))
			rl->reset_s = n;
		else if (json_int(e, "resets_in_seconds", 0, SECONDS_MAX, &n))
			rl->reset_s = now_s + n;
		rl->any = ok = true;
	}
	json_decref(root);
	return ok;
}

void egr_rl_finish(struct egr_ratelimit *rl)
{
	bool rejected = false, named = rl->reset_s != 0;

	for (size_t i = 0; i < EGR_RL_NWIN; i++) {
		const struct egr_rl_win *w = &rl->win[i];
		bool full = w->status == EGR_RL_REJECTED || w->utilization >= 1;

		rejected |= w->status == EGR_RL_REJECTED;
		/* The latest reset of a full window: the account is free when all are. */
		if (!named && w->seen && full && w->reset_s > rl->reset_s)
			rl->reset_s = w->reset_s;
	}
	if (rl->status == EGR_RL_UNKNOWN && rl->any)
		rl->status = rejected ? EGR_RL_REJECTED : EGR_RL_ALLOWED;
}
