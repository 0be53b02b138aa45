#!/usr/bin/env bash
# `backplane plugin new` end to end with the installed package alone: installs the build tree into
# a temporary --destdir; with the installed tool generates the skeleton (Meson and CMake flavours);
# builds each against the installed SDK only (pkg-config, find_package); checks that each exports
# bp_get_plugin_api alone, loads with one CPU device, and passes `backplane conformance`.
#
# usage: plugin_new.sh BUILD_ROOT PREFIX BINDIR LIBDIR LIBEXECDIR
# Exit 77 (SKIP) only when meson, cmake or pkg-config is missing; anything else that goes wrong fails.
set -euo pipefail

if [ $# -ne 5 ]; then
  echo "usage: $0 BUILD_ROOT PREFIX BINDIR LIBDIR LIBEXECDIR" >&2
  exit 1
fi
build_root=$1 prefix=$2 bindir=$3 libdir=$4 libexecdir=$5

for tool in meson cmake pkg-config; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIP: $tool is not installed"
    exit 77
  fi
done

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# Runs a command quietly; on failure shows its output and fails with the given reason.
run() {
  local what=$1
  shift
  if ! "$@" >"$work/last.log" 2>&1; then
    cat "$work/last.log" >&2
    fail "$what: $*"
  fi
}

work=$(mktemp -d "${TMPDIR:-/tmp}/plugin_new.XXXXXX")
trap 'rm -rf "$work"' EXIT
destdir=$work/destdir
run "meson install" meson install -C "$build_root" --destdir "$destdir" --no-rebuild

# Installed paths: BINDIR, LIBDIR... are relative to PREFIX unless absolute.
installed() {
  case $1 in
    /*) echo "$destdir$1" ;;
    *) echo "$destdir$prefix/$1" ;;
  esac
}
tool=$(installed "$bindir")/backplane
lib=$(installed "$libdir")
[ -x "$tool" ] || fail "the installed tree has no backplane tool at $tool"

# Nothing from the source or build tree, the user's config or caches: only the installed tree.
cd "$work"
unset BACKPLANE_CONFIG BACKPLANE_DEVICE BACKPLANE_PLUGIN_PATH BACKPLANE_PROBE CMAKE_PREFIX_PATH
export XDG_CONFIG_HOME=$work/config XDG_CACHE_HOME=$work/cache BACKPLANE_CACHE_DIR=$work/cache
export LD_LIBRARY_PATH=$lib # installed binaries carry no run path into a staging directory
probe_helper=$(installed "$libexecdir")/backplane/backplane-probe
if [ -x "$probe_helper" ]; then export BACKPLANE_PROBE_HELPER=$probe_helper; fi
export PKG_CONFIG_PATH=$lib/pkgconfig:$(installed share)/pkgconfig
sdk_prefix=$(pkg-config --variable=prefix backplane-plugin-sdk) ||
  fail "pkg-config does not find backplane-plugin-sdk in $lib/pkgconfig"
# A .pc with an absolute prefix is read through the staging directory as its sysroot.
case $sdk_prefix in
  "$destdir"/*) ;;
  *) export PKG_CONFIG_SYSROOT_DIR=$destdir ;;
esac

# The tool refuses bad names (exit 2, nothing created).
set +e
"$tool" plugin new Bad-Name --dir "$work/bad" >/dev/null 2>"$work/err"
status=$?
set -e
[ $status -eq 2 ] || fail "plugin new Bad-Name exited $status, expected 2"
[ ! -e "$work/bad" ] || fail "plugin new Bad-Name created $work/bad"

check_plugin() { # DIR: the built plugin in DIR/build
  local dir=$1 manifest=$1/build/demo.json library=$1/build/libbackplane_demo.so
  [ -f "$manifest" ] || fail "the build did not put the manifest next to the library: $manifest"
  [ -f "$library" ] || fail "the build made no $library"
  if command -v nm >/dev/null 2>&1; then
    exports=$(nm -D --defined-only "$library" | awk '{print $NF}' | sort | tr '\n' ' ')
    [ "$exports" = "bp_get_plugin_api " ] ||
      fail "$library exports '$exports'; the version script allows bp_get_plugin_api alone"
  fi

  # Loading: the manifest itself on the path (a build directory holds other .json files).
  if ! BACKPLANE_PLUGIN_PATH=$manifest "$tool" devices --json >"$work/devices.json" 2>"$work/err"
  then
    cat "$work/err" >&2
    fail "backplane devices --json with BACKPLANE_PLUGIN_PATH=$manifest"
  fi
  python3 - "$work/devices.json" "$manifest" <<'PY' || fail "devices --json for $manifest"
import json, sys
report = json.load(open(sys.argv[1]))
plugins = [p for p in report["plugins"] if p["manifest"] == sys.argv[2]]
assert len(plugins) == 1, "no plugin entry for the manifest: %s" % report["plugins"]
p = plugins[0]
assert p["name"] == "demo" and p["state"] == "loaded" and p["device_count"] == 1, p
devices = [d for d in report["devices"] if d["id"] == "demo:0"]
assert len(devices) == 1 and devices[0]["type"] == "cpu", report["devices"]
PY

  # CONFORMANCE: the installed `backplane conformance` must pass on the generated plugin.
  run "backplane conformance" "$tool" conformance --plugin "$manifest"
  echo "$dir: loaded; $(grep '^demo: passes' "$work/last.log")"
}

# Meson: dependency('backplane-plugin-sdk') through pkg-config.
run "plugin new --meson" "$tool" plugin new demo --meson --dir "$work/meson-demo"
for f in demo.cpp demo.json plugin.map meson.build README.md; do
  [ -f "$work/meson-demo/$f" ] || fail "plugin new --meson wrote no $f"
done
echo "// edited by its author" >>"$work/meson-demo/demo.cpp"
before=$(cat "$work/meson-demo"/* | cksum)
set +e
"$tool" plugin new demo --dir "$work/meson-demo" >/dev/null 2>"$work/err"
status=$?
set -e
[ $status -eq 2 ] || fail "plugin new over an existing skeleton exited $status, expected 2"
grep -q "refusing to overwrite" "$work/err" || fail "no clear refusal: $(cat "$work/err")"
[ "$(cat "$work/meson-demo"/* | cksum)" = "$before" ] || fail "plugin new changed existing files"
(cd "$work/meson-demo" && run "meson setup" meson setup build && run "meson compile" meson compile -C build)
check_plugin "$work/meson-demo"

# CMake: find_package(backplane) through CMAKE_PREFIX_PATH, backplane::plugin_sdk.
run "plugin new --cmake" "$tool" plugin new demo --cmake --dir "$work/cmake-demo"
(cd "$work/cmake-demo" &&
  run "cmake configure" cmake -S . -B build -DCMAKE_PREFIX_PATH="$destdir$prefix" &&
  run "cmake build" cmake --build build)
found=$(sed -n 's/^backplane_DIR:PATH=//p' "$work/cmake-demo/build/CMakeCache.txt")
case $found in
  "$destdir"/*) ;;
  *) fail "find_package(backplane) found '$found', not the installed tree under $destdir" ;;
esac
check_plugin "$work/cmake-demo"
