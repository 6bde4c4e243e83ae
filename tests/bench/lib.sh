# shellcheck shell=bash
# Sourced by every bench: bench_build, and for those that start servers (http-bench.sh, stream-bench.sh,
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

# bench_build DIR TARGET...: configure DIR for the benches and build TARGETs in it. Every
# bench calls it, so a source change is always built, and a build dir configured without
# the tests (deploy/olp-local serve's build/) gains the test targets the benches run
# (hello-fcgi, spawn-bench, …) instead of failing with "No rule to make target". The
# default DIR, build/bench, is the benches' own: serve's and the suite's builds stay as
# they were configured.
bench_build() {
	local dir=$1
	shift
	cmake -S "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)" -B "$dir" \
		-DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=ON >/dev/null
	cmake --build "$dir" -j"$(nproc)" --target "$@" >/dev/null
}
