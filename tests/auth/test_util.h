/* Helpers shared by the auth suites and the bench: temporary OLP homes and file reads. */
#ifndef OLP_TEST_AUTH_UTIL_H
#define OLP_TEST_AUTH_UTIL_H

#include <stdbool.h>

#include <jansson.h>

/* A fresh 0700 directory under $TMPDIR (or /tmp); returns a heap path. Aborts on failure. */
char *tu_mkhome(void);
/* rm -rf path, then free it. */
void tu_rmhome(char *path);
/* Copy the tree at src into dst (dirs 0700, files 0600). 0 or -errno. */
int tu_copy_tree(const char *src, const char *dst);
/* Parse home/keys/<id>/manifest.json (json_decref it), or NULL. */
json_t *tu_manifest(const char *home, const char *id);
/* Write text as home/keys/<id>/manifest.json (creating the dirs 0700, file 0600). */
void tu_write_manifest(const char *home, const char *id, const char *text);

/* Redirect stderr into a temporary file until tu_stderr_end(), which returns what was
 * written (free it). For counting warnings. */
void tu_stderr_begin(void);
char *tu_stderr_end(void);
/* Occurrences of needle in hay. */
int tu_count(const char *hay, const char *needle);

#endif
