/* A provider's "network" setting (ADR 0015, ADR 0018): read and checked once,
 * at load, into struct prov_network; and the credential sources of upstream mode, read
 * again by the worker for every run (a rotated key is picked up without a restart).
 *
 *   false | "none"   no network (a command's default)
 *   "host"           the host's network: a loud, explicit opt-in
 *   {"upstream": URL, "set_headers": {h: src}, "allow_paths": ["METHOD /path", …],
 *    "upstream_ca": pem}
 *   {"allow_hosts": ["host:port", "a.b.c.d:port", …]}   CONNECT mode
 *   true             legacy: a CLI's default upstream; "host" for a command (deprecated)
 *
 * A source is "file:/abs/path" or "env:NAME", maybe after "Bearer " (an Authorization
 * header). The file must be the worker's own, a regular file with no group or other
 * bits: a key anyone else can read or swap is not a secret the worker should send.
 * It is never bound into a sandbox, and no message ever holds a value. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "egress/egress.h"
#include "providers/internal.h"
#include "common/banned.h"

/* The longest credential a file or variable may hold. */
#define NET_MAX_SECRET 8192
#define BEARER "Bearer "

struct net_reader {
	struct prov_network *n;
	const char *where;
	bool strict;
	struct buf *err;
	const char *section; /* what follows where in messages: ".network", or "" */
};

static int bad(struct net_reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(struct net_reader *r, const char *fmt, ...)
{
	va_list ap;

	buf_addf(r->err, "%s%s", r->where, r->section ? r->section : ".network");
	va_start(ap, fmt);
	buf_vaddf(r->err, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* Something that may be fixed before the first run (a key file not yet in place): an
 * error in config.json (strict), a warning in a registry entry. */
static int soft(struct net_reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int soft(struct net_reader *r, const char *fmt, ...)
{
	struct buf msg = BUF_INIT;
	va_list ap;

	buf_addf(r->strict ? r->err : &msg, "%s%s", r->where, r->section ? r->section : ".network");
	va_start(ap, fmt);
	buf_vaddf(r->strict ? r->err : &msg, fmt, ap);
	va_end(ap);
	if (r->strict)
		return -EINVAL;
	log_warnx(NULL, "%s; runs of this provider fail until it is fixed", msg.data);
	buf_release(&msg);
	return 0;
}

static bool is_plain_string(const json_t *v)
{
	return json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v);
}

/* An HTTP token (RFC 9110 tchar), the only thing a header name may be. */
static bool token_ok(const char *s)
{
	static const char extra[] = "!#$%&'*+-.^_`|~";

	if (!*s)
		return false;
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && !strchr(extra, *s))
			return false;
	return true;
}

static bool env_var_ok(const char *s)
{
	if (!*s || isdigit((unsigned char)*s))
		return false;
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && *s != '_')
			return false;
	return true;
}

/* "file:/abs" or "env:NAME", maybe after "Bearer ": the form only. */
static const char *source_form_error(const char *src)
{
	if (!strncmp(src, BEARER, strlen(BEARER)))
		src += strlen(BEARER);
	if (!strncmp(src, "file:", 5))
		return src[5] == '/' ? NULL : "a file: source needs an absolute path (file:/...)";
	if (!strncmp(src, "env:", 4))
		return env_var_ok(src + 4) ? NULL
					   : "an env: source needs a variable name (env:NAME)";
	return "must be \"file:/abs/path\" or \"env:NAME\" (maybe after \"Bearer \")";
}

static void wipe(struct buf *b)
{
	if (b->len)
		explicit_bzero(b->data, b->len);
	buf_reset(b);
}

/* The file's content, if the file is fit to hold a key. */
static int read_secret_file(const char *path, struct buf *value, struct buf *why)
{
	struct stat st;
	char tmp[512];
	ssize_t n;
	int fd, ret = 0;

	/* O_NOFOLLOW: the checks below are about the file itself, not what a link names. */
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		ret = -errno;
		buf_addf(why, "file %s: %s", path, strerror(errno));
		return ret;
	}
	if (fstat(fd, &st)) {
		ret = -errno;
		buf_addf(why, "file %s: %s", path, strerror(errno));
	} else if (!S_ISREG(st.st_mode)) {
		ret = -EINVAL;
		buf_addf(why, "file %s: not a regular file", path);
	} else if (st.st_mode & 077) {
		ret = -EPERM;
		buf_addf(why, "file %s: mode %04o lets group or others in; must be 0600", path,
			 (unsigned)(st.st_mode & 07777));
	} else if (st.st_uid != geteuid()) {
		ret = -EPERM;
		buf_addf(why, "file %s: owned by uid %u, not by the worker's uid %u", path,
			 (unsigned)st.st_uid, (unsigned)geteuid());
	} else if (st.st_size > NET_MAX_SECRET) {
		ret = -EFBIG;
		buf_addf(why, "file %s: larger than %d bytes", path, NET_MAX_SECRET);
	}
	while (!ret && (n = read(fd, tmp, sizeof(tmp))) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			ret = -errno;
			buf_addf(why, "file %s: %s", path, strerror(errno));
		} else if (value->len + (size_t)n > NET_MAX_SECRET + strlen(BEARER)) {
			ret = -EFBIG;
			buf_addf(why, "file %s: larger than %d bytes", path, NET_MAX_SECRET);
		} else {
			buf_add(value, tmp, (size_t)n);
		}
	}
	explicit_bzero(tmp, sizeof(tmp));
	close(fd);
	return ret;
}

