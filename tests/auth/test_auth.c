/* CUnit suite for auth/: tokens, manifests, the check, tiers, last_used_at, the
 * revoke-vs-touch race, key management and the audit log. Through auth.h only: token
 * parsing is seen through auth_check (with an env owner token), the manifest parser
 * through auth_key_list (what is listed, what is skipped and the reason logged) and
 * auth_check, ids through auth_key_create and auth_key_revoke. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/cunit.h"
#include <jansson.h>
#include <sodium.h>

#include "auth/auth.h"
#include "common/common.h"
#include "tests/auth/test_util.h"
#include "common/banned.h"

#define RACE_ROUNDS 200

/* Tokens of tests/auth/fixtures/node-home (see TOKENS.txt there). */
#define FIX_OWNER_TOKEN "olp_9pUCRKOoP2lC7hnaE4q27leV2ReTMEZjxyqADKX0hGM"
#define FIX_GUEST_TOKEN "olp_BzXYAncu2iP0bD8eGLZmicWqguIy4XKv6Tv_-4ejecU"
#define FIX_REVOKED_TOKEN "olp_U1GKgTrkPh6c9sq5CdhZciwsJ137MUbme75XKanq6gM"

static const struct auth_options no_opts = { .allow_anonymous = false };

/* Create a key in home; token and id go to the caller's buffers. */
static void make_key(const char *home, const char *name, enum auth_tier tier,
		     const char *const *providers, size_t n, struct auth_new_key *k)
{
	struct auth_key_spec spec = {
		.name = name, .tier = tier, .providers = providers, .n_providers = n, .force = true
	};
	struct buf msg = BUF_INIT;
	enum auth_key_result r = auth_key_create(home, &spec, k, &msg);

	if (r)
		fprintf(stderr, "auth_key_create: %s\n", msg.data);
	CU_ASSERT_EQUAL_FATAL(r, AUTH_KEY_OK);
	buf_release(&msg);
}

static char *bearer(const char *tok)
{
	struct buf b = BUF_INIT;

	buf_addf(&b, "Bearer %s", tok);
	return buf_detach(&b, NULL);
}

/* ---- tokens, ids and hashes, seen through the store ---------------------------------- */

/* Which token auth_check takes from the headers: a store whose env owner token is want
 * accepts them as the env owner (an exact hash match, so nothing else was taken), and
 * with want NULL a store without anonymous access finds no token at all. */
static void expect_token(const char *home, const char *authz, const char *xkey, const char *want)
{
	struct auth_options o = { .env_owner_token = want };
	struct auth_identity id;
	struct auth_store *st = auth_store_open(home, &o);
	enum auth_result r;

	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	r = auth_check(st, authz, xkey, &id);
	if (!want) {
		CU_ASSERT_EQUAL(r, AUTH_ERR_REQUIRED);
	} else {
		if (r != AUTH_OK)
			fprintf(stderr, "\"%s\" / \"%s\": \"%s\" not taken\n", authz ? authz : "-",
				xkey ? xkey : "-", want);
		CU_ASSERT_EQUAL(r, AUTH_OK);
		CU_ASSERT_STRING_EQUAL(id.key_id, "__env_owner__");
		auth_identity_release(&id);
	}
	auth_store_free(st);
}

static void test_token_extract(void)
{
	char *home = tu_mkhome();

	expect_token(home, "Bearer abc", NULL, "abc");
	expect_token(home, "bearer abc", NULL, "abc");
	expect_token(home, "BEARER\tabc  ", NULL, "abc");
	expect_token(home, "  Bearer   abc", "xyz", "abc"); /* Bearer wins over x-api-key */
	expect_token(home, "Basic dXNlcjpwYXNz", "xyz", "xyz");
	expect_token(home, "Bearer", "xyz", "xyz"); /* no token after the scheme */
	expect_token(home, "Bearer    ", "xyz", "xyz");
	expect_token(home, "Bearerabc", NULL, NULL); /* scheme needs a blank after it */
	expect_token(home, NULL, "  xyz ", "xyz");
	expect_token(home, NULL, "", NULL);
	expect_token(home, "", "   ", NULL);
	expect_token(home, NULL, NULL, NULL);
	tu_rmhome(home);
}

/* Tokens as auth_key_create hands them out: "olp_" + 43 base64url characters, fresh each
 * time, and the manifest holds the lowercase hex SHA-256 of exactly those bytes (what the
 * Node OLP compares). The digest is computed here with libsodium directly. */
static void test_token_generate(void)
{
	char *home = tu_mkhome();
	struct auth_new_key a, b;
	unsigned char h[crypto_hash_sha256_BYTES];
	char hex[2 * crypto_hash_sha256_BYTES + 1];
	struct buf path = BUF_INIT, text = BUF_INIT;
	json_t *m;
	size_t i;

	make_key(home, "a", AUTH_TIER_GUEST, NULL, 0, &a);
	make_key(home, "b", AUTH_TIER_GUEST, NULL, 0, &b);
	CU_ASSERT_EQUAL(strlen(a.token), AUTH_TOKEN_LEN);
	CU_ASSERT_EQUAL(AUTH_TOKEN_LEN, 47);
	CU_ASSERT_NSTRING_EQUAL(a.token, "olp_", 4);
	CU_ASSERT_STRING_NOT_EQUAL(a.token, b.token);
	for (i = 4; i < AUTH_TOKEN_LEN; i++)
		CU_ASSERT(strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
				 a.token[i]) != NULL);

	CU_ASSERT_FATAL(sodium_init() >= 0);
	crypto_hash_sha256(h, (const unsigned char *)a.token, strlen(a.token));
	sodium_bin2hex(hex, sizeof(hex), h, sizeof(h));
	m = tu_manifest(home, a.id);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(m, "token_hash")), hex);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(m, "token_hash_algo")), "sha256");
	json_decref(m);
	buf_addf(&path, "%s/keys/%s/manifest.json", home, a.id);
	CU_ASSERT_EQUAL_FATAL(buf_read_file(&text, path.data, 1 << 20), 0);
	CU_ASSERT_PTR_NULL(strstr(text.data, a.token + 4)); /* never the token itself */
	buf_release(&text);
	buf_release(&path);
	auth_new_key_wipe(&a);
	auth_new_key_wipe(&b);
	tu_rmhome(home);
}

/* Key ids: 8 characters of [a-z0-9_-] that never start with '-' or '_', as created; and
 * which ids the store accepts at all, seen from auth_key_revoke (an id it cannot hold is
 * AUTH_KEY_ERR_INVALID_ARG, a well-formed unknown one AUTH_KEY_ERR_NOT_FOUND). */
enum { ID_ROUNDS = 200 };

static void expect_id(const char *home, const char *id, enum auth_key_result want)
{
	enum auth_key_result r = auth_key_revoke(home, id, NULL, NULL);

	if (r != want)
		fprintf(stderr, "revoke \"%s\": %d, want %d\n", id, r, want);
	CU_ASSERT_EQUAL(r, want);
}

static void test_id(void)
{
	char *home = tu_mkhome();
	int i;

	for (i = 0; i < ID_ROUNDS; i++) {
		struct auth_new_key k;

		make_key(home, "id", AUTH_TIER_GUEST, NULL, 0, &k);
		CU_ASSERT_EQUAL(strlen(k.id), 8);
		CU_ASSERT(strspn(k.id, "abcdefghijklmnopqrstuvwxyz0123456789_-") == 8);
		CU_ASSERT(k.id[0] != '-' && k.id[0] != '_');
		if (i < 10)
			expect_id(home, k.id, AUTH_KEY_OK);
		auth_new_key_wipe(&k);
	}
	expect_id(home, "ab_c-9Z", AUTH_KEY_ERR_NOT_FOUND);
	expect_id(home, "a12345678901234567890123456789012345678901234567890123456789012",
		  AUTH_KEY_ERR_NOT_FOUND); /* AUTH_ID_MAX - 1 characters */
	expect_id(home, "", AUTH_KEY_ERR_INVALID_ARG);
	expect_id(home, ".", AUTH_KEY_ERR_INVALID_ARG);
	expect_id(home, "..", AUTH_KEY_ERR_INVALID_ARG);
	expect_id(home, "a/b", AUTH_KEY_ERR_INVALID_ARG);
	expect_id(home, "a b", AUTH_KEY_ERR_INVALID_ARG);
	expect_id(home, "__env_owner__", AUTH_KEY_ERR_INVALID_ARG);
	expect_id(home, "__anonymous__", AUTH_KEY_ERR_INVALID_ARG);
	expect_id(home, "a123456789012345678901234567890123456789012345678901234567890123",
		  AUTH_KEY_ERR_INVALID_ARG);
	tu_rmhome(home);
}

/* ---- manifests --------------------------------------------------------------------- */

/* SHA-256("abc") (FIPS 180-2): the manifests below are the key of the token "abc". */
#define GOOD_HASH "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"

/* A guest manifest for the hash of "abc" whose "quota" is q (JSON text). */
#define QUOTA_MANIFEST(q)                                                       \
	"{\"schema_version\":1,\"id\":\"abcd1234\",\"token_hash\":\"" GOOD_HASH \
	"\",\"owner_tier\":\"guest\",\"providers_enabled\":\"*\",\"quota\":" q "}"
#define QUOTA_BAD_INT "a quota limit is not a positive integer (at most 10^15)"
#define QUOTA_BAD_CONC "quota max_concurrent is not an integer from 1 to 1024"

/* A valid manifest, read the two ways the module reads one: as a listed key and as the
 * key of a request's token. */
