/* The escape checks of olp-probe (escape.c). */
#ifndef OLP_TESTS_ESCAPE_H
#define OLP_TESTS_ESCAPE_H

#include <stdbool.h>

struct escape_args {
	const char *keyfile, *keydir, *runtime, *unix_path, *tcp_host, *secret, *extra_env;
	int tcp_port, hostpid, shmid;
	long worker_uid; /* the uid olp-sandbox (the worker) runs as, or -1 */
	bool network;
};

int escape_main(const struct escape_args *a);

#endif
