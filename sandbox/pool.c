/* What a process keeps started ahead of a run: warm sandboxes and pre-started commands.
 *
 * Warm sandboxes (ADR 0008). Building namespaces and mounts is most of a sandboxed spawn's
 * cost (docs/performance.md). For a policy it has run once, a worker keeps sandboxes
 * started ahead of time, whose payload (olp-sandbox-exec) waits on stdin for the command it
 * is to become; a request then costs one exec. A warm sandbox is built from exactly the
 * same policy, so it is the same sandbox; it just exists earlier. It is keyed by everything
 * that shapes it: bwrap's argv (less the scratch path), the rlimits, the seccomp variant and
 * the network mode (inputs.c, sbx_policy_key). A SBX_NET_LOOPBACK one is made in a network
 * namespace of its own, whose listener it keeps (close-on-exec) until it is taken, then
 * hands to on_listener; dropped or shut down, it closes it. Used once, like every sandbox:
 * no namespace serves two runs.
 *
 * Pre-started commands (ADR 0022): a warm sandbox whose stub was already sent its launch
 * message, so that the command itself (a provider CLI, whose own start-up is most of its
 * first token's wait) runs and waits on its stdin. Keyed by the warm key plus argv: only a
 * run of exactly the same command under exactly the same policy (environment, credentials'
 * identity, network mode and port included) takes it. Taken, it is the run's alone: its
 * listener goes to on_listener then, the run's stdin is written, the clock starts; never
 * reused. What it wrote while it waited stays in its pipes until then. Bounded per process
 * (POOL_MAX), per host (prestart.c), per owner tag on the host, and in time (an expiry
 * thread puts down what waited prestart_idle_ms, with or without traffic). An idle one
 * holds a uid slot, a scratch dir and its namespaces like a warm sandbox, but no provider
 * concurrency slot: that is the caller's, taken per run.
 *
 * Owner tags (ADR 0022). Every entry is filed under the tag of the run that made it (the
 * caller's key id: opaque here) and is given only to a run of the same tag. A tag has a
 * share of each pool: at most WARM_PER_TAG of this process's warm sandboxes, and at most
 * its share of the host's pre-start slots (flock'd tag slots, prestart.c). A tag that needs
 * room puts down its own least recently made entry, never another tag's, so a guest that
 * churns variants (a new max_tokens each request) only ever evicts its own, and cannot
 * hold more than its share.
 *
 * Both are one pool type (struct pool): entries filed by key and tag in age order, a lock,
 * the starts under way (reserved under the lock), a liveness check, and closing at exit.
 * What differs is in the few lines of each kind: a warm sandbox is filed as started; a
 * pre-started command after its launch message, holding host-wide slots, and expiring. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "sandbox/instance.h"
#include "common/banned.h"

/* ---- the pool type ---------------------------------------------------------------------- */

#define POOL_MAX 16	    /* entries of one kind in this process */
#define POOL_PENDING_MAX 64 /* starts under way at once, all keys (more: no new start) */

struct pool_entry {
	char *key, *tag;
	struct instance in;
	struct sbx_lease lease; /* the host-wide slots it holds while idle (pre-started) */
	uint64_t since;		/* mono_ms() it was filed */
};

struct pool {
	pthread_mutex_t lock;
	struct pool_entry slot[POOL_MAX];
	size_t n;
	bool closed; /* shutting down: no new entry */
	int filling; /* entries being started right now */
	/* Those being started (the strings are the starting threads' own, there for as long
	 * as the start). */
	struct {
		const char *key, *tag;
	} pending[POOL_PENDING_MAX];
	bool count_pending; /* a start under way counts as an entry of its key and tag */
	/* Still fit to be taken. */
	bool (*alive)(const struct instance *in);
	/* One was found dead when taken: counted under the lock, in the section that took it
	 * out, so that no reader of the counts sees it gone and not yet counted (NULL:
	 * nothing to count); then said without the lock (NULL: nothing to say). */
	void (*on_dead_locked)(void);
	void (*on_dead)(const char *rid);
	/* An entry was filed (under the lock; NULL: nothing to do). */
	void (*on_add_locked)(void);
};

