/* egress-forward: one forwarder (egress/) from the command line, on 127.0.0.1, for trying
 * a provider CLI through it by hand or from a script. Not a test; not installed.
 *
 *   egress-forward [-p PORT] [-t SECONDS] [-c CA_FILE] [-s NAME:VALUE]...
 *                  [-a "METHOD /PATH"]... [-A] [-B] [-m MODEL]... UPSTREAM_URL
 *   egress-forward [-p PORT] [-t SECONDS] -C HOST:PORT [-C HOST:PORT]... [-L]
 *
 * Upstream mode with an URL, connect mode with -C (-L: let the names resolve to this
 * machine). Upstream mode allows the requests -a names, or with -A any (EGR_ANY_PATH);
 * -B checks request bodies (EGR_CHECK_BODY), against the -m models if any. Prints the port it listens on, then serves until stdin closes or SIGINT/
 * SIGTERM, or -t seconds (the deadline); the totals go to stderr at the end. */
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"
#include "egress/egress.h"
#include "common/banned.h"

#define MAX_ITEMS 32

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static int usage(void)
{
	fprintf(stderr, "usage: egress-forward [-p PORT] [-t SECONDS] [-c CA] [-s NAME:VALUE]... "
			"[-a \"METHOD /PATH\"]... [-A] [-B] [-m MODEL]... UPSTREAM_URL\n"
			"       egress-forward [-p PORT] [-t SECONDS] -C HOST:PORT... [-L]\n");
	return 2;
}

int main(int argc, char **argv)
{
	struct egr_header set[MAX_ITEMS];
	const char *allow[MAX_ITEMS + 1] = { 0 }, *hosts[MAX_ITEMS + 1] = { 0 },
				      *models[MAX_ITEMS + 1] = { 0 };
	struct egr_route r = { .request_id = "egress-forward" };
	struct egr_limits l = { 0 };
	struct sockaddr_in a = { .sin_family = AF_INET };
	struct sigaction sa = { .sa_handler = on_signal };
	socklen_t al = sizeof(a);
	size_t ns = 0, na = 0, nh = 0, nm = 0;
	struct egr_stats st;
	struct egr_forwarder *f;
	int opt, fd;

	while ((opt = getopt(argc, argv, "p:t:c:s:a:ABm:C:L")) != -1) {
		switch (opt) {
		case 'p': a.sin_port = htons((uint16_t)atoi(optarg)); break;
		case 't': l.deadline_ms = mono_ms() + (uint64_t)atoi(optarg) * 1000; break;
		case 'c': r.ca_file = optarg; break;
		case 's': {
			char *colon = strchr(optarg, ':');

			if (!colon || ns == MAX_ITEMS)
				return usage();
			*colon = '\0';
			set[ns++] = (struct egr_header){ .name = optarg, .value = colon + 1 };
			break;
		}
		case 'a':
			if (na == MAX_ITEMS)
				return usage();
			allow[na++] = optarg;
			break;
		case 'A': r.flags |= EGR_ANY_PATH; break;
		case 'B': r.flags |= EGR_CHECK_BODY; break;
		case 'm':
			if (nm == MAX_ITEMS)
				return usage();
			models[nm++] = optarg;
			break;
		case 'C':
			if (nh == MAX_ITEMS)
				return usage();
			hosts[nh++] = optarg;
			break;
		case 'L': r.flags |= EGR_ALLOW_LOCAL_TARGETS; break;
		default: return usage();
		}
	}
	if (nh) {
		r.mode = EGR_MODE_CONNECT;
		r.allow_hosts = hosts;
	} else {
		if (optind != argc - 1)
			return usage();
		r.mode = EGR_MODE_UPSTREAM;
		r.upstream = argv[optind];
		r.set_headers = set;
		r.n_set_headers = ns;
		r.allow_paths = allow;
		r.models = nm ? models : NULL;
	}
	(void)signal(SIGPIPE, SIG_IGN);
	(void)sigaction(SIGINT, &sa, NULL);
	(void)sigaction(SIGTERM, &sa, NULL);
	log_set_program("egress-forward");
	log_set_level(LOG_LVL_DEBUG);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 128) ||
	    getsockname(fd, (struct sockaddr *)&a, &al)) {
		perror("egress-forward: listen");
		return 1;
	}
	f = egr_start(fd, &r, &l);
	if (!f) {
		const char *why = "";

		(void)egr_route_check(&r, &why);
		fprintf(stderr, "egress-forward: cannot start: %s\n", why);
		return 1;
	}
	printf("%u\n", ntohs(a.sin_port));
	(void)fflush(stdout);
	while (!stop && (!l.deadline_ms || mono_ms() < l.deadline_ms)) {
		struct pollfd p = { .fd = 0, .events = POLLIN };
		char c;

		if (poll(&p, 1, 200) == 1 && read(0, &c, 1) <= 0)
			break;
	}
	egr_stop(f, &st);
	fprintf(stderr,
		"egress-forward: %llu connections, %llu requests, %llu refused, %llu upstream "
		"errors, %llu bytes up, %llu down; usage: %llu answers, %lld input tokens, %lld "
		"output tokens\n",
		(unsigned long long)st.conns, (unsigned long long)st.requests,
		(unsigned long long)st.refused, (unsigned long long)st.upstream_errors,
		(unsigned long long)st.bytes_up, (unsigned long long)st.bytes_down,
		(unsigned long long)st.usage.answers, (long long)st.usage.input_tokens,
		(long long)st.usage.output_tokens);
	return 0;
}
