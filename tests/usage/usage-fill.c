/* usage-fill: append ledger rows through usage.h, as a worker does, for the olp-keys CLI
 * test (tests/auth/olp-keys-test.sh). Not installed.
 * usage: usage-fill OLP_HOME KEY_ID PROVIDER|- STATUS PROMPT COMPLETION [TS_MS [ACCOUNT]]
 * "-" as the provider stores none (a request refused before any ran); no ACCOUNT: none. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "usage/usage.h"
#include "common/banned.h"

int main(int argc, char **argv)
{
	uint64_t status, p, c, ts = 0;
	struct usage_store *st;
	struct usage_record r;
	int ret;

	if (argc < 7 || argc > 9 || parse_u64(argv[4], &status) || parse_u64(argv[5], &p) ||
	    parse_u64(argv[6], &c) || (argc >= 8 && parse_u64(argv[7], &ts))) {
		(void)fputs("usage: usage-fill OLP_HOME KEY_ID PROVIDER|- STATUS PROMPT COMPLETION"
			    " [TS_MS [ACCOUNT]]\n",
			    stderr);
		return 2;
	}
	st = usage_store_open(argv[1], NULL);
	if (!st)
		return 1;
	r = (struct usage_record){
		.ts_ms = (int64_t)ts,
		.key_id = argv[2],
		.provider = strcmp(argv[3], "-") == 0 ? NULL : argv[3],
		.model = "m",
		.account = argc == 9 ? argv[8] : NULL,
		.status = (int)status,
		.prompt_tokens = (int64_t)p,
		.completion_tokens = (int64_t)c,
		.duration_ms = 50,
		.start = USAGE_START_COLD,
	};
	ret = usage_record_add(st, &r);
	usage_store_free(st);
	if (ret) {
		fprintf(stderr, "usage-fill: %s\n", strerror(-ret));
		return 1;
	}
	return 0;
}
