/* Refreshing a held login (ADR 0036), and what /health shows of it.
 *
 * An OAuth access token lives hours; a run may take minutes. Before a run whose login's
 * token expires within PROV_HELD_MARGIN_MS, the worker asks the CLI's own token endpoint
 * ("login_token_url" replaces it, for tests) for a new one with the refresh token, as the
 * CLI would have done itself. One worker of the host at a time: an exclusive flock on
 * <runtime dir>/held/<provider>.lock, under which the login is read again, so that a
 * worker that waited finds the token another refreshed and asks for nothing (a refresh
 * token is single-use at some providers: two refreshes at once would log the host out).
 * The new file replaces the old whole (a temp file beside it, fsync, rename; mode 0600,
 * the old file's owner), so a reader sees the old login or the new one, never half; the
 * other workers read the file for every run and so pick the new token up at once.
 * <provider>.state (the last refresh, the failures since) is written under the same lock
 * for /health. Nothing here logs a token or an answer's body. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "providers/cli.h"
#include "common/banned.h"

#define REFRESH_TIMEOUT_S 20L
#define REFRESH_LOCK_WAIT_MS 30000
#define REFRESH_MAX_ANSWER ((size_t)64 * 1024)

static bool needs_refresh(const struct prov_held_login *l, int64_t now_ms)
{
	return l->root && l->expires_ms && l->expires_ms - now_ms < PROV_HELD_MARGIN_MS;
}

/* The lock of pv's refresher, taken: its fd, or -errno. Bounded: a worker stuck in a
 * refresh holds up the others' runs no longer than REFRESH_LOCK_WAIT_MS. */
static int lock_take(const struct prov_provider *pv)
{
	char path[PATH_MAX];
	uint64_t end = mono_ms() + REFRESH_LOCK_WAIT_MS;
	int fd, ret = prov_login_state_path(pv, path);
	size_t len = strlen(path);

	if (ret)
		return ret;
	snprintf(path + len - strlen("state"), PATH_MAX - len + strlen("state"), "lock");
	if ((fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0)
		return -errno;
	while (flock(fd, LOCK_EX | LOCK_NB)) {
		if (errno != EWOULDBLOCK && errno != EINTR) {
			ret = -errno;
			close(fd);
			return ret;
		}
		if (mono_ms() > end) {
			close(fd);
			return -ETIMEDOUT;
		}
		nanosleep(&(struct timespec){ .tv_nsec = 20L * 1000 * 1000 }, NULL);
	}
	return fd;
}

/* Replace path with data, whole, keeping the old file's owner (the worker may run as root
 * for a login of another user). */
static int replace_file(const char *path, const char *data)
{
	struct stat st;

	if (stat(path, &st))
		return -errno;
	return prov_file_replace(path, data, &st);
}

/* <provider>.state after a refresh: when it last worked, the failures since. */
static void state_write(const struct prov_provider *pv, bool ok, const char *err)
{
	char path[PATH_MAX];
	json_t *st = NULL, *last, *now;
	json_int_t fails;
	char *text;

	if (prov_login_state_path(pv, path))
		return;
	st = json_load_file(path, 0, NULL);
	if (!json_is_object(st)) {
		json_decref(st);
		st = json_object();
	}
	last = json_object_get(st, "last_refresh_ms");
	fails = json_integer_value(json_object_get(st, "failures"));
	now = json_pack("{s:I, s:I, s:s}", "last_refresh_ms",
			ok ? (json_int_t)wall_ms() : json_integer_value(last), "failures",
			ok ? (json_int_t)0 : fails + 1, "last_error", ok ? "" : err);
	text = now ? json_dumps(now, JSON_COMPACT) : NULL;
	json_decref(now);
	json_decref(st);
	/* The state file is new on a fresh host: create it empty first, then replace. */
	if (access(path, F_OK)) {
		int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);

		if (fd >= 0)
			close(fd);
	}
	if (text && replace_file(path, text))
		log_warnx(NULL, "provider %s: held login: state file %s: not written", pv->name,
			  path);
	free(text);
}

static size_t on_data(char *data, size_t size, size_t n, void *ctx)
{
	struct buf *b = ctx;

	if (b->len + size * n > REFRESH_MAX_ANSWER)
		return 0; /* libcurl fails the transfer */
	buf_add(b, data, size * n);
	return size * n;
}

/* POST the refresh to the token endpoint; its JSON answer into *answer. */
static int post_refresh(const struct prov_provider *pv, const char *refresh_token, json_t **answer,
			struct buf *why)
{
	const struct prov_held_ops *ho = pv->ops->held;
	const char *url = pv->login_token_url ? pv->login_token_url : ho->token_url;
	json_t *req = ho->refresh_body(ho, refresh_token);
	char *body = json_dumps(req, JSON_COMPACT);
	struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
	struct buf got = BUF_INIT;
	CURL *c = curl_easy_init();
	long status = 0;
	CURLcode rc;