int prov_net_resolve(const char *src, struct buf *value, struct buf *why)
{
	const char *form = source_form_error(src), *s = src;
	size_t start;
	int ret = 0;

	wipe(value);
	if (form) {
		buf_adds(why, form);
		return -EINVAL;
	}
	if (!strncmp(s, BEARER, strlen(BEARER))) {
		buf_adds(value, BEARER);
		s += strlen(BEARER);
	}
	start = value->len;
	if (!strncmp(s, "file:", 5)) {
		ret = read_secret_file(s + 5, value, why);
	} else {
		/* The environment is not changed once a worker serves (providers/cli.c). */
		const char *e = getenv(s + 4);

		if (!e) {
			ret = -ENOENT;
			buf_addf(why, "variable %s is not set in the worker's environment", s + 4);
		} else {
			buf_adds(value, e);
		}
	}
	/* A trailing newline is how a key file usually ends; it is not part of the key. */
	while (!ret && value->len > start && isspace((unsigned char)value->data[value->len - 1]))
		value->data[--value->len] = '\0';
	if (!ret && value->len == start) {
		ret = -ENODATA;
		buf_addf(why, "%s %s: empty", s[0] == 'f' ? "file" : "variable",
			 s + (s[0] == 'f' ? 5 : 4));
	}
	for (size_t i = start; !ret && i < value->len; i++) {
		unsigned char c = (unsigned char)value->data[i];

		/* A header value with a line break would be a header of the key's choosing. */
		if (c < 0x20 || c == 0x7f) {
			ret = -EINVAL;
			buf_addf(why, "%s %s: holds a line break or control character",
				 s[0] == 'f' ? "file" : "variable", s + (s[0] == 'f' ? 5 : 4));
		}
	}
	if (ret)
		wipe(value);
	return ret;
}

/* "scheme://host[:port]" of url, for /health and logs. */
static char *host_of(const char *url)
{
	const char *h = strstr(url, "://"), *e;

	h = h ? h + 3 : url;
	e = h + strcspn(h, "/?#");
	return xstrndup(h, (size_t)(e - h));
}

static int check_url(struct net_reader *r, const char *url)
{
	const char *h;
	size_t hl;

	if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8))
		return bad(r, ".upstream: must be an http:// or https:// URL");
	h = strstr(url, "://") + 3;
	hl = strcspn(h, "/");
	if (!hl || h[0] == ':')
		return bad(r, ".upstream: names no host");
	if (memchr(h, '@', hl))
		return bad(r, ".upstream: must not hold a user or password");
	if (strpbrk(url, "?# \t\r\n"))
		return bad(r, ".upstream: must not hold a query, fragment or whitespace");
	return 0;
}

