/* usage: a key's max_concurrent, held across the processes of a host (slot files) or
 * across hosts (lease rows in the shared store) (usage.h, ADR 0020, 0034).
 *
 * Embedded: a slot is a flock'ed file <runtime_dir>/keyslots/<hex of the key id>.<i>.slot
 * (common.h slot_take); the kernel gives it back when its holder dies.
 *
 * PostgreSQL: a slot is a row of olp_leases (key, slot, holder, expires_at), taken by the
 * function olp_lease_take under the key's transaction-scoped advisory lock (two hosts
 * cannot both see the last free slot), with the database's clock. The holder is this
 * process's leases object ("host:pid:random"). A thread renews every lease the holder
 * has every ttl / 3 (5 s by default) to now + ttl (15 s): a process or host that dies
 * stops renewing, and its slots are taken over by the next take after they expired. A
 * release that fails (the database away) is queued and retried by the same thread before
 * it renews anything, so a lease given back is never renewed again; meanwhile it lapses on
 * its own. When renewals fail for longer than ttl, other hosts may take the slots of the
 * requests still running here: the cap is then exceeded by those requests at most, which
 * the database's being away for that long makes unavoidable (they are not stopped). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "store/store.h"
#include "usage/internal.h"
#include "usage/usage.h"
#include "common/banned.h"

#define LEASE_TTL_MS 15000u
#define LEASE_WAIT_MS 2000u
#define LEASE_PENDING_MAX 4096

struct pending {
	char key_id[64];
	int64_t slot;
};

struct usage_leases {
	char *dir;	     /* embedded: <runtime_dir>/keyslots, or NULL */
	struct store_db *db; /* borrowed, or NULL */
	unsigned ttl_ms;
	char holder[160];

	pthread_mutex_t lock; /* everything below */
	pthread_cond_t wake;
	unsigned held; /* leases this holder has in the database */
	struct pending *pending;
	size_t n_pending;
	bool started, stop;
	pthread_t renewer;
};

struct usage_leases *usage_leases_open(const struct usage_lease_options *o)
{
	struct usage_leases *ls;
	char host[128] = "";
	uint32_t rnd[2] = { 0, 0 };
	char *dir = NULL;

	if (!o || (!o->store && (!o->runtime_dir || !*o->runtime_dir))) {
		errno = EINVAL;
		return NULL;
	}
	if (o->runtime_dir && *o->runtime_dir && !o->store) {
		dir = path_join(o->runtime_dir, "keyslots");
		if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
			int e = errno;

			free(dir);
			errno = e;
			return NULL;
		}
	}
	ls = xcalloc(1, sizeof(*ls));
	ls->dir = dir;
	ls->db = o->store;
	ls->ttl_ms = o->ttl_ms ? o->ttl_ms : LEASE_TTL_MS;
	if (o->host && *o->host)
		(void)snprintf(host, sizeof(host), "%s", o->host);
	else if (gethostname(host, sizeof(host) - 1) < 0 || !*host)
		(void)snprintf(host, sizeof(host), "localhost");
	/* The random part: a pid reused after a restart (a container's pid 1) is another
	 * holder, whose renewals must not revive its predecessor's leases. */
	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
		rnd[0] = (uint32_t)mono_ns(), rnd[1] = (uint32_t)(uintptr_t)ls;
	(void)snprintf(ls->holder, sizeof(ls->holder), "%s:%ld:%08" PRIx32 "%08" PRIx32, host,
		       (long)getpid(), rnd[0], rnd[1]);
	pthread_mutex_init(&ls->lock, NULL);
	pthread_cond_init(&ls->wake, NULL);
	return ls;
}

/* ---- PostgreSQL ------------------------------------------------------------------------- */

/* Run one statement on a connection of the pool: its result, or NULL with *err set. */
static PGresult *lease_exec(struct usage_leases *ls, const char *sql, int n, const char *const *p,
			    int *err)
{
	bool broken = false;
	PGresult *r;
	PGconn *c = store_conn_get(ls->db, LEASE_WAIT_MS);

	if (!c) {
		*err = errno == ETIMEDOUT ? -ETIMEDOUT : -ECONNREFUSED;
		return NULL;
	}
	r = store_exec(ls->db, c, sql, n, p, NULL, &broken);
	store_conn_put(ls->db, c, broken);
	*err = r ? 0 : broken ? -ECONNREFUSED : -EIO;
	return r;
}

static int release_row(struct usage_leases *ls, const char *key_id, int64_t slot)
{
	char s[24];
	const char *p[3] = { key_id, s, ls->holder };
	PGresult *r;
	int err;

	(void)snprintf(s, sizeof(s), "%" PRId64, slot);
	r = lease_exec(ls,
		       "DELETE FROM olp_leases WHERE key_id = $1 AND slot = $2::integer"
		       " AND holder = $3",
		       3, p, &err);
	PQclear(r);
	return err;
}

/* The renewer's round: the releases that failed, then every lease of this holder renewed.
 * A release still failing is kept, and nothing is renewed (it would revive it). */
static void renew_round(struct usage_leases *ls)
{
	char ttl[24];
	const char *p[2] = { ls->holder, ttl };
	struct pending one;
	PGresult *r;
	int err;

	pthread_mutex_lock(&ls->lock);
	while (ls->n_pending) {
		one = ls->pending[ls->n_pending - 1];
		pthread_mutex_unlock(&ls->lock);
		err = release_row(ls, one.key_id, one.slot);
		pthread_mutex_lock(&ls->lock);
		if (err)
			break;
		ls->n_pending--;
	}
	if (ls->n_pending || !ls->held) {
		pthread_mutex_unlock(&ls->lock);
		return;
	}
	pthread_mutex_unlock(&ls->lock);
	(void)snprintf(ttl, sizeof(ttl), "%u", ls->ttl_ms);
	r = lease_exec(ls,
		       "UPDATE olp_leases SET expires_at = clock_timestamp() + $2::bigint"
		       " * interval '1 millisecond' WHERE holder = $1",
		       2, p, &err);
	PQclear(r);
}