static void test_manifest_valid(void)
{
	char *home = tu_mkhome();
	struct auth_key_list list;
	struct auth_identity id;
	struct auth_store *st;

	tu_write_manifest(home, "abcd1234",
			  "{\"schema_version\":1,\"id\":\"abcd1234\",\"name\":\"a\","
			  "\"token_hash\":\"" GOOD_HASH "\",\"token_hash_algo\":\"sha256\","
			  "\"owner_tier\":\"guest\",\"providers_enabled\":[\"claude\",\"codex\"],"
			  "\"quota\":null,\"revoked_at\":null,\"future_field\":[1,2]}");
	CU_ASSERT_EQUAL_FATAL(auth_key_list(home, &list, NULL), AUTH_KEY_OK);
	CU_ASSERT_EQUAL_FATAL(list.n, 1);
	CU_ASSERT_EQUAL(list.n_skipped, 0);
	CU_ASSERT_STRING_EQUAL(list.keys[0].id, "abcd1234");
	CU_ASSERT_STRING_EQUAL(list.keys[0].name, "a");
	CU_ASSERT_EQUAL(list.keys[0].tier, AUTH_TIER_GUEST);
	CU_ASSERT_FALSE(list.keys[0].revoked);
	CU_ASSERT_FALSE(list.keys[0].all_providers);
	CU_ASSERT_EQUAL_FATAL(list.keys[0].n_providers, 2);
	CU_ASSERT_STRING_EQUAL(list.keys[0].providers[1], "codex");
	auth_key_list_release(&list);
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, "Bearer abc", NULL, &id), AUTH_OK);
	CU_ASSERT_STRING_EQUAL(id.key_id, "abcd1234");
	CU_ASSERT_EQUAL(id.tier, AUTH_TIER_GUEST);
	CU_ASSERT_FALSE(id.all_providers);
	CU_ASSERT(auth_identity_allows(&id, "codex"));
	CU_ASSERT_FALSE(auth_identity_allows(&id, "vibe"));
	/* "quota": null is no limit. */
	CU_ASSERT_EQUAL(id.quota.requests_per_minute, 0);
	CU_ASSERT_EQUAL(id.quota.requests_per_day, 0);
	CU_ASSERT_EQUAL(id.quota.tokens_per_day, 0);
	CU_ASSERT_EQUAL(id.quota.max_concurrent, 0);
	auth_identity_release(&id);
	auth_store_free(st);

	/* A quota: each limit optional, null is none, 2e3 is the integer 2000. */
	tu_write_manifest(home, "abcd1234",
			  QUOTA_MANIFEST("{\"requests_per_minute\":5,\"requests_per_day\":null,"
					 "\"tokens_per_day\":2e3,\"max_concurrent\":2.0}"));
	CU_ASSERT_EQUAL_FATAL(auth_key_list(home, &list, NULL), AUTH_KEY_OK);
	CU_ASSERT_EQUAL_FATAL(list.n, 1);
	CU_ASSERT_EQUAL(list.keys[0].quota.requests_per_minute, 5);
	CU_ASSERT_EQUAL(list.keys[0].quota.requests_per_day, 0);
	CU_ASSERT_EQUAL(list.keys[0].quota.tokens_per_day, 2000);
	CU_ASSERT_EQUAL(list.keys[0].quota.max_concurrent, 2);
	auth_key_list_release(&list);
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, "Bearer abc", NULL, &id), AUTH_OK);
	CU_ASSERT_EQUAL(id.quota.requests_per_minute, 5);
	CU_ASSERT_EQUAL(id.quota.requests_per_day, 0);
	CU_ASSERT_EQUAL(id.quota.tokens_per_day, 2000);
	CU_ASSERT_EQUAL(id.quota.max_concurrent, 2);
	auth_identity_release(&id);
	auth_store_free(st);
	/* An empty object and the largest limit. */
	tu_write_manifest(home, "abcd1234",
			  QUOTA_MANIFEST("{\"requests_per_day\":1000000000000000}"));
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, "Bearer abc", NULL, &id), AUTH_OK);
	CU_ASSERT_EQUAL(id.quota.requests_per_day, AUTH_QUOTA_MAX);
	auth_identity_release(&id);
	auth_store_free(st);
	tu_write_manifest(home, "abcd1234", QUOTA_MANIFEST("{}"));
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, "Bearer abc", NULL, &id), AUTH_OK);
	CU_ASSERT_EQUAL(id.quota.requests_per_day, 0);
	auth_identity_release(&id);
	auth_store_free(st);

	/* No token_hash_algo (sha256, as the Node OLP wrote it) and no name; revoked. */
	tu_write_manifest(
		home, "abcd1234",
		"{\"schema_version\":1,\"id\":\"abcd1234\","
		"\"token_hash\":\"" GOOD_HASH "\",\"owner_tier\":\"owner\","
		"\"providers_enabled\":\"*\",\"revoked_at\":\"2025-01-01T00:00:00.000Z\"}");
	CU_ASSERT_EQUAL_FATAL(auth_key_list(home, &list, NULL), AUTH_KEY_OK);
	CU_ASSERT_EQUAL_FATAL(list.n, 1);
	CU_ASSERT_EQUAL(list.keys[0].tier, AUTH_TIER_OWNER);
	CU_ASSERT(list.keys[0].all_providers);
	CU_ASSERT(list.keys[0].revoked);
	CU_ASSERT_PTR_NULL(list.keys[0].name);
	auth_key_list_release(&list);
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	CU_ASSERT_EQUAL(auth_check(st, "Bearer abc", NULL, &id), AUTH_ERR_INVALID);
	auth_store_free(st);
	tu_rmhome(home);
}

/* The reason the log gives for skipping keys/abcd1234 in what was captured, or NULL. */
static char *skip_reason(const char *captured)
{
	static const char mark[] = "abcd1234/manifest.json: ";
	const char *line = captured, *next;
	char *why = NULL;

	for (; !why && *line; line = next + 1) {
		json_t *j;
		const char *msg, *at;

		next = strchr(line, '\n');
		if (!next)
			break;
		j = json_loadb(line, (size_t)(next - line), 0, NULL);
		msg = json_string_value(json_object_get(j, "msg"));
		at = msg ? strstr(msg, mark) : NULL;
		if (at)
			why = xstrdup(at + strlen(mark));
		json_decref(j);
	}
	return why;
}

/* Each kind of invalid manifest: left out of the list with its reason logged, and its
 * token (the hash of "abc") refused. */
static void test_manifest_invalid(void)
{
	static const struct {
		const char *text;
		const char *why;
	} bad[] = {
		{ "{\"schema_version\":1,", "not valid JSON" },
		{ "{\"schema_version\":1,\"schema_version\":1,\"id\":\"abcd1234\",\"token_hash\":"
		  "\"" GOOD_HASH "\",\"owner_tier\":\"guest\",\"providers_enabled\":\"*\"}",
		  "not valid JSON" }, /* a duplicate member is ambiguous: refused */
		{ "[1,2]", "not a JSON object" },
		{ "{\"schema_version\":2,\"id\":\"abcd1234\",\"token_hash\":\"" GOOD_HASH
		  "\",\"owner_tier\":\"guest\",\"providers_enabled\":\"*\"}",
		  "schema_version is not 1" },
		{ "{\"schema_version\":\"1\",\"id\":\"abcd1234\",\"token_hash\":\"" GOOD_HASH
		  "\",\"owner_tier\":\"guest\",\"providers_enabled\":\"*\"}",
		  "schema_version is not 1" },
		{ "{\"id\":\"abcd1234\",\"token_hash\":\"" GOOD_HASH
		  "\",\"owner_tier\":\"guest\",\"providers_enabled\":\"*\"}",
		  "schema_version is not 1" },
		{ "{\"schema_version\":1,\"id\":\"other123\",\"token_hash\":\"" GOOD_HASH
		  "\",\"owner_tier\":\"guest\",\"providers_enabled\":\"*\"}",
		  "id does not match its directory" },
		{ "{\"schema_version\":1,\"token_hash\":\"" GOOD_HASH
		  "\",\"owner_tier\":\"guest\",\"providers_enabled\":\"*\"}",
		  "id does not match its directory" },
		{ "{\"schema_version\":1,\"id\":\"abcd1234\",\"token_hash\":\"abc\","
		  "\"owner_tier\":\"guest\",\"providers_enabled\":\"*\"}",
		  "token_hash is not 64 hex digits" },
		{ "{\"schema_version\":1,\"id\":\"abcd1234\",\"token_hash\":"
		  "\"zz7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\","
		  "\"owner_tier\":\"guest\",\"providers_enabled\":\"*\"}",
		  "token_hash is not 64 hex digits" },
		{ "{\"schema_version\":1,\"id\":\"abcd1234\",\"token_hash\":\"" GOOD_HASH
		  "\",\"token_hash_algo\":\"md5\",\"owner_tier\":\"guest\",\"providers_enabled\":"
		  "\"*\"}",
		  "token_hash_algo is not sha256" },
		{ "{\"schema_version\":1,\"id\":\"abcd1234\",\"token_hash\":\"" GOOD_HASH
		  "\",\"owner_tier\":\"admin\",\"providers_enabled\":\"*\"}",
		  "owner_tier is neither \"owner\" nor \"guest\"" },
		{ "{\"schema_version\":1,\"id\":\"abcd1234\",\"token_hash\":\"" GOOD_HASH
		  "\",\"owner_tier\":\"guest\",\"name\":7,\"providers_enabled\":\"*\"}",
		  "name is not a string" },
		{ "{\"schema_version\":1,\"id\":\"abcd1234\",\"token_hash\":\"" GOOD_HASH
		  "\",\"owner_tier\":\"guest\",\"providers_enabled\":5}",
		  "providers_enabled is neither \"*\" nor an array" },
		{ "{\"schema_version\":1,\"id\":\"abcd1234\",\"token_hash\":\"" GOOD_HASH
		  "\",\"owner_tier\":\"guest\",\"providers_enabled\":[\"claude\",7]}",
		  "providers_enabled holds something other than a provider name" },
		{ "{\"schema_version\":1,\"id\":\"abcd1234\",\"token_hash\":\"" GOOD_HASH
		  "\",\"owner_tier\":\"guest\",\"providers_enabled\":[\"claude\",\"\"]}",
		  "providers_enabled holds something other than a provider name" },
		{ "{\"schema_version\":1,\"id\":\"abcd1234\",\"token_hash\":\"" GOOD_HASH
		  "\",\"owner_tier\":\"guest\"}",
		  "providers_enabled is neither \"*\" nor an array" },
		/* A login allowance that does not parse refuses the key (issue 22). */
		{ "{\"schema_version\":1,\"id\":\"abcd1234\",\"token_hash\":\"" GOOD_HASH
		  "\",\"owner_tier\":\"guest\",\"providers_enabled\":\"*\",\"login_access\":\"*\"}",
		  "login_access is neither null nor an array" },
		{ "{\"schema_version\":1,\"id\":\"abcd1234\",\"token_hash\":\"" GOOD_HASH
		  "\",\"owner_tier\":\"guest\",\"providers_enabled\":\"*\","
		  "\"login_access\":[\"codex\",\"../x\"]}",
		  "login_access holds something other than a provider name" },
		/* An account binding that does not parse refuses the key (ADR 0037). */
		{ "{\"schema_version\":1,\"id\":\"abcd1234\",\"token_hash\":\"" GOOD_HASH
		  "\",\"owner_tier\":\"guest\",\"providers_enabled\":\"*\",\"accounts\":[\"a\"]}",
		  "accounts is neither null nor an object" },
		{ "{\"schema_version\":1,\"id\":\"abcd1234\",\"token_hash\":\"" GOOD_HASH
		  "\",\"owner_tier\":\"guest\",\"providers_enabled\":\"*\","
		  "\"accounts\":{\"claude\":\"Bob\"}}",
		  "accounts holds something other than provider and account names" },
		{ "{\"schema_version\":1,\"id\":\"abcd1234\",\"token_hash\":\"" GOOD_HASH
		  "\",\"owner_tier\":\"guest\",\"providers_enabled\":\"*\","
		  "\"accounts\":{\"a=b\":\"bob\"}}",
		  "accounts holds something other than provider and account names" },
		/* A quota that does not parse must not become no quota. */
		{ QUOTA_MANIFEST("5"), "quota is neither null nor an object" },
		{ QUOTA_MANIFEST("[]"), "quota is neither null nor an object" },
		{ QUOTA_MANIFEST("{\"request_per_day\":3}"), "quota holds an unknown limit" },
		{ QUOTA_MANIFEST("{\"requests_per_day\":0}"), QUOTA_BAD_INT },
		{ QUOTA_MANIFEST("{\"requests_per_minute\":-1}"), QUOTA_BAD_INT },
		{ QUOTA_MANIFEST("{\"tokens_per_day\":1.5}"), QUOTA_BAD_INT },
		{ QUOTA_MANIFEST("{\"tokens_per_day\":\"100\"}"), QUOTA_BAD_INT },
		{ QUOTA_MANIFEST("{\"tokens_per_day\":1e16}"), QUOTA_BAD_INT },
		{ QUOTA_MANIFEST("{\"requests_per_day\":true}"), QUOTA_BAD_INT },
		{ QUOTA_MANIFEST("{\"max_concurrent\":0}"), QUOTA_BAD_CONC },
		{ QUOTA_MANIFEST("{\"max_concurrent\":-1}"), QUOTA_BAD_CONC },
		{ QUOTA_MANIFEST("{\"max_concurrent\":1025}"), QUOTA_BAD_CONC },
		{ QUOTA_MANIFEST("{\"max_concurrent\":1.5}"), QUOTA_BAD_CONC },
		{ QUOTA_MANIFEST("{\"max_concurrent\":\"2\"}"), QUOTA_BAD_CONC },
		{ QUOTA_MANIFEST("{\"max_concurrent\":[1]}"), QUOTA_BAD_CONC },
		{ QUOTA_MANIFEST("{\"maxConcurrent\":1}"), "quota holds an unknown limit" },
	};
	char *home = tu_mkhome();
	size_t i;

	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		struct auth_key_list list;
		struct auth_identity id;
		struct auth_store *st;
		enum auth_key_result r;
		enum auth_result check;
		char *out, *why;

		tu_write_manifest(home, "abcd1234", bad[i].text);
		tu_stderr_begin();
		r = auth_key_list(home, &list, NULL);
		out = tu_stderr_end();
		CU_ASSERT_EQUAL_FATAL(r, AUTH_KEY_OK);
		CU_ASSERT_EQUAL(list.n, 0);
		CU_ASSERT_EQUAL(list.n_skipped, 1);
		auth_key_list_release(&list);
		why = skip_reason(out);
		CU_ASSERT_PTR_NOT_NULL_FATAL(why);
		if (strcmp(why, bad[i].why) != 0)
			fprintf(stderr, "case %zu: got \"%s\", want \"%s\"\n", i, why, bad[i].why);
		CU_ASSERT_STRING_EQUAL(why, bad[i].why);
		free(why);
		free(out);

		/* The store says the same once more: keep it out of the test's output. */
		tu_stderr_begin();
		st = auth_store_open(home, &no_opts);
		check = st ? auth_check(st, "Bearer abc", NULL, &id) : AUTH_OK;
		auth_store_free(st);
		free(tu_stderr_end());
		CU_ASSERT_EQUAL(check, AUTH_ERR_INVALID);
	}
	tu_rmhome(home);
}

