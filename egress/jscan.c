/* JSON read as it streams by (internal.h, struct egr_jscan): the forwarder checks request
 * bodies and counts the usage in answers without holding either whole, so that a large
 * body costs no memory and an SSE token is not held up.
 *
 * Strict on purpose: the request check decides from this reading which members a body
 * has, and the upstream acts on its own reading. Where two parsers could differ
 * (comments, trailing commas, NaN, numbers like "01" or "1-2", single quotes, a second
 * value after the first, control bytes in strings, bad escapes) the text is refused rather
 * than guessed. Keys that held an escape are marked, so that "mo\u0064el" cannot pass as
 * a key that is not "model". */
#include <stdint.h>
#include <string.h>

#include "egress/internal.h"
#include "common/banned.h"

enum expect {
	X_VALUE = 0,	/* a value must start (the start, after ':', after ',' in an array) */
	X_VALUE_OR_END, /* after '[' */
	X_KEY,		/* after ',' in an object */
	X_KEY_OR_END,	/* after '{' */
	X_COLON,	/* after a key */
	X_COMMA_OR_END, /* after a member's or an element's value */
	X_TRAILING,	/* after the top-level value: whitespace only */
};

static int fail(struct egr_jscan *s)
{
	s->failed = true;
	return -1;
}

static void cap_put(struct egr_jscan *s, char c)
{
	if (!s->cap_on)
		return;
	if (s->cap_len < sizeof(s->cap))
		s->cap[s->cap_len++] = c;
	else
		s->cap_over = true;
}

/* Every container from the top down to depth is an object (so keys name the path). */
static bool objects_to(const struct egr_jscan *s, unsigned depth)
{
	for (unsigned i = 0; i < depth; i++)
		if (!s->stack[i])
			return false;
	return true;
}

/* A value starts here: expected, and captured when the caller wants it. */
static int value_start(struct egr_jscan *s)
{
	int w;

	if (s->expect != X_VALUE && s->expect != X_VALUE_OR_END)
		return fail(s);
	if (s->cap_on || !s->want || s->depth < 1 || s->depth > 2 || !objects_to(s, s->depth))
		return 0;
	w = s->want(s->ctx, s, s->depth);
	if (w < 0)
		return fail(s);
	if (w) {
		s->cap_on = true;
		s->cap_over = false;
		s->cap_len = 0;
		s->cap_depth = s->depth;
	}
	return 0;
}

static int value_end(struct egr_jscan *s)
{
	s->expect = s->depth ? X_COMMA_OR_END : X_TRAILING;
	if (s->cap_on && s->depth == s->cap_depth) {
		s->cap_on = false;
		if (s->got && s->got(s->ctx, s, s->depth, s->cap, s->cap_len, !s->cap_over) < 0)
			return fail(s);
	}
	return 0;
}

static bool lit_char(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       c == '-' || c == '+' || c == '.';
}

/* Where a number is in RFC 8259's grammar, -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?,
 * after the characters read so far (s->num). Only the N_END_* states end a number. */
enum num_state {
	N_NONE = 0, /* nothing read */
	N_MINUS,    /* "-" */
	N_BAD,	    /* not a number */
	N_DOT,	    /* "1." */
	N_E,	    /* "1e" */
	N_E_SIGN,   /* "1e+" */
	N_END_ZERO, /* "0", "-0": only '.', 'e' may follow */
	N_END_INT,  /* "12" */
	N_END_FRAC, /* "1.5" */
	N_END_EXP,  /* "1e5" */
};

static unsigned num_next(unsigned st, char c)
{
	bool digit = c >= '0' && c <= '9', e = c == 'e' || c == 'E';

	switch (st) {
	case N_NONE: return c == '-' ? N_MINUS : c == '0' ? N_END_ZERO : digit ? N_END_INT : N_BAD;
	case N_MINUS: return c == '0' ? N_END_ZERO : digit ? N_END_INT : N_BAD;
	case N_END_ZERO: return c == '.' ? N_DOT : e ? N_E : N_BAD;
	case N_END_INT: return digit ? N_END_INT : c == '.' ? N_DOT : e ? N_E : N_BAD;
	case N_DOT: return digit ? N_END_FRAC : N_BAD;
	case N_END_FRAC: return digit ? N_END_FRAC : e ? N_E : N_BAD;
	case N_E: return c == '+' || c == '-' ? N_E_SIGN : digit ? N_END_EXP : N_BAD;
	case N_E_SIGN:
	case N_END_EXP: return digit ? N_END_EXP : N_BAD;
	default: return N_BAD;
	}
}

/* true, false, null, or a number as RFC 8259 writes one: a parser that reads "1-2" or
 * "01" its own way could see other members than the check saw. */
static int lit_end(struct egr_jscan *s)
{
	const char *l = s->lit;
	unsigned n = s->lit_len;

	s->in_lit = false;
	if ((n == 4 && !memcmp(l, "true", 4)) || (n == 5 && !memcmp(l, "false", 5)) ||
	    (n == 4 && !memcmp(l, "null", 4)) || s->num >= N_END_ZERO)
		return value_end(s);
	return fail(s);
}

