#!/usr/bin/env bash
# http-bench.sh — the request path's cost, measured side by side in one run.
#
#  1. GET /health requests/s through lighttpd, with a stored owner key (the key store's
#     path: hash, lookup, a stat of the manifest; the owner's full /health; a log line and
#     an audit record): olp-fcgi vs a hello-world libfcgi responder (hello-fcgi, sent the
#     same header) behind the same lighttpd config (issue 23 goal: ratio >= 0.85).
#     Rounds alternate A, B, A, B… so that machine noise hits both alike. Where the time
#     went: each side's CPU per request (the FastCGI processes', from /proc, and the web
#     server's), and with BENCH_PERF=1 a perf profile of the olp-fcgi workers (top symbols).
#     With BASE_BUILD (3. below) the base's olp-fcgi is a third side in the same rounds.
#     The same pair behind Apache + mod_fcgid (deploy/apache/olp.conf: one request per
#     process, 16 processes, started before the timed rounds) and behind nginx +
#     spawn-fcgi (deploy/nginx/olp.conf, one nginx worker like lighttpd's one process,
#     one olp-fcgi with 16 threads), where installed (BENCH_SERVERS to choose).
#  2. Median round trip of a non-streaming completion whose command answers at once
#     (printf ok, sandboxed, over HTTP; requests 50 ms apart, as a person's are) vs
#     spawning that command bare, and through the sandbox layer alone, cold and warm
#     (spawn-bench).
#  3. With BASE_BUILD=DIR (another build of olp-fcgi, e.g. of an earlier commit): the same
#     round trip against both, requests alternating between them, so that a change's
#     cost on the request path is read off one run (issue 9: the per-run uid and budgets
#     may add at most 1 ms).
#
# usage: tests/bench/http-bench.sh [BUILD_DIR]   (default: build/bench; configured and built each run)
# env:   BENCH_SECONDS (per wrk round, default 5), BENCH_ROUNDS (default 3),
#        BENCH_CONNS (default 16), BENCH_N (spawn/round-trip samples, default 200),
#        BENCH_SERVERS (default "lighttpd apache nginx": the /health comparisons to run),
#        BENCH_PERF=1 (perf record -g on the olp-fcgi workers during one more round),
#        BENCH_CALLGRIND=N (each side's worker under valgrind's callgrind for N requests:
#        user-space instructions per request, steady on a noisy machine, and olp's top
#        functions),
#        BENCH_STRACE=N (each side's workers under strace -f -c for N requests: system
#        calls per request, and olp's by name),
#        BENCH_RT=0 (skip the round trips and the spawn bench: 2. and 3.)
#        Context switches per request (every thread of the FastCGI processes, voluntary and
#        not, from /proc) are measured with the CPU over the same rounds.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build/bench}
secs=${BENCH_SECONDS:-5}
rounds=${BENCH_ROUNDS:-3}
conns=${BENCH_CONNS:-16}
n=${BENCH_N:-200}

command -v wrk >/dev/null || { echo "installing wrk"; apt-get install -y -q wrk >/dev/null; }
command -v lighttpd >/dev/null || { echo "lighttpd missing: run deploy/olp-local test first" >&2; exit 1; }
# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_build "$build" olp-fcgi olp-keys hello-fcgi spawn-bench
# The servers start their workers from other directories: every path absolute.
build=$(cd "$build" && pwd)

bench_workdir bench

token=bench-owner-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
mkdir -m 0700 "$work/home"
cat > "$work/home/models-registry.json" <<'JSON'
{"providers":{"bench":{"type":"command","argv":["/usr/bin/printf","ok"],"timeout_s":30,
 "models":[{"id":"instant"}]}}}
JSON
# The stored owner key every /health round sends (hello-fcgi gets it too, and ignores it).
key=$("$build/auth/olp-keys" keygen --owner --json --olp-home="$work/home" |
	sed -n 's/^ *"token": *"\([A-Za-z0-9_-]*\)",\{0,1\}$/\1/p')
[ -n "$key" ] || { echo "olp-keys keygen --owner failed" >&2; exit 1; }
mkdir -m 0700 "$work/home-base"
cp -a "$work/home/models-registry.json" "$work/home/keys" "$work/home-base/"

