/* Plan helpers shared by the CLI providers: finding the program, binding its install
 * tree and the credentials it needs.
 *
 * The environment is read here (HOME, PATH, OLP_<TYPE>_BIN) on the serving threads, while
 * plans are built: getenv is safe there only because nothing calls setenv, putenv or
 * unsetenv once a worker serves. fcgi/main.c makes the last change before it starts its
 * threads; keep it that way (a variable a request needs is read at start instead). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "providers/cli.h"
#include "common/banned.h"

/* The worker's home, for "~/" in configured paths. */
static const char *host_home(char *tmp, size_t tmpsz)
{
	const char *h = getenv("HOME");
	struct passwd pw, *res = NULL;

	if (h && h[0] == '/')
		return h;
	if (getpwuid_r(getuid(), &pw, tmp, tmpsz, &res) || !res || !res->pw_dir)
		return NULL;
	return res->pw_dir;
}

int prov_cli_expand_home(const char *path, char *out)
{
	return prov_cli_expand_home_in(NULL, path, out);
}

int prov_cli_expand_home_in(const char *home, const char *path, char *out)
{
	char tmp[1024];
	int n;

	if (path[0] == '/') {
		n = snprintf(out, PATH_MAX, "%s", path);
	} else if (path[0] == '~' && path[1] == '/') {
		if (!home && !(home = host_home(tmp, sizeof(tmp))))
			return -ENOENT;
		n = snprintf(out, PATH_MAX, "%s%s", home, path + 1);
	} else {
		return -EINVAL;
	}
	return n > 0 && n < PATH_MAX ? 0 : -ENAMETOOLONG;
}

static bool is_exec_file(const char *path)
{
	struct stat st;

	return !stat(path, &st) && S_ISREG(st.st_mode) && !access(path, X_OK);
}

/* name on the worker's PATH (absolute entries only: a relative one would depend on the
 * worker's working directory). Real path into real. */
static int path_lookup(const char *name, char *real)
{
	const char *path = getenv("PATH"), *p, *colon;
	char cand[PATH_MAX];

	if (!path || !*path)
		path = "/usr/local/bin:/usr/bin:/bin";
	for (p = path; *p; p = *colon ? colon + 1 : colon) {
		int n;

		colon = strchrnul(p, ':');
		if (p[0] != '/')
			continue;
		n = snprintf(cand, sizeof(cand), "%.*s/%s", (int)(colon - p), p, name);
		if (n > 0 && n < (int)sizeof(cand) && is_exec_file(cand) && realpath(cand, real))
			return 0;
	}
	return -ENOENT;
}

static int resolve(const char *what, char *real)
{
	char exp[PATH_MAX];

	if (!strchr(what, '/'))
		return path_lookup(what, real);
	if (prov_cli_expand_home(what, exp) || !is_exec_file(exp) || !realpath(exp, real))
		return -ENOENT;
	return 0;
}

int prov_cli_find(const struct prov_provider *pv, char *real)
{
	const char *env_bin = pv->ops->bin_env ? getenv(pv->ops->bin_env) : NULL;

	if (pv->bin)
		return resolve(pv->bin, real);
	if (env_bin && *env_bin)
		return resolve(env_bin, real);
	return pv->ops->bin_name ? path_lookup(pv->ops->bin_name, real) : -ENOENT;
}

int prov_cli_bind_install(struct sbx_policy *p, const char *real)
{
	const char *nm = NULL, *s, *end;
	char root[PATH_MAX];

	if (!strncmp(real, "/usr/", 5))
		return 0;
	for (s = real; (s = strstr(s, "/node_modules/")); s++)
		nm = s;
	if (!nm)
		return sbx_policy_add_ro(p, real);
	/* The package root: node_modules/<name> or node_modules/@scope/<name>. */
	s = nm + strlen("/node_modules/");
	end = strchr(s, '/');
	if (end && *s == '@')
		end = strchr(end + 1, '/');
	if (!end || (size_t)(end - real) >= sizeof(root))
		return sbx_policy_add_ro(p, real);
	memcpy(root, real, (size_t)(end - real));
	root[end - real] = '\0';
	return sbx_policy_add_ro(p, root);
}

