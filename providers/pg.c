/* The accounts' limits state and the sticky account choices shared by every host through
 * the PostgreSQL store (ADR 0034; the amendments of ADR 0035 and 0037).
 *
 * Reads never wait on the database on the request path: a per-process cache holds the
 * store's rows, kept up to date by the NOTIFY every change sends at commit (the payload is
 * the whole row, so no query follows it) and used only while fresh in ADR 0034's sense:
 * the store's LISTEN thread completed a round trip within PG_FRESH_MS and its connection
 * epoch is the cache's. A new epoch (notifications may have been lost) empties the cache.
 * The limits table is small (providers x accounts): it is loaded whole once per epoch;
 * a sticky choice not in the cache costs one query for that key.
 *
 * Not fresh (the database or the listener away, or no store): limits.c reads the host's
 * own files, sticky.c its own choice file. Limits are advisory: failing open means the CLI
 * runs and the upstream answers 429 itself.
 *
 * Writes of limits leave the answer's path: prov_pg_limits_put queues the state for this
 * process's writer thread (one pending state per account, coalesced) only when it changed
 * in a way that matters (pg_matters), and waits (at most PG_SYNC_MS) only for a new
 * rejection while the database answers, so that the next request on any host is refused.
 * The writer retries every second while the database is away; the answer is never held
 * for it. An upsert never replaces a newer answer's state with an older one (seen_ms).
 *
 * Every value read back (the cache's rows, notifications) is decoded as strictly as the
 * network's words were (egress/ratelimit.c): fixed ranges, fixed words; anything else
 * makes the row unknown. Statements are parameterised: a provider, account or key id is
 * never SQL text. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "providers/internal.h"
#include "store/store.h"
#include "common/banned.h"

#define PG_FRESH_MS 2000   /* ADR 0034's bound for a cache entry */
#define PG_BUCKETS 256	   /* power of two */
#define PG_CACHE_MAX 65536 /* sticky choices beyond this are not cached */
#define PG_PEND_MAX 64	   /* accounts with a state waiting for the writer */
#define PG_REFRESH_MS 5000 /* a state unchanged in what matters: written this often at most */
#define PG_SYNC_MS 1000	   /* a new rejection waits this long for its commit */
#define PG_RETRY_MS 1000   /* the writer's retry while the database is away */
#define PG_POOL_WAIT_MS 200
#define PG_PRUNE_MS INT64_C(3600000)  /* lapsed sticky choices deleted hourly */
#define PG_PRUNE_AGE_S INT64_C(86400) /* ...a day after they lapsed */
#define PG_NAME_MAX 64		      /* provider, account and key id bytes */
#define PG_CHANNEL "olp_providers"

struct pg_entry {
	struct pg_entry *next;
	char kind; /* 'l': limits of provider@name (an account); 'c': choice of provider@name (a key) */
	char provider[PG_NAME_MAX + 1];
	char name[PG_NAME_MAX + 1];
	int64_t gen;
	struct prov_limits st;			 /* 'l' */
	char account[PROV_ACCOUNT_NAME_MAX + 1]; /* 'c' */
	int64_t until;				 /* 'c' */
};

/* One account's state on its way to the store. */
struct pg_pending {
	bool used, dirty, inflight, has_sent;
	char provider[PG_NAME_MAX + 1];
	char account[PG_NAME_MAX + 1];
	struct prov_limits st;	 /* the latest put (what the writer writes next) */
	struct prov_limits sent; /* the last state this process committed */
	uint64_t seq, done_seq, failed_seq;
	int64_t retry_ms; /* mono ms: not before this after a failure */
	int64_t used_ms;  /* mono ms of the last put, for reuse */
};

static struct {
	pthread_mutex_t lock; /* everything below */
	pthread_cond_t cond;  /* the writer's work, and the end of a write */
	struct store_db *db;
	char host[64];
	uint64_t epoch; /* the listener epoch the cache belongs to */
	bool limits_loaded;
	struct pg_entry *buckets[PG_BUCKETS];
	size_t n_entries;
	struct pg_pending pend[PG_PEND_MAX];
	pthread_t writer;
	bool writer_on, stopping, failing;
} pg = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* ---- the state as JSON ----------------------------------------------------------------- */

