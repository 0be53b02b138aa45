#!/bin/sh
# Runs `backplane devices` with a plugin whose probe segfaults next to the host plugin; expects
# exit 0, the plugin reported as probe_crashed with SIGSEGV, and host:0 still listed.
tool=$1 crashing=$2 host=$3
cache=$(mktemp -d) || exit 1
trap 'rm -rf "$cache"' EXIT
ulimit -c 0
output=$(env -u BACKPLANE_PROBE -u BACKPLANE_CONFIG BACKPLANE_CACHE_DIR="$cache" \
  BACKPLANE_PLUGIN_PATH="$crashing:$host" "$tool" devices 2>&1)
rc=$?
echo "$output"
status=0
[ "$rc" -eq 0 ] || { echo "expected exit 0, got $rc"; status=1; }
for word in probe_crashed SIGSEGV host:0; do
  case "$output" in *"$word"*) ;; *) echo "the output does not name $word"; status=1 ;; esac
done
exit $status
