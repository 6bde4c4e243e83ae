#!/usr/bin/env bash
# The size rules of issue 23 over the production C files (every module, no tests): no
# function over 80 lines or of complexity over 25 (pmccabe's modified McCabe number), no
# file over 1,200 lines, unless a comment at the spot says why: a line "size: REASON" in
# the comment above the function, or in the file's first comment for the file.
# Usage: function-size.sh SOURCE_DIR MODULE...   Exit 77 when pmccabe is not installed.
set -euo pipefail
src=$1
shift
command -v pmccabe >/dev/null || {
	echo "pmccabe is not installed (Debian package pmccabe): size rules not checked"
	exit 77
}
bad=0
files=()
for m in "$@"; do
	for f in "$src/$m"/*.c; do
		[ -e "$f" ] && files+=("$f")
	done
done
for f in "${files[@]}"; do
	n=$(wc -l <"$f")
	if [ "$n" -gt 1200 ] && ! head -n 30 "$f" | grep -q 'size:'; then
		echo "${f#"$src"/}: $n lines (over 1,200)"
		bad=1
	fi
done
# pmccabe: modified complexity, traditional, statements, first line, lines, file(line): name
while read -r cc _ _ first lines where name; do
	file=${where%%(*}
	[ "$cc" -gt 25 ] || [ "$lines" -gt 80 ] || continue
	# A "size:" line in the 15 lines above the function's first line says why.
	if sed -n "$((first > 15 ? first - 15 : 1)),${first}p" "$file" | grep -q 'size:'; then
		continue
	fi
	echo "${file#"$src"/}:$first: $name: $lines lines, complexity $cc (over 80 or 25)"
	bad=1
done < <(pmccabe "${files[@]}" 2>/dev/null)
[ $bad -eq 0 ] && echo "size rules hold over ${#files[@]} files"
exit $bad