static json_t *pg_state_encode(const struct prov_limits *st)
{
	json_t *w = json_array();

	for (size_t i = 0; i < EGR_RL_NWIN; i++) {
		const struct egr_rl_win *x = &st->rl.win[i];

		json_array_append_new(w,
				      json_pack("{s:b, s:i, s:f, s:I, s:I, s:I}", "n", x->seen, "s",
						(int)x->status, "u", x->utilization, "r",
						(json_int_t)x->reset_s, "m", (json_int_t)x->minutes,
						"t", (json_int_t)st->win_seen_ms[i]));
	}
	return json_pack("{s:i, s:i, s:I, s:s, s:I, s:o}", "s", (int)st->rl.status, "h",
			 st->rl.http_status, "r", (json_int_t)st->rl.reset_s, "c", st->rl.claim,
			 "t", (json_int_t)st->seen_ms, "w", w);
}

/* An integer member in [lo, hi]: 0 with *v, else -1. */
static int pg_int(const json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *v)
{
	const json_t *j = json_object_get(o, k);

	if (!json_is_integer(j) || json_integer_value(j) < lo || json_integer_value(j) > hi)
		return -1;
	*v = json_integer_value(j);
	return 0;
}

static int pg_win_decode(const json_t *o, struct egr_rl_win *x, int64_t *seen_ms)
{
	const json_t *n = json_object_get(o, "n"), *u = json_object_get(o, "u");
	int64_t s, r, m;

	if (!json_is_boolean(n) || !json_is_number(u) || pg_int(o, "s", 0, EGR_RL_REJECTED, &s) ||
	    pg_int(o, "r", 0, INT64_C(1) << 40, &r) || pg_int(o, "m", 0, UINT32_MAX, &m) ||
	    pg_int(o, "t", 0, INT64_C(1) << 50, seen_ms))
		return -1;
	x->seen = json_is_true(n);
	x->status = (enum egr_rl_status)s;
	x->utilization = json_number_value(u);
	if (!isfinite(x->utilization) || x->utilization > 1.0)
		return -1;
	if (x->utilization < 0)
		x->utilization = -1;
	x->reset_s = r;
	x->minutes = (uint32_t)m;
	return 0;
}

/* A state from its JSON: 0, or -EINVAL for anything not as pg_state_encode writes it. */
static int pg_state_decode(const json_t *o, struct prov_limits *st)
{
	const json_t *w = json_object_get(o, "w"), *c = json_object_get(o, "c");
	int64_t s, h, r;
	size_t len;

	memset(st, 0, sizeof(*st));
	if (!json_is_object(o) || !json_is_array(w) || json_array_size(w) != EGR_RL_NWIN ||
	    !json_is_string(c) || pg_int(o, "s", 0, EGR_RL_REJECTED, &s) ||
	    pg_int(o, "h", 0, 999, &h) || pg_int(o, "r", 0, INT64_C(1) << 40, &r) ||
	    pg_int(o, "t", 0, INT64_C(1) << 50, &st->seen_ms))
		return -EINVAL;
	len = json_string_length(c);
	if (len >= sizeof(st->rl.claim) ||
	    strspn(json_string_value(c), "abcdefghijklmnopqrstuvwxyz0123456789_") != len)
		return -EINVAL;
	memcpy(st->rl.claim, json_string_value(c), len + 1);
	st->rl.any = true;
	st->rl.status = (enum egr_rl_status)s;
	st->rl.http_status = (int)h;
	st->rl.reset_s = r;
	for (size_t i = 0; i < EGR_RL_NWIN; i++)
		if (pg_win_decode(json_array_get(w, i), &st->rl.win[i], &st->win_seen_ms[i]))
			return -EINVAL;
	return 0;
}

/* ---- the cache ------------------------------------------------------------------------- */

static size_t pg_bucket(char kind, const char *provider, const char *name)
{
	uint32_t h = 2166136261u ^ (unsigned char)kind; /* FNV-1a */

	for (const char *c = provider; *c; c++)
		h = (h ^ (unsigned char)*c) * 16777619u;
	h = (h ^ '@') * 16777619u;
	for (const char *c = name; *c; c++)
		h = (h ^ (unsigned char)*c) * 16777619u;
	return h & (PG_BUCKETS - 1);
}

/* Caller holds lock. */
static struct pg_entry **pg_find(char kind, const char *provider, const char *name)
{
	struct pg_entry **pp = &pg.buckets[pg_bucket(kind, provider, name)];

