# shellcheck shell=bash
# Sourced by the benches that start servers (http-bench.sh, stream-bench.sh,
# usage-http-bench.sh, auth-http-bench.sh): a work dir that goes at exit together with
# every process the bench put in pids, and a free loopback port.

# bench_workdir NAME: work := a new /tmp/olp-NAME.XXXXXX; pids := (); both cleaned up at
# exit (each pid killed and waited for, then the dir removed).
bench_workdir() {
	work=$(mktemp -d "/tmp/olp-$1.XXXXXX")
	pids=()
	trap bench_cleanup EXIT
}

bench_cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}

# A TCP port free on 127.0.0.1 right now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