static int read_strings(struct net_reader *r, const char *key, const json_t *v, struct strv *out)
{
	const json_t *a;
	size_t i;

	if (!json_is_array(v))
		return bad(r, ".%s: must be an array of strings", key);
	json_array_foreach(v, i, a) {
		if (!is_plain_string(a) || !json_string_length(a))
			return bad(r, ".%s[%zu]: must be a non-empty string", key, i);
		strv_push(out, json_string_value(a));
	}
	return 0;
}

/* "METHOD /path" entries. A plain "/path" (the form before ADR 0027, matched as a prefix
 * with any method) is taken as "POST /path", exact, and said at start: the narrowest
 * reading that keeps a model API working, never a wider one. */
static int read_allow_paths(struct net_reader *r, const json_t *v)
{
	const json_t *a;
	size_t i;

	if (!json_is_array(v))
		return bad(r, ".allow_paths: must be an array of \"METHOD /path\" strings");
	json_array_foreach(v, i, a) {
		const char *e = json_string_value(a), *one[2] = { NULL, NULL }, *why = NULL;
		struct egr_route route = { .mode = EGR_MODE_UPSTREAM, .upstream = "http://x" };
		struct buf entry = BUF_INIT;

		if (!is_plain_string(a) || !json_string_length(a))
			return bad(r, ".allow_paths[%zu]: must be a non-empty string", i);
		if (e[0] == '/') {
			buf_addf(&entry, "POST %s", e);
			if (!r->strict)
				log_warnx(
					NULL,
					"%s.network.allow_paths[%zu]: \"%.200s\" names no method: "
					"taken as \"%.200s\" (that exact path, POST only); write "
					"\"METHOD /path\" entries (docs/providers.md, \"Network\")",
					r->where, i, e, entry.data);
		} else {
			buf_adds(&entry, e);
		}
		one[0] = entry.data;
		route.allow_paths = one;
		if (egr_route_check(&route, &why)) {
			buf_release(&entry);
			return bad(r,
				   ".allow_paths[%zu]: %s (\"METHOD /path\", the path canonical, "
				   "no query; a '*' only at the end, after a '/')",
				   i, why ? why : "refused");
		}
		if (!r->strict && entry.len && entry.data[entry.len - 1] == '*')
			log_warnx(
				NULL,
				"%s.network.allow_paths[%zu]: \"%.200s\" allows every path under "
				"it: a run may reach any API there with the credential the worker "
				"adds",
				r->where, i, entry.data);
		strv_push_take(&r->n->allow_paths, buf_detach(&entry, NULL));
	}
	return 0;
}

static int read_set_headers(struct net_reader *r, const json_t *v)
{
	struct buf value = BUF_INIT, why = BUF_INIT;
	const char *name;
	const json_t *src;
	int ret = 0;

	if (!json_is_object(v))
		return bad(r, ".set_headers: must be an object of header names to sources");
	json_object_foreach((json_t *)v, name, src) {
		const char *form;
		char *lower;

		if (!token_ok(name)) {
			ret = bad(r, ".set_headers.%.100s: is not a header name", name);
			break;
		}
		if (!is_plain_string(src)) {
			ret = bad(r, ".set_headers.%.100s: must be a string", name);
			break;
		}
		if ((form = source_form_error(json_string_value(src)))) {
			ret = bad(r, ".set_headers.%.100s: %s", name, form);
			break;
		}
		lower = xstrdup(name);
		for (char *c = lower; *c; c++)
			*c = (char)tolower((unsigned char)*c);
		strv_push_take(&r->n->hdr_names, lower);
		strv_push(&r->n->hdr_srcs, json_string_value(src));
		/* Readable now? Read again for every run: this only finds a mistake early. */
		buf_reset(&why);
		if (prov_net_resolve(json_string_value(src), &value, &why) &&
		    (ret = soft(r, ".set_headers.%.100s: %s", name, why.data)))
			break;
	}
	wipe(&value);
	buf_release(&value);
	buf_release(&why);
	return ret;
}

int prov_net_read_headers(struct prov_network *n, const json_t *v, const char *where, bool strict,
			  struct buf *err)
{
	struct net_reader r = {
		.n = n, .where = where, .strict = strict, .err = err, .section = ""
	};

