#!/usr/bin/env python3
"""`backplane conformance` against the "defective" fixture (tests/fixtures/conformance): the host
plugin with five planted defects. The suite must report each defect in the case that covers it,
with a reason; report the crash and the hang as such and still run every other case; and, with
the manifest that declares them, count them as expected failures and exit 0.

usage: defective_test.py BACKPLANE_TOOL FIXTURE_DIR
"""
import json
import subprocess
import sys

PLANTED = {
    "info.strings": ("failed", ("vendor",)),
    "device.open_unknown_flags": ("failed", ("flags",)),
    "fill.unaligned_rejected": ("failed", ("success",)),
    # Under ASan the SIGSEGV is caught and the worker exits 1: a crash all the same.
    "transfer.zero_size": ("crashed", ("SIGSEGV", "exited with status 1")),
    "native.unknown_kind": ("timed_out", ("did not finish",)),
}


def run(tool, manifest):
    proc = subprocess.run([tool, "conformance", "--plugin", manifest, "--json", "--timeout", "20"],
                          capture_output=True, text=True, timeout=600)
    try:
        report = json.loads(proc.stdout)["runs"][0]
    except (ValueError, KeyError, IndexError):
        sys.exit(f"no JSON report from {manifest} (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.returncode, report


def main():
    tool, fixtures = sys.argv[1], sys.argv[2]
    listed = subprocess.run([tool, "conformance", "--list"], capture_output=True, text=True,
                            check=True).stdout.splitlines()
    all_cases = {line.split()[0] for line in listed if line.strip()}
    problems = []
    if len(all_cases) < 60:
        problems.append(f"the suite has {len(all_cases)} cases, fewer than 60")

    code, report = run(tool, f"{fixtures}/defective.json")
    results = {c["name"]: c for c in report["cases"]}
    if code != 1:
        problems.append(f"defective.json: exit {code}, expected 1 (cases failed)")
    if set(results) != all_cases:
        problems.append(f"defective.json: ran {len(results)} of {len(all_cases)} cases; missing "
                        f"{sorted(all_cases - set(results))[:10]}")
    for name, (result, words) in PLANTED.items():
        got = results.get(name)
        if got is None:
            continue
        if got["result"] != result or not any(w in got["reason"] for w in words):
            problems.append(f"{name}: {got['result']} ({got['reason']!r}), expected {result} "
                            f"with {words!r} in the reason")
    others = [n for n, c in results.items()
              if n not in PLANTED and c["result"] not in ("passed", "not_applicable")]
    if others:
        problems.append("cases without a planted defect did not pass: " +
                        "; ".join(f"{n}: {results[n]['result']} {results[n]['reason']}" for n in others))

    code, report = run(tool, f"{fixtures}/defective_expected.json")
    summary = report["summary"]
    if code != 0:
        problems.append(f"defective_expected.json: exit {code}, expected 0 (all failures declared)")
    if summary["expected_failures"] != len(PLANTED):
        problems.append(f"defective_expected.json: {summary['expected_failures']} expected "
                        f"failures, expected {len(PLANTED)}")
    if report["unknown_expected_failures"] != ["plugin.no_such_case"]:
        problems.append("defective_expected.json: the unknown name plugin.no_such_case was not "
                        f"reported: {report['unknown_expected_failures']}")

    for p in problems:
        print("FAIL:", p)
    if not problems:
        print(f"ok: {len(all_cases)} cases; the five planted defects were found and named")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