/* Remove entry i (locked) into *in and *lease; the rest stay in age order. */
static void pool_remove_locked(struct pool *pl, size_t i, struct instance *in,
			       struct sbx_lease *lease)
{
	*in = pl->slot[i].in;
	*lease = pl->slot[i].lease;
	free(pl->slot[i].key);
	free(pl->slot[i].tag);
	memmove(&pl->slot[i], &pl->slot[i + 1], (pl->n - i - 1) * sizeof(pl->slot[0]));
	pl->n--;
}

/* An entry is over: its sandbox, then the host-wide slots it held. */
static void pool_put_down(struct instance *in, struct sbx_lease *lease, const char *rid)
{
	sbx_instance_release(in, rid);
	sbx_lease_put(lease);
}

/* Take the oldest live entry of key for tag, with the slots it holds (*lease, which must
 * be empty); one found dead is put down and *out starts over as INSTANCE_INIT. */
static bool pool_take(struct pool *pl, const char *key, const char *tag, struct instance *out,
		      struct sbx_lease *lease, const char *rid)
{
	for (;;) {
		bool found = false, alive = false;

		pthread_mutex_lock(&pl->lock);
		for (size_t i = 0; i < pl->n && !found; i++) {
			found = !strcmp(pl->slot[i].key, key) && !strcmp(pl->slot[i].tag, tag);
			if (found)
				pool_remove_locked(pl, i, out, lease);
		}
		/* alive() is a poll(2) with no wait: cheap enough under the lock, as the
		 * expiry thread's check is. */
		if (found)
			alive = pl->alive(out);
		if (found && !alive && pl->on_dead_locked)
			pl->on_dead_locked();
		pthread_mutex_unlock(&pl->lock);
		if (!found)
			return false;
		if (alive)
			return true;
		if (pl->on_dead)
			pl->on_dead(rid);
		pool_put_down(out, lease, rid);
		*out = (struct instance)INSTANCE_INIT;
	}
}

/* Count, under the lock, the entries of tag (of key too, unless key is NULL), and the
 * starts under way where they count. */
static size_t pool_have_locked(const struct pool *pl, const char *key, const char *tag)
{
	size_t have = 0;

	for (size_t i = 0; i < pl->n; i++)
		have += !strcmp(pl->slot[i].tag, tag) && (!key || !strcmp(pl->slot[i].key, key));
	for (int i = 0; pl->count_pending && i < pl->filling; i++)
		have += !strcmp(pl->pending[i].tag, tag) &&
			(!key || !strcmp(pl->pending[i].key, key));
	return have;
}

static size_t pool_have(struct pool *pl, const char *key, const char *tag)
{
	size_t have;

	pthread_mutex_lock(&pl->lock);
	have = pool_have_locked(pl, key, tag);
	pthread_mutex_unlock(&pl->lock);
	return have;
}

/* Reserve a start of key for tag (locked): false when closed or too many are under way. */
static bool pool_reserve_locked(struct pool *pl, const char *key, const char *tag)
{
	if (pl->closed || pl->filling >= POOL_PENDING_MAX)
		return false;
	pl->pending[pl->filling].key = key;
	pl->pending[pl->filling++].tag = tag;
	return true;
}

/* The start reserved with key is over, filed or not. */
static void pool_unreserve(struct pool *pl, const char *key)
{
	pthread_mutex_lock(&pl->lock);
	for (int i = 0; i < pl->filling; i++) {
		if (pl->pending[i].key == key) {
			pl->pending[i] = pl->pending[--pl->filling];
			break;
		}
	}
	pthread_mutex_unlock(&pl->lock);
}

