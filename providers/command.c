/* The generic "command" provider: a local program configured in the registry gets the
 * flattened prompt on stdin; its stdout is the answer, streamed as it arrives.
 *
 *   "providers": { "local": { "type": "command", "argv": ["/usr/bin/…", "…"],
 *                             "ro_paths": [...], "network": false, "env": {...},
 *                             "timeout_s": 60, "models": [{"id": "…"}] } } */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "providers/internal.h"
#include "common/banned.h"

static bool under_usr(const char *path)
{
	char real[PATH_MAX];

	return realpath(path, real) && !strncmp(real, "/usr/", 5);
}

static int command_plan(const struct prov_provider *pv, const struct prov_request *req,
			struct prov_plan *plan, struct prov_outcome *out)
{
	const json_t *argv = json_object_get(pv->conf, "argv"), *v;
	const char *exe, *key;
	size_t i;
	int ret;

	json_array_foreach(argv, i, v) {
		if ((ret = prov_plan_push_arg(plan, json_string_value(v))))
			return ret;
	}
	exe = plan->argv[0];
	/* The program itself must be visible inside the sandbox; /usr (and /bin, a link
	 * into it on merged-/usr systems) already is. */
	if (!under_usr(exe) && (ret = sbx_policy_add_ro(plan->policy, exe)))
		goto fail;
	json_array_foreach(json_object_get(pv->conf, "ro_paths"), i, v)
		if ((ret = sbx_policy_add_ro(plan->policy, json_string_value(v))))
			goto fail;
	json_object_foreach((json_t *)json_object_get(pv->conf, "env"), key, v)
		if ((ret = sbx_policy_setenv(plan->policy, key, json_string_value(v))))
			goto fail;
	prov_flatten_messages(req->messages, &plan->stdin_data);
	return 0;
fail:
	snprintf(out->message, sizeof(out->message), "provider %s is misconfigured", pv->name);
	return ret;
}

static void *command_parser_new(void)
{
	return calloc(1, sizeof(struct prov_text_reader));
}

static int command_feed(void *st, const char *data, size_t len, const struct prov_sink *sink)
{
	return prov_text_feed(st, data, len, sink);
}

static int command_finish(void *st, const struct prov_sink *sink)
{
	return prov_text_finish(st, sink);
}

const struct provider_ops prov_command_ops = {
	.type = "command",
	.plan = command_plan,
	.parser_new = command_parser_new,
	.parser_feed = command_feed,
	.parser_finish = command_finish,
	.parser_free = free,
};
