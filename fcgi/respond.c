/* The answers' common layer: status line and headers (with the X-OLP-* of a chat answer
 * under way), JSON bodies, OpenAI-style errors, and who the caller is. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fcgi/worker.h"
#include "common/banned.h"

/* Append one header through fcgi_header_add; one it refuses (a control character in a
 * value: header injection) is left out and logged, and the answer goes on without it. */
void fcgi_add_header(struct fcgi_req *rc, struct buf *h, const char *name, const char *value)
{
	if (fcgi_header_add(h, name, value))
		log_warnx(rc->rid,
			  "response header %.64s left out: its value holds a control "
			  "character",
			  name);
}

/* The head of the answer into h (rc->status and rc->t_first set). */
static void head_build(struct fcgi_req *rc, struct buf *h, int status, const char *ctype,
		       const struct fcgi_hdr *extra)
{
	rc->status = status;
	if (!rc->t_first)
		rc->t_first = mono_ms();
	fcgi_add_header(rc, h, "Status", fcgi_status_text(status));
	fcgi_add_header(rc, h, "Content-Type", ctype);
	fcgi_add_header(rc, h, "X-Request-Id", rc->rid);
	if (rc->answer)
		fcgi_chat_headers(rc->answer, status, h);
	for (; extra && extra->name; extra++)
		fcgi_add_header(rc, h, extra->name, extra->value);
	buf_adds(h, "\r\n");
}

void fcgi_send_head(struct fcgi_req *rc, int status, const char *ctype,
		    const struct fcgi_hdr *extra)
{
	struct buf h = BUF_INIT;

	head_build(rc, &h, status, ctype, extra);
	fcgi_io_write(rc->io, h.data, h.len);
	buf_release(&h);
}

void fcgi_send_json(struct fcgi_req *rc, int status, const struct buf *body,
		    const struct fcgi_hdr *extra)
{
	struct buf a = BUF_INIT;

	/* Head and body in one record, written with the end of the request: one write. */
	buf_grow(&a, 256 + body->len);
	head_build(rc, &a, status, "application/json", extra);
	buf_add(&a, body->data, body->len);
	fcgi_io_write_last(rc->io, &a);
}

void fcgi_send_error(struct fcgi_req *rc, const struct fcgi_error *e, const struct fcgi_hdr *extra)
{
	struct buf b = BUF_INIT;

	fcgi_error_json_api(e, rc->api, &b);
	rc->error_code = e->code ? e->code : e->type;
	fcgi_send_json(rc, e->status, &b, extra);
	buf_release(&b);
}

void fcgi_fail(struct fcgi_req *rc, int status, const char *type, const char *code, const char *fmt,
	       ...)
{
	struct fcgi_error e = { .status = status, .type = type, .code = code };
	va_list ap;

	va_start(ap, fmt);
	(void)vsnprintf(e.message, sizeof(e.message), fmt, ap);
	va_end(ap);
	fcgi_send_error(rc, &e, NULL);
}

/* ---- auth ------------------------------------------------------------------------------ */

/* Identify the caller. required: a missing token is an error (else it yields no
 * identity, as /health allows). Returns 0 to go on. */
int fcgi_authenticate(struct fcgi_req *rc, bool required)
{
	const char *authz = fcgi_io_param(rc->io, "HTTP_AUTHORIZATION");
	const char *xkey = fcgi_io_param(rc->io, "HTTP_X_API_KEY");
	enum auth_result r;

	if (rc->have_id)
		return 0;
	if (!required && !authz && !xkey)
		return 0;
	r = auth_check(rc->app->auth, authz, xkey, &rc->id);
	if (r == AUTH_OK) {
		rc->have_id = true;
		return 0;
	}
	if (r == AUTH_ERR_UNAVAILABLE) {
		/* The shared store is away and this key was not checked recently (ADR 0034): it
		 * may well exist, so not a 401 a client would give up on. */
		struct fcgi_error e;

		fcgi_error_set(&e, 503, auth_error_type(r), auth_error_type(r), NULL, "%s",
			       auth_strerror(r));
		fcgi_send_error(
			rc, &e,
			(const struct fcgi_hdr[]){ { "Retry-After", STORE_RETRY_AFTER }, { 0 } });
		return -1;
	}
	fcgi_fail(rc, 401, auth_error_type(r), auth_error_type(r), "%s", auth_strerror(r));
	return -1;
}

bool fcgi_is_owner(const struct fcgi_req *rc)
{
	return rc->have_id && rc->id.tier == AUTH_TIER_OWNER;
}
