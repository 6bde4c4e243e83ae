/* CUnit for the suites: include this instead of <CUnit/Basic.h>.
 * A failed _FATAL assertion longjmps out of the test, which the static analyzer
 * (clang-tidy's clang-analyzer-*) cannot see: it follows the path on past the failed
 * assertion and reports a NULL dereference the test has just ruled out. For the
 * analyzer alone, the _FATAL forms the suites use end that path with abort(). */
#ifndef OLP_TESTS_CUNIT_H
#define OLP_TESTS_CUNIT_H

#include <CUnit/Basic.h>

#ifdef __clang_analyzer__
#include <stdlib.h>

#undef CU_ASSERT_FATAL
#undef CU_ASSERT_EQUAL_FATAL
#undef CU_ASSERT_PTR_NOT_NULL_FATAL
#define CU_ASSERT_FATAL(value)   \
	do {                     \
		if (!(value))    \
			abort(); \
	} while (0)
#define CU_ASSERT_EQUAL_FATAL(actual, expected) CU_ASSERT_FATAL((actual) == (expected))
#define CU_ASSERT_PTR_NOT_NULL_FATAL(value) CU_ASSERT_FATAL(NULL != (const void *)(value))
#endif

/* ---- one suite's main() -------------------------------------------------------------
 * A suite lists its tests in a table ending with { NULL, NULL }, does its own set-up and
 * clean-up around ts_cunit_run, and exits with ts_exit_status. */
struct ts_test {
	const char *name;
	void (*fn)(void);
};

/* Register tests as one CUnit suite named suite, run it with verbose output, and clean
 * CUnit up. Returns the number of failed assertions (0: all passed), or -1 when CUnit
 * could not be set up. */
int ts_cunit_run(const char *suite, const struct ts_test tests[]);

/* Several suites in one program: a table ending with { NULL, NULL }, run in order. */
struct ts_suite {
	const char *name;
	const struct ts_test *tests;
};
int ts_cunit_run_suites(const struct ts_suite suites[]);
/* The exit status for main(): 0 only when every test passed. */
static inline int ts_exit_status(int failures)
{
	return failures ? 1 : 0;
}

#endif
