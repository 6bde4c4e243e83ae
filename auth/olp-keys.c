/* olp-keys: create, list and revoke OLP API keys in $OLP_HOME/keys.
 * Exit codes: 0 done, 1 failed, 2 usage. The token is printed once, at keygen. */
#include <errno.h>
#include <stddef.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "auth/auth.h"
#include "common/common.h"
#include "common/banned.h"

#define EXIT_USAGE 2

static const char usage_text[] =
	"usage: olp-keys [--olp-home=DIR] [--json] COMMAND [OPTIONS]\n"
	"\n"
	"Commands:\n"
	"  keygen --owner | --name=NAME [--tier=owner|guest] [--providers=a,b] [--notes=TEXT]\n"
	"         [--force]          create a key and print its token (once)\n"
	"  list [--owner-only] [--include-revoked]\n"
	"                            list keys (never their hashes)\n"
	"  revoke --id=ID            revoke a key; workers refuse it on the next request\n"
	"\n"
	"Options (anywhere on the line; --flag=value and --flag value both work):\n"
	"  --olp-home=DIR  the OLP home (default: $OLP_HOME, else ~/.olp)\n"
	"  --json          machine-readable output on stdout\n"
	"  --help          show this text\n"
	"\n"
	"keygen --owner creates an owner key named \"owner\" (like the Node OLP) and refuses a\n"
	"second active owner unless --force is given. --name alone creates a guest key.\n"
	"Exit status: 0 done, 1 failed, 2 usage error.\n";

enum cmd { CMD_NONE, CMD_KEYGEN, CMD_LIST, CMD_REVOKE };

struct opts {
	enum cmd cmd;
	const char *olp_home;
	bool json;
	bool help;
	/* keygen */
	bool owner;
	const char *name;
	const char *tier;
	const char *providers;
	const char *notes;
	bool force;
	/* list */
	bool owner_only;
	bool include_revoked;
	/* revoke */
	const char *id;
};

enum opt_kind { OPT_FLAG, OPT_VALUE };

struct opt_def {
	const char *name;
	enum opt_kind kind;
	enum cmd only; /* CMD_NONE: valid with every command */
	size_t field;  /* offsetof into struct opts */
};

#define FLAG(n, c, f)                                    \
	{                                                \
		n, OPT_FLAG, c, offsetof(struct opts, f) \
	}
#define VALUE(n, c, f)                                    \
	{                                                 \
		n, OPT_VALUE, c, offsetof(struct opts, f) \
	}

static const struct opt_def opt_defs[] = {
	VALUE("olp-home", CMD_NONE, olp_home),
	FLAG("json", CMD_NONE, json),
	FLAG("help", CMD_NONE, help),
	FLAG("owner", CMD_KEYGEN, owner),
	VALUE("name", CMD_KEYGEN, name),
	VALUE("tier", CMD_KEYGEN, tier),
	VALUE("providers", CMD_KEYGEN, providers),
	VALUE("notes", CMD_KEYGEN, notes),
	FLAG("force", CMD_KEYGEN, force),
	FLAG("owner-only", CMD_LIST, owner_only),
	FLAG("include-revoked", CMD_LIST, include_revoked),
	VALUE("id", CMD_REVOKE, id),
};

static const char *const cmd_names[] = { "", "keygen", "list", "revoke" };

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
	va_list ap;

	(void)fputs("olp-keys: ", stderr);
	va_start(ap, fmt);
	(void)vfprintf(stderr, fmt, ap);
	va_end(ap);
	(void)fputs("\nTry 'olp-keys --help'.\n", stderr);
	return EXIT_USAGE;
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
	va_list ap;

	(void)fputs("olp-keys: ", stderr);
	va_start(ap, fmt);
	(void)vfprintf(stderr, fmt, ap);
	va_end(ap);
	(void)fputc('\n', stderr);
	return EXIT_FAILURE;
}

static const struct opt_def *opt_find(const char *name, size_t len)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(opt_defs); i++)
		if (strlen(opt_defs[i].name) == len && memcmp(opt_defs[i].name, name, len) == 0)
			return &opt_defs[i];
	return NULL;
}

/* Options may come before or after the command; their validity against the command is
 * checked once the whole line is read. Returns 0 or EXIT_USAGE. */
