#!/bin/bash
# Functions of with-pg.sh and pg-ctl.sh (sourced): a throwaway PostgreSQL cluster.
# shellcheck disable=SC2317

# The newest installed server's bin directory, or status 1.
pg_bindir() {
	local d
	d=$(find /usr/lib/postgresql -maxdepth 3 -path '*/bin/initdb' 2>/dev/null | sort -V | tail -1)
	[ -n "$d" ] || return 1
	dirname "$d"
}

pg_as() { runuser -u postgres -- "$@"; }

# A free TCP port on 127.0.0.1.
pg_free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# pg_cluster_create DIR BINDIR: initdb in DIR/data (owned by postgres), a port, passwords.
pg_cluster_create() {
	local dir=$1 bindir=$2 port
	chmod 0755 "$dir"
	mkdir -p "$dir/data" "$dir/socket"
	chown postgres:postgres "$dir/data" "$dir/socket"
	chmod 0700 "$dir/data"
	echo "$bindir" >"$dir/bindir"
	pg_as "$bindir/initdb" -D "$dir/data" -U postgres --auth-local=peer \
		--auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 || {
		cat "$dir/initdb.log" >&2
		return 1
	}
	port=$(pg_free_port)
	echo "$port" >"$dir/port"
	pg_cluster_tls "$dir"
	cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir/socket'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
log_min_messages = warning
ssl = on
ssl_cert_file = '$dir/data/server.crt'
ssl_key_file = '$dir/data/server.key'
CONF
	# Random passwords, kept in a 0600 passfile readable by whoever runs the tests.
	head -c 18 /dev/urandom | base64 | tr '+/' 'xy' >"$dir/admin.pw"
	head -c 18 /dev/urandom | base64 | tr '+/' 'xy' >"$dir/worker.pw"
	(umask 077 && {
		echo "127.0.0.1:$port:*:olp_admin:$(cat "$dir/admin.pw")"
		echo "127.0.0.1:$port:*:olp_worker:$(cat "$dir/worker.pw")"
	} >"$dir/passfile")
}

# pg_cluster_tls DIR: a test CA (DIR/ca.crt) and a server certificate for 127.0.0.1 and
# localhost signed by it, so that clients can connect with sslmode=verify-full.
pg_cluster_tls() {
	local dir=$1
	(
		cd "$dir" || exit 1
		openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=olp test CA" \
			-keyout ca.key -out ca.crt >/dev/null 2>&1 &&
			openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
				-keyout data/server.key -out server.csr >/dev/null 2>&1 &&
			printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >san.ext &&
			openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
				-days 2 -extfile san.ext -out data/server.crt >/dev/null 2>&1
	) || {
		echo "with-pg: could not make the test certificates (openssl)" >&2
		return 1
	}
	chown postgres:postgres "$dir/data/server.key" "$dir/data/server.crt"
	chmod 0600 "$dir/data/server.key"
	chmod 0644 "$dir/ca.crt"
}

pg_ctl_run() {
	local dir=$1
	shift
	pg_as "$(cat "$dir/bindir")/pg_ctl" -D "$dir/data" -l "$dir/data/server.log" -w -t 60 "$@" >/dev/null
}

pg_cluster_start() { pg_ctl_run "$1" start; }

pg_cluster_stop() {
	[ -f "$1/data/postmaster.pid" ] || return 0
	pg_ctl_run "$1" stop -m fast
}

# Roles and the database (as the postgres superuser, over the socket).
pg_cluster_setup() {
	local dir=$1 port
	port=$(cat "$dir/port")
	pg_as "$(cat "$dir/bindir")/psql" -q -v ON_ERROR_STOP=1 -h "$dir/socket" -p "$port" \
		-U postgres -d postgres >/dev/null <<SQL
CREATE ROLE olp_admin LOGIN PASSWORD '$(cat "$dir/admin.pw")';
CREATE ROLE olp_worker LOGIN PASSWORD '$(cat "$dir/worker.pw")';
CREATE DATABASE olp OWNER olp_admin;
\c olp
REVOKE ALL ON SCHEMA public FROM PUBLIC;
ALTER SCHEMA public OWNER TO olp_admin;
GRANT USAGE ON SCHEMA public TO olp_worker;
-- What olp-keys store init creates later: data rights for the workers' role.
ALTER DEFAULT PRIVILEGES FOR ROLE olp_admin IN SCHEMA public
	GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO olp_worker;
ALTER DEFAULT PRIVILEGES FOR ROLE olp_admin IN SCHEMA public
	GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO olp_worker;
SQL
}
