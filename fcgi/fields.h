/* Private to fcgi/: the walk over a request body's top-level fields that the three client
 * APIs share (chat completions in api.c, Responses in resp_parse.c, Messages in
 * messages_parse.c). Each parser keeps its own table, the list of every field it honours,
 * ignores on purpose or refuses (docs/openai-compat.md is the same list for people); the
 * walk refuses, by name, any field its table does not list. No I/O. */
#ifndef OLP_FCGI_FIELDS_H
#define OLP_FCGI_FIELDS_H

#include <jansson.h>

#include "fcgi/fcgi.h"

/* What OLP does with a field it knows. */
enum fcgi_field_use {
	FCGI_FIELD_USED,    /* honoured: checked and translated by the parser's own code */
	FCGI_FIELD_IGNORED, /* accepted and ignored on purpose (the parser may check its type) */
	FCGI_FIELD_DEFAULT, /* accepted only with its default value (the parser checks it) */
	FCGI_FIELD_REFUSED, /* refused unless it asks for nothing (enum fcgi_fields_shape) */
};

/* One known field. A table ends with an entry whose name is NULL. */
struct fcgi_field {
	const char *name;
	enum fcgi_field_use use;
	const char *why; /* FCGI_FIELD_REFUSED: the end of the refusal's message */
};

/* Whose table it is: the words of the refusals (each API's own, which its clients and
 * tests know) and what a refused field may hold. */
enum fcgi_fields_shape {
	/* Chat completions: "Unrecognized request argument supplied: F (...)" and "F is not
	 * supported: WHY"; a refused field may be null, [] or {} (clients send "functions":
	 * [] and the like, which ask for nothing). */
	FCGI_FIELDS_CHAT,
	/* Responses: the same words; a refused field may only be null. */
	FCGI_FIELDS_RESPONSES,
	/* Messages, as Anthropic words them, the field's path first: "F: unknown field (...)"
	 * and "F: not supported: WHY"; a refused field may only be null. */
	FCGI_FIELDS_MESSAGES,
};

/* Refuse the first top-level field of root (an object) that table does not list, or that
 * it lists as refused and that asks for something: 0, or -1 with err set (400
 * invalid_request_error, param the field's name). The fields' own values are the
 * parser's to check. */
int fcgi_fields_check(const json_t *root, const struct fcgi_field *table,
		      enum fcgi_fields_shape shape, struct fcgi_error *err);

#endif
