/* CUnit suite for the accounts' subscription limits kept for the host (providers/
 * limits.c, ADR 0035), through providers.h: the state per (provider, account), the merge
 * of one answer's words into it, the check before a run, file names and modes, and
 * readers that never see half a state while writers replace it. */
#include "tests/support/cunit.h"
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"
#include "providers/providers.h"
#include "common/banned.h"

static char dir[] = "/tmp/olp-limits-test-XXXXXX";

static void anthropic(struct egr_ratelimit *rl, enum egr_rl_status st, double u5, int64_t reset)
{
	egr_rl_init(rl, st == EGR_RL_REJECTED ? 429 : 200);
	rl->any = true;
	rl->status = st;
	rl->reset_s = reset;
	snprintf(rl->claim, sizeof(rl->claim), "five_hour");
	rl->win[EGR_RL_5H] = (struct egr_rl_win){
		.seen = true, .status = st, .utilization = u5, .reset_s = reset, .minutes = 300
	};
}

static void test_put_get(void)
{
	struct egr_ratelimit rl;
	struct prov_limits st;
	int64_t now = wall_ms() / 1000, retry = 0;
	char path[512];
	struct stat sb;

	CU_ASSERT_EQUAL(prov_limits_get("claude", PROV_ACCOUNT_DEFAULT, &st), -ENOENT);
	anthropic(&rl, EGR_RL_ALLOWED, 0.42, now + 3600);
	rl.win[EGR_RL_7D] =
		(struct egr_rl_win){ .seen = true, .utilization = 0.25, .reset_s = now + 86400 };
	CU_ASSERT_EQUAL(prov_limits_put("claude", PROV_ACCOUNT_DEFAULT, &rl), 0);
	CU_ASSERT_EQUAL_FATAL(prov_limits_get("claude", PROV_ACCOUNT_DEFAULT, &st), 0);
	CU_ASSERT_EQUAL(st.rl.status, EGR_RL_ALLOWED);
	CU_ASSERT_DOUBLE_EQUAL(st.rl.win[EGR_RL_5H].utilization, 0.42, 1e-9);
	CU_ASSERT_DOUBLE_EQUAL(st.rl.win[EGR_RL_7D].utilization, 0.25, 1e-9);
	CU_ASSERT_STRING_EQUAL(st.rl.claim, "five_hour");
	CU_ASSERT(st.seen_ms > 0 && st.win_seen_ms[EGR_RL_7D] == st.seen_ms);
	CU_ASSERT_EQUAL(st.win_seen_ms[EGR_RL_PRIMARY], 0);
	CU_ASSERT(!prov_limits_blocked(&st, now, &retry));
	/* Another provider's account is another state. */
	CU_ASSERT_EQUAL(prov_limits_get("codex", PROV_ACCOUNT_DEFAULT, &st), -ENOENT);
	CU_ASSERT_EQUAL(prov_limits_get("claude", "other", &st), -ENOENT);

	/* A 429 that names only the 5h window: the 7d window keeps what was said of it. */
	anthropic(&rl, EGR_RL_REJECTED, 1.0, now + 600);
	CU_ASSERT_EQUAL(prov_limits_put("claude", PROV_ACCOUNT_DEFAULT, &rl), 0);
	CU_ASSERT_EQUAL_FATAL(prov_limits_get("claude", PROV_ACCOUNT_DEFAULT, &st), 0);
	CU_ASSERT_EQUAL(st.rl.status, EGR_RL_REJECTED);
	CU_ASSERT_DOUBLE_EQUAL(st.rl.win[EGR_RL_5H].utilization, 1.0, 1e-9);
	CU_ASSERT_DOUBLE_EQUAL(st.rl.win[EGR_RL_7D].utilization, 0.25, 1e-9);
	CU_ASSERT(prov_limits_blocked(&st, now, &retry));
	CU_ASSERT_EQUAL(retry, 600);
	/* Once the reset has passed, nothing is blocked. */
	CU_ASSERT(!prov_limits_blocked(&st, now + 600, &retry));
	/* Rejected without a reset: no time to give, nothing blocked. */
	anthropic(&rl, EGR_RL_REJECTED, 1.0, 0);
	CU_ASSERT_EQUAL(prov_limits_put("claude", PROV_ACCOUNT_DEFAULT, &rl), 0);
	CU_ASSERT_EQUAL(prov_limits_get("claude", PROV_ACCOUNT_DEFAULT, &st), 0);
	CU_ASSERT(!prov_limits_blocked(&st, now, &retry));

	snprintf(path, sizeof(path), "%s/limits/claude@default.v1", dir);
	CU_ASSERT_EQUAL_FATAL(stat(path, &sb), 0);
	CU_ASSERT_EQUAL(sb.st_mode & 07777, 0600);
	snprintf(path, sizeof(path), "%s/limits", dir);
	CU_ASSERT_EQUAL_FATAL(stat(path, &sb), 0);
	CU_ASSERT_EQUAL(sb.st_mode & 07777, 0700);
}

