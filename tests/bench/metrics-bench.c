/* metrics-bench: what a request's metrics hooks cost (fcgi/handler.c: run in flight up
 * and down, the run's start, the request's counter and two histograms), in one process
 * on a table already holding its series, and with 2 processes updating the same series.
 *
 * usage: metrics-bench [ITERATIONS]   (default 200000; a temp dir for the table) */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "metrics/metrics.h"
#include "common/banned.h"

/* One request's hooks, as a chat completion calls them. */
static void one_request(void)
{
	metrics_run_begin("echo");
	metrics_run_end("echo");
	metrics_run_started("echo", "cold");
	metrics_request("chat", "echo", "echo", 200, 43000, 34000);
}

static double per_request_ns(unsigned long n)
{
	uint64_t t0 = mono_ns();

	for (unsigned long i = 0; i < n; i++)
		one_request();
	return (double)(mono_ns() - t0) / (double)n;
}

int main(int argc, char **argv)
{
	unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 10) : 200000;
	char dir[] = "/tmp/olp-metrics-bench-XXXXXX", cmd[64];
	struct buf err = BUF_INIT, out = BUF_INIT;
	uint64_t t0;
	pid_t kid;

	if (!n || !mkdtemp(dir) || metrics_open(dir, &err)) {
		fprintf(stderr, "metrics-bench: %s\n", err.len ? err.data : "usage or mkdtemp");
		return 1;
	}
	one_request(); /* the series exist from here on */
	printf("hooks per request, 1 process:   %.0f ns\n", per_request_ns(n));
	kid = fork();
	if (kid == 0) {
		(void)per_request_ns(n);
		_exit(0);
	}
	printf("hooks per request, 2 processes: %.0f ns\n", per_request_ns(n));
	waitpid(kid, NULL, 0);
	t0 = mono_ns();
	metrics_render(&out);
	printf("one scrape: %.1f us, %zu bytes\n", (double)(mono_ns() - t0) / 1000, out.len);
	buf_release(&out);
	metrics_close();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : 1;
}
