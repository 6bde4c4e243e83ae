/* CUnit suite for the accounts' limits and sticky choices shared through PostgreSQL
 * (providers/pg.c; ADR 0035 and 0037 amendments), against a real server: run under
 * tests/pg/with-pg.sh (OLP_TEST_PG_URL, OLP_TEST_PG_ADMIN_URL, PGPASSFILE,
 * OLP_TEST_PG_DIR); without it the suite skips (77).
 *
 * Two "hosts": two child processes, each with its own state dir (its own limits and
 * choice files, as two machines have) and its own store connection, LISTEN thread and
 * writer, sharing only the database. The parent drives them over pipes, one command line
 * and one answer line at a time; a command may carry a monotonic time to start at (the
 * clock is the machine's, shared by both), so that both hosts choose at the same moment.
 * Time bounds scale by OLP_TEST_TIME_FACTOR (1 to 10). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/cunit.h"
#include <jansson.h>

#include "common/common.h"
#include "providers/providers.h"
#include "store/store.h"
#include "common/banned.h"

#define PROVIDER "shared"

static const char *worker_url, *admin_url;

struct host {
	char name;
	pid_t pid;
	int to, from; /* command pipe, answer pipe */
	char dir[64];
};

static struct host hosts[2] = { { .name = 'a' }, { .name = 'b' } };

/* A bound of ms, times OLP_TEST_TIME_FACTOR (1 to 10; anything else is 1). */
static int64_t bound_ms(int64_t ms)
{
	const char *f = getenv("OLP_TEST_TIME_FACTOR");
	long k = f ? strtol(f, NULL, 10) : 1;

	return ms * (k >= 1 && k <= 10 ? k : 1);
}

static struct store_db *db_open(const char *url)
{
	struct store_options so = { .application_name = "test_shared_pg", .connect_timeout_s = 20 };
	struct buf err = BUF_INIT;
	struct store_db *db = store_open(url, &so, &err);

	if (!db)
		fprintf(stderr, "store_open: %s\n", err.data);
	CU_ASSERT_PTR_NOT_NULL_FATAL(db);
	buf_release(&err);
	return db;
}

/* One SQL statement as the admin (the first value, heap, or NULL). */
static char *admin_value(const char *sql, int n, const char *const *params)
{
	struct store_db *db = db_open(admin_url);
	PGconn *c = store_conn_get(db, 10000);
	char *v = NULL;
	PGresult *r;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	r = store_exec(db, c, sql, n, params, NULL, NULL);
	if (r && PQntuples(r) > 0)
		v = xstrdup(PQgetvalue(r, 0, 0));
	CU_ASSERT_PTR_NOT_NULL(r);
	PQclear(r);
	store_conn_put(db, c, false);
	store_free(db);
	return v;
}

static void pg_ctl(const char *what)
{
	char cmd[4096];

	snprintf(cmd, sizeof(cmd), "bash %s/tests/pg/pg-ctl.sh %s", OLP_SRC_DIR, what);
	CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
}

/* ---- a host (the child's side) ---------------------------------------------------------- */

static struct prov_provider *host_provider(void)
{
	json_t *entry = json_pack("{s:s, s:{s:{}, s:{}, s:{}}}", "type", "claude", "accounts", "a",
				  "b", "c");
	struct buf err = BUF_INIT;
	struct prov_provider *pv = prov_provider_from_json(PROVIDER, entry, &err);

	if (!pv)
		fprintf(stderr, "provider: %s\n", err.data);
	json_decref(entry);
	buf_release(&err);
	return pv;
}

static void host_put(const char *provider, const char *account, int status, int64_t reset,
		     char *out, size_t n)
{
	struct egr_ratelimit rl;
	uint64_t t0 = mono_ms();
	int ret;

	egr_rl_init(&rl, status == EGR_RL_REJECTED ? 429 : 200);
	rl.any = true;
	rl.status = (enum egr_rl_status)status;
	rl.reset_s = reset;
	rl.win[EGR_RL_5H].seen = true;
	rl.win[EGR_RL_5H].status = (enum egr_rl_status)status;
	rl.win[EGR_RL_5H].utilization = status == EGR_RL_REJECTED ? 1.0 : 0.5;
	rl.win[EGR_RL_5H].reset_s = reset;
	ret = prov_limits_put(provider, account, &rl);
	snprintf(out, n, "%d %llu", ret, (unsigned long long)(mono_ms() - t0));
}

