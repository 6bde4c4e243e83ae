/* The check of a request body under EGR_CHECK_BODY (egress.h), read as it streams to the
 * upstream: a refusal is decided before the body's last byte is handed on, so that the
 * upstream sees a cut request and acts on nothing.
 *
 * What it stops (ADR 0027): a secretless run that talks to the model API itself, past its
 * CLI, spending the worker's credential on another model than the run's, on a background
 * response that outlives the run (and its count), or on objects stored on the owner's
 * account (store, previous_response_id, conversation, a stored prompt). The CLIs send
 * none of these (codex: "store": false). Members are compared case-insensitively, and a
 * top-level key with an escape is refused: some parsers match keys loosely or decode
 * escapes, and every reading must come to the same members. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "egress/internal.h"
#include "common/banned.h"

enum member { M_OTHER = 0, M_MODEL, M_FALSE_OR_NULL, M_NULL, M_NOT_OBJECT };

static const struct {
	const char *key;
	enum member rule;
	const char *why;
} members[] = {
	{ "model", M_MODEL, NULL },
	{ "background", M_FALSE_OR_NULL,
	  "OLP egress: \"background\" responses are not allowed (they outlive the run)" },
	{ "store", M_FALSE_OR_NULL,
	  "OLP egress: \"store\" is not allowed (nothing is kept on the upstream account)" },
	{ "previous_response_id", M_NULL,
	  "OLP egress: \"previous_response_id\" is not allowed (no stored responses)" },
	{ "conversation", M_NULL,
	  "OLP egress: \"conversation\" is not allowed (no stored conversations)" },
	{ "prompt", M_NOT_OBJECT, "OLP egress: a stored \"prompt\" is not allowed" },
};

static int refuse(struct egr_body *b, int status, const char *why)
{
	b->status = status;
	b->why = why;
	return -1;
}

static int want(void *ctx, const struct egr_jscan *s, unsigned depth)
{
	struct egr_body *b = ctx;

	if (depth != 1)
		return 0;
	if (s->key_odd[0])
		return refuse(b, 400,
			      "OLP egress: a top-level key of the request body holds an escape or "
			      "is too long");
	for (size_t i = 0; i < ARRAY_SIZE(members); i++)
		if (!strcasecmp(s->key[0], members[i].key))
			return 1;
	return 0;
}

/* One captured member's value against its rule. */
static int check(struct egr_body *b, enum member rule, const char *why, const json_t *v)
{
	switch (rule) {
	case M_MODEL:
		b->model_seen = true;
		if (!b->models)
			return 0;
		if (!json_is_string(v) ||
		    !egr_model_allowed(b->models, json_string_value(v), json_string_length(v)))
			return refuse(b, 403, "OLP egress: this model is not the run's model");
		return 0;
	case M_FALSE_OR_NULL: return json_is_false(v) || json_is_null(v) ? 0 : refuse(b, 403, why);
	case M_NULL: return json_is_null(v) ? 0 : refuse(b, 403, why);
	case M_NOT_OBJECT: return json_is_object(v) ? refuse(b, 403, why) : 0;
	case M_OTHER: break;
	}
	return 0;
}

static int got(void *ctx, const struct egr_jscan *s, unsigned depth, const char *raw, size_t len,
	       bool whole)
{
	struct egr_body *b = ctx;
	json_t *v;
	int ret = 0;

	(void)depth;
	if (!whole)
		return refuse(b, 400,
			      "OLP egress: a checked member of the request body is too long");
	v = json_loadb(raw, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
	if (!v)
		return refuse(b, 400, "OLP egress: the request body is not JSON");
	for (size_t i = 0; i < ARRAY_SIZE(members) && !ret; i++)
		if (!strcasecmp(s->key[0], members[i].key))
			ret = check(b, members[i].rule, members[i].why, v);
	json_decref(v);
	return ret;
}

void egr_body_begin(struct egr_body *b, const struct strv *models)
{
	memset(b, 0, sizeof(*b));
	b->models = models;
	b->js.want = want;
	b->js.got = got;
	b->js.ctx = b;
}

int egr_body_feed(struct egr_body *b, const char *data, size_t len)
{
	if (b->status)
		return -1;
	if (egr_jscan_feed(&b->js, data, len) && !b->status)
		return refuse(b, 400, "OLP egress: the request body is not one JSON object");
	/* The first byte that is not blank must open an object. */
	if (!b->js.stack[0] && b->js.depth)
		return refuse(b, 400, "OLP egress: the request body is not one JSON object");
	return 0;
}

int egr_body_finish(struct egr_body *b)
{
	if (b->finished)
		return b->status ? -1 : 0;
	b->finished = true;
	if (b->status)
		return -1;
	if (egr_jscan_finish(&b->js) || !b->js.stack[0])
		return refuse(b, 400, "OLP egress: the request body is not one JSON object");
	if (b->models && !b->model_seen)
		return refuse(b, 403, "OLP egress: the request body names no model");
	return 0;
}
