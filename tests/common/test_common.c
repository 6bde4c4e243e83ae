/* CUnit suite for common/: the growable buffer and its invariants, reading files, JSON
 * string escaping (checked by parsing every output with jansson), parse_u64, the JSON-line
 * loggers, the small utilities, paths, the aborting allocators and the string vector.
 * Public header only. */
#include "tests/support/cunit.h"
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "tests/support/support.h"
#include "common/banned.h"

static char tmpdir[] = "/tmp/olp-common-test-XXXXXX";

/* The invariants common.h promises, checked after every operation. */
static void check_invariants(const struct buf *b)
{
	CU_ASSERT_PTR_NOT_NULL_FATAL(b->data);
	CU_ASSERT_EQUAL(b->data[b->len], '\0');
	if (b->cap) {
		CU_ASSERT(b->len < b->cap);
	} else {
		CU_ASSERT_EQUAL(b->len, 0);
	}
}

/* ---- struct buf ------------------------------------------------------------------------- */

static void test_buf_init(void)
{
	struct buf a = BUF_INIT, b;

	check_invariants(&a);
	CU_ASSERT_STRING_EQUAL(a.data, "");
	memset(&b, 0x5a, sizeof(b));
	buf_init(&b);
	check_invariants(&b);
	CU_ASSERT_EQUAL(b.len, 0);
	CU_ASSERT_EQUAL(b.cap, 0);
	/* Releasing a never-grown buffer is fine, and leaves it usable. */
	buf_release(&b);
	check_invariants(&b);
	buf_adds(&b, "x");
	CU_ASSERT_STRING_EQUAL(b.data, "x");
	buf_release(&b);
	check_invariants(&b);
	CU_ASSERT_EQUAL(b.len, 0);
	/* The shared empty string was never written to. */
	CU_ASSERT_EQUAL(buf_empty[0], '\0');
}

static void test_buf_add_and_grow(void)
{
	struct buf b = BUF_INIT;
	char chunk[97];
	size_t i, total = 0;

	for (i = 0; i < sizeof(chunk); i++)
		chunk[i] = (char)('a' + i % 26);
	/* Many appends of an odd size: every growth must keep the old contents. */
	for (i = 0; i < 5000; i++) {
		buf_add(&b, chunk, sizeof(chunk));
		total += sizeof(chunk);
		check_invariants(&b);
	}
	CU_ASSERT_EQUAL(b.len, total);
	for (i = 0; i < b.len; i++)
		if (b.data[i] != chunk[i % sizeof(chunk)])
			break;
	CU_ASSERT_EQUAL(i, total);

	buf_reset(&b);
	check_invariants(&b);
	CU_ASSERT_EQUAL(b.len, 0);
	CU_ASSERT_STRING_EQUAL(b.data, "");
	CU_ASSERT(b.cap > 0); /* reset keeps the allocation */

	buf_add(&b, "", 0);
	check_invariants(&b);
	CU_ASSERT_EQUAL(b.len, 0);
	buf_adds(&b, "ab");
	buf_addch(&b, 'c');
	buf_addch(&b, '\0'); /* binary bytes count in len */
	buf_addch(&b, 'd');
	check_invariants(&b);
	CU_ASSERT_EQUAL(b.len, 5);
	CU_ASSERT_EQUAL(memcmp(b.data, "abc\0d", 5), 0);
	buf_release(&b);
}

static void test_buf_grow_reserves(void)
{
	struct buf b = BUF_INIT;

	buf_grow(&b, 1000);
	check_invariants(&b);
	CU_ASSERT(b.cap >= 1001);
	CU_ASSERT_EQUAL(b.len, 0);
	CU_ASSERT_STRING_EQUAL(b.data, "");
	buf_adds(&b, "hello");
	buf_grow(&b, 10);
	CU_ASSERT(b.cap >= b.len + 11);
	CU_ASSERT_STRING_EQUAL(b.data, "hello");
	/* Room reserved with buf_grow is what the prepare → write → commit cycle uses. */
	memcpy(buf_tail(&b), " world", 6);
	buf_commit(&b, 6);
	check_invariants(&b);
	CU_ASSERT_STRING_EQUAL(b.data, "hello world");
	buf_release(&b);
}

static void test_buf_consume(void)
{
	struct buf b = BUF_INIT;

	buf_adds(&b, "0123456789");
	buf_consume(&b, 0);
	CU_ASSERT_STRING_EQUAL(b.data, "0123456789");
	buf_consume(&b, 3);
	check_invariants(&b);
	CU_ASSERT_EQUAL(b.len, 7);
	CU_ASSERT_STRING_EQUAL(b.data, "3456789");
	buf_consume(&b, 6);
	check_invariants(&b);
	CU_ASSERT_STRING_EQUAL(b.data, "9");
	buf_consume(&b, 1); /* n == len */
	check_invariants(&b);
	CU_ASSERT_EQUAL(b.len, 0);
	CU_ASSERT_STRING_EQUAL(b.data, "");
	buf_adds(&b, "again");
	CU_ASSERT_STRING_EQUAL(b.data, "again");
	buf_release(&b);

	/* Consuming on a never-grown buffer must not write into the shared empty string. */
	buf_init(&b);
	buf_consume(&b, 0);
	check_invariants(&b);
	CU_ASSERT_EQUAL(buf_empty[0], '\0');
}