	json_decref(req);
	h = curl_slist_append(h, "Accept: application/json");
	if (!c || !h || !body) {
		rc = CURLE_OUT_OF_MEMORY;
		goto out;
	}
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, REFRESH_TIMEOUT_S);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &got);
	rc = curl_easy_perform(c);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
out:
	if (rc != CURLE_OK)
		buf_addf(why, "token endpoint %s: %s", url, curl_easy_strerror(rc));
	else if (status != 200)
		buf_addf(why, "token endpoint %s: HTTP %ld", url, status);
	else if (!(*answer = json_loadb(got.data, got.len, 0, NULL)) || !json_is_object(*answer))
		buf_addf(why, "token endpoint %s: its answer is not a JSON object", url);
	if (got.len)
		explicit_bzero(got.data, got.len);
	buf_release(&got);
	if (body) {
		explicit_bzero(body, strlen(body));
		free(body);
	}
	curl_slist_free_all(h);
	if (c)
		curl_easy_cleanup(c);
	return why->len ? -EPROTO : 0;
}

/* Ask for a new token, put it into l's file. Under the lock. */
static int refresh_locked(const struct prov_provider *pv, struct prov_held_login *l,
			  struct buf *why)
{
	const struct prov_held_ops *ho = pv->ops->held;
	const char *what = NULL;
	char path[PATH_MAX], *text;
	json_t *answer = NULL;
	int ret;

	if (!l->refresh) {
		buf_adds(why, "the login holds no refresh token");
		return -ENOKEY;
	}
	if ((ret = post_refresh(pv, l->refresh, &answer, why)))
		goto out;
	if ((ret = ho->refreshed(l->root, answer, wall_ms(), &what))) {
		buf_adds(why, what);
		goto out;
	}
	/* The strings of l pointed at the values just replaced: read them again. */
	l->access = l->refresh = l->account = NULL;
	l->expires_ms = 0;
	if ((ret = ho->parse(l->root, l, &what))) {
		buf_adds(why, what);
		goto out;
	}
	text = json_dumps(l->root, JSON_INDENT(2));
	if ((ret = prov_login_path(pv, path)) || !text || (ret = replace_file(path, text)))
		buf_addf(why, "writing the login back: %s", strerror(ret ? -ret : ENOMEM));
	if (text) {
		explicit_bzero(text, strlen(text));
		free(text);
	}
out:
	json_decref(answer);
	return ret;
}

int prov_login_refresh(const struct prov_provider *pv, const char *rid, struct prov_held_login *l,
		       struct buf *why)
{
	int lock, ret;

	if (!needs_refresh(l, wall_ms()))
		return 0;
	if ((lock = lock_take(pv)) < 0) {
		buf_addf(why, "the refresh lock: %s", strerror(-lock));
		return lock;
	}
	/* Another worker may have refreshed it while this one waited. */
	prov_login_release(l);
	if ((ret = prov_login_read(pv, l, why)) || !needs_refresh(l, wall_ms()))
		goto out_unlock;
	ret = refresh_locked(pv, l, why);
	state_write(pv, !ret, why->data);
	if (ret)
		log_warnx(rid, "provider %s: held login: refresh failed: %s", pv->name, why->data);
	else
		log_info(rid, "provider %s: held login refreshed; it expires in %lld s", pv->name,
			 (long long)((l->expires_ms - wall_ms()) / 1000));
out_unlock:
	close(lock);
	return ret;
}

/* ---- /health -------------------------------------------------------------------------- */

static void state_read(const struct prov_provider *pv, struct prov_login_info *out)
{
	char path[PATH_MAX];
	json_t *st;

	if (prov_login_state_path(pv, path) || !(st = json_load_file(path, 0, NULL)))
		return;
	out->last_refresh_ms = json_integer_value(json_object_get(st, "last_refresh_ms"));
	out->refresh_failures = json_integer_value(json_object_get(st, "failures"));
	snprintf(out->last_error, sizeof(out->last_error), "%s",
		 json_string_value(json_object_get(st, "last_error")) ?: "");
	json_decref(st);
}

void prov_provider_login_info(const struct prov_provider *pv, struct prov_login_info *out)
{
	struct prov_held_login l;
	struct buf why = BUF_INIT;

	memset(out, 0, sizeof(*out));
	if (!prov_provider_uses_account(pv) || prov_net_secretless(&pv->net) ||
	    (pv->credentials_set && !pv->cred_host.n && !(pv->ops->held && pv->login)))
		return;
	if (pv->login != PROV_LOGIN_HELD) {
		out->mode = "copy";
		out->warning = pv->ops->held
				       ? "runs get a copy of the login's files, which a prompt can "
					 "have printed; set \"login\": \"held\""
				       : "this CLI's login cannot be held by the worker: runs get "
					 "a copy of its files; give it a key through "
					 "network.set_headers instead";
		return;
	}
	out->mode = "held";
	state_read(pv, out);
	if (!prov_login_read(pv, &l, &why)) {
		out->expires_ms = l.expires_ms;
		prov_login_release(&l);
	} else {
		snprintf(out->last_error, sizeof(out->last_error), "%s", why.data);
	}
	buf_release(&why);
}
