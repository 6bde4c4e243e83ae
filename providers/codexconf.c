/* codex's own config.toml, read once at load for the one thing OLP must know (ADR 0025,
 * item 14): which base URL its model provider talks to. In upstream mode every run's
 * provider base_url is replaced by the forwarder's, and the forwarder goes to the
 * provider's network.upstream; without this, a config.toml that sends codex to a provider
 * of the owner's choosing (model_provider = "x", [model_providers.x] base_url = …) would
 * have been re-routed to api.openai.com without a word, prompts and all. That base_url
 * becomes the upstream instead, as claude's env ANTHROPIC_BASE_URL does.
 *
 * Only the subset of TOML that names it is read: tables ([a.b], quoted keys too), dotted
 * keys, and basic or literal strings; every other value is passed over (a multi-line
 * string is skipped whole). "profile" and [profiles.<p>] model_provider are followed as
 * codex follows them. What cannot be read this way is said in a warning, and the type's
 * default upstream holds. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "providers/internal.h"
#include "common/banned.h"

#define TOML_MAX ((size_t)1 << 20)

/* What the file says, as far as the upstream goes. */
struct codex_conf {
	char *model_provider;	/* top-level model_provider */
	char *profile;		/* top-level profile */
	struct strv profile_mp; /* pairs: profile, its model_provider */
	struct strv base_urls;	/* pairs: model provider id, its base_url */
	bool unread;		/* a line that matters could not be read */
};

static void conf_release(struct codex_conf *c)
{
	free(c->model_provider);
	free(c->profile);
	strv_release(&c->profile_mp);
	strv_release(&c->base_urls);
}

static const char *skip_ws(const char *s)
{
	return s + strspn(s, " \t");
}

