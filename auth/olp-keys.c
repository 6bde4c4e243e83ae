/* olp-keys: create, list and revoke OLP API keys in $OLP_HOME/keys, or in the PostgreSQL
 * store config.json (or OLP_STORE) names (ADR 0034), set their quotas, report their usage
 * from the ledger ($OLP_HOME/usage.db, usage/usage.h), create or upgrade the store's
 * schema and copy a file store into it.
 * Exit codes: 0 done, 1 failed, 2 usage. The token is printed once, at keygen. */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "auth/auth.h"
#include "common/common.h"
#include "providers/providers.h"
#include "store/store.h"
#include "usage/usage.h"
#include "common/banned.h"

#define EXIT_USAGE 2

static const char usage_text[] =
	"usage: olp-keys [--olp-home=DIR] [--json] COMMAND [OPTIONS]\n"
	"\n"
	"Commands:\n"
	"  keygen --owner | --name=NAME [--tier=owner|guest] [--providers=a,b] [--notes=TEXT]\n"
	"         [--quota-rpm=N] [--quota-rpd=N] [--quota-tpd=N] [--quota-concurrent=N]\n"
	"         [--allow-login=a,b] [--force]\n"
	"                            create a key and print its token (once)\n"
	"  list [--owner-only] [--include-revoked]\n"
	"                            list keys and their quotas (never their hashes)\n"
	"  revoke --id=ID            revoke a key; workers refuse it on the next request\n"
	"  set-quota --id=ID [--quota-rpm=N|none] [--quota-rpd=N|none] [--quota-tpd=N|none]\n"
	"            [--concurrent=N|none] [--clear]\n"
	"                            change a key's quota; workers apply it on the next request\n"
	"  set-login --id=ID (--allow=a,b | --deny=a,b | --clear)\n"
	"                            let a guest key reach providers' logins, or take it back\n"
	"  set-account --id=ID (PROVIDER=ACCOUNT | --clear PROVIDER)\n"
	"                            bind a key's requests to one of a provider's accounts\n"
	"                            (keygen: --account=PROVIDER=ACCOUNT[,...]), or unbind\n"
	"  usage [--id=ID] [--since=YYYY-MM-DD] [--account=ACCOUNT]\n"
	"                            requests and tokens per key, provider, account and UTC\n"
	"                            day (--account: that account's only)\n"
	"  store init [--worker-role=ROLE]\n"
	"                            create or upgrade the PostgreSQL store's schema and grant\n"
	"                            ROLE (the workers') data rights only\n"
	"  store status              the store, whether it answers, its schema versions\n"
	"  migrate --to=postgresql://USER@HOST:PORT/DB\n"
	"                            copy the key files into that store (safe to re-run)\n"
	"\n"
	"Options (anywhere on the line; --flag=value and --flag value both work):\n"
	"  --olp-home=DIR  the OLP home (default: $OLP_HOME, else ~/.olp)\n"
	"  --json          machine-readable output on stdout\n"
	"  --help          show this text\n"
	"\n"
	"keygen --owner creates an owner key named \"owner\" (like the Node OLP) and refuses a\n"
	"second active owner unless --force is given. --name alone creates a guest key.\n"
	"Quotas: --quota-rpm requests per minute, --quota-rpd requests per day, --quota-tpd\n"
	"tokens (prompt + completion) per day, in fixed UTC minutes and days, shared by all\n"
	"the workers of the host; N is 1 to 10^15, none removes the limit. --quota-concurrent\n"
	"(set-quota: --concurrent) is how many chat completions of the key may run at once on\n"
	"the host, 1 to 1024. set-quota changes only the limits given (--clear removes them\n"
	"all first).\n"
	"Logins: a provider whose CLI runs commands itself (codex, vibe, claude with its own\n"
	"tools on) and whose runs are given its login (credential files) serves owner keys\n"
	"only: the model can read those files and show them to whoever asked. --allow-login\n"
	"(set-login --allow) lets a guest key use such a provider anyway; that key's prompts\n"
	"can then read the login.\n"
	"Store: with config.json \"store\" (or OLP_STORE) set to a postgresql:// URL, every\n"
	"command works on that database instead of $OLP_HOME/keys; the password comes from\n"
	"config.json \"store_passfile\", PGPASSFILE or ~/.pgpass, never from the URL. Run\n"
	"\"store init\" as a role that may create tables.\n"
	"Exit status: 0 done, 1 failed, 2 usage error.\n";

enum cmd {
	CMD_NONE,
	CMD_KEYGEN,
	CMD_LIST,
	CMD_REVOKE,
	CMD_SET_QUOTA,
	CMD_USAGE,
	CMD_SET_LOGIN,
	CMD_STORE,
	CMD_MIGRATE,
	CMD_SET_ACCOUNT,
};

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
	/* revoke, set-quota, usage */
	const char *id;
	/* keygen, set-quota */
	const char *quota_rpm;
	const char *quota_rpd;
	const char *quota_tpd;
	const char *quota_concurrent;
	bool clear;
	/* keygen (allow_login), set-login */
	const char *allow_login;
	const char *deny_login;
	/* keygen (--account), usage (--account: one account's rows), set-account
	 * (PROVIDER=ACCOUNT, or PROVIDER with --clear) */
	const char *account;
	const char *binding;
	/* usage */
	const char *since;
	/* store init|status */
	const char *store_sub;
	const char *worker_role;
	/* migrate */
	const char *to;
};

