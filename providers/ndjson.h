/* Private to providers/: the NDJSON line framer shared by the claude, codex and vibe
 * parsers, and the small JSON helpers they all use.
 *
 * The framer cuts a provider's stdout into lines as the bytes arrive, whatever the split
 * points of the reads. A line is handed over without its "\n" (and without a trailing
 * "\r"); empty lines are skipped. Lines longer than the framer's limit are refused: a
 * client that never sends "\n" must not make a worker buffer its whole output. */
#ifndef OLP_PROVIDERS_NDJSON_H
#define OLP_PROVIDERS_NDJSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/common.h"
#include "providers/providers.h"

/* Default bound on one line (see providers.h). */
#define PROV_NDJSON_MAX_LINE PROV_MAX_OUTPUT_LINE

/* Called once per complete line; returns 0 to go on, non-zero to stop the feed (that value
 * is returned by prov_ndjson_feed). */
typedef int (*prov_ndjson_line_fn)(void *ctx, const char *line, size_t len);

struct prov_ndjson {
	struct buf partial; /* the bytes of the current, unfinished line */
	size_t max_line;
	bool overlong; /* sticky: a line exceeded max_line; nothing more is framed */
	size_t lines;  /* complete lines delivered */
};

void prov_ndjson_init(struct prov_ndjson *nj, size_t max_line);
void prov_ndjson_release(struct prov_ndjson *nj);
/* Frame the next bytes. Returns the first non-zero value of fn (the rest of data is then
 * kept unframed and dropped), else 0. When a line exceeds max_line, sets nj->overlong,
 * returns 0 and frames nothing from then on: the caller checks nj->overlong after each
 * call and reports the error its own way. */
int prov_ndjson_feed(struct prov_ndjson *nj, const char *data, size_t len, prov_ndjson_line_fn fn,
		     void *ctx);
/* End of output: hand over a last line that had no "\n" (a process may exit without one).
 * A truncated JSON object there simply fails to parse in the caller. */
int prov_ndjson_finish(struct prov_ndjson *nj, prov_ndjson_line_fn fn, void *ctx);

/* ---- helpers for the parsers ------------------------------------------------------- */

/* Parse one line as a JSON object; NULL when it is not one (garbage, a truncated line). */
json_t *prov_json_object(const char *line, size_t len);
/* obj[key] as a string, or NULL when missing or of another type. */
const char *prov_json_str(const json_t *obj, const char *key);
/* The largest token count a provider may report: far above any real one, and small
 * enough that the sums the parsers make (input + cache read + cache creation) cannot
 * overflow. */
#define PROV_MAX_COUNT ((int64_t)1 << 48)
/* obj[key] as a count (a token count: 0..PROV_MAX_COUNT) / an HTTP status (100..599), or
 * dflt when missing, not an integer (parse_json_int) or out of that range. */
int64_t prov_json_count(const json_t *obj, const char *key, int64_t dflt);
int prov_json_status(const json_t *obj, const char *key, int dflt);

/* Emit helpers: each returns the sink's value. A delta of length 0 is not emitted. */
int prov_emit_delta(const struct prov_sink *sink, const char *text, size_t len);
int prov_emit_usage(const struct prov_sink *sink, const struct prov_usage *u);
int prov_emit_finish(const struct prov_sink *sink, const char *finish_reason);
int prov_emit_failure(const struct prov_sink *sink, enum prov_error err, int upstream_status,
		      const char *message);

/* The first HTTP status (100-599) that follows the word "status" in msg ("unexpected
 * status 401 Unauthorized", "last status: 429"), else 0. */
int prov_find_status(const char *msg);

/* A client-safe description of an upstream API status ("the upstream API rate-limited
 * the request"); a static string. */
const char *prov_upstream_text(int status);

/* A line parser on top of the framer: the parts every line-based provider shares. */
struct prov_lines {
	struct prov_ndjson nj;
	const struct prov_sink *sink; /* set for the duration of a feed */
	bool done;		      /* the answer is complete: ignore the rest */
	size_t ignored;		      /* well-formed lines of types we do not use */
	size_t garbage;		      /* lines that are not JSON objects */
};
void prov_lines_init(struct prov_lines *pl);
void prov_lines_release(struct prov_lines *pl);
/* Feed bytes to line_fn (ctx = the parser that embeds pl). line_fn returns < 0 (sink
 * abort), > 0 (done) or 0. Returns what prov_parser_feed must. */
int prov_lines_feed(struct prov_lines *pl, const char *data, size_t len,
		    const struct prov_sink *sink, prov_ndjson_line_fn line_fn, void *ctx);
/* End of output: the last, unterminated line. */
int prov_lines_finish(struct prov_lines *pl, const struct prov_sink *sink,
		      prov_ndjson_line_fn line_fn, void *ctx);

#endif