/* Invalid manifests in a live store: skipped, one warning each, never a match. */
static void test_manifest_skipped_once(void)
{
	char *home = tu_mkhome(), *out, *authz;
	struct auth_new_key good;
	struct auth_identity id;
	struct auth_store *st;
	int i;

	make_key(home, "good", AUTH_TIER_GUEST, NULL, 0, &good);
	tu_write_manifest(home, "badjson1", "{\"schema_version\":1,");
	tu_write_manifest(home, "badschm1",
			  "{\"schema_version\":2,\"id\":\"badschm1\",\"token_hash\":\"" GOOD_HASH
			  "\",\"owner_tier\":\"guest\",\"providers_enabled\":\"*\"}");
	/* Claims another id (and the hash of "abc"): must not match as either. */
	tu_write_manifest(home, "wrongid1",
			  "{\"schema_version\":1,\"id\":\"stolenid\",\"token_hash\":\"" GOOD_HASH
			  "\",\"owner_tier\":\"owner\",\"providers_enabled\":\"*\"}");
	tu_stderr_begin();
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	/* Each new key changes keys/, so each miss rescans: the warnings must not repeat. */
	for (i = 0; i < 3; i++) {
		struct auth_new_key more;

		make_key(home, "more", AUTH_TIER_GUEST, NULL, 0, &more);
		CU_ASSERT_EQUAL(auth_check(st, "Bearer abc", NULL, &id), AUTH_ERR_INVALID);
		CU_ASSERT_EQUAL(auth_check(st, NULL, "nothing-like-it", &id), AUTH_ERR_INVALID);
		CU_ASSERT_EQUAL(auth_check(st, NULL, more.token, &id), AUTH_OK);
		auth_identity_release(&id);
		auth_new_key_wipe(&more);
	}
	authz = bearer(good.token);
	CU_ASSERT_EQUAL(auth_check(st, authz, NULL, &id), AUTH_OK);
	auth_identity_release(&id);
	auth_store_free(st);
	out = tu_stderr_end();
	CU_ASSERT_EQUAL(tu_count(out, "badjson1/manifest.json: not valid JSON"), 1);
	CU_ASSERT_EQUAL(tu_count(out, "badschm1/manifest.json: schema_version is not 1"), 1);
	CU_ASSERT_EQUAL(tu_count(out, "wrongid1/manifest.json: id does not match"), 1);
	CU_ASSERT_EQUAL(tu_count(out, "\"level\":\"warn\""), 3);
	CU_ASSERT_EQUAL(tu_count(out, good.token), 0);
	CU_ASSERT_EQUAL(tu_count(out, GOOD_HASH), 0);
	free(out);
	free(authz);
	auth_new_key_wipe(&good);
	tu_rmhome(home);
}

/* Every rewrite replaces the file whole: same mode, no temporary left, unknown fields kept. */
static void test_atomic_rewrite(void)
{
	char *home = tu_mkhome();
	struct buf dir = BUF_INIT, path = BUF_INIT;
	struct stat before, after;
	bool was = true;
	json_t *m, *want;
	DIR *d;
	int n = 0;

	tu_write_manifest(home, "keep0001",
			  "{\"schema_version\":1,\"id\":\"keep0001\",\"name\":\"k\",\"token_hash\":"
			  "\"" GOOD_HASH
			  "\",\"token_hash_algo\":\"sha256\",\"owner_tier\":\"guest\","
			  "\"providers_enabled\":\"*\",\"quota\":null,\"revoked_at\":null,"
			  "\"x_future\":{\"a\":[1,2,3]},\"notes\":\"n\"}");
	buf_addf(&dir, "%s/keys/keep0001", home);
	buf_addf(&path, "%s/manifest.json", dir.data);
	CU_ASSERT_EQUAL_FATAL(stat(path.data, &before), 0);
	CU_ASSERT_EQUAL(auth_key_revoke(home, "keep0001", &was, NULL), AUTH_KEY_OK);
	CU_ASSERT_FALSE(was);
	CU_ASSERT_EQUAL_FATAL(stat(path.data, &after), 0);
	CU_ASSERT_NOT_EQUAL(before.st_ino, after.st_ino); /* replaced, not edited in place */
	CU_ASSERT_EQUAL(after.st_mode & 07777, 0600);
	m = tu_manifest(home, "keep0001");
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT(json_is_string(json_object_get(m, "revoked_at")));
	want = json_pack("{s:[i,i,i]}", "a", 1, 2, 3);
	CU_ASSERT(json_equal(json_object_get(m, "x_future"), want));
	json_decref(want);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(m, "notes")), "n");
	CU_ASSERT(json_is_null(json_object_get(m, "quota")));
	json_decref(m);
	d = opendir(dir.data);
	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	while (readdir(d))
		n++;
	closedir(d);
	CU_ASSERT_EQUAL(n, 3); /* ".", "..", manifest.json: no temporary left behind */
	buf_release(&dir);
	buf_release(&path);
	tu_rmhome(home);
}

/* ---- the check --------------------------------------------------------------------- */

static void test_check_missing(void)
{
	char *home = tu_mkhome();
	struct auth_options anon = { .allow_anonymous = true };
	struct auth_identity id;
	struct auth_store *st;

	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	CU_ASSERT_EQUAL(auth_check(st, NULL, NULL, &id), AUTH_ERR_REQUIRED);
	CU_ASSERT_EQUAL(id.tier, AUTH_TIER_NONE);
	CU_ASSERT_EQUAL(auth_check(st, "Basic eDp5", NULL, &id), AUTH_ERR_REQUIRED);
	CU_ASSERT_STRING_EQUAL(auth_strerror(AUTH_ERR_REQUIRED),
			       "OLP API key required. Pass via \"Authorization: Bearer <token>\" "
			       "or \"x-api-key: <token>\".");
	CU_ASSERT_STRING_EQUAL(auth_error_type(AUTH_ERR_REQUIRED), "auth_required");
	CU_ASSERT_EQUAL(auth_check(st, "Bearer olp_nope", NULL, &id), AUTH_ERR_INVALID);
	CU_ASSERT_STRING_EQUAL(auth_strerror(AUTH_ERR_INVALID),
			       "OLP API key is invalid or has been revoked.");
	CU_ASSERT_STRING_EQUAL(auth_error_type(AUTH_ERR_INVALID), "invalid_or_revoked_key");
	auth_store_free(st);

	/* Anonymous with nothing set gets no provider at all (issue 22: it used to get every
	 * one, with no limit). */
	st = auth_store_open(home, &anon);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, NULL, NULL, &id), AUTH_OK);
	CU_ASSERT_EQUAL(id.tier, AUTH_TIER_ANONYMOUS);
	CU_ASSERT_STRING_EQUAL(id.key_id, "__anonymous__");
	CU_ASSERT_FALSE(auth_identity_allows(&id, "claude"));
	CU_ASSERT(auth_quota_none(&id.quota));
	auth_touch(st, &id); /* no manifest: nothing to write, nothing to crash */
	auth_identity_release(&id);
	/* A wrong token is still wrong when anonymous access is on. */
	CU_ASSERT_EQUAL(auth_check(st, NULL, "olp_wrong", &id), AUTH_ERR_INVALID);
	auth_store_free(st);
	tu_rmhome(home);
}

/* auth.anonymous: its own providers and quota, like a key's; never a login. */
static void test_check_anonymous_settings(void)
{
	static const char *const local[] = { "local", "echo" };
	struct auth_anonymous a = { .providers = local,
				    .n_providers = 2,
				    .quota = { .requests_per_day = 5, .max_concurrent = 1 } };
	struct auth_options o = { .allow_anonymous = true, .anonymous = &a };
	char *home = tu_mkhome();
	struct auth_identity id;
	struct auth_store *st;

	st = auth_store_open(home, &o);
	a.n_providers = 0; /* copied at open */
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, NULL, NULL, &id), AUTH_OK);
	CU_ASSERT(auth_identity_allows(&id, "echo"));
	CU_ASSERT(auth_identity_allows(&id, "local"));
	CU_ASSERT_FALSE(auth_identity_allows(&id, "codex"));
	CU_ASSERT_EQUAL(id.quota.requests_per_day, 5);
	CU_ASSERT_EQUAL(id.quota.max_concurrent, 1);
	CU_ASSERT_FALSE(auth_identity_may_hold_login(&id, "local"));
	auth_identity_release(&id);
	auth_store_free(st);

	a.all_providers = true;
	st = auth_store_open(home, &o);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, NULL, NULL, &id), AUTH_OK);
	CU_ASSERT(auth_identity_allows(&id, "codex"));
	CU_ASSERT_FALSE(auth_identity_may_hold_login(&id, "codex"));
	auth_identity_release(&id);
	auth_store_free(st);
	tu_rmhome(home);
}

/* login_access: set by keygen and set-login, kept in the manifest, carried by the guest's
 * identity, listed for /health; an owner holds every login, a guest none unless named. */
static void test_login_access(void)
{
	static const char *const codex[] = { "codex" }, *const two[] = { "vibe", "codex" };
	struct auth_key_spec g = { .name = "g", .tier = AUTH_TIER_GUEST };
	struct auth_key_spec o = { .name = "owner", .tier = AUTH_TIER_OWNER };
	char *home = tu_mkhome(), *authz, **now = NULL;
	struct auth_login_grant *grants;
	struct auth_new_key owner, guest, plain;
	struct auth_identity id;
	struct auth_store *st;
	struct buf msg = BUF_INIT;
	size_t n = 0, ng;
	json_t *m;

	/* An owner key reaches every login already: no list on it. */
	o.login_access = codex;
	o.n_login_access = 1;
	CU_ASSERT_EQUAL(auth_key_create(home, &o, &owner, &msg), AUTH_KEY_ERR_INVALID_ARG);
	o.n_login_access = 0;
	CU_ASSERT_EQUAL_FATAL(auth_key_create(home, &o, &owner, &msg), AUTH_KEY_OK);
	CU_ASSERT_EQUAL_FATAL(auth_key_create(home, &g, &plain, &msg), AUTH_KEY_OK);
	g.login_access = codex;
	g.n_login_access = 1;
	CU_ASSERT_EQUAL_FATAL(auth_key_create(home, &g, &guest, &msg), AUTH_KEY_OK);
	/* Written only where given: other manifests keep the Node OLP's exact fields. */
	m = tu_manifest(home, plain.id);
	CU_ASSERT_PTR_NULL(json_object_get(m, "login_access"));
	json_decref(m);
	m = tu_manifest(home, guest.id);
	CU_ASSERT_STRING_EQUAL(
		json_string_value(json_array_get(json_object_get(m, "login_access"), 0)), "codex");
	json_decref(m);

	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	authz = bearer(owner.token);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, authz, NULL, &id), AUTH_OK);
	CU_ASSERT(auth_identity_may_hold_login(&id, "codex"));
	auth_identity_release(&id);
	free(authz);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, NULL, plain.token, &id), AUTH_OK);
	CU_ASSERT_FALSE(auth_identity_may_hold_login(&id, "codex"));
	auth_identity_release(&id);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, NULL, guest.token, &id), AUTH_OK);
	CU_ASSERT(auth_identity_may_hold_login(&id, "codex"));
	CU_ASSERT_FALSE(auth_identity_may_hold_login(&id, "vibe"));
	auth_identity_release(&id);

	/* set-login: allow, take back, clear; an owner refused; seen on the next check. */
	CU_ASSERT_EQUAL(auth_key_set_login(home, plain.id, two, 2, true, false, &now, &n, &msg),
			AUTH_KEY_OK);
	CU_ASSERT_EQUAL_FATAL(n, 2);
	auth_strings_free(now, n);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, NULL, plain.token, &id), AUTH_OK);
	CU_ASSERT(auth_identity_may_hold_login(&id, "vibe"));
	auth_identity_release(&id);
	CU_ASSERT_EQUAL(auth_key_set_login(home, plain.id, two, 1, false, false, &now, &n, &msg),
			AUTH_KEY_OK);
	CU_ASSERT_EQUAL_FATAL(n, 1);
	CU_ASSERT_STRING_EQUAL(now[0], "codex");
	auth_strings_free(now, n);
	CU_ASSERT_EQUAL(auth_login_grants(st, &grants, &ng), 0);
	CU_ASSERT_EQUAL(ng, 2); /* plain: codex; guest: codex */
	for (size_t i = 0; i < ng; i++)
		CU_ASSERT_STRING_EQUAL(grants[i].provider, "codex");
	free(grants);
	CU_ASSERT_EQUAL(auth_key_set_login(home, plain.id, NULL, 0, false, true, &now, &n, &msg),
			AUTH_KEY_OK);
	CU_ASSERT_EQUAL(n, 0);
	auth_strings_free(now, n);
	m = tu_manifest(home, plain.id);
	CU_ASSERT_PTR_NULL(json_object_get(m, "login_access"));
	json_decref(m);
	CU_ASSERT_EQUAL(auth_key_set_login(home, owner.id, codex, 1, true, false, NULL, NULL, &msg),
			AUTH_KEY_ERR_INVALID_ARG);
	CU_ASSERT_EQUAL(auth_key_set_login(home, plain.id, (const char *const[]){ "a/b" }, 1, true,
					   false, NULL, NULL, &msg),
			AUTH_KEY_ERR_INVALID_ARG);
	CU_ASSERT_EQUAL(auth_login_grants(st, &grants, &ng), 0);
	CU_ASSERT_EQUAL(ng, 1);
	free(grants);
	/* A revoked key's grant is no risk any more. */
	CU_ASSERT_EQUAL(auth_key_revoke(home, guest.id, NULL, &msg), AUTH_KEY_OK);
	CU_ASSERT_EQUAL(auth_login_grants(st, &grants, &ng), 0);
	CU_ASSERT_EQUAL(ng, 0);
	free(grants);
	auth_store_free(st);
	auth_new_key_wipe(&owner);
	auth_new_key_wipe(&guest);
	auth_new_key_wipe(&plain);
	buf_release(&msg);
	tu_rmhome(home);
}

