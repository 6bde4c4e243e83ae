/* The accounts' subscription limits, kept for every worker of the host (ADR 0035).
 *
 * A run's forwarder reads what each upstream answer announces of the account's limits
 * (egress/ratelimit.c) and hands it here, from its connection's thread
 * (prov_limits_seen). The latest state of each (provider, account) is one small file,
 * <state dir>/limits/<provider>@<account>.v1, written whole to a file of its own and
 * renamed over the old one: a reader in any worker sees one state or the one before,
 * never half of one, and a worker killed mid-write leaves at most a stray temporary file.
 * Two runs of one account that write at the same moment: the last rename wins, and the
 * windows it did not name are those of the state it read (a lost update costs one
 * answer's news, which the next answer brings again).
 *
 * Readers: /health, /v1/usage, the dashboard and /metrics (fcgi/limits.c), and the check
 * before each run (prov_limits_blocked) that refuses a request for an account the
 * upstream rejected until its reset, without starting anything. The files hold the
 * upstream's words about limits only: status, fractions, times.
 *
 * With a shared PostgreSQL store (pg.c), every host's view: a put is also queued for the
 * store when it changed in a way that matters, and a read takes the store's state over
 * the file's when the store's cache is fresh and its state is the newer one (another
 * host's answer). Not fresh: the file alone (limits are advisory; failing open lets the
 * CLI run, and the upstream answers 429 itself). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "providers/internal.h"
#include "common/banned.h"

#define LIMITS_MAGIC 0x4f4c504c494d3031ULL /* "OLPLIM01" */
#define NAME_MAX_LEN 64

/* The file: a fixed layout of this build's (an older or newer one reads as absent). */
struct limits_file {
	uint64_t magic;
	uint32_t size;
	uint32_t pad;
	struct prov_limits st;
};

static pthread_mutex_t dir_lock = PTHREAD_MUTEX_INITIALIZER;
static char *limits_dir;
static atomic_uint tmp_seq;

int prov_limits_set_dir(const char *state_dir)
{
	return prov_state_subdir(state_dir, "limits", &limits_dir, &dir_lock);
}

/* A plain file name part: no path, no hidden file, nothing a shell or a log would read
 * otherwise. */
static bool name_ok(const char *s)
{
	size_t n = strnlen(s, NAME_MAX_LEN + 1);

	if (!n || n > NAME_MAX_LEN || s[0] == '.')
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
		      (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-' || s[i] == '.'))
			return false;
	return true;
}

/* <dir>/<provider>@<account>.v1 into path: 0, -ENOENT (no dir) or -EINVAL. */
static int state_path(const char *provider, const char *account, char *path, size_t size)
{
	int n, ret = 0;

	if (!name_ok(provider) || !name_ok(account))
		return -EINVAL;
	pthread_mutex_lock(&dir_lock);
	if (!limits_dir)
		ret = -ENOENT;
	else if ((n = snprintf(path, size, "%s/%s@%s.v1", limits_dir, provider, account)) < 0 ||
		 (size_t)n >= size)
		ret = -ENAMETOOLONG;
	pthread_mutex_unlock(&dir_lock);
	return ret;
}

/* The host's own file of the account. */
static int file_get(const char *provider, const char *account, struct prov_limits *out)
{
	struct limits_file f;
	char path[PATH_MAX];
	ssize_t n;
	int fd, ret = state_path(provider, account, path, sizeof(path));

	memset(out, 0, sizeof(*out));
	if (ret)
		return ret;
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, &f, sizeof(f));
	ret = n < 0 ? -errno : 0;
	close(fd);
	if (ret)
		return ret;
	if (n != (ssize_t)sizeof(f) || f.magic != LIMITS_MAGIC || f.size != sizeof(f))
		return -ENOENT;
	*out = f.st;
	/* What a file says is read as strictly as the network's words were. */
	out->rl.claim[sizeof(out->rl.claim) - 1] = '\0';
	if ((unsigned)out->rl.status > EGR_RL_REJECTED)
		out->rl.status = EGR_RL_UNKNOWN;
	return 0;
}

static int write_atomic(const char *path, const struct limits_file *f);

