#!/usr/bin/env python3
"""Runs the tests listed by `meson introspect --tests` where meson itself is not usable
(the GPU machine): each with its env, workdir and timeout; exit 77 counts as SKIP."""
import json, os, shutil, subprocess, sys, time

def main():
    tests_json, log_path = sys.argv[1], sys.argv[2]
    suites = [a for i, a in enumerate(sys.argv) if i > 0 and sys.argv[i - 1] == "--suite"]
    tests = json.load(open(tests_json))
    build_dir = os.path.dirname(os.path.abspath(tests_json))  # meson runs tests there
    failed = 0
    with open(log_path, "w") as log:
        for t in tests:
            names = {s.split(":")[-1] for s in t.get("suite", [])}
            if suites and not names & set(suites):
                continue
            env = dict(os.environ)
            env.update(t.get("env", {}))
            start = time.time()
            cmd = list(t["cmd"])
            # An interpreter found at configure time on the build machine (a pyenv shim) may not
            # exist here: take this machine's one of the same name.
            if not os.path.exists(cmd[0]) and shutil.which(os.path.basename(cmd[0])):
                cmd[0] = shutil.which(os.path.basename(cmd[0]))
            try:
                p = subprocess.run(cmd, env=env, cwd=t.get("workdir") or build_dir,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   timeout=(t.get("timeout") or 300) * 2)
                rc, out = p.returncode, p.stdout.decode(errors="replace")
            except OSError as e:
                rc, out = "not_started", str(e)
            except subprocess.TimeoutExpired as e:
                rc, out = "timeout", (e.stdout or b"").decode(errors="replace")
            state = "OK" if rc == 0 else "SKIP" if rc == 77 else "FAIL"
            failed += state == "FAIL"
            line = f"{state:5} {t['name']:45} {time.time() - start:6.1f}s rc={rc}"
            print(line, flush=True)
            log.write(f"==== {line}\n{out}\n")
    print(f"{failed} failed")
    return 1 if failed else 0

sys.exit(main())