/* The interpreter of a "#!" script: "#!/usr/bin/env node" gives "node", "#!/x/node" gives
 * "/x/node". Empty when path is not a script. */
static void shebang_interp(const char *path, char *interp, size_t size)
{
	char line[256], *s, *e;
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	interp[0] = '\0';
	if (fd < 0)
		return;
	n = read(fd, line, sizeof(line) - 1);
	close(fd);
	if (n < 3 || line[0] != '#' || line[1] != '!')
		return;
	line[n] = '\0';
	s = line + 2 + strspn(line + 2, " \t");
	e = s + strcspn(s, " \t\n");
	if (e - s == 12 && !strncmp(s, "/usr/bin/env", 12)) {
		s = e + strspn(e, " \t");
		e = s + strcspn(s, " \t\n");
	}
	snprintf(interp, size, "%.*s", (int)(e - s), s);
}

int prov_cli_push_program(const struct prov_provider *pv, struct prov_plan *plan,
			  struct prov_outcome *out)
{
	char real[PATH_MAX], interp[256], interp_real[PATH_MAX];
	int ret;

	if (prov_cli_find(pv, real)) {
		snprintf(out->message, sizeof(out->message),
			 "provider %s: program \"%s\" not found (set providers.%s.bin or %s)",
			 pv->name, pv->bin ? pv->bin : pv->ops->bin_name, pv->name,
			 pv->ops->bin_env);
		return -ENOENT;
	}
	shebang_interp(real, interp, sizeof(interp));
	/* A script whose interpreter the sandbox cannot see at the path the "#!" line names
	 * (node under ~/.nvm, say) runs through the interpreter's real path instead. */
	if (interp[0] && (resolve(interp, interp_real) == 0) && strncmp(interp_real, "/usr/", 5)) {
		strv_push(&plan->argv, interp_real);
		if ((ret = prov_cli_bind_install(plan->policy, interp_real)))
			return ret;
	}
	strv_push(&plan->argv, real);
	return prov_cli_bind_install(plan->policy, real);
}

int prov_cli_push_bounded_arg(const struct prov_provider *pv, struct prov_plan *plan,
			      const char *opt, const struct buf *text, struct prov_outcome *out)
{
	if (text->len > PROV_CLI_MAX_ARG) {
		snprintf(out->message, sizeof(out->message),
			 "Provider %s takes a prompt of at most %zu KiB (it is passed on a command "
			 "line); this one is %zu KiB",
			 pv->name, PROV_CLI_MAX_ARG / 1024, (text->len + 1023) / 1024);
		return -E2BIG;
	}
	if (memchr(text->data, '\0', text->len)) {
		snprintf(out->message, sizeof(out->message),
			 "Provider %s cannot take a prompt holding a NUL character (it is passed "
			 "on a command line)",
			 pv->name);
		return -E2BIG;
	}
	strv_push(&plan->argv, opt);
	strv_push(&plan->argv, text->data);
	return 0;
}

int prov_cli_bind_file(struct prov_plan *plan, const char *host, const char *inside, bool writable)
{
	char exp[PATH_MAX];
	int ret;

	if ((ret = prov_cli_expand_home(host, exp)))
		return ret;
	return sbx_policy_add_bind(plan->policy, exp, inside, writable);
}

/* Where a credentials file lands inside: its place relative to the worker's HOME (an
 * account's login dir: home). */
