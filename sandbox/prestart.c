/* The host-wide cap on idle pre-started commands (spawn.c keeps them; ADR 0022).
 *
 * Every worker process of a host keeps its own pre-started commands, but a claude waiting
 * on its stdin is a large runtime: the cap holds for the host. Slot i is the file
 * <runtime_dir>/prestart-slots/<i>.slot; an idle command holds one with
 * flock(LOCK_EX | LOCK_NB), as providers/slots.c does for concurrency. The kernel releases
 * the lock when its holder dies, so a SIGKILLed worker leaks nothing and no process has to
 * count anything. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sandbox/internal.h"
#include "common/banned.h"

#define SLOT_DIR "prestart-slots"

int sbx_prestart_slot_take(void)
{
	unsigned start;
	int dfd, fd, ret = -EBUSY;

	if (!sbx_g.prestart_max || sbx_g.runtime_fd < 0)
		return -EBUSY;
	/* The sweep of dead runs' scratch dirs skips it: its name is not "<pid>-…". */
	if (mkdirat(sbx_g.runtime_fd, SLOT_DIR, 0700) < 0 && errno != EEXIST)
		return -errno;
	dfd = sbx_open_dir_beneath(sbx_g.runtime_fd, SLOT_DIR);
	if (dfd < 0)
		return -errno;
	/* A different first slot in each process, so that they do not all contend for 0. */
	start = (unsigned)getpid() % sbx_g.prestart_max;
	for (unsigned i = 0; i < sbx_g.prestart_max; i++) {
		char name[32];

		snprintf(name, sizeof(name), "%u.slot", (start + i) % sbx_g.prestart_max);
		fd = openat(dfd, name, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd < 0) {
			ret = -errno;
			break;
		}
		if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
			ret = fd;
			break;
		}
		ret = errno == EWOULDBLOCK ? -EBUSY : -errno;
		close(fd);
		if (ret != -EBUSY)
			break;
	}
	close(dfd);
	return ret;
}

void sbx_prestart_slot_put(int fd)
{
	if (fd < 0)
		return;
	/* Unlock first: a child another thread is starting may hold a copy until its exec. */
	(void)flock(fd, LOCK_UN);
	close(fd);
}
