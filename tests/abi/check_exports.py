#!/usr/bin/env python3
"""The installed shared library exports only the public API: every dynamic symbol it defines is an
acl*/aclnn* C function of include/acl, include/aclnn or include/aclnnop, or a fusekit:: C++ name
declared in include/fusekit. Fails listing the others (internal kernels, the thread layer, test
hooks, standard-library instantiations).

  check_exports.py LIBFUSEKIT_SO INCLUDE_DIR
"""
import pathlib
import re
import subprocess
import sys


def main():
    lib, include = sys.argv[1], pathlib.Path(sys.argv[2])
    out = subprocess.run(["nm", "-D", "--defined-only", "-C", lib], check=True,
                         capture_output=True, text=True).stdout
    public_c = "\n".join(p.read_text() for d in ("acl", "aclnn", "aclnnop")
                         for p in (include / d).glob("*.h"))
    public_cpp = "\n".join(p.read_text() for p in (include / "fusekit").glob("*.h"))
    bad = []
    count = 0
    for line in out.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) < 3 or parts[1] not in "TtWwDdBbRrVv" or len(parts[1]) != 1:
            continue
        name = parts[2]
        count += 1
        if "::" not in name:
            if not (name.startswith("acl") and re.search(r"\b%s\b" % re.escape(name), public_c)):
                bad.append(name)
            continue
        head = name.split("(")[0].replace("[abi:cxx11]", "")
        ident = head.split("::")[-1]
        if not head.startswith("fusekit::") or not re.search(r"\b%s\b" % re.escape(ident),
                                                             public_cpp):
            bad.append(name)
    if bad:
        print(f"{len(bad)} of {count} exported symbols are not public API:")
        for b in bad:
            print("  " + b)
        return 1
    print(f"{count} exported symbols, all public API")
    return 0


if __name__ == "__main__":
    sys.exit(main())
