/* Start-up notes: what the operator should know of a provider's configuration that is not
 * an error (vibe's API base, which only its own config.toml sets), said by one worker of a
 * pool rather than by each worker at each start, and only for a program that is installed:
 * a note about a CLI the host does not have is noise in every error log.
 *
 * "Once" is once per web server run: the workers of a pool, and the processes of CGI mode,
 * share their parent (the web server) and the runtime dir. A file per provider in
 * <dir>/notes holds the parent's pid of the last worker that said its notes; under an
 * exclusive flock the first worker of a new parent finds another pid, says them and writes
 * its own, and its siblings find theirs and stay quiet. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "providers/cli.h"
#include "common/banned.h"

/* Whether this process is the first of its parent's to say pv's notes. Any failure of the
 * file says them: better twice than never. */
static bool first_to_say(const char *dir, const char *name)
{
	char path[PATH_MAX], mine[32], theirs[32];
	bool first = true;
	ssize_t n;
	int fd, len;

	if (!dir || (size_t)snprintf(path, sizeof(path), "%s/notes", dir) >= sizeof(path) ||
	    (mkdir(path, 0700) < 0 && errno != EEXIST) ||
	    (size_t)snprintf(path, sizeof(path), "%s/notes/%s.said", dir, name) >= sizeof(path))
		return true;
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return true;
	if (flock(fd, LOCK_EX) < 0)
		goto out;
	len = snprintf(mine, sizeof(mine), "%ld\n", (long)getppid());
	n = pread(fd, theirs, sizeof(theirs), 0);
	if (n == len && !memcmp(theirs, mine, (size_t)len)) {
		first = false;
		goto out;
	}
	if (ftruncate(fd, 0) < 0 || pwrite(fd, mine, (size_t)len, 0) != len)
		goto out; /* said anyway; the next worker will say them too */
out:
	close(fd); /* drops the lock */
	return first;
}

void prov_registry_notes(const struct prov_registry *reg, const char *dir)
{
	char real[PATH_MAX];

	for (size_t i = 0; i < prov_registry_provider_count(reg); i++) {
		const struct prov_provider *pv = prov_registry_provider_at(reg, i);
		const char *note = pv->ops->upstream_note;

		if (note && pv->net.mode == PROV_NET_UPSTREAM && !prov_cli_find(pv, real) &&
		    first_to_say(dir, pv->name))
			log_warnx(NULL, "providers.%s.network: %s", pv->name, note);
	}
}
