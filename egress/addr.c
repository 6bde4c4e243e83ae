/* Which addresses a CONNECT tunnel may reach (connect.c; internal.h, "addresses").
 *
 * The worker resolves a listed name itself and connects from the host's network, so
 * whatever the name's DNS says is where the tunnel goes. A run cannot pick an unlisted
 * name, but a listed name can point inside: by mistake, through split-horizon DNS, or
 * because whoever controls its zone wants it to (DNS rebinding). What this stops is a
 * tunnel to anything that is not the public internet:
 *  - every address of this machine, on every interface (a service bound to 0.0.0.0 is
 *    reached through the host's LAN or public address as well as through 127.0.0.1), and
 *    the broadcast addresses and loopback prefixes, read with getifaddrs at each CONNECT:
 *    about 30 us, next to a DNS lookup and a TCP handshake, and never stale (no cache to
 *    miss an address added since);
 *  - loopback, "this network" (0/8), link-local (169.254/16: most clouds' metadata),
 *    RFC 1918 (10/8, 172.16/12, 192.168/16), shared address space 100.64/10 (CGNAT, and
 *    Alibaba's metadata at 100.100.100.200), IETF protocol assignments 192.0.0/24,
 *    benchmarking 198.18/15, multicast, reserved 240/4 and broadcast;
 *  - IPv6 loopback and unspecified, link-local fe80::/10, site-local fec0::/10, unique
 *    local fc00::/7 (AWS's metadata at fd00:ec2::254), multicast, the deprecated
 *    IPv4-compatible ::/96, NAT64's local-use 64:ff9b:1::/48;
 *  - the IPv4 forms inside IPv6 are judged as the IPv4 address they carry: mapped
 *    (::ffff:a.b.c.d), NAT64 (64:ff9b::a.b.c.d) and 6to4 (2002:AABB:CCDD::).
 * An allow_hosts entry that is an address ("10.0.0.5:443", "[fd00::5]:443") lists that
 * address on purpose: it is reachable on that port, by that address or through a listed
 * name that resolves to it, whatever its range. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "egress/internal.h"
#include "common/banned.h"

struct prefix {
	uint8_t a[16];
	unsigned bits;
};

/* Never the public internet, IPv4 (see the top of this file). */
static const struct prefix v4_refused[] = {
	{ { 0 }, 8 },	      { { 10 }, 8 },	   { { 100, 64 }, 10 },	  { { 127 }, 8 },
	{ { 169, 254 }, 16 }, { { 172, 16 }, 12 }, { { 192, 0, 0 }, 24 }, { { 192, 168 }, 16 },
	{ { 198, 18 }, 15 },  { { 224 }, 4 },	   { { 240 }, 4 },
};

/* IPv6; the forms that carry an IPv4 address are handled before these. */
static const struct prefix v6_refused[] = {
	{ { 0 }, 96 },			       /* ::/96: ::, ::1, IPv4-compatible */
	{ { 0xfe, 0x80 }, 10 },		       /* link-local */
	{ { 0xfe, 0xc0 }, 10 },		       /* site-local */
	{ { 0xfc }, 7 },		       /* unique local */
	{ { 0xff }, 8 },		       /* multicast */
	{ { 0, 0x64, 0xff, 0x9b, 0, 1 }, 48 }, /* NAT64 local use */
};

static bool in_prefix(const uint8_t *a, const struct prefix *p)
{
	unsigned whole = p->bits / 8, rest = p->bits % 8;

	if (memcmp(a, p->a, whole))
		return false;
	return !rest || ((a[whole] ^ p->a[whole]) & (uint8_t)(0xff << (8 - rest))) == 0;
}

static bool v4_refused_range(const uint8_t *a4)
{
	for (size_t i = 0; i < ARRAY_SIZE(v4_refused); i++)
		if (in_prefix(a4, &v4_refused[i]))
			return true;
	return false;
}

bool egr_addr_from_sockaddr(const struct sockaddr *sa, struct egr_addr *out)
{
	static const uint8_t mapped[12] = { [10] = 0xff, [11] = 0xff };

	*out = (struct egr_addr){ 0 };
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;

		out->family = AF_INET;
		memcpy(out->a, &s4->sin_addr, 4);
		out->port = ntohs(s4->sin_port);
		return true;
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;

		out->port = ntohs(s6->sin6_port);
		/* ::ffff:a.b.c.d is a.b.c.d on the wire: one address, one answer. */
		if (!memcmp(s6->sin6_addr.s6_addr, mapped, sizeof(mapped))) {
			out->family = AF_INET;
			memcpy(out->a, &s6->sin6_addr.s6_addr[12], 4);
		} else {
			out->family = AF_INET6;
			memcpy(out->a, s6->sin6_addr.s6_addr, 16);
		}
		return true;
	}
	return false;
}

