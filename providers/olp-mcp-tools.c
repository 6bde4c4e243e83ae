/* olp-mcp-tools: the tiny stdio MCP server through which a client's function tools are
 * declared to claude and codex (ADR 0019). It LISTS tools and never runs anything: a
 * tools/call gets an error result, and OLP ends the run at the model's call.
 *
 *   olp-mcp-tools TOOLS.json
 *   claude … --mcp-config '{"mcpServers":{"olp":{"command":"<this>","args":["<TOOLS.json>"]}}}'
 *   codex exec … -c mcp_servers.olp.command="<this>" -c mcp_servers.olp.args=["<TOOLS.json>"]
 *
 * TOOLS.json is one JSON array of {"name","description","inputSchema"}: the run's own
 * copy of the file the worker wrote (providers/toolfile.c), in its home.
 *
 * codex calls every MCP tool the model asks for (it has no print-mode refusal, as claude
 * has) and then asks the model again, with the results: a second upstream request at the
 * client's cost. So for codex there is a second mode, a PreModelRequest hook, which codex
 * runs before each model request and waits for:
 *
 *   olp-mcp-tools --codex-hook TOOLS.json
 *
 * When the server has seen a tools/call from this codex process (a marker file next to
 * TOOLS.json, named after the codex process), the request about to be made would carry
 * the results of the client's calls: the hook interrupts codex (SIGINT: it aborts the
 * turn and exits) and never returns, so that request is never sent. codex has printed
 * every call of the model's answer by then; the parser reports them (providers/codex.c).
 * Any other request (the first, codex's own retries) goes ahead.
 *
 * JSON-RPC 2.0, one object a line (the MCP stdio transport). It runs inside the run's
 * sandbox, as the run's uid, with the run's seccomp filter. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

/* The tool list from the file, or NULL with the reason on stderr. */
static json_t *load_tools(const char *path)
{
	json_error_t jerr;
	json_t *tools = json_load_file(path, 0, &jerr);

	if (!json_is_array(tools)) {
		fprintf(stderr, "olp-mcp-tools: %s: not a JSON array of tools (%s)\n", path,
			jerr.text);
		json_decref(tools);
		return NULL;
	}
	return tools;
}

static void reply(const json_t *id, json_t *result)
{
	json_t *msg = json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result", result);
	char *s = msg ? json_dumps(msg, JSON_COMPACT) : NULL;

	if (!s)
		abort();
	/* One line a message: jansson's compact form holds no raw newline. Nobody left to
	 * read it (claude gone): nothing more to do. */
	if (fputs(s, stdout) == EOF || fputc('\n', stdout) == EOF || fflush(stdout) == EOF)
		exit(0);
	free(s);
	json_decref(msg);
}

/* A process's parent and start time, from /proc/<pid>/stat (fields 4 and 22, after
 * "pid (comm)"). 0, or -1 when it cannot be read. */
static int proc_stat(pid_t pid, pid_t *ppid, unsigned long long *start)
{
	char path[64], line[1024];
	const char *p = NULL;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (!(f = fopen(path, "re")))
		return -1;
	if (fgets(line, sizeof(line), f))
		p = strrchr(line, ')');
	(void)fclose(f); /* read only: nothing to lose */
	for (int field = 2; p && field < 22; field++) {
		p = strchr(p + 1, ' ');
		if (p && field == 3)
			*ppid = (pid_t)strtol(p + 1, NULL, 10);
	}
	if (!p)
		return -1;
	*start = strtoull(p + 1, NULL, 10);
	return 0;
}

/* The marker that says "the model called a tool of the client's" for the codex process
 * pid (the server's parent), next to the tool file: "<dir>/.olp-tools-called.<pid>.<start>",
 * the start time telling apart two runs whose processes had the same pid in their own pid
 * namespaces. 0, or -1 when the name does not fit. */
static int marker_path(const char *tools_path, pid_t pid, char *out, size_t size)
{
	const char *slash = strrchr(tools_path, '/');
	unsigned long long start = 0;
	pid_t ppid;
	int n;

	if (proc_stat(pid, &ppid, &start))
		start = 0;
	n = snprintf(out, size, "%.*s/.olp-tools-called.%d.%llu",
		     slash ? (int)(slash - tools_path) : 1, slash ? tools_path : ".", (int)pid,
		     start);
	return n > 0 && (size_t)n < size ? 0 : -1;
}

