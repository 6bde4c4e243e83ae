/* CUnit suite for logins held by the worker (ADR 0036) through providers.h: the "login"
 * setting and its defaults, the placeholder files a run gets (claude's
 * .credentials.json, codex's ChatGPT auth.json: the CLI's format, no secret of the
 * login, an expiry a year ahead), the headers the forwarder sets (the real token, codex's
 * account), and the refresher against tests/upstream/fake-token.mjs: a token near its
 * expiry refreshed once, the file replaced atomically with mode 0600, two threads
 * refreshing once, a failed refresh counted and a still-valid token kept. */
#include "tests/support/cunit.h"
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "providers/providers.h"
#include "tests/support/support.h"
#include "common/banned.h"

static char tmpdir[] = "/tmp/olp-held-test-XXXXXX";
static pid_t token_pid = -1;
static char token_url[128];

#define REAL_CLAUDE "sk-ant-oat01-REAL-claude-access-xxxxxxxxxxxxxxxxxxxxxxxx"
#define REAL_ACCOUNT "acct-REAL-0123456789abcdef"

static void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT(fputs(text, f) >= 0);
	CU_ASSERT(fclose(f) == 0);
	CU_ASSERT(chmod(path, 0600) == 0);
}

static char *read_text(const char *path)
{
	struct buf b = BUF_INIT;
	char tmp[4096];
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f)
		return NULL;
	while ((n = fread(tmp, 1, sizeof(tmp), f)) > 0)
		buf_add(&b, tmp, n);
	(void)fclose(f);
	return buf_detach(&b, NULL);
}

