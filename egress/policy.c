/* The route's rules for one request: which method and path it may have, which of the
 * client's headers never leave, which models a body may name.
 *
 * What it stops (ADR 0027): a run holding no credential spending the one the worker adds
 * on anything but the calls its CLI makes. Paths are matched exactly, with the method,
 * because a prefix lets a sibling API through ("/v1/messages" let
 * "GET /v1/messages/batches" and their results out, workspace-wide), and any method let
 * DELETE and TRACE reach the upstream. Headers that ask a server or a proxy on the way to
 * take another method or URL than the request line's (X-HTTP-Method-Override,
 * X-Original-URL, ...) or to believe another client address are dropped, so that the
 * method and path checked here are the ones the upstream acts on. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "egress/internal.h"
#include "common/banned.h"

bool egr_method_never(const char *method)
{
	/* TRACE and TRACK reflect the request, credential included, back to the client;
	 * CONNECT would open a tunnel past every check here. */
	return !strcmp(method, "TRACE") || !strcmp(method, "TRACK") || !strcmp(method, "CONNECT");
}

int egr_allow_parse(const char *entry, struct egr_allow *a, const char **why)
{
	const char *sp = entry ? strchr(entry, ' ') : NULL, *path;
	size_t ml, pl;
	bool prefix;
	char method[32];

	if (!sp) {
		*why = "an allowed request is not \"METHOD /path\"";
		return -EINVAL;
	}
	ml = (size_t)(sp - entry);
	path = sp + 1;
	pl = strlen(path);
	if (!ml || ml >= sizeof(method) || !egr_is_token(entry, ml)) {
		*why = "an allowed request's method is not an HTTP method";
		return -EINVAL;
	}
	memcpy(method, entry, ml);
	method[ml] = '\0';
	if (egr_method_never(method)) {
		*why = "TRACE, TRACK and CONNECT are never allowed";
		return -EINVAL;
	}
	/* "/v1/models/" then '*': a prefix. A '*' anywhere else is a character of the path,
	 * which the canonical check below lets through only where a path may hold it. */
	prefix = pl >= 2 && path[pl - 1] == '*' && path[pl - 2] == '/';
	if (prefix)
		pl--;
	if (!pl || !egr_path_canonical(path, pl) || memchr(path, '?', pl) ||
	    memchr(path, '#', pl) || memchr(path, '*', pl) || memchr(path, ' ', pl)) {
		*why = "an allowed request's path is not a canonical absolute path";
		return -EINVAL;
	}
	if (a) {
		a->method = xstrdup(method);
		a->path = xstrndup(path, pl);
		a->len = pl;
		a->prefix = prefix;
	}
	return 0;
}

void egr_allow_release(struct egr_allow *a)
{
	free(a->method);
	free(a->path);
	memset(a, 0, sizeof(*a));
}

int egr_allow_match(const struct egr_allow *allow, size_t n, const char *method, const char *path,
		    size_t len)
{
	bool path_listed = false;

	for (size_t i = 0; i < n; i++) {
		const struct egr_allow *a = &allow[i];
		bool match = a->prefix ? len >= a->len && !memcmp(path, a->path, a->len)
				       : len == a->len && !memcmp(path, a->path, len);

		if (!match)
			continue;
		if (!strcmp(method, a->method))
			return 0;
		path_listed = true;
	}
	return path_listed ? 405 : 403;
}

bool egr_req_dropped(const struct egr_req *r, const char *name)
{
	/* Read by some servers, frameworks and gateways as the real method, URL or client. */
	static const char *const exact[] = {
		"x-http-method-override",
		"x-http-method",
		"x-method-override",
		"x-original-url",
		"x-rewrite-url",
		"x-original-method",
		"forwarded",
		"x-real-ip",
		"x-client-ip",
		"true-client-ip",
		"x-envoy-original-path",
	};
	static const char *const prefixes[] = { "x-forwarded-", "proxy-" };

	if (egr_req_hop_by_hop(r, name))
		return true;
	for (size_t i = 0; i < ARRAY_SIZE(exact); i++)
		if (!strcasecmp(name, exact[i]))
			return true;
	for (size_t i = 0; i < ARRAY_SIZE(prefixes); i++)
		if (!strncasecmp(name, prefixes[i], strlen(prefixes[i])))
			return true;
	return false;
}

bool egr_model_allowed(const struct strv *models, const char *model, size_t len)
{
	for (size_t i = 0; i < models->n; i++) {
		const char *m = models->v[i];
		size_t ml = strlen(m);

		if (ml && m[ml - 1] == '*') {
			if (len >= ml - 1 && !memcmp(model, m, ml - 1))
				return true;
		} else if (ml == len && !memcmp(model, m, len)) {
			return true;
		}
	}
	return false;
}
