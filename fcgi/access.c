/* Who may use which provider: a key's providers_enabled, and logins (ADR 0025).
 *
 * A provider whose CLI runs commands itself (codex, vibe, claude with its own tools on)
 * and whose runs are given its login (credential files) hands that login to whoever
 * writes the prompt: the model can read the files and print them. Such a provider serves
 * only the callers that may hold its login: the owner tier, and a guest key the owner
 * allowed it by name (olp-keys set-login, the manifest's "login_access"); anonymous
 * callers never. A secretless provider (the worker adds an API key on the way out) binds
 * no login and is not concerned. /v1/models lists what the caller may use, so a model it
 * would be refused is not offered. */
#include <string.h>

#include "fcgi/worker.h"
#include "common/banned.h"

enum fcgi_access fcgi_access_check(const struct auth_identity *id, const struct prov_provider *pv)
{
	const char *name = prov_provider_name(pv);

	if (!auth_identity_allows(id, name))
		return FCGI_ACCESS_PROVIDER;
	if (prov_provider_login_exposed(pv) && !auth_identity_may_hold_login(id, name))
		return FCGI_ACCESS_LOGIN;
	return FCGI_ACCESS_OK;
}

void fcgi_access_health(struct buf *b, const struct prov_provider *pv,
			const struct auth_login_grant *grants, size_t n)
{
	const char *name = prov_provider_name(pv);
	bool first = true;

	if (!prov_provider_login_exposed(pv)) {
		buf_adds(b, ",\"login_exposed\":false");
		return;
	}
	/* The risk the owner took, named: these guests' prompts can read this login. */
	buf_adds(b, ",\"login_exposed\":true,\"login_access\":[");
	for (size_t i = 0; i < n; i++) {
		if (strcmp(grants[i].provider, name))
			continue;
		if (!first)
			buf_addch(b, ',');
		buf_add_json_str(b, grants[i].key_id, strlen(grants[i].key_id));
		first = false;
	}
	buf_addch(b, ']');
}
