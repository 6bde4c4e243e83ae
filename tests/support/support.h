/* Helpers shared by the CUnit suites: written independently of the code under test, so a
 * bug there cannot hide itself. Not part of any module. */
#ifndef OLP_TESTS_SUPPORT_H
#define OLP_TESTS_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>

/* Strict UTF-8: shortest forms only, no surrogates, nothing above U+10FFFF. */
bool ts_valid_utf8(const unsigned char *s, size_t n);
/* Run fn(arg) with stderr going to the file path (created or truncated), then put stderr
 * back: the caller reads what fn logged from path. 0 or -errno (stderr is as it was). */
int ts_capture_stderr(const char *path, void (*fn)(void *), void *arg);
/* How many descriptors this process has open (from /proc/self/fd, not counting the one
 * used to read it), or -1. For checking that a call leaves none behind. */
int ts_count_fds(void);

#endif