static void test_buf_detach(void)
{
	struct buf b = BUF_INIT;
	size_t len = 12345;
	char *p;

	/* Detaching an empty, never-grown buffer still hands out a heap string. */
	p = buf_detach(&b, &len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT(p != buf_empty);
	CU_ASSERT_EQUAL(len, 0);
	CU_ASSERT_STRING_EQUAL(p, "");
	free(p);
	check_invariants(&b);

	buf_adds(&b, "payload");
	p = buf_detach(&b, &len);
	CU_ASSERT_EQUAL(len, 7);
	CU_ASSERT_STRING_EQUAL(p, "payload");
	/* b is left initialised and empty, and no longer owns p. */
	check_invariants(&b);
	CU_ASSERT_EQUAL(b.len, 0);
	CU_ASSERT(b.data != p);
	buf_adds(&b, "next");
	CU_ASSERT_STRING_EQUAL(p, "payload");
	CU_ASSERT_STRING_EQUAL(b.data, "next");
	free(p);
	p = buf_detach(&b, NULL); /* len may be NULL */
	CU_ASSERT_STRING_EQUAL(p, "next");
	free(p);
	buf_release(&b);
}

/* buf_add_uint / buf_add_int: what %llu / %lld write, ends of the ranges included. */
static void test_buf_add_int(void)
{
	static const int64_t is[] = { 0, 7, -1, 10, -10, 200, 499, INT64_MAX, INT64_MIN };
	static const uint64_t us[] = { 0, 9, 10, 99, 100, 1234567890, UINT64_MAX };
	struct buf b = BUF_INIT, want = BUF_INIT;

	for (size_t i = 0; i < ARRAY_SIZE(is); i++) {
		buf_add_int(&b, is[i]);
		buf_addch(&b, ',');
		buf_addf(&want, "%lld,", (long long)is[i]);
	}
	for (size_t i = 0; i < ARRAY_SIZE(us); i++) {
		buf_add_uint(&b, us[i]);
		buf_addch(&b, ',');
		buf_addf(&want, "%llu,", (unsigned long long)us[i]);
	}
	check_invariants(&b);
	CU_ASSERT_STRING_EQUAL(b.data, want.data);
	buf_release(&b);
	buf_release(&want);
}

static void test_buf_addf(void)
{
	struct buf b = BUF_INIT;
	char *big;
	size_t n = 100000, i;

	buf_addf(&b, "%s", "");
	check_invariants(&b);
	CU_ASSERT_EQUAL(b.len, 0);
	buf_addf(&b, "%d-%s-%c", 42, "x", 'y');
	check_invariants(&b);
	CU_ASSERT_STRING_EQUAL(b.data, "42-x-y");

	/* Longer than any initial capacity, from both an empty and a non-empty buffer. */
	big = xmalloc(n + 1);
	for (i = 0; i < n; i++)
		big[i] = (char)('A' + i % 23);
	big[n] = '\0';
	buf_addf(&b, "[%s]", big);
	check_invariants(&b);
	CU_ASSERT_EQUAL(b.len, 6 + n + 2);
	CU_ASSERT_EQUAL(memcmp(b.data, "42-x-y[", 7), 0);
	CU_ASSERT_EQUAL(memcmp(b.data + 7, big, n), 0);
	CU_ASSERT_EQUAL(b.data[b.len - 1], ']');

	buf_release(&b);
	buf_addf(&b, "%s", big);
	check_invariants(&b);
	CU_ASSERT_EQUAL(b.len, n);
	CU_ASSERT_STRING_EQUAL(b.data, big);

	/* Exactly filling the remaining room (the boundary of the first vsnprintf). */
	buf_release(&b);
	buf_grow(&b, 63);
	CU_ASSERT_FATAL(b.cap >= 64);
	buf_addf(&b, "%.*s", (int)(b.cap - 1), big);
	check_invariants(&b);
	CU_ASSERT_EQUAL(b.len, strlen(b.data));
	CU_ASSERT_EQUAL(memcmp(b.data, big, b.len), 0);
	buf_addf(&b, "%.*s", 1, "Z");
	check_invariants(&b);
	CU_ASSERT_EQUAL(b.data[b.len - 1], 'Z');
	free(big);
	buf_release(&b);
}

static char *write_tmp(const char *name, const void *data, size_t len)
{
	static char path[256];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_FATAL(write_all(fd, data, len) == 0);
	close(fd);
	return path;
}

static void test_buf_read_file(void)
{
	struct buf b = BUF_INIT;
	size_t n = 200000, i;
	char *data = xmalloc(n), *path;

	for (i = 0; i < n; i++)
		data[i] = (char)(i * 7 + 3); /* includes NUL bytes */
	path = write_tmp("big", data, n);

	CU_ASSERT_EQUAL(buf_read_file(&b, path, n), 0); /* exactly max bytes: fine */
	check_invariants(&b);
	CU_ASSERT_EQUAL(b.len, n);
	CU_ASSERT_EQUAL(memcmp(b.data, data, n), 0);
	buf_release(&b);

	CU_ASSERT_EQUAL(buf_read_file(&b, path, n - 1), -EFBIG);
	check_invariants(&b);
	buf_release(&b);
	CU_ASSERT_EQUAL(buf_read_file(&b, path, 10), -EFBIG);
	buf_release(&b);

	path = write_tmp("empty", "", 0);
	CU_ASSERT_EQUAL(buf_read_file(&b, path, 0), 0);
	check_invariants(&b);
	CU_ASSERT_EQUAL(b.len, 0);

	CU_ASSERT_EQUAL(buf_read_file(&b, "/nonexistent/olp/file", 100), -ENOENT);
	check_invariants(&b);
	CU_ASSERT_EQUAL(buf_read_file(&b, tmpdir, 100), -EISDIR);
	buf_release(&b);
	free(data);
}

/* The limit is on the file ("read the whole file … at most max bytes"); bytes already in
 * the buffer are not part of the file. */
static void test_buf_read_file_appends(void)
{
	struct buf b = BUF_INIT;
	char *path = write_tmp("hundred",
			       "0123456789012345678901234567890123456789"
			       "0123456789012345678901234567890123456789"
			       "01234567890123456789",
			       100);

	buf_adds(&b, "prefix:");
	CU_ASSERT_EQUAL(buf_read_file(&b, path, 100), 0);
	CU_ASSERT_EQUAL(b.len, 107);
	CU_ASSERT_EQUAL(memcmp(b.data, "prefix:0123", 11), 0);
	buf_release(&b);
}

static void test_buf_read_once(void)
{
	struct buf b = BUF_INIT;
	int fds[2];

	CU_ASSERT_FATAL(pipe(fds) == 0);
	CU_ASSERT_EQUAL(write_all(fds[1], "hello", 5), 0);
	CU_ASSERT_EQUAL(buf_read_once(&b, fds[0], 3), 3);
	CU_ASSERT_STRING_EQUAL(b.data, "hel");
	CU_ASSERT_EQUAL(buf_read_once(&b, fds[0], 100), 2);
	CU_ASSERT_STRING_EQUAL(b.data, "hello");
	check_invariants(&b);
	close(fds[1]);
	CU_ASSERT_EQUAL(buf_read_once(&b, fds[0], 100), 0);
	CU_ASSERT_EQUAL(b.len, 5);
	close(fds[0]);
	CU_ASSERT_EQUAL(buf_read_once(&b, fds[0], 100), -EBADF);
	check_invariants(&b);
	CU_ASSERT_STRING_EQUAL(b.data, "hello");
	buf_release(&b);
}

/* ---- buf_add_json_str ------------------------------------------------------------------- */

/* Encode s and parse the result back with jansson; returns the decoded value (owned) or
 * NULL when the output was not valid JSON. The raw encoding is left in enc. */
static json_t *roundtrip(const char *s, size_t len, struct buf *enc)
{
	json_error_t jerr;

	buf_reset(enc);
	buf_add_json_str(enc, s, len);
	check_invariants(enc);
	return json_loadb(enc->data, enc->len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
}

static void test_json_escapes(void)
{
	static const struct {
		const char *in;
		size_t len;
		const char *out;
	} cases[] = {
		{ "", 0, "\"\"" },
		{ "plain text", 10, "\"plain text\"" },
		{ "a\"b", 3, "\"a\\\"b\"" },
		{ "a\\b", 3, "\"a\\\\b\"" },
		{ "l1\nl2", 5, "\"l1\\nl2\"" },
		{ "\r\t", 2, "\"\\r\\t\"" },
		{ "\x01", 1, "\"\\u0001\"" },
		{ "\x08\x0c", 2, "\"\\u0008\\u000c\"" },
		{ "\x1f", 1, "\"\\u001f\"" },
		{ "a\0b", 3, "\"a\\u0000b\"" },
		{ "\x7f", 1, "\"\x7f\"" },
		{ "</script>", 9, "\"</script>\"" },
		/* valid multibyte UTF-8 is kept as is */
		{ "\xc3\xa9", 2, "\"\xc3\xa9\"" },
		{ "\xe2\x82\xac", 3, "\"\xe2\x82\xac\"" },
		{ "\xf0\x9f\x98\x80", 4, "\"\xf0\x9f\x98\x80\"" },
		{ "\xf4\x8f\xbf\xbf", 4, "\"\xf4\x8f\xbf\xbf\"" }, /* U+10FFFF */
		{ "\xef\xbf\xbd", 3, "\"\xef\xbf\xbd\"" },	   /* U+FFFD itself */
		{ "\xed\x9f\xbf", 3, "\"\xed\x9f\xbf\"" }, /* U+D7FF, just below surrogates */
		{ "\xee\x80\x80", 3, "\"\xee\x80\x80\"" }, /* U+E000, just above */
		{ "\xc2\x80", 2, "\"\xc2\x80\"" },	   /* U+0080, smallest 2-byte */
	};
	struct buf enc = BUF_INIT;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		json_t *v = roundtrip(cases[i].in, cases[i].len, &enc);

		CU_ASSERT_STRING_EQUAL(enc.data, cases[i].out);
		CU_ASSERT_PTR_NOT_NULL(v);
		if (!v) {
			fprintf(stderr, "case %zu: not JSON: %s\n", i, enc.data);
			continue;
		}
		CU_ASSERT(json_is_string(v));
		CU_ASSERT_EQUAL(json_string_length(v), cases[i].len);
		CU_ASSERT_EQUAL(memcmp(json_string_value(v), cases[i].in, cases[i].len), 0);
		json_decref(v);
	}
	/* Appends: what was in the buffer stays. */
	buf_reset(&enc);
	buf_adds(&enc, "{\"k\":");
	buf_add_json_str(&enc, "v", 1);
	buf_addch(&enc, '}');
	CU_ASSERT_STRING_EQUAL(enc.data, "{\"k\":\"v\"}");
	/* len is honoured: bytes after it are not read. */
	buf_reset(&enc);
	buf_add_json_str(&enc, "abc\"def", 3);
	CU_ASSERT_STRING_EQUAL(enc.data, "\"abc\"");
	buf_release(&enc);
}

/* Long strings are scanned eight bytes at a time: a byte that needs escaping (or a UTF-8
 * sequence to check) at any place among plain ones, in runs of every length around the
 * eight-byte steps, comes out as it does alone. */
static void test_json_escapes_long(void)
{
	static const struct {
		const char *in, *out;
	} odd[] = {
		{ "\"", "\\\"" },      { "\\", "\\\\" },      { "\n", "\\n" },
		{ "\x01", "\\u0001" }, { "\x1f", "\\u001f" }, { "\x7f", "\x7f" },
		{ " ", " " },	       { "~", "~" },	      { "\xc3\xa9", "\xc3\xa9" },
		{ "\x80", "\\ufffd" }, { "\xff", "\\ufffd" },
	};
	struct buf enc = BUF_INIT, in = BUF_INIT, want = BUF_INIT;
	unsigned bad = 0;

	for (size_t k = 0; k < ARRAY_SIZE(odd); k++) {
		for (size_t n = 0; n <= 26; n++) {
			for (size_t at = 0; at <= n; at++) {
				buf_reset(&in);
				buf_reset(&want);
				for (size_t i = 0; i < n; i++) {
					if (i == at) {
						buf_adds(&in, odd[k].in);
						buf_adds(&want, odd[k].out);
					}
					buf_addch(&in, (char)('a' + i % 26));
					buf_addch(&want, (char)('a' + i % 26));
				}
				if (at == n) {
					buf_adds(&in, odd[k].in);
					buf_adds(&want, odd[k].out);
				}
				buf_reset(&enc);
				buf_add_json_str(&enc, in.data, in.len);
				if (enc.len != want.len + 2 || enc.data[0] != '"' ||
				    memcmp(enc.data + 1, want.data, want.len) ||
				    enc.data[enc.len - 1] != '"') {
					if (!bad++)
						fprintf(stderr, "case %zu, %zu bytes, at %zu: %s\n",
							k, n, at, enc.data);
				}
			}
		}
	}
	CU_ASSERT_EQUAL(bad, 0);
	buf_release(&enc);
	buf_release(&in);
	buf_release(&want);
}

static bool contains(const char *hay, size_t hlen, const char *needle)
{
	size_t n = strlen(needle);

	for (size_t i = 0; i + n <= hlen; i++)
		if (!memcmp(hay + i, needle, n))
			return true;
	return false;
}

static void test_json_invalid_utf8(void)
{
	static const struct {
		const char *in;
		size_t len;
		const char *good; /* valid text around it that must survive */
	} cases[] = {
		{ "a\x80z", 3, "a" }, /* lone continuation */
		{ "a\xbf\xbfz", 4, "z" },
		{ "a\xc0\xafz", 4, "a" },		  /* overlong '/' */
		{ "a\xc1\xbfz", 4, "z" },		  /* overlong 2-byte */
		{ "a\xe0\x80\xafz", 5, "a" },		  /* overlong 3-byte */
		{ "a\xf0\x80\x80\xafz", 6, "z" },	  /* overlong 4-byte */
		{ "a\xed\xa0\x80z", 5, "a" },		  /* U+D800, a surrogate */
		{ "a\xed\xbf\xbfz", 5, "z" },		  /* U+DFFF */
		{ "a\xed\xa0\xbd\xed\xb8\x80z", 8, "a" }, /* CESU-8 surrogate pair */
		{ "a\xf4\x90\x80\x80z", 6, "z" },	  /* U+110000 */
		{ "a\xf5\x80\x80\x80z", 6, "a" },
		{ "a\xf8\x88\x80\x80\x80z", 7, "z" }, /* 5-byte form */
		{ "a\xfe\xffz", 4, "a" },
		{ "a\xc3", 2, "a" }, /* truncated at the end */
		{ "a\xe2\x82", 3, "a" },
		{ "a\xf0\x9f\x98", 4, "a" },
		{ "a\xe2\x82z", 4, "z" }, /* truncated in the middle */
		{ "a\xc3(z", 4, "(z" },	  /* lead + non-continuation */
		{ "\xc3\xa9\xff\xc3\xa9", 5, "\xc3\xa9" },
	};
	struct buf enc = BUF_INIT;
	size_t i, j;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		json_t *v = roundtrip(cases[i].in, cases[i].len, &enc);
		const char *d;
		size_t dl;

		CU_ASSERT_PTR_NOT_NULL(v);
		if (!v) {
			fprintf(stderr, "invalid case %zu: not JSON\n", i);
			continue;
		}
		d = json_string_value(v);
		dl = json_string_length(v);
		/* Replaced: U+FFFD appears (raw or escaped), no byte >= 0x80 of the input that
		 * is not part of a valid sequence is copied. */
		CU_ASSERT(contains(enc.data, enc.len, "\\ufffd"));
		CU_ASSERT(contains(d, dl, "\xef\xbf\xbd"));
		CU_ASSERT(contains(d, dl, cases[i].good));
		for (j = 0; j < enc.len; j++) {
			unsigned char c = (unsigned char)enc.data[j];

			CU_ASSERT(c != 0xc0 && c != 0xc1 && c < 0xf5);
		}
		json_decref(v);
	}
	/* One replacement per byte that cannot start a valid sequence: a lone continuation
	 * byte becomes exactly one U+FFFD, and the text after it is untouched. */
	buf_reset(&enc);
	buf_add_json_str(&enc, "x\x80y", 3);
	CU_ASSERT_STRING_EQUAL(enc.data, "\"x\\ufffdy\"");
	buf_release(&enc);
}

