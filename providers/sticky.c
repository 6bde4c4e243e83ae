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
 * With a shared PostgreSQL store (pg.c) the choice is made once for every host: the
 * store's row (olp_account_choose: the first INSERT wins; a move compares the account it
 * replaces) is the choice, and the host's file keeps a copy of it. While the store cannot
 * be reached, the file's choice is used, and hosts may then differ.
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
	return prov_state_subdir(state_dir, "accounts", &sticky_dir, &dir_lock);
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
	return n ? h % n : 0;
}

/* The first of pv's accounts from start on (in order, round) that is not rejected:
 * its name, or NULL with *soonest the soonest reset of them all. */
static const char *next_free(const struct prov_provider *pv, size_t start, int64_t now_s,
			     int64_t *soonest)
{
	size_t n = prov_provider_account_count(pv);
	int64_t r;

	*soonest = 0;
	for (size_t i = 0; i < n; i++) {
		const char *a = prov_provider_account_at(pv, (start + i) % n);

		if (!prov_account_blocked(pv, a, now_s, &r))
			return a;
		if (!*soonest || r < *soonest)
			*soonest = r;
	}
	return NULL;
}

/* Where a new choice starts: after cur (the kept account, which cannot be used), or at
 * the caller's own place. */
static size_t start_after(const struct prov_provider *pv, const char *cur, const char *who)
{
	size_t n = prov_provider_account_count(pv), i;

	for (i = 0; cur && i < n; i++)
		if (!strcmp(prov_provider_account_at(pv, i), cur))
			return i + 1;
	return start_of(who ? who : "", n);
}

/* The choice through the shared store (pg.c): 0 with *account, -EBUSY with *retry_s,
 * or -ESTALE when the store cannot be used now (the caller uses the file). Each round
 * either finds the kept account usable or replaces it, comparing the account it saw: two
 * hosts that choose or move at the same moment end on one account. */
static int choose_shared(const struct prov_provider *pv, const char *who, int64_t now_s,
			 const char **account, int64_t *retry_s, char *kept, int64_t *until)
{
	size_t n = prov_provider_account_count(pv);
	const struct prov_provider *cur;
	const char *want, *old;
	int64_t r;
	int ret = prov_pg_choice_get(pv->name, who, kept, until);

	for (size_t round = 0; round <= n; round++) {
		if (ret == -ESTALE)
			return ret;
		old = !ret && *until > now_s ? kept : NULL;
		cur = old ? prov_provider_for_account(pv, old) : NULL;
		if (cur && !prov_account_blocked(pv, prov_provider_account(cur), now_s, &r)) {
			*account = prov_provider_account(cur);
			return 0;
		}
		want = next_free(pv, start_after(pv, cur ? old : NULL, who), now_s, retry_s);
		if (!want)
			return -EBUSY;
		/* old: the account seen kept and not usable here (rejected, or one this host
		 * does not have); NULL: none, or lapsed. */
		ret = prov_pg_choose(pv->name, who, want, now_s + PROV_STICKY_S, now_s, old, kept,
				     until);
	}
	/* The store kept answering with accounts this host cannot use: the file decides. */
	return -ESTALE;
}

int prov_account_choose(const struct prov_provider *pv, const char *who, int64_t now_s,
			const char **account, int64_t *retry_s)
{
	char path[PATH_MAX], kept[PROV_ACCOUNT_NAME_MAX + 1];
	const struct prov_provider *cur = NULL;
	bool have_path = who && !sticky_path(pv, who, path);
	int64_t until = 0, r = 0;
	int ret;

	if (pv->parent)
		pv = pv->parent;
	if (prov_provider_account_count(pv) == 1) {
		*account = prov_provider_account_at(pv, 0);
		if (!prov_account_blocked(pv, *account, now_s, &r))
			return 0;
		*retry_s = r;
		return -EBUSY;
	}
	if (who) {
		ret = choose_shared(pv, who, now_s, account, retry_s, kept, &until);
		if (ret != -ESTALE) {
			/* The host's copy, for the time the store cannot be reached. */
			if (!ret && have_path &&
			    (sticky_read(path, kept, &r) || strcmp(kept, *account) || r != until))
				sticky_write(path, *account, until);
			return ret;
		}
	}
	if (have_path && !sticky_read(path, kept, &until) && until > now_s)
		cur = prov_provider_for_account(pv, kept);
	if (cur && !prov_account_blocked(pv, prov_provider_account(cur), now_s, &r)) {
		*account = prov_provider_account(cur);
		return 0;
	}
	/* A new choice: after the rejected one, or from the caller's own place. */
	*account = next_free(pv, start_after(pv, cur ? prov_provider_account(cur) : NULL, who),
			     now_s, retry_s);
	if (!*account)
		return -EBUSY;
	if (have_path)
		sticky_write(path, *account, now_s + PROV_STICKY_S);
	return 0;
}
