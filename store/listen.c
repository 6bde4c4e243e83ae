/* store: one LISTEN connection per process and the thread that reads it (store.h).
 *
 * A cache of what the database holds (the key checks of auth/pg.c) must know how fresh it
 * is. The thread makes a round trip on its connection at least every STORE_FRESH_EVERY_MS;
 * the server sends a notification of a committed change before the reply to a query that
 * started after the commit had signalled it, so once the reply is in and every
 * notification read, the cache has seen every change committed before the query was sent
 * (less STORE_FRESH_MARGIN_MS, for the signal between the committing backend and ours).
 * store_listen_fresh_ms publishes that time; a connection lost and made again bumps the
 * epoch and calls every on_resync first, since notifications sent meanwhile are gone. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "store/internal.h"
#include "common/banned.h"

#define STORE_FRESH_EVERY_MS 500u
#define STORE_FRESH_MARGIN_MS 250
#define STORE_LISTEN_RETRY_MS 1000u

static bool channel_valid(const char *s)
{
	size_t i, n = strlen(s);

	if (!n || n >= STORE_CHANNEL_MAX || !((s[0] >= 'a' && s[0] <= 'z') || s[0] == '_'))
		return false;
	for (i = 1; i < n; i++) {
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
			return false;
	}
	return true;
}

/* Connect and LISTEN on every channel: the connection, or NULL (noted as a failure). */
static PGconn *listen_connect(struct store_db *db)
{
	struct store_channel ch[STORE_MAX_CHANNELS];
	unsigned i, n;
	PGconn *c = store_connect(db);
	struct buf sql = BUF_INIT;
	PGresult *r;

	if (!c)
		return NULL;
	pthread_mutex_lock(&db->listen_lock);
	n = db->n_channels;
	memcpy(ch, db->channels, sizeof(ch));
	pthread_mutex_unlock(&db->listen_lock);
	for (i = 0; i < n; i++) {
		/* The name was checked to be a plain identifier: no quoting can go wrong. */
		buf_reset(&sql);
		buf_addf(&sql, "LISTEN %s", ch[i].name);
		r = PQexec(c, sql.data);
		if (PQresultStatus(r) != PGRES_COMMAND_OK) {
			store_note_failure(db, PQerrorMessage(c));
			PQclear(r);
			PQfinish(c);
			buf_release(&sql);
			return NULL;
		}
		PQclear(r);
	}
	buf_release(&sql);
	/* Under the lock, from the live table: store_unlisten may have dropped a channel. */
	pthread_mutex_lock(&db->listen_lock);
	for (i = 0; i < db->n_channels; i++)
		if (db->channels[i].on_resync)
			db->channels[i].on_resync(db->channels[i].arg);
	atomic_fetch_add(&db->epoch, 1);
	pthread_mutex_unlock(&db->listen_lock);
	return c;
}

static void dispatch(struct store_db *db, PGconn *c)
{
	PGnotify *nt;
	unsigned i;

	while ((nt = PQnotifies(c))) {
		pthread_mutex_lock(&db->listen_lock);
		for (i = 0; i < db->n_channels; i++) {
			if (!strcmp(db->channels[i].name, nt->relname))
				db->channels[i].on_notify(db->channels[i].arg,
							  nt->extra ? nt->extra : "");
		}
		pthread_mutex_unlock(&db->listen_lock);
		PQfreemem(nt);
	}
}

/* One round trip; on success every notification before it is dispatched and the fresh
 * time published. false: the connection failed. */
static bool round_trip(struct store_db *db, PGconn *c)
{
	int64_t sent = (int64_t)mono_ms();
	PGresult *r = PQexec(c, "SELECT 1");
	bool ok = PQresultStatus(r) == PGRES_TUPLES_OK;

	PQclear(r);
	if (!ok) {
		store_note_failure(db, PQerrorMessage(c));
		return false;
	}
	dispatch(db, c);
	atomic_store(&db->fresh_ms,
		     sent > STORE_FRESH_MARGIN_MS ? sent - STORE_FRESH_MARGIN_MS : 1);
	return true;
}

