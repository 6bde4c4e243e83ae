#!/bin/bash
# Stop, start or restart the with-pg.sh cluster of this test (OLP_TEST_PG_DIR), as its
# tests do to take the database away under load: pg-ctl.sh stop|start|restart|psql [ARGS]
# psql runs as the postgres superuser on database olp.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/pg/pg-lib.sh
. "$here/pg-lib.sh"
dir=${OLP_TEST_PG_DIR:?run under tests/pg/with-pg.sh}
case "${1:-}" in
stop) pg_ctl_run "$dir" stop -m fast ;;
start) pg_ctl_run "$dir" start ;;
restart) pg_ctl_run "$dir" restart -m fast ;;
psql)
	shift
	pg_as "$(cat "$dir/bindir")/psql" -X -q -h "$dir/socket" -p "$(cat "$dir/port")" \
		-U postgres -d olp "$@"
	;;
*) echo "usage: $0 stop|start|restart|psql [ARGS]" >&2; exit 2 ;;
esac