static int inside_for(const char *home, const char *host, char *inside)
{
	char exp[PATH_MAX], tmp[1024];
	size_t hl;
	int ret;

	if (!home)
		home = host_home(tmp, sizeof(tmp));
	if ((ret = prov_cli_expand_home_in(home, host, exp)))
		return ret;
	hl = home ? strlen(home) : 0;
	if (!home || hl < 2 || strncmp(exp, home, hl) || exp[hl] != '/')
		return -EINVAL;
	ret = snprintf(inside, PATH_MAX, "%s%s", SBX_HOME_PATH, exp + hl);
	return ret > 0 && ret < PATH_MAX ? 0 : -ENAMETOOLONG;
}

/* check: NULL for a read-only copy, else a writable one whose write-back it decides. */
static int bind_cred_file(struct prov_plan *plan, const char *home, const char *host,
			  const char *inside, sbx_writeback_check check)
{
	char exp[PATH_MAX];
	int ret;

	if ((ret = prov_cli_expand_home_in(home, host, exp)))
		return ret;
	if (!check)
		return sbx_policy_add_bind(plan->policy, exp, inside, false);
	return sbx_policy_add_bind_checked(plan->policy, exp, inside, check);
}

static int bind_one_credential(struct prov_plan *plan, const char *home, const char *host,
			       const char *rel, sbx_writeback_check check)
{
	char inside[PATH_MAX];
	int n;

	if (!rel)
		return inside_for(home, host, inside)
			       ?: bind_cred_file(plan, home, host, inside, check);
	if (rel[0] == '/')
		n = strncmp(rel, SBX_HOME_PATH "/", sizeof(SBX_HOME_PATH))
			    ? -1
			    : snprintf(inside, sizeof(inside), "%s", rel);
	else
		n = snprintf(inside, sizeof(inside), "%s/%s", SBX_HOME_PATH, rel);
	if (n <= 0 || n >= (int)sizeof(inside))
		return -EINVAL;
	return bind_cred_file(plan, home, host, inside, check);
}

int prov_cli_bind_credentials(const struct prov_provider *pv, const struct prov_request *req,
			      struct prov_plan *plan, struct prov_outcome *out)
{
	const char *const *dflt = pv->ops->credentials;
	/* A login is replaced only by its owner's runs, and only with a file of its own
	 * format: a guest's run must not swap in a login of its choosing (or garbage) that
	 * every later run, the owner's included, would use (ADR 0025). */
	sbx_writeback_check check =
		pv->credentials_writable && req->login_owner ? pv->ops->credentials_ok : NULL;
	size_t i;
	int ret = 0;

	/* The worker adds the credential on the way out: the run gets none at all. */
	if (prov_net_secretless(&pv->net))
		return 0;
	/* A held login: the run gets a placeholder of the login's format (login.c). */
	if (pv->login == PROV_LOGIN_HELD)
		return prov_login_bind(pv, req, plan, out);
	if (!pv->credentials_set) {
		for (i = 0; !ret && dflt && dflt[i]; i++)
			ret = bind_one_credential(plan, pv->home, dflt[i], NULL, check);
		/* A default outside HOME (no HOME at all) is simply not there. */
		return ret == -EINVAL || ret == -ENOENT ? 0 : ret;
	}
	for (i = 0; !ret && i < pv->cred_host.n; i++) {
		const char *inside = pv->cred_inside.v[i];

		ret = bind_one_credential(plan, pv->home, pv->cred_host.v[i],
					  inside[0] ? inside : NULL, check);
	}
	if (ret)
		snprintf(out->message, sizeof(out->message),
			 "provider %s: credentials file %s: %s (a path given without its place "
			 "inside must lie under HOME)",
			 pv->name, pv->cred_host.v[i - 1], strerror(-ret));
	return ret;
}

