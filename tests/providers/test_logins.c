/* CUnit suite for logins (issue 22, ADR 0025) through providers.h: which providers' runs
 * hold a login a prompt can read (prov_provider_login_exposed), what anonymous callers
 * get by default (prov_provider_uses_account), a codex config.toml's base_url as the
 * upstream (item 14), and the write-back of credentials_writable under the sandbox: only
 * from a run of the login's owner, only a file in the CLI's own format, at most 64 KiB.
 * The CLIs are fakes: a shell script that writes what the test says into the file the
 * real CLI would refresh. */
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
#include "tests/support/support.h"
#include "common/banned.h"

static char tmpdir[] = "/tmp/olp-logins-test-XXXXXX";

static void write_text(const char *path, const char *text, mode_t mode)
{
	FILE *f = fopen(path, "w");

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT(fputs(text, f) >= 0);
	CU_ASSERT(fclose(f) == 0);
	CU_ASSERT(chmod(path, mode) == 0);
}

static struct prov_provider *provider(const char *name, const char *entry)
{
	json_error_t jerr;
	json_t *e = json_loads(entry, 0, &jerr);
	struct buf err = BUF_INIT;
	struct prov_provider *pv;

	CU_ASSERT_PTR_NOT_NULL_FATAL(e);
	pv = prov_provider_from_json(name, e, &err);
	if (!pv)
		fprintf(stderr, "%s: %s\n", entry, err.data);
	json_decref(e);
	buf_release(&err);
	return pv;
}

static void expect_exposed(const char *entry, bool exposed, bool account)
{
	struct prov_provider *pv = provider("p", entry);

	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	CU_ASSERT_EQUAL(prov_provider_login_exposed(pv), exposed);
	CU_ASSERT_EQUAL(prov_provider_uses_account(pv), account);
	if (prov_provider_login_exposed(pv) != exposed)
		fprintf(stderr, "%s: login_exposed %d\n", entry, !exposed);
	prov_provider_free(pv);
}

/* A CLI that runs commands with its login bound: exposed; secretless or without
 * credentials: not; claude only with its own tools on; a command never. A login the
 * worker holds (the default for claude and codex, ADR 0036) is never bound: not exposed;
 * "copy" or CONNECT mode binds it. */
static void test_login_exposed(void)
{
	char key[512], entry[1024];

	snprintf(key, sizeof(key), "%s/api.key", tmpdir);
	write_text(key, "sk-test\n", 0600);
	expect_exposed("{\"type\":\"codex\"}", false, true);
	expect_exposed("{\"type\":\"codex\",\"login\":\"copy\"}", true, true);
	expect_exposed("{\"type\":\"codex\",\"network\":true,\"login\":\"copy\"}", true, true);
	expect_exposed("{\"type\":\"codex\",\"network\":{\"allow_hosts\":[\"chatgpt.com:443\"]}}",
		       true, true);
	expect_exposed("{\"type\":\"codex\",\"credentials\":[]}", false, true);
	expect_exposed("{\"type\":\"codex\",\"credentials\":\"/etc/olp/auth.json\"}", false, true);
	expect_exposed(
		"{\"type\":\"codex\",\"credentials\":\"/etc/olp/auth.json\",\"login\":\"copy\"}",
		true, true);
	snprintf(entry, sizeof(entry),
		 "{\"type\":\"codex\",\"network\":{\"upstream\":\"https://api.openai.com/v1\","
		 "\"set_headers\":{\"authorization\":\"Bearer file:%s\"}}}",
		 key);
	expect_exposed(entry, false, true);
	expect_exposed("{\"type\":\"vibe\"}", true, true);
	expect_exposed("{\"type\":\"claude\"}", false, true);
	expect_exposed("{\"type\":\"claude\",\"tools\":\"\"}", false, true);
	expect_exposed("{\"type\":\"claude\",\"tools\":\"Bash,Read\"}", false, true);
	expect_exposed("{\"type\":\"claude\",\"tools\":\"Bash,Read\",\"login\":\"copy\"}", true,
		       true);
	expect_exposed("{\"argv\":[\"/bin/cat\"]}", false, false);
	unlink(key);
}