	return read_set_headers(&r, v);
}

static int read_upstream(struct net_reader *r, const json_t *o)
{
	const json_t *v = json_object_get(o, "upstream");
	struct prov_network *n = r->n;
	int ret;

	if (!is_plain_string(v))
		return bad(r, ".upstream: must be a base URL (a string)");
	if ((ret = check_url(r, json_string_value(v))))
		return ret;
	n->mode = PROV_NET_UPSTREAM;
	n->upstream = xstrdup(json_string_value(v));
	n->upstream_host = host_of(n->upstream);
	if ((v = json_object_get(o, "set_headers")) && (ret = read_set_headers(r, v)))
		return ret;
	if ((v = json_object_get(o, "allow_paths")) && (ret = read_allow_paths(r, v)))
		return ret;
	if ((v = json_object_get(o, "upstream_ca"))) {
		if (!is_plain_string(v) || json_string_value(v)[0] != '/')
			return bad(r, ".upstream_ca: must be an absolute path");
		n->ca_file = xstrdup(json_string_value(v));
		if (access(n->ca_file, R_OK))
			return soft(r, ".upstream_ca: %s: %s", n->ca_file, strerror(errno));
	}
	return 0;
}

static int read_connect(struct net_reader *r, const json_t *o)
{
	const json_t *v = json_object_get(o, "allow_hosts");
	int ret;

	r->n->mode = PROV_NET_CONNECT;
	if ((ret = read_strings(r, "allow_hosts", v, &r->n->allow_hosts)))
		return ret;
	if (!r->n->allow_hosts.n)
		return bad(r, ".allow_hosts: must list at least one \"host:port\"");
	/* One at a time, so that the message names the entry. */
	for (size_t i = 0; i < r->n->allow_hosts.n; i++) {
		const char *one[] = { r->n->allow_hosts.v[i], NULL }, *why = NULL;
		struct egr_route route = { .mode = EGR_MODE_CONNECT, .allow_hosts = one };

		if (egr_route_check(&route, &why))
			return bad(r, ".allow_hosts[%zu]: %s", i, why ? why : "refused");
	}
	return 0;
}

static int read_object(struct net_reader *r, const json_t *o)
{
	static const char *const keys[] = { "upstream",	   "set_headers", "allow_paths",
					    "upstream_ca", "allow_hosts", NULL };
	const char *key;
	const json_t *v;
	bool up = json_object_get(o, "upstream"), conn = json_object_get(o, "allow_hosts");

	/* A misspelt key would silently leave a path or a credential unchecked. */
	json_object_foreach((json_t *)o, key, v) {
		size_t i;

		for (i = 0; keys[i] && strcmp(keys[i], key); i++)
			;
		if (!keys[i])
			return bad(r,
				   ".%.100s: unknown setting (upstream, set_headers, allow_paths, "
				   "upstream_ca, allow_hosts)",
				   key);
	}
	if (up == conn)
		return bad(r, ": an object needs \"upstream\" (upstream mode) or \"allow_hosts\" "
			      "(CONNECT mode), not both");
	if (conn && json_object_size(o) != 1)
		return bad(r, ": CONNECT mode (\"allow_hosts\") takes no other setting");
	return up ? read_upstream(r, o) : read_connect(r, o);
}

/* The type's network default (struct provider_ops: upstream, allow_paths, model_in_argv,
 * model_aliases), or NULL when it has none (a command, or an override of config.json,
 * checked before its type is known). */
static const struct provider_ops *default_for(const struct prov_provider *pv)
{
	return pv->ops && pv->ops->upstream ? pv->ops : NULL;
}

/* A CLI's default upstream mode. An "env" ANTHROPIC_BASE_URL (a config written before
 * network modes), or the base_url of codex's config.toml, keeps its upstream: that is
 * where the operator meant runs to go. */