/* One key segment (bare, "basic" or 'literal') into seg; the rest after it, or NULL. */
static const char *read_key(const char *s, struct buf *seg)
{
	static const char bare[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";
	size_t n;

	buf_reset(seg);
	s = skip_ws(s);
	if (*s == '"' || *s == '\'') {
		const char *e = strchr(s + 1, *s);

		if (!e || (*s == '"' && memchr(s + 1, '\\', (size_t)(e - s - 1))))
			return NULL; /* escapes in a key: not in any file we need to read */
		buf_add(seg, s + 1, (size_t)(e - s - 1));
		return skip_ws(e + 1);
	}
	n = strspn(s, bare);
	if (!n)
		return NULL;
	buf_add(seg, s, n);
	return skip_ws(s + n);
}

/* A dotted key up to stop ('=' or ']') into path; the rest after stop, or NULL. */
static const char *read_path(const char *s, char stop, struct strv *path)
{
	struct buf seg = BUF_INIT;

	for (;;) {
		if (!(s = read_key(s, &seg)))
			break;
		strv_push(path, seg.data);
		if (*s == '.') {
			s++;
			continue;
		}
		s = *s == stop ? s + 1 : NULL;
		break;
	}
	buf_release(&seg);
	return s;
}

/* A string value into out: 1, 0 when the value is not a one-line string, -1 when it
 * opens a multi-line string (the caller skips to its end: *delim is its delimiter). */
static int read_string_value(const char *s, struct buf *out, const char **delim)
{
	const char *e;

	buf_reset(out);
	if (!strncmp(s, "\"\"\"", 3) || !strncmp(s, "'''", 3)) {
		*delim = s[0] == '"' ? "\"\"\"" : "'''";
		return strstr(s + 3, *delim) ? 0 : -1;
	}
	if (*s == '\'') {
		if (!(e = strchr(s + 1, '\'')))
			return 0;
		buf_add(out, s + 1, (size_t)(e - s - 1));
		return 1;
	}
	if (*s != '"')
		return 0;
	for (e = s + 1; *e && *e != '"'; e++) {
		if (*e == '\\') {
			/* The escapes a URL or an id may need; any other: not read. */
			if (e[1] != '"' && e[1] != '\\' && e[1] != '/')
				return 0;
			e++;
		}
		buf_addch(out, *e);
	}
	return *e == '"';
}

static bool path_is(const struct strv *p, size_t n, const char *a, const char *b)
{
	return p->n == n && !strcmp(p->v[0], a) && (!b || !strcmp(p->v[n - 1], b));
}

/* One key = value line, under table. */
static int conf_line(struct codex_conf *c, const struct strv *table, const char *line,
		     const char **delim)
{
	struct strv path = STRV_INIT;
	struct buf val = BUF_INIT;
	const char *s;
	int got = 0;

	for (size_t i = 0; i < table->n; i++)
		strv_push(&path, table->v[i]);
	s = read_path(line, '=', &path);
	if (s)
		got = read_string_value(skip_ws(s), &val, delim);
	if (!s || got < 0)
		goto out;
	if (path_is(&path, 1, "model_provider", NULL) && got) {
		free(c->model_provider);
		c->model_provider = buf_detach(&val, NULL);
	} else if (path_is(&path, 1, "profile", NULL) && got) {
		free(c->profile);
		c->profile = buf_detach(&val, NULL);
	} else if (path_is(&path, 3, "profiles", "model_provider") && got) {
		strv_push(&c->profile_mp, path.v[1]);
		strv_push(&c->profile_mp, val.data);
	} else if (path_is(&path, 3, "model_providers", "base_url")) {
		if (!got)
			c->unread = true; /* a base_url that is not a plain string */
		strv_push(&c->base_urls, path.v[1]);
		strv_push(&c->base_urls, got ? val.data : "");
	} else if (path_is(&path, 2, "model_providers", NULL) &&
		   *skip_ws(strchr(line, '=') + 1) == '{') {
		c->unread = true; /* an inline table: its base_url is not read here */
	}
out:
	strv_release(&path);
	buf_release(&val);
	return got;
}

static void conf_parse(struct codex_conf *c, char *text)
{
	struct strv table = STRV_INIT;
	const char *delim = NULL;

	for (char *line = text, *next; line; line = next) {
		const char *s;

		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		if (delim) { /* inside a multi-line string */
			if (strstr(line, delim))
				delim = NULL;
			continue;
		}
		s = skip_ws(line);
		if (!*s || *s == '#')
			continue;
		if (*s == '[') {
			strv_release(&table);
			/* [[array.of.tables]] holds nothing we read: a table of no name. */
			if (s[1] == '[' || !read_path(s + 1, ']', &table)) {
				strv_release(&table);
				strv_push(&table, "");
			}
			continue;
		}
		if (strchr(s, '='))
			(void)conf_line(c, &table, s, &delim);
	}
	strv_release(&table);
}

static const char *pair_get(const struct strv *pairs, const char *key)
{
	for (size_t i = 0; i + 1 < pairs->n; i += 2)
		if (!strcmp(pairs->v[i], key))
			return pairs->v[i + 1];
	return NULL;
}

/* An id codex_plan can put in a TOML key path (as read_model_provider checks). */
static bool id_ok(const char *s)
{
	static const char ok[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-";

	return *s && strspn(s, ok) == strlen(s) && strlen(s) < 64;
}

/* The file's text ("~/" against the worker's HOME), or NULL when there is none. */
static char *load(const char *path)
{
	struct buf b = BUF_INIT;
	char exp[PATH_MAX];
	const char *home = getenv("HOME");
	int n = -1;

	if (path[0] == '/')
		n = snprintf(exp, sizeof(exp), "%s", path);
	else if (home && home[0] == '/')
		n = snprintf(exp, sizeof(exp), "%s%s", home, path + 1);
	if (n <= 0 || n >= (int)sizeof(exp) || buf_read_file(&b, exp, TOML_MAX)) {
		buf_release(&b);
		return NULL;
	}
	return buf_detach(&b, NULL);
}

char *prov_codex_config_upstream(struct prov_provider *pv, const char *where)
{
	const char *file = pv->config_toml ? pv->config_toml : "~/.codex/config.toml";
	struct codex_conf c = { .profile_mp = STRV_INIT, .base_urls = STRV_INIT };
	const char *mp, *url;
	char *text, *ret = NULL;

	if (pv->config_toml_off || !(text = load(file)))
		return NULL;
	conf_parse(&c, text);
	free(text);
	/* As codex chooses: the provider's own "model_provider" (passed with -c), else the
	 * profile's, else the file's. */
	mp = pv->model_provider;
	if (!mp && c.profile)
		mp = pair_get(&c.profile_mp, c.profile);
	if (!mp)
		mp = c.model_provider;
	url = mp ? pair_get(&c.base_urls, mp) : NULL;
	if (url && *url && id_ok(mp)) {
		ret = xstrdup(url);
		if (!pv->model_provider)
			pv->model_provider = xstrdup(mp);
	} else if (mp && (url || c.unread || !id_ok(mp))) {
		log_warnx(NULL,
			  "%s: %s names model provider \"%.64s\" whose base_url OLP cannot read; "
			  "runs go to this provider's network upstream instead: set "
			  "network.upstream to its base_url",
			  where, file, mp);
	} else if (mp && strcmp(mp, "openai")) {
		log_warnx(NULL,
			  "%s: %s names model provider \"%.64s\" with no base_url there; runs go "
			  "to this provider's network upstream instead: set network.upstream",
			  where, file, mp);
	}
	conf_release(&c);
	return ret;
}