static void expect_upstream(const char *entry, const char *host)
{
	struct prov_provider *pv = provider("openai", entry);
	struct prov_net_info ni;

	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	prov_provider_net_info(pv, &ni);
	CU_ASSERT_STRING_EQUAL(ni.mode, "upstream");
	CU_ASSERT_TRUE(ni.upstream_host && !strcmp(ni.upstream_host, host));
	if (!ni.upstream_host || strcmp(ni.upstream_host, host))
		fprintf(stderr, "%s: upstream %s, want %s\n", entry,
			ni.upstream_host ? ni.upstream_host : "-", host);
	prov_provider_free(pv);
}

/* Item 14: a codex config.toml naming a model provider with a base_url (the legacy
 * "network": true, or no network at all) is sent there, not to api.openai.com. */
static void test_codex_config_upstream(void)
{
	static const struct {
		const char *toml, *host;
	} cases[] = {
		{ "model_provider = \"corp\"\n\n[model_providers.corp]\nname = \"Corp\"\n"
		  "base_url = \"https://llm.corp.example/v1\" # ours\nwire_api = \"responses\"\n",
		  "llm.corp.example" },
		{ "# comment\nmodel_provider='corp'\n[model_providers.\"corp\"]\n"
		  "base_url = 'http://10.1.2.3:8000/v1'\n",
		  "10.1.2.3:8000" },
		{ "model_provider = \"corp\"\nmodel_providers.corp.base_url = "
		  "\"https://a.example\"\n",
		  "a.example" },
		/* A profile chosen at the top names the provider. */
		{ "profile = \"work\"\nmodel_provider = \"x\"\n[profiles.work]\nmodel_provider = "
		  "\"corp\"\n[model_providers.corp]\nbase_url = \"https://work.example/v1\"\n"
		  "[model_providers.x]\nbase_url = \"https://x.example/v1\"\n",
		  "work.example" },
		/* A multi-line string does not end the table early. */
		{ "model_provider = \"corp\"\n[model_providers.corp]\nnote = \"\"\"\n"
		  "base_url = \"https://not-this.example\"\n\"\"\"\n"
		  "base_url = \"https://this.example\"\n",
		  "this.example" },
		/* Nothing to read: the type's default. */
		{ "[analytics]\nenabled = false\n", "api.openai.com" },
		{ "model_provider = \"oss\"\n", "api.openai.com" },
	};
	char toml[512], entry[1024];

	snprintf(toml, sizeof(toml), "%s/config.toml", tmpdir);
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		write_text(toml, cases[i].toml, 0600);
		snprintf(entry, sizeof(entry),
			 "{\"type\":\"codex\",\"config_toml\":\"%s\",\"network\":true}", toml);
		expect_upstream(entry, cases[i].host);
		snprintf(entry, sizeof(entry), "{\"type\":\"codex\",\"config_toml\":\"%s\"}", toml);
		expect_upstream(entry, cases[i].host);
	}
	/* The provider's own model_provider is looked up in the file too. */
	write_text(toml, "[model_providers.mine]\nbase_url = \"https://mine.example/v1\"\n", 0600);
	snprintf(entry, sizeof(entry),
		 "{\"type\":\"codex\",\"config_toml\":\"%s\",\"model_provider\":\"mine\"}", toml);
	expect_upstream(entry, "mine.example");
	/* An explicit upstream wins; config_toml false reads nothing. */
	snprintf(entry, sizeof(entry),
		 "{\"type\":\"codex\",\"config_toml\":\"%s\",\"model_provider\":\"mine\","
		 "\"network\":{\"upstream\":\"https://chosen.example/v1\"}}",
		 toml);
	expect_upstream(entry, "chosen.example");
	expect_upstream("{\"type\":\"codex\",\"config_toml\":false}", "api.openai.com");
	/* A base_url that is no URL skips the provider rather than re-route it. */
	write_text(toml,
		   "model_provider = \"corp\"\n[model_providers.corp]\nbase_url = \"ftp://x\"\n",
		   0600);
	snprintf(entry, sizeof(entry), "{\"type\":\"codex\",\"config_toml\":\"%s\"}", toml);
	CU_ASSERT_PTR_NULL(provider("openai", entry));
	unlink(toml);
}

