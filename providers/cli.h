/* Private to providers/: what the three CLI providers (claude, codex, vibe) share when
 * they build a plan. Everything here runs in the worker, before any fork: the program is
 * looked up on the worker's PATH here, never inside the child. */
#ifndef OLP_PROVIDERS_CLI_H
#define OLP_PROVIDERS_CLI_H

#include "providers/internal.h"

/* Find the provider's program and put what to execute at the front of plan->argv:
 * pv->bin (absolute, or a name looked up on PATH), else the type's environment variable
 * (ops->bin_env: OLP_CLAUDE_BIN, …), else its name (ops->bin_name) on PATH. Symlinks are resolved, and the real
 * install directory is bound read-only (an npm package's root: claude's native binary
 * lives in its package, codex's in a platform package). A "#!" script whose interpreter
 * lies outside /usr is run through that interpreter by its real path, which is bound too.
 * On failure out->message says what was looked for; returns -ENOENT, or the sandbox
 * policy's -errno. */
int prov_cli_push_program(const struct prov_provider *pv, struct prov_plan *plan,
			  struct prov_outcome *out);

/* Resolve a program like prov_cli_push_program does, without a plan: the real path into
 * real (PATH_MAX bytes). 0 or -ENOENT. */
int prov_cli_find(const struct prov_provider *pv, char *real);

/* Bind the read-only install tree of the program at real path `real` (nothing when it
 * lies under /usr, which every sandbox sees). */
int prov_cli_bind_install(struct sbx_policy *p, const char *real);

/* Bind credential files into the scratch home: none at all for a secretless provider
 * (network.set_headers: the worker adds the credential), else pv's "credentials" (see
 * struct prov_provider), else the type's defaults (ops->credentials: one that cannot be
 * placed is left out). A host path with no place given keeps its place relative to HOME inside.
 * Every run gets a copy; it is written back only with "credentials_writable" (OAuth
 * clients that refresh tokens), for a run of the login's owner (req->login_owner), and
 * when the type's credentials_ok accepts it. Missing files are skipped when the run
 * starts. 0, or -errno with out->message set. */
int prov_cli_bind_credentials(const struct prov_provider *pv, const struct prov_request *req,
			      struct prov_plan *plan, struct prov_outcome *out);
/* Expand "~/" against the worker's home into out (PATH_MAX); absolute paths as they are.
 * 0, -ENOENT (no home known), -EINVAL (neither form) or -ENAMETOOLONG. */
int prov_cli_expand_home(const char *path, char *out);
/* Bind one host file (with "~/" expanded) at inside (absolute). */
int prov_cli_bind_file(struct prov_plan *plan, const char *host, const char *inside, bool writable);

/* The longest argument the kernel passes to a program is MAX_ARG_STRLEN (32 pages,
 * 128 KiB); the limit here keeps room to spare. */
#define PROV_CLI_MAX_ARG ((size_t)120 * 1024)

/* Push opt, then text as one argument, for a CLI that takes text of the client's (a
 * prompt) only on its command line: where it has any other way in (stdin, a file), use
 * that, since argv is readable in the host's /proc/<pid>/cmdline. Text longer than
 * PROV_CLI_MAX_ARG, or holding a NUL byte (which would cut it short), is refused with
 * -E2BIG and out->message naming the limit: the client gets a 400 (PROV_ERR_PROMPT_REFUSED),
 * never an exec that fails. */
int prov_cli_push_bounded_arg(const struct prov_provider *pv, struct prov_plan *plan,
			      const char *opt, const struct buf *text, struct prov_outcome *out);

/* Split messages into the system text (system/developer messages, joined by blank lines)
 * and the flattened rest (prov_flatten_messages into prompt, and/or prov_flatten_blocks
 * appended to the array blocks). Any of the three may be NULL. */
void prov_cli_split_messages(const json_t *messages, struct buf *system, struct buf *prompt,
			     json_t *blocks);

#endif
