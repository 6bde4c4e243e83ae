/* The worker's own lockdown: no capabilities, no_new_privs.
 *
 * One exception, only when the worker runs as root: what giving each run a host uid of
 * its own takes (ident.c, ADR 0014). Writing a user namespace's uid and gid map with
 * other host ids needs CAP_SETUID and CAP_SETGID, and mapping the worker's own uid 0
 * needs CAP_SETFCAP (Linux >= 5.12); the bounding set keeps what bwrap and the stub then
 * use inside that namespace, where a capability reaches nothing of the host's. A root
 * worker without capabilities still owns every root-owned file of the host, so these add
 * little to a compromised worker; the run itself never has them. Running lighttpd and its
 * workers as an ordinary user (www-data, or olp) needs no capability at all and is what
 * docs/sandbox.md recommends. */
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

/* Held (root only): writing the run namespaces' maps. */
static const cap_value_t keep_caps[] = { CAP_SETUID, CAP_SETGID, CAP_SETFCAP };
/* Left in the bounding set (root only): what bwrap needs as root of a run's user namespace
 * (mounts, pivot_root, loopback, its own cap drop) and what the stub needs there. */
static const cap_value_t keep_bounding[] = { CAP_SETUID,    CAP_SETGID,	   CAP_SETFCAP,
					     CAP_SETPCAP,   CAP_SYS_ADMIN, CAP_SYS_CHROOT,
					     CAP_NET_ADMIN, CAP_CHOWN };

static bool kept(const cap_value_t *set, size_t n, cap_value_t c)
{
	for (size_t i = 0; i < n; i++)
		if (set[i] == c)
			return true;
	return false;
}

int sbx_lockdown_self(void)
{
	bool root = geteuid() == 0;
	cap_t caps;
	cap_value_t c;
	int ret = 0;

	/* 0. A non-root worker maps its runs' uids with the setuid newuidmap/newgidmap,
	 *    which no_new_privs (step 4) would disable: their helper is forked first. It
	 *    holds nothing but a socket to us. */
	if ((ret = sbx_ident_prepare()))
		return ret;
	/* 1. The bounding set first: dropping from it needs CAP_SETPCAP, which step 3
	 *    removes. What is not in it can never be regained through an exec. Without
	 *    CAP_SETPCAP (an ordinary user) nothing can be dropped, nor needs to be: such a
	 *    process gains no capability from its bounding set but through file capabilities,
	 *    which no_new_privs (step 4) disables. */
	if (root || cap_setpcap_held()) {
		for (c = 0; c <= CAP_LAST_CAP; c++) {
			if (root && kept(keep_bounding, ARRAY_SIZE(keep_bounding), c))
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
	/* 3. Effective, permitted and inheritable sets: empty (root: keep_caps only). */
	caps = cap_init();
	if (!caps)
		return -errno;
	if (root &&
	    (cap_set_flag(caps, CAP_EFFECTIVE, ARRAY_SIZE(keep_caps), keep_caps, CAP_SET) < 0 ||
	     cap_set_flag(caps, CAP_PERMITTED, ARRAY_SIZE(keep_caps), keep_caps, CAP_SET) < 0))
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