static int parse_args(int argc, char **argv, struct opts *o)
{
	unsigned long seen = 0; /* bit i: opt_defs[i] was given */
	size_t i;
	int a;

	for (a = 1; a < argc; a++) {
		const char *arg = argv[a], *eq, *val = NULL;
		const struct opt_def *d;

		if (strcmp(arg, "-h") == 0) {
			o->help = true;
			continue;
		}
		if (strncmp(arg, "--", 2) != 0) {
			if (o->cmd != CMD_NONE)
				return usage_error("unexpected argument '%s'", arg);
			for (i = 1; i < ARRAY_SIZE(cmd_names); i++)
				if (strcmp(arg, cmd_names[i]) == 0)
					o->cmd = (enum cmd)i;
			if (o->cmd == CMD_NONE)
				return usage_error("unknown command '%s'", arg);
			continue;
		}
		eq = strchr(arg + 2, '=');
		d = opt_find(arg + 2, eq ? (size_t)(eq - arg - 2) : strlen(arg + 2));
		if (!d)
			return usage_error("unknown option '%s'", arg);
		if (d->kind == OPT_FLAG) {
			if (eq)
				return usage_error("option '--%s' takes no value", d->name);
			*(bool *)((char *)o + d->field) = true;
		} else {
			if (eq) {
				val = eq + 1;
			} else if (a + 1 < argc) {
				val = argv[++a];
			} else {
				return usage_error("option '--%s' needs a value", d->name);
			}
			if (!*val)
				return usage_error("option '--%s' needs a non-empty value",
						   d->name);
			*(const char **)((char *)o + d->field) = val;
		}
		seen |= 1ul << (d - opt_defs);
	}
	if (o->help)
		return 0;
	if (o->cmd == CMD_NONE)
		return usage_error("no command given");
	for (i = 0; i < ARRAY_SIZE(opt_defs); i++)
		if ((seen & (1ul << i)) && opt_defs[i].only != CMD_NONE &&
		    opt_defs[i].only != o->cmd)
			return usage_error("option '--%s' does not apply to '%s'", opt_defs[i].name,
					   cmd_names[o->cmd]);
	return 0;
}

/* --olp-home, else $OLP_HOME, else ~/.olp. Returns a heap string or NULL. */
static char *resolve_home(const struct opts *o)
{
	const char *env = getenv("OLP_HOME"), *home = getenv("HOME");
	struct passwd *pw;
	struct buf b = BUF_INIT;

	if (o->olp_home)
		return xstrdup(o->olp_home);
	if (env && *env)
		return xstrdup(env);
	if (!home || !*home) {
		pw = getpwuid(getuid());
		home = pw ? pw->pw_dir : NULL;
	}
	if (!home)
		return NULL;
	buf_addf(&b, "%s/.olp", home);
	return buf_detach(&b, NULL);
}

static void print_json(json_t *v)
{
	char *s = json_dumps(v, JSON_INDENT(2));

	if (s) {
		puts(s);
		free(s);
	}
	json_decref(v);
}

/* Append the names of the comma-separated list s to v: -EINVAL on an empty name. */
static int split_providers(const char *s, struct strv *v)
{
	const char *comma;

	for (;; s = comma + 1) {
		size_t len;

		comma = strchr(s, ',');
		len = comma ? (size_t)(comma - s) : strlen(s);
		if (!len)
			return -EINVAL;
		strv_push_take(v, xstrndup(s, len));
		if (!comma)
			return 0;
	}
}

static int cmd_keygen(const struct opts *o, const char *home)
{
	struct auth_key_spec spec = { .tier = AUTH_TIER_GUEST,
				      .notes = o->notes,
				      .force = o->force };
	struct auth_new_key key;
	struct buf msg = BUF_INIT;
	enum auth_key_result r;
	struct strv prov = STRV_INIT;
	int rc = EXIT_FAILURE;

	if (!o->owner && !o->name)
		return usage_error("keygen needs --owner or --name=NAME");
	if (o->tier) {
		if (strcmp(o->tier, "owner") == 0)
			spec.tier = AUTH_TIER_OWNER;
		else if (strcmp(o->tier, "guest") != 0)
			return usage_error("--tier is owner or guest, not '%s'", o->tier);
	}
	if (o->owner) {
		if (o->tier && spec.tier != AUTH_TIER_OWNER)
			return usage_error("--owner contradicts --tier=%s", o->tier);
		spec.tier = AUTH_TIER_OWNER;
	}
	/* The Node OLP names its owner key "owner"; --name overrides. */
	spec.name = o->name ? o->name : "owner";
	if (o->providers && strcmp(o->providers, "*") != 0) {
		if (split_providers(o->providers, &prov)) {
			strv_release(&prov);
			return usage_error("--providers is a comma-separated list of names");
		}
		spec.providers = (const char *const *)prov.v;
		spec.n_providers = prov.n;
	}
	r = auth_key_create(home, &spec, &key, &msg);
	if (r) {
		rc = fail("keygen: %s", msg.len ? msg.data : auth_key_strerror(r));
		goto out_free;
	}
	if (o->json) {
		print_json(json_pack("{s:s, s:s, s:s, s:s}", "id", key.id, "name", spec.name,
				     "owner_tier", auth_tier_name(spec.tier), "token", key.token));
	} else {
		printf("Created %s key %s (name \"%s\", providers %s).\n",
		       auth_tier_name(spec.tier), key.id, spec.name,
		       o->providers ? o->providers : "*");
		printf("Token (shown only now; store it safely, it cannot be recovered):\n%s\n",
		       key.token);
	}
	/* The token is shown only here: a failed write must not exit 0. */
	if (fflush(stdout) != 0 || ferror(stdout))
		rc = fail("could not write the token of key %s (%s); revoke it", key.id,
			  strerror(errno));
	else
		rc = EXIT_SUCCESS;
	auth_new_key_wipe(&key);
out_free:
	strv_release(&prov);
	buf_release(&msg);
	return rc;
}

