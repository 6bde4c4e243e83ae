/* Caps that hold across every process of a host (common.h, "slots").
 *
 * A cap of N is N slot files <dir>/<prefix>.<i>.slot; a holder keeps one locked with
 * flock(LOCK_EX | LOCK_NB) for as long as it needs it. The kernel drops a lock when its
 * holder dies, so a crashed process never leaks a slot and no process has to count
 * anything (a counter in a file or a database would stay up after a crash). Trying the
 * slots in turn costs a few syscalls. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/file.h>
#include <unistd.h>

#include "common/common.h"
#include "common/banned.h"

/* The loop of slot_take and slot_take_at: the files are opened relative to dfd, under dir
 * when dir is not NULL. */
static int slot_take_in(int dfd, const char *dir, const char *prefix, unsigned n)
{
	unsigned i, start;
	int fd;

	if (!n)
		return -EINVAL;
	/* Start at a different slot in each process so that they do not all contend for
	 * slot 0 first. */
	start = (unsigned)getpid() % n;
	for (i = 0; i < n; i++) {
		char path[PATH_MAX];
		unsigned k = (start + i) % n;

		if ((size_t)snprintf(path, sizeof(path), "%s%s%s%s%u.slot", dir ? dir : "",
				     dir ? "/" : "", prefix, *prefix ? "." : "", k) >= sizeof(path))
			return -ENAMETOOLONG;
		/* O_NOFOLLOW: a symlink planted in the dir must not make us create or lock
		 * a file elsewhere. */
		fd = openat(dfd, path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
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

int slot_take(const char *dir, const char *prefix, unsigned n)
{
	return slot_take_in(AT_FDCWD, dir, prefix, n);
}

int slot_take_at(int dfd, const char *prefix, unsigned n)
{
	if (dfd < 0)
		return -EBADF;
	return slot_take_in(dfd, NULL, prefix, n);
}

void slot_release(int fd)
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