/* Poll until provider's account is blocked (want 1) or not (want 0), at most limit ms:
 * the ms it took, or -1. */
static void host_wait_blocked(const struct prov_provider *pv, const char *account, int want,
			      long limit, char *out, size_t n)
{
	uint64_t t0 = mono_ms();
	int64_t r;

	for (;;) {
		uint64_t took = mono_ms() - t0;

		if ((int)prov_account_blocked(pv, account, wall_ms() / 1000, &r) == want) {
			snprintf(out, n, "%llu", (unsigned long long)took);
			return;
		}
		if (took > (uint64_t)limit) {
			snprintf(out, n, "-1");
			return;
		}
		usleep(5 * 1000);
	}
}

static void host_choose(const struct prov_provider *pv, const char *who, uint64_t at, char *out,
			size_t n)
{
	const char *account = NULL;
	int64_t r = 0;
	uint64_t t0;
	int ret;

	while (mono_ms() < at)
		usleep(200);
	t0 = mono_ms();
	ret = prov_account_choose(pv, who, wall_ms() / 1000, &account, &r);
	snprintf(out, n, "%d %s %llu", ret, ret ? "-" : account,
		 (unsigned long long)(mono_ms() - t0));
}

static void host_wait_fresh(struct store_db *db, long limit, char *out, size_t n)
{
	uint64_t t0 = mono_ms();

	while (mono_ms() - t0 < (uint64_t)limit &&
	       (store_listen_fresh_ms(db, NULL) <= 0 ||
		(int64_t)mono_ms() - store_listen_fresh_ms(db, NULL) > 1500))
		usleep(10 * 1000);
	snprintf(out, n, "%d", store_listen_fresh_ms(db, NULL) > 0);
}

/* One command line: "put PROVIDER ACCOUNT STATUS RESET", "blocked ACCOUNT WANT LIMIT_MS",
 * "choose WHO AT_MONO_MS" (WHO is hex: any bytes), "fresh LIMIT_MS". */
static void host_command(struct store_db *db, const struct prov_provider *pv, char *line, char *out,
			 size_t n)
{
	char a[256], b[256];
	long long x, y;

	if (sscanf(line, "put %255s %255s %lld %lld", a, b, &x, &y) == 4) {
		host_put(a, b, (int)x, y, out, n);
	} else if (sscanf(line, "blocked %255s %lld %lld", a, &x, &y) == 3) {
		host_wait_blocked(pv, a, (int)x, (long)y, out, n);
	} else if (sscanf(line, "choose %255s %lld", a, &x) == 2) {
		size_t len = strlen(a) / 2;

		for (size_t i = 0; i < len; i++) {
			unsigned v;

			if (sscanf(a + 2 * i, "%2x", &v) != 1)
				v = 0;
			b[i] = (char)v;
		}
		b[len] = '\0';
		host_choose(pv, b, (uint64_t)x, out, n);
	} else if (sscanf(line, "fresh %lld", &x) == 1) {
		host_wait_fresh(db, (long)x, out, n);
	} else {
		snprintf(out, n, "?");
	}
}

static void host_main(struct host *h, int in, int out_fd)
{
	struct store_options so = { .application_name = "test_shared_pg_host" };
	struct buf err = BUF_INIT;
	struct prov_provider *pv;
	struct store_db *db;
	char line[1024], out[256];
	FILE *f = fdopen(in, "r");

	if (!f || prov_set_state_dir(h->dir) || !(pv = host_provider()) ||
	    !(db = store_open(worker_url, &so, &err)) || prov_store_attach(db) ||
	    store_listen_start(db)) {
		fprintf(stderr, "host %c: setup failed: %s\n", h->name, err.data);
		_exit(1);
	}
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "quit", 4))
			break;
		host_command(db, pv, line, out, sizeof(out));
		dprintf(out_fd, "%s\n", out);
	}
	prov_store_detach();
	store_free(db);
	prov_provider_free(pv);
	_exit(0);
}

/* ---- the parent's side ------------------------------------------------------------------ */

