/* Concurrency caps that hold across every worker process of the pool.
 *
 * A provider with max_concurrent N has N slot files <slot_dir>/<provider>.<i>.slot; a run
 * holds one with flock(LOCK_EX | LOCK_NB) for its whole life. The kernel releases a lock
 * when its holder dies, so a crashed worker never leaks a slot, and no process has to
 * count anything. Trying the slots in turn costs a few syscalls per request. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <unistd.h>

#include "providers/internal.h"
#include "common/banned.h"

static char *slot_dir;

int prov_set_state_dir(const char *dir)
{
	char path[PATH_MAX];

	if ((size_t)snprintf(path, sizeof(path), "%s/slots", dir) >= sizeof(path))
		return -ENAMETOOLONG;
	if (mkdir(path, 0700) < 0 && errno != EEXIST)
		return -errno;
	free(slot_dir);
	slot_dir = xstrdup(path);
	/* The tool lists of runs live in the same state dir (toolfile.c); without it a
	 * request with tools fails at its plan, saying why. */
	if (prov_toolfile_set_dir(dir))
		log_warnx(NULL, "tool lists in %s/tools: %s; requests with tools will fail", dir,
			  strerror(errno));
	return 0;
}

int prov_slot_acquire(const struct prov_provider *pv)
{
	unsigned i, start;
	int fd;

	if (!slot_dir || !pv->max_concurrent)
		return PROV_SLOT_NONE;
	/* Start at a different slot in each process so that they do not all contend for
	 * slot 0 first. */
	start = (unsigned)getpid() % pv->max_concurrent;
	for (i = 0; i < pv->max_concurrent; i++) {
		char path[PATH_MAX];
		unsigned n = (start + i) % pv->max_concurrent;

		if ((size_t)snprintf(path, sizeof(path), "%s/%s.%u.slot", slot_dir, pv->name, n) >=
		    sizeof(path))
			return -ENAMETOOLONG;
		fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd < 0)
			return -errno;
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			return fd;
		close(fd);
		if (errno != EWOULDBLOCK)
			return -errno;
	}
	return -EBUSY;
}

void prov_slot_release(int fd)
{
	if (fd < 0)
		return;
	/* Unlock before closing: a child that another thread is starting right now holds a
	 * copy of this descriptor until its exec (or, for a user namespace holder, until it
	 * exits), and the lock lives as long as any copy does; a client that got its whole
	 * answer and asked again at once was refused with 429 (load.sh found it). */
	(void)flock(fd, LOCK_UN);
	close(fd);
}