/* Take tag's oldest entry (locked) whose key is not except (NULL: any key), to make room
 * for a more recent one of the same tag. Never another tag's: that is what keeps one
 * tag's churn its own. false when it has none. */
static bool pool_evict_locked(struct pool *pl, const char *tag, const char *except,
			      struct instance *in, struct sbx_lease *lease)
{
	for (size_t i = 0; i < pl->n; i++) {
		if (!strcmp(pl->slot[i].tag, tag) && (!except || strcmp(pl->slot[i].key, except))) {
			pool_remove_locked(pl, i, in, lease);
			return true;
		}
	}
	return false;
}

/* File a started entry, unless the pool is closed or full (false: the caller puts it
 * down). Takes in and lease when it returns true. */
static bool pool_add(struct pool *pl, const char *key, const char *tag, const struct instance *in,
		     const struct sbx_lease *lease)
{
	bool keep = false;

	pthread_mutex_lock(&pl->lock);
	if (!pl->closed && pl->n < POOL_MAX) {
		pl->slot[pl->n++] = (struct pool_entry){ .key = xstrdup(key),
							 .tag = xstrdup(tag),
							 .in = *in,
							 .lease = *lease,
							 .since = mono_ms() };
		keep = true;
		if (pl->on_add_locked)
			pl->on_add_locked();
	}
	pthread_mutex_unlock(&pl->lock);
	return keep;
}

/* No new entry from now on (the process is about to exit). */
static void pool_close(struct pool *pl)
{
	pthread_mutex_lock(&pl->lock);
	pl->closed = true;
	pthread_mutex_unlock(&pl->lock);
}

static int pool_filling(struct pool *pl)
{
	int n;

	pthread_mutex_lock(&pl->lock);
	n = pl->filling;
	pthread_mutex_unlock(&pl->lock);
	return n;
}

/* Put down every entry, newest first; how many there were. */
static uint64_t pool_release_all(struct pool *pl)
{
	uint64_t n = 0;

	pthread_mutex_lock(&pl->lock);
	while (pl->n) {
		struct instance in;
		struct sbx_lease lease;

		pool_remove_locked(pl, pl->n - 1, &in, &lease);
		pthread_mutex_unlock(&pl->lock);
		pool_put_down(&in, &lease, NULL);
		n++;
		pthread_mutex_lock(&pl->lock);
	}
	pthread_mutex_unlock(&pl->lock);
	return n;
}

/* ---- warm sandboxes --------------------------------------------------------------------- */

#define WARM_PER_TAG (POOL_MAX / 2) /* one tag's share: its churn leaves half to the others */
_Static_assert(SBX_WARM_PER_POLICY_MAX <= WARM_PER_TAG,
	       "a policy's warm sandboxes fit a tag's share");

/* Threads finishing runs of one policy at once start sbx_g.warm_per_key between them, not each
 * their own, and a tag's share counts the starts under way. */
static struct pool warm = { .lock = PTHREAD_MUTEX_INITIALIZER,
			    .count_pending = true,
			    .alive = sbx_instance_alive };

bool sbx_warm_take(const char *key, const char *tag, struct instance *out, const char *rid)
{
	struct sbx_lease none = SBX_LEASE_INIT;

	return pool_take(&warm, key, tag, out, &none, rid);
}

/* Make room for one more of tag's sandboxes of key (locked): when the tag is at its share
 * or the pool is full, its own oldest of another policy goes into *old (a policy no run of
 * it has used since, e.g. one whose login file changed); never another tag's. false when
 * there is no room. */
static bool warm_room_locked(const char *key, const char *tag, struct instance *old, bool *evict)
{
	struct sbx_lease none;

	if (warm.n < POOL_MAX && pool_have_locked(&warm, NULL, tag) < WARM_PER_TAG)
		return true;
	*evict = pool_evict_locked(&warm, tag, key, old, &none);
	return *evict;
}

