/* olp-mcp-tools: the tiny stdio MCP server through which a client's function tools are
 * declared to claude (ADR 0019). It LISTS tools and never runs anything: a tools/call gets
 * an error result, and OLP ends the run as soon as the model asks for a call, before the
 * CLI could send one.
 *
 *   olp-mcp-tools TOOLS.json
 *   claude … --mcp-config '{"mcpServers":{"olp":{"command":"<this>","args":["<TOOLS.json>"]}}}'
 *
 * TOOLS.json is one JSON array of {"name","description","inputSchema"}: the run's own
 * copy of the file the worker wrote (providers/toolfile.c), in its home.
 *
 * JSON-RPC 2.0, one object a line (the MCP stdio transport). It runs inside the run's
 * sandbox, as the run's uid, with the run's seccomp filter. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void handle(const json_t *msg, const json_t *tools)
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
		/* Never reached in OLP's runs (the run ends at the model's call); if it is, the
		 * call is refused, not run. */
		result = json_pack("{s:[{s:s, s:s}], s:b}", "content", "type", "text", "text",
				   "This tool is run by the API client, not here.", "isError", 1);
	} else {
		result = json_object(); /* ping and anything else: an empty result */
	}
	if (!result)
		abort();
	reply(id, result);
}

int main(int argc, char **argv)
{
	json_t *tools = argc == 2 ? load_tools(argv[1]) : NULL;
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;

	if (!tools) {
		if (argc != 2)
			fprintf(stderr, "usage: olp-mcp-tools TOOLS.json\n");
		return 1;
	}
	while ((n = getline(&line, &cap, stdin)) > 0) {
		json_error_t jerr;
		json_t *msg = json_loadb(line, (size_t)n, 0, &jerr);

		if (json_is_object(msg))
			handle(msg, tools);
		json_decref(msg);
	}
	free(line);
	json_decref(tools);
	return 0;
}
