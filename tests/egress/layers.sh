#!/bin/sh
# The files of egress/ call downwards only (egress/internal.h): each object of olp_egress
# may use a symbol defined by another only when that one's rank is lower. Ranks:
#   4 forwarder (accepting, dispatching, start and stop)
#   3 upstream, connect (the modes)
#   2 conn (one connection's waits and I/O), body, answer
#   1 policy, jscan, addr, ratelimit (the subscription limits an answer announces)
#   0 http (the request head, names and addresses)
# A file not listed fails the check: a new file gets its rank here.
# Usage: layers.sh NM OBJECT...
set -u
nm_bin=$1
shift
rank() {
	case $(basename "$1") in
	forwarder.c.o) echo 4 ;;
	upstream.c.o | connect.c.o) echo 3 ;;
	conn.c.o | body.c.o | answer.c.o) echo 2 ;;
	policy.c.o | jscan.c.o | addr.c.o | ratelimit.c.o) echo 1 ;;
	http.c.o) echo 0 ;;
	*) echo "" ;;
	esac
}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
for o in "$@"; do
	r=$(rank "$o")
	if [ -z "$r" ]; then
		echo "FAIL: $(basename "$o") has no rank in $0"
		exit 1
	fi
	"$nm_bin" --defined-only -g "$o" >"$tmp/nm" || exit 1
	awk -v f="$(basename "$o")" -v r="$r" 'NF == 3 { print $3, f, r }' "$tmp/nm" >>"$tmp/defs"
	"$nm_bin" --undefined-only -g "$o" >"$tmp/nm" || exit 1
	awk -v f="$(basename "$o")" -v r="$r" '{ print $NF, f, r }' "$tmp/nm" >>"$tmp/uses"
done
[ -s "$tmp/defs" ] || { echo "FAIL: no symbols read (nm: $nm_bin)"; exit 1; }
awk 'NR == FNR { file[$1] = $2; rank[$1] = $3; next }
     ($1 in file) && rank[$1] >= $3 {
	     printf "FAIL: %s (rank %s) calls %s in %s (rank %s), not below it\n",
		    $2, $3, $1, file[$1], rank[$1]
	     bad = 1
     }
     END { exit bad }' "$tmp/defs" "$tmp/uses" || exit 1
echo "ok: $# objects, every call goes down"
