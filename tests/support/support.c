#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "tests/support/support.h"
#include "common/banned.h"

bool ts_valid_utf8(const unsigned char *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		unsigned char c = s[i];
		size_t len, k;
		uint32_t cp;

		if (c < 0x80) {
			i++;
			continue;
		} else if (c >= 0xc2 && c <= 0xdf) {
			len = 2;
			cp = c & 0x1f;
		} else if (c >= 0xe0 && c <= 0xef) {
			len = 3;
			cp = c & 0x0f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			len = 4;
			cp = c & 0x07;
		} else {
			return false;
		}
		if (i + len > n)
			return false;
		for (k = 1; k < len; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (s[i + k] & 0x3f);
		}
		if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += len;
	}
	return true;
}

int ts_capture_stderr(const char *path, void (*fn)(void *), void *arg)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600), saved, ret = 0;

	if (fd < 0)
		return -errno;
	(void)fflush(stderr);
	saved = dup(STDERR_FILENO);
	if (saved < 0 || dup2(fd, STDERR_FILENO) != STDERR_FILENO) {
		ret = -errno;
		if (saved >= 0)
			close(saved);
		close(fd);
		return ret;
	}
	fn(arg);
	(void)fflush(stderr);
	if (dup2(saved, STDERR_FILENO) != STDERR_FILENO)
		ret = -errno;
	close(saved);
	close(fd);
	return ret;
}

int ts_count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1; /* the DIR's own */
}