# start_lighttpd NAME BIN PORT [HOME]
start_lighttpd() {
	mkdir -p "$work/$1"
	OLP_BIN=$2 OLP_HOME=${4:-$work/home} OLP_RUN_DIR=$work/$1 OLP_PORT=$3 OLP_MAX_PROCS=2 \
	OLP_THREADS=16 OLP_OWNER_TOKEN=$token OLP_LOG_LEVEL=warn \
		lighttpd -D -f "$root/lighttpd/olp.conf" >"$work/$1/stdout" 2>&1 &
	pids+=($!)
	lpid[$1]=$!
	for _ in $(seq 100); do
		curl -sf "http://127.0.0.1:$3/health" >/dev/null 2>&1 && return 0
		sleep 0.05
	done
	echo "lighttpd $1 did not come up" >&2
	cat "$work/$1/stdout" >&2
	exit 1
}

# The other servers run their workers as www-data when we are root (Apache will not
# run them as root), from copies it can read.
runas=
if [ "$(id -u)" -eq 0 ]; then
	runas=www-data
	chmod 0755 "$work" # the workers (www-data) reach their home and binaries in it
fi
mkdir -m 0755 "$work/bin"
install -m 0755 "$build/fcgi/olp-fcgi" "$build/tests/bench/hello-fcgi" "$build/sandbox/olp-sandbox-exec" "$work/bin/"

# start_apache NAME BIN PORT: deploy/apache/olp.conf (mod_fcgid), OLP at /olp.
start_apache() {
	local d=$work/$1 m
	mkdir -p "$d/fcgid/sock" "$d/home"
	cp -a "$work/home/models-registry.json" "$work/home/keys" "$d/home/"
	chmod 0700 "$d/home"
	{
		echo "ServerRoot $d"; echo "Listen 127.0.0.1:$3"; echo "PidFile $d/httpd.pid"
		echo "ErrorLog $d/error.log"; echo "LogLevel warn"; echo "DefaultRuntimeDir $d"
		echo "Mutex file:$d default"; echo "ServerName 127.0.0.1"
		[ -z "$runas" ] || printf 'User %s\nGroup %s\n' "$runas" "$runas"
		for m in mpm_event authz_core alias env fcgid; do
			printf '<IfModule !%s_module>\nLoadModule %s_module /usr/lib/apache2/modules/mod_%s.so\n</IfModule>\n' "$m" "$m" "$m"
		done
		echo "Define OLP_BIN $2"; echo "Define OLP_HOME $d/home"; echo "Define OLP_FCGID_DIR $d/fcgid"
		echo "Include $root/deploy/apache/olp.conf"
		echo "FcgidInitialEnv OLP_OWNER_TOKEN $token"; echo "FcgidInitialEnv OLP_LOG_LEVEL warn"
		echo "FcgidInitialEnv OLP_SANDBOX_EXEC $work/bin/olp-sandbox-exec"
	} >"$d/httpd.conf"
	[ -z "$runas" ] || chown -R "$runas:$runas" "$d/fcgid" "$d/home"
	apache2 -DFOREGROUND -f "$d/httpd.conf" >"$d/stdout" 2>&1 &
	pids+=($!)
	wait_up "$1" "http://127.0.0.1:$3/olp/health" "$d/stdout" "$d/error.log"
	# mod_fcgid starts a process for a request that found none idle and then waited a
	# second more: load it until all 16 run, so that the rounds measure requests, not
	# process starts.
	wrk -t2 -c"$conns" -d20s -H "Authorization: Bearer $key" "http://127.0.0.1:$3/olp/health" >/dev/null
}