static struct prov_provider *provider(const char *name, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static struct prov_provider *provider(const char *name, const char *fmt, ...)
{
	struct buf entry = BUF_INIT, err = BUF_INIT;
	struct prov_provider *pv;
	va_list ap;
	json_t *e;

	va_start(ap, fmt);
	buf_vaddf(&entry, fmt, ap);
	va_end(ap);
	e = json_loads(entry.data, 0, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(e);
	pv = prov_provider_from_json(name, e, &err);
	if (!pv)
		fprintf(stderr, "%s: %s\n", entry.data, err.data);
	json_decref(e);
	buf_release(&entry);
	buf_release(&err);
	return pv;
}

/* A base64url JWT part of JSON text. */
static void b64url(struct buf *out, const char *json)
{
	static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
	const unsigned char *s = (const unsigned char *)json;
	size_t n = strlen(json);

	for (size_t i = 0; i < n; i += 3) {
		unsigned v =
			s[i] << 16 | (i + 1 < n ? s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);

		buf_addch(out, a[v >> 18 & 63]);
		buf_addch(out, a[v >> 12 & 63]);
		if (i + 1 < n)
			buf_addch(out, a[v >> 6 & 63]);
		if (i + 2 < n)
			buf_addch(out, a[v & 63]);
	}
}

static char *jwt(const char *claims)
{
	struct buf b = BUF_INIT;

	b64url(&b, "{\"alg\":\"RS256\"}");
	buf_addch(&b, '.');
	b64url(&b, claims);
	buf_adds(&b, ".c2ln");
	return buf_detach(&b, NULL);
}

static void write_claude(const char *path, int64_t expires_ms, const char *refresh)
{
	struct buf b = BUF_INIT;

	buf_addf(&b,
		 "{\"claudeAiOauth\":{\"accessToken\":\"" REAL_CLAUDE "\",\"refreshToken\":\"%s\","
		 "\"expiresAt\":%lld,\"scopes\":[\"user:inference\"],\"subscriptionType\":\"max\"},"
		 "\"other\":1}",
		 refresh, (long long)expires_ms);
	write_text(path, b.data);
	buf_release(&b);
}

static char *codex_access;

static void write_codex(const char *path, int64_t expires_ms, bool with_account)
{
	struct buf b = BUF_INIT, c = BUF_INIT;
	char *idt;

	buf_addf(&c,
		 "{\"exp\":%lld,\"email\":\"o@example.com\",\"https://api.openai.com/auth\":"
		 "{\"chatgpt_account_id\":\"" REAL_ACCOUNT "\",\"chatgpt_plan_type\":\"pro\"}}",
		 (long long)(expires_ms / 1000));
	idt = jwt(c.data);
	free(codex_access);
	codex_access = jwt(c.data);
	buf_addf(
		&b,
		"{\"OPENAI_API_KEY\":null,\"tokens\":{\"id_token\":\"%s\",\"access_token\":\"%s\","
		"\"refresh_token\":\"rt-codex-REAL\"%s},\"last_refresh\":\"2026-01-01T00:00:00Z\"}",
		idt, codex_access, with_account ? ",\"account_id\":\"" REAL_ACCOUNT "\"" : "");
	write_text(path, b.data);
	free(idt);
	buf_release(&b);
	buf_release(&c);
}

static int start_token(const char *delay_ms)
{
	int p[2];
	char line[32] = "";
	ssize_t n;

	if (access("/usr/bin/node", X_OK) || pipe(p))
		return -1;
	token_pid = fork();
	if (token_pid == 0) {
		dup2(p[1], 1);
		close(p[0]);
		setenv("FAKE_TOKEN_DELAY_MS", delay_ms, 1);
		execl("/usr/bin/node", "node", OLP_SOURCE_DIR "/tests/upstream/fake-token.mjs", "0",
		      (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	n = read(p[0], line, sizeof(line) - 1);
	close(p[0]);
	if (n <= 0)
		return -1;
	line[n] = '\0';
	snprintf(token_url, sizeof(token_url), "http://127.0.0.1:%d", atoi(line));
	return 0;
}

static void stop_token(void)
{
	if (token_pid > 0) {
		kill(token_pid, SIGTERM);
		waitpid(token_pid, NULL, 0);
	}
	token_pid = -1;
}

/* How many refreshes the fake token endpoint has answered. */
static int token_posts(void)
{
	struct buf cmd = BUF_INIT;
	char out[64] = "";
	FILE *f;

	buf_addf(&cmd, "curl -s %s/_requests | grep -o '\"method\":\"POST\"' | wc -l", token_url);
	f = popen(cmd.data, "r");
	buf_release(&cmd);
	if (!f)
		return -1;
	if (!fgets(out, sizeof(out), f))
		out[0] = '\0';
	pclose(f);
	return atoi(out);
}

static int suite_init(void)
{
	char run[PATH_MAX];

	if (!mkdtemp(tmpdir))
		return -1;
	snprintf(run, sizeof(run), "%s/run", tmpdir);
	if (mkdir(run, 0700) || prov_set_state_dir(run))
		return -1;
	return start_token("300");
}

static int suite_clean(void)
{
	char cmd[PATH_MAX + 16];

	stop_token();
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

static void path_in(char *out, const char *name)
{
	snprintf(out, PATH_MAX, "%s/%s", tmpdir, name);
}

static void test_settings(void)
{
	struct prov_login_info li;
	struct prov_provider *pv;
	char f[PATH_MAX];

	path_in(f, "settings.json");
	write_claude(f, wall_ms() + 3600000, "rt");
	/* Held by default, where the settings allow it. */
	pv = provider(
		"c", "{\"type\":\"claude\",\"credentials\":{\"%s\":\".claude/.credentials.json\"}}",
		f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	prov_provider_login_info(pv, &li);
	CU_ASSERT_STRING_EQUAL(li.mode, "held");
	CU_ASSERT_PTR_NULL(li.warning);
	CU_ASSERT(!prov_provider_login_exposed(pv));
	prov_provider_free(pv);
	/* "copy": today's behaviour, said loudly. */
	pv = provider("c", "{\"type\":\"codex\",\"login\":\"copy\"}");
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	prov_provider_login_info(pv, &li);
	CU_ASSERT_STRING_EQUAL(li.mode, "copy");
	CU_ASSERT_PTR_NOT_NULL(li.warning);
	CU_ASSERT(prov_provider_login_exposed(pv));
	prov_provider_free(pv);
	/* CONNECT mode cannot hold a login: by default "copy", given "held" an error. */
	pv = provider(
		"c",
		"{\"type\":\"claude\",\"network\":{\"allow_hosts\":[\"api.anthropic.com:443\"]}}");
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	prov_provider_login_info(pv, &li);
	CU_ASSERT_STRING_EQUAL(li.mode, "copy");
	prov_provider_free(pv);
	CU_ASSERT_PTR_NULL(provider("c", "{\"type\":\"claude\",\"login\":\"held\",\"network\":"
					 "{\"allow_hosts\":[\"api.anthropic.com:443\"]}}"));
	CU_ASSERT_PTR_NULL(provider("c", "{\"type\":\"claude\",\"login\":\"kept\"}"));
	CU_ASSERT_PTR_NULL(provider("c", "{\"type\":\"claude\",\"login_token_url\":\"ftp://x\"}"));
	CU_ASSERT_PTR_NULL(provider("c", "{\"type\":\"vibe\",\"login\":\"held\"}"));
	CU_ASSERT_PTR_NULL(provider("c", "{\"type\":\"claude\",\"login\":\"held\",\"credentials\":"
					 "[\"/a/x.json\",\"/a/y.json\"]}"));
	/* A key the worker adds (set_headers): no login in the run at all. */
	pv = provider(
		"c", "{\"type\":\"claude\",\"network\":{\"upstream\":\"https://api.anthropic.com\","
		     "\"set_headers\":{\"x-api-key\":\"env:HOME\"}}}");
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	prov_provider_login_info(pv, &li);
	CU_ASSERT_PTR_NULL(li.mode);
	prov_provider_free(pv);
}

/* Whether text holds needle, for the secrets a placeholder must not hold. */
static bool holds(const char *text, const char *needle)
{
	return text && strstr(text, needle);
}

static void test_placeholder_claude(void)
{
	char f[PATH_MAX], ph[PATH_MAX];
	struct buf why = BUF_INIT;
	struct prov_provider *pv;
	struct stat st;
	json_t *j, *o;
	char *text;

	path_in(f, "ph-claude.json");
	write_claude(f, wall_ms() + 3600000, "rt-claude-REAL");
	pv = provider(
		"phc",
		"{\"type\":\"claude\",\"credentials\":{\"%s\":\".claude/.credentials.json\"}}", f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_EQUAL_FATAL(prov_provider_held_placeholder(pv, ph, &why), 0);
	text = read_text(ph);
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	CU_ASSERT(!holds(text, "REAL"));
	CU_ASSERT(stat(ph, &st) == 0 && (st.st_mode & 0777) == 0600);
	j = json_loads(text, 0, NULL);
	o = json_object_get(j, "claudeAiOauth");
	CU_ASSERT_PTR_NOT_NULL_FATAL(o);
	CU_ASSERT(holds(json_string_value(json_object_get(o, "accessToken")), "olp-placeholder"));
	CU_ASSERT(json_integer_value(json_object_get(o, "expiresAt")) >
		  wall_ms() + 300LL * 86400000);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(o, "subscriptionType")), "max");
	json_decref(j);
	free(text);
	buf_release(&why);
	prov_provider_free(pv);
}

/* The claims of a JWT, decoded with base64 -d through the shell's coreutils. */
static json_t *jwt_claims(const char *token)
{
	const char *a = strchr(token, '.'), *b = a ? strchr(a + 1, '.') : NULL;
	struct buf cmd = BUF_INIT, part = BUF_INIT;
	char out[8192];
	size_t n;
	FILE *f;

	if (!b)
		return NULL;
	buf_add(&part, a + 1, (size_t)(b - a - 1));
	for (char *c = part.data; *c; c++)
		*c = (char)(*c == '-' ? '+' : *c == '_' ? '/' : *c);
	while (part.len % 4)
		buf_addch(&part, '=');
	buf_addf(&cmd, "printf '%%s' '%s' | base64 -d", part.data);
	f = popen(cmd.data, "r");
	n = f ? fread(out, 1, sizeof(out) - 1, f) : 0;
	if (f)
		pclose(f);
	out[n] = '\0';
	buf_release(&cmd);
	buf_release(&part);
	return json_loads(out, 0, NULL);
}

static void test_placeholder_codex(void)
{
	char f[PATH_MAX], ph[PATH_MAX];
	struct buf why = BUF_INIT;
	struct prov_provider *pv;
	json_t *j, *t, *claims;
	char *text;

	path_in(f, "ph-codex.json");
	write_codex(f, wall_ms() + 3600000, true);
	pv = provider("phx", "{\"type\":\"codex\",\"credentials\":{\"%s\":\".codex/auth.json\"}}",
		      f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_EQUAL_FATAL(prov_provider_held_placeholder(pv, ph, &why), 0);
	text = read_text(ph);
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	CU_ASSERT(!holds(text, "REAL") && !holds(text, codex_access));
	j = json_loads(text, 0, NULL);
	t = json_object_get(j, "tokens");
	CU_ASSERT_PTR_NOT_NULL_FATAL(t);
	CU_ASSERT(json_is_null(json_object_get(j, "OPENAI_API_KEY")));
	CU_ASSERT(json_is_string(json_object_get(j, "last_refresh")));
	claims = jwt_claims(json_string_value(json_object_get(t, "id_token")));
	CU_ASSERT_PTR_NOT_NULL_FATAL(claims);
	CU_ASSERT(json_integer_value(json_object_get(claims, "exp")) * 1000 >
		  wall_ms() + 300LL * 86400000);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(
				       json_object_get(claims, "https://api.openai.com/auth"),
				       "chatgpt_plan_type")),
			       "pro");
	json_decref(claims);
	claims = jwt_claims(json_string_value(json_object_get(t, "access_token")));
	CU_ASSERT(claims && json_integer_value(json_object_get(claims, "exp")) * 1000 >
				    wall_ms() + 300LL * 86400000);
	json_decref(claims);
	json_decref(j);
	free(text);
	buf_release(&why);
	prov_provider_free(pv);
}

static void expect_header(const struct strv *names, const struct strv *values, const char *name,
			  const char *value)
{
	ssize_t i = strv_find(names, name);

	CU_ASSERT_FATAL(i >= 0);
	CU_ASSERT_STRING_EQUAL(values->v[i], value);
}

static void test_headers(void)
{
	char f[PATH_MAX], g[PATH_MAX];
	struct strv names = STRV_INIT, values = STRV_INIT;
	struct buf why = BUF_INIT, bearer = BUF_INIT;
	struct prov_login_info li;
	struct prov_provider *pv;

	path_in(f, "h-claude.json");
	write_claude(f, wall_ms() + 3600000, "rt");
	pv = provider(
		"hc",
		"{\"type\":\"claude\",\"credentials\":{\"%s\":\".claude/.credentials.json\"}}", f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_EQUAL(prov_provider_held_headers(pv, NULL, &names, &values, &why), 0);
	expect_header(&names, &values, "authorization", "Bearer " REAL_CLAUDE);
	CU_ASSERT_EQUAL(names.n, 1);
	prov_provider_free(pv);
	strv_release(&names);
	strv_release(&values);
	/* codex: the account from the id token's claim when auth.json names none. */
	path_in(g, "h-codex.json");
	write_codex(g, wall_ms() + 3600000, false);
	pv = provider("hx", "{\"type\":\"codex\",\"credentials\":{\"%s\":\".codex/auth.json\"}}",
		      g);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_EQUAL(prov_provider_held_headers(pv, NULL, &names, &values, &why), 0);
	buf_addf(&bearer, "Bearer %s", codex_access);
	expect_header(&names, &values, "authorization", bearer.data);
	expect_header(&names, &values, "chatgpt-account-id", REAL_ACCOUNT);
	prov_provider_free(pv);
	strv_release(&names);
	strv_release(&values);
	/* claude setup-token's token in "env": held, sent as it is, never expiring. */
	pv = provider(
		"ht",
		"{\"type\":\"claude\",\"credentials\":[],\"env\":"
		"{\"CLAUDE_CODE_OAUTH_TOKEN\":\"sk-ant-oat01-SETUP-REAL-xxxxxxxxxxxxxxxx\"}}");
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_EQUAL(prov_provider_held_headers(pv, NULL, &names, &values, &why), 0);
	expect_header(&names, &values, "authorization",
		      "Bearer sk-ant-oat01-SETUP-REAL-xxxxxxxxxxxxxxxx");
	prov_provider_login_info(pv, &li);
	CU_ASSERT_STRING_EQUAL(li.mode, "held");
	CU_ASSERT_EQUAL(li.expires_ms, 0);
	CU_ASSERT(!prov_provider_login_exposed(pv));
	prov_provider_free(pv);
	strv_release(&names);
	strv_release(&values);
	/* codex logged in with an API key: the key, no account; a placeholder key. */
	write_text(g, "{\"OPENAI_API_KEY\":\"sk-REAL-api-key-0123456789abcdef\"}");
	pv = provider("hk", "{\"type\":\"codex\",\"credentials\":{\"%s\":\".codex/auth.json\"}}",
		      g);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_EQUAL(prov_provider_held_headers(pv, NULL, &names, &values, &why), 0);
	expect_header(&names, &values, "authorization", "Bearer sk-REAL-api-key-0123456789abcdef");
	CU_ASSERT_EQUAL(names.n, 1);
	strv_release(&names);
	strv_release(&values);
	{
		char ph[PATH_MAX];
		char *text;

		CU_ASSERT_EQUAL_FATAL(prov_provider_held_placeholder(pv, ph, &why), 0);
		text = read_text(ph);
		CU_ASSERT(text && !holds(text, "REAL") && holds(text, "OPENAI_API_KEY"));
		free(text);
	}
	prov_provider_free(pv);
	/* A login file anyone else may read is not one the worker sends. */
	chmod(f, 0644);
	pv = provider(
		"hc2",
		"{\"type\":\"claude\",\"credentials\":{\"%s\":\".claude/.credentials.json\"}}", f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_EQUAL(prov_provider_held_headers(pv, NULL, &names, &values, &why), -EPERM);
	CU_ASSERT(!holds(why.data, REAL_CLAUDE));
	prov_provider_free(pv);
	strv_release(&names);
	strv_release(&values);
	buf_release(&why);
	buf_release(&bearer);
}

static struct prov_provider *near_claude(const char *file, const char *refresh)
{
	write_claude(file, wall_ms() + 60000, refresh);
	return provider("near",
			"{\"type\":\"claude\",\"login_token_url\":\"%s/v1/oauth/token\","
			"\"credentials\":{\"%s\":\".claude/.credentials.json\"}}",
			token_url, file);
}

static void test_refresh(void)
{
	char f[PATH_MAX];
	struct strv names = STRV_INIT, values = STRV_INIT;
	struct buf why = BUF_INIT;
	struct prov_login_info li;
	struct prov_provider *pv;
	struct stat before, after;
	int posts = token_posts();
	json_t *j, *o;

	path_in(f, "r-claude.json");
	pv = near_claude(f, "rt-NEAR");
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT(stat(f, &before) == 0);
	CU_ASSERT_EQUAL(prov_provider_held_headers(pv, NULL, &names, &values, &why), 0);
	CU_ASSERT_EQUAL(token_posts(), posts + 1);
	CU_ASSERT(stat(f, &after) == 0);
	CU_ASSERT(before.st_ino != after.st_ino);
	CU_ASSERT_EQUAL(after.st_mode & 0777, 0600);
	j = json_load_file(f, 0, NULL);
	o = json_object_get(j, "claudeAiOauth");
	CU_ASSERT_PTR_NOT_NULL_FATAL(o);
	CU_ASSERT(holds(json_string_value(json_object_get(o, "accessToken")), "REFRESHED"));
	CU_ASSERT(!strncmp(json_string_value(json_object_get(o, "refreshToken")), "rt-NEAR-r", 9));
	CU_ASSERT(json_integer_value(json_object_get(o, "expiresAt")) > wall_ms() + 3000000);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(j, "other")), 1);
	CU_ASSERT_FATAL(values.n == 1);
	CU_ASSERT(holds(values.v[0], "REFRESHED"));
	json_decref(j);
	prov_provider_login_info(pv, &li);
	CU_ASSERT(li.last_refresh_ms > wall_ms() - 60000);
	CU_ASSERT_EQUAL(li.refresh_failures, 0);
	CU_ASSERT(li.expires_ms > wall_ms() + 3000000);
	strv_release(&names);
	strv_release(&values);
	/* Fresh now: the next run asks for nothing. */
	CU_ASSERT_EQUAL(prov_provider_held_headers(pv, NULL, &names, &values, &why), 0);
	CU_ASSERT_EQUAL(token_posts(), posts + 1);
	strv_release(&names);
	strv_release(&values);
	buf_release(&why);
	prov_provider_free(pv);
}

static void *refresh_thread(void *arg)
{
	struct strv names = STRV_INIT, values = STRV_INIT;
	struct buf why = BUF_INIT;
	intptr_t ret = prov_provider_held_headers(arg, NULL, &names, &values, &why);

	if (!ret && (values.n != 1 || !strstr(values.v[0], "REFRESHED")))
		ret = -EBADMSG;
	strv_release(&names);
	strv_release(&values);
	buf_release(&why);
	return (void *)ret;
}

static void test_refresh_once(void)
{
	char f[PATH_MAX];
	struct prov_provider *pv, *pv2;
	pthread_t t[2];
	void *r[2];
	int posts = token_posts();

	path_in(f, "once-claude.json");
	pv = near_claude(f, "rt-ONCE");
	/* Another provider object on the same login, as another worker would hold. */
	pv2 = provider("near",
		       "{\"type\":\"claude\",\"login_token_url\":\"%s/v1/oauth/token\","
		       "\"credentials\":{\"%s\":\".claude/.credentials.json\"}}",
		       token_url, f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv2);
	CU_ASSERT(pthread_create(&t[0], NULL, refresh_thread, pv) == 0);
	CU_ASSERT(pthread_create(&t[1], NULL, refresh_thread, pv2) == 0);
	pthread_join(t[0], &r[0]);
	pthread_join(t[1], &r[1]);
	CU_ASSERT_EQUAL((intptr_t)r[0], 0);
	CU_ASSERT_EQUAL((intptr_t)r[1], 0);
	CU_ASSERT_EQUAL(token_posts(), posts + 1);
	prov_provider_free(pv);
	prov_provider_free(pv2);
}

static void test_refresh_fails(void)
{
	char f[PATH_MAX];
	struct strv names = STRV_INIT, values = STRV_INIT;
	struct buf why = BUF_INIT;
	struct prov_login_info li;
	struct prov_provider *pv;

	path_in(f, "fail-claude.json");
	write_claude(f, wall_ms() + 120000, "rt-FAIL");
	/* Nothing listens on port 9 of loopback. */
	pv = provider("fail",
		      "{\"type\":\"claude\",\"login_token_url\":\"http://127.0.0.1:9/t\","
		      "\"credentials\":{\"%s\":\".claude/.credentials.json\"}}",
		      f);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	/* Still valid for two minutes: this run goes with it. */
	CU_ASSERT_EQUAL(prov_provider_held_headers(pv, NULL, &names, &values, &why), 0);
	expect_header(&names, &values, "authorization", "Bearer " REAL_CLAUDE);
	strv_release(&names);
	strv_release(&values);
	prov_provider_login_info(pv, &li);
	CU_ASSERT_EQUAL(li.refresh_failures, 1);
	CU_ASSERT(li.last_error[0] != '\0');
	/* Expired and not refreshed: no run. */
	write_claude(f, wall_ms() - 1000, "rt-FAIL");
	buf_reset(&why);
	CU_ASSERT(prov_provider_held_headers(pv, NULL, &names, &values, &why) < 0);
	CU_ASSERT(why.len > 0 && !holds(why.data, REAL_CLAUDE));
	prov_provider_login_info(pv, &li);
	CU_ASSERT_EQUAL(li.refresh_failures, 2);
	strv_release(&names);
	strv_release(&values);
	buf_release(&why);
	prov_provider_free(pv);
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "the login setting and its defaults", test_settings },
		{ "claude's placeholder holds no secret", test_placeholder_claude },
		{ "codex's placeholder: JWTs it can read, no secret", test_placeholder_codex },
		{ "the headers the forwarder sets", test_headers },
		{ "a token near its expiry is refreshed, the file replaced", test_refresh },
		{ "two refreshers at once: one refresh", test_refresh_once },
		{ "a failed refresh is counted, a valid token kept", test_refresh_fails },
		{ NULL, NULL },
	};

	int fails;

	log_set_program("test_held");
	log_set_level(LOG_LVL_ERROR);
	if (suite_init()) {
		/* node runs the fake token endpoint: a limit of the host, said as a skip. */
		fprintf(stderr, "SKIP: node or the fake token endpoint could not start\n");
		suite_clean();
		return 77;
	}
	fails = ts_cunit_run("providers_held", tests);
	if (suite_clean())
		fails++;
	return ts_exit_status(fails);
}
