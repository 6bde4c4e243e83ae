#!/bin/bash
# Run a command against a throwaway PostgreSQL cluster of the distribution's own server
# (package postgresql), then stop it and remove it.
#
#   tests/pg/with-pg.sh [--keep-dir DIR] COMMAND [ARG...]
#
# The cluster lives in a fresh directory under ${TMPDIR:-/tmp}, owned by the postgres
# system user (initdb refuses root), listens on 127.0.0.1 at a free port and on a unix
# socket in its own directory, and has one database, olp, with two roles:
#   olp_admin   owns the database: creates and upgrades the schema (olp-keys store init)
#   olp_worker  data rights only (what olp-fcgi and olp-keys use day to day)
# Both log in with a password kept in a 0600 passfile (libpq's pgpass format).
# COMMAND sees:
#   OLP_TEST_PG_URL        postgresql://olp_worker@127.0.0.1:PORT/olp
#   OLP_TEST_PG_ADMIN_URL  postgresql://olp_admin@127.0.0.1:PORT/olp
#   PGPASSFILE             the passfile (both roles)
#   OLP_TEST_PG_DIR        the cluster's directory (data/, socket/, log)
#   OLP_TEST_PG_PORT       the port
#   OLP_TEST_PG_CA         the test CA that signed the server's certificate (TLS is on:
#                          ?sslmode=verify-full&sslrootcert=$OLP_TEST_PG_CA works)
#   OLP_TEST_PG_CTL        "pg_ctl -D DATA" to stop or start it as the postgres user:
#                          tests/pg/pg-ctl.sh stop|start|restart (uses OLP_TEST_PG_DIR)
# When the server is not installed, it exits 77 (a skip) with the reason, unless
# OLP_TEST_PG_REQUIRED=1 (then 1): deploy/olp-local test installs it.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/pg/pg-lib.sh
. "$here/pg-lib.sh"

keep=
if [ "${1:-}" = --keep-dir ]; then
	keep=$2
	shift 2
fi
[ $# -ge 1 ] || { echo "usage: $0 [--keep-dir DIR] COMMAND [ARG...]" >&2; exit 2; }

bindir=$(pg_bindir) || {
	echo "with-pg: no PostgreSQL server installed (apt-get install postgresql)" >&2
	[ "${OLP_TEST_PG_REQUIRED:-0}" = 1 ] && exit 1
	exit 77
}

dir=${keep:-$(mktemp -d "${TMPDIR:-/tmp}/olp-pg.XXXXXX")}
mkdir -p "$dir"
cleanup() {
	local rc=$?
	pg_cluster_stop "$dir" || true
	[ -n "$keep" ] || rm -rf "$dir"
	exit "$rc"
}
trap cleanup EXIT INT TERM

pg_cluster_create "$dir" "$bindir"
pg_cluster_start "$dir"
pg_cluster_setup "$dir"

export OLP_TEST_PG_DIR=$dir
OLP_TEST_PG_PORT=$(cat "$dir/port")
export OLP_TEST_PG_PORT
export OLP_TEST_PG_URL="postgresql://olp_worker@127.0.0.1:$OLP_TEST_PG_PORT/olp"
export OLP_TEST_PG_ADMIN_URL="postgresql://olp_admin@127.0.0.1:$OLP_TEST_PG_PORT/olp"
export PGPASSFILE=$dir/passfile
export OLP_TEST_PG_CA=$dir/ca.crt
export OLP_TEST_PG_CTL="$here/pg-ctl.sh"
set +e
"$@"
rc=$?
set -e
exit "$rc"