	for (; *pp; pp = &(*pp)->next)
		if ((*pp)->kind == kind && !strcmp((*pp)->provider, provider) &&
		    !strcmp((*pp)->name, name))
			break;
	return pp;
}

/* Caller holds lock. */
static void pg_cache_clear(void)
{
	for (size_t b = 0; b < PG_BUCKETS; b++) {
		while (pg.buckets[b]) {
			struct pg_entry *e = pg.buckets[b];

			pg.buckets[b] = e->next;
			free(e);
		}
	}
	pg.n_entries = 0;
	pg.limits_loaded = false;
}

/* Caller holds lock. The entry for (kind, provider, name) when e is newer than it (or
 * none is kept): e is copied in. gen < 0 removes the entry (the row was deleted). */
static void pg_install(const struct pg_entry *e)
{
	struct pg_entry **pp = pg_find(e->kind, e->provider, e->name), *x = *pp;

	if (e->gen < 0) {
		if (x) {
			*pp = x->next;
			free(x);
			pg.n_entries--;
		}
		return;
	}
	if (x) {
		if (x->gen < e->gen) {
			struct pg_entry *next = x->next;

			*x = *e;
			x->next = next;
		}
		return;
	}
	if (e->kind == 'c' && pg.n_entries >= PG_CACHE_MAX)
		return;
	x = xmalloc(sizeof(*x));
	*x = *e;
	x->next = *pp;
	*pp = x;
	pg.n_entries++;
}

/* Caller holds lock. Whether the cache may be used now (ADR 0034's rule); a new listener
 * epoch empties it first, since notifications may have been lost. *epoch: the epoch. */
static bool pg_fresh(uint64_t *epoch)
{
	uint64_t ep;
	int64_t f;

	if (!pg.db)
		return false;
	f = store_listen_fresh_ms(pg.db, &ep);
	if (epoch)
		*epoch = ep;
	if (!f || (int64_t)mono_ms() - f > PG_FRESH_MS)
		return false;
	if (ep != pg.epoch) {
		pg_cache_clear();
		pg.epoch = ep;
	}
	return true;
}

static bool pg_name_ok(const char *s)
{
	size_t n = strnlen(s, PG_NAME_MAX + 1);

	return n && n <= PG_NAME_MAX;
}

/* A notification's row (pg_providers_notify's JSON) as an entry: 0 or -EINVAL. */
static int pg_notice_decode(const json_t *o, struct pg_entry *e)
{
	const char *t = json_string_value(json_object_get(o, "t"));
	const char *p = json_string_value(json_object_get(o, "p"));
	const char *n = json_string_value(json_object_get(o, t && *t == 'c' ? "k" : "a"));
	const char *a = json_string_value(json_object_get(o, "a"));
	const json_t *g = json_object_get(o, "g");

	memset(e, 0, sizeof(*e));
	if (!t || (strcmp(t, "l") && strcmp(t, "c")) || !p || !n || !pg_name_ok(p) ||
	    !pg_name_ok(n))
		return -EINVAL;
	e->kind = *t;
	memcpy(e->provider, p, strlen(p) + 1);
	memcpy(e->name, n, strlen(n) + 1);
	if (!g) {
		e->gen = -1; /* deleted */
		return 0;
	}
	if (!json_is_integer(g) || json_integer_value(g) < 0)
		return -EINVAL;
	e->gen = json_integer_value(g);
	if (e->kind == 'l')
		return pg_state_decode(json_object_get(o, "s"), &e->st);
	if (!a || strlen(a) > PROV_ACCOUNT_NAME_MAX ||
	    pg_int(o, "u", 0, INT64_C(1) << 40, &e->until))
		return -EINVAL;
	memcpy(e->account, a, strlen(a) + 1);
	return 0;
}

/* On the store's listener thread: a committed change of either table. */
static void pg_on_notify(void *arg, const char *payload)
{
	struct pg_entry e;
	json_t *o = json_loads(payload, 0, NULL);

	(void)arg;
	if (o && !pg_notice_decode(o, &e)) {
		pthread_mutex_lock(&pg.lock);
		pg_install(&e);
		pthread_mutex_unlock(&pg.lock);
	}
	json_decref(o);
}

/* On the listener thread, before a new epoch: what was cached may have missed changes. */
static void pg_on_resync(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&pg.lock);
	pg_cache_clear();
	pthread_mutex_unlock(&pg.lock);
}

