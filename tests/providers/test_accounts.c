/* CUnit suite for a provider's accounts (issue 26 item 1, ADR 0037) through providers.h:
 * the "accounts" and "default_account" settings, the account variants, each account's own
 * held login (its login dir's file, its own placeholder), the sticky choice
 * of an unbound caller and its move when the account is rejected (the limits state as the
 * forwarder writes it), and, under the sandbox, runs of a command provider whose two
 * accounts are two login dirs: a run sees only its own account's files, and a process
 * pre-started for one account never serves the other. */
#include "tests/support/cunit.h"
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "providers/providers.h"
#include "sandbox/sandbox.h"
#include "tests/support/recorder.h"
#include "common/banned.h"

static char tmpdir[] = "/tmp/olp-accounts-test-XXXXXX";
static char statedir[] = "/tmp/olp-accounts-state-XXXXXX";

static void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	(void)fputs(text, f);
	CU_ASSERT_EQUAL(fclose(f), 0);
}

/* A provider from entry's JSON text; NULL (with the reason in err) when refused. */
static struct prov_provider *provider(const char *name, const char *text, struct buf *err)
{
	json_error_t je;
	json_t *entry = json_loads(text, 0, &je);
	struct prov_provider *pv;

	CU_ASSERT_PTR_NOT_NULL_FATAL(entry);
	buf_reset(err);
	pv = prov_provider_from_json(name, entry, err);
	json_decref(entry);
	return pv;
}