static void lit_add(struct egr_jscan *s, char c)
{
	cap_put(s, c);
	if (s->lit_len < sizeof(s->lit))
		s->lit[s->lit_len] = c;
	if (s->lit_len < UINT32_MAX)
		s->lit_len++;
	s->num = num_next(s->num, c);
}

static bool hex(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* One byte of a string (the opening quote is behind). */
static int in_string(struct egr_jscan *s, char c)
{
	unsigned char u = (unsigned char)c;
	unsigned k = s->depth - 1;
	bool track = s->str_is_key && s->depth <= 2;

	cap_put(s, c);
	if (s->uni) {
		s->uni--;
		return hex(c) ? 0 : fail(s);
	}
	if (s->esc) {
		s->esc = false;
		if (c == 'u')
			s->uni = 4;
		else if (!strchr("\"\\/bfnrt", c) || !c)
			return fail(s);
		return 0;
	}
	if (c == '\\') {
		s->esc = true;
		if (track)
			s->key_odd[k] = true;
		return 0;
	}
	if (u < 0x20)
		return fail(s);
	if (c != '"') {
		if (track && s->key_len + 1 < EGR_JSCAN_KEY)
			s->key[k][s->key_len++] = c;
		else if (track)
			s->key_odd[k] = true;
		return 0;
	}
	s->in_str = false;
	if (!s->str_is_key)
		return value_end(s);
	if (track) {
		s->key[k][s->key_len] = '\0';
		if (s->key_odd[k])
			s->key[k][0] = '\0';
	}
	s->expect = X_COLON;
	return 0;
}

static int open_container(struct egr_jscan *s, char c)
{
	if (value_start(s))
		return -1;
	cap_put(s, c);
	if (s->depth >= EGR_JSCAN_DEPTH)
		return fail(s);
	s->stack[s->depth++] = c == '{';
	s->expect = c == '{' ? X_KEY_OR_END : X_VALUE_OR_END;
	return 0;
}

static int close_container(struct egr_jscan *s, char c)
{
	bool obj = c == '}';

	if (!s->depth || s->stack[s->depth - 1] != obj)
		return fail(s);
	if (s->expect != X_COMMA_OR_END && s->expect != (obj ? X_KEY_OR_END : X_VALUE_OR_END))
		return fail(s);
	cap_put(s, c);
	s->depth--;
	return value_end(s);
}

/* One byte outside strings and literals. */
static int structural(struct egr_jscan *s, char c)
{
	switch (c) {
	case ' ':
	case '\t':
	case '\n':
	case '\r': cap_put(s, c); return 0;
	case '{':
	case '[': return open_container(s, c);
	case '}':
	case ']': return close_container(s, c);
	case ',':
		if (s->expect != X_COMMA_OR_END)
			return fail(s);
		cap_put(s, c);
		s->expect = s->stack[s->depth - 1] ? X_KEY : X_VALUE;
		return 0;
	case ':':
		if (s->expect != X_COLON)
			return fail(s);
		cap_put(s, c);
		s->expect = X_VALUE;
		return 0;
	case '"':
		if (s->expect == X_KEY || s->expect == X_KEY_OR_END) {
			cap_put(s, c);
			s->str_is_key = true;
			if (s->depth <= 2) {
				s->key_len = 0;
				s->key_odd[s->depth - 1] = false;
				/* A key at depth 1 starts a new member: the key below is stale. */
				if (s->depth == 1)
					s->key[1][0] = '\0';
			}
		} else {
			if (value_start(s))
				return -1;
			cap_put(s, c);
			s->str_is_key = false;
		}
		s->in_str = true;
		return 0;
	default:
		if (!lit_char(c) || value_start(s))
			return fail(s);
		s->in_lit = true;
		s->lit_len = 0;
		s->num = N_NONE;
		lit_add(s, c);
		return 0;
	}
}

int egr_jscan_feed(struct egr_jscan *s, const char *data, size_t len)
{
	for (size_t i = 0; i < len && !s->failed; i++) {
		char c = data[i];

		if (s->in_str) {
			(void)in_string(s, c);
			continue;
		}
		if (s->in_lit) {
			if (lit_char(c)) {
				lit_add(s, c);
				continue;
			}
			if (lit_end(s))
				break;
		}
		if (s->expect == X_TRAILING && c != ' ' && c != '\t' && c != '\n' && c != '\r') {
			(void)fail(s);
			break;
		}
		(void)structural(s, c);
	}
	return s->failed ? -1 : 0;
}

int egr_jscan_finish(struct egr_jscan *s)
{
	if (!s->failed && s->in_lit && !s->depth)
		(void)lit_end(s);
	if (s->failed || s->in_str || s->in_lit || s->expect != X_TRAILING)
		return -1;
	return 0;
}