/* A deterministic generator, so that a failure can be replayed. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 11);
}

static void test_json_random(void)
{
	static const char *const pieces[] = {
		"a",	    "\"",	"\\",		"\n",
		"\x01",	    "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
		"\x80",	    "\xff",	"\xed\xa0\x80", "\xc0\x80",
		"\xf0\x9f", "\0"
	};
	struct buf enc = BUF_INIT, in = BUF_INIT;
	unsigned bad_json = 0, bad_roundtrip = 0, bad_utf8 = 0;
	int iter;

	for (iter = 0; iter < 20000; iter++) {
		size_t n = rng() % 40, i;
		json_t *v;

		buf_reset(&in);
		if (iter % 2) {
			for (i = 0; i < n; i++)
				buf_addch(&in, (char)(rng() & 0xff));
		} else {
			for (i = 0; i < n; i++) {
				const char *p = pieces[rng() % ARRAY_SIZE(pieces)];

				buf_add(&in, p, *p ? strlen(p) : 1);
			}
		}
		v = roundtrip(in.data, in.len, &enc);
		if (!v) {
			bad_json++;
			continue;
		}
		/* Output must itself be valid UTF-8 (JSON text is). */
		if (!ts_valid_utf8((const unsigned char *)enc.data, enc.len))
			bad_utf8++;
		/* Valid input comes back byte for byte. */
		if (ts_valid_utf8((const unsigned char *)in.data, in.len) &&
		    (json_string_length(v) != in.len ||
		     memcmp(json_string_value(v), in.data, in.len)))
			bad_roundtrip++;
		json_decref(v);
	}
	CU_ASSERT_EQUAL(bad_json, 0);
	CU_ASSERT_EQUAL(bad_utf8, 0);
	CU_ASSERT_EQUAL(bad_roundtrip, 0);
	buf_release(&enc);
	buf_release(&in);
}

