/* The host-wide caps on idle pre-started commands (pool.c keeps them; ADR 0022).
 *
 * Every worker process of a host keeps its own pre-started commands, but a claude waiting
 * on its stdin is a large runtime: the cap holds for the host. Slot i is the file
 * <runtime_dir>/prestart-slots/<i>.slot; an idle command holds one with
 * flock(LOCK_EX | LOCK_NB): common.h's slots, as providers/slots.c's for concurrency. The
 * kernel releases the lock when its holder dies, so a SIGKILLed worker leaks nothing and no
 * process has to count anything.
 *
 * Each owner tag (the caller's key id, opaque here) has a share of them, held the same way:
 * t<hex of the tag>.<i>.slot in the same directory, i below the tag's share. A command
 * holds one of each, so that no tag, whichever workers its runs land on, holds more than
 * its share of the host's slots (ADR 0022: a guest's churn took all four). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sandbox/instance.h"
#include "common/banned.h"

#define SLOT_DIR "prestart-slots"

/* One of n slot files <prefix>.<i>.slot (<i>.slot for the host's), locked, in the slot
 * directory under the runtime dir (common.h's slot_take_at); an fd, -EBUSY when all are
 * held. */
static int slot_take_in(const char *prefix, unsigned n)
{
	int dfd, ret;

	if (!n || sbx_g.runtime_fd < 0)
		return -EBUSY;
	/* The sweep of dead runs' scratch dirs skips it: its name is not "<pid>-…". */
	if (mkdirat(sbx_g.runtime_fd, SLOT_DIR, 0700) < 0 && errno != EEXIST)
		return -errno;
	dfd = sbx_open_dir_beneath(sbx_g.runtime_fd, SLOT_DIR);
	if (dfd < 0)
		return -errno;
	ret = slot_take_at(dfd, prefix, n);
	close(dfd);
	return ret;
}

int sbx_prestart_slot_take(void)
{
	if (!sbx_g.prestart_max)
		return -EBUSY;
	return slot_take_in("", sbx_g.prestart_max);
}

int sbx_prestart_tag_take(const char *tag, unsigned share)
{
	char prefix[2 * SBX_OWNER_TAG_MAX + 2];
	size_t len = strlen(tag);

	if (len > SBX_OWNER_TAG_MAX)
		return -ENAMETOOLONG;
	/* Hex: a file name part for any tag, never a path; "t" keeps it apart from the
	 * host's numbered slots. */
	prefix[0] = 't';
	for (size_t i = 0; i < len; i++)
		snprintf(prefix + 1 + 2 * i, 3, "%02x", (unsigned char)tag[i]);
	prefix[1 + 2 * len] = '\0';
	return slot_take_in(prefix, share);
}