/* ---- write-back under the sandbox -------------------------------------------------------- */

/* Writes $T_DATA into $HOME/$T_FILE, then answers as codex would (the other types fail to
 * parse it, which does not matter: the write-back happens however the run ended). */
static const char fake_cli[] = "#!/bin/sh\n"
			       "cat >/dev/null\n"
			       "if [ -n \"$T_BIG\" ]; then\n"
			       "  { printf '{\"OPENAI_API_KEY\":\"'; head -c 70000 /dev/zero | tr "
			       "'\\0' a; printf '\"}'; } > \"$HOME/$T_FILE\"\n"
			       "else printf '%s' \"$T_DATA\" > \"$HOME/$T_FILE\"; fi\n"
			       "echo '{\"type\":\"item.completed\",\"item\":{\"type\":"
			       "\"agent_message\",\"text\":\"ok\"}}'\n"
			       "echo '{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":1,"
			       "\"output_tokens\":1}}'\n";

static const char old_content[] = "OLD-LOGIN";

/* One run of type with the host file holding old_content; whether the run's data
 * replaced it. */
static bool written_back(const char *type, const char *rel, const char *data, bool big, bool owner)
{
	char cli[512], host[512], entry[4096];
	struct buf got = BUF_INIT, esc = BUF_INIT;
	struct prov_provider *pv;
	struct prov_model m = { .id = "m" };
	json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", "hi");
	struct prov_request req = { .model = &m,
				    .model_name = "m",
				    .messages = msgs,
				    .request_id = "logins-test",
				    .login_owner = owner };
	struct ts_rec rec;
	struct prov_sink sink = ts_rec_sink(&rec);
	struct prov_outcome o;
	bool changed;

	snprintf(cli, sizeof(cli), "%s/fake-cli", tmpdir);
	snprintf(host, sizeof(host), "%s/login-file", tmpdir);
	write_text(cli, fake_cli, 0755);
	write_text(host, old_content, 0600);
	buf_add_json_str(&esc, data, strlen(data));
	snprintf(entry, sizeof(entry),
		 "{\"type\":\"%s\",\"bin\":\"%s\",\"credentials\":{\"%s\":\"%s\"},"
		 "\"credentials_writable\":true,\"network\":false,\"prestart\":0,"
		 "\"timeout_s\":30,\"env\":{\"T_FILE\":\"%s\",\"T_DATA\":%s,\"T_BIG\":\"%s\"}%s}",
		 type, cli, host, rel, rel, esc.data, big ? "1" : "",
		 strcmp(type, "codex") ? "" : ",\"config_toml\":false");
	pv = provider("p", entry);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pv);
	m.provider = pv;
	ts_rec_init(&rec);
	prov_run(&req, &sink, -1, &o);
	CU_ASSERT_TRUE(o.ran);
	if (!o.ran)
		fprintf(stderr, "%s run: %s\n", type, o.message);
	CU_ASSERT_EQUAL(buf_read_file(&got, host, 1 << 20), 0);
	changed = strcmp(got.data, old_content) != 0;
	if (changed && !big)
		CU_ASSERT_STRING_EQUAL(got.data, data);
	ts_rec_release(&rec);
	prov_provider_free(pv);
	json_decref(msgs);
	buf_release(&got);
	buf_release(&esc);
	return changed;
}