static void *renewer_main(void *arg)
{
	struct usage_leases *ls = arg;
	unsigned every = ls->ttl_ms / 3 ? ls->ttl_ms / 3 : 1;
	struct timespec ts;

	pthread_mutex_lock(&ls->lock);
	while (!ls->stop) {
		ts = clock_after_ms(CLOCK_REALTIME, every);
		(void)pthread_cond_timedwait(&ls->wake, &ls->lock, &ts);
		if (ls->stop)
			break;
		pthread_mutex_unlock(&ls->lock);
		renew_round(ls);
		pthread_mutex_lock(&ls->lock);
	}
	pthread_mutex_unlock(&ls->lock);
	return NULL;
}

/* Start the renewer once (with ls->lock held): 0 or -errno. */
static int renewer_start(struct usage_leases *ls)
{
	int e;

	if (ls->started)
		return 0;
	e = pthread_create(&ls->renewer, NULL, renewer_main, ls);
	if (e) {
		log_errx(NULL, "usage: cannot start the lease renewal thread: %s", strerror(e));
		return -e;
	}
	ls->started = true;
	return 0;
}

static int pg_take(struct usage_leases *ls, const char *key, int64_t max, struct usage_lease *l)
{
	char m[24], ttl[24];
	const char *p[4] = { key, ls->holder, m, ttl };
	PGresult *r;
	int64_t slot;
	int err;

	pthread_mutex_lock(&ls->lock);
	err = renewer_start(ls);
	pthread_mutex_unlock(&ls->lock);
	if (err)
		return err;
	(void)snprintf(m, sizeof(m), "%" PRId64, max > INT_MAX ? (int64_t)INT_MAX : max);
	(void)snprintf(ttl, sizeof(ttl), "%u", ls->ttl_ms);
	r = lease_exec(ls, "SELECT olp_lease_take($1, $2, $3::integer, $4::bigint)", 4, p, &err);
	if (!r)
		return err;
	slot = PQntuples(r) == 1 ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : -1;
	PQclear(r);
	if (slot < 0)
		return -EBUSY;
	pthread_mutex_lock(&ls->lock);
	ls->held++;
	pthread_mutex_unlock(&ls->lock);
	l->slot = slot;
	return 0;
}

static void pg_release(struct usage_leases *ls, struct usage_lease *l)
{
	int err = release_row(ls, l->key_id, l->slot);

	pthread_mutex_lock(&ls->lock);
	if (ls->held)
		ls->held--;
	if (err && ls->n_pending < LEASE_PENDING_MAX) {
		if (!ls->pending)
			ls->pending = xreallocarray(NULL, LEASE_PENDING_MAX, sizeof(*ls->pending));
		snprintf(ls->pending[ls->n_pending].key_id, sizeof(ls->pending[0].key_id), "%s",
			 l->key_id);
		ls->pending[ls->n_pending++].slot = l->slot;
	}
	pthread_mutex_unlock(&ls->lock);
}

/* ---- either ----------------------------------------------------------------------------- */

int usage_lease_take(struct usage_leases *ls, const char *key_id, int64_t max,
		     struct usage_lease *l)
{
	char prefix[2 * USAGE_KEY_ID_MAX + 1];
	size_t len;
	int ret;

	if (l)
		*l = (struct usage_lease)USAGE_LEASE_INIT;
	if (!ls || !key_id || !*key_id || max <= 0 || !l)
		return -EINVAL;
	usage_key_cut(l->key_id, sizeof(l->key_id), key_id);
	if (ls->db) {
		ret = pg_take(ls, l->key_id, max, l);
		if (!ret)
			l->held = true;
		return ret;
	}
	if (!ls->dir)
		return -ENOENT;
	/* Hex: a file name part for any id ("__env_owner__" too), never a path. */
	len = strlen(l->key_id);
	for (size_t i = 0; i < len; i++)
		snprintf(prefix + 2 * i, 3, "%02x", (unsigned char)l->key_id[i]);
	prefix[2 * len] = '\0';
	ret = slot_take(ls->dir, prefix, max > UINT_MAX ? UINT_MAX : (unsigned)max);
	if (ret < 0)
		return ret;
	l->fd = ret;
	l->held = true;
	return 0;
}

void usage_lease_release(struct usage_leases *ls, struct usage_lease *l)
{
	if (!l || !l->held)
		return;
	if (l->fd >= 0)
		slot_release(l->fd);
	else if (ls && ls->db)
		pg_release(ls, l);
	*l = (struct usage_lease)USAGE_LEASE_INIT;
}

void usage_leases_free(struct usage_leases *ls)
{
	if (!ls)
		return;
	if (ls->started) {
		pthread_mutex_lock(&ls->lock);
		ls->stop = true;
		pthread_cond_broadcast(&ls->wake);
		pthread_mutex_unlock(&ls->lock);
		pthread_join(ls->renewer, NULL);
		/* The last failed releases: once more, then they lapse on their own. */
		while (ls->n_pending) {
			ls->n_pending--;
			(void)release_row(ls, ls->pending[ls->n_pending].key_id,
					  ls->pending[ls->n_pending].slot);
		}
	}
	free(ls->pending);
	pthread_cond_destroy(&ls->wake);
	pthread_mutex_destroy(&ls->lock);
	free(ls->dir);
	free(ls);
}
