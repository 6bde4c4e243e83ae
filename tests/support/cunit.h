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

#endif
