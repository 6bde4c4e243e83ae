/* Tokens, ids and hashes. Every cryptographic primitive (SHA-256, random bytes, base64url,
 * constant-time compare) comes from libsodium; nothing here is hand-written crypto. */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <strings.h>

#include "auth/internal.h"
#include "common/banned.h"

static pthread_once_t crypto_once = PTHREAD_ONCE_INIT;
static int crypto_status = -ENOSYS;

static void crypto_init_once(void)
{
	/* 1 means "already initialised" by someone else in the process: also fine. */
	crypto_status = sodium_init() < 0 ? -ENOSYS : 0;
}

int auth_crypto_init(void)
{
	pthread_once(&crypto_once, crypto_init_once);
	return crypto_status;
}

void auth_hash_token(const char *tok, size_t len, unsigned char out[AUTH_HASH_BYTES])
{
	crypto_hash_sha256(out, (const unsigned char *)tok, len);
}

void auth_hash_to_hex(const unsigned char h[AUTH_HASH_BYTES], char out[AUTH_HASH_HEX + 1])
{
	sodium_bin2hex(out, AUTH_HASH_HEX + 1, h, AUTH_HASH_BYTES);
}

int auth_hash_from_hex(const char *hex, unsigned char out[AUTH_HASH_BYTES])
{
	size_t bin_len = 0;
	const char *end = NULL;

	if (strlen(hex) != (size_t)AUTH_HASH_HEX)
		return -EINVAL;
	if (sodium_hex2bin(out, AUTH_HASH_BYTES, hex, (size_t)AUTH_HASH_HEX, NULL, &bin_len,
			   &end) != 0 ||
	    bin_len != AUTH_HASH_BYTES || *end != '\0')
		return -EINVAL;
	return 0;
}

void auth_token_generate(char out[AUTH_TOKEN_LEN + 1])
{
	unsigned char raw[32];

	randombytes_buf(raw, sizeof(raw));
	memcpy(out, "olp_", 4); /* NOLINT(bugprone-not-null-terminated-result): ended below */
	/* 32 bytes → 43 characters without padding, + NUL = the 44 bytes left in out. */
	sodium_bin2base64(out + 4, AUTH_TOKEN_LEN + 1 - 4, raw, sizeof(raw),
			  sodium_base64_VARIANT_URLSAFE_NO_PADDING);
	sodium_memzero(raw, sizeof(raw));
}

void auth_id_generate(char out[AUTH_ID_MAX])
{
	static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789_-";
	size_t i;

	/* A leading '-' reads as an option on a command line and a leading '_' could look
	 * like the server's reserved "__…__" ids, so the first character is [a-z0-9]. */
	out[0] = alphabet[randombytes_uniform(36)];
	for (i = 1; i < 8; i++)
		out[i] = alphabet[randombytes_uniform(sizeof(alphabet) - 1)];
	out[8] = '\0';
}

bool auth_id_valid(const char *s)
{
	size_t i;

	for (i = 0; s[i]; i++) {
		char c = s[i];

		if (i >= AUTH_ID_MAX - 1)
			return false;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '-'))
			return false;
	}
	/* The charset already rules out ".", ".." and "/": an id is always one path element. */
	return i > 0 && strcmp(s, AUTH_ID_ENV_OWNER) != 0 && strcmp(s, AUTH_ID_ANONYMOUS) != 0;
}

static bool is_blank(char c)
{
	return c == ' ' || c == '\t';
}

/* Trim blanks around s; *len is 0 when nothing is left. */
static void trim(const char *s, const char **start, size_t *len)
{
	size_t n = strlen(s);

	while (n && is_blank(*s)) {
		s++;
		n--;
	}
	while (n && is_blank(s[n - 1]))
		n--;
	*start = s;
	*len = n;
}

void auth_token_extract(const char *authorization, const char *x_api_key, const char **tok,
			size_t *len)
{
	*tok = NULL;
	*len = 0;
	if (authorization) {
		const char *p = authorization;

		while (is_blank(*p))
			p++;
		/* The scheme is case-insensitive (RFC 9110 §11.1) and needs a blank after it;
		 * any other scheme ("Basic …") falls through to x-api-key. */
		if (strncasecmp(p, "bearer", 6) == 0 && is_blank(p[6])) {
			trim(p + 6, tok, len);
			if (*len)
				return;
		}
	}
	if (x_api_key)
		trim(x_api_key, tok, len);
	if (!*len)
		*tok = NULL;
}
