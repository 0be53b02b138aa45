#!/bin/sh
# Runs `backplane trace render FILE OUT` and expects exit 1 with a message naming FILE and PATH,
# and no OUT written.
tool=$1 file=$2 path=$3
out=${TMPDIR:-/tmp}/backplane-render-$$.svg
rm -f "$out"
output=$("$tool" trace render "$file" "$out" 2>&1)
rc=$?
echo "$output"
[ "$rc" -eq 1 ] || { echo "expected exit 1, got $rc"; exit 1; }
[ ! -e "$out" ] || { echo "$out was written"; rm -f "$out"; exit 1; }
case "$output" in *"$file"*"$path"*) exit 0 ;; esac
echo "the message does not name $file and $path"
exit 1
