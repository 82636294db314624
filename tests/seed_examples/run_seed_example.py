#!/usr/bin/env python3
"""Extracts the C++ example program from a seed document, builds it unchanged against fusekit's
installed headers and library, runs it, and hands its output to check_<op>.py.

The program is the text from the first '#include' line to the last line that is a lone '}'
(the end of main). Exit 77 when the seed file is not there."""
import argparse
import importlib.util
import os
import subprocess
import sys


def extract_program(text):
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("#include"))
    end = max(i for i, l in enumerate(lines) if l.strip() == "}")
    return "\n".join(lines[start:end + 1]) + "\n"


def run(cmd, **kw):
    p = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if p.returncode != 0:
        sys.stdout.write(p.stdout)
        sys.stderr.write(p.stderr)
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", required=True)
    ap.add_argument("--op", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--cxx", default="c++")
    ap.add_argument("--cxxflags", default="", help="e.g. the sanitizer flags of a sanitizer build")
    a = ap.parse_args()
    if not os.path.exists(a.seed):
        print(f"seed {a.seed} not found: skipped")
        return 77
    os.makedirs(a.work, exist_ok=True)
    prefix = os.path.join(a.work, "prefix")
    run(["cmake", "--install", a.build, "--prefix", prefix])
    src = os.path.join(a.work, f"seed_{a.op}.cpp")
    with open(a.seed, encoding="utf-8") as f:
        program = extract_program(f.read())
    with open(src, "w", encoding="utf-8") as f:
        f.write(program)
    exe = os.path.join(a.work, f"seed_{a.op}")
    libdir = next(os.path.join(prefix, d) for d in ("lib", "lib64") if os.path.isdir(os.path.join(prefix, d)))
    # Built as a user would: the seed's code as it is, our installed headers and library.
    run([a.cxx, "-std=c++17", "-O1", *a.cxxflags.split(), src, "-I", os.path.join(prefix, "include"),
         "-I", os.path.join(prefix, "include", "fusekit", "cann"), "-L", libdir,
         f"-Wl,-rpath,{libdir}", "-lfusekit", "-o", exe])
    out = run([exe]).stdout
    sys.stdout.write(out)
    spec = importlib.util.spec_from_file_location(
        "check", os.path.join(os.path.dirname(os.path.abspath(__file__)), f"check_{a.op}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ok, detail = mod.check(out)
    print(("PASS: " if ok else "FAIL: ") + detail)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