# start_nginx NAME BIN PORT: deploy/nginx/olp.conf, one olp-fcgi (16 threads) under
# spawn-fcgi, one nginx worker (lighttpd serves from one process too).
start_nginx() {
	local d=$work/$1 t as=()
	mkdir -p "$d/home"
	cp -a "$work/home/models-registry.json" "$work/home/keys" "$d/home/"
	chmod 0700 "$d/home"
	cp /etc/nginx/fastcgi_params "$d/"
	sed -e "s|listen 127.0.0.1:8080;|listen 127.0.0.1:$3;|" -e "s|unix:/run/olp/olp-fcgi.sock|unix:$d/fcgi.sock|" \
		"$root/deploy/nginx/olp.conf" >"$d/site.conf"
	{
		[ -z "$runas" ] || echo "user $runas $runas;"
		echo "worker_processes 1;"; echo "pid $d/nginx.pid;"; echo "error_log $d/error.log warn;"
		echo "events { worker_connections 1024; }"
		echo "http { access_log off;"
		for t in client_body fastcgi proxy uwsgi scgi; do echo "${t}_temp_path $d/${t}_temp;"; done
		echo "include $d/site.conf; }"
	} >"$d/nginx.conf"
	[ -z "$runas" ] || { chown -R "$runas:$runas" "$d/home"; as=(-u "$runas" -g "$runas" -U "$runas" -G "$runas"); }
	OLP_HOME=$d/home OLP_THREADS=16 OLP_OWNER_TOKEN=$token OLP_LOG_LEVEL=warn \
	OLP_SANDBOX_EXEC=$work/bin/olp-sandbox-exec \
		spawn-fcgi -n -s "$d/fcgi.sock" -M 0600 "${as[@]}" -- "$2" >"$d/fcgi.out" 2>&1 &
	pids+=($!)
	nginx -p "$d/" -c "$d/nginx.conf" -e "$d/error.log" -g 'daemon off;' >"$d/stdout" 2>&1 &
	pids+=($!)
	wait_up "$1" "http://127.0.0.1:$3/health" "$d/stdout" "$d/error.log" "$d/fcgi.out"
}

wait_up() {
	local name=$1 url=$2 f
	shift 2
	for _ in $(seq 200); do
		curl -sf "$url" >/dev/null 2>&1 && return 0
		sleep 0.05
	done
	echo "$name did not come up" >&2
	for f in "$@"; do cat "$f" >&2 2>/dev/null || true; done
	exit 1
}

med() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }

# round URL: one wrk round with the stored key; prints "REQ_PER_S REQUESTS". Fails on any
# answer that is not 2xx (a 401 would be faster).
round() {
	local out
	out=$(wrk -t2 -c"$conns" -d"${secs}s" -H "Authorization: Bearer $key" "$1")
	if grep -q 'Non-2xx' <<<"$out"; then
		echo "non-2xx answers from $1:" >&2
		echo "$out" >&2
		exit 1
	fi
	awk '/Requests\/sec/ {r = $2} / requests in / {n = $1} END {print r, n}' <<<"$out"
}

