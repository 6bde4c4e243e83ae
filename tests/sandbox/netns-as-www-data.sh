#!/bin/sh
# netns-as-www-data.sh — a network-namespace suite (test_netns, test_sandbox_net: CTest
# unit_sandbox_netns_www_data, unit_sandbox_net_www_data) again as
# www-data, the user a web server's FastCGI workers run as: the namespace is then made
# inside a user namespace. Only root
# can switch users: anyone else, or a host without www-data or setpriv, or a build tree
# www-data cannot read, is a SKIP (77), saying why.
#
# usage: netns-as-www-data.sh TEST_BINARY
set -u
t=$1
[ "$(id -u)" -eq 0 ] || { echo "SKIP: not root: cannot run as www-data"; exit 77; }
command -v setpriv >/dev/null 2>&1 || { echo "SKIP: no setpriv (util-linux)"; exit 77; }
id www-data >/dev/null 2>&1 || { echo "SKIP: no www-data user"; exit 77; }
setpriv --reuid=www-data --regid=www-data --clear-groups test -x "$t" ||
	{ echo "SKIP: www-data cannot execute $t (a build tree under a private home?)"; exit 77; }
cd / && exec setpriv --reuid=www-data --regid=www-data --clear-groups "$t"
