/* prov-driver: the providers module from the command line, for the real-CLI tests.
 *
 *   prov-driver parse TYPE            stdin = a provider's stdout; prints its events
 *   prov-driver run REGISTRY MODEL [CONFIG_PROVIDERS_JSON] [off|bwrap]
 *                                     stdin = the user message; runs the request with
 *                                     prov_run (plan, sandbox, parser) and prints its
 *                                     events and outcome
 *
 * With OLP_PCLI_TOOLS (a JSON array of OpenAI function tools) in the environment, run
 * declares them (prov_request.tools; tool-list files in the run's state dir), with
 * OLP_PCLI_TOOL_CHOICE "required" or a tool's name as its tool_choice (else "auto").
 *
 * With OLP_PCLI_PRESTART=1 in the environment, run runs the request twice in one process:
 * once silently but for a {"ev":"warmup_delta"} line per text delta (which leaves a
 * pre-started process of the provider, when its "prestart" is above 0: ADR 0022), then, once that process waits, again, printed; the outcome says
 * how its process came to be ("start").
 *
 * Every event is one JSON line: {"ev":"delta","text":…,"t_ms":…}, {"ev":"usage",…},
 * {"ev":"finish","reason":…}, {"ev":"error",…}, then {"ev":"done"} when the parser said
 * the answer is complete, and (run) {"ev":"outcome",…}. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "providers/providers.h"
#include "sandbox/sandbox.h"
#include "common/banned.h"

static uint64_t t0;

static void print_line(struct buf *b)
{
	buf_addch(b, '\n');
	write_all(1, b->data, b->len);
	buf_release(b);
}

static int print_event(void *ctx, const struct prov_event *ev)
{
	struct buf b = BUF_INIT;

	(void)ctx;
	switch (ev->kind) {
	case PROV_EV_DELTA:
		buf_adds(&b, "{\"ev\":\"delta\",\"text\":");
		buf_add_json_str(&b, ev->text, ev->len);
		break;
	case PROV_EV_USAGE:
		buf_addf(&b,
			 "{\"ev\":\"usage\",\"prompt_tokens\":%lld,\"completion_tokens\":%lld,"
			 "\"total_tokens\":%lld,\"cached_tokens\":%lld",
			 (long long)ev->usage->prompt_tokens,
			 (long long)ev->usage->completion_tokens,
			 (long long)ev->usage->total_tokens, (long long)ev->usage->cached_tokens);
		if (ev->usage->partial)
			buf_adds(&b, ",\"partial\":true");
		break;
	case PROV_EV_FINISH:
		buf_adds(&b, "{\"ev\":\"finish\",\"reason\":");
		buf_add_json_str(&b, ev->finish_reason, strlen(ev->finish_reason));
		break;
	case PROV_EV_ERROR:
		buf_addf(&b,
			 "{\"ev\":\"error\",\"code\":\"%s\",\"upstream_status\":%d,\"message\":",
			 prov_error_code(ev->failure->err), ev->failure->upstream_status);
		buf_add_json_str(&b, ev->failure->message, strlen(ev->failure->message));
		break;
	case PROV_EV_TOOL_CALL:
		buf_addf(&b, "{\"ev\":\"tool\",\"index\":%u", ev->tool_index);
		if (ev->tool_id) {
			buf_adds(&b, ",\"id\":");
			buf_add_json_str(&b, ev->tool_id, strlen(ev->tool_id));
			buf_adds(&b, ",\"name\":");
			buf_add_json_str(&b, ev->tool_name, strlen(ev->tool_name));
		}
		buf_adds(&b, ",\"args\":");
		buf_add_json_str(&b, ev->text ? ev->text : "", ev->len);
		break;
	}
	buf_addf(&b, ",\"t_ms\":%llu}", (unsigned long long)(mono_ms() - t0));
	print_line(&b);
	return 0;
}

static int parse_main(const char *type)
{
	struct prov_sink sink = { .emit = print_event };
	struct prov_parser *ps = prov_parser_new(type);
	struct buf in = BUF_INIT, b = BUF_INIT;
	int ret = 0;

	if (!ps) {
		fprintf(stderr, "prov-driver: no parser for type %s\n", type);
		return 2;
	}
	while (ret == 0 && buf_read_once(&in, 0, 65536) > 0) {
		ret = prov_parser_feed(ps, in.data, in.len, &sink);
		buf_reset(&in);
	}
	if (ret > 0) {
		/* The answer is complete: say so at once, as prov_run would answer now. */
		buf_addf(&b, "{\"ev\":\"done\",\"t_ms\":%llu}",
			 (unsigned long long)(mono_ms() - t0));
		print_line(&b);
	}
	prov_parser_finish(ps, &sink);
	prov_parser_free(ps);
	buf_release(&in);
	return 0;
}

/* The warm-up's sink: only a line per text delta, {"ev":"warmup_delta","t_ms":…}, for a
 * test whose upstream streams in lockstep with what the client saw (x-fake-delta-gate). */
static int quiet_event(void *ctx, const struct prov_event *ev)
{
	struct buf b = BUF_INIT;

	(void)ctx;
	if (ev->kind != PROV_EV_DELTA)
		return 0;
	buf_addf(&b, "{\"ev\":\"warmup_delta\",\"t_ms\":%llu}",
		 (unsigned long long)(mono_ms() - t0));
	print_line(&b);
	return 0;
}

/* Run req once, quietly (but for warmup_delta lines), then wait (generously: the machine is shared) until a process
 * started ahead waits for the next one, and a little more for the CLI to be ready. */
