#!/usr/bin/env bash
# deb.sh SOURCE_DIR WORK_DIR [C_COMPILER]
#
# The Debian package, end to end, on this (CI) machine:
#
#  1. builds it: a build of its own in WORK_DIR (prefix /usr, OLP_INSTALLED_PATHS=ON,
#     no tests), `cpack -G DEB`; a DESTDIR `cmake --install` of the same build has the
#     FHS layout, /var/lib/olp 0700 included;
#  2. checks `dpkg-deb --info` (name, Depends: bubblewrap, uidmap, the runtime
#     libraries, a web server as an alternative) and `dpkg-deb --contents` (every file
#     where it belongs, modes; no build-tree path compiled into the programs);
#  3. runs the postinst against a scratch root (DPKG_ROOT, no chroot): it makes the
#     system user olp, its subordinate id range above every other, /var/lib/olp 0700
#     and olp's; run again it changes nothing, and an OLP_HOME given to another user
#     stays that user's;
#  4. installs it (dpkg -i), runs `olp-sandbox --doctor` as olp, `systemd-analyze
#     verify` on the installed units (man pages included), and sends requests through
#     the packaged configuration: lighttpd with /etc/olp/lighttpd.conf, started as
#     olp-lighttpd.service would start it (its User=, Environment=, EnvironmentFile=,
#     ExecStartPre=, ExecStart=), on a free port with a scratch OLP_HOME, an owner key
#     made with the installed olp-keys;
#  5. purges it (dpkg --purge): nothing of it is left but what postrm keeps on
#     purpose, and this test removes what it made itself.
#
# Needs root and dpkg; skips (77) saying why otherwise, or when a package named olp is
# installed already (this test would replace it, then purge it).
set -euo pipefail

src=$(cd "$1" && pwd)
work=$2
cc=${3:-cc}
PKG=olp

skip() {
	echo "SKIP: $*"
	exit 77
}
[ "$(id -u)" -eq 0 ] || skip "needs root (dpkg -i, a scratch root's ownership)"
for t in dpkg dpkg-deb cpack setpriv useradd usermod curl; do
	command -v "$t" >/dev/null || skip "$t not installed"
done
if dpkg-query -W -f='${Status}' "$PKG" 2>/dev/null | grep -q 'ok installed'; then
	skip "a package named $PKG is installed on this machine already"
fi
id -u olp >/dev/null 2>&1 && user_before=1 || user_before=0
[ -e /var/lib/olp ] && home_before=1 || home_before=0

fail=0
ok() { printf 'ok   %s\n' "$*"; }
bad() {
	printf 'FAIL %s\n' "$*"
	fail=1
}
check() { # check DESCRIPTION COMMAND...
	local what=$1
	shift
	if "$@"; then ok "$what"; else bad "$what"; fi
}

