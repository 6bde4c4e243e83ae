/* Not a test: makes the "usage" schema in a with-pg.sh cluster for the integration tests
 * (it_usage_pg), as olp-keys store init will: as the schema's owner
 * (OLP_TEST_PG_ADMIN_URL, PGPASSFILE), data rights granted to olp_worker.
 * usage: usage-pg-init; exit 0, or 1 with the reason on stderr. */
#include <stdio.h>
#include <stdlib.h>

#include "common/common.h"
#include "store/store.h"
#include "usage/usage.h"
#include "common/banned.h"

int main(void)
{
	const struct store_schema *v[1] = { usage_pg_schema() };
	const char *url = getenv("OLP_TEST_PG_ADMIN_URL");
	struct buf msg = BUF_INIT;
	struct store_db *db;
	int ret = 1;

	if (!url) {
		(void)fputs("usage-pg-init: OLP_TEST_PG_ADMIN_URL is not set\n", stderr);
		return 1;
	}
	db = store_open(url, NULL, &msg);
	if (db && !store_schema_apply(db, v, 1, "olp_worker", &msg))
		ret = 0;
	(void)fputs(msg.data, ret ? stderr : stdout);
	store_free(db);
	buf_release(&msg);
	return ret;
}