/* Start one warm instance of key for tag, unless sbx_g.warm_per_key wait or are being started
 * already, or the tag has no room (false then). Off the client's critical path: called
 * after the run that needed it has answered. The check and the reservation are one step
 * under the lock. */
static bool warm_fill_one(const struct sbx_policy *p, const char *key, const char *tag)
{
	struct instance in = INSTANCE_INIT, old = INSTANCE_INIT;
	struct sbx_lease none = SBX_LEASE_INIT;
	struct sbx_result res = { 0 };
	bool keep = false, evict = false, go;

	pthread_mutex_lock(&warm.lock);
	go = !warm.closed && warm.filling < POOL_PENDING_MAX &&
	     pool_have_locked(&warm, key, tag) < sbx_g.warm_per_key &&
	     warm_room_locked(key, tag, &old, &evict) && pool_reserve_locked(&warm, key, tag);
	pthread_mutex_unlock(&warm.lock);
	if (!go)
		return false;
	if (evict)
		sbx_instance_release(&old, NULL);
	if (sbx_instance_start(p, NULL, NULL, NULL, true, &in, &res) == 0)
		keep = pool_add(&warm, key, tag, &in, &none);
	if (!keep)
		sbx_instance_release(&in, NULL);
	pool_unreserve(&warm, key);
	return true;
}

/* bwrap is only started here, not waited for: it builds the sandbox while the thread goes
 * on. */
void sbx_warm_fill(const struct sbx_policy *p, const char *key, const char *tag)
{
	for (unsigned i = 0; i < sbx_g.warm_per_key && warm_fill_one(p, key, tag); i++)
		;
}

size_t sbx_warm_count(void)
{
	size_t n;

	pthread_mutex_lock(&warm.lock);
	n = warm.n;
	pthread_mutex_unlock(&warm.lock);
	return n;
}

void sbx_warm_release_all(void)
{
	(void)pool_release_all(&warm);
}

static void add_u32(struct buf *b, uint32_t v)
{
	unsigned char le[4] = { v & 0xff, (v >> 8) & 0xff, (v >> 16) & 0xff, v >> 24 };

	buf_add(b, le, 4);
}

void sbx_launch_message(const char *const argv[], const struct sbx_run_options *opt,
			struct buf *out)
{
	uint32_t argc = 0;

	while (argv[argc])
		argc++;
	buf_add(out, SBX_LAUNCH_MAGIC, 4);
	add_u32(out, argc);
	for (uint32_t i = 0; i < argc; i++) {
		add_u32(out, (uint32_t)strlen(argv[i]));
		buf_adds(out, argv[i]);
	}
	if (opt && opt->stdin_data)
		buf_add(out, opt->stdin_data, opt->stdin_len);
}

/* ---- pre-started commands --------------------------------------------------------------- */

#define LAUNCH_WRITE_MS 2000 /* the launch message is small: a pipe takes it at once */

static bool prestart_alive(const struct instance *in);
static void prestart_died_locked(void);
static void prestart_died(const char *rid);

static void prestart_reaper_start_locked(void);

/* Starts under way do not count as entries: a run's refill starts what it wants. */
static struct pool pre = { .lock = PTHREAD_MUTEX_INITIALIZER,
			   .alive = prestart_alive,
			   .on_dead_locked = prestart_died_locked,
			   .on_dead = prestart_died,
			   .on_add_locked = prestart_reaper_start_locked };

/* The expiry thread and the counts, under pre.lock. */
static struct {
	pthread_cond_t cond;
	bool reaping; /* the expiry thread runs */
	bool stop;    /* ... and is asked to end */
	pthread_t reaper;
	uint64_t hit, miss, expired, died;
} pre_x = { .cond = PTHREAD_COND_INITIALIZER };

void sbx_lease_put(struct sbx_lease *l)
{
	slot_release(l->host_fd);
	slot_release(l->tag_fd);
	*l = (struct sbx_lease)SBX_LEASE_INIT;
}