tmp=$(mktemp -d /tmp/olp-deb.XXXXXX)
chmod 0755 "$tmp"
installed=0
ltpid=
# shellcheck disable=SC2317 # run by the trap
cleanup() {
	if [ -n "$ltpid" ] && kill -0 "$ltpid" 2>/dev/null; then
		kill "$ltpid" 2>/dev/null || true
		sleep 1
		kill -9 "$ltpid" 2>/dev/null || true
	fi
	if [ "$installed" = 1 ]; then
		DEBIAN_FRONTEND=noninteractive dpkg --purge "$PKG" >/dev/null 2>&1 || true
	fi
	# What the installation made and nobody had before.
	if [ "$home_before" = 0 ] && [ -d /var/lib/olp ]; then rm -rf /var/lib/olp; fi
	if [ "$user_before" = 0 ] && id -u olp >/dev/null 2>&1; then
		userdel olp 2>/dev/null || true
		sed -i '/^olp:/d' /etc/subuid /etc/subgid 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

# ---- 1. build --------------------------------------------------------------------------
echo "== building the package in $work"
cmake -S "$src" -B "$work" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	-DCMAKE_INSTALL_PREFIX=/usr -DOLP_INSTALLED_PATHS=ON -DBUILD_TESTING=OFF >/dev/null
cmake --build "$work" -j "${OLP_JOBS:-2}" >/dev/null
rm -f "$work"/*.deb
(cd "$work" && cpack -G DEB >/dev/null)
deb=$(ls "$work"/${PKG}_*.deb)
ok "built $(basename "$deb")"

DESTDIR=$tmp/destdir cmake --install "$work" >/dev/null
for f in usr/lib/olp/olp-fcgi usr/lib/olp/olp-sandbox-exec usr/bin/olp-keys usr/bin/olp-sandbox \
	usr/share/olp/models-registry.json etc/olp/lighttpd.conf lib/systemd/system/olp-lighttpd.service \
	usr/share/man/man8/olp-fcgi.8.gz; do
	[ -e "$tmp/destdir/$f" ] || bad "cmake --install: no /$f"
done
check "cmake --install: /var/lib/olp is 0700" [ "$(stat -c %a "$tmp/destdir/var/lib/olp")" = 700 ]

# ---- 2. dpkg-deb --info / --contents ---------------------------------------------------
info=$(dpkg-deb --info "$deb")
field() { dpkg-deb --field "$deb" "$1"; }
check "Package: olp" [ "$(field Package)" = olp ]
check "Architecture: $(dpkg --print-architecture)" [ "$(field Architecture)" = "$(dpkg --print-architecture)" ]
deps=$(field Depends)
for d in bubblewrap uidmap passwd 'lighttpd | apache2 | spawn-fcgi' libc6 libcap2 libfcgi0ldbl \
	libjansson4 libseccomp2 libsodium23 libsqlite3-0; do
	case ", $deps," in *", $d"[,\ ]*) ok "Depends: $d" ;; *) bad "Depends lacks $d: $deps" ;; esac
done
for s in postinst prerm postrm conffiles; do
	grep -q " $s" <<<"$info" || bad "control archive lacks $s"
done
contents=$(dpkg-deb --contents "$deb" | awk '{ print $1, $NF }')
want=(
	"-rwxr-xr-x ./usr/lib/olp/olp-fcgi"
	"-rwxr-xr-x ./usr/lib/olp/olp-sandbox-exec"
	"-rwxr-xr-x ./usr/bin/olp-keys"
	"-rwxr-xr-x ./usr/bin/olp-sandbox"
	"-rw-r--r-- ./usr/share/olp/models-registry.json"
	"-rw-r--r-- ./etc/olp/lighttpd.conf"
	"-rw-r--r-- ./etc/olp/lighttpd-cgi.conf"
	"-rw-r--r-- ./etc/olp/apache.conf"
	"-rw-r--r-- ./etc/olp/apache-cgi.conf"
	"-rw-r--r-- ./etc/olp/nginx.conf"
	"-rw-r--r-- ./etc/olp/olp.env"
	"-rw-r--r-- ./etc/logrotate.d/olp"
	"-rw-r--r-- ./lib/systemd/system/olp-lighttpd.service"
	"-rw-r--r-- ./lib/systemd/system/olp-spawn-fcgi.service"
	"-rw-r--r-- ./usr/share/man/man1/olp-keys.1.gz"
	"-rw-r--r-- ./usr/share/man/man1/olp-sandbox.1.gz"
	"-rw-r--r-- ./usr/share/man/man8/olp-fcgi.8.gz"
	"-rw-r--r-- ./usr/share/doc/olp/deploy.md"
)
for w in "${want[@]}"; do
	grep -qxF -- "$w" <<<"$contents" || bad "contents: no $w"
done
ok "contents: ${#want[@]} files where they belong"
if grep -E '\./(var|usr/etc|usr/local|home|root|tmp)/' <<<"$contents"; then
	bad "contents: files outside the package's layout (above)"
fi
mkdir "$tmp/x"
dpkg-deb -x "$deb" "$tmp/x"
dpkg-deb -e "$deb" "$tmp/control"
for f in etc/olp/lighttpd.conf etc/olp/lighttpd-cgi.conf etc/olp/apache.conf etc/olp/apache-cgi.conf \
	etc/olp/nginx.conf etc/olp/olp.env etc/logrotate.d/olp; do
	grep -qxF "/$f" "$tmp/control/conffiles" || bad "conffiles: no /$f"
done
# The programs look for their files where the package puts them, not in a build tree.
for p in usr/lib/olp/olp-fcgi usr/bin/olp-sandbox; do
	grep -qaF /usr/lib/olp/olp-sandbox-exec "$tmp/x/$p" || bad "$p: no /usr/lib/olp/olp-sandbox-exec in it"
done
grep -qaF /usr/share/olp/models-registry.json "$tmp/x/usr/lib/olp/olp-fcgi" ||
	bad "olp-fcgi: the registry path is not /usr/share/olp/models-registry.json"
if grep -qaF "$work/sandbox/olp-sandbox-exec" "$tmp/x/usr/lib/olp/olp-fcgi"; then
	bad "olp-fcgi: the build tree's olp-sandbox-exec is compiled in"
fi
ok "dpkg-deb --info and --contents checked"

# ---- 3. postinst in a scratch root ----------------------------------------------------
root=$tmp/root
mkdir -p "$root/etc"
for f in passwd group shadow gshadow subuid subgid; do
	grep -v '^olp:' "/etc/$f" >"$root/etc/$f" 2>/dev/null || : >"$root/etc/$f"
done
cp /etc/login.defs "$root/etc/"
[ -e /etc/default/useradd ] && mkdir -p "$root/etc/default" && cp /etc/default/useradd "$root/etc/default/"
DPKG_ROOT=$root sh "$tmp/control/postinst" configure
pw=$(grep '^olp:' "$root/etc/passwd" || true)
IFS=: read -r _ _ puid pgid _ phome pshell <<<"$pw"
check "postinst: system user olp (uid ${puid:-none} < 1000)" test -n "$pw" -a "${puid:-1000}" -lt 1000
check "postinst: olp's home /var/lib/olp, shell nologin" test "$phome" = /var/lib/olp -a "$pshell" = /usr/sbin/nologin
check "postinst: group olp" grep -q "^olp:x:$pgid:" "$root/etc/group"
for f in subuid subgid; do
	r=$(grep '^olp:' "$root/etc/$f" || true)
	IFS=: read -r _ base count <<<"$r"
	check "postinst: $f range for olp ($base:$count)" [ "${count:-0}" = 65536 ]
	# Above every other range.
	if awk -F: -v b="$base" '$1 != "olp" && NF >= 3 && $2 + $3 > b { exit 1 }' "$root/etc/$f"; then
		ok "postinst: olp's $f range overlaps none"
	else
		bad "postinst: olp's $f range overlaps another"
	fi
done
check "postinst: /var/lib/olp 0700 olp:olp" \
	[ "$(stat -c '%a %u %g' "$root/var/lib/olp")" = "700 $puid $pgid" ]
sums() { md5sum "$root"/etc/passwd "$root"/etc/group "$root"/etc/subuid "$root"/etc/subgid; }
before=$(sums)
chown 33:33 "$root/var/lib/olp" # given to www-data (Apache's mod_fcgid)
DPKG_ROOT=$root sh "$tmp/control/postinst" configure 0.1.0-1
check "postinst again: user, group and ranges unchanged" [ "$(sums)" = "$before" ]
check "postinst again: an OLP_HOME given to another user stays its" \
	[ "$(stat -c '%u' "$root/var/lib/olp")" = 33 ]

# ---- 4. install, doctor, systemd-analyze, a request ----------------------------------
echo "== dpkg -i"
DEBIAN_FRONTEND=noninteractive dpkg -i "$deb"
installed=1
check "dpkg -s: installed" test "$(dpkg-query -W -f='${Status}' "$PKG")" = "install ok installed"
check "user olp and its subuid range" grep -q '^olp:' /etc/subuid
if [ "$home_before" = 0 ]; then
	check "/var/lib/olp 0700 olp:olp" [ "$(stat -c '%a %U %G' /var/lib/olp)" = "700 olp olp" ]
fi
echo "== olp-sandbox --doctor, as olp"
if setpriv --reuid=olp --regid=olp --init-groups -- env HOME=/var/lib/olp /usr/bin/olp-sandbox --doctor; then
	ok "olp-sandbox --doctor as olp"
else
	bad "olp-sandbox --doctor as olp (above)"
fi
if command -v systemd-analyze >/dev/null; then
	# Any message is a failure: verify exits 0 after "unknown key …, ignoring".
	out=$(systemd-analyze verify /lib/systemd/system/olp-lighttpd.service \
		/lib/systemd/system/olp-spawn-fcgi.service 2>&1) && rc=0 || rc=$?
	if [ "$rc" = 0 ] && [ -z "$out" ]; then
		ok "systemd-analyze verify on the installed units (with their man pages)"
	else
		bad "systemd-analyze verify on the installed units: $out"
	fi
else
	echo "note: no systemd-analyze here; the installed units are not verified"
fi

# olp-lighttpd.service, as systemd would start it, but on a free port, with a scratch
# OLP_HOME and run dir (the unit's RuntimeDirectory=).
unit=/lib/systemd/system/olp-lighttpd.service
env_args=()
while read -r -a kvs; do env_args+=("${kvs[@]}"); done < <(sed -n 's/^Environment=//p' "$unit")
envfile=$(sed -n 's/^EnvironmentFile=-\{0,1\}//p' "$unit")
while IFS= read -r line; do
	case $line in '' | '#'*) ;; *=*) env_args+=("$line") ;; esac
done <"$envfile"
user=$(sed -n 's/^User=//p' "$unit")
check "the unit runs as olp" [ "$user" = olp ]
home=$tmp/home rundir=$tmp/run
install -d -m 0700 -o olp -g olp "$home" "$rundir"
printf '{"sandbox":{"warm":false}}\n' >"$home/config.json"
chown olp:olp "$home/config.json"
token=$(setpriv --reuid=olp --regid=olp --init-groups -- /usr/bin/olp-keys keygen --owner --json \
	--olp-home="$home" | sed -n 's/^ *"token": *"\([A-Za-z0-9_-]*\)".*/\1/p')
check "an owner key made with the installed olp-keys" [ -n "$token" ]
read -r -a pre <<<"$(sed -n 's/^ExecStartPre=//p' "$unit")"
read -r -a start <<<"$(sed -n 's/^ExecStart=//p' "$unit")"
up=0
for attempt in 1 2 3 4 5; do
	port=$((20000 + RANDOM % 40000))
	# env execs setpriv, which execs lighttpd: one pid, the one to stop.
	as_unit=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "${env_args[@]}" OLP_HOME="$home"
		OLP_RUN_DIR="$rundir" OLP_ACCESS_LOG="$rundir/access.log" OLP_PORT="$port"
		setpriv --reuid="$user" --regid="$user" --init-groups --)
	"${as_unit[@]}" "${pre[@]}" >/dev/null || {
		bad "ExecStartPre: ${pre[*]}"
		break
	}
	"${as_unit[@]}" "${start[@]}" >"$tmp/lighttpd.out" 2>&1 &
	ltpid=$!
	for _ in $(seq 100); do
		if curl -sf "http://127.0.0.1:$port/health/live" >/dev/null 2>&1; then
			up=1
			break 2
		fi
		kill -0 "$ltpid" 2>/dev/null || break
		sleep 0.1
	done
	kill "$ltpid" 2>/dev/null || true
	wait "$ltpid" 2>/dev/null || true
	ltpid=
	grep -q 'in use' "$tmp/lighttpd.out" || break # anything but a port taken: give up