/* ---- parse_u64 -------------------------------------------------------------------------- */

static void test_parse_json_int(void)
{
	static const struct {
		const char *json; /* an array of one value: jansson's decoder wants a container */
		int64_t min, max;
		int ret;
		int64_t v;
	} cases[] = {
		{ "[0]", 0, 10, 0, 0 },
		{ "[10]", 0, 10, 0, 10 },
		{ "[11]", 0, 10, -ERANGE, 0 },
		{ "[-1]", 0, 10, -ERANGE, 0 },
		{ "[-9223372036854775808]", INT64_MIN, INT64_MAX, 0, INT64_MIN },
		{ "[9223372036854775807]", INT64_MIN, INT64_MAX, 0, INT64_MAX },
		/* Reals: the integer they equal, or refused. */
		{ "[2.0]", 0, 10, 0, 2 },
		{ "[1e1]", 0, 10, 0, 10 },
		{ "[-0.0]", 0, 10, 0, 0 },
		{ "[1.5]", 0, 10, -EINVAL, 0 },
		{ "[1e-300]", 0, 10, -EINVAL, 0 },
		{ "[1e2]", 0, 10, -ERANGE, 0 },
		/* What the fuzzer found: never cast, whatever the range. */
		{ "[4e29]", INT64_MIN, INT64_MAX, -ERANGE, 0 },
		{ "[-4e29]", INT64_MIN, INT64_MAX, -ERANGE, 0 },
		{ "[1e308]", INT64_MIN, INT64_MAX, -ERANGE, 0 },
		/* 2^63 is one past INT64_MAX; -2^63 is INT64_MIN. */
		{ "[9223372036854775808.0]", INT64_MIN, INT64_MAX, -ERANGE, 0 },
		{ "[-9223372036854775808.0]", INT64_MIN, INT64_MAX, 0, INT64_MIN },
		{ "[9.2233720368547748e18]", INT64_MIN, INT64_MAX, 0, 9223372036854774784 },
		{ "[-9.2233720368547779e18]", INT64_MIN, INT64_MAX, -ERANGE, 0 },
		/* Not numbers. */
		{ "[\"3\"]", 0, 10, -EINVAL, 0 },
		{ "[true]", 0, 10, -EINVAL, 0 },
		{ "[null]", 0, 10, -EINVAL, 0 },
		{ "[[3]]", 0, 10, -EINVAL, 0 },
		{ "[{}]", 0, 10, -EINVAL, 0 },
	};
	int64_t v;

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		json_t *a = json_loads(cases[i].json, 0, NULL);
		int ret;

		CU_ASSERT_PTR_NOT_NULL_FATAL(a);
		v = 12345;
		ret = parse_json_int(json_array_get(a, 0), cases[i].min, cases[i].max, &v);
		if (ret != cases[i].ret)
			fprintf(stderr, "parse_json_int %s: %d, want %d\n", cases[i].json, ret,
				cases[i].ret);
		CU_ASSERT_EQUAL(ret, cases[i].ret);
		/* *out is set on success only. */
		CU_ASSERT_EQUAL(v, ret ? 12345 : cases[i].v);
		json_decref(a);
	}
	v = 12345;
	CU_ASSERT_EQUAL(parse_json_int(NULL, 0, 10, &v), -EINVAL);
	CU_ASSERT_EQUAL(v, 12345);
}

static void test_parse_u64(void)
{
	static const struct {
		const char *s;
		int ret;
		uint64_t v;
	} cases[] = {
		{ "0", 0, 0 },
		{ "1", 0, 1 },
		{ "007", 0, 7 },
		{ "5000000", 0, 5000000 },
		{ "4294967296", 0, 4294967296ull },
		{ "18446744073709551615", 0, UINT64_MAX },
		{ "18446744073709551616", -ERANGE, 0 },
		{ "18446744073709551620", -ERANGE, 0 },
		{ "99999999999999999999", -ERANGE, 0 },
		{ "184467440737095516150", -ERANGE, 0 },
		{ "", -EINVAL, 0 },
		{ "-1", -EINVAL, 0 },
		{ "+1", -EINVAL, 0 },
		{ " 1", -EINVAL, 0 },
		{ "1 ", -EINVAL, 0 },
		{ "1\n", -EINVAL, 0 },
		{ "0x10", -EINVAL, 0 },
		{ "1e3", -EINVAL, 0 },
		{ "1.0", -EINVAL, 0 },
		{ "12a", -EINVAL, 0 },
		{ "a12", -EINVAL, 0 },
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		uint64_t v = 0xdeadbeefull;
		int ret = parse_u64(cases[i].s, &v);

		CU_ASSERT_EQUAL(ret, cases[i].ret);
		if (ret != cases[i].ret)
			fprintf(stderr, "parse_u64(\"%s\") = %d, want %d\n", cases[i].s, ret,
				cases[i].ret);
		if (cases[i].ret == 0) {
			CU_ASSERT_EQUAL(v, cases[i].v);
		} else {
			CU_ASSERT_EQUAL(v, 0xdeadbeefull); /* untouched on failure */
		}
	}
	CU_ASSERT_EQUAL(parse_u64(NULL, &(uint64_t){ 0 }), -EINVAL);
}

/* ---- logging ------------------------------------------------------------------------------ */

struct plain_fn {
	void (*fn)(void);
};

static void run_plain(void *arg)
{
	((struct plain_fn *)arg)->fn();
}

/* Run fn with stderr redirected to a file; return what it wrote. */
static void capture_stderr(void (*fn)(void), struct buf *out)
{
	struct plain_fn f = { fn };
	char path[256];

	snprintf(path, sizeof(path), "%s/stderr", tmpdir);
	CU_ASSERT_FATAL(ts_capture_stderr(path, run_plain, &f) == 0);
	buf_reset(out);
	CU_ASSERT_EQUAL(buf_read_file(out, path, 1 << 20), 0);
}

/* Split captured output into lines and parse each as a JSON object. */
static size_t parse_lines(const struct buf *b, json_t **lines, size_t max)
{
	size_t n = 0, start = 0, i;

	for (i = 0; i < b->len; i++) {
		if (b->data[i] != '\n')
			continue;
		if (n < max) {
			lines[n] = json_loadb(b->data + start, i - start, 0, NULL);
			CU_ASSERT_PTR_NOT_NULL(lines[n]);
			CU_ASSERT(json_is_object(lines[n]));
		}
		n++;
		start = i + 1;
	}
	CU_ASSERT_EQUAL(start, b->len); /* every line ends with a newline */
	return n;
}

static void emit_logs(void)
{
	log_set_program("olp-test");
	log_set_level(LOG_LVL_INFO);
	log_debug("r0", "not shown");
	log_info("r1", "hello %s", "\"world\"\n");
	errno = ENOENT;
	log_warn(NULL, "open %s", "x");
	errno = EACCES;
	log_warnx("r3", "bad \xff byte");
	CU_ASSERT_EQUAL(errno, EACCES); /* loggers keep errno */
	log_errx("r4", "%d%%", 5);
	log_event("request", "r5", ",\"status\":200");
	log_line("{\"raw\":true}");
	log_set_level(LOG_LVL_ERROR);
	log_warnx("r6", "filtered");
	log_set_level(LOG_LVL_INFO);
}

static const char *jstr(const json_t *o, const char *k)
{
	return json_string_value(json_object_get(o, k));
}

