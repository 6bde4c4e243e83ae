/* The HTTP/1.1 request head as the forwarder reads it (RFC 9112), strictly.
 *
 * What it stops: request smuggling and path confusion. The forwarder decides from this
 * parse which path is asked for and where the body ends; libcurl then writes a request of
 * its own to the upstream. Anything two parsers could read two ways is refused here
 * rather than guessed: obs-folded lines, whitespace before a colon, control bytes, both
 * Content-Length and Transfer-Encoding, a transfer coding other than chunked, several
 * Content-Lengths that differ, a non-canonical path. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "egress/internal.h"
#include "common/banned.h"

bool egr_is_token(const char *s, size_t len)
{
	static const char extra[] = "!#$%&'*+-.^_`|~";

	if (!len)
		return false;
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)s[i];

		if (!isalnum(ch) && !(ch && strchr(extra, ch)))
			return false;
	}
	return true;
}

/* A header value's bytes: HTAB, visible ASCII, space, obs-text. No CR, LF, NUL, DEL. */
static bool value_ok(const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)s[i];

		if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
			return false;
	}
	return true;
}

bool egr_list_has(const char *value, const char *token, size_t token_len)
{
	const char *p = value;

	while (*p) {
		const char *start, *end;

		while (*p == ' ' || *p == '\t' || *p == ',')
			p++;
		start = p;
		while (*p && *p != ',')
			p++;
		end = p;
		while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
			end--;
		if ((size_t)(end - start) == token_len && !strncasecmp(start, token, token_len))
			return true;
	}
	return false;
}

static int parse_length(struct egr_req *r, const char *v)
{
	uint64_t n = 0;
	size_t i;

	for (i = 0; v[i]; i++) {
		if (!isdigit((unsigned char)v[i]) || i >= 18)
			return 400;
		n = n * 10 + (uint64_t)(v[i] - '0');
	}
	if (!i || (r->has_length && r->length != n))
		return 400;
	r->has_length = true;
	r->length = n;
	return 0;
}

/* What the request's framing and connection headers mean. 0 or a status. */
static int interpret(struct egr_req *r)
{
	bool close = false, keep = false, te = false;
	int ret;

	for (size_t i = 0; i < r->nh; i++) {
		const char *n = r->h[i].name, *v = r->h[i].value;

		if (!strcasecmp(n, "content-length")) {
			if ((ret = parse_length(r, v)))
				return ret;
		} else if (!strcasecmp(n, "transfer-encoding")) {
			/* One coding, chunked, in one header: anything else is either not ours
			 * to decode or a smuggling attempt. */
			if (te || r->minor == 0)
				return 400;
			te = true;
			if (strcasecmp(v, "chunked"))
				return 501;
			r->chunked = true;
		} else if (!strcasecmp(n, "connection")) {
			close |= egr_list_has(v, "close", 5);
			keep |= egr_list_has(v, "keep-alive", 10);
		} else if (!strcasecmp(n, "expect")) {
			if (strcasecmp(v, "100-continue"))
				return 417;
			r->expect_continue = true;
		}
	}
	if (r->chunked && r->has_length)
		return 400;
	r->keep_alive = r->minor == 1 ? !close : keep && !close;
	return 0;
}

/* Split off the line at *p (ending in CRLF before end): the line, NUL-terminated, or NULL. */
static char *next_line(char **p, char *end)
{
	char *line = *p, *eol;

	if (line >= end)
		return NULL;
	eol = memmem(line, (size_t)(end - line), "\r\n", 2);
	if (!eol)
		return NULL;
	*eol = '\0';
	*p = eol + 2;
	return line;
}

static int parse_request_line(struct egr_req *r, char *line)
{
	char *sp1 = strchr(line, ' '), *sp2, *v;

	if (!sp1 || !egr_is_token(line, (size_t)(sp1 - line)))
		return 400;
	*sp1 = '\0';
	r->method = line;
	r->target = sp1 + 1;
	sp2 = strchr(r->target, ' ');
	if (!sp2 || sp2 == r->target)
		return 400;
	*sp2 = '\0';
	for (const char *t = r->target; *t; t++)
		if ((unsigned char)*t <= 0x20 || (unsigned char)*t >= 0x7f || *t == '#')
			return 400;
	r->path_len = strcspn(r->target, "?");
	v = sp2 + 1;
	if (strncmp(v, "HTTP/", 5) || !isdigit((unsigned char)v[5]) || v[6] != '.' ||
	    !isdigit((unsigned char)v[7]) || v[8])
		return 400;
	if (v[5] != '1' || (v[7] != '0' && v[7] != '1'))
		return 505;
	r->minor = v[7] - '0';
	return 0;
}

int egr_req_parse(struct egr_req *r, const char *data, size_t len)
{
	char *p, *end, *line;
	int ret;

	memset(r, 0, sizeof(*r));
	r->head = xmalloc(len + 1);
	memcpy(r->head, data, len);
	r->head[len] = '\0';
	p = r->head;
	end = r->head + len;
	/* RFC 9112 2.2: empty lines before the request line are ignored. */
	while (end - p >= 2 && p[0] == '\r' && p[1] == '\n')
		p += 2;
	line = next_line(&p, end);
	if (!line)
		return 400;
	if ((ret = parse_request_line(r, line)))
		return ret;
	while ((line = next_line(&p, end)) && *line) {
		char *colon = strchr(line, ':'), *v, *ve;

		/* A line starting with whitespace is obs-fold; whitespace before the colon
		 * would be read as part of the name by some and not by others. */
		if (!colon || !egr_is_token(line, (size_t)(colon - line)))
			return 400;
		if (r->nh == EGR_MAX_HEADERS)
			return 431;
		*colon = '\0';
		v = colon + 1;
		while (*v == ' ' || *v == '\t')
			v++;
		ve = v + strlen(v);
		while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
			ve--;
		*ve = '\0';
		if (!value_ok(v, (size_t)(ve - v)))
			return 400;
		r->h[r->nh].name = line;
		r->h[r->nh++].value = v;
	}
	/* The head ends with its empty line, exactly at end. */
	if (!line || p != end)
		return 400;
	return interpret(r);
}