static void hosts_start(void)
{
	for (int i = 0; i < 2; i++) {
		struct host *h = &hosts[i];
		int to[2], from[2];

		snprintf(h->dir, sizeof(h->dir), "/tmp/olp-shared-%c-XXXXXX", h->name);
		CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(h->dir));
		CU_ASSERT_EQUAL_FATAL(pipe2(to, O_CLOEXEC), 0);
		CU_ASSERT_EQUAL_FATAL(pipe2(from, O_CLOEXEC), 0);
		(void)fflush(NULL);
		h->pid = fork();
		CU_ASSERT_FATAL(h->pid >= 0);
		if (h->pid == 0) {
			close(to[1]);
			close(from[0]);
			if (i == 1) {
				close(hosts[0].to);
				close(hosts[0].from);
			}
			host_main(h, to[0], from[1]);
		}
		close(to[0]);
		close(from[1]);
		h->to = to[1];
		h->from = from[0];
	}
}

/* Send a command; with answer, wait for its line (at most limit ms). */
static void host_send(struct host *h, const char *cmd)
{
	CU_ASSERT_FATAL(dprintf(h->to, "%s\n", cmd) > 0);
}

static void host_answer(struct host *h, char *out, size_t n, int64_t limit)
{
	struct pollfd p = { .fd = h->from, .events = POLLIN };
	size_t len = 0;

	out[0] = '\0';
	while (len + 1 < n) {
		CU_ASSERT_FATAL(poll(&p, 1, (int)limit) == 1);
		CU_ASSERT_FATAL(read(h->from, out + len, 1) == 1);
		if (out[len] == '\n')
			break;
		len++;
	}
	out[len] = '\0';
}

static void host_ask(struct host *h, const char *cmd, char *out, size_t n)
{
	host_send(h, cmd);
	host_answer(h, out, n, bound_ms(30000));
}

static void hosts_stop(void)
{
	for (int i = 0; i < 2; i++) {
		struct host *h = &hosts[i];
		char cmd[128];
		int st = 0;

		if (h->pid <= 0)
			continue;
		(void)dprintf(h->to, "quit\n");
		close(h->to);
		close(h->from);
		for (int k = 0; k < 500 && waitpid(h->pid, &st, WNOHANG) == 0; k++)
			usleep(20 * 1000);
		if (waitpid(h->pid, &st, WNOHANG) == 0) {
			kill(h->pid, SIGKILL);
			waitpid(h->pid, &st, 0);
		}
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", h->dir);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", h->dir);
		h->pid = 0;
	}
}

static void both_fresh(void)
{
	char out[64];

	for (int i = 0; i < 2; i++) {
		host_ask(&hosts[i], "fresh 10000", out, sizeof(out));
		CU_ASSERT_STRING_EQUAL(out, "1");
	}
}

/* Both hosts choose for who at the same moment: their accounts into a and b. */
static void choose_both(const char *who, char *a, char *b)
{
	char cmd[512], hex[300], out[2][128], acc[2][64];
	int ret[2];
	size_t i;

	for (i = 0; who[i] && i < 140; i++)
		snprintf(hex + 2 * i, 3, "%02x", (unsigned char)who[i]);
	hex[2 * i] = '\0';
	snprintf(cmd, sizeof(cmd), "choose %s %llu", hex, (unsigned long long)(mono_ms() + 60));
	host_send(&hosts[0], cmd);
	host_send(&hosts[1], cmd);
	for (i = 0; i < 2; i++) {
		host_answer(&hosts[i], out[i], sizeof(out[i]), bound_ms(30000));
		CU_ASSERT_EQUAL(sscanf(out[i], "%d %63s", &ret[i], acc[i]), 2);
		CU_ASSERT_EQUAL(ret[i], 0);
	}
	snprintf(a, 64, "%s", acc[0]);
	snprintf(b, 64, "%s", acc[1]);
}

static void put(struct host *h, const char *account, int status, int64_t reset, int *ret,
		long *took)
{
	char cmd[256], out[64];

	snprintf(cmd, sizeof(cmd), "put %s %s %d %lld", PROVIDER, account, status,
		 (long long)reset);
	host_ask(h, cmd, out, sizeof(out));
	CU_ASSERT_EQUAL(sscanf(out, "%d %ld", ret, took), 2);
}