static void test_logging(void)
{
	struct buf out = BUF_INIT;
	json_t *l[10] = { 0 };
	size_t n, i;
	const char *msg;

	capture_stderr(emit_logs, &out);
	n = parse_lines(&out, l, ARRAY_SIZE(l));
	CU_ASSERT_EQUAL_FATAL(n, 6);
	for (i = 0; i < n; i++)
		CU_ASSERT_PTR_NOT_NULL_FATAL(l[i]);

	CU_ASSERT_STRING_EQUAL(jstr(l[0], "level"), "info");
	CU_ASSERT_STRING_EQUAL(jstr(l[0], "prog"), "olp-test");
	CU_ASSERT_STRING_EQUAL(jstr(l[0], "request_id"), "r1");
	CU_ASSERT_STRING_EQUAL(jstr(l[0], "msg"), "hello \"world\"\n");
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(l[0], "pid")), getpid());
	CU_ASSERT_PTR_NOT_NULL(jstr(l[0], "ts"));

	CU_ASSERT_STRING_EQUAL(jstr(l[1], "level"), "warn");
	CU_ASSERT_PTR_NULL(json_object_get(l[1], "request_id"));
	msg = jstr(l[1], "msg");
	CU_ASSERT_PTR_NOT_NULL_FATAL(msg);
	CU_ASSERT_EQUAL(strncmp(msg, "open x: ", 8), 0);
	CU_ASSERT_STRING_EQUAL(msg + 8, strerror(ENOENT));

	CU_ASSERT_STRING_EQUAL(jstr(l[2], "level"), "warn");
	CU_ASSERT_STRING_EQUAL(jstr(l[2], "msg"), "bad \xef\xbf\xbd byte"); /* no errno */

	CU_ASSERT_STRING_EQUAL(jstr(l[3], "level"), "error");
	CU_ASSERT_STRING_EQUAL(jstr(l[3], "msg"), "5%");

	CU_ASSERT_STRING_EQUAL(jstr(l[4], "event"), "request");
	CU_ASSERT_STRING_EQUAL(jstr(l[4], "request_id"), "r5");
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(l[4], "status")), 200);

	CU_ASSERT(json_is_true(json_object_get(l[5], "raw")));
	for (i = 0; i < n; i++)
		json_decref(l[i]);
	buf_release(&out);
	log_set_program("olp");
}

/* The pid every line names is read once per process: a forked child's lines name the
 * child, not the parent it was read in. */
static void emit_after_fork(void)
{
	pid_t pid;
	int st;

	log_event("parent", NULL, ""); /* the parent's pid is read by now */
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		char p[24];

		snprintf(p, sizeof(p), ",\"child\":%ld", (long)getpid());
		log_event("child", NULL, p);
		_exit(0);
	}
	CU_ASSERT_EQUAL(waitpid(pid, &st, 0), pid);
}

static void test_logging_fork(void)
{
	struct buf out = BUF_INIT;
	json_t *l[2] = { 0 };

	capture_stderr(emit_after_fork, &out);
	CU_ASSERT_EQUAL_FATAL(parse_lines(&out, l, ARRAY_SIZE(l)), 2);
	CU_ASSERT_PTR_NOT_NULL_FATAL(l[0]);
	CU_ASSERT_PTR_NOT_NULL_FATAL(l[1]);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(l[0], "pid")), getpid());
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(l[1], "pid")),
			json_integer_value(json_object_get(l[1], "child")));
	CU_ASSERT_NOT_EQUAL(json_integer_value(json_object_get(l[1], "pid")), getpid());
	json_decref(l[0]);
	json_decref(l[1]);
	buf_release(&out);
}

/* ---- small utilities ---------------------------------------------------------------------- */

static void test_utils(void)
{
	char a[2 * 16 + 1], b[2 * 16 + 1];
	uint64_t t0, t1;
	size_t i;

	memset(a, 'Z', sizeof(a));
	random_hex(a, 16);
	CU_ASSERT_EQUAL(strlen(a), 32);
	for (i = 0; i < 32; i++)
		CU_ASSERT(strchr("0123456789abcdef", a[i]) != NULL);
	random_hex(b, 16);
	CU_ASSERT_STRING_NOT_EQUAL(a, b);
	random_hex(a, 0);
	CU_ASSERT_STRING_EQUAL(a, "");

	t0 = mono_ns();
	usleep(2000);
	t1 = mono_ns();
	CU_ASSERT(t1 > t0);
	CU_ASSERT(t1 - t0 >= 2000000u);
	CU_ASSERT(mono_ms() >= t1 / 1000000u);
	/* The wall clock in milliseconds: time(2)'s seconds, read around it. */
	{
		int64_t before = (int64_t)time(NULL) * 1000, ms = wall_ms(),
			after = (int64_t)time(NULL) * 1000 + 999;

		CU_ASSERT(ms >= before && ms <= after);
	}

	/* clock_after_ms: ms later on that clock, nanoseconds carried into seconds. */
	for (unsigned ms = 0; ms <= 2999; ms += 333) {
		struct timespec now, at;
		int64_t d;

		clock_gettime(CLOCK_MONOTONIC, &now);
		at = clock_after_ms(CLOCK_MONOTONIC, ms);
		CU_ASSERT(at.tv_nsec >= 0 && at.tv_nsec < 1000000000L);
		d = (int64_t)(at.tv_sec - now.tv_sec) * 1000000000 + (at.tv_nsec - now.tv_nsec);
		CU_ASSERT(d >= (int64_t)ms * 1000000 && d < ((int64_t)ms + 60000) * 1000000);
	}

	CU_ASSERT_EQUAL(write_all(-1, "x", 1), -EBADF);

	/* More than 64 bytes is cut to 64. */
	{
		char big[2 * 100 + 1];

		memset(big, 'Z', sizeof(big));
		random_hex(big, 100);
		CU_ASSERT_EQUAL(strlen(big), 128);
		CU_ASSERT_EQUAL(big[129], 'Z');
	}
}

/* unique_hex16: 16 hex digits; no repeat within a thread or across threads (each seeds
 * its own generator). */
#define UNIQUE_N ((size_t)4096)
static void *unique_thread(void *arg)
{
	char(*ids)[17] = arg;

	for (size_t i = 0; i < UNIQUE_N; i++)
		unique_hex16(ids[i]);
	return NULL;
}

static int cmp_id17(const void *a, const void *b)
{
	return memcmp(a, b, 17);
}

