/* Which of a provider's accounts an unbound caller uses (issue 26 item 1, ADR 0037).
 *
 * A key not bound to an account gets one, and keeps it: the choice is one small file per
 * (provider, caller) in <state dir>/accounts, "<account> <until>\n", replaced whole
 * (rename), so every worker of the host sees the same. It holds for PROV_STICKY_S; a
 * choice whose account the upstream rejected (limits.c: "rejected" until a reset still
 * to come) is dropped at once for the next account in the provider's order that is not,
 * and that becomes the sticky choice. A new choice starts at an account picked from the
 * caller's name (so that callers spread over the accounts), then goes round in order.
 * One person's requests never alternate between accounts request by request: upstreams
 * read that as a shared login.
 *
 * Without a state dir (tests, tools) nothing is kept: the choice is recomputed the same
 * way each time, which gives the same account while none is rejected. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "providers/internal.h"
#include "common/banned.h"

static pthread_mutex_t dir_lock = PTHREAD_MUTEX_INITIALIZER;
static char *sticky_dir;

int prov_sticky_set_dir(const char *state_dir)
{
	char path[PATH_MAX];

	if ((size_t)snprintf(path, sizeof(path), "%s/accounts", state_dir) >= sizeof(path))
		return -ENAMETOOLONG;
	if (mkdir(path, 0700) < 0 && errno != EEXIST)
		return -errno;
	pthread_mutex_lock(&dir_lock);
	free(sticky_dir);
	sticky_dir = xstrdup(path);
	pthread_mutex_unlock(&dir_lock);
	return 0;
}

/* A caller's name as a file name part: [A-Za-z0-9_-], as key ids are; else -EINVAL. */
static int sticky_path(const struct prov_provider *pv, const char *who, char *path)
{
	int n, ret = 0;

	for (const char *c = who; *c; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
		      (*c >= '0' && *c <= '9') || *c == '_' || *c == '-'))
			return -EINVAL;
	if (!*who || strlen(who) > 64)
		return -EINVAL;
	pthread_mutex_lock(&dir_lock);
	if (!sticky_dir)
		ret = -ENOENT;
	else if ((n = snprintf(path, PATH_MAX, "%s/%s@%s", sticky_dir, pv->name, who)) < 0 ||
		 n >= PATH_MAX)
		ret = -ENAMETOOLONG;
	pthread_mutex_unlock(&dir_lock);
	return ret;
}

/* The kept choice: 0 with account (PROV_ACCOUNT_NAME_MAX + 1) and until, or -errno. */
static int sticky_read(const char *path, char *account, int64_t *until)
{
	char data[96];
	long long u;
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	if (fd < 0)
		return -errno;
	n = read(fd, data, sizeof(data) - 1);
	close(fd);
	if (n <= 0)
		return -EINVAL;
	data[n] = '\0';
	if (sscanf(data, "%32[a-z0-9_-] %lld", account, &u) != 2)
		return -EINVAL;
	*until = u;
	return 0;
}

static void sticky_write(const char *path, const char *account, int64_t until)
{
	char tmp[PATH_MAX + 16], data[96];
	int fd, n = snprintf(data, sizeof(data), "%s %lld\n", account, (long long)until);

	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.XXXXXX", path) >= sizeof(tmp))
		return;
	if ((fd = mkostemp(tmp, O_CLOEXEC)) < 0)
		return;
	if (write(fd, data, (size_t)n) != n || fchmod(fd, 0600) || close(fd) || rename(tmp, path)) {
		log_warnx(NULL, "account %s: a caller's choice of it could not be kept: %s",
			  account, strerror(errno));
		unlink(tmp);
	}
}

bool prov_account_blocked(const struct prov_provider *pv, const char *account, int64_t now_s,
			  int64_t *retry_s)
{
	struct prov_limits st;

	return !prov_limits_get(pv->name, account, &st) && prov_limits_blocked(&st, now_s, retry_s);
}

/* Where a caller's first choice starts: a small hash of its name (FNV-1a). */
static size_t start_of(const char *who, size_t n)
{
	uint32_t h = 2166136261u;

	for (const char *c = who; *c; c++)
		h = (h ^ (unsigned char)*c) * 16777619u;
	return h % n;
}

int prov_account_choose(const struct prov_provider *pv, const char *who, int64_t now_s,
			const char **account, int64_t *retry_s)
{
	char path[PATH_MAX], kept[PROV_ACCOUNT_NAME_MAX + 1];
	size_t n = prov_provider_account_count(pv), start, i;
	const struct prov_provider *cur = NULL;
	bool have_path = who && !sticky_path(pv, who, path);
	int64_t until = 0, r, soonest = 0;

	if (pv->parent)
		pv = pv->parent;
	if (n == 1) {
		*account = prov_provider_account_at(pv, 0);
		if (!prov_account_blocked(pv, *account, now_s, &r))
			return 0;
		*retry_s = r;
		return -EBUSY;
	}
	if (have_path && !sticky_read(path, kept, &until) && until > now_s)
		cur = prov_provider_for_account(pv, kept);
	if (cur && !prov_account_blocked(pv, prov_provider_account(cur), now_s, &r)) {
		*account = prov_provider_account(cur);
		return 0;
	}
	/* A new choice: after the rejected one, or from the caller's own place. */
	for (start = 0; cur && start < n; start++)
		if (!strcmp(prov_provider_account_at(pv, start), prov_provider_account(cur)))
			break;
	start = cur ? start + 1 : start_of(who ? who : "", n);
	for (i = 0; i < n; i++) {
		const char *a = prov_provider_account_at(pv, (start + i) % n);

		if (!prov_account_blocked(pv, a, now_s, &r)) {
			*account = a;
			if (have_path)
				sticky_write(path, a, now_s + PROV_STICKY_S);
			return 0;
		}
		if (!soonest || r < soonest)
			soonest = r;
	}
	*retry_s = soonest;
	return -EBUSY;
}