void egr_req_release(struct egr_req *r)
{
	free(r->head);
	memset(r, 0, sizeof(*r));
}

const char *egr_req_header(const struct egr_req *r, const char *name)
{
	for (size_t i = 0; i < r->nh; i++)
		if (!strcasecmp(r->h[i].name, name))
			return r->h[i].value;
	return NULL;
}

bool egr_req_hop_by_hop(const struct egr_req *r, const char *name)
{
	static const char *const fixed[] = {
		"connection",	  "keep-alive",		 "proxy-connection", "te",
		"trailer",	  "transfer-encoding",	 "upgrade",	     "host",
		"content-length", "proxy-authorization", "expect",	     "proxy-authenticate"
	};

	for (size_t i = 0; i < ARRAY_SIZE(fixed); i++)
		if (!strcasecmp(name, fixed[i]))
			return true;
	for (size_t i = 0; i < r->nh; i++)
		if (!strcasecmp(r->h[i].name, "connection") &&
		    egr_list_has(r->h[i].value, name, strlen(name)))
			return true;
	return false;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = (char)tolower((unsigned char)c);
	return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

bool egr_path_canonical(const char *path, size_t len)
{
	size_t seg = 1; /* start of the current segment */

	if (!len || path[0] != '/')
		return false;
	for (size_t i = 1; i <= len; i++) {
		if (i == len || path[i] == '/') {
			size_t sl = i - seg;

			/* An empty segment is allowed only as the very end ("/v1/"). */
			if ((sl == 0 && i != len) || (sl == 1 && path[seg] == '.') ||
			    (sl == 2 && path[seg] == '.' && path[seg + 1] == '.'))
				return false;
			seg = i + 1;
			continue;
		}
		/* ';' is a path parameter to some servers (Tomcat: "/a;/../b"). */
		if (path[i] == '\\' || path[i] == ';')
			return false;
		if (path[i] == '%') {
			int hi, lo, ch;

			if (i + 2 >= len)
				return false; /* not two hex digits */
			hi = hexval(path[i + 1]);
			lo = hexval(path[i + 2]);
			if (hi < 0 || lo < 0)
				return false;
			ch = hi * 16 + lo;
			/* Decoded by an upstream, these would make another path. */
			if (ch == '.' || ch == '/' || ch == '\\' || ch == '%' || ch == ';' ||
			    ch == 0)
				return false;
			i += 2;
		}
	}
	return true;
}

const char *egr_reason(int status)
{
	switch (status) {
	case 100: return "Continue";
	case 200: return "OK";
	case 201: return "Created";
	case 202: return "Accepted";
	case 204: return "No Content";
	case 206: return "Partial Content";
	case 301: return "Moved Permanently";
	case 302: return "Found";
	case 304: return "Not Modified";
	case 307: return "Temporary Redirect";
	case 308: return "Permanent Redirect";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 409: return "Conflict";
	case 413: return "Content Too Large";
	case 415: return "Unsupported Media Type";
	case 417: return "Expectation Failed";
	case 422: return "Unprocessable Content";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 501: return "Not Implemented";
	case 502: return "Bad Gateway";
	case 503: return "Service Unavailable";
	case 504: return "Gateway Timeout";
	case 505: return "HTTP Version Not Supported";
	case 529: return "Overloaded";
	default: return "Status";
	}
}

/* ---- a CONNECT authority ------------------------------------------------------------ */

static bool is_ip_literal(const char *host, size_t len)
{
	char tmp[256];
	struct in_addr a4;
	bool digits_only = true;

	if (len >= sizeof(tmp))
		return false;
	memcpy(tmp, host, len);
	tmp[len] = '\0';
	/* inet_aton takes every form libc's resolver takes as an address: "127.1",
	 * "0x7f.1", "2130706433". A last label of digits only is never a DNS name. */
	if (inet_aton(tmp, &a4))
		return true;
	for (const char *p = strrchr(tmp, '.') ? strrchr(tmp, '.') + 1 : tmp; *p; p++)
		digits_only &= *p >= '0' && *p <= '9';
	return digits_only;
}

/* "host:port" with a DNS name and a port in 1-65535: the host's length, or 0. */
static size_t host_port_ok(const char *hp)
{
	const char *colon = strrchr(hp, ':');
	size_t hl;
	char *end;
	unsigned long port;

	if (!colon || colon == hp)
		return 0;
	hl = (size_t)(colon - hp);
	for (size_t i = 0; i < hl; i++) {
		char ch = hp[i];

		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '-' || ch == '.'))
			return 0;
	}
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	/* Digits only: strtoul also takes a sign and leading blanks ("+443"). */
	if (errno || *end || colon[1] < '1' || colon[1] > '9' || port < 1 || port > 65535)
		return 0;
	return hl;
}

bool egr_host_port_valid(const char *hp, bool *is_ip)
{
	size_t hl = host_port_ok(hp);

	*is_ip = hl && is_ip_literal(hp, hl);
	return hl != 0;
}