/* ---- statements ------------------------------------------------------------------------ */

/* Run one statement on a pooled connection: the result (PQclear it) or NULL. Never waits
 * on a database known to be away (store_conn_get answers at once then). */
static PGresult *pg_exec(const char *sql, int n, const char *const *params)
{
	PGconn *c = store_conn_get(pg.db, PG_POOL_WAIT_MS);
	bool broken = false;
	PGresult *r;

	if (!c)
		return NULL;
	r = store_exec(pg.db, c, sql, n, params, NULL, &broken);
	store_conn_put(pg.db, c, broken);
	return r;
}

/* The whole limits table into the cache, once per epoch. 0 or -ESTALE. */
static int pg_load_limits(uint64_t epoch)
{
	PGresult *r = pg_exec("SELECT provider, account, gen, state::text FROM olp_account_limits",
			      0, NULL);
	struct pg_entry e;
	int rows;

	if (!r)
		return -ESTALE;
	rows = PQntuples(r);
	pthread_mutex_lock(&pg.lock);
	/* A reconnect meanwhile: what was read may predate notifications now lost. */
	if (pg_fresh(NULL) && pg.epoch == epoch) {
		for (int i = 0; i < rows; i++) {
			json_t *s = json_loads(PQgetvalue(r, i, 3), 0, NULL);

			memset(&e, 0, sizeof(e));
			e.kind = 'l';
			if (pg_name_ok(PQgetvalue(r, i, 0)) && pg_name_ok(PQgetvalue(r, i, 1)) &&
			    !pg_state_decode(s, &e.st)) {
				(void)snprintf(e.provider, sizeof(e.provider), "%s",
					       PQgetvalue(r, i, 0));
				(void)snprintf(e.name, sizeof(e.name), "%s", PQgetvalue(r, i, 1));
				e.gen = strtoll(PQgetvalue(r, i, 2), NULL, 10);
				pg_install(&e);
			}
			json_decref(s);
		}
		pg.limits_loaded = true;
	}
	pthread_mutex_unlock(&pg.lock);
	PQclear(r);
	return 0;
}

int prov_pg_limits_get(const char *provider, const char *account, bool may_load,
		       struct prov_limits *out)
{
	struct pg_entry *e;
	uint64_t epoch;
	int ret = -ENOENT;

	if (!pg.db)
		return -ESTALE;
	pthread_mutex_lock(&pg.lock);
	if (!pg_fresh(&epoch)) {
		ret = -ESTALE;
	} else if (!pg.limits_loaded) {
		pthread_mutex_unlock(&pg.lock);
		if (!may_load || pg_load_limits(epoch))
			return -ESTALE;
		pthread_mutex_lock(&pg.lock);
		if (!pg.limits_loaded)
			ret = -ESTALE;
	}
	if (ret == -ENOENT && (e = *pg_find('l', provider, account))) {
		*out = e->st;
		ret = 0;
	}
	pthread_mutex_unlock(&pg.lock);
	return ret;
}

/* ---- writing the limits ---------------------------------------------------------------- */

/* Whether st differs from base in a way another host must know at once: the status, a
 * window's status or reset, a utilization moved by a point or more; or base is older
 * than PG_REFRESH_MS. */
static bool pg_matters(const struct prov_limits *base, const struct prov_limits *st)
{
	if (st->rl.status != base->rl.status || st->rl.reset_s != base->rl.reset_s ||
	    st->seen_ms - base->seen_ms >= PG_REFRESH_MS)
		return true;
	for (size_t i = 0; i < EGR_RL_NWIN; i++) {
		const struct egr_rl_win *a = &base->rl.win[i], *b = &st->rl.win[i];

		if (a->status != b->status || a->reset_s != b->reset_s ||
		    fabs(a->utilization - b->utilization) >= 0.01)
			return true;
	}
	return false;
}

/* Caller holds lock. The pending slot of the account, a free one, or the least recently
 * used idle one; NULL when every slot is busy. */
static struct pg_pending *pg_pending_slot(const char *provider, const char *account)
{
	struct pg_pending *unused = NULL, *lru = NULL, *idle;

