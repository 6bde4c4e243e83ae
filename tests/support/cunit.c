#include "tests/support/cunit.h"
#include "common/banned.h"

int ts_cunit_run_suites(const struct ts_suite suites[])
{
	int failures;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return -1;
	for (const struct ts_suite *su = suites; su->name; su++) {
		CU_pSuite s = CU_add_suite(su->name, NULL, NULL);

		if (!s) {
			CU_cleanup_registry();
			return -1;
		}
		for (const struct ts_test *t = su->tests; t->name; t++) {
			if (!CU_add_test(s, t->name, t->fn)) {
				CU_cleanup_registry();
				return -1;
			}
		}
	}
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	failures = (int)CU_get_number_of_failures();
	CU_cleanup_registry();
	return failures;
}

int ts_cunit_run(const char *suite, const struct ts_test tests[])
{
	const struct ts_suite suites[] = { { suite, tests }, { NULL, NULL } };

	return ts_cunit_run_suites(suites);
}