# med_words "V V V": med of the words.
med_words() { local v; read -ra v <<<"$1"; med "${v[@]}"; }
# ticks PID...: CPU time (user + system, clock ticks) the processes have used so far.
ticks() {
	local p t=0
	for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
	echo "$t"
}
# fcgi_pids NAME: the FastCGI processes of the lighttpd that start_lighttpd NAME started.
fcgi_pids() { pgrep -P "${lpid[$1]}" | tr '\n' ' '; }
# fcgi_ticks NAME: ticks of those processes.
fcgi_ticks() { local p; read -ra p <<<"$(fcgi_pids "$1")"; ticks "${p[@]}"; }
# csw PID...: context switches (voluntary and involuntary) of every thread of the
# processes so far.
csw() {
	local p
	for p in "$@"; do cat /proc/"$p"/task/*/status 2>/dev/null || true; done |
		awk '/^(nonv|v)oluntary_ctxt_switches:/ {s += $2} END {print s + 0}'
}
# fcgi_csw NAME: csw of lighttpd NAME's FastCGI processes.
fcgi_csw() { local p; read -ra p <<<"$(fcgi_pids "$1")"; csw "${p[@]}"; }
hz=$(getconf CLK_TCK)

# compare SERVER SIDE...: alternating rounds over the sides, then each side's median
# req/s and its ratio to hello-fcgi's. A SIDE is LABEL=URL, or LABEL=URL=NAME for one
# start_lighttpd NAME started: then the CPU its FastCGI processes and lighttpd itself
# used per request is measured over the same rounds (median of the rounds, µs).
# The labels: olp (this build), hello (hello-fcgi), base (BASE_BUILD's olp-fcgi).
compare() {
	local server=$1 sfx='' r i lbl rest url name line out rate n f0 s0 f1 s1 c0 c1 m
	local labels=() urls=() names=()
	declare -A rps=() fcpu=() scpu=() fcsw=()
	shift
	[ "$server" = lighttpd ] || sfx=_$server
	for i in "$@"; do
		lbl=${i%%=*} rest=${i#*=}
		url=${rest%%=*} name=
		[ "$url" = "$rest" ] || name=${rest#*=}
		labels+=("$lbl") urls+=("$url") names+=("$name")
	done
	echo "== GET /health with a stored owner key behind $server, wrk -t2 -c$conns -d${secs}s, $rounds alternating rounds"
	for r in $(seq "$rounds"); do
		line="round $r:"
		for i in "${!labels[@]}"; do
			lbl=${labels[$i]} name=${names[$i]}
			if [ -n "$name" ]; then
				f0=$(fcgi_ticks "$name") s0=$(ticks "${lpid[$name]}")
				c0=$(fcgi_csw "$name")
			fi
			out=$(round "${urls[$i]}")
			read -r rate n <<<"$out"
			rps[$lbl]+=" $rate"
			line+=" $lbl $rate req/s"
			if [ -n "$name" ]; then
				f1=$(fcgi_ticks "$name") s1=$(ticks "${lpid[$name]}")
				c1=$(fcgi_csw "$name")
				fcsw[$lbl]+=" $(awk -v d=$((c1 - c0)) -v n="$n" 'BEGIN {printf "%.2f", d / n}')"
				fcpu[$lbl]+=" $(awk -v d=$((f1 - f0)) -v n="$n" -v hz="$hz" 'BEGIN {printf "%.1f", d * 1e6 / hz / n}')"
				scpu[$lbl]+=" $(awk -v d=$((s1 - s0)) -v n="$n" -v hz="$hz" 'BEGIN {printf "%.1f", d * 1e6 / hz / n}')"
			fi
		done
		echo "$line"
	done
	for lbl in "${labels[@]}"; do
		echo "health_rps_$lbl$sfx $(med_words "${rps[$lbl]}")"
	done
	m=$(med_words "${rps[hello]}")
	for lbl in "${labels[@]}"; do
		[ "$lbl" != hello ] || continue
		awk -v a="$(med_words "${rps[$lbl]}")" -v b="$m" -v s="$sfx" -v l="$lbl" 'BEGIN {
			printf "health_ratio%s%s %.2f (goal >= 0.85)\n", (l == "olp" ? "" : "_" l), s, a / b }'
	done
	if [ -n "${rps[base]:-}" ]; then
		awk -v a="$(med_words "${rps[olp]}")" -v b="$(med_words "${rps[base]}")" -v s="$sfx" \
			'BEGIN {printf "health_this_over_base%s %.2f\n", s, a / b}'
	fi
	[ ${#fcpu[@]} -gt 0 ] || return 0
	echo "-- where the time went: CPU per request (µs, median of the rounds): its FastCGI processes | lighttpd"
	for lbl in "${labels[@]}"; do
		[ -n "${fcpu[$lbl]:-}" ] || continue
		printf 'cpu_us_per_req_%s %s | %s\n' "$lbl" "$(med_words "${fcpu[$lbl]}")" \
			"$(med_words "${scpu[$lbl]}")"
	done
	echo "-- context switches per request (median of the rounds): its FastCGI processes' threads"
	for lbl in "${labels[@]}"; do
		[ -n "${fcsw[$lbl]:-}" ] || continue
		printf 'cswitch_per_req_%s %s\n' "$lbl" "$(med_words "${fcsw[$lbl]}")"
	done
}

# syscalls NAME URL: lighttpd NAME's FastCGI processes under strace -f -c for BENCH_STRACE
# requests of ab -c4 at URL; prints "CALLS REQUESTS", and leaves the table in
# $work/strace-NAME.txt.
syscalls() {
	local out=$work/strace-$1.txt p args=() sp r
	for p in $(fcgi_pids "$1"); do args+=(-p "$p"); done
	strace -f -c -o "$out" "${args[@]}" 2>/dev/null &
	sp=$!
	sleep 1 # attached to every thread
	r=$(ab -q -n "$BENCH_STRACE" -c 4 -H "Authorization: Bearer $key" "$2" |
		awk '/^Complete requests:/ {print $3}')
	kill -INT "$sp"
	wait "$sp" 2>/dev/null || true
	echo "$(awk '$NF == "total" {print ($4 ~ /^[0-9]+$/ ? $4 : $3)}' "$out") $r"
}

syscalls_all() {
	local side r
	if ! command -v strace >/dev/null || ! command -v ab >/dev/null; then
		echo "== strace: strace or ab (apache2-utils) missing: skipped"
		return 0
	fi
	echo "== system calls per request: the workers under strace -f -c, $BENCH_STRACE requests (ab -c4)"
	for side in "$@"; do
		r=$(syscalls "${side%%=*}" "${side#*=}")
		awk -v s="${side%%=*}" '{printf "syscalls_per_req_%s %.1f\n", s, $1 / $2}' <<<"$r"
	done
	echo "-- olp's by name, per request"
	awk -v n="$BENCH_STRACE" 'NF >= 5 && $NF != "total" && $NF != "syscall" && $1 ~ /^[0-9.]+$/ {
		c = ($4 ~ /^[0-9]+$/ ? $4 : $3); printf "%8.2f  %s\n", c / n, $NF}' "$work/strace-olp.txt" |
		sort -rn | head -20 || true
}

# perf_profile NAME URL: one more round at URL with perf sampling lighttpd NAME's FastCGI
# processes; the symbols that took the most of their CPU (self time).
perf_profile() {
	local data=$work/perf-$1.data
	command -v perf >/dev/null || { echo "== perf: not installed: no profile"; return 0; }
	echo "== perf profile of $1's olp-fcgi workers over one more ${secs}s round (self time, top 30)"
	perf record -q -e cpu-clock -g -p "$(fcgi_pids "$1" | tr ' ' ',' | sed 's/,$//')" \
		-o "$data" -- sleep "$secs" >/dev/null 2>&1 &
	local ppid=$!
	round "$2" >/dev/null
	wait "$ppid" || { echo "perf record failed (perf_event_paranoid?): no profile"; return 0; }
	# (head ends the pipe early: with pipefail that is no failure of ours.)
	perf report -i "$data" --no-children --sort dso,symbol --stdio -g none 2>/dev/null |
		grep -v '^#' | grep -v '^$' | sed 's/ *- *- *$//' | head -30 || true
}

# callgrind NAME BIN FN: one worker of BIN (1 process, 4 threads) under callgrind behind
# lighttpd, collecting inside FN (the serving thread's function: start-up is left out),
# BENCH_CALLGRIND requests of ab -c4; prints "INSTRUCTIONS REQUESTS".
callgrind() {
	local d=$work/cg-$1 port out f=
	mkdir -p "$d/run"
	printf '#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file=%s/callgrind.out.%%p --toggle-collect=%s -q %s\n' \
		"$d" "$3" "$2" >"$d/wrap"
	chmod 0755 "$d/wrap"
	port=$(free_port)
	OLP_BIN=$d/wrap OLP_HOME=$work/home-cg OLP_RUN_DIR=$d/run OLP_PORT=$port OLP_MAX_PROCS=1 \
	OLP_THREADS=4 OLP_OWNER_TOKEN=$token OLP_LOG_LEVEL=warn \
		lighttpd -D -f "$root/lighttpd/olp.conf" >"$d/run/stdout" 2>&1 &
	local lp=$!
	for _ in $(seq 300); do
		curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
		sleep 0.1
	done
	out=$(ab -q -n "$BENCH_CALLGRIND" -c 4 -H "Authorization: Bearer $key" "http://127.0.0.1:$port/health")
	kill "$lp"
	wait "$lp" || true
	grep -q '^Non-2xx' <<<"$out" && { echo "non-2xx answers under callgrind ($1)" >&2; exit 1; }
	# The worker's file (the other is the shell that exec'd it: none), once it is written.
	for _ in $(seq 100); do
		f=$(grep -l '^totals: [1-9]' "$d"/callgrind.out.* 2>/dev/null | head -1) && [ -n "$f" ] && break
		sleep 0.1
	done
	[ -n "$f" ] || { echo "no callgrind output for $1" >&2; exit 1; }
	mv "$f" "$d/out"
	echo "$(awk '/^totals:/ {print $2}' "$d/out") $(awk '/^Complete requests:/ {print $3}' <<<"$out")"
}

callgrind_all() {
	local side bin fn r
	if ! command -v valgrind >/dev/null || ! command -v ab >/dev/null; then
		echo "== callgrind: valgrind or ab (apache2-utils) missing: skipped"
		return 0
	fi
	mkdir -m 0700 "$work/home-cg"
	cp -a "$work/home/models-registry.json" "$work/home/keys" "$work/home-cg/"
	echo "== callgrind: one worker, $BENCH_CALLGRIND requests (ab -c4); user-space instructions per request, the serving threads only"
	for side in olp hello ${BASE_BUILD:+base}; do
		case $side in
		olp) bin=$build/fcgi/olp-fcgi fn=serve_thread ;;
		hello) bin=$build/tests/bench/hello-fcgi fn=serve ;;
		base) bin=$(realpath "$BASE_BUILD")/fcgi/olp-fcgi fn=serve_thread ;;
		esac
		r=$(callgrind "$side" "$bin" "$fn")
		awk -v s="$side" '{printf "instructions_per_req_%s %d\n", s, $1 / $2}' <<<"$r"
	done
	echo "-- olp's functions by instructions per request, callees included (top 25)"
	# "  1,234 ( 5.6%)  dir/file.c:function [object]": once per function (inlined copies
	# repeat it under a shorter path), without the totals and the threads' start.
	callgrind_annotate --inclusive=yes "$work/cg-olp/out" 2>/dev/null |
		sed -nE 's/^ *([0-9,]+) \( *[0-9.]+%\) +([^ ]*:)?([^ :]+)( \[.*)?$/\1 \3/p' |
		awk -v n="$BENCH_CALLGRIND" '{v = $1; gsub(",", "", v)}
			!seen[$2]++ && $2 !~ /^(clone|start_thread|PROGRAM)$/ {printf "%8d  %s\n", v / n, $2}' |
		head -25 || true
}

declare -A lpid=()
pa=$(free_port); start_lighttpd olp "$build/fcgi/olp-fcgi" "$pa"
servers=" ${BENCH_SERVERS:-lighttpd apache nginx} "
if [[ $servers == *" lighttpd "* ]]; then
	sides=()
	pb=$(free_port); start_lighttpd hello "$build/tests/bench/hello-fcgi" "$pb"
	if [ -n "${BASE_BUILD:-}" ]; then
		pc=$(free_port)
		start_lighttpd base "$(realpath "$BASE_BUILD")/fcgi/olp-fcgi" "$pc" "$work/home-base"
		sides=("base=http://127.0.0.1:$pc/health=base")
	fi
	compare lighttpd "olp=http://127.0.0.1:$pa/health=olp" \
		"hello=http://127.0.0.1:$pb/health=hello" "${sides[@]}"
	if [ "${BENCH_PERF:-0}" = 1 ]; then
		perf_profile olp "http://127.0.0.1:$pa/health"
		[ -z "${BASE_BUILD:-}" ] || perf_profile base "http://127.0.0.1:$pc/health"
	fi
	[ "${BENCH_CALLGRIND:-0}" = 0 ] || callgrind_all
	if [ "${BENCH_STRACE:-0}" != 0 ]; then
		syscalls_all "olp=http://127.0.0.1:$pa/health" "hello=http://127.0.0.1:$pb/health" \
			${BASE_BUILD:+"base=http://127.0.0.1:$pc/health"}
	fi
fi
if [[ $servers == *" apache "* ]] && command -v apache2 >/dev/null && [ -f /usr/lib/apache2/modules/mod_fcgid.so ]; then
	p1=$(free_port); start_apache apache-olp "$work/bin/olp-fcgi" "$p1"
	p2=$(free_port); start_apache apache-hello "$work/bin/hello-fcgi" "$p2"
	compare apache "olp=http://127.0.0.1:$p1/olp/health" "hello=http://127.0.0.1:$p2/olp/health"
elif [[ $servers == *" apache "* ]]; then
	echo "== apache: not installed (apache2, libapache2-mod-fcgid): skipped"
fi
if [[ $servers == *" nginx "* ]] && command -v nginx >/dev/null && command -v spawn-fcgi >/dev/null; then
	p3=$(free_port); start_nginx nginx-olp "$work/bin/olp-fcgi" "$p3"
	p4=$(free_port); start_nginx nginx-hello "$work/bin/hello-fcgi" "$p4"
	compare nginx "olp=http://127.0.0.1:$p3/health" "hello=http://127.0.0.1:$p4/health"
elif [[ $servers == *" nginx "* ]]; then
	echo "== nginx: not installed (nginx, spawn-fcgi): skipped"
fi

[ "${BENCH_RT:-1}" != 0 ] || exit 0
echo "== non-streaming completion round trip, $n requests 50 ms apart (curl time_total), one connection each"
body='{"model":"instant","messages":[{"role":"user","content":"hi"}]}'
curl -sf -H "Authorization: Bearer $token" -H 'Content-Type: application/json' -d "$body" \
	"http://127.0.0.1:$pa/v1/chat/completions" | grep -q '"content":"ok"'
: > "$work/rt.txt"
for _ in $(seq "$n"); do
	curl -s -o /dev/null -w '%{time_total}\n' -H "Authorization: Bearer $token" \
		-H 'Content-Type: application/json' -d "$body" \
		"http://127.0.0.1:$pa/v1/chat/completions" >>"$work/rt.txt"
	sleep 0.05
done
rt=$(sort -g "$work/rt.txt" | awk '{v[NR]=$1*1000} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}')
mkdir -p "$work/spawn"
sp=$("$build/tests/bench/spawn-bench" "$work/spawn" "$n" "$build/sandbox/olp-sandbox-exec" /usr/bin/printf ok)
bare=$(awk '/bare_spawn_median_ms/ {print $2}' <<<"$sp")
cold=$(awk '/sandbox_cold_median_ms/ {print $2}' <<<"$sp")
warm=$(awk '/sandbox_warm_median_ms/ {print $2}' <<<"$sp")
echo "roundtrip_median_ms $rt"
echo "bare_spawn_median_ms $bare"
echo "sandbox_cold_median_ms $cold"
echo "sandbox_warm_median_ms $warm"
awk -v rt="$rt" -v bare="$bare" -v cold="$cold" -v warm="$warm" 'BEGIN {
	printf "overhead_vs_bare_ms %.2f (goal <= 6)\n", rt - bare
	printf "  of which the sandbox (warm) %.2f; a cold sandbox would add %.2f\n", warm - bare, cold - bare
	printf "  of which HTTP + lighttpd + worker %.2f\n", rt - warm
}'

[ -n "${BASE_BUILD:-}" ] || exit 0
if [ -z "${lpid[base]:-}" ]; then
	pc=$(free_port)
	start_lighttpd base "$(realpath "$BASE_BUILD")/fcgi/olp-fcgi" "$pc" "$work/home-base"
fi
echo "== the same round trip, this build vs BASE_BUILD, $n requests each, alternating"
: > "$work/rt-a.txt"; : > "$work/rt-b.txt"
one() {
	curl -s -o /dev/null -w '%{time_total}\n' -H "Authorization: Bearer $token" \
		-H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$1/v1/chat/completions"
}
one "$pc" >/dev/null
for _ in $(seq "$n"); do
	one "$pa" >>"$work/rt-a.txt"; sleep 0.05
	one "$pc" >>"$work/rt-b.txt"; sleep 0.05
done
mrt() { sort -g "$1" | awk '{v[NR]=$1*1000} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
ra=$(mrt "$work/rt-a.txt"); rb=$(mrt "$work/rt-b.txt")
echo "roundtrip_this_median_ms $ra"
echo "roundtrip_base_median_ms $rb"
awk -v a="$ra" -v b="$rb" 'BEGIN {printf "this_minus_base_ms %.2f (issue 9 goal <= 1)\n", a - b}'