	for (size_t i = 0; i < PG_PEND_MAX; i++) {
		struct pg_pending *p = &pg.pend[i];

		if (!p->used) {
			if (!unused)
				unused = p;
		} else if (!strcmp(p->provider, provider) && !strcmp(p->account, account)) {
			return p;
		} else if (!p->dirty && !p->inflight && (!lru || p->used_ms < lru->used_ms)) {
			lru = p;
		}
	}
	idle = unused ? unused : lru;
	if (idle) {
		memset(idle, 0, sizeof(*idle));
		idle->used = true;
		(void)snprintf(idle->provider, sizeof(idle->provider), "%s", provider);
		(void)snprintf(idle->account, sizeof(idle->account), "%s", account);
	}
	return idle;
}

/* Caller holds lock: wait for the write of seq (PG_SYNC_MS at most). */
static void pg_wait_written(struct pg_pending *p, uint64_t seq)
{
	struct timespec ts = clock_after_ms(CLOCK_MONOTONIC, PG_SYNC_MS);

	while (p->done_seq < seq && p->failed_seq < seq && !pg.stopping)
		if (pthread_cond_timedwait(&pg.cond, &pg.lock, &ts) == ETIMEDOUT)
			break;
}

void prov_pg_limits_put(const char *provider, const char *account, const struct prov_limits *st)
{
	struct prov_limits cached, *base = NULL;
	struct pg_pending *p;
	struct pg_entry *e;
	uint64_t seq;
	bool wait;

	if (!pg.db || !pg_name_ok(provider) || !pg_name_ok(account))
		return;
	pthread_mutex_lock(&pg.lock);
	if (!pg.writer_on)
		goto out;
	p = pg_pending_slot(provider, account);
	/* What the store holds, as far as this process knows: the state on its way there,
	 * else the newer of the cache's row and this process's last write (the row's
	 * notification may not have come back yet). */
	if (p && (p->dirty || p->inflight))
		base = &p->st;
	else if (p && p->has_sent)
		base = &p->sent;
	if (!(p && (p->dirty || p->inflight)) && pg_fresh(NULL) && pg.limits_loaded &&
	    (e = *pg_find('l', provider, account)) && (!base || e->st.seen_ms > base->seen_ms)) {
		cached = e->st;
		base = &cached;
	}
	if (base && !pg_matters(base, st))
		goto out;
	if (!p) {
		log_warnx(NULL,
			  "provider %s: account %s: %d accounts already wait for the store: "
			  "this state is kept on this host only",
			  provider, account, PG_PEND_MAX);
		goto out;
	}
	/* A rejection the store does not know yet is what another host must see before its
	 * next request: wait for its commit, briefly, and only while the database answers. */
	wait = st->rl.status == EGR_RL_REJECTED && (!base || base->rl.status != EGR_RL_REJECTED) &&
	       store_available(pg.db);

	p->st = *st;
	p->dirty = true;
	p->retry_ms = 0;
	p->used_ms = (int64_t)mono_ms();
	seq = ++p->seq;
	pthread_cond_broadcast(&pg.cond);
	if (wait)
		pg_wait_written(p, seq);
out:
	pthread_mutex_unlock(&pg.lock);
}

/* One state into the store: true when committed (or older than the store's). */
static bool pg_write_limits(const char *provider, const char *account, const struct prov_limits *st)
{
	char seen[24];
	json_t *j = pg_state_encode(st);
	char *text = json_dumps(j, JSON_COMPACT);
	const char *params[] = { provider, account, seen, text, pg.host };
	PGresult *r;

	(void)snprintf(seen, sizeof(seen), "%lld", (long long)st->seen_ms);
	r = pg_exec("INSERT INTO olp_account_limits (provider, account, seen_ms, state, host)"
		    " VALUES ($1, $2, $3::bigint, $4::jsonb, $5)"
		    " ON CONFLICT (provider, account) DO UPDATE SET seen_ms = EXCLUDED.seen_ms,"
		    " state = EXCLUDED.state, host = EXCLUDED.host,"
		    " gen = nextval('olp_providers_gen')"
		    " WHERE olp_account_limits.seen_ms <= EXCLUDED.seen_ms",
		    5, params);
	free(text);
	json_decref(j);
	PQclear(r);
	return r != NULL;
}

/* Lapsed sticky choices, a day after they lapsed (a choice past its time is replaced by
 * the next request anyway; this only keeps the table the size of the live keys). */
static void pg_prune(void)
{
	char before[24];
	const char *params[] = { before };

	(void)snprintf(before, sizeof(before), "%lld",
		       (long long)(wall_ms() / 1000 - PG_PRUNE_AGE_S));
	PQclear(pg_exec("DELETE FROM olp_account_choices WHERE until < $1::bigint", 1, params));
}

