#include "tests/support/cunit.h"
#include "common/banned.h"

int ts_cunit_run(const char *suite, const struct ts_test tests[])
{
	CU_pSuite s;
	int failures;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return -1;
	s = CU_add_suite(suite, NULL, NULL);
	if (!s) {
		CU_cleanup_registry();
		return -1;
	}
	for (const struct ts_test *t = tests; t->name; t++) {
		if (!CU_add_test(s, t->name, t->fn)) {
			CU_cleanup_registry();
			return -1;
		}
	}
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	failures = (int)CU_get_number_of_failures();
	CU_cleanup_registry();
	return failures;
}