/* How long host h took to see account blocked (want 1) or not: ms, or -1 past limit. */
static long wait_blocked(struct host *h, const char *account, int want, int64_t limit)
{
	char cmd[256], out[64];

	snprintf(cmd, sizeof(cmd), "blocked %s %d %lld", account, want, (long long)limit);
	host_ask(h, cmd, out, sizeof(out));
	return strtol(out, NULL, 10);
}

/* ---- the tests ---------------------------------------------------------------------------- */

static void test_schema(void)
{
	const struct store_schema *s[] = { prov_pg_schema() };
	struct store_db *db = db_open(admin_url);
	struct buf msg = BUF_INIT;
	unsigned found = 0;

	CU_ASSERT_EQUAL(store_schema_apply(db, s, 1, "olp_worker", &msg), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg.data, "providers: version 0 -> 1"));
	buf_reset(&msg);
	CU_ASSERT_EQUAL(store_schema_apply(db, s, 1, "olp_worker", &msg), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg.data, "providers: version 1, current"));
	CU_ASSERT_EQUAL(store_schema_check(db, prov_pg_schema(), &found), 0);
	buf_release(&msg);
	store_free(db);
	hosts_start();
	both_fresh();
}

/* A puts `rejected`: B's check before a run says so within ADR 0034's 2 s (scaled), from
 * the store alone (B's own file never saw it). A's put is not held past PG_SYNC_MS. */
static void test_rejected_seen_by_other_host(void)
{
	int64_t now = wall_ms() / 1000;
	char path[128];
	long took, seen;
	int ret;

	put(&hosts[0], "a", EGR_RL_ALLOWED, now + 7200, &ret, &took);
	CU_ASSERT_EQUAL(ret, 0);
	CU_ASSERT_EQUAL(wait_blocked(&hosts[1], "a", 0, 100) >= 0, true);
	put(&hosts[0], "a", EGR_RL_REJECTED, now + 3600, &ret, &took);
	CU_ASSERT_EQUAL(ret, 0);
	CU_ASSERT_TRUE(took < bound_ms(1500));
	seen = wait_blocked(&hosts[1], "a", 1, bound_ms(2500));
	fprintf(stderr, "  put %ld ms; seen on the other host after %ld ms\n", took, seen);
	CU_ASSERT_TRUE(seen >= 0);
	/* B keeps a copy of what it saw, for the time the store is away. */
	snprintf(path, sizeof(path), "%s/limits/%s@a.v1", hosts[1].dir, PROVIDER);
	CU_ASSERT_EQUAL(access(path, F_OK), 0);
	/* And the reset passed (the upstream allows it again, on B): A sees it. */
	put(&hosts[1], "a", EGR_RL_ALLOWED, now + 7200, &ret, &took);
	CU_ASSERT_TRUE(wait_blocked(&hosts[0], "a", 0, bound_ms(2500)) >= 0);
}

/* Answers that say what the store holds already add no write (no round trip): 40 puts of
 * one unchanged state make one write, plus one per PG_REFRESH_MS (5 s) they took. */
