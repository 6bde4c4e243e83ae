/* Allocation that aborts on failure, and the string vector; contracts in common.h. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/banned.h"

void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		abort();
	return p;
}

void *xcalloc(size_t nmemb, size_t size)
{
	void *p = calloc(nmemb ? nmemb : 1, size ? size : 1);

	if (!p)
		abort();
	return p;
}

void *xrealloc(void *p, size_t n)
{
	void *np = realloc(p, n ? n : 1);

	if (!np)
		abort();
	return np;
}

void *xreallocarray(void *p, size_t nmemb, size_t size)
{
	if (size && nmemb > SIZE_MAX / size)
		abort();
	return xrealloc(p, nmemb * size);
}

char *xstrdup(const char *s)
{
	char *d = strdup(s);

	if (!d)
		abort();
	return d;
}

char *xstrndup(const char *s, size_t n)
{
	char *d = strndup(s, n);

	if (!d)
		abort();
	return d;
}

void strv_init(struct strv *v)
{
	v->v = NULL;
	v->n = 0;
	v->cap = 0;
}

void strv_release(struct strv *v)
{
	size_t i;

	for (i = 0; i < v->n; i++)
		free(v->v[i]);
	free(v->v);
	strv_init(v);
}

void strv_push_take(struct strv *v, char *s)
{
	/* Room for s and the terminating NULL. */
	if (v->n + 2 > v->cap) {
		v->cap = v->cap ? 2 * v->cap : 8;
		if (v->cap < v->n + 2)
			v->cap = v->n + 2;
		v->v = xreallocarray(v->v, v->cap, sizeof(*v->v));
	}
	v->v[v->n++] = s;
	v->v[v->n] = NULL;
}

void strv_push(struct strv *v, const char *s)
{
	strv_push_take(v, xstrdup(s));
}

void strv_pushf(struct strv *v, const char *fmt, ...)
{
	struct buf b = BUF_INIT;
	va_list ap;

	va_start(ap, fmt);
	buf_vaddf(&b, fmt, ap);
	va_end(ap);
	strv_push_take(v, buf_detach(&b, NULL));
}

int strv_setenv(struct strv *v, const char *name, const char *value)
{
	size_t i, nlen = strlen(name);
	struct buf b = BUF_INIT;

	if (!nlen || strchr(name, '='))
		return -EINVAL;
	buf_addf(&b, "%s=%s", name, value);
	for (i = 0; i < v->n; i++) {
		if (!strncmp(v->v[i], name, nlen) && v->v[i][nlen] == '=') {
			free(v->v[i]);
			v->v[i] = buf_detach(&b, NULL);
			return 0;
		}
	}
	strv_push_take(v, buf_detach(&b, NULL));
	return 0;
}

ssize_t strv_find(const struct strv *v, const char *s)
{
	size_t i;

	for (i = 0; i < v->n; i++)
		if (!strcmp(v->v[i], s))
			return (ssize_t)i;
	return -1;
}

char **strv_detach(struct strv *v, size_t *n)
{
	char **arr;

	if (!v->v)
		arr = xcalloc(1, sizeof(*arr));
	else
		arr = v->v;
	if (n)
		*n = v->n;
	v->v = NULL;
	v->n = 0;
	v->cap = 0;
	return arr;
}
