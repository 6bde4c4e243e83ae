/* Concurrency caps that hold across every worker process of the pool.
 *
 * A provider with max_concurrent N has N slot files <slot_dir>/<provider>.<i>.slot; a run
 * holds one for its whole life (common.h slot_take: flock'ed, so a crashed worker never
 * leaks one). */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <stdlib.h>

#include "providers/internal.h"
#include "common/banned.h"

static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;
static char *slot_dir;

int prov_state_subdir(const char *state_dir, const char *name, char **dir, pthread_mutex_t *lock)
{
	char path[PATH_MAX];

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", state_dir, name) >= sizeof(path))
		return -ENAMETOOLONG;
	if (mkdir(path, 0700) < 0 && errno != EEXIST)
		return -errno;
	pthread_mutex_lock(lock);
	free(*dir);
	*dir = xstrdup(path);
	pthread_mutex_unlock(lock);
	return 0;
}

int prov_set_state_dir(const char *dir)
{
	int ret = prov_state_subdir(dir, "slots", &slot_dir, &slot_lock);

	if (ret)
		return ret;
	/* The tool lists of runs live in the same state dir (toolfile.c); without it a
	 * request with tools fails at its plan, saying why. */
	/* The accounts' subscription limits (limits.c): without them nothing is kept or
	 * shown, and no request is refused for a limit. */
	if ((ret = prov_limits_set_dir(dir)))
		log_warnx(NULL, "subscription limits in %s/limits: %s; they will not be kept", dir,
			  strerror(-ret));
	/* The unbound callers' account choices (sticky.c): without them each request
	 * chooses again, the same way. */
	if ((ret = prov_sticky_set_dir(dir)))
		log_warnx(NULL, "account choices in %s/accounts: %s; they will not be kept", dir,
			  strerror(-ret));
	/* Held logins (login.c): without the dir, their runs fail, saying why. */
	if (prov_login_set_dir(dir))
		log_warnx(NULL, "held logins in %s/held: %s; their runs will fail", dir,
			  strerror(errno));
	if (prov_toolfile_set_dir(dir))
		log_warnx(NULL, "tool lists in %s/tools: %s; requests with tools will fail", dir,
			  strerror(errno));
	return 0;
}

int prov_slot_acquire(const struct prov_provider *pv)
{
	if (!slot_dir || !pv->max_concurrent)
		return PROV_SLOT_NONE;
	/* Provider names are checked at registry load to be plain file name parts. */
	return slot_take(slot_dir, pv->name, pv->max_concurrent);
}

void prov_slot_release(int fd)
{
	slot_release(fd);
}
