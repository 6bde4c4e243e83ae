/* The worker's own lockdown: no capabilities, no_new_privs.
 *
 * One exception, only when the worker runs as root: CAP_SETFCAP. Since Linux 5.12 a user
 * namespace may map host uid 0 only if its creator held CAP_SETFCAP (the kernel records
 * it at creation), so without it bwrap run by root cannot set up the sandbox's uid map
 * and every request would fail closed. Running lighttpd and its workers as an ordinary
 * user (www-data) needs no capability at all and is what docs/sandbox.md recommends. */
#include <errno.h>
#include <stdbool.h>
#include <sys/capability.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/common.h"
#include "sandbox/internal.h"
#include "common/banned.h"

static bool cap_setpcap_held(void)
{
	cap_flag_value_t v = CAP_CLEAR;
	cap_t caps = cap_get_proc();

	if (caps) {
		cap_get_flag(caps, CAP_SETPCAP, CAP_EFFECTIVE, &v);
		cap_free(caps);
	}
	return v == CAP_SET;
}

int sbx_lockdown_self(void)
{
	bool root = geteuid() == 0;
	cap_value_t keep = CAP_SETFCAP;
	cap_t caps;
	cap_value_t c;
	int ret = 0;

	/* 1. The bounding set first: dropping from it needs CAP_SETPCAP, which step 3
	 *    removes. What is not in it can never be regained through an exec. Without
	 *    CAP_SETPCAP (an ordinary user) nothing can be dropped, nor needs to be: such a
	 *    process gains no capability from its bounding set but through file capabilities,
	 *    which no_new_privs (step 4) disables. */
	if (root || cap_setpcap_held()) {
		for (c = 0; c <= CAP_LAST_CAP; c++) {
			if (root && c == keep)
				continue;
			/* EINVAL: a capability this kernel does not know. */
			if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL)
				return -errno;
		}
	}
	/* 2. Ambient capabilities would survive an exec: clear them (EINVAL: a kernel
	 *    before 4.3 has none). */
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
		return -errno;
	/* 3. Effective, permitted and inheritable sets: empty (root: CAP_SETFCAP only). */
	caps = cap_init();
	if (!caps)
		return -errno;
	if (root && (cap_set_flag(caps, CAP_EFFECTIVE, 1, &keep, CAP_SET) < 0 ||
		     cap_set_flag(caps, CAP_PERMITTED, 1, &keep, CAP_SET) < 0))
		ret = -errno;
	if (!ret && cap_set_proc(caps) < 0)
		ret = -errno;
	cap_free(caps);
	if (ret)
		return ret;
	/* 4. No exec may grant privilege again (setuid binaries, file capabilities). */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return -errno;
	return 0;
}
