#!/usr/bin/env python3
"""Checks the floors of core/src against docs/architecture.md ("Floors"): every
#include "area/..." of a core/src area names an area in that area's list (all on lower floors),
or is a listed known exception. Prints each offending file and include; exits 1 if any.

    check_floors.py DOC SRC     e.g. docs/architecture.md core/src
"""
import os
import re
import sys

LINE = re.compile(r'^(\d+)\s+([a-z_]+)\s+(.*)$')
EXCEPTION = re.compile(r'^exception\s+([a-z_]+)\s*->\s*(\S+)\s+(#\d+)\b')
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SOURCES = ('.cpp', '.hpp', '.h', '.cc', '.inc')


def fail_doc(doc, why):
    print(f'{doc}: {why}', file=sys.stderr)
    sys.exit(2)


def read_floors(doc):
    """{area: (floor, set of areas it may include)}, {(area, header): issue}."""
    with open(doc, encoding='utf-8') as f:
        text = f.read()
    block = re.search(r'^```floors\n(.*?)^```', text, re.S | re.M)
    if not block:
        fail_doc(doc, 'no ```floors block')
    areas, exceptions = {}, {}
    for number, raw in enumerate(block.group(1).splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith('#'):
            continue
        if m := EXCEPTION.match(line):
            exceptions[(m.group(1), m.group(2))] = m.group(3)
        elif m := LINE.match(line):
            allowed = set() if m.group(3).strip() == '-' else set(m.group(3).split())
            if m.group(2) in areas:
                fail_doc(doc, f'floors line {number}: {m.group(2)} is listed twice')
            areas[m.group(2)] = (int(m.group(1)), allowed)
        else:
            fail_doc(doc, f'floors line {number}: cannot read "{line}" (expected '
                          '"FLOOR AREA INCLUDES..." or "exception AREA -> HEADER #ISSUE ...")')
    return areas, exceptions


def area_of(src, path):
    """The core/src area a path lies in, or None."""
    rel = os.path.relpath(os.path.normpath(path), src)
    first = rel.split(os.sep)[0]
    return None if first in ('..', '.') else first


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    doc, src = sys.argv[1], sys.argv[2]
    areas, exceptions = read_floors(doc)
    problems = []

    for area, (floor, allowed) in sorted(areas.items()):
        for other in sorted(allowed):
            if other not in areas:
                problems.append(f'{doc}: floors: {area} may include "{other}", which is no area')
            elif areas[other][0] >= floor:
                problems.append(f'{doc}: floors: {area} (floor {floor}) lists {other}, which is '
                                f'on floor {areas[other][0]}: only lower floors may be listed')
    for (area, header), issue in sorted(exceptions.items()):
        if area not in areas:
            problems.append(f'{doc}: floors: the exception {area} -> {header} ({issue}) names '
                            f'no area')

    present = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    for area in present:
        if area not in areas:
            problems.append(f'{os.path.join(src, area)}/: the area is not in the floors list of '
                            f'{doc}: give it a floor and its includes')

    used = set()
    for area in present:
        if area not in areas:
            continue
        floor, allowed = areas[area]
        for root, _, files in os.walk(os.path.join(src, area)):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(root, name)
                with open(path, encoding='utf-8', errors='replace') as f:
                    lines = f.readlines()
                for number, line in enumerate(lines, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    header = m.group(1)
                    # "../server/x.hpp" resolves from the file; "server/x.hpp" from core/src.
                    if header.startswith('.'):
                        target = os.path.join(root, header)
                    else:
                        target = os.path.join(src, header)
                    other = area_of(src, target)
                    if other is None or other == area or '/' not in header:
                        continue
                    if not os.path.isdir(os.path.join(src, other)):
                        continue  # not a core/src area ("backplane/abi/plugin.h")
                    canonical = os.path.relpath(os.path.normpath(target), src)
                    if other in allowed:
                        continue
                    if (area, canonical) in exceptions:
                        used.add((area, canonical))
                        continue
                    where = f'{path}:{number}: #include "{header}"'
                    if other not in areas:
                        problems.append(f'{where}: {other} has no floor in {doc}')
                    elif areas[other][0] >= floor:
                        problems.append(
                            f'{where}: {area} (floor {floor}) includes {other} (floor '
                            f'{areas[other][0]}), which is not below it: move what it needs down, '
                            f'or list it in {doc} as a known exception with its issue')
                    else:
                        problems.append(
                            f'{where}: {other} is below {area} but not in its list in {doc}: '
                            f'add it there if the include is meant')
    for key in sorted(set(exceptions) - used):
        problems.append(f'{doc}: floors: the exception {key[0]} -> {key[1]} ({exceptions[key]}) '
                        f'is no longer needed: remove it')

    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f'check_floors: {len(problems)} problem(s)', file=sys.stderr)
        return 1
    print(f'check_floors: {len(present)} areas, {len(used)} known exception(s), every include '
          f'on a lower floor')
    return 0


if __name__ == '__main__':
    sys.exit(main())