static void test_names(void)
{
	static const char *const bad[] = {
		"",	   "..",
		".hidden", "a/b",
		"a b",	   "a@b",
		"é",	   "x\ny",
		"a\\b",	   "0123456789012345678901234567890123456789012345678901234567890123456789"
	};
	struct egr_ratelimit rl;
	struct prov_limits st;

	anthropic(&rl, EGR_RL_ALLOWED, 0.1, 0);
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		CU_ASSERT_EQUAL(prov_limits_put(bad[i], PROV_ACCOUNT_DEFAULT, &rl), -EINVAL);
		CU_ASSERT_EQUAL(prov_limits_put("claude", bad[i], &rl), -EINVAL);
		CU_ASSERT_EQUAL(prov_limits_get(bad[i], PROV_ACCOUNT_DEFAULT, &st), -EINVAL);
	}
	CU_ASSERT_EQUAL(prov_limits_put("my-claude_2.x", "default", &rl), 0);
}

/* A file of another layout (an older OLP's, or garbage) reads as nothing seen. */
static void test_bad_file(void)
{
	struct prov_limits st;
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/limits/vibe@default.v1", dir);
	f = fopen(path, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	(void)fputs("not a state", f);
	(void)fclose(f);
	CU_ASSERT_EQUAL(prov_limits_get("vibe", PROV_ACCOUNT_DEFAULT, &st), -ENOENT);
	CU_ASSERT_EQUAL(st.rl.status, EGR_RL_UNKNOWN);
}

struct writer {
	int id;
	int failures;
	atomic_bool *done;
};

/* Each writer says its own id everywhere: a reader that sees two ids in one state saw a
 * torn write. */
static void *write_many(void *arg)
{
	struct writer *w = arg;
	struct egr_ratelimit rl;

	for (int i = 0; i < 300; i++) {
		anthropic(&rl, EGR_RL_ALLOWED, w->id / 10.0, 1800000000 + w->id);
		rl.win[EGR_RL_7D] = rl.win[EGR_RL_5H];
		if (prov_limits_put("codex", PROV_ACCOUNT_DEFAULT, &rl))
			w->failures++;
	}
	atomic_store(w->done, true);
	return NULL;
}

static void test_concurrent(void)
{
	atomic_bool done[4] = { false, false, false, false };
	struct writer w[4] = { { .id = 1, .done = &done[0] },
			       { .id = 2, .done = &done[1] },
			       { .id = 3, .done = &done[2] },
			       { .id = 4, .done = &done[3] } };
	struct egr_ratelimit rl0;
	pthread_t t[4];
	int torn = 0, reads = 0, tmp_left = 0;
	struct dirent *de;
	DIR *d;
	char path[512];

	/* A whole state first (id 0): a reader always finds one, however late the writers
	 * start on a loaded machine. */
	anthropic(&rl0, EGR_RL_ALLOWED, 0.0, 1800000000);
	rl0.win[EGR_RL_7D] = rl0.win[EGR_RL_5H];
	CU_ASSERT_EQUAL_FATAL(prov_limits_put("codex", PROV_ACCOUNT_DEFAULT, &rl0), 0);
	for (int i = 0; i < 4; i++)
		CU_ASSERT_EQUAL_FATAL(pthread_create(&t[i], NULL, write_many, &w[i]), 0);
	/* Read while any writer still writes, and at least 2000 times. */
	for (int i = 0; i < 2000 || !(atomic_load(&done[0]) && atomic_load(&done[1]) &&
				      atomic_load(&done[2]) && atomic_load(&done[3]));
	     i++) {
		struct prov_limits st;

		if (prov_limits_get("codex", PROV_ACCOUNT_DEFAULT, &st))
			continue;
		reads++;
		if (st.rl.reset_s - 1800000000 !=
			    (int64_t)(st.rl.win[EGR_RL_5H].utilization * 10 + 0.5) ||
		    st.rl.win[EGR_RL_7D].reset_s != st.rl.reset_s)
			torn++;
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		CU_ASSERT_EQUAL(w[i].failures, 0);
	}
	CU_ASSERT(reads > 0);
	CU_ASSERT_EQUAL(torn, 0);
	snprintf(path, sizeof(path), "%s/limits", dir);
	d = opendir(path);
	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	while ((de = readdir(d)))
		tmp_left += strstr(de->d_name, ".tmp") != NULL;
	closedir(d);
	CU_ASSERT_EQUAL(tmp_left, 0);
}

int main(void)
{
	static const struct ts_test tests[] = {
		{ "one state per provider and account", test_put_get },
		{ "names are plain file name parts", test_names },
		{ "a file of another layout", test_bad_file },
		{ "readers never see half a state", test_concurrent },
		{ NULL, NULL },
	};
	struct buf cmd = BUF_INIT;
	int fails;

	log_set_program("test_limits");
	log_set_level(LOG_LVL_ERROR);
	if (!mkdtemp(dir) || prov_set_state_dir(dir))
		return 1;
	fails = ts_cunit_run("providers_limits", tests);
	buf_addf(&cmd, "rm -rf '%s'", dir);
	(void)!system(cmd.data);
	buf_release(&cmd);
	return ts_exit_status(fails);
}