const char *sbx_prestart_event_name(enum sbx_prestart_event ev)
{
	switch (ev) {
	case SBX_PRESTART_READY: return "ready";
	case SBX_PRESTART_HIT: return "hit";
	case SBX_PRESTART_MISS: return "miss";
	case SBX_PRESTART_EXPIRED: return "expired";
	case SBX_PRESTART_DIED: return "died";
	case SBX_PRESTART_RELEASED: return "released";
	}
	return "unknown";
}

/* Count n events (pre.lock held). An entry taken out of the pool is counted in the same
 * locked section, so that no reader of the stats sees it gone and not yet counted (a test
 * that waited for the pool to empty read "nothing expired" in that gap under load). */
static void prestart_add_locked(enum sbx_prestart_event ev, uint64_t n)
{
	switch (ev) {
	case SBX_PRESTART_HIT: pre_x.hit += n; break;
	case SBX_PRESTART_MISS: pre_x.miss += n; break;
	case SBX_PRESTART_EXPIRED: pre_x.expired += n; break;
	case SBX_PRESTART_DIED: pre_x.died += n; break;
	default: break;
	}
}

/* The caller's hook, told without pre.lock. */
static void prestart_tell(enum sbx_prestart_event ev, uint64_t n)
{
	for (uint64_t i = 0; sbx_g.on_prestart && i < n; i++)
		sbx_g.on_prestart(ev);
}

/* Counted under pre.lock; the caller's hook is told after it. */
void sbx_prestart_count(enum sbx_prestart_event ev, uint64_t n)
{
	if (!n)
		return;
	pthread_mutex_lock(&pre.lock);
	prestart_add_locked(ev, n);
	pthread_mutex_unlock(&pre.lock);
	prestart_tell(ev, n);
}

char *sbx_prestart_key(const char *policy, const char *const argv[])
{
	struct buf key = BUF_INIT;

	buf_adds(&key, policy);
	buf_addch(&key, '\x1d');
	for (size_t i = 0; argv[i]; i++) {
		buf_adds(&key, argv[i]);
		buf_addch(&key, '\x1f');
	}
	return buf_detach(&key, NULL);
}

/* Alive and still waiting: its sandbox is up and its stdout not closed (a command that
 * exited while it waited, e.g. for want of credentials). */
static bool prestart_alive(const struct instance *in)
{
	struct pollfd pfd = { .fd = in->r.out_fd, .events = POLLIN };

	if (!sbx_instance_alive(in))
		return false;
	return !(poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLHUP | POLLERR)));
}

static void prestart_died_locked(void)
{
	prestart_add_locked(SBX_PRESTART_DIED, 1);
}

static void prestart_died(const char *rid)
{
	log_warnx(rid, "sandbox: a pre-started command had died while it waited");
	prestart_tell(SBX_PRESTART_DIED, 1);
}

bool sbx_prestart_take(const char *key, const char *tag, struct instance *out,
		       struct sbx_lease *lease, const char *rid)
{
	return pool_take(&pre, key, tag, out, lease, rid);
}

/* Wait on pre_x.cond (pre.lock held) for ms at most. */
static void prestart_tick_wait(uint64_t ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	ts.tv_sec += (time_t)(ms / 1000) + ts.tv_nsec / 1000000000L;
	ts.tv_nsec %= 1000000000L;
	(void)pthread_cond_timedwait(&pre_x.cond, &pre.lock, &ts);
}

/* The expiry thread: every so often, put down what waited too long or died. It runs while
 * any process is idle or not: an idle worker's pre-started claudes must not live on. */
