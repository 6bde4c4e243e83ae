/* The benches' order statistics (stats.h). */
#include <stdio.h>
#include <stdlib.h>

#include "tests/bench/stats.h"
#include "common/banned.h"

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

double bench_quantile(uint64_t *v, size_t n, double q)
{
	size_t i;

	if (!n)
		return 0;
	qsort(v, n, sizeof(*v), cmp_u64);
	if (q <= 0)
		return (double)v[0];
	i = q >= 1 ? n - 1 : (size_t)((double)(n - 1) * q);
	return (double)v[i];
}

void bench_row(const char *what, int width, uint64_t *ns, size_t n)
{
	printf("  %-*s %7zu %10.2f %10.2f %10.2f %10.2f\n", width, what, n,
	       bench_quantile(ns, n, 0.5) / 1e3, bench_quantile(ns, n, 0.9) / 1e3,
	       bench_quantile(ns, n, 0.99) / 1e3, bench_quantile(ns, n, 1) / 1e3);
}
