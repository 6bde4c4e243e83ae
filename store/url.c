/* store: where the shared store is (store.h): OLP_STORE or config.json's "store", and
 * what such a URL may hold. A password in it is refused: config.json and the environment
 * are read by more than the database driver (a process listing shows an environment to
 * its user, a backup of OLP_HOME carries config.json), while a passfile is one 0600 file
 * libpq alone reads. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "common/common.h"
#include "store/store.h"
#include "common/banned.h"

static bool has_scheme(const char *url)
{
	return !strncmp(url, "postgresql://", 13) || !strncmp(url, "postgres://", 11);
}

int store_url_check(const char *url, struct buf *err)
{
	PQconninfoOption *opts, *o;
	char *perr = NULL;
	int ret = 0;

	if (!url || !*url || !has_scheme(url)) {
		buf_adds(err, "the store must be a postgresql://USER@HOST:PORT/DB URL");
		return -1;
	}
	opts = PQconninfoParse(url, &perr);
	if (!opts) {
		/* libpq's message quotes no part of the URL's user info. */
		buf_addf(err, "the store URL does not parse: %s", perr ? perr : "out of memory");
		PQfreemem(perr);
		return -1;
	}
	for (o = opts; o->keyword; o++) {
		if (!strcmp(o->keyword, "password") && o->val && *o->val) {
			buf_adds(err, "the store URL holds a password: put it in a 0600 passfile "
				      "(config.json \"store_passfile\", or PGPASSFILE) instead");
			ret = -1;
			break;
		}
	}
	PQconninfoFree(opts);
	return ret;
}

void store_url_public(const char *url, char *out, size_t n)
{
	const char *host = "", *port = "", *db = "";
	PQconninfoOption *opts, *o;

	if (!n)
		return;
	*out = '\0';
	opts = url ? PQconninfoParse(url, NULL) : NULL;
	if (!opts)
		return;
	for (o = opts; o->keyword; o++) {
		if (!o->val)
			continue;
		if (!strcmp(o->keyword, "host"))
			host = o->val;
		else if (!strcmp(o->keyword, "port"))
			port = o->val;
		else if (!strcmp(o->keyword, "dbname"))
			db = o->val;
	}
	(void)snprintf(out, n, "postgresql://%s%s%s/%s", host, *port ? ":" : "", port, db);
	PQconninfoFree(opts);
}

/* config.json's string field name, or NULL when absent; -1 when present and not one. */
static int config_string(json_t *root, const char *name, const char *path, char **out,
			 struct buf *err)
{
	json_t *v = json_object_get(root, name);

	*out = NULL;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v) || !*json_string_value(v)) {
		buf_addf(err, "%s: \"%s\" must be a non-empty string", path, name);
		return -1;
	}
	*out = xstrdup(json_string_value(v));
	return 0;
}

int store_url_resolve(const char *olp_home, char **url, char **passfile, struct buf *err)
{
	const char *env = getenv("OLP_STORE");
	char *path, *from_file = NULL;
	json_error_t jerr;
	json_t *root;
	int ret = 0;

	*url = NULL;
	*passfile = NULL;
	path = path_join(olp_home, "config.json");
	root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (!root && access(path, F_OK) == 0) {
		buf_addf(err, "%s: line %d: %s", path, jerr.line, jerr.text);
		ret = -1;
		goto out;
	}
	if (root && !json_is_object(root)) {
		buf_addf(err, "%s: not a JSON object", path);
		ret = -1;
		goto out;
	}
	if (root && (config_string(root, "store", path, &from_file, err) ||
		     config_string(root, "store_passfile", path, passfile, err))) {
		ret = -1;
		goto out;
	}
	if (env && *env) {
		free(from_file);
		from_file = xstrdup(env);
	}
	if (from_file) {
		struct buf why = BUF_INIT;

		if (store_url_check(from_file, &why)) {
			/* Name where the URL came from, as every configuration error does. */
			if (env && *env)
				buf_addf(err, "OLP_STORE: %s", why.data);
			else
				buf_addf(err, "%s: store: %s", path, why.data);
			ret = -1;
		}
		buf_release(&why);
		if (ret)
			goto out;
	}
	*url = steal_pointer(&from_file);
out:
	if (ret) {
		free(*passfile);
		*passfile = NULL;
	}
	free(from_file);
	json_decref(root);
	free(path);
	return ret;
}
