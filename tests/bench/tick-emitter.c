/* tick-emitter: the provider side of stream-bench.sh. Reads its stdin to the end (the
 * prompt), then writes N lines ("tick 1\n" …) one every INTERVAL_MS, each with its own
 * write(2), paced on absolute CLOCK_MONOTONIC deadlines so that the intervals do not
 * drift. No stdio buffering is involved.
 *
 *   tick-emitter [N=20] [INTERVAL_MS=50] */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

int main(int argc, char **argv)
{
	long n = argc > 1 ? strtol(argv[1], NULL, 10) : 20;
	long ms = argc > 2 ? strtol(argv[2], NULL, 10) : 50;
	char buf[4096];
	struct timespec next;
	ssize_t r;

	while ((r = read(0, buf, sizeof(buf))) > 0 || (r < 0 && errno == EINTR))
		;
	clock_gettime(CLOCK_MONOTONIC, &next);
	for (long i = 1; i <= n; i++) {
		int len = snprintf(buf, sizeof(buf), "tick %ld\n", i);

		if (write(1, buf, (size_t)len) != len)
			return 1;
		if (i == n)
			break;
		next.tv_nsec += ms * 1000000L;
		while (next.tv_nsec >= 1000000000L) {
			next.tv_nsec -= 1000000000L;
			next.tv_sec++;
		}
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR)
			;
	}
	return 0;
}