/* Caller holds lock. The next pending state due now, or NULL with *wait_ms until one is. */
static struct pg_pending *pg_next_due(int64_t now, int64_t *wait_ms)
{
	*wait_ms = PG_RETRY_MS;
	for (size_t i = 0; i < PG_PEND_MAX; i++) {
		struct pg_pending *p = &pg.pend[i];

		if (!p->used || !p->dirty || p->inflight)
			continue;
		if (p->retry_ms <= now)
			return p;
		if (p->retry_ms - now < *wait_ms)
			*wait_ms = p->retry_ms - now;
	}
	return NULL;
}

static void pg_wait_ms(int64_t ms)
{
	struct timespec ts = clock_after_ms(CLOCK_MONOTONIC, (uint64_t)ms);

	(void)pthread_cond_timedwait(&pg.cond, &pg.lock, &ts);
}

/* The writer: each pending state to the store, the latest one of each account. */
static void *pg_writer(void *arg)
{
	int64_t next_prune = (int64_t)mono_ms() + PG_PRUNE_MS, wait;
	char provider[PG_NAME_MAX + 1], account[PG_NAME_MAX + 1];
	struct prov_limits st;
	struct pg_pending *p;
	uint64_t seq;
	bool ok;

	(void)arg;
	pthread_mutex_lock(&pg.lock);
	while (!pg.stopping) {
		if (!(p = pg_next_due((int64_t)mono_ms(), &wait))) {
			if ((int64_t)mono_ms() >= next_prune) {
				pthread_mutex_unlock(&pg.lock);
				pg_prune();
				pthread_mutex_lock(&pg.lock);
				next_prune = (int64_t)mono_ms() + PG_PRUNE_MS;
			}
			pg_wait_ms(wait);
			continue;
		}
		memcpy(provider, p->provider, sizeof(provider));
		memcpy(account, p->account, sizeof(account));
		st = p->st;
		seq = p->seq;
		p->dirty = false;
		p->inflight = true;
		pthread_mutex_unlock(&pg.lock);
		ok = pg_write_limits(provider, account, &st);
		pthread_mutex_lock(&pg.lock);
		p->inflight = false;
		if (ok) {
			p->sent = st;
			p->has_sent = true;
			p->done_seq = seq;
			if (pg.failing)
				log_info(NULL,
					 "accounts' limits: written to the shared store again");
			pg.failing = false;
		} else {
			p->failed_seq = seq;
			p->dirty = true; /* this state, or a newer put's */
			p->retry_ms = (int64_t)mono_ms() + PG_RETRY_MS;
			if (!pg.failing)
				log_warnx(NULL,
					  "accounts' limits: the shared store cannot be written "
					  "now; this host's files are used, and the store is "
					  "tried again every second");
			pg.failing = true;
		}
		pthread_cond_broadcast(&pg.cond);
	}
	pthread_mutex_unlock(&pg.lock);
	return NULL;
}

/* ---- the sticky choices ---------------------------------------------------------------- */

/* A row (account, until, gen) of a choice into out, cached when the cache is fresh in
 * epoch. 0 or -EINVAL (an account that is no account name). */
static int pg_choice_row(PGresult *r, const char *provider, const char *who, uint64_t epoch,
			 char *account, int64_t *until)
{
	const char *a = PQgetvalue(r, 0, 0);
	struct pg_entry e;

	if (PQgetisnull(r, 0, 0) || !*a || strlen(a) > PROV_ACCOUNT_NAME_MAX)
		return -EINVAL;
	memcpy(account, a, strlen(a) + 1);
	*until = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
	memset(&e, 0, sizeof(e));
	e.kind = 'c';
	(void)snprintf(e.provider, sizeof(e.provider), "%s", provider);
	(void)snprintf(e.name, sizeof(e.name), "%s", who);
	memcpy(e.account, account, sizeof(e.account));
	e.until = *until;
	e.gen = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
	pthread_mutex_lock(&pg.lock);
	if (pg_fresh(NULL) && pg.epoch == epoch)
		pg_install(&e);
	pthread_mutex_unlock(&pg.lock);
	return 0;
}