static void *prestart_reaper(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&pre.lock);
	while (!pre_x.stop) {
		struct {
			struct instance in;
			struct sbx_lease lease;
		} gone[POOL_MAX];
		size_t ngone = 0, nexpired = 0;
		uint64_t now;

		prestart_tick_wait(sbx_g.prestart_idle_ms < 2000 ? 100 : 1000);
		if (pre_x.stop)
			break;
		now = mono_ms();
		for (size_t i = 0; i < pre.n;) {
			bool expired = now - pre.slot[i].since >= sbx_g.prestart_idle_ms;

			if (!expired && prestart_alive(&pre.slot[i].in)) {
				i++;
				continue;
			}
			nexpired += expired;
			pool_remove_locked(&pre, i, &gone[ngone].in, &gone[ngone].lease);
			ngone++;
		}
		prestart_add_locked(SBX_PRESTART_EXPIRED, nexpired);
		prestart_add_locked(SBX_PRESTART_DIED, ngone - nexpired);
		pthread_mutex_unlock(&pre.lock);
		prestart_tell(SBX_PRESTART_EXPIRED, nexpired);
		prestart_tell(SBX_PRESTART_DIED, ngone - nexpired);
		for (size_t i = 0; i < ngone; i++)
			pool_put_down(&gone[i].in, &gone[i].lease, NULL);
		pthread_mutex_lock(&pre.lock);
	}
	pthread_mutex_unlock(&pre.lock);
	return NULL;
}

/* Start the expiry thread if it is not running (pre.lock held: one was just filed). Every
 * signal blocked in it: the worker's own handling stays on its main thread. */
static void prestart_reaper_start_locked(void)
{
	sigset_t all, old;

	if (pre_x.reaping)
		return;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pre_x.stop = false;
	pre_x.reaping = pthread_create(&pre_x.reaper, NULL, prestart_reaper, NULL) == 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!pre_x.reaping)
		log_warnx(NULL, "sandbox: no expiry thread for pre-started commands");
}

/* Put down this process's oldest idle one of tag, to make room for a more recent key of
 * the same tag (never another tag's). */
static bool prestart_evict_oldest(const char *tag)
{
	struct instance in;
	struct sbx_lease lease;
	bool found;

	pthread_mutex_lock(&pre.lock);
	found = pool_evict_locked(&pre, tag, NULL, &in, &lease);
	if (found)
		prestart_add_locked(SBX_PRESTART_EXPIRED, 1);
	pthread_mutex_unlock(&pre.lock);
	if (!found)
		return false;
	prestart_tell(SBX_PRESTART_EXPIRED, 1);
	pool_put_down(&in, &lease, NULL);
	return true;
}

/* Write the launch message whole (the pipe is non-blocking), bounded in time. */
static int write_launch(int fd, const struct buf *msg)
{
	uint64_t until = mono_ms() + LAUNCH_WRITE_MS;
	size_t off = 0;

	while (off < msg->len) {
		struct pollfd pfd = { .fd = fd, .events = POLLOUT };
		ssize_t w = write(fd, msg->data + off, msg->len - off);

		if (w > 0) {
			off += (size_t)w;
			continue;
		}
		if (w < 0 && errno != EAGAIN && errno != EINTR)
			return -errno;
		if (mono_ms() >= until)
			return -ETIMEDOUT;
		(void)poll(&pfd, 1, 10);
	}
	return 0;
}

/* One host-wide slot into *fd: one of tag's cap of them (cap 0: one of the host's). The
 * one already held (a lease), else a new one; when every slot is held, tag's least
 * recently made one of this process's makes room. Other tags' are never put down (theirs
 * expire on their own), nor other processes'. 0 or -errno. */
static int pre_slot(int *fd, const char *tag, unsigned cap)
{
	int ret = 0;

	if (*fd >= 0)
		return 0;
	for (int tries = 0; tries < 2; tries++) {
		ret = cap ? sbx_prestart_tag_take(tag, cap) : sbx_prestart_slot_take();
		if (ret >= 0) {
			*fd = ret;
			return 0;
		}
		if (ret != -EBUSY || !prestart_evict_oldest(tag))
			break;
	}
	return ret;
}

/* The slots a new one of tag holds, the tag's first (the cheaper refusal). */
static int pre_slots(struct sbx_lease *held, const char *tag, unsigned share,
		     struct sbx_lease *lease)
{
	unsigned cap = sbx_g.prestart_per_owner;
	int ret;

