#include <stdio.h>
#include <string.h>

#include "tests/support/recorder.h"
#include "common/banned.h"

void ts_rec_init(struct ts_rec *r)
{
	memset(r, 0, sizeof(*r));
	buf_init(&r->text);
	buf_init(&r->events);
	buf_init(&r->log);
}

void ts_rec_release(struct ts_rec *r)
{
	buf_release(&r->text);
	buf_release(&r->events);
	buf_release(&r->log);
}

static void on_delta(struct ts_rec *r, const struct prov_event *ev)
{
	if (!ev->text || !ev->len) {
		r->malformed++;
		return;
	}
	buf_add(&r->text, ev->text, ev->len);
	buf_adds(&r->log, "delta ");
	buf_add(&r->log, ev->text, ev->len);
	if (!r->events.len || r->events.data[r->events.len - 1] != 'D')
		buf_addch(&r->events, 'D');
	r->ndeltas++;
}

static void on_usage(struct ts_rec *r, const struct prov_usage *u)
{
	char line[128];

	if (!u) {
		r->malformed++;
		return;
	}
	r->usage = *u;
	snprintf(line, sizeof(line), "%lld %lld %lld %lld%s", (long long)u->prompt_tokens,
		 (long long)u->completion_tokens, (long long)u->total_tokens,
		 (long long)u->cached_tokens, u->partial ? " partial" : "");
	buf_addf(&r->log, "usage %s", line);
	buf_addf(&r->events, "<U %s>", line);
}

static void on_finish(struct ts_rec *r, const char *reason)
{
	if (!reason) {
		r->malformed++;
		return;
	}
	snprintf(r->finish, sizeof(r->finish), "%s", reason);
	buf_addf(&r->log, "finish %s", reason);
	buf_addf(&r->events, "<F %s>", reason);
}

static void on_error(struct ts_rec *r, const struct prov_failure *f)
{
	if (!f || !f->message) {
		r->malformed++;
		return;
	}
	r->err = f->err;
	r->upstream_status = f->upstream_status;
	snprintf(r->message, sizeof(r->message), "%s", f->message);
	r->nerrors++;
	buf_addf(&r->log, "error %s %d %s", prov_error_code(f->err), f->upstream_status,
		 f->message);
	buf_addf(&r->events, "<E %s %d %s>", prov_error_code(f->err), f->upstream_status,
		 f->message);
}

int ts_rec_emit(void *ctx, const struct prov_event *ev)
{
	struct ts_rec *r = ctx;

	r->nevents++;
	switch (ev->kind) {
	case PROV_EV_DELTA: on_delta(r, ev); break;
	case PROV_EV_USAGE: on_usage(r, ev->usage); break;
	case PROV_EV_FINISH: on_finish(r, ev->finish_reason); break;
	case PROV_EV_ERROR: on_error(r, ev->failure); break;
	case PROV_EV_TOOL_CALL:
		/* "<T0 id name:args>" for a call's first piece, "<T0:args>" for the others. */
		buf_addf(&r->log, "tool %u %s %s %.*s", ev->tool_index,
			 ev->tool_id ? ev->tool_id : "-", ev->tool_name ? ev->tool_name : "-",
			 (int)ev->len, ev->text ? ev->text : "");
		buf_addf(&r->events, "<T%u%s%s%s%s:%.*s>", ev->tool_index, ev->tool_id ? " " : "",
			 ev->tool_id ? ev->tool_id : "", ev->tool_name ? " " : "",
			 ev->tool_name ? ev->tool_name : "", (int)ev->len,
			 ev->text ? ev->text : "");
		break;
	}
	buf_addch(&r->log, '\n');
	return r->abort_after && r->nevents >= (size_t)r->abort_after ? -1 : 0;
}
