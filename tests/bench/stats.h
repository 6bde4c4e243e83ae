/* The order statistics the benches report (tests/bench/stats.c): one home for sorting
 * samples and reading a quantile off them, so that every bench's "median" and "p99"
 * mean the same thing.
 *
 * Samples are uint64_t nanoseconds (mono_ns() differences). */
#ifndef OLP_BENCH_STATS_H
#define OLP_BENCH_STATS_H

#include <stddef.h>
#include <stdint.h>

/* The value at fraction q (0 = the least, 0.5 the median, 1 = the greatest) of the n
 * samples in v, by nearest rank below: v[floor((n - 1) * q)] once sorted. Sorts v in
 * place (already sorted: cheap). 0 for n = 0. */
double bench_quantile(uint64_t *v, size_t n, double q);

/* One table row: "  WHAT  N  median  p90  p99  max", the times in microseconds, WHAT
 * left-aligned in width columns. Sorts ns in place. */
void bench_row(const char *what, int width, uint64_t *ns, size_t n);

#endif