static void handle(const json_t *msg, const json_t *tools, const char *marker)
{
	const json_t *id = json_object_get(msg, "id");
	const char *method = json_string_value(json_object_get(msg, "method"));
	json_t *result;

	if (!id || json_is_null(id) || !method)
		return; /* a notification (or a response): no answer */
	if (!strcmp(method, "initialize")) {
		const json_t *v =
			json_object_get(json_object_get(msg, "params"), "protocolVersion");

		/* Whatever version the client speaks: listing tools is the same in all. */
		result = json_pack("{s:s, s:{s:{}}, s:{s:s, s:s}}", "protocolVersion",
				   json_is_string(v) ? json_string_value(v) : "2024-11-05",
				   "capabilities", "tools", "serverInfo", "name", "olp", "version",
				   "1");
	} else if (!strcmp(method, "tools/list")) {
		result = json_pack("{s:O}", "tools", tools);
	} else if (!strcmp(method, "tools/call")) {
		/* Refused, never run. claude never sends one (print mode refuses it first);
		 * codex does, and the marker tells the hook to end the run before codex
		 * asks the model again. */
		if (marker[0]) {
			int fd = open(marker, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);

			if (fd >= 0)
				close(fd);
		}
		result = json_pack("{s:[{s:s, s:s}], s:b}", "content", "type", "text", "text",
				   "This tool is run by the API client, not here.", "isError", 1);
	} else {
		result = json_object(); /* ping and anything else: an empty result */
	}
	if (!result)
		abort();
	reply(id, result);
}

/* codex's PreModelRequest hook (above): 0 lets the request go; after a call of the
 * client's, interrupt codex and wait to be killed with it. The hook's parent is not
 * always codex itself (in the sandbox it was not): the codex process is the nearest of
 * our ancestors (up to 3) that the server marked. */
static int codex_hook(const char *tools_path)
{
	char marker[4096], sink[4096];
	struct timespec tick = { 0, 10L * 1000 * 1000 };
	unsigned long long start;
	pid_t pid = getppid(), codex = 0, up;

	/* codex writes the request's description on stdin: read it all, unread. */
	while (fread(sink, 1, sizeof(sink), stdin) > 0)
		;
	for (int depth = 0; depth < 3 && pid > 1 && !codex; depth++, pid = up) {
		if (!marker_path(tools_path, pid, marker, sizeof(marker)) && !access(marker, F_OK))
			codex = pid;
		else if (proc_stat(pid, &up, &start))
			break;
	}
	if (!codex)
		return 0;
	if (kill(codex, SIGINT))
		return 1;
	/* Never return while codex lives: returning lets its request go. codex exits at
	 * once on SIGINT; should it not within 10 s, it is killed (the run then fails, and
	 * still makes no second request). */
	for (int i = 0; !kill(codex, 0) && i < 2000; i++) {
		if (i == 1000)
			kill(codex, SIGKILL);
		nanosleep(&tick, NULL);
	}
	return 1;
}

int main(int argc, char **argv)
{
	bool hook = argc == 3 && !strcmp(argv[1], "--codex-hook");
	json_t *tools = argc == 2 ? load_tools(argv[1]) : NULL;
	char marker[4096] = "";
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;

	if (hook)
		return codex_hook(argv[2]);
	if (!tools) {
		if (argc != 2)
			fprintf(stderr, "usage: olp-mcp-tools TOOLS.json\n"
					"       olp-mcp-tools --codex-hook TOOLS.json\n");
		return 1;
	}
	if (marker_path(argv[1], getppid(), marker, sizeof(marker)))
		marker[0] = '\0';
	while ((n = getline(&line, &cap, stdin)) > 0) {
		json_error_t jerr;
		json_t *msg = json_loadb(line, (size_t)n, 0, &jerr);

		if (json_is_object(msg))
			handle(msg, tools, marker);
		json_decref(msg);
	}
	free(line);
	json_decref(tools);
	return 0;
}