/* "accounts" (ADR 0037): written by keygen and set-account, carried by the identity
 * (auth_identity_account), an owner's too; unbinding removes the field when empty. */
static void test_accounts(void)
{
	static const char *const bind[] = { "claude=bob", "codex=alice" };
	struct auth_key_spec g = { .name = "g", .tier = AUTH_TIER_GUEST };
	char *home = tu_mkhome(), p[AUTH_PROVIDER_MAX], a[AUTH_ACCOUNT_MAX];
	struct auth_new_key key;
	struct auth_identity id;
	struct auth_store *st;
	struct buf msg = BUF_INIT;
	json_t *m;

	CU_ASSERT_EQUAL(auth_binding_split("claude=bob", p, a), 0);
	CU_ASSERT_STRING_EQUAL(p, "claude");
	CU_ASSERT_STRING_EQUAL(a, "bob");
	CU_ASSERT_EQUAL(auth_binding_split("claude", p, a), -EINVAL);
	CU_ASSERT_EQUAL(auth_binding_split("=bob", p, a), -EINVAL);
	CU_ASSERT_EQUAL(auth_binding_split("claude=", p, a), -EINVAL);
	CU_ASSERT_EQUAL(auth_binding_split("claude=B", p, a), -EINVAL);
	CU_ASSERT_EQUAL(auth_binding_split("claude=abcdefghijabcdefghijabcdefghijabc", p, a),
			-EINVAL);
	g.accounts = (const char *const[]){ "claude=bob", "claude=eve" };
	g.n_accounts = 2;
	CU_ASSERT_EQUAL(auth_key_create(home, &g, &key, &msg), AUTH_KEY_ERR_INVALID_ARG);
	g.accounts = bind;
	CU_ASSERT_EQUAL_FATAL(auth_key_create(home, &g, &key, &msg), AUTH_KEY_OK);
	m = tu_manifest(home, key.id);
	CU_ASSERT_STRING_EQUAL(
		json_string_value(json_object_get(json_object_get(m, "accounts"), "codex")),
		"alice");
	json_decref(m);
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, NULL, key.token, &id), AUTH_OK);
	CU_ASSERT_STRING_EQUAL(auth_identity_account(&id, "claude"), "bob");
	CU_ASSERT_STRING_EQUAL(auth_identity_account(&id, "codex"), "alice");
	CU_ASSERT_PTR_NULL(auth_identity_account(&id, "claud"));
	CU_ASSERT_PTR_NULL(auth_identity_account(&id, "vibe"));
	auth_identity_release(&id);
	/* set-account: rebind, unbind; seen on the next check. */
	CU_ASSERT_EQUAL(
		auth_key_set_account_at(AUTH_TARGET_FILES(home), key.id, "claude", "carol", &msg),
		AUTH_KEY_OK);
	CU_ASSERT_EQUAL(
		auth_key_set_account_at(AUTH_TARGET_FILES(home), key.id, "codex", NULL, &msg),
		AUTH_KEY_OK);
	CU_ASSERT_EQUAL(
		auth_key_set_account_at(AUTH_TARGET_FILES(home), key.id, "codex", "x.y", &msg),
		AUTH_KEY_ERR_INVALID_ARG);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, NULL, key.token, &id), AUTH_OK);
	CU_ASSERT_STRING_EQUAL(auth_identity_account(&id, "claude"), "carol");
	CU_ASSERT_PTR_NULL(auth_identity_account(&id, "codex"));
	auth_identity_release(&id);
	CU_ASSERT_EQUAL(
		auth_key_set_account_at(AUTH_TARGET_FILES(home), key.id, "claude", NULL, &msg),
		AUTH_KEY_OK);
	m = tu_manifest(home, key.id);
	CU_ASSERT_PTR_NULL(json_object_get(m, "accounts"));
	json_decref(m);
	auth_store_free(st);
	auth_new_key_wipe(&key);
	buf_release(&msg);
	tu_rmhome(home);
}

/* Every key for /v1/usage, from the index: names, tiers, quotas and revocations as the
 * manifests say, in the listing's order; an invalid manifest left out; a key made, given a
 * quota, revoked or deleted since is seen by the very next call. */
static void test_store_keys(void)
{
	struct auth_key_spec g = { .name = "guest \"one\"", .tier = AUTH_TIER_GUEST };
	struct auth_key_spec o = { .name = "owner", .tier = AUTH_TIER_OWNER };
	const struct auth_quota q = { .requests_per_day = 9 };
	char *home = tu_mkhome(), path[512];
	struct auth_new_key owner, guest, late;
	struct auth_key_summary *v;
	struct auth_store *st;
	struct buf msg = BUF_INIT;
	size_t n;

	g.quota = (struct auth_quota){ .requests_per_minute = 5, .max_concurrent = 2 };
	CU_ASSERT_EQUAL_FATAL(auth_key_create(home, &o, &owner, &msg), AUTH_KEY_OK);
	CU_ASSERT_EQUAL_FATAL(auth_key_create(home, &g, &guest, &msg), AUTH_KEY_OK);
	tu_write_manifest(home, "badbad12", "[1,2]");
	/* Past the window in which a scan treats keys/ as changed whatever its stat says
	 * (racy(): its coarse timestamps), so that what follows is seen through the
	 * manifests' own stat. */
	usleep(120 * 1000);
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	CU_ASSERT_EQUAL(auth_store_keys(NULL, &v, &n), -EINVAL);
	CU_ASSERT_EQUAL_FATAL(auth_store_keys(st, &v, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 2);
	for (size_t i = 0; i + 1 < n; i++) {
		int c = strcmp(v[i].created_at, v[i + 1].created_at);

		CU_ASSERT(c < 0 || (c == 0 && strcmp(v[i].id, v[i + 1].id) < 0));
	}
	for (size_t i = 0; i < n; i++) {
		if (!strcmp(v[i].id, owner.id)) {
			CU_ASSERT_STRING_EQUAL(v[i].name, "owner");
			CU_ASSERT_EQUAL(v[i].tier, AUTH_TIER_OWNER);
			CU_ASSERT(auth_quota_none(&v[i].quota));
		} else {
			CU_ASSERT_STRING_EQUAL(v[i].id, guest.id);
			CU_ASSERT_STRING_EQUAL(v[i].name, "guest \"one\"");
			CU_ASSERT_EQUAL(v[i].tier, AUTH_TIER_GUEST);
			CU_ASSERT_EQUAL(v[i].quota.requests_per_minute, 5);
			CU_ASSERT_EQUAL(v[i].quota.max_concurrent, 2);
		}
		CU_ASSERT_FALSE(v[i].revoked);
	}
	auth_key_summaries_free(v, n);
	/* Changes made by another process (here, these very calls) show at once: a quota set
	 * and a revocation rewrite the manifest, a new key and a deleted one change keys/. */
	CU_ASSERT_EQUAL(auth_key_set_quota(home, guest.id, &q, AUTH_QUOTA_RPD, NULL, &msg),
			AUTH_KEY_OK);
	CU_ASSERT_EQUAL_FATAL(auth_store_keys(st, &v, &n), 0);
	for (size_t i = 0; i < n; i++)
		if (!strcmp(v[i].id, guest.id))
			CU_ASSERT_EQUAL(v[i].quota.requests_per_day, 9);
	auth_key_summaries_free(v, n);
	CU_ASSERT_EQUAL(auth_key_revoke(home, guest.id, NULL, &msg), AUTH_KEY_OK);
	g.name = "late";
	CU_ASSERT_EQUAL_FATAL(auth_key_create(home, &g, &late, &msg), AUTH_KEY_OK);
	CU_ASSERT_EQUAL_FATAL(auth_store_keys(st, &v, &n), 0);
	CU_ASSERT_EQUAL_FATAL(n, 3);
	for (size_t i = 0; i < n; i++) {
		CU_ASSERT_EQUAL(v[i].revoked, !strcmp(v[i].id, guest.id));
		if (!strcmp(v[i].id, late.id))
			CU_ASSERT_STRING_EQUAL(v[i].name, "late");
	}
	auth_key_summaries_free(v, n);
	snprintf(path, sizeof(path), "%s/keys/%s/manifest.json", home, late.id);
	CU_ASSERT_FATAL(unlink(path) == 0);
	snprintf(path, sizeof(path), "%s/keys/%s", home, late.id);
	CU_ASSERT_FATAL(rmdir(path) == 0);
	CU_ASSERT_EQUAL_FATAL(auth_store_keys(st, &v, &n), 0);
	CU_ASSERT_EQUAL(n, 2);
	for (size_t i = 0; i < n; i++)
		CU_ASSERT_STRING_NOT_EQUAL(v[i].id, late.id);
	auth_key_summaries_free(v, n);
	auth_store_free(st);
	auth_new_key_wipe(&owner);
	auth_new_key_wipe(&guest);
	auth_new_key_wipe(&late);
	buf_release(&msg);
	tu_rmhome(home);
}

/* The owner's /health asks for the grants on every call: a set-login or a revocation
 * shows at once though keys/ itself did not change (only the key's manifest did), and
 * with neither, nothing is re-read. */
static void test_login_grants_follow_manifests(void)
{
	static const char *const codex[] = { "codex" };
	struct auth_key_spec g = { .name = "g", .tier = AUTH_TIER_GUEST };
	char *home = tu_mkhome();
	struct auth_login_grant *grants;
	struct auth_new_key guest;
	struct auth_store *st;
	struct buf msg = BUF_INIT;
	size_t ng;

	CU_ASSERT_EQUAL_FATAL(auth_key_create(home, &g, &guest, &msg), AUTH_KEY_OK);
	/* keys/ last changed well before the store's scan: no "racy" rescan. */
	usleep(150 * 1000);
	st = auth_store_open(home, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	CU_ASSERT_EQUAL(auth_login_grants(st, &grants, &ng), 0);
	CU_ASSERT_EQUAL(ng, 0);
	free(grants);
	CU_ASSERT_EQUAL(auth_key_set_login(home, guest.id, codex, 1, true, false, NULL, NULL, &msg),
			AUTH_KEY_OK);
	CU_ASSERT_EQUAL(auth_login_grants(st, &grants, &ng), 0);
	CU_ASSERT_EQUAL_FATAL(ng, 1);
	CU_ASSERT_STRING_EQUAL(grants[0].key_id, guest.id);
	CU_ASSERT_STRING_EQUAL(grants[0].provider, "codex");
	free(grants);
	CU_ASSERT_EQUAL(auth_login_grants(st, &grants, &ng), 0); /* unchanged: the same */
	CU_ASSERT_EQUAL(ng, 1);
	free(grants);
	CU_ASSERT_EQUAL(auth_key_revoke(home, guest.id, NULL, &msg), AUTH_KEY_OK);
	CU_ASSERT_EQUAL(auth_login_grants(st, &grants, &ng), 0);
	CU_ASSERT_EQUAL(ng, 0);
	free(grants);
	auth_store_free(st);
	auth_new_key_wipe(&guest);
	buf_release(&msg);
	tu_rmhome(home);
}

static void test_check_env_owner(void)
{
	char *home = tu_mkhome();
	struct auth_options o = { .env_owner_token = "env-secret-token" };
	struct auth_identity id;
	struct auth_store *st;
	struct stat sb;
	struct buf keys = BUF_INIT;

	st = auth_store_open(home, &o);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, "Bearer env-secret-token", NULL, &id), AUTH_OK);
	CU_ASSERT_EQUAL(id.tier, AUTH_TIER_OWNER);
	CU_ASSERT_STRING_EQUAL(id.key_id, "__env_owner__");
	CU_ASSERT(id.all_providers);
	auth_touch(st, &id);
	auth_identity_release(&id);
	CU_ASSERT_EQUAL(auth_check(st, NULL, "env-secret-token", &id), AUTH_OK);
	auth_identity_release(&id);
	CU_ASSERT_EQUAL(auth_check(st, NULL, "env-secret-tokeN", &id), AUTH_ERR_INVALID);
	auth_store_free(st);
	/* Touching a synthetic identity wrote nothing. */
	buf_addf(&keys, "%s/keys", home);
	CU_ASSERT_EQUAL(stat(keys.data, &sb), -1);
	buf_release(&keys);
	tu_rmhome(home);
}