static void test_unique_hex16(void)
{
	char(*ids)[17] = xcalloc(4 * UNIQUE_N, 17);
	pthread_t t[3];
	size_t i, j;

	unique_thread(ids);
	for (i = 0; i < 3; i++)
		CU_ASSERT_EQUAL_FATAL(
			pthread_create(&t[i], NULL, unique_thread, ids + (i + 1) * UNIQUE_N), 0);
	for (i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	for (i = 0; i < 4 * UNIQUE_N; i++) {
		CU_ASSERT_EQUAL(strlen(ids[i]), 16);
		for (j = 0; j < 16; j++)
			CU_ASSERT(ids[i][j] && strchr("0123456789abcdef", ids[i][j]) != NULL);
	}
	qsort(ids, 4 * UNIQUE_N, 17, cmp_id17);
	for (i = 1; i < 4 * UNIQUE_N; i++)
		CU_ASSERT_NOT_EQUAL(memcmp(ids[i - 1], ids[i], 17), 0);
	free(ids);
}

/* wall_iso_now: "YYYY-MM-DDTHH:MM:SS.mmmZ", the same instant as wall_ms around it, and
 * right across a change of second (the cached part). */
static void test_wall_iso(void)
{
	for (int round = 0; round < 3; round++) {
		char iso[WALL_ISO_MAX], want[32];
		int64_t before = wall_ms(), after;
		time_t sec;
		struct tm tm;

		memset(iso, 'Z', sizeof(iso));
		wall_iso_now(iso);
		after = wall_ms();
		CU_ASSERT_EQUAL(strlen(iso), WALL_ISO_MAX - 1);
		CU_ASSERT_EQUAL(iso[10], 'T');
		CU_ASSERT_EQUAL(iso[19], '.');
		CU_ASSERT_EQUAL(iso[23], 'Z');
		/* Some instant in [before, after] formats as iso. */
		for (int64_t ms = before; ms <= after; ms++) {
			sec = (time_t)(ms / 1000);
			gmtime_r(&sec, &tm);
			(void)strftime(want, sizeof(want), "%Y-%m-%dT%H:%M:%S", &tm);
			snprintf(want + 19, sizeof(want) - 19, ".%03dZ", (int)(ms % 1000));
			if (!strcmp(want, iso))
				break;
			if (ms == after)
				CU_FAIL("wall_iso_now is not the time around it");
		}
		if (round < 2)
			usleep(600 * 1000); /* the next one or two in another second */
	}
}

/* A reader that takes everything, slowly, until EOF: what it got is checked after. */
struct slow_reader {
	int fd;
	struct buf got;
};

static void *slow_read(void *arg)
{
	struct slow_reader *r = arg;

	for (;;) {
		ssize_t n;

		buf_grow(&r->got, 4096);
		n = read(r->fd, buf_tail(&r->got), 4096);
		if (n <= 0)
			break;
		buf_commit(&r->got, (size_t)n);
		usleep(200);
	}
	return NULL;
}

static void test_write_control_file(void)
{
	char path[256], got[64] = { 0 };
	int fd;

	snprintf(path, sizeof(path), "%s/control", tmpdir);
	/* Never creates: a control file that is not there is an error. */
	CU_ASSERT_EQUAL(write_control_file(path, "deny"), -ENOENT);
	CU_ASSERT_EQUAL(access(path, F_OK), -1);
	fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(write(fd, "0123456789", 10), 10);
	close(fd);
	/* One write at offset 0, no truncation (what /proc's files expect of a writer). */
	CU_ASSERT_EQUAL(write_control_file(path, "0 1000 1\n"), 0);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(read(fd, got, sizeof(got) - 1), 10);
	close(fd);
	CU_ASSERT_STRING_EQUAL(got, "0 1000 1\n9");
	/* A directory cannot be written. */
	CU_ASSERT_EQUAL(write_control_file(tmpdir, "x"), -EISDIR);
	unlink(path);
}

static void test_write_all_until(void)
{
	size_t big = 4u << 20;
	char *data = xmalloc(big);
	struct slow_reader r = { .got = BUF_INIT };
	pthread_t th;
	uint64_t t0, ms;
	int sv[2], pp[2];

	for (size_t i = 0; i < big; i++)
		data[i] = (char)('a' + i % 26);

	/* A reader that never reads: the write ends at the deadline, not later. */
	CU_ASSERT_FATAL(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	t0 = mono_ms();
	CU_ASSERT_EQUAL(write_all_until(sv[0], data, big, t0 + 200), -ETIMEDOUT);
	ms = mono_ms() - t0;
	CU_ASSERT(ms >= 200 && ms < 400);
	/* The socket was not made non-blocking. */
	CU_ASSERT_EQUAL(fcntl(sv[0], F_GETFL) & O_NONBLOCK, 0);
	CU_ASSERT_EQUAL(wait_writable(sv[0], mono_ms() + 50), -ETIMEDOUT);
	/* Past the deadline, nothing more is waited for. */
	t0 = mono_ms();
	CU_ASSERT_EQUAL(write_all_until(sv[0], data, big, t0 - 1), -ETIMEDOUT);
	CU_ASSERT(mono_ms() - t0 < 50);
	close(sv[0]);
	close(sv[1]);

	/* A reader that reads, slowly: all of it arrives, in order, well before the deadline;
	 * and what fits at once is written even past the deadline. */
	CU_ASSERT_FATAL(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	CU_ASSERT_EQUAL(wait_writable(sv[0], mono_ms() + 50), 0);
	CU_ASSERT_EQUAL(write_all_until(sv[0], "0123456789", 10, mono_ms() - 1), 0);
	r.fd = sv[1];
	CU_ASSERT_FATAL(pthread_create(&th, NULL, slow_read, &r) == 0);
	CU_ASSERT_EQUAL(write_all_until(sv[0], data, big, mono_ms() + 60000), 0);
	close(sv[0]);
	pthread_join(th, NULL);
	CU_ASSERT_EQUAL(r.got.len, big + 10);
	CU_ASSERT(r.got.len == big + 10 && !memcmp(r.got.data, "0123456789", 10) &&
		  !memcmp(r.got.data + 10, data, big));
	buf_release(&r.got);

	/* The reader is gone: -EPIPE, and no SIGPIPE. */
	close(sv[1]);
	CU_ASSERT_FATAL(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	close(sv[1]);
	CU_ASSERT_EQUAL(write_all_until(sv[0], "x", 1, mono_ms() + 1000), -EPIPE);
	close(sv[0]);

	/* A pipe (CGI's stdout) that nobody reads: the same deadline, and it is left
	 * blocking as it was. */
	CU_ASSERT_FATAL(pipe(pp) == 0);
	t0 = mono_ms();
	CU_ASSERT_EQUAL(write_all_until(pp[1], data, big, t0 + 200), -ETIMEDOUT);
	ms = mono_ms() - t0;
	CU_ASSERT(ms >= 200 && ms < 400);
	CU_ASSERT_EQUAL(fcntl(pp[1], F_GETFL) & O_NONBLOCK, 0);
	close(pp[0]);
	close(pp[1]);
	free(data);
}

/* ---- paths -------------------------------------------------------------------------------- */

static void test_path_join(void)
{
	char out[8], *p;

	p = path_join("/var/lib", "olp");
	CU_ASSERT_STRING_EQUAL(p, "/var/lib/olp");
	free(p);
	p = path_join("", "x");
	CU_ASSERT_STRING_EQUAL(p, "/x");
	free(p);
	p = path_join("a/", "b"); /* nothing normalised */
	CU_ASSERT_STRING_EQUAL(p, "a//b");
	free(p);

	CU_ASSERT_EQUAL(path_join_buf(out, sizeof(out), "abc", "def"), 0); /* 7 + NUL: fits */
	CU_ASSERT_STRING_EQUAL(out, "abc/def");
	CU_ASSERT_EQUAL(path_join_buf(out, sizeof(out), "abc", "defg"), -ENAMETOOLONG);
	CU_ASSERT_EQUAL(path_join_buf(out, 7, "abc", "def"), -ENAMETOOLONG); /* no room for NUL */
	memset(out, 'Z', sizeof(out));
	CU_ASSERT_EQUAL(path_join_buf(out, 0, "a", "b"), -ENAMETOOLONG);
	CU_ASSERT_EQUAL(out[0], 'Z'); /* n == 0: nothing written */
}

/* ---- allocation ------------------------------------------------------------------------------ */

/* Run fn in a child: whether it died of SIGABRT (or, under a sanitizer that intercepts the
 * allocation first, at least did not return normally when must_abort is false). */
static bool dies(void (*fn)(void), bool must_abort)
{
	int status;
	pid_t pid = fork();

	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		/* The child's stderr says nothing the suite needs. */
		int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);

		if (fd >= 0)
			dup2(fd, STDERR_FILENO);
		fn();
		_exit(0);
	}
	CU_ASSERT_FATAL(waitpid(pid, &status, 0) == pid);
	if (must_abort)
		return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
	return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void overflow_array(void)
{
	free(xreallocarray(NULL, SIZE_MAX / 2 + 1, 2));
}

static void overflow_buf(void)
{
	struct buf b = BUF_INIT;

	buf_addch(&b, 'x');
	buf_grow(&b, SIZE_MAX - 1);
	buf_release(&b);
}

static void huge_malloc(void)
{
	free(xmalloc(SIZE_MAX));
}

static void test_alloc(void)
{
	char *p, *q;
	size_t i;

	/* Size 0 still gives a pointer of its own. */
	p = xmalloc(0);
	q = xmalloc(0);
	CU_ASSERT_PTR_NOT_NULL(p);
	CU_ASSERT_PTR_NOT_NULL(q);
	CU_ASSERT_PTR_NOT_EQUAL(p, q);
	free(p);
	free(q);
	p = xcalloc(0, 0);
	CU_ASSERT_PTR_NOT_NULL(p);
	free(p);

	p = xcalloc(100, 3);
	for (i = 0; i < 300; i++)
		CU_ASSERT_EQUAL(p[i], 0);
	memcpy(p, "keep", 5);
	p = xrealloc(p, 1 << 20);
	CU_ASSERT_STRING_EQUAL(p, "keep");
	p = xreallocarray(p, 10, 1);
	CU_ASSERT_STRING_EQUAL(p, "keep");
	free(p);
	p = xrealloc(NULL, 16);
	free(p);

	p = xstrdup("hello");
	CU_ASSERT_STRING_EQUAL(p, "hello");
	free(p);
	p = xstrndup("hello", 3);
	CU_ASSERT_STRING_EQUAL(p, "hel");
	free(p);
	p = xstrndup("hi", 10);
	CU_ASSERT_STRING_EQUAL(p, "hi");
	free(p);

	/* No -ENOMEM anywhere: an impossible size aborts. */
	CU_ASSERT(dies(overflow_array, true));
	CU_ASSERT(dies(overflow_buf, true));
	CU_ASSERT(dies(huge_malloc, false));
}

/* auto_free frees at the end of the scope; steal_pointer takes the pointer out of it. */
static void test_cleanup_helpers(void)
{
	char *kept;

	{
		auto_free char *dropped = xstrdup("dropped"); /* a leak here shows under ASan */
		auto_free char *moved = xstrdup("moved");

		CU_ASSERT_STRING_EQUAL(dropped, "dropped");
		kept = steal_pointer(&moved);
		CU_ASSERT_PTR_NULL(moved);
	}
	CU_ASSERT_STRING_EQUAL(kept, "moved"); /* not freed: ASan would see a use after free */
	free(kept);
}

static void test_strv(void)
{
	struct strv v = STRV_INIT;
	char **arr;
	size_t i, n;

	CU_ASSERT_PTR_NULL(v.v);
	for (i = 0; i < 100; i++)
		strv_pushf(&v, "item-%zu", i);
	CU_ASSERT_EQUAL(v.n, 100);
	CU_ASSERT_STRING_EQUAL(v.v[0], "item-0");
	CU_ASSERT_STRING_EQUAL(v.v[99], "item-99");
	CU_ASSERT_PTR_NULL(v.v[100]);
	CU_ASSERT_EQUAL(strv_find(&v, "item-42"), 42);
	CU_ASSERT_EQUAL(strv_find(&v, "item-100"), -1);
	strv_pushf(&v, "%s", "");
	CU_ASSERT_STRING_EQUAL(v.v[100], "");
	strv_push_take(&v, xstrdup("taken"));
	CU_ASSERT_STRING_EQUAL(v.v[101], "taken");
	CU_ASSERT_PTR_NULL(v.v[102]);
	strv_release(&v);
	CU_ASSERT_PTR_NULL(v.v);
	CU_ASSERT_EQUAL(v.n, 0);

	/* setenv replaces NAME's entry only, never a NAME prefix of another. */
	CU_ASSERT_EQUAL(strv_setenv(&v, "HOME", "/a"), 0);
	CU_ASSERT_EQUAL(strv_setenv(&v, "HOMEDIR", "/b"), 0);
	CU_ASSERT_EQUAL(strv_setenv(&v, "HOME", "/c"), 0);
	CU_ASSERT_EQUAL(v.n, 2);
	CU_ASSERT_STRING_EQUAL(v.v[0], "HOME=/c");
	CU_ASSERT_STRING_EQUAL(v.v[1], "HOMEDIR=/b");
	CU_ASSERT_EQUAL(strv_setenv(&v, "", "x"), -EINVAL);
	CU_ASSERT_EQUAL(strv_setenv(&v, "A=B", "x"), -EINVAL);
	CU_ASSERT_EQUAL(v.n, 2);

	arr = strv_detach(&v, &n);
	CU_ASSERT_EQUAL(n, 2);
	CU_ASSERT_STRING_EQUAL(arr[1], "HOMEDIR=/b");
	CU_ASSERT_PTR_NULL(arr[2]);
	CU_ASSERT_PTR_NULL(v.v);
	for (i = 0; i < n; i++)
		free(arr[i]);
	free(arr);

	/* An empty vector detaches as a NULL-terminated empty array, never NULL. */
	memset(&v, 0xff, sizeof(v));
	strv_init(&v);
	CU_ASSERT_PTR_NULL(v.v);
	CU_ASSERT_EQUAL(v.n, 0);
	arr = strv_detach(&v, &n);
	CU_ASSERT_PTR_NOT_NULL_FATAL(arr);
	CU_ASSERT_EQUAL(n, 0);
	CU_ASSERT_PTR_NULL(arr[0]);
	free(arr);
}

static void test_utf8_valid(void)
{
	CU_ASSERT_TRUE(utf8_valid("", 0));
	CU_ASSERT_TRUE(utf8_valid("plain", 5));
	CU_ASSERT_TRUE(utf8_valid("\xc3\xa9t\xc3\xa9", 6)); /* été */
	CU_ASSERT_TRUE(utf8_valid("\xf0\x9f\x98\x80", 4));  /* U+1F600 */
	CU_ASSERT_FALSE(utf8_valid("\xff", 1));
	CU_ASSERT_FALSE(utf8_valid("\xc0\x80", 2));	    /* overlong NUL */
	CU_ASSERT_FALSE(utf8_valid("\xed\xa0\x80", 3));	    /* a surrogate */
	CU_ASSERT_FALSE(utf8_valid("\xf4\x90\x80\x80", 4)); /* past U+10FFFF */
	CU_ASSERT_FALSE(utf8_valid("\xc3", 1));		    /* cut short */
	CU_ASSERT_FALSE(utf8_valid("ok\xc3\xa9\x80", 5));   /* a stray continuation */
}

/* slot_take: a cap of 3 holds across two processes; a slot comes free when its holder
 * releases it and when the holder exits without releasing anything. */
static void test_slots(void)
{
	char dir[256], path[300], c;
	int tochild[2], fromchild[2], fd, held[3];
	struct stat st;
	pid_t pid;
	int status;

	snprintf(dir, sizeof(dir), "%s/slots", tmpdir);
	CU_ASSERT_FATAL(mkdir(dir, 0700) == 0);
	CU_ASSERT_EQUAL(slot_take(dir, "k", 0), -EINVAL);
	CU_ASSERT_FATAL(pipe(tochild) == 0 && pipe(fromchild) == 0);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		int a = slot_take(dir, "k", 3), b = slot_take(dir, "k", 3);

		close(tochild[1]);
		close(fromchild[0]);
		c = a >= 0 && b >= 0 ? 'y' : 'n';
		(void)!write(fromchild[1], &c, 1);
		/* 'r': release one; EOF: exit holding the other. */
		while (read(tochild[0], &c, 1) == 1)
			if (c == 'r') {
				slot_release(a);
				(void)!write(fromchild[1], &c, 1);
			}
		_exit(0);
	}
	close(tochild[0]);
	close(fromchild[1]);
	CU_ASSERT_FATAL(read(fromchild[0], &c, 1) == 1);
	CU_ASSERT_EQUAL_FATAL(c, 'y');
	/* The child holds 2 of 3: one is left for this process, then none. */
	held[0] = slot_take(dir, "k", 3);
	CU_ASSERT_FATAL(held[0] >= 0);
	CU_ASSERT(fcntl(held[0], F_GETFD) & FD_CLOEXEC);
	CU_ASSERT_EQUAL(slot_take(dir, "k", 3), -EBUSY);
	/* Another prefix is another cap. */
	fd = slot_take(dir, "other", 1);
	CU_ASSERT(fd >= 0);
	CU_ASSERT_EQUAL(slot_take(dir, "other", 1), -EBUSY);
	slot_release(fd);
	/* The child releases one: it can be taken here. */
	c = 'r';
	CU_ASSERT_FATAL(write(tochild[1], &c, 1) == 1);
	CU_ASSERT_FATAL(read(fromchild[0], &c, 1) == 1);
	held[1] = slot_take(dir, "k", 3);
	CU_ASSERT(held[1] >= 0);
	CU_ASSERT_EQUAL(slot_take(dir, "k", 3), -EBUSY);
	/* The child exits still holding one: the kernel frees it. */
	close(tochild[1]);
	CU_ASSERT(waitpid(pid, &status, 0) == pid);
	close(fromchild[0]);
	held[2] = slot_take(dir, "k", 3);
	CU_ASSERT(held[2] >= 0);
	CU_ASSERT_EQUAL(slot_take(dir, "k", 3), -EBUSY);
	/* Released here, taken again. */
	slot_release(held[2]);
	held[2] = slot_take(dir, "k", 3);
	CU_ASSERT(held[2] >= 0);
	for (int i = 0; i < 3; i++)
		slot_release(held[i]);
	slot_release(-1); /* ignored */
	snprintf(path, sizeof(path), "%s/k.0.slot", dir);
	CU_ASSERT(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
	/* A symlink in place of a slot file is refused, never followed. */
	snprintf(path, sizeof(path), "%s/s.0.slot", dir);
	CU_ASSERT_FATAL(symlink("/tmp/olp-slot-target-never", path) == 0);
	CU_ASSERT_EQUAL(slot_take(dir, "s", 1), -ELOOP);
	CU_ASSERT(access("/tmp/olp-slot-target-never", F_OK) != 0);
	unlink(path);
	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s/k.%d.slot", dir, i);
		unlink(path);
	}
	snprintf(path, sizeof(path), "%s/other.0.slot", dir);
	unlink(path);
	rmdir(dir);
}

/* slot_take_at: the same caps in a directory the caller opened (sandbox/'s pre-start
 * slots): an empty prefix names the files <i>.slot, another prefix <prefix>.<i>.slot; the
 * cap holds across descriptors and against slot_take on the same files; a symlink in a slot
 * file's place is refused. */
static void test_slots_at(void)
{
	char dir[256], path[300];
	int dfd, a, b, t, u;
	struct stat st;

	snprintf(dir, sizeof(dir), "%s/slots-at", tmpdir);
	CU_ASSERT_FATAL(mkdir(dir, 0700) == 0);
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CU_ASSERT_FATAL(dfd >= 0);
	CU_ASSERT_EQUAL(slot_take_at(-1, "", 1), -EBADF);
	CU_ASSERT_EQUAL(slot_take_at(dfd, "", 0), -EINVAL);
	a = slot_take_at(dfd, "", 2);
	b = slot_take_at(dfd, "", 2);
	CU_ASSERT(a >= 0 && b >= 0);
	CU_ASSERT(fcntl(a, F_GETFD) & FD_CLOEXEC);
	CU_ASSERT_EQUAL(slot_take_at(dfd, "", 2), -EBUSY);
	snprintf(path, sizeof(path), "%s/0.slot", dir);
	CU_ASSERT(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
	snprintf(path, sizeof(path), "%s/1.slot", dir);
	CU_ASSERT(stat(path, &st) == 0);
	/* A prefix is a cap of its own, and the same files as slot_take's. */
	t = slot_take_at(dfd, "t6b", 1);
	CU_ASSERT(t >= 0);
	CU_ASSERT_EQUAL(slot_take(dir, "t6b", 1), -EBUSY);
	snprintf(path, sizeof(path), "%s/t6b.0.slot", dir);
	CU_ASSERT(stat(path, &st) == 0);
	slot_release(t);
	u = slot_take(dir, "t6b", 1);
	CU_ASSERT(u >= 0);
	slot_release(u);
	/* Released, taken again. */
	slot_release(a);
	a = slot_take_at(dfd, "", 2);
	CU_ASSERT(a >= 0);
	slot_release(a);
	slot_release(b);
	snprintf(path, sizeof(path), "%s/s.0.slot", dir);
	CU_ASSERT_FATAL(symlink("/tmp/olp-slot-target-never", path) == 0);
	CU_ASSERT_EQUAL(slot_take_at(dfd, "s", 1), -ELOOP);
	CU_ASSERT(access("/tmp/olp-slot-target-never", F_OK) != 0);
	unlink(path);
	for (const char *const *n = (const char *const[]){ "0.slot", "1.slot", "t6b.0.slot", NULL };
	     *n; n++)
		(void)unlinkat(dfd, *n, 0);
	close(dfd);
	rmdir(dir);
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "buf init and release", test_buf_init },
		{ "buf add and growth", test_buf_add_and_grow },
		{ "buf grow reserves room", test_buf_grow_reserves },
		{ "buf consume", test_buf_consume },
		{ "buf detach", test_buf_detach },
		{ "buf addf long strings", test_buf_addf },
		{ "buf_add_uint and buf_add_int", test_buf_add_int },
		{ "buf read file and EFBIG", test_buf_read_file },
		{ "buf read file appends to content", test_buf_read_file_appends },
		{ "buf read once", test_buf_read_once },
		{ "json escapes", test_json_escapes },
		{ "json escapes in long strings", test_json_escapes_long },
		{ "json invalid UTF-8 replaced", test_json_invalid_utf8 },
		{ "json random input always parses", test_json_random },
		{ "parse_u64", test_parse_u64 },
		{ "parse_json_int", test_parse_json_int },
		{ "logging JSON lines", test_logging },
		{ "logging: a forked child's lines name its own pid", test_logging_fork },
		{ "utilities", test_utils },
		{ "unique_hex16: 16 hex digits, none repeated across threads", test_unique_hex16 },
		{ "wall_iso_now: the ISO time of now, across seconds", test_wall_iso },
		{ "strv push, find, setenv, detach", test_strv },
		{ "utf8_valid", test_utf8_valid },
		{ "path_join and path_join_buf", test_path_join },
		{ "x* allocators, and aborting on an impossible size", test_alloc },
		{ "auto_free and steal_pointer", test_cleanup_helpers },
		{ "write_all_until: a reader that stops reading", test_write_all_until },
		{ "write_control_file: one write, never creates", test_write_control_file },
		{ "slot_take: a cap across two processes", test_slots },
		{ "slot_take_at: a cap in an open directory", test_slots_at },
		{ NULL, NULL },
	};
	int fails;

	if (!mkdtemp(tmpdir))
		return 1;
	fails = ts_cunit_run("common", tests);
	{
		char path[256];

		snprintf(path, sizeof(path), "%s/big", tmpdir);
		unlink(path);
		snprintf(path, sizeof(path), "%s/empty", tmpdir);
		unlink(path);
		snprintf(path, sizeof(path), "%s/hundred", tmpdir);
		unlink(path);
		snprintf(path, sizeof(path), "%s/stderr", tmpdir);
		unlink(path);
		rmdir(tmpdir);
	}
	return ts_exit_status(fails);
}
