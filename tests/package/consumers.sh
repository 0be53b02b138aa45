#!/usr/bin/env bash
# Host apps built against an installed backplane alone: `meson install --destdir` of this build
# into a temporary directory, then tests/package/consumers/host_app.cpp built twice, with CMake
# (find_package(backplane), backplane::backplane) and with pkg-config (backplane.pc), each with
# only the staged tree on its search path, and run on the staged host plugin. Exits 77 (SKIP) only
# when cmake or pkg-config is not installed.
#
# pkg-config on a --destdir tree: PKG_CONFIG_SYSROOT_DIR=<destdir> (pkgconf prepends it to -I, -L
# and path variables) with PKG_CONFIG_LIBDIR=<staged pkgconfig dir> (no system .pc files, so a
# Requires on e.g. nlohmann_json fails here). `pkgconf --define-prefix` does not work with
# Debian's multiarch libdir: it derives the prefix by dropping lib/pkgconfig, which leaves
# <prefix>/lib from <prefix>/lib/x86_64-linux-gnu/pkgconfig.
#
#   consumers.sh MESON BUILD_ROOT PREFIX LIBDIR DATADIR CONSUMERS_SOURCE_DIR
set -euo pipefail

if [ $# -ne 6 ]; then
    echo "usage: consumers.sh MESON BUILD_ROOT PREFIX LIBDIR DATADIR CONSUMERS_SOURCE_DIR" >&2
    exit 2
fi
meson=$1 build=$2 prefix=$3 libdir=$4 datadir=$5 sources=$6

for tool in cmake pkg-config; do
    if ! command -v "$tool" >/dev/null; then
        echo "SKIP: $tool is not installed (Debian: apt-get install cmake pkgconf)"
        exit 77
    fi
done

# meson test points LD_LIBRARY_PATH at the build tree's libraries; a user's app has none of that.
unset LD_LIBRARY_PATH

work=$(mktemp -d "${TMPDIR:-/tmp}/backplane-consumers.XXXXXX")
trap 'rm -rf "$work"' EXIT
destdir=$work/destdir
case "$libdir" in /*) ;; *) libdir=$prefix/$libdir ;; esac
case "$datadir" in /*) ;; *) datadir=$prefix/$datadir ;; esac
staged_lib=$destdir$libdir
plugins=$staged_lib/backplane/plugins

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

echo "=== meson install --destdir $destdir"
# --no-rebuild: meson test already built what the test depends on (every installed target).
"$meson" install -C "$build" --no-rebuild --quiet --destdir "$destdir"
[ -f "$plugins/host.json" ] || fail "the staged tree has no host plugin ($plugins/host.json)"

# The sources alone, away from the source tree: nothing there is reachable by a relative path.
cp -r "$sources" "$work/src"

# Runs an app the way a user would: the staged plugins, no config file, a private cache. Checks
# that the libbackplane it loads is the staged one.
run_app() {
    local app=$1
    local loaded
    loaded=$(ldd "$app" | awk '/libbackplane\.so/ {print $3}')
    case "$loaded" in
    "$staged_lib"/*) ;;
    *) fail "$app loads libbackplane from '$loaded', not from the staged $staged_lib" ;;
    esac
    mkdir -p "$work/run"
    (cd "$work/run" && env -u BACKPLANE_CONFIG -u BACKPLANE_DEVICE -u BACKPLANE_PLUGIN_PATH \
        XDG_CONFIG_HOME="$work/run/config" BACKPLANE_CACHE_DIR="$work/run/cache" \
        BACKPLANE_PLUGIN_PATH="$plugins" "$app") || fail "$app failed"
}

echo "=== CMake host app: find_package(backplane) with CMAKE_PREFIX_PATH=$destdir$prefix"
# Ninja (which builds backplane itself): Debian's cmake only recommends make.
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake "${generator[@]}" -S "$work/src" -B "$work/cmake-build" \
    -DCMAKE_PREFIX_PATH="$destdir$prefix" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
    >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; fail "cmake configure"; }
found=$(sed -n 's/^backplane_DIR:PATH=//p' "$work/cmake-build/CMakeCache.txt")
[ "$found" = "$staged_lib/cmake/backplane" ] ||
    fail "find_package(backplane) found '$found', not the staged $staged_lib/cmake/backplane"
cmake --build "$work/cmake-build" >"$work/cmake-build.log" 2>&1 ||
    { cat "$work/cmake-build.log"; fail "cmake build"; }
run_app "$work/cmake-build/host_app"

echo "=== pkg-config host app: PKG_CONFIG_SYSROOT_DIR=$destdir"
export PKG_CONFIG_SYSROOT_DIR=$destdir PKG_CONFIG_LIBDIR=$staged_lib/pkgconfig
unset PKG_CONFIG_PATH
flags=$(pkg-config --cflags --libs backplane) || fail "pkg-config --cflags --libs backplane"
echo "pkg-config --cflags --libs backplane: $flags"
# shellcheck disable=SC2086 # the flags are words
"${CXX:-c++}" -std=c++20 -o "$work/pkg-config-app" "$work/src/host_app.cpp" $flags \
    -Wl,-rpath,"$(pkg-config --variable=libdir backplane)" || fail "building the pkg-config app"
run_app "$work/pkg-config-app"

echo "=== backplane-plugin-sdk.pc: headers only, version script and manifest template"
[ -z "$(pkg-config --libs backplane-plugin-sdk)" ] ||
    fail "backplane-plugin-sdk has Libs: $(pkg-config --libs backplane-plugin-sdk)"
sdk_data=$destdir$datadir/backplane/plugin-sdk
for variable in plugin_map manifest_template; do
    file=$(pkg-config --variable="$variable" backplane-plugin-sdk)
    case "$file" in
    "$sdk_data"/*) [ -f "$file" ] || fail "backplane-plugin-sdk: $variable: $file is missing" ;;
    *) fail "backplane-plugin-sdk: $variable='$file' is not in the staged $sdk_data" ;;
    esac
done
# shellcheck disable=SC2046
echo '#include <backplane/abi/plugin.h>' | "${CC:-cc}" -std=c99 -fsyntax-only -x c - \
    $(pkg-config --cflags backplane-plugin-sdk) || fail "plugin.h with backplane-plugin-sdk cflags"

echo "OK: the CMake and the pkg-config host apps built and ran against the installed tree alone"