int prov_pg_choice_get(const char *provider, const char *who, char *account, int64_t *until)
{
	const char *params[] = { provider, who };
	struct pg_entry *e;
	uint64_t epoch = 0;
	PGresult *r;
	int ret;

	if (!pg.db || !pg_name_ok(provider) || !pg_name_ok(who))
		return -ESTALE;
	pthread_mutex_lock(&pg.lock);
	if (pg_fresh(&epoch) && (e = *pg_find('c', provider, who))) {
		memcpy(account, e->account, sizeof(e->account));
		*until = e->until;
		pthread_mutex_unlock(&pg.lock);
		return 0;
	}
	pthread_mutex_unlock(&pg.lock);
	r = pg_exec("SELECT account, until, gen FROM olp_account_choices"
		    " WHERE provider = $1 AND key_id = $2",
		    2, params);
	if (!r)
		return -ESTALE;
	ret = PQntuples(r) == 1 ? pg_choice_row(r, provider, who, epoch, account, until) : -ENOENT;
	PQclear(r);
	return ret;
}

int prov_pg_choose(const char *provider, const char *who, const char *account, int64_t until,
		   int64_t now_s, const char *old, char *out, int64_t *out_until)
{
	char u[24], n[24];
	const char *params[] = { provider, who, account, u, n, old };
	uint64_t epoch = 0;
	PGresult *r;
	int ret;

	if (!pg.db || !pg_name_ok(provider) || !pg_name_ok(who))
		return -ESTALE;
	pthread_mutex_lock(&pg.lock);
	(void)pg_fresh(&epoch);
	pthread_mutex_unlock(&pg.lock);
	(void)snprintf(u, sizeof(u), "%lld", (long long)until);
	(void)snprintf(n, sizeof(n), "%lld", (long long)now_s);
	r = pg_exec("SELECT o_account, o_until, o_gen FROM"
		    " olp_account_choose($1, $2, $3, $4::bigint, $5::bigint, $6)",
		    6, params);
	if (!r)
		return -ESTALE;
	ret = PQntuples(r) == 1 ? pg_choice_row(r, provider, who, epoch, out, out_until) : -EIO;
	PQclear(r);
	return ret ? -ESTALE : 0;
}

/* ---- attaching ------------------------------------------------------------------------- */

int prov_store_attach(struct store_db *db)
{
	pthread_condattr_t ca;
	unsigned found = 0;
	int ret;

	if (!db || pg.db)
		return -EINVAL;
	ret = store_schema_check(db, prov_pg_schema(), &found);
	if (ret == -ENOENT || ret == -EPROTO) {
		log_warnx(NULL,
			  "the shared store has %s providers schema (this build's is version %u): "
			  "the accounts' limits and choices stay per host until olp-keys store "
			  "init is run",
			  ret == -ENOENT ? "no" : "another", prov_pg_schema()->n);
		return ret;
	}
	/* The database away: go on; the cache is used once it answers. */
	ret = store_listen(db, PG_CHANNEL, pg_on_notify, pg_on_resync, &pg);
	if (ret)
		return ret;
	if (gethostname(pg.host, sizeof(pg.host)) < 0)
		(void)snprintf(pg.host, sizeof(pg.host), "?");
	pg.host[sizeof(pg.host) - 1] = '\0';
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&pg.cond, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_lock(&pg.lock);
	pg.db = db;
	pg.stopping = false;
	pg.epoch = 0;
	pg_cache_clear();
	memset(pg.pend, 0, sizeof(pg.pend));
	ret = -pthread_create(&pg.writer, NULL, pg_writer, NULL);
	pg.writer_on = !ret;
	pthread_mutex_unlock(&pg.lock);
	if (ret)
		log_warnx(NULL, "accounts' limits: no writer thread (%s): kept per host",
			  strerror(-ret));
	return 0;
}

void prov_store_detach(void)
{
	struct store_db *db = pg.db;
	bool joined;

	if (!db)
		return;
	pthread_mutex_lock(&pg.lock);
	pg.stopping = true;
	joined = pg.writer_on;
	pg.writer_on = false;
	pthread_cond_broadcast(&pg.cond);
	pthread_mutex_unlock(&pg.lock);
	if (joined)
		pthread_join(pg.writer, NULL);
	store_unlisten(db, &pg);
	pthread_mutex_lock(&pg.lock);
	pg.db = NULL;
	pg_cache_clear();
	pthread_mutex_unlock(&pg.lock);
	pthread_cond_destroy(&pg.cond);
}
