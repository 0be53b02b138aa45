#!/bin/sh
# Runs `backplane config check FILE` and expects exit 1 with a message naming FILE and PATH.
tool=$1 file=$2 path=$3
output=$("$tool" config check "$file" 2>&1)
rc=$?
echo "$output"
[ "$rc" -eq 1 ] || { echo "expected exit 1, got $rc"; exit 1; }
case "$output" in *"$file"*"$path"*) exit 0 ;; esac
echo "the message does not name $file and $path"
exit 1
