/* Helpers shared by the auth suites and the bench. */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "tests/auth/test_util.h"
#include "common/banned.h"

char *tu_mkhome(void)
{
	const char *tmp = getenv("TMPDIR");
	struct buf b = BUF_INIT;

	buf_addf(&b, "%s/olp-auth-test-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(b.data))
		abort();
	chmod(b.data, 0700);
	return buf_detach(&b, NULL);
}

static int rm_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
	(void)sb;
	(void)ftw;
	if (type == FTW_DP)
		rmdir(path);
	else
		unlink(path);
	return 0;
}

void tu_rmhome(char *path)
{
	if (!path)
		return;
	nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	free(path);
}

int tu_copy_tree(const char *src, const char *dst)
{
	struct dirent *de;
	DIR *d;
	int ret = 0;

	if (mkdir(dst, 0700) < 0 && errno != EEXIST)
		return -errno;
	chmod(dst, 0700);
	d = opendir(src);
	if (!d)
		return -errno;
	while (!ret && (de = readdir(d))) {
		struct buf s = BUF_INIT, t = BUF_INIT, data = BUF_INIT;
		struct stat sb;
		int fd;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		buf_addf(&s, "%s/%s", src, de->d_name);
		buf_addf(&t, "%s/%s", dst, de->d_name);
		if (stat(s.data, &sb) < 0) {
			ret = -errno;
		} else if (S_ISDIR(sb.st_mode)) {
			ret = tu_copy_tree(s.data, t.data);
		} else if ((ret = buf_read_file(&data, s.data, 1 << 20)) == 0) {
			fd = open(t.data, O_WRONLY | O_CREAT | O_TRUNC, 0600);
			if (fd < 0)
				ret = -errno;
			else {
				ret = write_all(fd, data.data, data.len);
				close(fd);
			}
		}
		buf_release(&s);
		buf_release(&t);
		buf_release(&data);
	}
	closedir(d);
	return ret;
}

json_t *tu_manifest(const char *home, const char *id)
{
	struct buf p = BUF_INIT;
	json_t *j;

	buf_addf(&p, "%s/keys/%s/manifest.json", home, id);
	j = json_load_file(p.data, 0, NULL);
	buf_release(&p);
	return j;
}

void tu_write_manifest(const char *home, const char *id, const char *text)
{
	struct buf p = BUF_INIT;
	int fd;

	buf_addf(&p, "%s/keys", home);
	mkdir(p.data, 0700);
	buf_addf(&p, "/%s", id);
	mkdir(p.data, 0700);
	buf_adds(&p, "/manifest.json");
	fd = open(p.data, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || write_all(fd, text, strlen(text)))
		abort();
	close(fd);
	buf_release(&p);
}

static int saved_stderr = -1;
static FILE *capture;

void tu_stderr_begin(void)
{
	capture = tmpfile();
	if (!capture)
		abort();
	(void)fflush(stderr);
	saved_stderr = dup(STDERR_FILENO);
	dup2(fileno(capture), STDERR_FILENO);
}

char *tu_stderr_end(void)
{
	struct buf b = BUF_INIT;
	int fd = fileno(capture);

	(void)fflush(stderr);
	dup2(saved_stderr, STDERR_FILENO);
	close(saved_stderr);
	lseek(fd, 0, SEEK_SET);
	while (buf_read_once(&b, fd, 4096) > 0)
		;
	(void)fclose(capture);
	capture = NULL;
	return buf_detach(&b, NULL);
}

int tu_count(const char *hay, const char *needle)
{
	int n = 0;
	size_t len = strlen(needle);

	while ((hay = strstr(hay, needle))) {
		n++;
		hay += len;
	}
	return n;
}