#define CODEX_OK                                                                          \
	"{\"OPENAI_API_KEY\":null,\"tokens\":{\"id_token\":\"i\",\"access_token\":\"a\"," \
	"\"refresh_token\":\"r\",\"account_id\":\"x\"},\"last_refresh\":\"2026\",\"new\":1}"
#define CLAUDE_OK                                                           \
	"{\"claudeAiOauth\":{\"accessToken\":\"a\",\"refreshToken\":\"r\"," \
	"\"expiresAt\":1748658860401,\"scopes\":[\"user:inference\"]}}"

static void test_write_back(void)
{
	static const char codex_rel[] = ".codex/auth.json",
			  claude_rel[] = ".claude/.credentials.json";

	if (!sbx_status_get()->available) {
		fprintf(stderr, "sandbox not available (%s): write-back runs skipped\n",
			sbx_status_get()->message ? sbx_status_get()->message : "?");
		return;
	}
	/* The owner's run: its refreshed login is kept. */
	CU_ASSERT_TRUE(written_back("codex", codex_rel, CODEX_OK, false, true));
	CU_ASSERT_TRUE(
		written_back("codex", codex_rel, "{\"OPENAI_API_KEY\":\"sk-new\"}", false, true));
	CU_ASSERT_TRUE(written_back("claude", claude_rel, CLAUDE_OK, false, true));
	CU_ASSERT_TRUE(
		written_back("vibe", ".vibe/.env", "# key\nMISTRAL_API_KEY=abc\n", false, true));
	/* A guest's run: the same file is not kept (issue 22, item 2). */
	CU_ASSERT_FALSE(written_back("codex", codex_rel, CODEX_OK, false, false));
	CU_ASSERT_FALSE(written_back("claude", claude_rel, CLAUDE_OK, false, false));
	/* Garbage, the wrong shape, or too big: the host file stays. */
	CU_ASSERT_FALSE(written_back("codex", codex_rel, "not json", false, true));
	CU_ASSERT_FALSE(written_back("codex", codex_rel, "[1]", false, true));
	CU_ASSERT_FALSE(written_back("codex", codex_rel, "{\"tokens\":{\"access_token\":\"a\"}}",
				     false, true));
	CU_ASSERT_FALSE(written_back("codex", codex_rel, "{}", false, true));
	CU_ASSERT_FALSE(written_back("codex", codex_rel, "", true, true));
	CU_ASSERT_FALSE(written_back("claude", claude_rel, "{\"claudeAiOauth\":{}}", false, true));
	CU_ASSERT_FALSE(written_back("vibe", ".vibe/.env", "rm -rf /\n", false, true));
	/* A file whose format is not known is never written back. */
	CU_ASSERT_FALSE(written_back("codex", ".codex/other.json", CODEX_OK, false, true));
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "which providers expose a login", test_login_exposed },
		{ "codex config.toml base_url is the upstream", test_codex_config_upstream },
		{ "write-back: owner only, own format, 64 KiB", test_write_back },
		{ NULL, NULL },
	};
	char runtime[] = "/tmp/olp-logins-rt-XXXXXX";
	struct sbx_global_config cfg = { .mode = SBX_MODE_BWRAP };
	char cmd[160];
	int failed;

	if (!mkdtemp(tmpdir) || !mkdtemp(runtime)) {
		perror("mkdtemp");
		return 1;
	}
	/* "~/" paths (a CLI's default credentials and config.toml) resolve in here, not in
	 * the home of whoever runs the tests. */
	setenv("HOME", tmpdir, 1);
	cfg.runtime_dir = runtime;
	if (sbx_global_init(&cfg)) {
		fprintf(stderr, "sbx_global_init failed\n");
		return 1;
	}
	failed = ts_cunit_run("logins", tests);
	sbx_global_release();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", tmpdir, runtime);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmpdir);
	return ts_exit_status(failed);
}