static json_t *json_str_or_null(const char *s)
{
	return s ? json_string(s) : json_null();
}

static json_t *key_to_json(const struct auth_key_info *k)
{
	json_t *prov;
	size_t i;

	if (k->all_providers) {
		prov = json_string("*");
	} else {
		prov = json_array();
		for (i = 0; i < k->n_providers; i++)
			json_array_append_new(prov, json_string(k->providers[i]));
	}
	return json_pack("{s:s, s:o, s:s, s:o, s:o, s:o, s:o, s:o}", "id", k->id, "name",
			 json_str_or_null(k->name), "owner_tier", auth_tier_name(k->tier),
			 "providers_enabled", prov, "created_at", json_str_or_null(k->created_at),
			 "last_used_at", json_str_or_null(k->last_used_at), "revoked_at",
			 json_str_or_null(k->revoked_at), "notes", json_str_or_null(k->notes));
}

static void providers_text(const struct auth_key_info *k, struct buf *b)
{
	size_t i;

	buf_reset(b);
	if (k->all_providers) {
		buf_adds(b, "*");
		return;
	}
	for (i = 0; i < k->n_providers; i++)
		buf_addf(b, "%s%s", i ? "," : "", k->providers[i]);
	if (!k->n_providers)
		buf_adds(b, "(none)");
}

static int cmd_list(const struct opts *o, const char *home)
{
	struct auth_key_list list;
	struct buf msg = BUF_INIT, prov = BUF_INIT;
	enum auth_key_result r;
	json_t *arr = NULL;
	size_t i;

	r = auth_key_list(home, &list, &msg);
	if (r) {
		int rc = fail("list: %s", msg.len ? msg.data : auth_key_strerror(r));

		buf_release(&msg);
		return rc;
	}
	if (o->json)
		arr = json_array();
	else
		printf("%-10s %-20s %-6s %-20s %-24s %-24s %s\n", "ID", "NAME", "TIER", "PROVIDERS",
		       "CREATED", "LAST USED", "STATUS");
	for (i = 0; i < list.n; i++) {
		const struct auth_key_info *k = &list.keys[i];

		if ((o->owner_only && k->tier != AUTH_TIER_OWNER) ||
		    (!o->include_revoked && k->revoked))
			continue;
		if (arr) {
			json_array_append_new(arr, key_to_json(k));
			continue;
		}
		providers_text(k, &prov);
		printf("%-10s %-20s %-6s %-20s %-24s %-24s %s\n", k->id, k->name ? k->name : "",
		       auth_tier_name(k->tier), prov.data, k->created_at ? k->created_at : "-",
		       k->last_used_at ? k->last_used_at : "never",
		       k->revoked ? "revoked" : "active");
	}
	if (arr)
		print_json(arr);
	auth_key_list_release(&list);
	buf_release(&msg);
	buf_release(&prov);
	return EXIT_SUCCESS;
}

static int cmd_revoke(const struct opts *o, const char *home)
{
	struct buf msg = BUF_INIT;
	enum auth_key_result r;
	bool was = false;
	int rc = EXIT_SUCCESS;

	if (!o->id)
		return usage_error("revoke needs --id=ID");
	r = auth_key_revoke(home, o->id, &was, &msg);
	if (r) {
		rc = fail("revoke: %s", msg.len ? msg.data : auth_key_strerror(r));
	} else if (o->json) {
		print_json(json_pack("{s:s, s:b, s:b}", "id", o->id, "revoked", 1,
				     "already_revoked", was));
	} else {
		printf(was ? "Key %s was already revoked.\n" : "Revoked key %s.\n", o->id);
	}
	buf_release(&msg);
	return rc;
}

int main(int argc, char **argv)
{
	struct opts o = { .cmd = CMD_NONE };
	char *home;
	int rc;

	log_set_program("olp-keys");
	rc = parse_args(argc, argv, &o);
	if (rc)
		return rc;
	if (o.help) {
		(void)fputs(usage_text, stdout);
		return EXIT_SUCCESS;
	}
	home = resolve_home(&o);
	if (!home)
		return fail(
			"cannot tell where the OLP home is: pass --olp-home=DIR or set OLP_HOME");
	/* Files we create are ours alone whatever the caller's umask. */
	umask(077);
	switch (o.cmd) {
	case CMD_KEYGEN: rc = cmd_keygen(&o, home); break;
	case CMD_LIST: rc = cmd_list(&o, home); break;
	case CMD_REVOKE: rc = cmd_revoke(&o, home); break;
	case CMD_NONE: rc = EXIT_USAGE; break;
	}
	free(home);
	return rc;
}
