"""The installed wheel on its own: run by scripts/check_wheel.sh in a fresh virtual environment
(NumPy and the wheel, nothing else), from a folder outside the clone, with the system's Highway
hidden from the loader. Exits non-zero, with the reason, when any check fails.

1. The system's libhwy cannot be loaded (FUSEKIT_EXPECT_HWY_HIDDEN=1): the hiding works, so an
   import below that succeeds does not owe it to the system.
2. `import fusekit` loads the installed copy (not the source tree, not a build folder), and the
   Highway it runs with, if any, is the one the wheel carries (fusekit.libs/).
3. One AdamW step through the extension's plan class (fusekit._fusekit.AdamWPlan) on random
   arrays from a recorded seed, against the same step in NumPy float64.
"""

import ctypes
import os
import sys

import numpy as np


def fail(msg):
    print(f"check_import: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


if os.environ.get("FUSEKIT_EXPECT_HWY_HIDDEN") == "1":
    try:
        ctypes.CDLL("libhwy.so.1")
    except OSError as e:
        print(f"check_import: the system's libhwy is hidden ({e})")
    else:
        fail("libhwy.so.1 still loads from the system: the hiding did not work")

try:
    import fusekit
    from fusekit import _fusekit
except ImportError as e:
    fail(f"import fusekit: {type(e).__name__}: {e}")

prefix = os.path.realpath(sys.prefix)
where = os.path.realpath(fusekit.__file__)
if not where.startswith(prefix + os.sep):
    fail(f"fusekit imported from {where}, not from this environment ({prefix})")
print(f"check_import: fusekit {fusekit.__version__} from {os.path.dirname(where)}")

with open("/proc/self/maps") as f:
    hwy = sorted({line.split()[-1] for line in f if "libhwy" in line})
for lib in hwy:
    if not os.path.realpath(lib).startswith(prefix + os.sep):
        fail(f"Highway loaded from outside the environment: {lib}")
print(f"check_import: Highway loaded from {hwy or 'nowhere (linked statically)'}")

# One AdamW step (no weight decay: the decay's order is no part of this check).
seed = 20261204
rng = np.random.default_rng(seed)
n = 1000
beta1, beta2, eps, lr, step = 0.9, 0.999, 1e-8, 1e-2, 3  # step counts from 0: t = 4
var = rng.standard_normal(n).astype(np.float32)
grad = rng.standard_normal(n).astype(np.float32)
m = (0.1 * rng.standard_normal(n)).astype(np.float32)
v = (0.01 * rng.random(n)).astype(np.float32)

t = step + 1
m64 = beta1 * m.astype(np.float64) + (1 - beta1) * grad.astype(np.float64)
v64 = beta2 * v.astype(np.float64) + (1 - beta2) * grad.astype(np.float64) ** 2
var64 = var.astype(np.float64) - lr * (m64 / (1 - beta1**t)) / (
    np.sqrt(v64 / (1 - beta2**t)) + eps)

plan = _fusekit.AdamWPlan((var, grad, m, v), dict(beta1=beta1, beta2=beta2, eps=eps))
plan.run((var, grad, m, v), step=step, lr=lr)
for name, got, want in (("m", m, m64), ("v", v, v64), ("var", var, var64)):
    bad = ~(np.abs(got - want) <= 1e-7 + 1e-5 * np.abs(want))  # NaN counts as bad
    if bad.any():
        i = int(np.argmax(bad))
        fail(f"AdamW {name}: {int(bad.sum())} of {n} elements off NumPy float64 (seed {seed}), "
             f"first [{i}]: {got[i]!r} vs {want[i]!r}")
print(f"check_import: AdamW step ({plan.implementation}) matches NumPy float64 (seed {seed})")