/* The host's file, or the shared store's state when the store's cache is fresh and its
 * state is the newer (another host's answer). may_load: the store's table may be read
 * now if this process has not read it in this listener epoch (never on an answer's
 * path). */
static int limits_get(const char *provider, const char *account, bool may_load,
		      struct prov_limits *out)
{
	struct prov_limits shared;
	int ret = file_get(provider, account, out);

	if (ret && ret != -ENOENT)
		return ret;
	if (prov_pg_limits_get(provider, account, may_load, &shared))
		return ret;
	if (ret || shared.seen_ms > out->seen_ms) {
		struct limits_file f = { .magic = LIMITS_MAGIC, .size = sizeof(f), .st = shared };
		char path[PATH_MAX];

		*out = shared;
		/* The host's copy of every host's news, once per change: while the store
		 * is away, this host decides from the last state it saw, not from its own
		 * older one. */
		if (!state_path(provider, account, path, sizeof(path)))
			(void)write_atomic(path, &f);
	}
	return 0;
}

int prov_limits_get(const char *provider, const char *account, struct prov_limits *out)
{
	return limits_get(provider, account, true, out);
}

/* Write f to path through a temporary file of its own, renamed over it. 0 or -errno. */
static int write_atomic(const char *path, const struct limits_file *f)
{
	char tmp[PATH_MAX];
	int fd, ret = 0;

	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.%ld.%u.tmp", path, (long)getpid(),
			     atomic_fetch_add(&tmp_seq, 1)) >= sizeof(tmp))
		return -ENAMETOOLONG;
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (write(fd, f, sizeof(*f)) != (ssize_t)sizeof(*f))
		ret = errno ? -errno : -EIO;
	if (close(fd) < 0 && !ret)
		ret = -errno;
	if (!ret && rename(tmp, path) < 0)
		ret = -errno;
	if (ret)
		(void)unlink(tmp);
	return ret;
}

/* The new answer's words over the old state: the overall status, reset and claim are the
 * answer's; a window it did not name keeps what an earlier answer said of it. */
static void merge(struct prov_limits *st, const struct egr_ratelimit *rl, int64_t now_ms)
{
	struct egr_rl_win old[EGR_RL_NWIN];

	memcpy(old, st->rl.win, sizeof(old));
	st->rl = *rl;
	st->seen_ms = now_ms;
	for (size_t i = 0; i < EGR_RL_NWIN; i++) {
		if (rl->win[i].seen)
			st->win_seen_ms[i] = now_ms;
		else
			st->rl.win[i] = old[i];
	}
}

int prov_limits_put(const char *provider, const char *account, const struct egr_ratelimit *rl)
{
	struct limits_file f = { .magic = LIMITS_MAGIC, .size = sizeof(f) };
	char path[PATH_MAX];
	int ret = state_path(provider, account, path, sizeof(path));

	if (ret)
		return ret;
	if (limits_get(provider, account, false, &f.st))
		memset(&f.st, 0, sizeof(f.st));
	merge(&f.st, rl, wall_ms());
	ret = write_atomic(path, &f);
	/* Every host's view: queued for the store only when it matters (pg.c). */
	prov_pg_limits_put(provider, account, &f.st);
	return ret;
}

bool prov_limits_blocked(const struct prov_limits *st, int64_t now_s, int64_t *retry_s)
{
	if (st->rl.status != EGR_RL_REJECTED || st->rl.reset_s <= now_s)
		return false;
	*retry_s = st->rl.reset_s - now_s;
	return true;
}

void prov_limits_seen(void *ctx, const struct egr_ratelimit *rl)
{
	const struct prov_provider *pv = ctx;
	int ret = prov_limits_put(pv->name, prov_provider_account(pv), rl);

	if (ret && ret != -ENOENT)
		log_warnx(NULL, "provider %s: account %s: its limits could not be kept: %s",
			  pv->name, prov_provider_account(pv), strerror(-ret));
	if (rl->status == EGR_RL_REJECTED)
		log_warnx(NULL,
			  "provider %s: account %s: the upstream says its subscription limit is "
			  "reached (%s), reset at %lld: its requests get 429 until then",
			  pv->name, prov_provider_account(pv),
			  rl->claim[0] ? rl->claim : "no window named", (long long)rl->reset_s);
}
