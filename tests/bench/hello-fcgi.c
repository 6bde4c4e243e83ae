/* The baseline for the HTTP benchmark: the smallest threaded libfcgi responder that
 * answers every request with the same JSON as GET /health. Behind the same lighttpd as
 * olp-fcgi, the ratio of the two shows what our worker costs per request. */
#include <fcgiapp.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>

static pthread_mutex_t accept_lock = PTHREAD_MUTEX_INITIALIZER;

static void *serve(void *arg)
{
	FCGX_Request req;

	(void)arg;
	FCGX_InitRequest(&req, 0, 0);
	for (;;) {
		int rc;

		pthread_mutex_lock(&accept_lock);
		rc = FCGX_Accept_r(&req);
		pthread_mutex_unlock(&accept_lock);
		if (rc < 0)
			break;
		FCGX_PutS("Status: 200 OK\r\nContent-Type: application/json\r\n\r\n"
			  "{\"ok\":true,\"version\":\"hello\"}",
			  req.out);
		FCGX_Finish_r(&req);
	}
	return NULL;
}

int main(void)
{
	const char *n = getenv("OLP_THREADS");
	int threads = n ? atoi(n) : 16, i;
	pthread_t t[256];

	if (threads < 1 || threads > 256)
		threads = 16;
	FCGX_Init();
	/* As olp-fcgi does (fcgi/main.c): libfcgi catches SIGTERM and reads the flag only
	 * between requests, so a responder blocked in accept() outlived the server that
	 * stopped it (http-bench.sh left two running). Let SIGTERM end it, and the
	 * server's end too. */
	(void)signal(SIGTERM, SIG_DFL);
	(void)prctl(PR_SET_PDEATHSIG, SIGTERM);
	for (i = 0; i < threads; i++)
		pthread_create(&t[i], NULL, serve, NULL);
	for (i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	return 0;
}