static void test_check_keys_and_tiers(void)
{
	static const char *const only_claude[] = { "claude" };
	char *home = tu_mkhome(), *authz;
	struct auth_new_key owner, guest;
	struct auth_identity id;
	struct auth_store *st;

	make_key(home, "owner", AUTH_TIER_OWNER, NULL, 0, &owner);
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	authz = bearer(owner.token);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, authz, NULL, &id), AUTH_OK);
	CU_ASSERT_EQUAL(id.tier, AUTH_TIER_OWNER);
	CU_ASSERT_STRING_EQUAL(id.key_id, owner.id);
	CU_ASSERT(auth_identity_allows(&id, "codex"));
	auth_identity_release(&id);
	free(authz);

	/* Created after the store was opened: usable on the very next request. */
	make_key(home, "alice", AUTH_TIER_GUEST, only_claude, 1, &guest);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, NULL, guest.token, &id), AUTH_OK);
	CU_ASSERT_EQUAL(id.tier, AUTH_TIER_GUEST);
	CU_ASSERT_STRING_EQUAL(id.key_id, guest.id);
	CU_ASSERT_FALSE(id.all_providers);
	CU_ASSERT(auth_identity_allows(&id, "claude"));
	CU_ASSERT_FALSE(auth_identity_allows(&id, "codex"));
	CU_ASSERT_FALSE(auth_identity_allows(&id, NULL));
	auth_identity_release(&id);

	/* A token differing in one character, or a prefix of a real one, is no key. */
	guest.token[20] ^= 1;
	CU_ASSERT_EQUAL(auth_check(st, NULL, guest.token, &id), AUTH_ERR_INVALID);
	guest.token[20] ^= 1;
	guest.token[46] = '\0';
	CU_ASSERT_EQUAL(auth_check(st, NULL, guest.token, &id), AUTH_ERR_INVALID);

	CU_ASSERT_STRING_EQUAL(auth_tier_name(AUTH_TIER_OWNER), "owner");
	CU_ASSERT_STRING_EQUAL(auth_tier_name(AUTH_TIER_GUEST), "guest");
	CU_ASSERT_STRING_EQUAL(auth_tier_name(AUTH_TIER_ANONYMOUS), "anonymous");
	CU_ASSERT_STRING_EQUAL(auth_tier_name(AUTH_TIER_NONE), "none");
	memset(&id, 0, sizeof(id));
	CU_ASSERT_FALSE(auth_identity_allows(&id, "claude"));
	auth_store_free(st);
	auth_new_key_wipe(&owner);
	auth_new_key_wipe(&guest);
	tu_rmhome(home);
}

/* A revocation by another process is refused on the very next check, without reopening. */
static void test_check_revoked_next_request(void)
{
	char *home = tu_mkhome(), *authz;
	struct auth_new_key k;
	struct auth_identity id;
	struct auth_store *st;
	struct buf dir = BUF_INIT;
	pid_t pid;
	int status;

	make_key(home, "soon-revoked", AUTH_TIER_GUEST, NULL, 0, &k);
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	authz = bearer(k.token);
	CU_ASSERT_EQUAL(auth_check(st, authz, NULL, &id), AUTH_OK);
	auth_identity_release(&id);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0)
		_exit(auth_key_revoke(home, k.id, NULL, NULL) == AUTH_KEY_OK ? 0 : 1);
	CU_ASSERT_EQUAL(waitpid(pid, &status, 0), pid);
	CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CU_ASSERT_EQUAL(auth_check(st, authz, NULL, &id), AUTH_ERR_INVALID);
	CU_ASSERT_EQUAL(auth_check(st, authz, NULL, &id), AUTH_ERR_INVALID);

	/* A deleted key directory is refused too. */
	auth_new_key_wipe(&k);
	make_key(home, "soon-deleted", AUTH_TIER_GUEST, NULL, 0, &k);
	free(authz);
	authz = bearer(k.token);
	CU_ASSERT_EQUAL(auth_check(st, authz, NULL, &id), AUTH_OK);
	auth_identity_release(&id);
	buf_addf(&dir, "%s/keys/%s/manifest.json", home, k.id);
	CU_ASSERT_EQUAL(unlink(dir.data), 0);
	CU_ASSERT_EQUAL(auth_check(st, authz, NULL, &id), AUTH_ERR_INVALID);
	auth_store_free(st);
	free(authz);
	buf_release(&dir);
	auth_new_key_wipe(&k);
	tu_rmhome(home);
}

/* A quota set by another process (olp-keys set-quota) applies to a running store's very
 * next check; keygen writes one; bad values are refused before anything is written. */
static void test_check_quota_next_request(void)
{
	struct auth_key_spec spec = { .name = "q", .tier = AUTH_TIER_GUEST };
	char *home = tu_mkhome(), *authz;
	struct auth_quota q = { .requests_per_day = 3, .tokens_per_day = 500 }, now;
	struct auth_identity id;
	struct auth_new_key k;
	struct auth_store *st;
	struct buf msg = BUF_INIT;
	json_t *m;
	pid_t pid;
	int status;

	spec.quota = (struct auth_quota){ .requests_per_minute = 10 };
	CU_ASSERT_EQUAL_FATAL(auth_key_create(home, &spec, &k, &msg), AUTH_KEY_OK);
	m = tu_manifest(home, k.id);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(json_object_get(m, "quota"),
							   "requests_per_minute")),
			10);
	CU_ASSERT_EQUAL(json_object_size(json_object_get(m, "quota")), 1);
	json_decref(m);
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	authz = bearer(k.token);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, authz, NULL, &id), AUTH_OK);
	CU_ASSERT_EQUAL(id.quota.requests_per_minute, 10);
	CU_ASSERT_EQUAL(id.quota.requests_per_day, 0);
	auth_identity_release(&id);

	/* Another process sets rpd and tpd, keeping rpm. */
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0)
		_exit(auth_key_set_quota(home, k.id, &q, AUTH_QUOTA_RPD | AUTH_QUOTA_TPD, NULL,
					 NULL) == AUTH_KEY_OK
			      ? 0
			      : 1);
	CU_ASSERT_EQUAL(waitpid(pid, &status, 0), pid);
	CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, authz, NULL, &id), AUTH_OK);
	CU_ASSERT_EQUAL(id.quota.requests_per_minute, 10);
	CU_ASSERT_EQUAL(id.quota.requests_per_day, 3);
	CU_ASSERT_EQUAL(id.quota.tokens_per_day, 500);
	CU_ASSERT_EQUAL(id.quota.max_concurrent, 0);
	auth_identity_release(&id);

	/* max_concurrent alone, keeping the rest; written as an integer, read back. */
	q.max_concurrent = 1024;
	CU_ASSERT_EQUAL(auth_key_set_quota(home, k.id, &q, AUTH_QUOTA_CONC, &now, &msg),
			AUTH_KEY_OK);
	CU_ASSERT_EQUAL(now.max_concurrent, 1024);
	CU_ASSERT_EQUAL(now.requests_per_day, 3);
	m = tu_manifest(home, k.id);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT_EQUAL(
		json_integer_value(json_object_get(json_object_get(m, "quota"), "max_concurrent")),
		1024);
	json_decref(m);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, authz, NULL, &id), AUTH_OK);
	CU_ASSERT_EQUAL(id.quota.max_concurrent, 1024);
	CU_ASSERT_EQUAL(id.quota.requests_per_day, 3);
	auth_identity_release(&id);
	/* max_concurrent alone is a quota too: not written as null. */
	q = (struct auth_quota){ .max_concurrent = 1 };
	CU_ASSERT_EQUAL(auth_key_set_quota(home, k.id, &q, AUTH_QUOTA_ALL, &now, &msg),
			AUTH_KEY_OK);
	m = tu_manifest(home, k.id);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT_EQUAL(json_object_size(json_object_get(m, "quota")), 1);
	json_decref(m);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, authz, NULL, &id), AUTH_OK);
	CU_ASSERT_EQUAL(id.quota.max_concurrent, 1);
	CU_ASSERT_EQUAL(id.quota.requests_per_minute, 0);
	auth_identity_release(&id);
	/* Out of range for max_concurrent, though fine for the others. */
	q.max_concurrent = 1025;
	CU_ASSERT_EQUAL(auth_key_set_quota(home, k.id, &q, AUTH_QUOTA_CONC, NULL, &msg),
			AUTH_KEY_ERR_INVALID_ARG);
	q.max_concurrent = -1;
	CU_ASSERT_EQUAL(auth_key_set_quota(home, k.id, &q, AUTH_QUOTA_CONC, NULL, &msg),
			AUTH_KEY_ERR_INVALID_ARG);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, authz, NULL, &id), AUTH_OK);
	CU_ASSERT_EQUAL(id.quota.max_concurrent, 1);
	auth_identity_release(&id);

	/* Lifted: all limits to 0 is "quota": null, seen at once too. */
	q = (struct auth_quota){ 0 };
	CU_ASSERT_EQUAL(auth_key_set_quota(home, k.id, &q, AUTH_QUOTA_ALL, &now, &msg),
			AUTH_KEY_OK);
	CU_ASSERT_FALSE(now.requests_per_minute || now.requests_per_day || now.tokens_per_day ||
			now.max_concurrent);
	m = tu_manifest(home, k.id);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT(json_is_null(json_object_get(m, "quota")));
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(m, "name")), "q");
	json_decref(m);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, authz, NULL, &id), AUTH_OK);
	CU_ASSERT_FALSE(id.quota.requests_per_minute || id.quota.requests_per_day ||
			id.quota.tokens_per_day);
	auth_identity_release(&id);

	/* Refused: a negative or too large limit, a bad id, a missing key, a bad keygen. */
	q.requests_per_day = -1;
	CU_ASSERT_EQUAL(auth_key_set_quota(home, k.id, &q, AUTH_QUOTA_RPD, NULL, &msg),
			AUTH_KEY_ERR_INVALID_ARG);
	q.requests_per_day = AUTH_QUOTA_MAX + 1;
	CU_ASSERT_EQUAL(auth_key_set_quota(home, k.id, &q, AUTH_QUOTA_RPD, NULL, &msg),
			AUTH_KEY_ERR_INVALID_ARG);
	q.requests_per_day = 1;
	CU_ASSERT_EQUAL(auth_key_set_quota(home, "../etc", &q, AUTH_QUOTA_RPD, NULL, &msg),
			AUTH_KEY_ERR_INVALID_ARG);
	CU_ASSERT_EQUAL(auth_key_set_quota(home, "nosuch00", &q, AUTH_QUOTA_RPD, NULL, &msg),
			AUTH_KEY_ERR_NOT_FOUND);
	spec.quota.tokens_per_day = -5;
	auth_new_key_wipe(&k);
	CU_ASSERT_EQUAL(auth_key_create(home, &spec, &k, &msg), AUTH_KEY_ERR_INVALID_ARG);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, authz, NULL, &id), AUTH_OK);
	CU_ASSERT_EQUAL(id.quota.requests_per_day, 0);
	auth_identity_release(&id);
	auth_store_free(st);
	free(authz);
	buf_release(&msg);
	tu_rmhome(home);
}