enum opt_kind { OPT_FLAG, OPT_VALUE };

struct opt_def {
	const char *name;
	enum opt_kind kind;
	unsigned only; /* the commands it applies to (1 << enum cmd); 0: every command */
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

#define ALL 0u
#define KEYGEN (1u << CMD_KEYGEN)
#define LIST (1u << CMD_LIST)
#define REVOKE (1u << CMD_REVOKE)
#define SET_QUOTA (1u << CMD_SET_QUOTA)
#define USAGE (1u << CMD_USAGE)
#define SET_LOGIN (1u << CMD_SET_LOGIN)
#define STORE (1u << CMD_STORE)
#define MIGRATE (1u << CMD_MIGRATE)
#define SET_ACCOUNT (1u << CMD_SET_ACCOUNT)

static const struct opt_def opt_defs[] = {
	VALUE("olp-home", ALL, olp_home),
	FLAG("json", ALL, json),
	FLAG("help", ALL, help),
	FLAG("owner", KEYGEN, owner),
	VALUE("name", KEYGEN, name),
	VALUE("tier", KEYGEN, tier),
	VALUE("providers", KEYGEN, providers),
	VALUE("notes", KEYGEN, notes),
	FLAG("force", KEYGEN, force),
	FLAG("owner-only", LIST, owner_only),
	FLAG("include-revoked", LIST, include_revoked),
	VALUE("id", REVOKE | SET_QUOTA | USAGE | SET_LOGIN | SET_ACCOUNT, id),
	VALUE("quota-rpm", KEYGEN | SET_QUOTA, quota_rpm),
	VALUE("quota-rpd", KEYGEN | SET_QUOTA, quota_rpd),
	VALUE("quota-tpd", KEYGEN | SET_QUOTA, quota_tpd),
	VALUE("quota-concurrent", KEYGEN | SET_QUOTA, quota_concurrent),
	/* set-quota's own name for it, beside --clear */
	VALUE("concurrent", SET_QUOTA, quota_concurrent),
	FLAG("clear", SET_QUOTA | SET_LOGIN | SET_ACCOUNT, clear),
	VALUE("account", KEYGEN | USAGE, account),
	VALUE("since", USAGE, since),
	VALUE("allow-login", KEYGEN, allow_login),
	/* set-login's names for them */
	VALUE("allow", SET_LOGIN, allow_login),
	VALUE("deny", SET_LOGIN, deny_login),
	VALUE("worker-role", STORE, worker_role),
	VALUE("to", MIGRATE, to),
};

static const char *const cmd_names[] = { "",	  "keygen",    "list",	"revoke",  "set-quota",
					 "usage", "set-login", "store", "migrate", "set-account" };

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

/* The whole line read: a command, a store subcommand, options that apply to them (seen:
 * bit i when opt_defs[i] was given). 0 or EXIT_USAGE. */
static int check_args(const struct opts *o, unsigned long seen)
{
	if (o->cmd == CMD_NONE)
		return usage_error("no command given");
	if (o->cmd == CMD_STORE && (!o->store_sub || (strcmp(o->store_sub, "init") != 0 &&
						      strcmp(o->store_sub, "status") != 0)))
		return usage_error("store needs 'init' or 'status'");
	if (o->cmd == CMD_STORE && o->worker_role && strcmp(o->store_sub, "init") != 0)
		return usage_error("--worker-role applies to 'store init'");
	for (size_t i = 0; i < ARRAY_SIZE(opt_defs); i++)
		if ((seen & (1ul << i)) && opt_defs[i].only != ALL &&
		    !(opt_defs[i].only & (1u << o->cmd)))
			return usage_error("option '--%s' does not apply to '%s'", opt_defs[i].name,
					   cmd_names[o->cmd]);
	return 0;
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
			if (o->cmd == CMD_STORE && !o->store_sub) {
				o->store_sub = arg; /* store init | store status */
				continue;
			}
			if (o->cmd == CMD_SET_ACCOUNT && !o->binding) {
				o->binding = arg; /* PROVIDER=ACCOUNT, or PROVIDER */
				continue;
			}
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
	return o->help ? 0 : check_args(o, seen);
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

/* One --quota-* value: a whole number 1..max, or "none" (0: no limit). */
static int parse_limit(const char *flag, const char *s, int64_t max, int64_t *out)
{
	uint64_t v;

	if (strcmp(s, "none") == 0) {
		*out = 0;
		return 0;
	}
	if (parse_u64(s, &v) || v < 1 || v > (uint64_t)max)
		return usage_error("--%s is a whole number from 1 to %s, or none; not '%s'", flag,
				   max == AUTH_QUOTA_MAX ? "10^15" : "1024", s);
	*out = (int64_t)v;
	return 0;
}

/* The --quota-* options given: the limits in *q, which ones in *fields. 0 or EXIT_USAGE. */
static int parse_quota_opts(const struct opts *o, struct auth_quota *q, unsigned *fields)
{
	*fields = 0;
	memset(q, 0, sizeof(*q));
	if (o->quota_rpm) {
		if (parse_limit("quota-rpm", o->quota_rpm, AUTH_QUOTA_MAX, &q->requests_per_minute))
			return EXIT_USAGE;
		*fields |= AUTH_QUOTA_RPM;
	}
	if (o->quota_rpd) {
		if (parse_limit("quota-rpd", o->quota_rpd, AUTH_QUOTA_MAX, &q->requests_per_day))
			return EXIT_USAGE;
		*fields |= AUTH_QUOTA_RPD;
	}
	if (o->quota_tpd) {
		if (parse_limit("quota-tpd", o->quota_tpd, AUTH_QUOTA_MAX, &q->tokens_per_day))
			return EXIT_USAGE;
		*fields |= AUTH_QUOTA_TPD;
	}
	if (o->quota_concurrent) {
		if (parse_limit("quota-concurrent", o->quota_concurrent, AUTH_QUOTA_CONCURRENT_MAX,
				&q->max_concurrent))
			return EXIT_USAGE;
		*fields |= AUTH_QUOTA_CONC;
	}
	return 0;
}

static json_t *quota_to_json(const struct auth_quota *q)
{
	json_t *o;

	if (auth_quota_none(q))
		return json_null();
	o = json_object();
	if (q->requests_per_minute)
		json_object_set_new(o, "requests_per_minute", json_integer(q->requests_per_minute));
	if (q->requests_per_day)
		json_object_set_new(o, "requests_per_day", json_integer(q->requests_per_day));
	if (q->tokens_per_day)
		json_object_set_new(o, "tokens_per_day", json_integer(q->tokens_per_day));
	if (q->max_concurrent)
		json_object_set_new(o, "max_concurrent", json_integer(q->max_concurrent));
	return o;
}

/* "rpm=5 rpd=100" ("-" for a limit not set), or "none". */
static void quota_text(const struct auth_quota *q, struct buf *b)
{
	buf_reset(b);
	if (auth_quota_none(q)) {
		buf_adds(b, "none");
		return;
	}
	if (q->requests_per_minute)
		buf_addf(b, "rpm=%" PRId64, q->requests_per_minute);
	if (q->requests_per_day)
		buf_addf(b, "%srpd=%" PRId64, b->len ? "," : "", q->requests_per_day);
	if (q->tokens_per_day)
		buf_addf(b, "%stpd=%" PRId64, b->len ? "," : "", q->tokens_per_day);
	if (q->max_concurrent)
		buf_addf(b, "%sconcurrent=%" PRId64, b->len ? "," : "", q->max_concurrent);
}

/* The risk of a login allowance, in words, on stderr (also with --json): whoever holds the
 * key can have the model print the provider's credential files. */
static void warn_logins(const char *id, const struct strv *logins)
{
	for (size_t i = 0; i < logins->n; i++)
		fprintf(stderr,
			"olp-keys: warning: key %s may now use provider %s with its login: this "
			"key's prompts can read %s's login (the credential files its runs are "
			"given), and whoever holds the key can take it.\n",
			id, logins->v[i], logins->v[i]);
}

/* --tier and --owner: 0, or EXIT_USAGE after the usage error. */
static int keygen_tier(const struct opts *o, enum auth_tier *tier)
{
	if (o->tier) {
		if (strcmp(o->tier, "owner") == 0)
			*tier = AUTH_TIER_OWNER;
		else if (strcmp(o->tier, "guest") != 0)
			return usage_error("--tier is owner or guest, not '%s'", o->tier);
	}
	if (o->owner) {
		if (o->tier && *tier != AUTH_TIER_OWNER)
			return usage_error("--owner contradicts --tier=%s", o->tier);
		*tier = AUTH_TIER_OWNER;
	}
	return 0;
}

/* The new key, with its token (shown only here), as text or JSON. */
static void keygen_print(const struct opts *o, const struct auth_key_spec *spec,
			 const struct auth_new_key *key)
{
	struct buf quota = BUF_INIT;

	if (o->json) {
		print_json(json_pack("{s:s, s:s, s:s, s:o, s:s}", "id", key->id, "name", spec->name,
				     "owner_tier", auth_tier_name(spec->tier), "quota",
				     quota_to_json(&spec->quota), "token", key->token));
		return;
	}
	quota_text(&spec->quota, &quota);
	printf("Created %s key %s (name \"%s\", providers %s, quota %s).\n",
	       auth_tier_name(spec->tier), key->id, spec->name, o->providers ? o->providers : "*",
	       quota.data);
	printf("Token (shown only now; store it safely, it cannot be recovered):\n%s\n",
	       key->token);
	buf_release(&quota);
}

static int cmd_keygen(const struct opts *o, const struct auth_target *t)
{
	struct auth_key_spec spec = { .tier = AUTH_TIER_GUEST,
				      .notes = o->notes,
				      .force = o->force };
	struct auth_new_key key;
	struct buf msg = BUF_INIT;
	enum auth_key_result r;
	struct strv prov = STRV_INIT, logins = STRV_INIT, accounts = STRV_INIT;
	int rc = EXIT_FAILURE;
	unsigned fields;

	if (!o->owner && !o->name)
		return usage_error("keygen needs --owner or --name=NAME");
	if (parse_quota_opts(o, &spec.quota, &fields))
		return EXIT_USAGE;
	if (keygen_tier(o, &spec.tier))
		return EXIT_USAGE;
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
	if (o->allow_login) {
		if (spec.tier != AUTH_TIER_GUEST) {
			rc = usage_error("--allow-login is for guest keys: an owner key reaches "
					 "every provider's login already");
			goto out_free;
		}
		if (split_providers(o->allow_login, &logins)) {
			rc = usage_error("--allow-login is a comma-separated list of names");
			goto out_free;
		}
		spec.login_access = (const char *const *)logins.v;
		spec.n_login_access = logins.n;
	}
	if (o->account && split_providers(o->account, &accounts)) {
		rc = usage_error("--account is PROVIDER=ACCOUNT[,PROVIDER=ACCOUNT...]");
		goto out_free;
	}
	spec.accounts = (const char *const *)accounts.v;
	spec.n_accounts = accounts.n;
	r = auth_key_create_at(t, &spec, &key, &msg);
	if (r) {
		rc = fail("keygen: %s", msg.len ? msg.data : auth_key_strerror(r));
		goto out_free;
	}
	keygen_print(o, &spec, &key);
	warn_logins(key.id, &logins);
	/* The token is shown only here: a failed write must not exit 0. */
	if (fflush(stdout) != 0 || ferror(stdout))
		rc = fail("could not write the token of key %s (%s); revoke it", key.id,
			  strerror(errno));
	else
		rc = EXIT_SUCCESS;
	auth_new_key_wipe(&key);
out_free:
	strv_release(&prov);
	strv_release(&logins);
	strv_release(&accounts);
	buf_release(&msg);
	return rc;
}

static json_t *json_str_or_null(const char *s)
{
	return s ? json_string(s) : json_null();
}

static json_t *strings_json(char *const *v, size_t n)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < n; i++)
		json_array_append_new(a, json_string(v[i]));
	return a;
}