static void test_settings(void)
{
	struct buf err = BUF_INIT, e = BUF_INIT;
	struct prov_provider *pv;
	const struct prov_provider *a;

	/* Without "accounts": one account, "default", the provider itself. */
	pv = provider("c", "{\"type\":\"claude\"}", &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_EQUAL(prov_provider_account_count(pv), 1);
	CU_ASSERT_STRING_EQUAL(prov_provider_account_at(pv, 0), "default");
	CU_ASSERT_PTR_NULL(prov_provider_account_at(pv, 1));
	CU_ASSERT_STRING_EQUAL(prov_provider_default_account(pv), "default");
	CU_ASSERT_PTR_EQUAL(prov_provider_for_account(pv, NULL), pv);
	CU_ASSERT_PTR_EQUAL(prov_provider_for_account(pv, "default"), pv);
	CU_ASSERT_PTR_NULL(prov_provider_for_account(pv, "alice"));
	prov_provider_free(pv);

	/* Two accounts, bob the default; the variants keep the provider's settings. */
	pv = provider("c",
		      "{\"type\":\"claude\",\"timeout_s\":77,\"accounts\":{"
		      "\"alice\":{\"home\":\"/var/lib/olp/accounts/alice/\"},"
		      "\"bob\":{\"home\":\"/var/lib/olp/accounts/bob\"}},"
		      "\"default_account\":\"bob\"}",
		      &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_EQUAL(prov_provider_account_count(pv), 2);
	CU_ASSERT_STRING_EQUAL(prov_provider_account_at(pv, 0), "alice");
	CU_ASSERT_STRING_EQUAL(prov_provider_account_at(pv, 1), "bob");
	CU_ASSERT_STRING_EQUAL(prov_provider_default_account(pv), "bob");
	a = prov_provider_for_account(pv, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_STRING_EQUAL(prov_provider_account(a), "bob");
	a = prov_provider_for_account(pv, "alice");
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_STRING_EQUAL(prov_provider_account(a), "alice");
	CU_ASSERT_STRING_EQUAL(prov_provider_name(a), "c");
	CU_ASSERT_EQUAL(prov_provider_timeout_ms(a), 77000);
	CU_ASSERT_PTR_EQUAL(prov_provider_for_account(a, "bob"),
			    prov_provider_for_account(pv, "bob"));
	CU_ASSERT_PTR_NULL(prov_provider_for_account(pv, "carol"));
	prov_provider_free(pv);

	/* Without default_account: "default" when named so, else the first. */
	pv = provider("c", "{\"type\":\"claude\",\"accounts\":{\"x\":{},\"default\":{}}}", &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_STRING_EQUAL(prov_provider_default_account(pv), "default");
	prov_provider_free(pv);
	pv = provider("c", "{\"type\":\"claude\",\"accounts\":{\"x\":{},\"y\":{}}}", &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_STRING_EQUAL(prov_provider_default_account(pv), "x");
	prov_provider_free(pv);
	buf_release(&err);
	buf_release(&e);
}

static void refused(const char *text, const char *says)
{
	struct buf err = BUF_INIT;
	struct prov_provider *pv = provider("c", text, &err);

	CU_ASSERT_PTR_NULL(pv);
	if (!strstr(err.data ? err.data : "", says))
		fprintf(stderr, "\n%s: said \"%s\", not \"%s\"\n", text, err.data, says);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.data ? err.data : "", says));
	prov_provider_free(pv);
	buf_release(&err);
}

static void test_settings_refused(void)
{
	refused("{\"type\":\"claude\",\"accounts\":{\"Alice\":{}}}",
		"accounts.Alice: an account name");
	refused("{\"type\":\"claude\",\"accounts\":{\"a.b\":{}}}", "accounts.a.b: an account name");
	refused("{\"type\":\"claude\",\"accounts\":{\"abcdefghijabcdefghijabcdefghijabc\":{}}}",
		"an account name is 1-32");
	refused("{\"type\":\"claude\",\"accounts\":{}}", "accounts: must be an object of 1");
	refused("{\"type\":\"claude\",\"accounts\":[\"a\"]}", "accounts: must be an object of 1");
	refused("{\"type\":\"claude\",\"accounts\":{\"a\":\"/x\"}}",
		"accounts.a: must be an object");
	refused("{\"type\":\"claude\",\"accounts\":{\"a\":{\"home\":\"rel/dir\"}}}",
		"accounts.a.home: must be an absolute directory path");
	refused("{\"type\":\"claude\",\"accounts\":{\"a\":{\"home\":\"/x/../y\"}}}",
		"accounts.a.home: must be an absolute");
	refused("{\"type\":\"claude\",\"accounts\":{\"a\":{\"hmoe\":\"/x\"}}}",
		"accounts.a.hmoe: unknown setting");
	refused("{\"type\":\"claude\",\"accounts\":{\"a\":{\"set_headers\":{\"x-api-key\":"
		"\"env:K\"}}}}",
		"accounts.a.set_headers: needs the provider's network.set_headers");
	refused("{\"type\":\"claude\",\"accounts\":{\"a\":{}},\"default_account\":\"b\"}",
		"default_account: must name one of");
	refused("{\"type\":\"claude\",\"credentials\":[\"/etc/olp/login.json\"],"
		"\"accounts\":{\"a\":{\"home\":\"/x\"}}}",
		"accounts.a.home: the provider's credentials name /etc/olp/login.json");
	refused("{\"type\":\"claude\",\"default_account\":\"b\"}",
		"default_account: there is no \"accounts\"");
	refused("{\"type\":\"claude\",\"network\":{\"upstream\":\"https://"
		"api.anthropic.com\",\"set_headers\":{\"x-api-key\":\"env:K0\"}},"
		"\"accounts\":{\"a\":{\"set_headers\":{\"x-api-key\":\"nope\"}}}}",
		"accounts.a.set_headers.x-api-key: must be");
}

/* Accounts with their own credential sources, for a secretless provider. */
static void test_set_headers(void)
{
	struct buf err = BUF_INIT;
	struct prov_provider *pv = provider(
		"c",
		"{\"type\":\"claude\",\"network\":{\"upstream\":\"https://"
		"api.anthropic.com\",\"set_headers\":{\"x-api-key\":\"env:OLP_T_K0\"}},"
		"\"accounts\":{\"a\":{\"set_headers\":{\"x-api-key\":\"env:OLP_T_KA\"}},\"b\":{}}}",
		&err);
	struct prov_net_info ni;

	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	prov_provider_net_info(prov_provider_for_account(pv, "a"), &ni);
	CU_ASSERT_TRUE(ni.secretless);
	prov_provider_net_info(prov_provider_for_account(pv, "b"), &ni);
	CU_ASSERT_TRUE(ni.secretless);
	prov_provider_free(pv);
	buf_release(&err);
}

/* The Authorization header the forwarder would set for a run of pv's account. */
static void expect_bearer(const struct prov_provider *pv, const char *account, const char *want)
{
	struct strv names = STRV_INIT, values = STRV_INIT;
	struct buf why = BUF_INIT;
	const struct prov_provider *a = prov_provider_for_account(pv, account);

	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_EQUAL(prov_provider_held_headers(a, NULL, &names, &values, &why), 0);
	CU_ASSERT_EQUAL_FATAL(names.n, 1);
	CU_ASSERT_STRING_EQUAL(names.v[0], "authorization");
	CU_ASSERT_STRING_EQUAL(values.v[0], want);
	strv_release(&names);
	strv_release(&values);
	buf_release(&why);
}

/* Each account's held login (ADR 0036) is its own: its login dir's file, its own
 * placeholder file. */
static void test_held(void)
{
	char dir[128], file[256], entry[1024], ph_a[4096], ph_b[4096];
	struct buf err = BUF_INIT, why = BUF_INIT;
	struct prov_provider *pv;
	long long exp = (long long)wall_ms() + 3600000;

	for (int i = 0; i < 2; i++) {
		snprintf(dir, sizeof(dir), "%s/held-%s", tmpdir, i ? "bob" : "alice");
		CU_ASSERT_EQUAL_FATAL(mkdir(dir, 0700), 0);
		snprintf(file, sizeof(file), "%s/.claude", dir);
		CU_ASSERT_EQUAL_FATAL(mkdir(file, 0700), 0);
		snprintf(file, sizeof(file), "%s/.claude/.credentials.json", dir);
		snprintf(entry, sizeof(entry),
			 "{\"claudeAiOauth\":{\"accessToken\":\"sk-ant-oat01-%s\","
			 "\"refreshToken\":\"sk-ant-ort01-%s\",\"expiresAt\":%lld,"
			 "\"scopes\":[\"user:inference\"]}}",
			 i ? "BOB" : "ALICE", i ? "BOB" : "ALICE", exp);
		write_text(file, entry);
		CU_ASSERT_EQUAL(chmod(file, 0600), 0);
	}
	snprintf(entry, sizeof(entry),
		 "{\"type\":\"claude\",\"accounts\":{\"alice\":{\"home\":\"%s/held-alice\"},"
		 "\"bob\":{\"home\":\"%s/held-bob\"}}}",
		 tmpdir, tmpdir);
	pv = provider("heldc", entry, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	expect_bearer(pv, "alice", "Bearer sk-ant-oat01-ALICE");
	expect_bearer(pv, "bob", "Bearer sk-ant-oat01-BOB");
	CU_ASSERT_EQUAL(
		prov_provider_held_placeholder(prov_provider_for_account(pv, "alice"), ph_a, &why),
		0);
	CU_ASSERT_EQUAL(
		prov_provider_held_placeholder(prov_provider_for_account(pv, "bob"), ph_b, &why),
		0);
	CU_ASSERT_PTR_NOT_NULL(strstr(ph_a, "heldc@alice"));
	CU_ASSERT_PTR_NOT_NULL(strstr(ph_b, "heldc@bob"));
	prov_provider_free(pv);
	buf_release(&err);
	buf_release(&why);
}

/* Each account's long-lived token (claude's setup-token) in its own env: the forwarder's
 * bearer is the account's, its placeholder a variable (no file), its credentials present;
 * an account without one keeps the provider's token. */
static void test_held_env(void)
{
	struct buf err = BUF_INIT, why = BUF_INIT;
	struct prov_provider *pv;
	struct prov_cli_state cs;
	struct prov_login_info li;
	char ph[4096];

	pv = provider(
		"envc",
		"{\"type\":\"claude\",\"credentials\":[],\"accounts\":{"
		"\"alice\":{\"env\":{\"CLAUDE_CODE_OAUTH_TOKEN\":\"sk-ant-oat01-ALICE-SETUP\"}},"
		"\"bob\":{\"env\":{\"CLAUDE_CODE_OAUTH_TOKEN\":\"sk-ant-oat01-BOB-SETUP\"}}}}",
		&err);
	if (!pv)
		fprintf(stderr, "refused: %s\n", err.data);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	/* Held (the default), though "credentials" names no file: the accounts' tokens. */
	prov_provider_login_info(prov_provider_for_account(pv, "alice"), &li);
	CU_ASSERT_STRING_EQUAL(li.mode ? li.mode : "(null)", "held");
	CU_ASSERT_FALSE(prov_provider_login_exposed(prov_provider_for_account(pv, "alice")));
	expect_bearer(pv, "alice", "Bearer sk-ant-oat01-ALICE-SETUP");
	expect_bearer(pv, "bob", "Bearer sk-ant-oat01-BOB-SETUP");
	CU_ASSERT_EQUAL(
		prov_provider_held_placeholder(prov_provider_for_account(pv, "alice"), ph, &why),
		-EINVAL);
	prov_provider_cli_state(prov_provider_for_account(pv, "bob"), &cs);
	CU_ASSERT_STRING_EQUAL(cs.credentials, "present");
	prov_provider_free(pv);

	/* The provider's own token: the login of an account that gives none. */
	pv = provider(
		"envd",
		"{\"type\":\"claude\",\"env\":{\"CLAUDE_CODE_OAUTH_TOKEN\":"
		"\"sk-ant-oat01-OWNER-SETUP\",\"OTHER\":\"1\"},\"accounts\":{"
		"\"alice\":{\"env\":{\"CLAUDE_CODE_OAUTH_TOKEN\":\"sk-ant-oat01-ALICE-SETUP\"}},"
		"\"owner\":{}}}",
		&err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	expect_bearer(pv, "alice", "Bearer sk-ant-oat01-ALICE-SETUP");
	expect_bearer(pv, "owner", "Bearer sk-ant-oat01-OWNER-SETUP");
	prov_provider_free(pv);
	buf_release(&err);
	buf_release(&why);
}

/* A token given as "file:/abs": read at each run (a renewed token is sent without a
 * restart), under a set_headers file's rules (the worker's own, 0600), never quoted. */
static void test_held_env_file(void)
{
	struct buf err = BUF_INIT, why = BUF_INIT;
	struct strv names = STRV_INIT, values = STRV_INIT;
	char tok[256], tmp[300], conf[1024];
	struct prov_provider *pv;
	struct prov_cli_state cs;
	json_t *top;

	snprintf(tok, sizeof(tok), "%s/alice.token", tmpdir);
	snprintf(tmp, sizeof(tmp), "%s/alice.token.new", tmpdir);
	write_text(tok, "sk-ant-oat01-ALICE-FILE-ONE\n");
	CU_ASSERT_EQUAL_FATAL(chmod(tok, 0600), 0);
	snprintf(conf, sizeof(conf),
		 "{\"type\":\"claude\",\"credentials\":[],\"env\":{\"CLAUDE_CODE_OAUTH_TOKEN\":"
		 "\"file:%s\"},\"accounts\":{\"alice\":{\"env\":{\"CLAUDE_CODE_OAUTH_TOKEN\":"
		 "\"file:%s\"}},\"bob\":{\"env\":{\"CLAUDE_CODE_OAUTH_TOKEN\":"
		 "\"sk-ant-oat01-BOB-SETUP\"}},\"owner\":{}}}",
		 tok, tok);
	pv = provider("envf", conf, &err);
	if (!pv)
		fprintf(stderr, "refused: %s\n", err.data);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	expect_bearer(pv, "alice", "Bearer sk-ant-oat01-ALICE-FILE-ONE");
	expect_bearer(pv, "owner", "Bearer sk-ant-oat01-ALICE-FILE-ONE"); /* the provider's */
	expect_bearer(pv, "bob", "Bearer sk-ant-oat01-BOB-SETUP");
	prov_provider_cli_state(prov_provider_for_account(pv, "alice"), &cs);
	CU_ASSERT_STRING_EQUAL(cs.credentials, "present");
	/* Renewed in place (a new file renamed over it): the next run sends the new one. */
	write_text(tmp, "sk-ant-oat01-ALICE-FILE-TWO");
	CU_ASSERT_EQUAL_FATAL(chmod(tmp, 0600), 0);
	CU_ASSERT_EQUAL_FATAL(rename(tmp, tok), 0);
	expect_bearer(pv, "alice", "Bearer sk-ant-oat01-ALICE-FILE-TWO");
	/* Readable by others: refused, naming the file, never its content. */
	CU_ASSERT_EQUAL_FATAL(chmod(tok, 0644), 0);
	CU_ASSERT_EQUAL(prov_provider_held_headers(prov_provider_for_account(pv, "alice"), NULL,
						   &names, &values, &why),
			-EPERM);
	CU_ASSERT_EQUAL(names.n, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(why.data ? why.data : "", tok));
	CU_ASSERT_PTR_NULL(strstr(why.data ? why.data : "", "ALICE-FILE"));
	prov_provider_free(pv);

	/* Gone: the account's credentials are missing (and the provider still loads, with
	 * a warning: its runs have no login until the file is back). */
	CU_ASSERT_EQUAL_FATAL(unlink(tok), 0);
	pv = provider("envf", conf, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	prov_provider_cli_state(prov_provider_for_account(pv, "alice"), &cs);
	CU_ASSERT_STRING_EQUAL(cs.credentials, "missing");
	prov_provider_cli_state(prov_provider_for_account(pv, "bob"), &cs);
	CU_ASSERT_STRING_EQUAL(cs.credentials, "present");
	prov_provider_free(pv);

	/* config.json's check is strict: a token file it cannot read now is an error; the
	 * file that names it holds no token, so any mode of config.json will do. */
	snprintf(conf, sizeof(conf),
		 "{\"c\":{\"accounts\":{\"a\":{\"env\":{\"CLAUDE_CODE_OAUTH_TOKEN\":"
		 "\"file:%s\"}}}}}",
		 tok);
	top = json_loads(conf, 0, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(top);
	buf_reset(&err);
	CU_ASSERT_EQUAL(prov_config_check(top, &err), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(
		strstr(err.data ? err.data : "", "accounts.a.env.CLAUDE_CODE_OAUTH_TOKEN: file"));
	write_text(tok, "sk-ant-oat01-ALICE-FILE-THREE\n");
	CU_ASSERT_EQUAL_FATAL(chmod(tok, 0600), 0);
	buf_reset(&err);
	CU_ASSERT_EQUAL(prov_config_check(top, &err), 0);
	snprintf(tmp, sizeof(tmp), "%s/config.json", tmpdir);
	write_text(tmp, "{}");
	CU_ASSERT_EQUAL_FATAL(chmod(tmp, 0644), 0);
	CU_ASSERT_EQUAL(prov_config_check_file(top, tmp, &err), 0);
	json_decref(top);
	strv_release(&names);
	strv_release(&values);
	buf_release(&err);
	buf_release(&why);
}

static void test_held_env_refused(void)
{
	refused("{\"type\":\"claude\",\"accounts\":{\"a\":{\"home\":\"/x\",\"env\":{"
		"\"CLAUDE_CODE_OAUTH_TOKEN\":\"t\"}}}}",
		"accounts.a: \"home\", \"set_headers\" and \"env\" each name the login; keep one");
	refused("{\"type\":\"claude\",\"env\":{\"CLAUDE_CODE_OAUTH_TOKEN\":\"t\"},"
		"\"accounts\":{\"a\":{\"home\":\"/x\"}}}",
		"accounts.a.home: the provider's env.CLAUDE_CODE_OAUTH_TOKEN would be this "
		"account's login");
	refused("{\"type\":\"claude\",\"accounts\":{\"a\":{\"env\":{\"HOME\":\"/x\"}}}}",
		"accounts.a.env.HOME: an account's env holds only its login's token "
		"(CLAUDE_CODE_OAUTH_TOKEN)");
	refused("{\"type\":\"claude\",\"accounts\":{\"a\":{\"env\":{"
		"\"CLAUDE_CODE_OAUTH_TOKEN\":\"t\",\"X\":\"1\"}}}}",
		"accounts.a.env: must be an object of one variable");
	refused("{\"type\":\"claude\",\"accounts\":{\"a\":{\"env\":{"
		"\"CLAUDE_CODE_OAUTH_TOKEN\":\"\"}}}}",
		"accounts.a.env.CLAUDE_CODE_OAUTH_TOKEN: must be the token");
	refused("{\"type\":\"claude\",\"accounts\":{\"a\":{\"env\":{"
		"\"CLAUDE_CODE_OAUTH_TOKEN\":\"t\\r\\nx-evil: 1\"}}}}",
		"accounts.a.env.CLAUDE_CODE_OAUTH_TOKEN: holds a space or control character");
	refused("{\"type\":\"codex\",\"accounts\":{\"a\":{\"env\":{"
		"\"CLAUDE_CODE_OAUTH_TOKEN\":\"t\"}}}}",
		"(none for this type)");
	/* A file: token: an absolute path, and only for a held login. */
	refused("{\"type\":\"claude\",\"accounts\":{\"a\":{\"env\":{"
		"\"CLAUDE_CODE_OAUTH_TOKEN\":\"file:tok\"}}}}",
		"accounts.a.env.CLAUDE_CODE_OAUTH_TOKEN: a file: token needs an absolute path");
	refused("{\"type\":\"claude\",\"login\":\"copy\",\"accounts\":{\"a\":{\"env\":{"
		"\"CLAUDE_CODE_OAUTH_TOKEN\":\"file:/x\"}}}}",
		"accounts.a.env.CLAUDE_CODE_OAUTH_TOKEN: a file: token is read by the worker");
	refused("{\"type\":\"claude\",\"network\":\"host\",\"env\":{"
		"\"CLAUDE_CODE_OAUTH_TOKEN\":\"file:/x\"}}",
		"env.CLAUDE_CODE_OAUTH_TOKEN: a file: token is read by the worker");
	/* "held" given with neither a file nor a token anywhere: still an error. */
	refused("{\"type\":\"claude\",\"login\":\"held\",\"credentials\":[],"
		"\"accounts\":{\"a\":{}}}",
		"exactly one login file");
}

/* config.json's check (the type not known yet), and the files that may hold a token. */
static void test_held_env_config(void)
{
	struct buf err = BUF_INIT;
	char path[256];
	json_t *ok = json_loads("{\"c\":{\"accounts\":{\"a\":{\"env\":{"
				"\"CLAUDE_CODE_OAUTH_TOKEN\":\"sk-ant-oat01-A\"}}}}}",
				0, NULL);
	json_t *bad =
		json_loads("{\"c\":{\"accounts\":{\"a\":{\"env\":{\"PATH\":\"/x\"}}}}}", 0, NULL);
	json_t *top = json_loads("{\"c\":{\"env\":{\"CLAUDE_CODE_OAUTH_TOKEN\":\"t\"}}}", 0, NULL);
	json_t *none = json_loads("{\"c\":{\"env\":{\"X\":\"1\"}}}", 0, NULL);
	static const struct {
		mode_t mode;
		bool ok;
	} modes[] = { { 0600, true },  { 0640, true },	{ 0400, true },
		      { 0644, false }, { 0660, false }, { 0604, false } };

	CU_ASSERT_EQUAL(prov_config_check(ok, &err), 0);
	buf_reset(&err);
	CU_ASSERT_EQUAL(prov_config_check(bad, &err), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.data, "providers.c.accounts.a.env.PATH"));
	snprintf(path, sizeof(path), "%s/config.json", tmpdir);
	write_text(path, "{}");
	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		CU_ASSERT_EQUAL_FATAL(chmod(path, modes[i].mode), 0);
		buf_reset(&err);
		CU_ASSERT_EQUAL(prov_config_check_file(ok, path, &err), modes[i].ok ? 0 : -EINVAL);
		CU_ASSERT_EQUAL(prov_config_check_file(top, path, &err), modes[i].ok ? 0 : -EINVAL);
		/* No token: any mode. */
		CU_ASSERT_EQUAL(prov_config_check_file(none, path, &err), 0);
	}
	buf_reset(&err);
	CU_ASSERT_EQUAL(prov_config_check_file(ok, path, &err), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.data,
				      "providers.c.accounts.a.env.CLAUDE_CODE_OAUTH_TOKEN "
				      "is a login token"));
	CU_ASSERT_PTR_NULL(strstr(err.data, "sk-ant-oat01-A")); /* never the token itself */
	json_decref(ok);
	json_decref(bad);
	json_decref(top);
	json_decref(none);
	buf_release(&err);
}

/* The forwarder's word that an account is rejected until reset (epoch s). */
static void reject(const char *provider, const char *account, int64_t reset)
{
	struct egr_ratelimit rl;

	egr_rl_init(&rl, 429);
	rl.any = true;
	rl.status = EGR_RL_REJECTED;
	rl.reset_s = reset;
	CU_ASSERT_EQUAL(prov_limits_put(provider, account, &rl), 0);
}

static void test_sticky(void)
{
	struct buf err = BUF_INIT;
	struct prov_provider *pv = provider(
		"sticky", "{\"type\":\"claude\",\"accounts\":{\"a\":{},\"b\":{},\"c\":{}}}", &err);
	int64_t now = wall_ms() / 1000, r = 0;
	const char *first = NULL, *got = NULL, *moved = NULL;
	char path[512];
	struct stat st;

	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_EQUAL(prov_account_choose(pv, "key1", now, &first, &r), 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(first);
	/* Kept for every worker of the host, 0600. */
	snprintf(path, sizeof(path), "%s/accounts/sticky@key1", statedir);
	CU_ASSERT_EQUAL_FATAL(stat(path, &st), 0);
	CU_ASSERT_EQUAL(st.st_mode & 0777, 0600);
	/* Ten requests: the same account every time. */
	for (int i = 0; i < 10; i++) {
		CU_ASSERT_EQUAL(prov_account_choose(pv, "key1", now + (int64_t)i * 60, &got, &r),
				0);
		CU_ASSERT_STRING_EQUAL(got, first);
	}
	/* Its account rejected until an hour from now: another one, which then sticks. */
	reject("sticky", first, now + 3600);
	CU_ASSERT_TRUE(prov_account_blocked(pv, first, now, &r));
	CU_ASSERT_EQUAL(r, 3600);
	CU_ASSERT_EQUAL(prov_account_choose(pv, "key1", now, &moved, &r), 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(moved);
	CU_ASSERT_STRING_NOT_EQUAL(moved, first);
	for (int i = 0; i < 10; i++) {
		CU_ASSERT_EQUAL(prov_account_choose(pv, "key1", now + i, &got, &r), 0);
		CU_ASSERT_STRING_EQUAL(got, moved);
	}
	/* Once the first one's reset has passed, the key stays where it is: no going back
	 * and forth. */
	CU_ASSERT_EQUAL(prov_account_choose(pv, "key1", now + 4000, &got, &r), 0);
	CU_ASSERT_STRING_EQUAL(got, moved);
	/* After PROV_STICKY_S the choice is made again (any account not rejected). */
	CU_ASSERT_EQUAL(prov_account_choose(pv, "key1", now + PROV_STICKY_S + 10, &got, &r), 0);
	/* Every account rejected: -EBUSY with the soonest reset. */
	reject("sticky", "a", now + 900);
	reject("sticky", "b", now + 300);
	reject("sticky", "c", now + 600);
	CU_ASSERT_EQUAL(prov_account_choose(pv, "key2", now, &got, &r), -EBUSY);
	CU_ASSERT_EQUAL(r, 300);
	/* A caller name that is no file name part chooses without keeping anything. */
	CU_ASSERT_EQUAL(prov_account_choose(pv, "../x", now + 1000, &got, &r), 0);
	prov_provider_free(pv);
	buf_release(&err);
}

/* One run of pv's account; its text into out, how it started into *start. */
static void run_account(const struct prov_provider *pv, const char *account, const char *owner,
			struct buf *out, enum sbx_start *start)
{
	struct prov_model m = { .id = "m", .provider = pv };
	json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", "hi");
	struct prov_request req = { .model = &m,
				    .model_name = "m",
				    .messages = msgs,
				    .request_id = "accounts-test",
				    .account = account,
				    .owner = owner };
	struct ts_rec rec;
	struct prov_sink sink = ts_rec_sink(&rec);
	struct prov_outcome o;

	ts_rec_init(&rec);
	prov_run(&req, &sink, -1, &o);
	CU_ASSERT_EQUAL(o.err, PROV_OK);
	if (o.err)
		fprintf(stderr, "run of %s: %s\n", account ? account : "(default)", o.message);
	buf_reset(out);
	buf_add(out, rec.text.data ? rec.text.data : "", rec.text.len);
	*start = o.start;
	ts_rec_release(&rec);
	json_decref(msgs);
}

static void test_runs(void)
{
	char home_a[128], home_b[128], file[200], entry[2048];
	struct buf err = BUF_INIT, out = BUF_INIT;
	struct prov_provider *pv;
	enum sbx_start start;

	if (!sbx_status_get()->available) {
		fprintf(stderr, "sandbox not available (%s): account runs skipped\n",
			sbx_status_get()->message ? sbx_status_get()->message : "?");
		return;
	}
	snprintf(home_a, sizeof(home_a), "%s/alice", tmpdir);
	snprintf(home_b, sizeof(home_b), "%s/bob", tmpdir);
	CU_ASSERT_EQUAL_FATAL(mkdir(home_a, 0755), 0);
	CU_ASSERT_EQUAL_FATAL(mkdir(home_b, 0755), 0);
	snprintf(file, sizeof(file), "%s/login.txt", home_a);
	write_text(file, "ALICE-LOGIN\n");
	snprintf(file, sizeof(file), "%s/login.txt", home_b);
	write_text(file, "BOB-LOGIN\n");
	chmod(file, 0644);
	/* The command prints its account, its login dir's files, and tries the other's. */
	snprintf(entry, sizeof(entry),
		 "{\"type\":\"command\",\"argv\":[\"/bin/sh\",\"-c\",\"cat >/dev/null; "
		 "echo acct=$OLP_ACCOUNT; cat $OLP_ACCOUNT_HOME/*; cat %s/login.txt %s/login.txt "
		 "2>/dev/null; echo end\"],\"prestart\":1,\"timeout_s\":30,"
		 "\"accounts\":{\"alice\":{\"home\":\"%s\"},\"bob\":{\"home\":\"%s\"}}}",
		 home_a, home_b, home_a, home_b);
	pv = provider("cmd", entry, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	run_account(pv, "alice", "k1", &out, &start);
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "acct=alice"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "ALICE-LOGIN"));
	CU_ASSERT_PTR_NULL(strstr(out.data, "BOB-LOGIN"));
	run_account(pv, "bob", "k1", &out, &start);
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "acct=bob"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "BOB-LOGIN"));
	CU_ASSERT_PTR_NULL(strstr(out.data, "ALICE-LOGIN"));
	/* The same owner, alice's process pre-started after her run, bob's after his: each
	 * run takes only its own account's. */
	for (int i = 0; i < 3; i++) {
		run_account(pv, i % 2 ? "bob" : "alice", "k1", &out, &start);
		CU_ASSERT_PTR_NOT_NULL(strstr(out.data, i % 2 ? "BOB-LOGIN" : "ALICE-LOGIN"));
		CU_ASSERT_PTR_NULL(strstr(out.data, i % 2 ? "ALICE-LOGIN" : "BOB-LOGIN"));
		CU_ASSERT_PTR_NOT_NULL(strstr(out.data, i % 2 ? "acct=bob" : "acct=alice"));
	}
	/* The default account (the first here) when the request names none. */
	run_account(pv, NULL, "k2", &out, &start);
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "acct=alice"));
	prov_provider_free(pv);
	buf_release(&err);
	buf_release(&out);
}

/* A pre-started process of alice's is taken by alice's next run, never by bob's. */
static void test_pools(void)
{
	char entry[1024];
	struct buf err = BUF_INIT, out = BUF_INIT;
	struct prov_provider *pv;
	enum sbx_start start;

	if (!sbx_status_get()->available)
		return;
	snprintf(entry, sizeof(entry),
		 "{\"type\":\"command\",\"argv\":[\"/bin/sh\",\"-c\",\"cat >/dev/null; "
		 "echo acct=$OLP_ACCOUNT\"],\"prestart\":1,\"timeout_s\":30,"
		 "\"accounts\":{\"alice\":{},\"bob\":{}}}");
	pv = provider("pool", entry, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	run_account(pv, "alice", "k9", &out, &start);
	usleep(500 * 1000); /* the next one is started after the run */
	run_account(pv, "bob", "k9", &out, &start);
	CU_ASSERT_NOT_EQUAL(start, SBX_START_PRESTART);
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "acct=bob"));
	usleep(500 * 1000);
	run_account(pv, "alice", "k9", &out, &start);
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "acct=alice"));
	CU_ASSERT_EQUAL(start, SBX_START_PRESTART);
	usleep(500 * 1000);
	run_account(pv, "bob", "k9", &out, &start);
	CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "acct=bob"));
	CU_ASSERT_EQUAL(start, SBX_START_PRESTART);
	prov_provider_free(pv);
	buf_release(&err);
	buf_release(&out);
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "accounts and default_account", test_settings },
		{ "bad accounts settings are refused", test_settings_refused },
		{ "accounts with their own set_headers", test_set_headers },
		{ "each account holds its own login", test_held },
		{ "each account's login from its env token", test_held_env },
		{ "an env token read from its file at each run", test_held_env_file },
		{ "bad account env tokens are refused", test_held_env_refused },
		{ "a login token only in a private file", test_held_env_config },
		{ "an unbound caller's sticky account and its move", test_sticky },
		{ "a run sees only its account's login dir", test_runs },
		{ "pre-started processes never cross accounts", test_pools },
		{ NULL, NULL },
	};
	char runtime[] = "/tmp/olp-accounts-rt-XXXXXX";
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP,
					 .warm = true,
					 .prestart_max = 8,
					 .prestart_idle_ms = 60000,
					 .exec_stub = OLP_SANDBOX_EXEC_PATH };
	char cmd[256];
	int failed;

	if (!mkdtemp(tmpdir) || !mkdtemp(statedir) || !mkdtemp(runtime)) {
		perror("mkdtemp");
		return 1;
	}
	chmod(tmpdir, 0755);
	setenv("OLP_T_K0", "k0", 1);
	setenv("OLP_T_KA", "ka", 1);
	log_set_program("test_accounts");
	log_set_level(LOG_LVL_ERROR);
	cfg.runtime_dir = runtime;
	if (sbx_global_init(&cfg) || prov_set_state_dir(statedir)) {
		fprintf(stderr, "sbx_global_init or prov_set_state_dir failed\n");
		return 1;
	}
	failed = ts_cunit_run("providers_accounts", tests);
	sbx_global_release();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s' '%s'", tmpdir, statedir, runtime);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmpdir);
	return ts_exit_status(failed);
}
