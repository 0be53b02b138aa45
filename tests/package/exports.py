#!/usr/bin/env python3
"""The dynamic symbols of libbackplane.so are the public API: namespace backplane minus
backplane::detail (functions, data, typeinfo, vtables, thunks). Prints the count; fails, naming
them, on any export outside that set, and on any public symbol the version script hid
(core/libbackplane.map).

usage: exports.py LIBBACKPLANE_SO
"""
import re
import subprocess
import sys

# The kinds core/libbackplane.map exports, by mangled prefix: functions and data, qualified
# members, typeinfo / typeinfo name / vtable / VTT / TLS init and wrapper, and this-adjusting
# thunks; each followed by a nested name that starts with namespace backplane.
PUBLIC_KIND = re.compile(r"^_Z(?:T[ISVTHW]|Thn?\d+_|Tvn?\d+_n?\d+_)?N[rVKRO]*9backplane")


def first_component(rest):
    """The first component after `9backplane` ('6detail', '7Runtime'), or what stands there
    instead of a source name (an 'L' for internal linkage)."""
    digits = re.match(r"\d+", rest)
    if not digits:
        return rest[:1]
    return rest[: len(digits.group()) + int(digits.group())]


def is_public(mangled):
    match = PUBLIC_KIND.match(mangled)
    return bool(match) and first_component(mangled[match.end():]) not in ("6detail", "L")


def has_internal_linkage(mangled):
    """Anonymous namespaces, `static` (L) names in the nested name, and compiler clones (.cold,
    .isra.0): local whatever the version script says."""
    if "_GLOBAL__N" in mangled or "." in mangled:
        return True
    match = PUBLIC_KIND.match(mangled)
    rest = mangled[match.end() - len("9backplane"):]
    while True:
        if re.match(r"L\d", rest):
            return True
        component = re.match(r"B?(\d+)", rest)  # a name or an ABI tag
        if not component:
            return False
        rest = rest[component.end() + int(component.group(1)):]


def symbols(library, dynamic):
    args = ["nm", "--defined-only"] + (["-D"] if dynamic else []) + [library]
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"FAIL: {' '.join(args)}: {run.stderr.strip()}")
    out = run.stdout
    result = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            result.append((fields[1], fields[2]))
    return result


def demangle(names):
    if not names:
        return []
    out = subprocess.run(["c++filt"], input="\n".join(names) + "\n", check=True,
                         capture_output=True, text=True).stdout
    return out.splitlines()


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    library = sys.argv[1]
    exported = sorted({name for _, name in symbols(library, dynamic=True)})
    print(f"{library}: {len(exported)} exported dynamic symbols")
    failed = False

    outside = [name for name in exported if not is_public(name)]
    if outside:
        failed = True
        print(f"FAIL: {len(outside)} exported symbols outside the public API:")
        for name, plain in zip(outside, demangle(outside)):
            print(f"  {plain}    [{name}]")

    # Public names the version script made local: .symtab lists them with a lowercase type.
    # Without a .symtab (stripped), this half is skipped.
    exported_set = set(exported)
    # (u, v, w, i: unique, weak and indirect symbols, lowercase yet global.)
    hidden = sorted({name for kind, name in symbols(library, dynamic=False)
                     if kind.islower() and kind not in "uvwi" and is_public(name)
                     and not has_internal_linkage(name) and name not in exported_set})
    if hidden:
        failed = True
        print(f"FAIL: {len(hidden)} public symbols hidden (add their kind to "
              "core/libbackplane.map):")
        for name, plain in zip(hidden, demangle(hidden)):
            print(f"  {plain}    [{name}]")

    if not failed:
        print("OK: every export is public API and every public symbol is exported")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