static void prestart_first(const struct prov_request *req)
{
	struct prov_sink quiet = { .emit = quiet_event };
	struct sbx_prestart_stats st;
	struct prov_outcome o;

	prov_run(req, &quiet, -1, &o);
	for (int i = 0; i < 300; i++) {
		sbx_prestart_stats(&st);
		if (st.idle)
			break;
		usleep(100000);
	}
	usleep(1500000);
}

static int run_main(int argc, char **argv)
{
	struct buf err = BUF_INIT, prompt = BUF_INIT, b = BUF_INIT;
	struct prov_sink sink = { .emit = print_event };
	char runtime[] = "/tmp/olp-prov-driver-XXXXXX";
	struct sbx_global_config gc = { .mode = SBX_MODE_BWRAP };
	const char *pre = getenv("OLP_PCLI_PRESTART");
	const char *tools_env = getenv("OLP_PCLI_TOOLS"), *choice = getenv("OLP_PCLI_TOOL_CHOICE");
	json_t *tools = NULL;
	bool prestart = pre && !strcmp(pre, "1");
	json_t *conf = NULL, *messages = NULL;
	struct prov_registry *reg = NULL;
	const struct prov_model *m;
	struct prov_outcome o;
	int rc = 1;

	if (argc > 4 && argv[4][0]) {
		json_error_t je;

		if (!(conf = json_loads(argv[4], 0, &je))) {
			fprintf(stderr, "prov-driver: config: %s\n", je.text);
			return 2;
		}
	}
	if (argc > 5 && !strcmp(argv[5], "off"))
		gc.mode = SBX_MODE_OFF;
	if (!mkdtemp(runtime)) {
		perror("mkdtemp");
		goto out;
	}
	gc.runtime_dir = runtime;
	if (prestart) {
		gc.warm = true;
		gc.prestart_max = 2;
	}
	if (tools_env && *tools_env) {
		json_error_t je;

		if (!json_is_array(tools = json_loads(tools_env, 0, &je)) ||
		    prov_set_state_dir(runtime)) {
			fprintf(stderr, "prov-driver: OLP_PCLI_TOOLS: not a JSON array (%s)\n",
				je.text);
			goto out;
		}
	}
	if (sbx_global_init(&gc)) {
		fprintf(stderr, "prov-driver: sbx_global_init failed\n");
		goto out;
	}
	if (!(reg = prov_registry_load(argv[2], conf, &err))) {
		fprintf(stderr, "prov-driver: %s\n", err.data);
		goto out;
	}
	if (!(m = prov_registry_find(reg, argv[3]))) {
		fprintf(stderr, "prov-driver: no model %s\n", argv[3]);
		goto out;
	}
	while (buf_read_once(&prompt, 0, 65536) > 0)
		;
	messages = json_pack("[{s:s, s:s}]", "role", "user", "content", prompt.data);
	{
		struct prov_request req = { .model = m,
					    .model_name = argv[3],
					    .messages = messages,
					    .request_id = "prov-driver",
					    .tools = tools };

		if (tools && choice && !strcmp(choice, "required")) {
			req.tool_choice = PROV_TOOLS_REQUIRED;
		} else if (tools && choice && *choice) {
			req.tool_choice = PROV_TOOLS_NAMED;
			req.tool_name = choice;
		}

		if (prestart) {
			struct timespec now;

			prestart_first(&req);
			/* The upstream requests of the checked run are the ones from now on. */
			clock_gettime(CLOCK_REALTIME, &now);
			buf_addf(&b, "{\"ev\":\"warmup\",\"wall_ms\":%lld}",
				 (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000);
			print_line(&b);
		}
		prov_run(&req, &sink, -1, &o);
	}
	buf_addf(&b,
		 "{\"ev\":\"outcome\",\"code\":\"%s\",\"status\":%d,\"upstream_status\":%d,"
		 "\"finish_reason\":\"%s\",\"exit_status\":%d,\"duration_ms\":%llu,"
		 "\"output_started\":%s,\"usage_present\":%s,\"message\":",
		 prov_error_code(o.err), o.status, o.upstream_status, o.finish_reason,
		 o.exit_status, (unsigned long long)o.duration_ms,
		 o.output_started ? "true" : "false", o.usage.present ? "true" : "false");
	buf_add_json_str(&b, o.message, strlen(o.message));
	buf_adds(&b, ",\"stderr_tail\":");
	buf_add_json_str(&b, o.stderr_tail, strlen(o.stderr_tail));
	buf_addf(&b, ",\"start\":\"%s\",\"retried_cold\":%s", sbx_start_name(o.start),
		 o.retried_cold ? "true" : "false");
	buf_addf(&b, ",\"t_ms\":%llu}", (unsigned long long)(mono_ms() - t0));
	print_line(&b);
	rc = 0;
out:
	json_decref(tools);
	json_decref(messages);
	json_decref(conf);
	prov_registry_free(reg);
	sbx_global_release();
	if (tools) {
		/* What prov_set_state_dir made: the slots and the tool lists. */
		struct buf cmd = BUF_INIT;

		buf_addf(&cmd, "rm -rf '%s'", runtime);
		if (system(cmd.data))
			fprintf(stderr, "prov-driver: could not remove %s\n", runtime);
		buf_release(&cmd);
	}
	rmdir(runtime);
	buf_release(&err);
	buf_release(&prompt);
	return rc;
}

int main(int argc, char **argv)
{
	t0 = mono_ms();
	if (argc == 3 && !strcmp(argv[1], "parse"))
		return parse_main(argv[2]);
	if (argc >= 4 && !strcmp(argv[1], "run"))
		return run_main(argc, argv);
	fprintf(stderr, "usage: prov-driver parse TYPE < output\n"
			"       prov-driver run REGISTRY MODEL [CONFIG_PROVIDERS_JSON] [off|bwrap] "
			"< prompt\n");
	return 2;
}
