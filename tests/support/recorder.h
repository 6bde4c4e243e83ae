/* A prov_sink that records every event, shared by the provider suites and the parser
 * fuzzer (tests/providers, tests/provider-clis, tests/fuzz). It uses providers.h only. */
#ifndef OLP_TESTS_RECORDER_H
#define OLP_TESTS_RECORDER_H

#include <stdbool.h>
#include <stddef.h>

#include "common/common.h"
#include "providers/providers.h"

struct ts_rec {
	struct buf text;   /* every delta, joined */
	struct buf events; /* the kinds in order, a run of deltas as one "D", then "<U p c t k>",
			      "<F reason>", "<E CODE status message>": the same however the
			      output was cut into reads */
	struct buf log;	   /* one line an event, deltas with their text ("delta …", "usage
			      p c t k", "finish …", "error CODE status message") */
	size_t ndeltas;
	size_t nevents;
	size_t nerrors;
	size_t malformed;	 /* events a parser must never emit: an empty delta, a NULL
				    text, usage, finish reason, failure or message */
	struct prov_usage usage; /* the last usage */
	char finish[32];	 /* the last finish reason, or "" */
	enum prov_error err;	 /* the last failure */
	int upstream_status;
	char message[512];
	int abort_after; /* > 0: the sink aborts (returns -1) at that many-th event */
};

void ts_rec_init(struct ts_rec *r);
void ts_rec_release(struct ts_rec *r);
/* The prov_sink emit function; ctx is a struct ts_rec. */
int ts_rec_emit(void *ctx, const struct prov_event *ev);
/* A sink into r (no done callback). */
static inline struct prov_sink ts_rec_sink(struct ts_rec *r)
{
	return (struct prov_sink){ .emit = ts_rec_emit, .ctx = r };
}

#endif
