/* olp-probe: runs INSIDE the sandbox and reports what it can see, as one JSON line per
 * check on stdout. Built without sanitizers: it must run in the bare sandbox. The sandbox
 * suite (and, later, the escape tests) assert on its output.
 *
 *   olp-probe fds        the descriptors it holds, and whether fd 0 is a socket
 *   olp-probe env        the names of its environment variables
 *   olp-probe read PATH  whether PATH can be opened for reading (errno name when not)
 *   olp-probe write PATH whether PATH can be created/written
 *   olp-probe spin       ignore SIGTERM, fork a grandchild, sleep forever */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern char **environ;

static int cmd_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	struct stat st;
	int first = 1, self;

	if (!d) {
		printf("{\"error\":\"opendir: %s\"}\n", strerror(errno));
		return 1;
	}
	self = dirfd(d);
	printf("{\"fds\":[");
	while ((de = readdir(d))) {
		int fd;

		if (de->d_name[0] == '.')
			continue;
		fd = atoi(de->d_name);
		if (fd == self)
			continue;
		printf("%s%d", first ? "" : ",", fd);
		first = 0;
	}
	closedir(d);
	printf("],\"fd0_socket\":%s}\n", fstat(0, &st) == 0 && S_ISSOCK(st.st_mode) ? "true" : "false");
	return 0;
}

static int cmd_env(void)
{
	char **e;
	int first = 1;

	printf("{\"env\":[");
	for (e = environ; *e; e++) {
		printf("%s\"%.*s\"", first ? "" : ",", (int)strcspn(*e, "="), *e);
		first = 0;
	}
	printf("]}\n");
	return 0;
}

static int cmd_read(const char *path)
{
	int fd = open(path, O_RDONLY);

	if (fd < 0) {
		printf("{\"path\":\"%s\",\"ok\":false,\"errno\":%d}\n", path, errno);
		return 0;
	}
	printf("{\"path\":\"%s\",\"ok\":true}\n", path);
	close(fd);
	return 0;
}

static int cmd_write(const char *path)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	if (fd < 0 || write(fd, "x", 1) != 1) {
		printf("{\"path\":\"%s\",\"ok\":false,\"errno\":%d}\n", path, errno);
		return 0;
	}
	printf("{\"path\":\"%s\",\"ok\":true}\n", path);
	close(fd);
	return 0;
}

static int __attribute__((noreturn)) cmd_spin(void)
{
	signal(SIGTERM, SIG_IGN);
	if (fork() == 0) {
		setsid(); /* try to escape the process group */
		for (;;)
			pause();
	}
	printf("{\"spinning\":true}\n");
	fflush(stdout);
	for (;;)
		pause();
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 2 && !strcmp(argv[1], "fds"))
		return cmd_fds();
	if (argc >= 2 && !strcmp(argv[1], "env"))
		return cmd_env();
	if (argc >= 3 && !strcmp(argv[1], "read"))
		return cmd_read(argv[2]);
	if (argc >= 3 && !strcmp(argv[1], "write"))
		return cmd_write(argv[2]);
	if (argc >= 2 && !strcmp(argv[1], "spin"))
		return cmd_spin();
	fprintf(stderr, "usage: olp-probe fds|env|read PATH|write PATH|spin\n");
	return 2;
}
