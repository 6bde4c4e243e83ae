/* olp-sandbox-exec: the payload of a warm sandbox (spawn.c keeps a few started ahead of
 * time so that a request does not wait for bwrap to build namespaces and mounts).
 *
 * It runs inside the finished sandbox, with only fds 0-2, and waits on stdin for the
 * command of the request it will become:
 *     "OLPX" u32 argc, then argc × (u32 length, bytes)      (lengths little-endian)
 * It reads exactly that much — the rest of stdin (the prompt) is the command's — and
 * execs argv[0] in place: same pid, same sandbox, same environment. On failure it says so
 * on stderr ("olp-sandbox-exec: execvp …") and exits 127. Nothing here allocates more
 * than the message needs; nothing is logged. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_ARGS 4096
#define MAX_BYTES (8u << 20)

static int read_exact(void *dst, size_t n)
{
	char *p = dst;

	while (n) {
		ssize_t r = read(STDIN_FILENO, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

static int read_u32(uint32_t *v)
{
	unsigned char b[4];

	if (read_exact(b, 4))
		return -1;
	*v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
	return 0;
}

int main(void)
{
	extern char **environ;
	char magic[4], **argv;
	uint32_t argc, i, len, total = 0;

	if (read_exact(magic, 4) || memcmp(magic, "OLPX", 4) || read_u32(&argc) || !argc ||
	    argc > MAX_ARGS)
		return 126; /* not launched (the worker went away): nothing to do */
	argv = calloc(argc + 1, sizeof(*argv));
	if (!argv)
		return 126;
	for (i = 0; i < argc; i++) {
		if (read_u32(&len) || len > MAX_BYTES - total)
			return 126;
		total += len;
		argv[i] = malloc(len + 1);
		if (!argv[i] || read_exact(argv[i], len))
			return 126;
		argv[i][len] = '\0';
	}
	execve(argv[0], argv, environ);
	fprintf(stderr, "olp-sandbox-exec: execvp %s: %s\n", argv[0], strerror(errno));
	return 127;
}