	if (share && share < cap)
		cap = share;
	held->tag_fd = lease->tag_fd;
	held->host_fd = lease->host_fd;
	*lease = (struct sbx_lease)SBX_LEASE_INIT;
	ret = pre_slot(&held->tag_fd, tag, cap);
	if (!ret)
		ret = pre_slot(&held->host_fd, tag, 0);
	return ret;
}

static void prestart_fill_one(const struct sbx_policy *p, const char *const argv[], const char *key,
			      const char *tag, unsigned share, struct sbx_lease *lease)
{
	struct instance in = INSTANCE_INIT;
	struct sbx_lease held = SBX_LEASE_INIT;
	struct sbx_result res = { 0 };
	struct buf msg = BUF_INIT;
	bool keep = false, started = false, full, go;

	pthread_mutex_lock(&pre.lock);
	go = pool_reserve_locked(&pre, key, tag);
	full = pre.n >= POOL_MAX;
	pthread_mutex_unlock(&pre.lock);
	if (!go)
		return;
	/* This process holds its most: only the tag's own oldest makes room. */
	if (full && !prestart_evict_oldest(tag))
		goto out_release;
	if (pre_slots(&held, tag, share, lease))
		goto out_release;
	started = true;
	if (sbx_instance_start(p, NULL, NULL, NULL, true, &in, &res))
		goto out_release;
	sbx_launch_message(argv, NULL, &msg);
	if (write_launch(in.r.in_fd, &msg))
		goto out_release;
	keep = pool_add(&pre, key, tag, &in, &held);
	if (keep)
		sbx_prestart_count(SBX_PRESTART_READY, 1);
out_release:
	if (!keep && started)
		sbx_instance_release(&in, NULL);
	if (!keep)
		sbx_lease_put(&held);
	buf_release(&msg);
	pool_unreserve(&pre, key);
}

/* Started, not waited for. */
void sbx_prestart_fill(const struct sbx_policy *p, const char *const argv[], const char *key,
		       const char *tag, unsigned want, unsigned share, struct sbx_lease *lease)
{
	for (unsigned i = 0; i < want && pool_have(&pre, key, tag) < want; i++)
		prestart_fill_one(p, argv, key, tag, share, lease);
}

void sbx_prestart_release_all(void)
{
	pthread_mutex_lock(&pre.lock);
	if (pre_x.reaping) {
		pre_x.stop = true;
		pthread_cond_broadcast(&pre_x.cond);
		pthread_mutex_unlock(&pre.lock);
		pthread_join(pre_x.reaper, NULL);
		pthread_mutex_lock(&pre.lock);
		pre_x.reaping = false;
		pre_x.stop = false;
	}
	pthread_mutex_unlock(&pre.lock);
	sbx_prestart_count(SBX_PRESTART_RELEASED, pool_release_all(&pre));
}

void sbx_prestart_stats(struct sbx_prestart_stats *out)
{
	pthread_mutex_lock(&pre.lock);
	*out = (struct sbx_prestart_stats){ .hit = pre_x.hit,
					    .miss = pre_x.miss,
					    .expired = pre_x.expired,
					    .died = pre_x.died,
					    .idle = pre.n };
	pthread_mutex_unlock(&pre.lock);
}

/* ---- both ------------------------------------------------------------------------------- */

void sbx_warm_shutdown(void)
{
	int filling = 1;

	pool_close(&warm);
	pool_close(&pre);
	/* One being started now is put down by its own thread (closed): wait for that, a
	 * second at most, so that none is cut off halfway by our exit. */
	for (int i = 0; i < 100 && filling; i++) {
		filling = pool_filling(&warm) + pool_filling(&pre);
		if (filling)
			usleep(10000);
	}
	sbx_prestart_release_all();
	sbx_warm_release_all();
}