/* Root editing a store another user owns (sudo olp-keys set-quota) leaves each manifest
 * its directory owner's, or the workers could no longer read the key. */
static void test_root_edit_keeps_owner(void)
{
	struct auth_key_spec spec = { .name = "o", .tier = AUTH_TIER_GUEST };
	struct auth_quota q = { .requests_per_day = 1 };
	const uid_t uid = 4242;
	const gid_t gid = 4343;
	char *home, path[4096];
	struct auth_new_key k;
	struct stat sb;

	if (geteuid() != 0) {
		printf("\n  (skipped: needs root to chown) ");
		return;
	}
	home = tu_mkhome();
	CU_ASSERT_EQUAL_FATAL(auth_key_create(home, &spec, &k, NULL), AUTH_KEY_OK);
	snprintf(path, sizeof(path), "%s/keys/%s", home, k.id);
	CU_ASSERT_FATAL(chown(path, uid, gid) == 0);
	CU_ASSERT_EQUAL(auth_key_set_quota(home, k.id, &q, AUTH_QUOTA_RPD, NULL, NULL),
			AUTH_KEY_OK);
	snprintf(path, sizeof(path), "%s/keys/%s/manifest.json", home, k.id);
	CU_ASSERT_FATAL(stat(path, &sb) == 0);
	CU_ASSERT_EQUAL(sb.st_uid, uid);
	CU_ASSERT_EQUAL(sb.st_gid, gid);
	CU_ASSERT_EQUAL(sb.st_mode & 07777, 0600);
	CU_ASSERT_EQUAL(auth_key_revoke(home, k.id, NULL, NULL), AUTH_KEY_OK);
	CU_ASSERT_FATAL(stat(path, &sb) == 0);
	CU_ASSERT_EQUAL(sb.st_uid, uid);
	auth_new_key_wipe(&k);
	tu_rmhome(home);
}

/* Root making a key in a store another user owns (sudo olp-keys keygen) gives the key's
 * directory and manifest keys/'s owner, or no worker could read the new key. */
static void test_root_keygen_keeps_owner(void)
{
	struct auth_key_spec spec = { .name = "g", .tier = AUTH_TIER_GUEST };
	const uid_t uid = 4242;
	const gid_t gid = 4343;
	char *home, path[4096];
	struct auth_new_key k;
	struct stat sb;

	if (geteuid() != 0) {
		printf("\n  (skipped: needs root to chown) ");
		return;
	}
	home = tu_mkhome();
	snprintf(path, sizeof(path), "%s/keys", home);
	CU_ASSERT_FATAL(mkdir(path, 0700) == 0);
	CU_ASSERT_FATAL(chown(home, uid, gid) == 0 && chown(path, uid, gid) == 0);
	CU_ASSERT_EQUAL_FATAL(auth_key_create(home, &spec, &k, NULL), AUTH_KEY_OK);
	snprintf(path, sizeof(path), "%s/keys/%s", home, k.id);
	CU_ASSERT_FATAL(stat(path, &sb) == 0);
	CU_ASSERT_EQUAL(sb.st_uid, uid);
	CU_ASSERT_EQUAL(sb.st_gid, gid);
	CU_ASSERT_EQUAL(sb.st_mode & 07777, 0700);
	snprintf(path, sizeof(path), "%s/keys/%s/manifest.json", home, k.id);
	CU_ASSERT_FATAL(stat(path, &sb) == 0);
	CU_ASSERT_EQUAL(sb.st_uid, uid);
	CU_ASSERT_EQUAL(sb.st_gid, gid);
	CU_ASSERT_EQUAL(sb.st_mode & 07777, 0600);
	auth_new_key_wipe(&k);
	tu_rmhome(home);
}

/* Root making the first key of a fresh home another user owns (sudo olp-keys keygen before
 * any keys/ exists) makes keys/ with OLP_HOME's owner, and so the key and its manifest:
 * a root-owned keys/ would be a store in which every key is refused. */
static void test_root_keygen_fresh_home(void)
{
	struct auth_key_spec spec = { .name = "first", .tier = AUTH_TIER_OWNER };
	const uid_t uid = 4242;
	const gid_t gid = 4343;
	char *home, path[3][4096];
	struct auth_new_key k;
	struct stat sb;

	if (geteuid() != 0) {
		printf("\n  (skipped: needs root to chown) ");
		return;
	}
	home = tu_mkhome();
	CU_ASSERT_FATAL(chown(home, uid, gid) == 0);
	CU_ASSERT_EQUAL_FATAL(auth_key_create(home, &spec, &k, NULL), AUTH_KEY_OK);
	snprintf(path[0], sizeof(path[0]), "%s/keys", home);
	snprintf(path[1], sizeof(path[1]), "%s/keys/%s", home, k.id);
	snprintf(path[2], sizeof(path[2]), "%s/keys/%s/manifest.json", home, k.id);
	for (size_t i = 0; i < 3; i++) {
		CU_ASSERT_FATAL(stat(path[i], &sb) == 0);
		CU_ASSERT_EQUAL(sb.st_uid, uid);
		CU_ASSERT_EQUAL(sb.st_gid, gid);
		CU_ASSERT_EQUAL(sb.st_mode & 07777, i == 2 ? 0600 : 0700);
	}
	auth_new_key_wipe(&k);
	tu_rmhome(home);
}

/* A store written by hand in the Node OLP's format works as is. */
static void test_node_fixture(void)
{
	char *home = tu_mkhome();
	struct auth_identity id;
	struct auth_store *st;
	json_t *m;

	CU_ASSERT_EQUAL_FATAL(tu_copy_tree(AUTH_FIXTURE_DIR, home), 0);
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, "Bearer " FIX_OWNER_TOKEN, NULL, &id), AUTH_OK);
	CU_ASSERT_EQUAL(id.tier, AUTH_TIER_OWNER);
	CU_ASSERT_STRING_EQUAL(id.key_id, "own3r0k1");
	auth_identity_release(&id);
	CU_ASSERT_EQUAL(auth_check(st, NULL, FIX_REVOKED_TOKEN, &id), AUTH_ERR_INVALID);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, NULL, FIX_GUEST_TOKEN, &id), AUTH_OK);
	CU_ASSERT_EQUAL(id.tier, AUTH_TIER_GUEST);
	/* The Node OLP's "quota": null: no limit. */
	CU_ASSERT_FALSE(id.quota.requests_per_minute || id.quota.requests_per_day ||
			id.quota.tokens_per_day);
	CU_ASSERT(auth_identity_allows(&id, "claude"));
	CU_ASSERT_FALSE(auth_identity_allows(&id, "vibe"));
	auth_touch(st, &id);
	auth_identity_release(&id);
	auth_store_free(st); /* flushes the last_used_at write */
	m = tu_manifest(home, "gu3st0k1");
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT(json_is_string(json_object_get(m, "last_used_at")));
	CU_ASSERT(json_is_true(json_object_get(json_object_get(m, "x_node_extra"), "kept")));
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(m, "notes")),
			       "written by hand in the Node OLP format");
	json_decref(m);
	tu_rmhome(home);
}

/* ---- last_used_at ------------------------------------------------------------------ */

static bool iso_like(const char *s)
{
	/* 2025-01-02T03:04:05.678Z */
	return s && strlen(s) == 24 && s[4] == '-' && s[10] == 'T' && s[19] == '.' && s[23] == 'Z';
}

static void test_touch(void)
{
	char *home = tu_mkhome();
	struct auth_new_key a, b;
	struct auth_identity ia, ib;
	struct auth_store *st;
	json_t *m;
	const char *first;
	char saved[32]; /* an ISO time: 24 characters */

	make_key(home, "a", AUTH_TIER_GUEST, NULL, 0, &a);
	make_key(home, "b", AUTH_TIER_GUEST, NULL, 0, &b);
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, NULL, a.token, &ia), AUTH_OK);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, NULL, b.token, &ib), AUTH_OK);
	auth_touch(st, &ia);
	/* b is revoked between its request and its touch: the touch must not revive it. */
	CU_ASSERT_EQUAL(auth_key_revoke(home, b.id, NULL, NULL), AUTH_KEY_OK);
	auth_touch(st, &ib);
	auth_store_free(st);

	m = tu_manifest(home, a.id);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	first = json_string_value(json_object_get(m, "last_used_at"));
	CU_ASSERT(iso_like(first));
	CU_ASSERT(json_is_null(json_object_get(m, "revoked_at")));
	snprintf(saved, sizeof(saved), "%s", first ? first : "");
	json_decref(m);
	m = tu_manifest(home, b.id);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT(json_is_null(json_object_get(m, "last_used_at")));
	CU_ASSERT(iso_like(json_string_value(json_object_get(m, "revoked_at"))));
	json_decref(m);

	/* Coalesced: many touches within the interval write once. */
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	auth_identity_release(&ia);
	CU_ASSERT_EQUAL_FATAL(auth_check(st, NULL, a.token, &ia), AUTH_OK);
	usleep(5000);
	for (int i = 0; i < 100; i++)
		auth_touch(st, &ia);
	auth_store_free(st);
	m = tu_manifest(home, a.id);
	CU_ASSERT_STRING_NOT_EQUAL(json_string_value(json_object_get(m, "last_used_at")), saved);
	json_decref(m);

	auth_identity_release(&ia);
	auth_identity_release(&ib);
	auth_new_key_wipe(&a);
	auth_new_key_wipe(&b);
	tu_rmhome(home);
}

/* Two processes: one revokes while the other records last_used_at, many times over. A
 * revocation must never be lost to the concurrent rewrite. */
static void test_race_revoke_touch(void)
{
	char *home = tu_mkhome();
	int round, lost = 0, touched = 0;

	for (round = 0; round < RACE_ROUNDS; round++) {
		struct auth_new_key k;
		int ready[2], go[2], status;
		char c = 0;
		json_t *m;
		pid_t pid;

		make_key(home, "race", AUTH_TIER_GUEST, NULL, 0, &k);
		CU_ASSERT_FATAL(pipe(ready) == 0 && pipe(go) == 0);
		pid = fork();
		CU_ASSERT_FATAL(pid >= 0);
		if (pid == 0) {
			struct auth_store *st = auth_store_open(home, &no_opts);
			struct auth_identity id;
			enum auth_result r = auth_check(st, NULL, k.token, &id);

			if (write(ready[1], "r", 1) != 1 || read(go[0], &c, 1) != 1)
				_exit(3);
			auth_touch(st, &id);
			auth_store_free(st); /* joins the writer: the update is on disk */
			_exit(r == AUTH_OK ? 0 : 2);
		}
		close(ready[1]);
		close(go[0]);
		CU_ASSERT(read(ready[0], &c, 1) == 1);
		CU_ASSERT(write(go[1], "g", 1) == 1);
		CU_ASSERT_EQUAL(auth_key_revoke(home, k.id, NULL, NULL), AUTH_KEY_OK);
		CU_ASSERT_EQUAL(waitpid(pid, &status, 0), pid);
		CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
		close(ready[0]);
		close(go[1]);
		m = tu_manifest(home, k.id);
		CU_ASSERT_PTR_NOT_NULL_FATAL(m);
		if (!json_is_string(json_object_get(m, "revoked_at")))
			lost++;
		if (json_is_string(json_object_get(m, "last_used_at")))
			touched++;
		json_decref(m);
		auth_new_key_wipe(&k);
	}
	printf("\n    race: %d rounds, %d with last_used_at written before the revocation, "
	       "%d revocations lost ",
	       RACE_ROUNDS, touched, lost);
	CU_ASSERT_EQUAL(lost, 0);
	tu_rmhome(home);
}

