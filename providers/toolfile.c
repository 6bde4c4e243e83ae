/* The files that carry a request's tool list into its run (ADR 0019), and the plan's part
 * that declares them through olp-mcp-tools (prov_tools_plan), shared by claude and codex.
 *
 * One file per distinct list, named by its BLAKE2b hash, in <state dir>/tools (0700, the
 * worker's own): the sandbox gives the run a copy of it (sbx_policy_add_bind), so nothing
 * of the client's reaches an argv or an environment (which the sandbox hands to bwrap as
 * --setenv arguments): the host shows both in /proc/<pid>/cmdline to every user. The same list (an agent sends the same tools every turn) is the
 * same file, unchanged, so that its runs keep one warm-sandbox key. A cryptographic hash,
 * so that no client can make its list land in another's file. At most MAX_FILES are kept:
 * past that the oldest go (a run already has its copy; a list needed again is written
 * again). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "providers/internal.h"
#include "common/banned.h"

#define MAX_FILES 64

static char *tools_dir;

int prov_toolfile_set_dir(const char *state_dir)
{
	char path[PATH_MAX];

	if ((size_t)snprintf(path, sizeof(path), "%s/tools", state_dir) >= sizeof(path))
		return -ENAMETOOLONG;
	if (mkdir(path, 0700) < 0 && errno != EEXIST)
		return -errno;
	free(tools_dir);
	tools_dir = xstrdup(path);
	return 0;
}

/* Past MAX_FILES, remove the oldest (by mtime) until MAX_FILES - 1 are left. */
static void prune(void)
{
	DIR *d = opendir(tools_dir);
	struct dirent *e;
	size_t n = 0;
	char oldest[PATH_MAX] = "";
	struct timespec t = { 0 };

	if (!d)
		return;
	while ((e = readdir(d))) {
		char p[PATH_MAX];
		struct stat st;

		if (e->d_name[0] == '.')
			continue;
		n++;
		if ((size_t)snprintf(p, sizeof(p), "%s/%s", tools_dir, e->d_name) >= sizeof(p) ||
		    lstat(p, &st))
			continue;
		if (!oldest[0] || st.st_mtim.tv_sec < t.tv_sec ||
		    (st.st_mtim.tv_sec == t.tv_sec && st.st_mtim.tv_nsec < t.tv_nsec)) {
			memcpy(oldest, p, sizeof(oldest));
			t = st.st_mtim;
		}
	}
	closedir(d);
	/* One at a time: each new file removes at most one old one, which holds the count. */
	if (n >= MAX_FILES && oldest[0])
		(void)unlink(oldest);
}

int prov_toolfile_get(const char *json, size_t len, char *path, size_t size)
{
	unsigned char h[32];
	char hex[65], rnd[17], tmp[PATH_MAX];
	int fd, ret = 0;

	if (!tools_dir)
		return -ENOENT;
	if (sodium_init() < 0)
		return -EIO;
	crypto_generichash(h, sizeof(h), (const unsigned char *)json, len, NULL, 0);
	sodium_bin2hex(hex, sizeof(hex), h, sizeof(h));
	if ((size_t)snprintf(path, size, "%s/%s.json", tools_dir, hex) >= size)
		return -ENAMETOOLONG;
	if (!access(path, F_OK))
		return 0; /* the same list: the same file, untouched */
	prune();
	/* Written whole under a name of its own, then renamed: a run never copies half. */
	random_hex(rnd, 8);
	if ((size_t)snprintf(tmp, sizeof(tmp), "%s/.%s.%s.tmp", tools_dir, hex, rnd) >= sizeof(tmp))
		return -ENAMETOOLONG;
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	ret = write_all(fd, json, len);
	if (close(fd) && !ret)
		ret = -errno;
	if (!ret && rename(tmp, path))
		ret = -errno;
	if (ret)
		(void)unlink(tmp);
	return ret;
}

/* ---- a request's tools, declared through olp-mcp-tools (claude, codex) ---------------- */
#define MCP_MAX_TOOLS_JSON ((size_t)1 << 20)

/* Where olp-mcp-tools is: OLP_MCP_TOOLS, else the path compiled in. */
static const char *mcp_tools_bin(void)
{
	const char *bin = getenv("OLP_MCP_TOOLS");

	return bin && *bin ? bin : PROV_DEFAULT_MCP_TOOLS;
}

/* The MCP tool list: the client's functions with their schemas as they are ("type":
 * "object" added where a schema lacks it, which MCP requires). */
static json_t *mcp_tool_list(const json_t *tools)
{
	json_t *list = json_array(), *t;
	size_t i;

	if (!list)
		abort();
	json_array_foreach(tools, i, t) {
		const json_t *fn = json_object_get(t, "function");
		const json_t *params = json_object_get(fn, "parameters");
		const char *desc = json_string_value(json_object_get(fn, "description"));
		json_t *schema =
			json_is_object(params) ? json_copy((json_t *)params) : json_object();
		json_t *tool;

		if (!schema || (!json_object_get(schema, "type") &&
				json_object_set_new(schema, "type", json_string("object"))))
			abort();
		tool = json_pack("{s:O, s:s, s:o}", "name", json_object_get(fn, "name"),
				 "description", desc ? desc : "", "inputSchema", schema);
		if (!tool || json_array_append_new(list, tool))
			abort();
	}
	return list;
}

int prov_tools_plan(const struct prov_provider *pv, const struct prov_request *req,
		    struct prov_plan *plan, struct prov_outcome *out, const char **binp)
{
	const char *bin = mcp_tools_bin();
	json_t *list = mcp_tool_list(req->tools);
	char *dump = json_dumps(list, JSON_COMPACT);
	size_t len = dump ? strlen(dump) : 0;
	char path[PATH_MAX];
	int ret;

	json_decref(list);
	if (!dump)
		abort();
	if (bin[0] != '/' || access(bin, X_OK)) {
		snprintf(out->message, sizeof(out->message),
			 "provider %s: the tool lister %s is not an executable file (install "
			 "olp-mcp-tools, or name it in OLP_MCP_TOOLS)",
			 pv->name, bin);
		ret = -ENOENT;
		goto out_free;
	}
	if (len > MCP_MAX_TOOLS_JSON) {
		snprintf(out->message, sizeof(out->message),
			 "the tools take %zu bytes as JSON, above the limit of %zu", len,
			 MCP_MAX_TOOLS_JSON);
		ret = -E2BIG;
		goto out_free;
	}
	if ((ret = prov_toolfile_get(dump, len, path, sizeof(path)))) {
		snprintf(out->message, sizeof(out->message),
			 "provider %s: the tool list could not be written (%s; is the runtime "
			 "dir writable?)",
			 pv->name, strerror(-ret));
		goto out_free;
	}
	if ((ret = sbx_policy_add_ro(plan->policy, bin)) ||
	    (ret = sbx_policy_add_bind(plan->policy, path, PROV_TOOLS_INSIDE, false)))
		goto out_free;
	*binp = bin;
out_free:
	free(dump);
	return ret;
}