static int set_default(struct net_reader *r, struct prov_provider *pv, const struct provider_ops *d)
{
	const char *url = d->upstream;
	ssize_t i = pv->ops && pv->ops->base_url_env
			    ? strv_find(&pv->env_names, pv->ops->base_url_env)
			    : -1;
	char *own = i < 0 && pv->ops && pv->ops->config_upstream && !r->strict
			    ? pv->ops->config_upstream(pv, r->where)
			    : NULL;
	int ret;

	r->n->mode = PROV_NET_UPSTREAM;
	if (own) {
		url = own;
		ret = check_url(r, url);
		if (ret)
			buf_adds(r->err, " (it is the base_url of the provider's config.toml)");
		else
			log_warnx(NULL,
				  "%s: the base_url of its config.toml is taken as the network's "
				  "upstream (%s)",
				  r->where, url);
		r->n->upstream = ret ? NULL : xstrdup(url);
		r->n->upstream_host = ret ? NULL : host_of(url);
		free(own);
		return ret;
	}
	if (i >= 0) {
		url = pv->env_values.v[i];
		if ((ret = check_url(r, url))) {
			buf_addf(r->err, " (it comes from env.%s)", pv->ops->base_url_env);
			return ret;
		}
		if (!r->strict)
			log_warnx(NULL,
				  "%s.env.%s: taken as the network's upstream (%s); move it to "
				  "network.upstream",
				  r->where, pv->ops->base_url_env, url);
	}
	r->n->upstream = xstrdup(url);
	r->n->upstream_host = host_of(url);
	return 0;
}

/* What upstream mode allows when allow_paths is not given: a CLI type's requests; for a
 * command that holds its own credential (no set_headers) any request, since the worker
 * adds nothing a path could spend; a secretless command must list its own. Bodies are
 * checked for the CLI types (EGR_CHECK_BODY), whose calls are all model calls. */
static int upstream_rules(struct net_reader *r, const struct provider_ops *d, bool command)
{
	struct prov_network *n = r->n;

	n->check_body = d != NULL;
	n->check_model = d && d->model_in_argv;
	if (n->allow_paths.n)
		return 0;
	if (d) {
		for (size_t j = 0; d->allow_paths[j]; j++)
			strv_push(&n->allow_paths, d->allow_paths[j]);
		return 0;
	}
	/* config.json's overrides are checked before the type is known: the load says. */
	if (!command)
		return 0;
	if (prov_net_secretless(n))
		return bad(r, ".allow_paths: a command in upstream mode with set_headers must "
			      "list the requests it may make (\"METHOD /path\"): the worker's "
			      "credential goes out on each");
	n->any_path = true;
	return 0;
}

/* The route egress would be given, with dummy header values: what egr_route_check says
 * of it at load is what egr_start would say at every run. */
static int check_route(struct net_reader *r)
{
	struct prov_network *n = r->n;
	struct egr_header *h = xcalloc(n->hdr_names.n + 1, sizeof(*h));
	struct egr_route route = {
		.mode = EGR_MODE_UPSTREAM,
		.upstream = n->upstream,
		.set_headers = h,
		.n_set_headers = n->hdr_names.n,
		.allow_paths = n->allow_paths.n ? (const char *const *)n->allow_paths.v : NULL,
		.ca_file = n->ca_file,
		.flags = (n->any_path ? EGR_ANY_PATH : 0) | (n->check_body ? EGR_CHECK_BODY : 0),
	};
	const char *why = NULL;
	int ret = 0;

	for (size_t i = 0; i < n->hdr_names.n; i++)
		h[i] = (struct egr_header){ n->hdr_names.v[i], "x" };
	if (egr_route_check(&route, &why))
		ret = bad(r, ": %s", why ? why : "refused by the forwarder");
	free(h);
	return ret;
}

/* Settings that upstream mode replaces, said once at load rather than found out later. */
static void warn_overrides(const struct prov_provider *pv, const json_t *v, const char *where)
{
	const struct prov_network *n = &pv->net;

	if (prov_net_secretless(n) && pv->ops && pv->ops->api_key_env &&
	    strv_find(&pv->env_names, pv->ops->api_key_env) >= 0)
		log_warnx(NULL,
			  "%s.env.%s: not given to runs: network.set_headers adds the credential, "
			  "the run holds a placeholder; remove it from env",
			  where, pv->ops->api_key_env);
	if (n->mode == PROV_NET_UPSTREAM && !json_is_object(v) && pv->model_provider &&
	    default_for(pv) && !strcmp(n->upstream, default_for(pv)->upstream))
		log_warnx(NULL,
			  "%s.model_provider: its base_url is replaced by the forwarder's, which "
			  "goes to %s; set network.upstream to the base_url it had",
			  where, n->upstream);
}