void prov_cli_split_messages(const json_t *messages, struct buf *system, struct buf *prompt,
			     json_t *blocks)
{
	json_t *sys = json_array(), *rest = json_array(), *m;
	size_t i;

	if (!sys || !rest)
		abort(); /* jansson's allocation failed */
	json_array_foreach(messages, i, m) {
		const char *role = json_string_value(json_object_get(m, "role"));

		if (role && (!strcmp(role, "system") || !strcmp(role, "developer"))) {
			/* As a plain message, so that flattening gives its text without the
			 * "[System]" label: here it becomes the system prompt itself. */
			json_t *plain = json_pack("{s:s, s:O}", "role", "user", "content",
						  json_object_get(m, "content"));

			if (plain)
				json_array_append_new(sys, plain);
		} else {
			json_array_append(rest, m);
		}
	}
	if (system)
		prov_flatten_messages(sys, system);
	if (prompt)
		prov_flatten_messages(rest, prompt);
	if (blocks)
		prov_flatten_blocks(rest, blocks);
	json_decref(sys);
	json_decref(rest);
}

/* A regular file at path ("~/" expands against home, NULL: the worker's). */
static bool file_present(const char *home, const char *path)
{
	char exp[PATH_MAX];
	struct stat st;

	return !prov_cli_expand_home_in(home, path, exp) && !stat(exp, &st) && S_ISREG(st.st_mode);
}

static void cli_state_look(const struct prov_provider *pv, struct prov_cli_state *out)
{
	const char *const *dflt = pv->ops->credentials;
	char real[PATH_MAX];
	size_t i, found = 0;
	ssize_t t;

	*out = (struct prov_cli_state){ .credentials = "not_needed" };
	if (!pv->ops->bin_name) { /* its program is its argv (a command) */
		out->cli_found = pv->argv.n && is_exec_file(pv->argv.v[0]);
		return;
	}
	out->cli_found = !prov_cli_find(pv, real);
	if (prov_net_secretless(&pv->net))
		return;
	/* A long-lived token in env (claude's setup-token; the provider's or an account's)
	 * is the login: no file is read, or only the token's own ("file:/abs"; whether the
	 * worker may read it, its login's last_error says). */
	if (pv->ops->held && pv->ops->held->token_env &&
	    (t = strv_find(&pv->env_names, pv->ops->held->token_env)) >= 0) {
		out->credentials = !prov_login_token_is_file(pv->env_values.v[t]) ||
						   file_present(NULL, pv->env_values.v[t] + 5)
					   ? "present"
					   : "missing";
		return;
	}
	/* Configured files must all be there; of the defaults one is enough (vibe reads its
	 * key from either). */
	if (pv->credentials_set) {
		for (i = 0; i < pv->cred_host.n; i++)
			found += file_present(pv->home, pv->cred_host.v[i]);
		out->credentials =
			pv->cred_host.n && found == pv->cred_host.n ? "present" : "missing";
		return;
	}
	for (i = 0; dflt && dflt[i]; i++)
		found += file_present(pv->home, dflt[i]);
	out->credentials = found ? "present" : "missing";
}

/* The cache word: the time of the look (mono_ms) above bit 8; bit 3: a look was made; bit
 * 2: cli_found; bits 0-1: the index of credentials in creds[]. */
static const char *const creds[] = { "not_needed", "present", "missing" };

void prov_provider_cli_state(const struct prov_provider *pv, struct prov_cli_state *out)
{
	/* The provider is shared by the worker's threads, but this cache is no setting. */
	uint64_t *cache = (uint64_t *)&pv->cli_state_cache;
	uint64_t c = __atomic_load_n(cache, __ATOMIC_RELAXED), now = mono_ms();
	unsigned k;

	if ((c & 8) && now - (c >> 8) < PROV_CLI_STATE_TTL_MS) {
		out->cli_found = c & 4;
		out->credentials = creds[c & 3];
		return;
	}
	cli_state_look(pv, out);
	for (k = 0; k < ARRAY_SIZE(creds) - 1 && strcmp(creds[k], out->credentials); k++)
		;
	__atomic_store_n(cache, now << 8 | 8 | (out->cli_found ? 4 : 0) | k, __ATOMIC_RELAXED);
}