done
if [ "$up" = 1 ]; then
	ok "lighttpd with /etc/olp/lighttpd.conf answers on 127.0.0.1:$port (attempt $attempt)"
	url=http://127.0.0.1:$port
	check "GET /health/live: 200 {\"ok\":true}" [ "$(curl -s "$url/health/live")" = '{"ok":true}' ]
	m=$(curl -s -H "Authorization: Bearer $token" "$url/v1/models")
	check "GET /v1/models lists olp-echo from /usr/share/olp" grep -q '"olp-echo"' <<<"$m"
	check "GET /v1/models without a key: 401" \
		[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/v1/models")" = 401 ]
	c=$(curl -s -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
		-d '{"model":"olp-echo","messages":[{"role":"user","content":"packaged"}]}' \
		"$url/v1/chat/completions")
	if grep -q '"content":"packaged"' <<<"$c"; then
		ok "a completion through the packaged configuration (sandboxed)"
	else
		bad "a completion through the packaged configuration: $c"
	fi
	workers=$(pgrep -u olp -f '^/usr/lib/olp/olp-fcgi' | wc -l)
	check "the workers are /usr/lib/olp/olp-fcgi, running as olp ($workers)" [ "$workers" -ge 1 ]
	check "the process started is lighttpd" [ "$(cat "/proc/$ltpid/comm" 2>/dev/null)" = lighttpd ]
	kill "$ltpid"
	wait "$ltpid" 2>/dev/null || true
	ltpid=
	for _ in $(seq 100); do
		pgrep -f '^/usr/lib/olp/olp-fcgi' >/dev/null || break
		sleep 0.1
	done
	check "nothing of it left running" \
		[ -z "$(pgrep -f '^(/usr/lib/olp/olp-fcgi|/usr/sbin/lighttpd -D -f /etc/olp/)' || true)" ]
else
	bad "lighttpd with /etc/olp/lighttpd.conf did not come up:"
	cat "$tmp/lighttpd.out"
fi

# ---- 5. purge --------------------------------------------------------------------------
echo "== dpkg --purge"
DEBIAN_FRONTEND=noninteractive dpkg --purge "$PKG"
installed=0
for p in /usr/lib/olp /usr/bin/olp-keys /usr/bin/olp-sandbox /etc/olp /etc/logrotate.d/olp \
	/lib/systemd/system/olp-lighttpd.service /usr/share/olp /usr/share/doc/olp; do
	[ ! -e "$p" ] || bad "purge left $p"
done
check "dpkg knows nothing of it" [ -z "$(dpkg-query -W -f='${Status}' "$PKG" 2>/dev/null | grep installed || true)" ]
exit $fail