bool egr_addr_port_parse(const char *hp, struct egr_addr *out)
{
	const char *colon = strrchr(hp, ':');
	char host[INET6_ADDRSTRLEN + 2];
	size_t hl;
	unsigned long port;
	char *end;

	if (!colon || colon[1] < '1' || colon[1] > '9')
		return false;
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno || *end || port > 65535)
		return false;
	hl = (size_t)(colon - hp);
	if (hl < 2 || hl >= sizeof(host))
		return false;
	if (hp[0] == '[') {
		struct sockaddr_in6 s6 = { .sin6_family = AF_INET6 };

		if (hp[hl - 1] != ']')
			return false;
		memcpy(host, hp + 1, hl - 2);
		host[hl - 2] = '\0';
		/* inet_pton takes no zone ("%eth0") and no other spelling but the hex one. */
		if (inet_pton(AF_INET6, host, &s6.sin6_addr) != 1)
			return false;
		s6.sin6_port = htons((uint16_t)port);
		return egr_addr_from_sockaddr((const struct sockaddr *)&s6, out);
	}
	memcpy(host, hp, hl);
	host[hl] = '\0';
	/* A dotted quad only: "127.1", "0x7f.0.0.1" and "2130706433" are no listing. */
	out->family = AF_INET;
	out->port = (uint16_t)port;
	memset(out->a, 0, sizeof(out->a));
	return inet_pton(AF_INET, host, out->a) == 1;
}

bool egr_addr_listable(const struct egr_addr *a)
{
	static const uint8_t zero[16];

	if (a->family == AF_INET)
		return memcmp(a->a, zero, 4) && a->a[0] < 224; /* not 0.0.0.0, multicast, 240/4 */
	return memcmp(a->a, zero, 16) && a->a[0] != 0xff;
}

bool egr_addr_listed(const struct egr_addr *a, char *const *allow)
{
	for (size_t i = 0; allow && allow[i]; i++) {
		struct egr_addr e;

		if (egr_addr_port_parse(allow[i], &e) && e.family == a->family &&
		    e.port == a->port && !memcmp(e.a, a->a, 16))
			return true;
	}
	return false;
}

/* Whether a is in a range that is never the public internet, the IPv4 an IPv6 address
 * carries judged as that IPv4 address. */
static bool refused_range(const struct egr_addr *a)
{
	static const uint8_t nat64[12] = { 0, 0x64, 0xff, 0x9b };

	if (a->family == AF_INET)
		return v4_refused_range(a->a);
	if (!memcmp(a->a, nat64, sizeof(nat64)))
		return v4_refused_range(&a->a[12]);
	if (a->a[0] == 0x20 && a->a[1] == 0x02) /* 6to4: 2002:AABB:CCDD::/48 */
		return v4_refused_range(&a->a[2]);
	for (size_t i = 0; i < ARRAY_SIZE(v6_refused); i++)
		if (in_prefix(a->a, &v6_refused[i]))
			return true;
	return false;
}

/* Whether a equals mine, or, with mask, is in mine's prefix. */
static bool addr_match(const struct egr_addr *a, const struct sockaddr *mine,
		       const struct sockaddr *mask)
{
	struct egr_addr m, k;

	if (!mine || !egr_addr_from_sockaddr(mine, &m) || m.family != a->family)
		return false;
	if (!mask || !egr_addr_from_sockaddr(mask, &k) || k.family != m.family)
		return !memcmp(m.a, a->a, 16);
	for (size_t i = 0; i < 16; i++)
		if ((m.a[i] ^ a->a[i]) & k.a[i])
			return false;
	return true;
}

/* Whether a is an address of one of this machine's interfaces, or its broadcast address,
 * or in the prefix of an address on a loopback interface (the kernel makes that whole
 * prefix local: 127.0.0.1/8 answers on 127.0.0.2, and 203.0.113.1/24 on lo likewise). */
static bool on_this_machine(const struct egr_addr *a, const struct ifaddrs *ifs)
{
	for (const struct ifaddrs *i = ifs; i; i = i->ifa_next) {
		bool lo = i->ifa_flags & IFF_LOOPBACK;

		if (addr_match(a, i->ifa_addr, lo ? i->ifa_netmask : NULL))
			return true;
		/* Without IFF_BROADCAST the field is a point-to-point link's far end. */
		if ((i->ifa_flags & IFF_BROADCAST) && addr_match(a, i->ifa_broadaddr, NULL))
			return true;
	}
	return false;
}

enum egr_addr_verdict egr_addr_judge(const struct egr_addr *a, char *const *allow,
				     const struct ifaddrs *ifs)
{
	if (egr_addr_listed(a, allow))
		return EGR_ADDR_OK;
	if (on_this_machine(a, ifs))
		return EGR_ADDR_THIS_MACHINE;
	return refused_range(a) ? EGR_ADDR_INTERNAL : EGR_ADDR_OK;
}

const char *egr_addr_str(const struct egr_addr *a, char *out, size_t n)
{
	if (!inet_ntop(a->family, a->a, out, (socklen_t)n))
		snprintf(out, n, "?");
	return out;
}
