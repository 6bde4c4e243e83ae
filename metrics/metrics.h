/* metrics: Prometheus counters, gauges and histograms shared by every worker process of a
 * host, so that one scrape of any worker shows the whole pool (ADR 0021).
 *
 * The values live in one file-backed MAP_SHARED mapping in the sandbox runtime dir
 * (<dir>/metrics.v1, mode 0600), a fixed table of series (a metric name and its label
 * set) updated with atomic operations. A series the table has no room for is counted in
 * olp_metrics_dropped_series_total and otherwise ignored: metrics never fail a request.
 *
 * One mapping per process (like the log): metrics_open once at start-up; every other
 * function is thread-safe, works in a child forked after it, and does nothing until
 * metrics_open succeeded. Labels are bounded sets only (provider, model, route, status,
 * start, limit, reason): never a key id, a token or a prompt. */
#ifndef OLP_METRICS_H
#define OLP_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/common.h"

/* The series table's capacity (the file's size is fixed by it). */
#define METRICS_MAX_SERIES 1024
/* The longest series key, `name{label="value",…}` with values escaped; a longer one is
 * dropped (counted). */
#define METRICS_MAX_KEY 232

/* Map <dir>/metrics.v1, creating it when missing. A file of another layout (magic,
 * version or size: an older OLP's) is replaced by a fresh one; a file that is not a
 * regular file of ours (another owner, group or other access, a symlink in its place)
 * is refused. 0, or -errno with err saying why (the path and what is wrong with it).
 * Calling it again replaces the process's mapping (tests). */
int metrics_open(const char *dir, struct buf *err);
/* Unmap; the process's updates are no-ops again. */
void metrics_close(void);
bool metrics_is_open(void);

/* ---- generic updates: name is one of the families of metrics.c, labels a
 * NULL-terminated list of name, value pairs (NULL or { NULL } for none; a NULL value
 * is ""). 0, or -EINVAL (unknown family, wrong type), -ENAMETOOLONG or -ENOSPC (the
 * series was dropped and counted), -ENODEV (not open). */
int metrics_counter_add(const char *name, const char *const labels[], uint64_t n);
/* Gauges are per process: each process adds to its own row, and a scrape sums the rows
 * of live processes, so a worker killed mid-run (SIGKILL) leaves nothing stuck. */
int metrics_gauge_add(const char *name, const char *const labels[], int64_t delta);
/* Set this process's row of a gauge (a state, not a count: olp_ledger_available). */
int metrics_gauge_set(const char *name, const char *const labels[], int64_t value);
/* Observe a duration (microseconds) in a histogram of buckets 5 ms … 120 s. */
int metrics_observe_us(const char *name, const char *const labels[], uint64_t us);

/* Append the whole pool's metrics to out in the Prometheus text format 0.0.4 (HELP and
 * TYPE lines, families together). 0, or -ENODEV when not open. */
int metrics_render(struct buf *out);

/* ---- OLP's events (the names and labels of docs/deploy.md "Metrics") ----------------- */
/* One answered request: route ("chat", "models", …), provider and model ("" or NULL off
 * the chat route), HTTP status, time to the end and (ttfb_us < 0: none) to the first
 * byte of the answer. */
void metrics_request(const char *route, const char *provider, const char *model, int status,
		     uint64_t dur_us, int64_t ttfb_us);
/* A provider this worker serves: its olp_runs_in_flight shows 0 before any run. */
void metrics_provider_add(const char *provider);
/* A provider run starts and ends (olp_runs_in_flight). */
void metrics_run_begin(const char *provider);
void metrics_run_end(const char *provider);
/* A provider run whose sandbox started (prov_outcome.ran); start is "cold", "warm" or
 * "prestart" (olp_runs_total). */
void metrics_run_started(const char *provider, const char *start);
/* A sandbox that could not start; reason is a bounded code ("sandbox", "spawn_failed"). */
void metrics_sandbox_failure(const char *provider, const char *reason);
/* A run of provider's account whose sandbox started (olp_account_requests_total). */
void metrics_account_run(const char *provider, const char *account);
/* A request refused for a quota: limit is "requests_per_minute", "requests_per_day",
 * "tokens_per_day" or "max_concurrent" (the key's runs at once). */
void metrics_quota_rejected(const char *limit);
/* n more audit records could not be written. */
void metrics_audit_failures(uint64_t n);
/* One usage ledger write failed. */
void metrics_ledger_failure(void);
/* Whether this process can write the usage ledger now (olp_ledger_available: the pool's
 * value is the lowest of the live workers'; a worker without a ledger never sets it). */
void metrics_ledger_available(bool ok);
/* Whether this process reaches the shared store now (olp_store_available, the lowest of
 * the live workers'; a worker of the embedded store never sets it). */
void metrics_store_available(bool ok);
/* n more ledger rows were dropped from the full queue of the shared store
 * (olp_ledger_dropped_total; n = 0 makes the series, shown at 0). */
void metrics_ledger_dropped(uint64_t n);
/* A request answered without a checked identity (401, or 404 on an unknown route…), by
 * status (olp_unauthenticated_requests_total). */
void metrics_unauthenticated(int status);
/* A pre-started provider process's event (sbx_prestart_event_name: "ready", "hit",
 * "miss", "expired", "died", "released") and how it moved the number waiting
 * (olp_prestart_events_total, olp_prestart_idle). */
void metrics_prestart_event(const char *event, int64_t idle_delta);

/* The pool's value of one counter or gauge series (a gauge summed over live processes),
 * for /health: 0 into *out when nothing was counted yet. 0, -EINVAL (unknown family, a
 * histogram), -ENAMETOOLONG, -ENODEV (not open). */
int metrics_value(const char *name, const char *const labels[], int64_t *out);
/* The pre-started processes' counts of the pool (olp_prestart_events_total by event,
 * olp_prestart_idle), as metrics_value gives each, for /health on every call: 0 or
 * -ENODEV (not open; all 0). */
struct metrics_prestart {
	int64_t hit, miss, expired, died, idle;
};
int metrics_prestart_counts(struct metrics_prestart *out);

#endif
