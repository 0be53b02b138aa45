#!/bin/sh
# Runs `backplane config check FILE`; expects exit status RC and every PATTERN in the output.
# usage: expect_report.sh TOOL FILE RC PATTERN...
tool=$1 file=$2 want=$3
shift 3
output=$("$tool" config check "$file" 2>&1)
rc=$?
echo "$output"
status=0
[ "$rc" -eq "$want" ] || { echo "expected exit $want, got $rc"; status=1; }
for pattern in "$@"; do
    case "$output" in
    *"$pattern"*) ;;
    *) echo "missing from the report: $pattern"; status=1 ;;
    esac
done
exit $status