int prov_net_read(struct prov_provider *pv, const json_t *v, const char *where, bool strict,
		  struct buf *err)
{
	struct net_reader r = { .n = &pv->net, .where = where, .strict = strict, .err = err };
	const struct provider_ops *d = default_for(pv);
	/* A known type with no default upstream: its program is the operator's (a command). */
	bool command = pv->ops && !d;
	int ret = 0;

	pv->net.mode = PROV_NET_NONE;
	if (!v || json_is_null(v)) {
		if (d)
			ret = set_default(&r, pv, d);
	} else if (json_is_false(v) ||
		   (json_is_string(v) && !strcmp(json_string_value(v), "none"))) {
		pv->net.mode = PROV_NET_NONE;
	} else if (json_is_string(v) && !strcmp(json_string_value(v), "host")) {
		pv->net.mode = PROV_NET_HOST;
	} else if (json_is_true(v)) {
		if (d) {
			ret = set_default(&r, pv, d);
		} else if (command) {
			/* What true meant before network modes; said to be going away. */
			pv->net.mode = PROV_NET_HOST;
			if (!strict)
				log_warnx(NULL,
					  "%s.network: true is deprecated for a command: it means "
					  "\"host\" (the host's whole network); write \"host\", or "
					  "an upstream object",
					  where);
		}
	} else if (json_is_object(v)) {
		ret = read_object(&r, v);
	} else {
		ret = bad(&r, ": must be false, \"none\", \"host\", true, or an object "
			      "({\"upstream\": …} or {\"allow_hosts\": […]})");
	}
	if (!ret && pv->net.mode == PROV_NET_UPSTREAM)
		ret = upstream_rules(&r, d, command);
	if (!ret && pv->net.mode == PROV_NET_UPSTREAM)
		ret = check_route(&r);
	if (!ret && !strict)
		warn_overrides(pv, v, where);
	return ret;
}

void prov_net_models(const struct prov_provider *pv, const char *id, struct strv *out)
{
	const struct provider_ops *d = default_for(pv);
	size_t len = strlen(id);

	if (!pv->net.check_model || !d)
		return;
	/* "claude-sonnet-4-6[1m]": the CLI sends the id without the bracket. */
	if (len && id[len - 1] == ']' && strchr(id, '['))
		len = (size_t)(strchr(id, '[') - id);
	strv_push_take(out, xstrndup(id, len));
	for (size_t i = 0; d->model_aliases && d->model_aliases[i]; i++)
		if (strlen(d->model_aliases[i]) == len && !memcmp(d->model_aliases[i], id, len)) {
			struct buf b = BUF_INIT;

			buf_addf(&b, "%s%s-*", d->alias_prefix ? d->alias_prefix : "",
				 d->model_aliases[i]);
			strv_push_take(out, buf_detach(&b, NULL));
		}
}

void prov_net_release(struct prov_network *n)
{
	free(n->upstream);
	free(n->upstream_host);
	free(n->ca_file);
	strv_release(&n->hdr_names);
	strv_release(&n->hdr_srcs);
	strv_release(&n->allow_paths);
	strv_release(&n->allow_hosts);
	memset(n, 0, sizeof(*n));
}

const char *prov_net_mode_name(enum prov_net mode)
{
	static const char *const names[] = { [PROV_NET_NONE] = "none",
					     [PROV_NET_HOST] = "host",
					     [PROV_NET_UPSTREAM] = "upstream",
					     [PROV_NET_CONNECT] = "connect" };

	return (size_t)mode < ARRAY_SIZE(names) ? names[mode] : "unknown";
}

void prov_provider_net_info(const struct prov_provider *pv, struct prov_net_info *out)
{
	out->mode = prov_net_mode_name(pv->net.mode);
	out->upstream_host = pv->net.mode == PROV_NET_UPSTREAM ? pv->net.upstream_host : NULL;
	out->secretless = prov_net_secretless(&pv->net);
}