/* One store, many threads checking and touching while keys come and go: every answer
 * is one of the two legal ones, and a revoked key is never accepted after its revocation
 * returned. (Run under -fsanitize=thread too.) */
enum { MT_THREADS = 4, MT_KEYS = 8 };

struct mt_ctx {
	struct auth_store *st;
	struct auth_new_key keys[MT_KEYS];
	atomic_int ready;	     /* keys[0..ready) exist on disk */
	atomic_int revoked[MT_KEYS]; /* 1 once auth_key_revoke() returned */
	atomic_bool stop;
	atomic_int bad;
};

static void *mt_worker(void *arg)
{
	struct mt_ctx *c = arg;
	unsigned n = 0;

	while (!atomic_load(&c->stop)) {
		unsigned i = n++ % (unsigned)atomic_load(&c->ready);
		int was_revoked = atomic_load(&c->revoked[i]);
		struct auth_identity id;
		enum auth_result r = auth_check(c->st, NULL, c->keys[i].token, &id);

		if (r == AUTH_OK) {
			if (was_revoked || strcmp(id.key_id, c->keys[i].id) != 0)
				atomic_fetch_add(&c->bad, 1);
			auth_touch(c->st, &id);
			auth_identity_release(&id);
		}
		if (auth_check(c->st, NULL, "olp_unknown", &id) != AUTH_ERR_INVALID)
			atomic_fetch_add(&c->bad, 1);
	}
	return NULL;
}

static void test_threads(void)
{
	char *home = tu_mkhome();
	struct mt_ctx *c = xcalloc(1, sizeof(*c));
	pthread_t th[MT_THREADS];
	int i;

	for (i = 0; i < MT_KEYS / 2; i++)
		make_key(home, "mt", AUTH_TIER_GUEST, NULL, 0, &c->keys[i]);
	atomic_store(&c->ready, MT_KEYS / 2);
	c->st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c->st);
	for (i = 0; i < MT_THREADS; i++)
		CU_ASSERT_FATAL(pthread_create(&th[i], NULL, mt_worker, c) == 0);
	/* Add the other half while the workers run, then revoke everything one by one. */
	for (i = MT_KEYS / 2; i < MT_KEYS; i++) {
		make_key(home, "mt-late", AUTH_TIER_GUEST, NULL, 0, &c->keys[i]);
		atomic_store(&c->ready, i + 1);
		usleep(20 * 1000);
	}
	for (i = 0; i < MT_KEYS; i++) {
		CU_ASSERT_EQUAL(auth_key_revoke(home, c->keys[i].id, NULL, NULL), AUTH_KEY_OK);
		atomic_store(&c->revoked[i], 1);
		usleep(20 * 1000);
	}
	atomic_store(&c->stop, true);
	for (i = 0; i < MT_THREADS; i++)
		pthread_join(th[i], NULL);
	CU_ASSERT_EQUAL(atomic_load(&c->bad), 0);
	auth_store_free(c->st);
	for (i = 0; i < MT_KEYS; i++) {
		json_t *m = tu_manifest(home, c->keys[i].id);

		CU_ASSERT(m && json_is_string(json_object_get(m, "revoked_at")));
		json_decref(m);
		auth_new_key_wipe(&c->keys[i]);
	}
	free(c);
	tu_rmhome(home);
}

/* ---- key management ---------------------------------------------------------------- */

/* The entry of list with this id, or NULL. */
static const struct auth_key_info *find_key(const struct auth_key_list *list, const char *id)
{
	for (size_t i = 0; i < list->n; i++)
		if (!strcmp(list->keys[i].id, id))
			return &list->keys[i];
	return NULL;
}

static void test_keys_manage(void)
{
	char *home = tu_mkhome();
	struct auth_key_spec owner = { .name = "owner", .tier = AUTH_TIER_OWNER };
	struct auth_key_spec bad = { .name = "bad\nname", .tier = AUTH_TIER_GUEST };
	struct auth_new_key k1, k2, k3;
	struct auth_key_list list;
	struct buf msg = BUF_INIT, p = BUF_INIT;
	bool was;

	CU_ASSERT_EQUAL(auth_key_create(home, &owner, &k1, &msg), AUTH_KEY_OK);
	CU_ASSERT_EQUAL(auth_key_create(home, &owner, &k2, &msg), AUTH_KEY_ERR_OWNER_EXISTS);
	CU_ASSERT(strstr(msg.data, "--force") != NULL);
	CU_ASSERT_EQUAL(k2.token[0], '\0'); /* nothing handed out on failure */
	owner.force = true;
	CU_ASSERT_EQUAL(auth_key_create(home, &owner, &k2, &msg), AUTH_KEY_OK);
	CU_ASSERT_STRING_NOT_EQUAL(k1.id, k2.id);
	CU_ASSERT_EQUAL(auth_key_create(home, &bad, &k3, &msg), AUTH_KEY_ERR_INVALID_ARG);
	bad.name = "ok";
	bad.tier = AUTH_TIER_ANONYMOUS;
	CU_ASSERT_EQUAL(auth_key_create(home, &bad, &k3, &msg), AUTH_KEY_ERR_INVALID_ARG);

	CU_ASSERT_EQUAL(auth_key_revoke(home, k1.id, &was, &msg), AUTH_KEY_OK);
	CU_ASSERT_FALSE(was);
	CU_ASSERT_EQUAL(auth_key_revoke(home, k1.id, &was, &msg), AUTH_KEY_OK);
	CU_ASSERT(was);
	CU_ASSERT_EQUAL(auth_key_revoke(home, "nosuch00", &was, &msg), AUTH_KEY_ERR_NOT_FOUND);
	CU_ASSERT_EQUAL(auth_key_revoke(home, "../../etc", &was, &msg), AUTH_KEY_ERR_INVALID_ARG);

	/* With every owner revoked, a new owner needs no --force. */
	owner.force = false;
	CU_ASSERT_EQUAL(auth_key_revoke(home, k2.id, &was, &msg), AUTH_KEY_OK);
	CU_ASSERT_EQUAL(auth_key_create(home, &owner, &k3, &msg), AUTH_KEY_OK);

	CU_ASSERT_EQUAL_FATAL(auth_key_list(home, &list, &msg), AUTH_KEY_OK);
	CU_ASSERT_EQUAL_FATAL(list.n, 3);
	/* Oldest first; keys made in the same millisecond tie on created_at and sort by
	 * their random id, so each key is looked up by id, and the order checked only
	 * where the times differ. */
	const struct auth_key_info *e1 = find_key(&list, k1.id), *e3 = find_key(&list, k3.id);
	CU_ASSERT_PTR_NOT_NULL_FATAL(e1);
	CU_ASSERT_PTR_NOT_NULL_FATAL(e3);
	CU_ASSERT(e1->revoked);
	CU_ASSERT(iso_like(e1->revoked_at));
	CU_ASSERT(iso_like(e1->created_at));
	CU_ASSERT_PTR_NULL(e1->last_used_at);
	CU_ASSERT_FALSE(e3->revoked);
	CU_ASSERT_PTR_NOT_NULL(find_key(&list, k2.id));
	for (size_t i = 1; i < list.n; i++)
		CU_ASSERT(strcmp(list.keys[i - 1].created_at, list.keys[i].created_at) <= 0);
	auth_key_list_release(&list);

	/* A store others can read is refused, with the fix in the message. */
	buf_addf(&p, "%s/keys", home);
	chmod(p.data, 0755);
	CU_ASSERT_EQUAL(auth_key_list(home, &list, &msg), AUTH_KEY_ERR_INSECURE);
	CU_ASSERT(strstr(msg.data, "chmod -R go=") != NULL);
	chmod(p.data, 0700);
	buf_addf(&p, "/%s/manifest.json", k1.id);
	chmod(p.data, 0644);
	CU_ASSERT_EQUAL(auth_store_check_perms(home, &msg), AUTH_KEY_ERR_INSECURE);
	CU_ASSERT(strstr(msg.data, k1.id) != NULL);
	chmod(p.data, 0600);
	chmod(home, 0777);
	CU_ASSERT_EQUAL(auth_store_check_perms(home, &msg), AUTH_KEY_ERR_INSECURE);
	CU_ASSERT(strstr(msg.data, "chmod go-w") != NULL);
	chmod(home, 0700);
	CU_ASSERT_EQUAL(auth_store_check_perms(home, &msg), AUTH_KEY_OK);

	auth_new_key_wipe(&k1);
	auth_new_key_wipe(&k2);
	auth_new_key_wipe(&k3);
	buf_release(&msg);
	buf_release(&p);
	tu_rmhome(home);
}

/* ---- audit log --------------------------------------------------------------------- */

static struct audit_record sample_record(void)
{
	return (struct audit_record){
		.key_id = "abcd1234",
		.owner_tier = "guest",
		.method = "POST",
		.path = "/v1/chat/completions?key=olp_secret",
		.provider = "claude",
		.model = "claude-sonnet",
		.status_code = 200,
		.latency_ms = 1234,
		.error_code = NULL,
		.request_id = "req-1",
	};
}

static char *read_all(const char *path)
{
	struct buf b = BUF_INIT;

	if (buf_read_file(&b, path, 64 << 20)) {
		buf_release(&b);
		return NULL;
	}
	return buf_detach(&b, NULL);
}

static void test_audit_line(void)
{
	char *home = tu_mkhome(), *text;
	struct audit_record rec = sample_record();
	struct auth_store *st = auth_store_open(home, &no_opts);
	struct buf p = BUF_INIT;
	struct stat sb;
	json_t *j;

	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	auth_audit(st, &rec);
	rec.key_id = NULL;
	rec.provider = NULL;
	rec.status_code = 401;
	rec.error_code = "auth_required";
	auth_audit(st, &rec);
	CU_ASSERT_EQUAL(auth_audit_failures(st), 0);
	auth_store_free(st);

	buf_addf(&p, "%s/logs", home);
	CU_ASSERT_EQUAL_FATAL(stat(p.data, &sb), 0);
	CU_ASSERT_EQUAL(sb.st_mode & 0777, 0700);
	buf_adds(&p, "/audit.ndjson");
	CU_ASSERT_EQUAL_FATAL(stat(p.data, &sb), 0);
	CU_ASSERT_EQUAL(sb.st_mode & 0777, 0600);
	text = read_all(p.data);
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	CU_ASSERT_EQUAL(tu_count(text, "\n"), 2);
	CU_ASSERT_EQUAL(tu_count(text, "olp_secret"), 0); /* the query string is not logged */
	j = json_loads(text, JSON_DISABLE_EOF_CHECK, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	CU_ASSERT(iso_like(json_string_value(json_object_get(j, "ts"))));
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "key_id")), "abcd1234");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "owner_tier")), "guest");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "method")), "POST");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "path")),
			       "/v1/chat/completions");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "provider")), "claude");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "model")), "claude-sonnet");
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(j, "status_code")), 200);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(j, "latency_ms")), 1234);
	CU_ASSERT(json_is_null(json_object_get(j, "error_code")));
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "request_id")), "req-1");
	CU_ASSERT_EQUAL(json_object_size(j), 11);
	json_decref(j);
	/* The 401 without an identity is not a line of its own but counted in a summary. */
	j = json_loads(strchr(text, '\n') + 1, 0, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	CU_ASSERT(json_is_null(json_object_get(j, "key_id")));
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(j, "event")),
			       "unauthenticated_summary");
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(j, "count")), 1);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(json_object_get(j, "statuses"), "401")),
			1);
	CU_ASSERT_PTR_NULL(json_object_get(j, "request_id"));
	json_decref(j);
	free(text);
	buf_release(&p);
	tu_rmhome(home);
}