/* "<provider>=<account>" bindings as the manifest's object. */
static json_t *accounts_json(char *const *v, size_t n)
{
	char p[AUTH_PROVIDER_MAX], a[AUTH_ACCOUNT_MAX];
	json_t *o = json_object();

	for (size_t i = 0; o && i < n; i++)
		if (!auth_binding_split(v[i], p, a))
			json_object_set_new(o, p, json_string(a));
	return o;
}

static json_t *key_to_json(const struct auth_key_info *k)
{
	json_t *prov, *o;
	size_t i;

	if (k->all_providers) {
		prov = json_string("*");
	} else {
		prov = json_array();
		for (i = 0; i < k->n_providers; i++)
			json_array_append_new(prov, json_string(k->providers[i]));
	}
	o = json_pack("{s:s, s:o, s:s, s:o, s:o, s:o, s:o, s:o, s:o}", "id", k->id, "name",
		      json_str_or_null(k->name), "owner_tier", auth_tier_name(k->tier),
		      "providers_enabled", prov, "quota", quota_to_json(&k->quota), "created_at",
		      json_str_or_null(k->created_at), "last_used_at",
		      json_str_or_null(k->last_used_at), "revoked_at",
		      json_str_or_null(k->revoked_at), "notes", json_str_or_null(k->notes));
	if (o)
		json_object_set_new(o, "login_access",
				    strings_json(k->login_access, k->n_login_access));
	if (o)
		json_object_set_new(o, "accounts", accounts_json(k->accounts, k->n_accounts));
	return o;
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

static int cmd_list(const struct opts *o, const struct auth_target *t)
{
	struct auth_key_list list;
	struct buf msg = BUF_INIT, prov = BUF_INIT, quota = BUF_INIT, logins = BUF_INIT;
	enum auth_key_result r;
	json_t *arr = NULL;
	size_t i;

	r = auth_key_list_at(t, &list, &msg);
	if (r) {
		int rc = fail("list: %s", msg.len ? msg.data : auth_key_strerror(r));

		buf_release(&msg);
		return rc;
	}
	if (o->json)
		arr = json_array();
	else
		printf("%-10s %-20s %-6s %-20s %-24s %-24s %-7s %-20s %s\n", "ID", "NAME", "TIER",
		       "PROVIDERS", "CREATED", "LAST USED", "STATUS", "QUOTA", "LOGIN ACCESS");
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
		quota_text(&k->quota, &quota);
		buf_reset(&logins);
		for (size_t j = 0; j < k->n_login_access; j++)
			buf_addf(&logins, "%s%s", j ? "," : "", k->login_access[j]);
		if (k->tier == AUTH_TIER_OWNER || !logins.len)
			buf_adds(&logins, k->tier == AUTH_TIER_OWNER ? "(all)" : "-");
		for (size_t j = 0; j < k->n_accounts; j++)
			buf_addf(&logins, "%s%s", j ? "," : " accounts:", k->accounts[j]);
		printf("%-10s %-20s %-6s %-20s %-24s %-24s %-7s %-20s %s\n", k->id,
		       k->name ? k->name : "", auth_tier_name(k->tier), prov.data,
		       k->created_at ? k->created_at : "-",
		       k->last_used_at ? k->last_used_at : "never",
		       k->revoked ? "revoked" : "active", quota.data, logins.data);
	}
	if (arr)
		print_json(arr);
	auth_key_list_release(&list);
	buf_release(&msg);
	buf_release(&prov);
	buf_release(&quota);
	buf_release(&logins);
	return EXIT_SUCCESS;
}