static void test_unchanged_not_written(void)
{
	int64_t now = wall_ms() / 1000;
	uint64_t t0;
	long took, total = 0;
	char *n;
	int ret;

	CU_ASSERT_PTR_NULL(admin_value("CREATE TABLE IF NOT EXISTS t_writes (n int)", 0, NULL));
	CU_ASSERT_PTR_NULL(admin_value(
		"CREATE OR REPLACE FUNCTION t_count_write() RETURNS trigger LANGUAGE plpgsql AS $$"
		" BEGIN IF NEW.account = 'b' THEN INSERT INTO t_writes VALUES (1); END IF;"
		" RETURN NEW; END $$",
		0, NULL));
	CU_ASSERT_PTR_NULL(admin_value("CREATE TRIGGER t_count_write AFTER INSERT OR UPDATE ON"
				       " olp_account_limits FOR EACH ROW EXECUTE FUNCTION"
				       " t_count_write()",
				       0, NULL));
	t0 = mono_ms();
	for (int i = 0; i < 40; i++) {
		put(&hosts[0], "b", EGR_RL_ALLOWED, now + 7200, &ret, &took);
		CU_ASSERT_EQUAL(ret, 0);
		total += took;
	}
	took = (long)(mono_ms() - t0);
	/* The writer's last write, if any, lands before the count is read. */
	usleep(500 * 1000);
	n = admin_value("SELECT count(*) FROM t_writes", 0, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(n);
	fprintf(stderr, "  40 unchanged puts: %ld ms in all, %s store write(s)\n", total, n);
	CU_ASSERT_TRUE(atol(n) >= 1 && atol(n) <= 1 + took / 5000);
	free(n);
	/* Still there for the other host. */
	CU_ASSERT_TRUE(wait_blocked(&hosts[1], "b", 0, 100) >= 0);
}

/* Many keys' first requests on both hosts at the same moment: one account per key. */
static void test_sticky_agree(void)
{
	char a[64], b[64], who[32];
	int spread[3] = { 0 };

	for (int i = 0; i < 40; i++) {
		snprintf(who, sizeof(who), "key%d", i);
		choose_both(who, a, b);
		CU_ASSERT_STRING_EQUAL(a, b);
		if (strlen(a) == 1 && a[0] >= 'a' && a[0] <= 'c')
			spread[a[0] - 'a']++;
		/* And kept: ten more requests on either host, the same account. */
		if (i % 10 == 0) {
			for (int k = 0; k < 5; k++) {
				choose_both(who, b, b);
				CU_ASSERT_STRING_EQUAL(a, b);
			}
		}
	}
	/* The keys spread over the accounts (the first choice is a hash of the key id). */
	CU_ASSERT_TRUE(spread[0] > 0 && spread[1] > 0 && spread[2] > 0);
}

/* The kept account rejected, both hosts choose at the same moment: one move, one account. */
static void test_move_once(void)
{
	const char *params[] = { PROVIDER, "mover" };
	int64_t now = wall_ms() / 1000;
	char a[64], b[64], moved[64], *n;
	long took;
	int ret;

	/* A test's own counter of the row's updates: a move that compared nothing would
	 * update it once per host. */
	CU_ASSERT_PTR_NULL(admin_value("CREATE TABLE IF NOT EXISTS t_moves (n int)", 0, NULL));
	CU_ASSERT_PTR_NULL(admin_value(
		"CREATE OR REPLACE FUNCTION t_count_move() RETURNS trigger LANGUAGE plpgsql AS $$"
		" BEGIN INSERT INTO t_moves VALUES (1); RETURN NEW; END $$",
		0, NULL));
	CU_ASSERT_PTR_NULL(admin_value("CREATE TRIGGER t_count_move AFTER UPDATE ON"
				       " olp_account_choices FOR EACH ROW EXECUTE FUNCTION"
				       " t_count_move()",
				       0, NULL));
	choose_both("mover", a, b);
	CU_ASSERT_STRING_EQUAL_FATAL(a, b);
	put(&hosts[0], a, EGR_RL_REJECTED, now + 3600, &ret, &took);
	CU_ASSERT_EQUAL(ret, 0);
	CU_ASSERT_TRUE(wait_blocked(&hosts[1], a, 1, bound_ms(2500)) >= 0);
	choose_both("mover", moved, b);
	CU_ASSERT_STRING_EQUAL(moved, b);
	CU_ASSERT_STRING_NOT_EQUAL(moved, a);
	for (int k = 0; k < 5; k++) {
		choose_both("mover", b, b);
		CU_ASSERT_STRING_EQUAL(moved, b);
	}
	n = admin_value("SELECT count(*) FROM t_moves", 0, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(n);
	CU_ASSERT_STRING_EQUAL(n, "1");
	free(n);
	n = admin_value(
		"SELECT account FROM olp_account_choices WHERE provider = $1 AND key_id = $2", 2,
		params);
	CU_ASSERT_PTR_NOT_NULL_FATAL(n);
	CU_ASSERT_STRING_EQUAL(n, moved);
	free(n);
}

/* Key ids are stored verbatim, whatever they hold; provider and account names that are no
 * plain names never reach SQL. */
static void test_injection(void)
{
	static const char *const evil[] = {
		"x'); DROP TABLE olp_account_choices; --",
		"k\\'; DELETE FROM olp_account_limits; --",
		"\"$1\" || 'a' $$ ; SELECT pg_sleep(10)",
	};
	char a[64], b[64], *n;
	long took;
	int ret;

	for (size_t i = 0; i < ARRAY_SIZE(evil); i++) {
		const char *params[] = { PROVIDER, evil[i] };

		choose_both(evil[i], a, b);
		CU_ASSERT_STRING_EQUAL(a, b);
		n = admin_value("SELECT account FROM olp_account_choices"
				" WHERE provider = $1 AND key_id = $2",
				2, params);
		CU_ASSERT_PTR_NOT_NULL_FATAL(n);
		CU_ASSERT_STRING_EQUAL(n, a);
		free(n);
	}
	put(&hosts[0], "a';DROP/**/TABLE/**/olp_account_limits;--", EGR_RL_REJECTED, 0, &ret,
	    &took);
	CU_ASSERT_EQUAL(ret, -EINVAL);
	n = admin_value("SELECT count(*) > 0 FROM olp_account_limits", 0, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(n);
	CU_ASSERT_STRING_EQUAL(n, "t");
	free(n);
}

/* The database stopped: each host answers from its files, at once, without a crash;
 * started again: a state put while it was away reaches the other host through the store. */
static void test_database_away(void)
{
	int64_t now = wall_ms() / 1000;
	char a[64], b[64], kept[64];
	uint64_t t0;
	long took, seen;
	int ret;

	const char *other = NULL;

	choose_both("key1", kept, b);
	CU_ASSERT_STRING_EQUAL(kept, b);
	/* An account neither key1's nor rejected already (by test_move_once). */
	for (const char *x = "abc"; *x && !other; x++) {
		char acc[2] = { *x, '\0' };

		if (strcmp(acc, kept) && wait_blocked(&hosts[0], acc, 0, 0) >= 0)
			other = *x == 'a' ? "a" : *x == 'b' ? "b" : "c";
	}
	CU_ASSERT_PTR_NOT_NULL_FATAL(other);
	pg_ctl("stop");
	t0 = mono_ms();
	put(&hosts[0], other, EGR_RL_REJECTED, now + 3600, &ret, &took);
	CU_ASSERT_EQUAL(ret, 0);
	CU_ASSERT_TRUE(took < bound_ms(1500));
	/* A's own file says so; B cannot know yet. */
	CU_ASSERT_TRUE(wait_blocked(&hosts[0], other, 1, 100) >= 0);
	/* Choices from each host's file: the kept one, and a new key's, at once. */
	choose_both("key1", a, b);
	CU_ASSERT_STRING_EQUAL(a, kept);
	CU_ASSERT_STRING_EQUAL(b, kept);
	choose_both("newkey-away", a, b);
	CU_ASSERT_TRUE(mono_ms() - t0 < (uint64_t)bound_ms(8000));
	pg_ctl("start");
	/* Back: A's writer retries, B's listener reconnects and reloads. */
	seen = wait_blocked(&hosts[1], other, 1, bound_ms(15000));
	fprintf(stderr, "  after the restart, seen on the other host after %ld ms\n", seen);
	CU_ASSERT_TRUE(seen >= 0);
	both_fresh();
	choose_both("key1", a, b);
	CU_ASSERT_STRING_EQUAL(a, b);
	CU_ASSERT_STRING_EQUAL(a, kept);
	hosts_stop();
}

static const struct ts_test pg_tests[] = {
	{ "schema; two hosts started", test_schema },
	{ "rejected on one host, refused on the other", test_rejected_seen_by_other_host },
	{ "unchanged answers are not written", test_unchanged_not_written },
	{ "sticky choice agreed under concurrent first requests", test_sticky_agree },
	{ "a move when rejected happens once", test_move_once },
	{ "SQL injection through key ids and names", test_injection },
	{ "the database away and back", test_database_away },
	{ NULL, NULL },
};

int main(void)
{
	int failed;

	worker_url = getenv("OLP_TEST_PG_URL");
	admin_url = getenv("OLP_TEST_PG_ADMIN_URL");
	if (!worker_url || !admin_url || !getenv("OLP_TEST_PG_DIR")) {
		fprintf(stderr, "test_shared_pg: run under tests/pg/with-pg.sh (no PostgreSQL)\n");
		return 77;
	}
	log_set_program("test_shared_pg");
	log_set_level(LOG_LVL_ERROR);
	failed = ts_cunit_run("providers_shared_pg", pg_tests);
	hosts_stop();
	return ts_exit_status(failed);
}