/* Serve one connection until it fails or the store is freed: false when freed. */
static bool serve(struct store_db *db, PGconn *c)
{
	uint64_t next = 0;
	struct pollfd p[2];
	char b;

	for (;;) {
		if (mono_ms() >= next) {
			if (!round_trip(db, c))
				return true;
			next = mono_ms() + STORE_FRESH_EVERY_MS;
		}
		p[0] = (struct pollfd){ .fd = PQsocket(c), .events = POLLIN };
		p[1] = (struct pollfd){ .fd = db->wake[0], .events = POLLIN };
		if (poll(p, 2, (int)STORE_FRESH_EVERY_MS) < 0 && errno != EINTR)
			return true;
		if (p[1].revents)
			return read(db->wake[0], &b, 1) < 0 && errno == EINTR;
		if (p[0].revents) {
			if (!PQconsumeInput(c)) {
				store_note_failure(db, PQerrorMessage(c));
				return true;
			}
			dispatch(db, c);
		}
	}
}

static void *listener(void *arg)
{
	struct store_db *db = arg;
	struct pollfd p;
	PGconn *c;
	bool go_on = true;

	while (go_on) {
		c = listen_connect(db);
		if (c) {
			go_on = serve(db, c);
			atomic_store(&db->fresh_ms, 0);
			PQfinish(c);
			if (!go_on)
				break;
		}
		/* Away: try again in a second, or stop when the store is freed. */
		p = (struct pollfd){ .fd = db->wake[0], .events = POLLIN };
		if (poll(&p, 1, (int)STORE_LISTEN_RETRY_MS) > 0)
			go_on = false;
	}
	return NULL;
}

int store_listen(struct store_db *db, const char *channel, store_notify_fn on_notify,
		 store_resync_fn on_resync, void *arg)
{
	struct store_channel *ch;
	int ret = 0;

	if (!db || !channel || !on_notify || !channel_valid(channel))
		return -EINVAL;
	pthread_mutex_lock(&db->listen_lock);
	if (db->listening) {
		/* Channels are fixed once the thread runs: its connection LISTENs to them. */
		ret = -EBUSY;
		goto out;
	}
	if (db->n_channels == STORE_MAX_CHANNELS) {
		ret = -EINVAL;
		goto out;
	}
	ch = &db->channels[db->n_channels++];
	(void)snprintf(ch->name, sizeof(ch->name), "%s", channel);
	ch->on_notify = on_notify;
	ch->on_resync = on_resync;
	ch->arg = arg;
out:
	pthread_mutex_unlock(&db->listen_lock);
	return ret;
}

void store_unlisten(struct store_db *db, void *arg)
{
	unsigned i, j = 0;

	if (!db)
		return;
	pthread_mutex_lock(&db->listen_lock);
	for (i = 0; i < db->n_channels; i++)
		if (db->channels[i].arg != arg)
			db->channels[j++] = db->channels[i];
	db->n_channels = j;
	pthread_mutex_unlock(&db->listen_lock);
}

int store_listen_start(struct store_db *db)
{
	int ret = 0;

	pthread_mutex_lock(&db->listen_lock);
	if (db->listening)
		goto out;
	if (pipe2(db->wake, O_CLOEXEC) < 0) {
		ret = -errno;
		goto out;
	}
	ret = -pthread_create(&db->listener, NULL, listener, db);
	if (ret) {
		close(db->wake[0]);
		close(db->wake[1]);
		db->wake[0] = db->wake[1] = -1;
		goto out;
	}
	db->listening = true;
out:
	pthread_mutex_unlock(&db->listen_lock);
	return ret;
}

void store_listen_stop(struct store_db *db)
{
	char b = 1;

	if (!db->listening)
		return;
	while (write(db->wake[1], &b, 1) < 0 && errno == EINTR)
		;
	pthread_join(db->listener, NULL);
	close(db->wake[0]);
	close(db->wake[1]);
	db->listening = false;
}

int64_t store_listen_fresh_ms(struct store_db *db, uint64_t *epoch)
{
	if (epoch)
		*epoch = atomic_load(&db->epoch);
	return atomic_load(&db->fresh_ms);
}