static int cmd_revoke(const struct opts *o, const struct auth_target *t)
{
	struct buf msg = BUF_INIT;
	enum auth_key_result r;
	bool was = false;
	int rc = EXIT_SUCCESS;

	if (!o->id)
		return usage_error("revoke needs --id=ID");
	r = auth_key_revoke_at(t, o->id, &was, &msg);
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

static int cmd_set_quota(const struct opts *o, const struct auth_target *t)
{
	struct buf msg = BUF_INIT, text = BUF_INIT;
	struct auth_quota q, now;
	enum auth_key_result r;
	unsigned fields;
	int rc = EXIT_SUCCESS;

	if (!o->id)
		return usage_error("set-quota needs --id=ID");
	if (parse_quota_opts(o, &q, &fields))
		return EXIT_USAGE;
	if (!fields && !o->clear)
		return usage_error(
			"set-quota needs --clear, --concurrent or at least one --quota-* option");
	/* --clear: every limit not given goes (set to 0), the given ones are set. */
	if (o->clear)
		fields = AUTH_QUOTA_ALL;
	r = auth_key_set_quota_at(t, o->id, &q, fields, &now, &msg);
	if (r) {
		rc = fail("set-quota: %s", msg.len ? msg.data : auth_key_strerror(r));
	} else if (o->json) {
		print_json(json_pack("{s:s, s:o}", "id", o->id, "quota", quota_to_json(&now)));
	} else {
		quota_text(&now, &text);
		printf("Key %s: quota %s.\n", o->id, text.data);
	}
	buf_release(&msg);
	buf_release(&text);
	return rc;
}

static int cmd_set_login(const struct opts *o, const struct auth_target *t)
{
	struct strv names = STRV_INIT;
	struct buf msg = BUF_INIT, text = BUF_INIT;
	enum auth_key_result r;
	char **now = NULL;
	size_t n = 0;
	int rc = EXIT_SUCCESS;

	if (!o->id)
		return usage_error("set-login needs --id=ID");
	if (!!o->allow_login + !!o->deny_login + o->clear != 1)
		return usage_error("set-login needs one of --allow=a,b, --deny=a,b or --clear");
	if ((o->allow_login || o->deny_login) &&
	    split_providers(o->allow_login ? o->allow_login : o->deny_login, &names)) {
		strv_release(&names);
		return usage_error("--%s is a comma-separated list of names",
				   o->allow_login ? "allow" : "deny");
	}
	r = auth_key_set_login_at(t, o->id, (const char *const *)names.v, names.n,
				  o->allow_login != NULL, o->clear, &now, &n, &msg);
	if (r) {
		rc = fail("set-login: %s", msg.len ? msg.data : auth_key_strerror(r));
		goto out_free;
	}
	if (o->json) {
		print_json(
			json_pack("{s:s, s:o}", "id", o->id, "login_access", strings_json(now, n)));
	} else {
		for (size_t i = 0; i < n; i++)
			buf_addf(&text, "%s%s", i ? "," : "", now[i]);
		printf("Key %s: login access %s.\n", o->id, n ? text.data : "none");
	}
	if (o->allow_login)
		warn_logins(o->id, &names);
out_free:
	auth_strings_free(now, n);
	strv_release(&names);
	buf_release(&msg);
	buf_release(&text);
	return rc;
}

static int cmd_set_account(const struct opts *o, const struct auth_target *t)
{
	const char *eq = o->binding ? strchr(o->binding, '=') : NULL;
	struct buf msg = BUF_INIT;
	char *provider;
	enum auth_key_result r;
	int rc = EXIT_SUCCESS;

	if (!o->id)
		return usage_error("set-account needs --id=ID");
	if (!o->binding || (o->clear == !!eq))
		return usage_error("set-account needs PROVIDER=ACCOUNT, or --clear PROVIDER");
	provider = eq ? xstrndup(o->binding, (size_t)(eq - o->binding)) : xstrdup(o->binding);
	r = auth_key_set_account_at(t, o->id, provider, eq ? eq + 1 : NULL, &msg);
	if (r)
		rc = fail("set-account: %s", msg.len ? msg.data : auth_key_strerror(r));
	else if (o->json)
		print_json(json_pack("{s:s, s:s, s:o}", "id", o->id, "provider", provider,
				     "account", eq ? json_string(eq + 1) : json_null()));
	else if (eq)
		printf("Key %s: provider %s uses account %s only.\n", o->id, provider, eq + 1);
	else
		printf("Key %s: provider %s is unbound (the worker picks its account).\n", o->id,
		       provider);
	free(provider);
	buf_release(&msg);
	return rc;
}

/* --since=YYYY-MM-DD: the start of that UTC day in unix ms (as /v1/usage's ?since=). 0 or
 * EXIT_USAGE. */
static int parse_since(const char *s, int64_t *ms)
{
	if (usage_day_parse(s, ms))
		return usage_error("--since is a date, YYYY-MM-DD; not '%s'", s);
	return 0;
}

/* The name of key id in list, "" when it has none or is not (any longer) in the store. */
static const char *key_name(const struct auth_key_list *list, const char *id)
{
	for (size_t i = 0; i < list->n; i++)
		if (strcmp(list->keys[i].id, id) == 0)
			return list->keys[i].name ? list->keys[i].name : "";
	return "";
}

/* The rows as usage/ writes them (usage_day_json, as /v1/usage's days), printed as every
 * --json answer of this tool is: indented, through jansson. */
static void print_usage_json(const struct auth_key_list *list, const struct usage_day *days,
			     size_t n)
{
	struct buf b = BUF_INIT;
	json_t *arr;

	buf_addch(&b, '[');
	for (size_t i = 0; i < n; i++) {
		if (i)
			buf_addch(&b, ',');
		usage_day_json(&b, &days[i], true, key_name(list, days[i].key_id));
	}
	buf_addch(&b, ']');
	arr = json_loads(b.data, 0, NULL);
	if (arr)
		print_json(arr);
	else
		puts(b.data); /* not reached: usage_day_json writes valid JSON */
	buf_release(&b);
}

/* --id, --since and --account into f: 0, or EXIT_USAGE after the usage error. */
static int usage_filter_read(const struct opts *o, struct usage_filter *f)
{
	if (o->id && strlen(o->id) >= sizeof(((struct usage_day *)0)->key_id))
		return usage_error("--id is a key id, at most %zu characters",
				   sizeof(((struct usage_day *)0)->key_id) - 1);
	if (o->since && parse_since(o->since, &f->since_ms))
		return EXIT_USAGE;
	if (o->account && !auth_account_name_valid(o->account))
		return usage_error("--account is an account name, 1-%d of [a-z0-9_-]; not '%s'",
				   AUTH_ACCOUNT_MAX - 1, o->account);
	f->account = o->account;
	return 0;
}

static int cmd_usage(const struct opts *o, const struct auth_target *t)
{
	struct usage_filter f = { .key_id = o->id };
	struct usage_day *days = NULL;
	struct auth_key_list list;
	struct buf msg = BUF_INIT;
	struct usage_store *st = NULL;
	enum auth_key_result r;
	char path[4096];
	struct stat sb;
	size_t n = 0;
	int ret, rc = EXIT_FAILURE;

	if (usage_filter_read(o, &f))
		return EXIT_USAGE;
	r = auth_key_list_at(t, &list, &msg);
	if (r) {
		rc = fail("usage: %s", msg.len ? msg.data : auth_key_strerror(r));
		buf_release(&msg);
		return rc;
	}
	/* No ledger yet is no usage yet: this tool does not create the workers' database. */
	if (path_join_buf(path, sizeof(path), t->olp_home, "usage.db") == 0 &&
	    lstat(path, &sb) < 0 && errno == ENOENT)
		goto out_print;
	st = usage_store_open(t->olp_home, NULL);
	ret = st ? usage_days(st, &f, &days, &n) : -errno;
	if (ret) {
		rc = fail("usage: cannot read the ledger %s: %s", path, strerror(-ret));
		goto out_free;
	}
out_print:
	if (o->json) {
		print_usage_json(&list, days, n);
	} else if (!n) {
		printf("No usage recorded%s%s%s%s%s%s.\n", o->id ? " for key " : "",
		       o->id ? o->id : "", o->account ? " on account " : "",
		       o->account ? o->account : "", o->since ? " since " : "",
		       o->since ? o->since : "");
	} else {
		printf("%-10s %-14s %-20s %-10s %-10s %8s %6s %12s %12s %12s %8s\n", "DAY", "KEY",
		       "NAME", "PROVIDER", "ACCOUNT", "REQUESTS", "ERRORS", "PROMPT", "COMPLETION",
		       "CACHED", "AVG MS");
		for (size_t i = 0; i < n; i++) {
			const struct usage_day *d = &days[i];

			printf("%-10s %-14s %-20s %-10s %-10s %8" PRId64 " %6" PRId64 " %12" PRId64
			       " %12" PRId64 " %12" PRId64 " %8" PRIu64 "\n",
			       d->day, d->key_id, key_name(&list, d->key_id),
			       *d->provider ? d->provider : "-", *d->account ? d->account : "-",
			       d->requests, d->errors, d->prompt_tokens, d->completion_tokens,
			       d->cached_tokens,
			       d->requests ? d->duration_ms / (uint64_t)d->requests : 0);
		}
	}
	rc = fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
out_free:
	free(days);
	usage_store_free(st);
	auth_key_list_release(&list);
	buf_release(&msg);
	return rc;
}

/* ---- the PostgreSQL store ---------------------------------------------------------------- */

/* Every module's schema, in the order store init applies them: the keys' (auth/), then the
 * usage ledger's, quota windows' and leases' (usage/) (ADR 0034), then the accounts'
 * limits and sticky choices (providers/, ADR 0035 and 0037 amendments). */
static const struct store_schema *(*const schema_fns[])(void) = {
	auth_pg_schema,
	usage_pg_schema,
	prov_pg_schema,
};

/* Open url (the passfile, may be NULL) for this tool: NULL with the reason printed. */
static struct store_db *store_open_tool(const char *url, const char *passfile)
{
	struct store_options so = { .passfile = passfile,
				    .max_conns = 2,
				    .application_name = "olp-keys" };
	struct buf err = BUF_INIT;
	struct store_db *db = store_open(url, &so, &err);

	if (!db)
		fail("store: %s", err.data);
	buf_release(&err);
	return db;
}

/* The store home names (config.json "store" or OLP_STORE), opened into *db; NULL url: the
 * key files. 0 or EXIT_FAILURE (said why). *passfile gets config's store_passfile. */
static int store_resolve(const char *home, struct store_db **db, char **passfile)
{
	struct buf err = BUF_INIT;
	char *url = NULL;
	int rc = 0;

	*db = NULL;
	*passfile = NULL;
	if (store_url_resolve(home, &url, passfile, &err)) {
		rc = fail("%s", err.data);
	} else if (url) {
		*db = store_open_tool(url, *passfile);
		rc = *db ? 0 : EXIT_FAILURE;
	}
	free(url);
	buf_release(&err);
	return rc;
}

static int cmd_store_init(const struct opts *o, struct store_db *db)
{
	const struct store_schema *s[ARRAY_SIZE(schema_fns)];
	struct buf msg = BUF_INIT;
	int rc = EXIT_SUCCESS;

	for (size_t i = 0; i < ARRAY_SIZE(schema_fns); i++)
		s[i] = schema_fns[i]();
	if (store_schema_apply(db, s, ARRAY_SIZE(s), o->worker_role, &msg)) {
		rc = fail("store init: %s", msg.data);
	} else if (o->json) {
		print_json(json_pack("{s:b, s:s}", "ok", 1, "log", msg.data ? msg.data : ""));
	} else {
		const char *text = msg.len ? msg.data : "";
		size_t n = strlen(text);

		printf("%s%s", text, n && text[n - 1] != '\n' ? "\n" : "");
	}
	buf_release(&msg);
	return rc;
}

/* One module's schema version as "version N, current" and friends; false: not current. */
static bool schema_state(struct store_db *db, const struct store_schema *s, struct buf *b)
{
	unsigned found = 0;
	int ret = store_schema_check(db, s, &found);

	buf_reset(b);
	if (ret == 0)
		buf_addf(b, "version %u, current", s->n);
	else if (ret == -ENOENT)
		buf_addf(b, "none: run olp-keys store init");
	else if (ret == -EPROTO)
		buf_addf(b, "version %u, this build knows %u: run olp-keys store init%s", found,
			 s->n, found > s->n ? " with a newer OLP" : "");
	else
		buf_addf(b, "unknown (%s)", strerror(-ret));
	return ret == 0;
}

static int cmd_store_status(const struct opts *o, struct store_db *db)
{
	struct store_health h;
	struct buf b = BUF_INIT;
	json_t *mods = json_object();
	bool current = true;

	for (size_t i = 0; i < ARRAY_SIZE(schema_fns); i++) {
		const struct store_schema *s = schema_fns[i]();

		current &= schema_state(db, s, &b);
		json_object_set_new(mods, s->module, json_string(b.data));
		if (!o->json)
			printf("%s: %s\n", s->module, b.data);
	}
	store_health(db, &h);
	if (o->json) {
		print_json(json_pack("{s:s, s:b, s:s?, s:o}", "store", h.where, "reachable", h.ok,
				     "last_error", h.last_error[0] ? h.last_error : NULL, "schemas",
				     mods));
	} else {
		json_decref(mods);
		printf("store: %s, %s%s%s\n", h.where, h.ok ? "reachable" : "unreachable",
		       h.last_error[0] && !h.ok ? ": " : "", h.ok ? "" : h.last_error);
	}
	buf_release(&b);
	return h.ok && current ? EXIT_SUCCESS : EXIT_FAILURE;
}

static int cmd_store(const struct opts *o, struct store_db *db)
{
	if (!db)
		return fail("store %s: no store is configured: set config.json \"store\" or "
			    "OLP_STORE to a postgresql:// URL",
			    o->store_sub);
	if (strcmp(o->store_sub, "init") == 0)
		return cmd_store_init(o, db);
	return cmd_store_status(o, db);
}

/* olp-keys migrate --to URL: the key files, then usage.db's ledger and current quota
 * windows, into the PostgreSQL store. Both copies are idempotent (keys by id, ledger rows
 * by host and rowid), so a run cut short is finished by running it again. */
static int migrate_ledger(const char *home, struct store_db *db, const struct opts *o, json_t *out)
{
	struct usage_import_report rep = { 0 };
	struct buf err = BUF_INIT;
	struct usage_store *src;
	int ret;

	src = usage_store_open(home, NULL);
	if (!src)
		return fail("migrate: the usage ledger in %s: %s", home, strerror(errno));
	ret = usage_pg_import(src, db, NULL, &rep, &err);
	usage_store_free(src);
	if (ret) {
		ret = fail("migrate: the usage ledger: %s", err.len ? err.data : strerror(-ret));
		buf_release(&err);
		return ret;
	}
	buf_release(&err);
	if (o->json)
		(void)json_object_set_new(out, "ledger",
					  json_pack("{s:I, s:I, s:I, s:I}", "rows_read",
						    (json_int_t)rep.rows_read, "rows_copied",
						    (json_int_t)rep.rows_copied, "windows_read",
						    (json_int_t)rep.windows_read, "windows_copied",
						    (json_int_t)rep.windows_copied));
	else
		printf("usage ledger: %llu rows copied (%llu already there), %llu quota windows "
		       "copied (%llu already there)\n",
		       (unsigned long long)rep.rows_copied,
		       (unsigned long long)(rep.rows_read - rep.rows_copied),
		       (unsigned long long)rep.windows_copied,
		       (unsigned long long)(rep.windows_read - rep.windows_copied));
	return EXIT_SUCCESS;
}

static int cmd_migrate(const struct opts *o, const char *home, const char *passfile)
{
	struct auth_migrate_report rep;
	struct buf msg = BUF_INIT;
	struct store_db *db;
	enum auth_key_result r;
	json_t *out = NULL;
	char path[4096];
	struct stat sb;
	int rc = EXIT_SUCCESS;

	if (!o->to)
		return usage_error("migrate needs --to=postgresql://USER@HOST:PORT/DB");
	db = store_open_tool(o->to, passfile);
	if (!db)
		return EXIT_FAILURE;
	r = auth_key_migrate(home, db, &rep, &msg);
	if (r) {
		rc = fail("migrate: %s", msg.len ? msg.data : auth_key_strerror(r));
		goto out;
	}
	if (o->json)
		out = json_pack("{s:I, s:I, s:I}", "copied", (json_int_t)rep.copied, "unchanged",
				(json_int_t)rep.unchanged, "skipped", (json_int_t)rep.skipped);
	else
		printf("%zu keys copied, %zu unchanged%s\n", rep.copied, rep.unchanged,
		       rep.skipped ? " (some invalid manifests skipped: see above)" : "");
	/* No usage.db: nothing was ever served here, or usage is off; nothing to copy. */
	if (path_join_buf(path, sizeof(path), home, "usage.db") == 0 && lstat(path, &sb) == 0)
		rc = migrate_ledger(home, db, o, out);
	if (out)
		print_json(out);
out:
	store_free(db);
	buf_release(&msg);
	return rc;
}

/* Run the command o names against home's store. */
static int run(const struct opts *o, const char *home)
{
	struct auth_target t = { .olp_home = home };
	struct store_db *db = NULL;
	char *passfile = NULL;
	int rc = store_resolve(home, &db, &passfile);

	if (rc)
		return rc;
	t.db = db;
	switch (o->cmd) {
	case CMD_KEYGEN: rc = cmd_keygen(o, &t); break;
	case CMD_LIST: rc = cmd_list(o, &t); break;
	case CMD_REVOKE: rc = cmd_revoke(o, &t); break;
	case CMD_SET_QUOTA: rc = cmd_set_quota(o, &t); break;
	case CMD_USAGE: rc = cmd_usage(o, &t); break;
	case CMD_SET_LOGIN: rc = cmd_set_login(o, &t); break;
	case CMD_SET_ACCOUNT: rc = cmd_set_account(o, &t); break;
	case CMD_STORE: rc = cmd_store(o, db); break;
	case CMD_MIGRATE: rc = cmd_migrate(o, home, passfile); break;
	case CMD_NONE: rc = EXIT_USAGE; break;
	}
	store_free(db);
	free(passfile);
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
	rc = run(&o, home);
	free(home);
	return rc;
}
