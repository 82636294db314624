"""Does an 8-bit second moment drift from float32's over a run? (issue #33's fidelity; the numbers
docs/torch_adam8bit.md quotes)

  PY=$(bash scripts/python_env.sh core | tail -1)
  PYTHONPATH=. $PY tools/fp8_v_ema_drift.py

Adam's v = beta2 v + (1 - beta2) g^2 with beta2 = 0.999 changes by about 1/t of itself per step
early in a run and by 0.1 % later: far less than half an ulp of an 8-bit code (1.6-3.1 % of
sqrt(v) in UE4M4). Rounding to nearest could then hold v back (v too small: longer steps) or hold
it up. This runs the EMA on stationary random gradients (64 blocks of 256 elements, each element's
scale log-uniform in [1e-4, 1e-2], normal draws, seed 20261207) three ways from zero: float32;
sqrt(v) stored in UE4M4 with a scale per block (golden/fp8_state.py, the FP8 format); v stored by
the dynamic map (golden/apply_adam_w_quant.py, bitsandbytes' format). At each checkpoint: the
stored v over float32's (median and mean over the elements) and the step's length factor
sqrt(v32 / v8) (median; above 1: longer steps than float32's). NumPy only; about 20 s."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from golden import fp8_state as fp8  # noqa: E402
from golden.apply_adam_w_quant import create_dynamic_map, nearest_code  # noqa: E402

F32 = np.float32
NB, B = 64, 256
SEED = 20261207


def main():
    qv = create_dynamic_map(False)
    rng = np.random.default_rng(SEED)
    n = NB * B
    b2, omb2 = F32(0.999), F32(1) - F32(0.999)
    sigma = (10.0 ** rng.uniform(-4, -2, size=n)).astype(F32)
    v32 = np.zeros(n, F32)
    vc, sv = np.zeros((NB, B), np.uint8), np.zeros(NB, F32)  # FP8: sqrt(v) codes, scales
    dc, da = np.zeros((NB, B), np.uint8), np.zeros(NB, F32)  # dynamic map: codes, absmax
    checks = (10, 30, 100, 250, 1000, 3000)
    print("step | FP8 (sqrt(v) in UE4M4): v / v32 median, mean; step factor | "
          "dynamic map: v / v32 median, mean; step factor")
    for t in range(1, checks[-1] + 1):
        g = (sigma * rng.standard_normal(n)).astype(F32)
        g2 = (g * g).astype(F32)
        v32 = (v32 * b2 + g2 * omb2).astype(F32)
        s = fp8.ue4m4_decode(vc) * sv[:, None]
        vv = ((s * s).reshape(-1) * b2 + g2 * omb2).astype(F32)
        vc, sv = fp8.quantize_blocks(np.sqrt(vv).reshape(NB, B), "ue4m4")
        vd = (qv[dc] * da[:, None]).reshape(-1).astype(F32)
        vvd = (vd * b2 + g2 * omb2).astype(F32).reshape(NB, B)
        da = np.max(vvd, axis=1).astype(F32)
        dc = nearest_code(qv, (vvd / da[:, None]).astype(F32), False).reshape(NB, B)
        if t in checks:
            s = fp8.ue4m4_decode(vc) * sv[:, None]
            r8 = (s * s).reshape(-1) / v32
            rd = (qv[dc] * da[:, None]).reshape(-1) / v32
            f8, fd = np.sqrt(1 / r8[r8 > 0]), np.sqrt(1 / rd[rd > 0])
            print(f"{t:5d} | {np.median(r8):.3f}, {np.mean(r8):.3f}; {np.median(f8):.3f} | "
                  f"{np.median(rd):.3f}, {np.mean(rd):.3f}; {np.median(fd):.3f}")


if __name__ == "__main__":
    main()