/* Many processes append at once: every line stays whole. */
static void test_audit_concurrent(void)
{
	enum { PROCS = 4, LINES = 300 };
	char *home = tu_mkhome(), *text, *line, *next;
	struct buf p = BUF_INIT, big = BUF_INIT;
	int i, n = 0, bad = 0, status;

	/* Long lines make a torn write likely to show. */
	for (i = 0; i < 400; i++)
		buf_addch(&big, (char)('a' + i % 26));
	for (i = 0; i < PROCS; i++) {
		pid_t pid = fork();

		CU_ASSERT_FATAL(pid >= 0);
		if (pid == 0) {
			struct auth_store *st = auth_store_open(home, &no_opts);
			struct audit_record rec = sample_record();
			int j;

			rec.model = big.data;
			for (j = 0; j < LINES; j++)
				auth_audit(st, &rec);
			j = (int)auth_audit_failures(st);
			auth_store_free(st);
			_exit(j ? 1 : 0);
		}
	}
	for (i = 0; i < PROCS; i++) {
		CU_ASSERT(wait(&status) > 0);
		CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	buf_addf(&p, "%s/logs/audit.ndjson", home);
	text = read_all(p.data);
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	for (line = text; *line; line = next + 1) {
		json_t *j;

		next = strchr(line, '\n');
		if (!next)
			break;
		*next = '\0';
		j = json_loads(line, 0, NULL);
		if (!j || strcmp(json_string_value(json_object_get(j, "model")), big.data) != 0)
			bad++;
		json_decref(j);
		n++;
	}
	CU_ASSERT_EQUAL(n, PROCS * LINES);
	CU_ASSERT_EQUAL(bad, 0);
	free(text);
	buf_release(&p);
	buf_release(&big);
	tu_rmhome(home);
}

static void test_audit_rotation(void)
{
	static const char old[] = "{\"ts\":\"2020-01-02T03:04:05.678Z\",\"key_id\":\"x\"}\n";
	char *home = tu_mkhome(), *text;
	struct audit_record rec = sample_record();
	struct auth_store *st;
	struct buf p = BUF_INIT;
	int fd;

	buf_addf(&p, "%s/logs", home);
	CU_ASSERT_EQUAL_FATAL(mkdir(p.data, 0700), 0);
	buf_adds(&p, "/audit.ndjson");
	fd = open(p.data, O_WRONLY | O_CREAT, 0600);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(write_all(fd, old, strlen(old)), 0);
	close(fd);
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	auth_audit(st, &rec);
	auth_store_free(st);

	text = read_all(p.data);
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	CU_ASSERT_EQUAL(tu_count(text, "\n"), 1);
	CU_ASSERT_EQUAL(tu_count(text, "2020-01-02"), 0);
	free(text);
	buf_reset(&p);
	buf_addf(&p, "%s/logs/audit-2020-01-02.ndjson", home);
	text = read_all(p.data);
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	CU_ASSERT_STRING_EQUAL(text, old);
	free(text);
	buf_release(&p);
	tu_rmhome(home);
}

/* The lines of every audit file in home's logs/ (audit.ndjson and the rotated ones):
 * *lines the count, *files how many files, *largest the largest file's size, *bad the
 * lines that do not parse. */
struct audit_files {
	int lines, files, bad;
	off_t largest, total;
	int64_t summary_count; /* the counts of the unauthenticated summaries */
};

static void audit_scan(const char *home, struct audit_files *out)
{
	struct buf dir = BUF_INIT, f = BUF_INIT;
	struct dirent *de;
	DIR *d;

	memset(out, 0, sizeof(*out));
	buf_addf(&dir, "%s/logs", home);
	d = opendir(dir.data);
	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	while ((de = readdir(d))) {
		char *text, *line, *next;
		struct stat sb;

		if (strncmp(de->d_name, "audit", 5) != 0)
			continue;
		buf_reset(&f);
		buf_addf(&f, "%s/%s", dir.data, de->d_name);
		CU_ASSERT_FATAL(stat(f.data, &sb) == 0);
		out->files++;
		out->total += sb.st_size;
		if (sb.st_size > out->largest)
			out->largest = sb.st_size;
		text = read_all(f.data);
		CU_ASSERT_PTR_NOT_NULL_FATAL(text);
		for (line = text; *line; line = next + 1) {
			json_t *j;

			next = strchr(line, '\n');
			if (!next)
				break;
			*next = '\0';
			j = json_loads(line, 0, NULL);
			if (!j)
				out->bad++;
			else if (json_object_get(j, "event"))
				out->summary_count +=
					json_integer_value(json_object_get(j, "count"));
			else
				out->lines++;
			json_decref(j);
		}
		free(text);
	}
	closedir(d);
	buf_release(&dir);
	buf_release(&f);
}

/* Issue 22 item 4: requests without an identity are counted, not written: a flood of
 * them leaves a summary line per interval, and what was counted when the store closes. */
static void test_audit_unauth_summary(void)
{
	struct auth_options o = { .audit_summary_s = 3600 };
	char *home = tu_mkhome();
	struct audit_record rec = sample_record();
	struct auth_store *st = auth_store_open(home, &o);
	struct audit_files af;

	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	rec.key_id = NULL;
	rec.owner_tier = "none";
	for (int i = 0; i < 5000; i++) {
		rec.status_code = i % 5 ? 401 : 404;
		auth_audit(st, &rec);
	}
	/* A request with an identity keeps its line. */
	rec = sample_record();
	auth_audit(st, &rec);
	audit_scan(home, &af);
	CU_ASSERT_EQUAL(af.lines, 1);
	CU_ASSERT_EQUAL(af.summary_count, 1); /* the first refusal's, at once */
	CU_ASSERT(af.total < 1024);
	auth_store_free(st);
	audit_scan(home, &af);
	CU_ASSERT_EQUAL(af.lines, 1);
	CU_ASSERT_EQUAL(af.summary_count, 5000);
	CU_ASSERT_EQUAL(af.bad, 0);
	CU_ASSERT(af.total < 2048);
	tu_rmhome(home);
}

/* Issue 22 item 4: past max_bytes the log is rotated, and only keep rotated files stay:
 * whatever is written, logs/ holds at most about max_bytes * (keep + 1). */
static void test_audit_size_rotation(void)
{
	struct auth_options o = { .audit_max_bytes = 65536, .audit_keep = 2 };
	char *home = tu_mkhome();
	struct audit_record rec = sample_record();
	struct auth_store *st = auth_store_open(home, &o);
	struct audit_files af;
	struct buf p = BUF_INIT;
	char *text;

	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	for (int i = 0; i < 3000; i++) /* ~300 bytes each: ~900 KB in all */
		auth_audit(st, &rec);
	rec.request_id = "the-last-one";
	auth_audit(st, &rec);
	CU_ASSERT_EQUAL(auth_audit_failures(st), 0);
	auth_store_free(st);
	audit_scan(home, &af);
	CU_ASSERT_EQUAL(af.files, 3); /* audit.ndjson and 2 rotated */
	CU_ASSERT(af.largest < 65536 + 1024);
	CU_ASSERT(af.total < (off_t)3 * (65536 + 1024));
	CU_ASSERT_EQUAL(af.bad, 0);
	buf_addf(&p, "%s/logs/audit.ndjson", home);
	text = read_all(p.data);
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	CU_ASSERT(strstr(text, "the-last-one") != NULL);
	free(text);
	buf_release(&p);
	tu_rmhome(home);
}

/* Processes writing at once rotate the one file between them: no line is lost or torn,
 * and no file grows past max_bytes by more than a line per process (one that had not
 * seen another's rotation yet). */
static void test_audit_rotation_processes(void)
{
	enum { PROCS = 4, LINES = 1500 };
	struct auth_options o = { .audit_max_bytes = 65536, .audit_keep = 1000 };
	char *home = tu_mkhome();
	struct audit_files af;
	int i, status;

	for (i = 0; i < PROCS; i++) {
		pid_t pid = fork();

		CU_ASSERT_FATAL(pid >= 0);
		if (pid == 0) {
			struct auth_store *st = auth_store_open(home, &o);
			struct audit_record rec = sample_record();
			int j;

			for (j = 0; j < LINES; j++)
				auth_audit(st, &rec);
			j = (int)auth_audit_failures(st);
			auth_store_free(st);
			_exit(j ? 1 : 0);
		}
	}
	for (i = 0; i < PROCS; i++) {
		CU_ASSERT(wait(&status) > 0);
		CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	audit_scan(home, &af);
	CU_ASSERT_EQUAL(af.lines, PROCS * LINES);
	CU_ASSERT_EQUAL(af.bad, 0);
	CU_ASSERT(af.files >= PROCS * LINES * 250 / 65536);
	CU_ASSERT(af.largest < 65536 + PROCS * 512);
	tu_rmhome(home);
}

/* An unwritable log fails nothing: it is counted. */
static void test_audit_failure_counted(void)
{
	char *home = tu_mkhome(), *err;
	struct audit_record rec = sample_record();
	struct auth_store *st;
	struct buf p = BUF_INIT;
	int fd, i;

	buf_addf(&p, "%s/logs", home);
	fd = open(p.data, O_WRONLY | O_CREAT, 0600); /* a file where the directory should be */
	CU_ASSERT_FATAL(fd >= 0);
	close(fd);
	st = auth_store_open(home, &no_opts);
	CU_ASSERT_PTR_NOT_NULL_FATAL(st);
	tu_stderr_begin();
	for (i = 0; i < 5; i++)
		auth_audit(st, &rec);
	err = tu_stderr_end();
	CU_ASSERT_EQUAL(auth_audit_failures(st), 5);
	CU_ASSERT_EQUAL(tu_count(err, "audit log"), 3); /* the 1st, 2nd and 4th failure */
	free(err);
	auth_store_free(st);
	buf_release(&p);
	tu_rmhome(home);
}

static const struct ts_test token_tests[] = {
	{ "extract from headers", test_token_extract },
	{ "generate, and its hash in the manifest", test_token_generate },
	{ "ids", test_id },
	{ NULL, NULL },
};

static const struct ts_test manifest_tests[] = {
	{ "valid", test_manifest_valid },
	{ "each invalid kind", test_manifest_invalid },
	{ "invalid skipped with one warning", test_manifest_skipped_once },
	{ "atomic rewrite keeps unknown fields", test_atomic_rewrite },
	{ NULL, NULL },
};

static const struct ts_test check_tests[] = {
	{ "missing token, anonymous", test_check_missing },
	{ "anonymous settings", test_check_anonymous_settings },
	{ "login access", test_login_access },
	{ "accounts", test_accounts },
	{ "every key from the index, in step with keys/", test_store_keys },
	{ "login grants follow the manifests, not keys/", test_login_grants_follow_manifests },
	{ "env owner", test_check_env_owner },
	{ "keys and tiers", test_check_keys_and_tiers },
	{ "revoked on the next request", test_check_revoked_next_request },
	{ "quota set on the next request", test_check_quota_next_request },
	{ "root's edit keeps the manifest's owner", test_root_edit_keeps_owner },
	{ "root's keygen gives the key keys/'s owner", test_root_keygen_keeps_owner },
	{ "root's keygen in a fresh home: keys/ is OLP_HOME's owner's",
	  test_root_keygen_fresh_home },
	{ "Node OLP fixture store", test_node_fixture },
	{ "threads sharing one store", test_threads },
	{ NULL, NULL },
};

static const struct ts_test touch_tests[] = {
	{ "last_used_at", test_touch },
	{ "revoke vs touch race", test_race_revoke_touch },
	{ NULL, NULL },
};

static const struct ts_test keys_tests[] = {
	{ "create, revoke, list, permissions", test_keys_manage },
	{ NULL, NULL },
};

static const struct ts_test audit_tests[] = {
	{ "line contents", test_audit_line },
	{ "concurrent processes", test_audit_concurrent },
	{ "daily rotation", test_audit_rotation },
	{ "unauthenticated requests summarised", test_audit_unauth_summary },
	{ "rotation by size, keep", test_audit_size_rotation },
	{ "rotation by size across 4 processes", test_audit_rotation_processes },
	{ "failures counted", test_audit_failure_counted },
	{ NULL, NULL },
};

int main(void)
{
	static const struct ts_suite suites[] = {
		{ "token", token_tests }, { "manifest", manifest_tests }, { "check", check_tests },
		{ "touch", touch_tests }, { "keys", keys_tests },	  { "audit", audit_tests },
		{ NULL, NULL },
	};

	return ts_exit_status(ts_cunit_run_suites(suites));
}
