"""Checks what the AddLora seed example (seeds/002_07365a4afa23c6b0.txt) prints.

The seed fills its float16 and int32 tensors from std::vector<float>, so each tensor's elements
are the bytes of those floats reinterpreted: x, y, weightA and weightB (all "ones") hold the
halves 0x0000, 0x3F80 (= 1.875), 0x0000, 0x3F80, ...; indices (float 0.0f) hold 0. The program
then reads back out's buffer as floats (16 floats = 32 halves: the 16 result halves, then the
untouched bytes of its own initial 1.0f values) and prints each with %f.

Expected values are computed here from those bytes with NumPy in float64, rounded once to
float16, and compared with the printed text exactly."""
import re

import numpy as np

B, H1, H2, R, W, L = 1, 16, 16, 16, 1, 1
LAYER, SCALE, Y_OFFSET = 0, 1.0, 0


def _as_halves(fill, count):
    """The first `count` float16 elements of a buffer made of float32 `fill` values."""
    raw = np.full(count, fill, dtype=np.float32).tobytes()  # the seed allocates count floats
    return np.frombuffer(raw, dtype=np.float16)[:count].astype(np.float64)


def expected_output():
    x = _as_halves(1.0, B * H1).reshape(B, H1)
    y = _as_halves(1.0, B * H2).reshape(B, H2)
    wb = _as_halves(1.0, W * L * H2 * R).reshape(W, L, H2, R)
    wa = _as_halves(1.0, W * L * R * H1).reshape(W, L, R, H1)
    idx = np.frombuffer(np.zeros(B, dtype=np.float32).tobytes(), dtype=np.int32)
    out = y.copy()
    for b in range(B):
        a = int(idx[b])
        if 0 <= a < W:
            t = wa[a, LAYER] @ x[b]
            out[b, Y_OFFSET:Y_OFFSET + H2] = y[b, Y_OFFSET:Y_OFFSET + H2] + SCALE * (wb[a, LAYER] @ t)
    out16 = out.astype(np.float16)  # one rounding, to nearest even
    # out's device buffer: B*H2 floats of 1.0f, of which the first B*H2 halves are the result.
    buf = bytearray(np.full(B * H2, 1.0, dtype=np.float32).tobytes())
    buf[:out16.nbytes] = out16.tobytes()
    return np.frombuffer(bytes(buf), dtype=np.float32)


def check(stdout):
    got = {}
    for m in re.finditer(r"mean result\[(\d+)\] is: (\S+)", stdout):
        got[int(m.group(1))] = m.group(2)
    want = expected_output()
    if sorted(got) != list(range(len(want))):
        return False, f"expected {len(want)} printed results, found indices {sorted(got)}"
    bad = [(i, got[i], "%f" % float(v)) for i, v in enumerate(want) if got[i] != "%f" % float(v)]
    if bad:
        return False, "mismatches (index, printed, expected): " + "; ".join(map(str, bad[:4]))
    return True, (f"{len(want)} printed floats match the float16 results computed from the reinterpreted "
                  f"bytes (first result halves {want[:1].view(np.float16)})")


if __name__ == "__main__":
    import sys
    ok, detail = check(sys.stdin.read())
    print(("PASS: " if ok else "FAIL: ") + detail)
    sys.exit(0 if ok else 1)
