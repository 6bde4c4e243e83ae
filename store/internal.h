/* store: what store.c (the pool, statements, health), listen.c (the LISTEN thread) and
 * schema.c share. Every name is store_*. */
#ifndef OLP_STORE_INTERNAL_H
#define OLP_STORE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "store/store.h"

#define STORE_MAX_CHANNELS 8
#define STORE_CHANNEL_MAX 64

struct store_channel {
	char name[STORE_CHANNEL_MAX];
	store_notify_fn on_notify;
	store_resync_fn on_resync;
	void *arg;
};

struct store_db {
	char *url;
	char *passfile;
	char *appname;
	unsigned max_conns;
	unsigned connect_timeout_s;
	char where[128];

	pthread_mutex_t lock; /* the pool and the health strings */
	pthread_cond_t freed; /* a connection came back, or a slot opened */
	PGconn **idle;	      /* max_conns entries, n_idle of them in use */
	unsigned n_idle;
	unsigned n_open; /* idle, lent out, or being opened */
	/* mono ms of the last connection attempt that failed: the pool waits a second
	 * before the next, and answers at once meanwhile. */
	uint64_t last_connect_fail_ms;

	atomic_bool ok;
	int64_t failing_since_ms; /* under lock */
	char last_error[160];	  /* under lock */

	/* The LISTEN thread (listen.c). */
	pthread_mutex_t listen_lock; /* channels[], n_channels, listening */
	struct store_channel channels[STORE_MAX_CHANNELS];
	unsigned n_channels;
	bool listening; /* the thread was started */
	pthread_t listener;
	int wake[2]; /* store_free writes a byte to stop the thread */
	atomic_int_fast64_t fresh_ms;
	atomic_uint_fast64_t epoch;
};

/* A new connection to db->url with the store's options, or NULL (the failure noted). */
PGconn *store_connect(struct store_db *db);
/* Stop the listener thread, if any, and close its connection (store_free). */
void store_listen_stop(struct store_db *db);

#endif
