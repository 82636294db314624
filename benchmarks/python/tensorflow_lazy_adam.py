"""fusekit.tensorflow's speed (docs/tensorflow.md, "Speed"): four measurements in one run.

1. op: FusekitResourceSparseApplyLazyAdam alone at the seed shape (table 2,000,000 x 32 float32,
   564,096 distinct rows, eager), in GB/s at 28 bytes per element plus the 4-byte index, and, with
   --cpp-bench, the C++ benchmark (benchmarks/lazy_adam_bench, BM_LazyAdam at D = 32) run right
   after in the same process tree, for the ratio.
1b. op8: FusekitResourceSparseApplyLazyAdamQuant (8-bit state, packed [R, 2, D] codes and
   [R, 2, 1] absmax) alone at the same shape, and, with --cpp-bench-quant, the C++ benchmark
   (benchmarks/lazy_adam_quant_bench, BM_LazyAdamQuant/float32/packed/D:32) right after it.
2. keras: one Keras 3 train step (model.train_on_batch) of Embedding(2_000_000, 32) -> sum -> a
   Dense head, a batch of 564,096 distinct ids, with keras.optimizers.Adam,
   fusekit.tensorflow.LazyAdam and fusekit.tensorflow.LazyAdam8bit (8-bit moments), and the bytes
   of optimizer state each holds.
3. growth: LazyAdam's train step at a fixed 65,536 touched rows and tables of 200,000 and
   2,000,000 rows: the step time should not grow with the table (no full-table copy per step).

Medians of --repeats timed runs after a warm-up. Benchmarks, not tests: nothing is asserted.

  PYTHONPATH=build-tf/python python benchmarks/python/tensorflow_lazy_adam.py \
      [--cpp-bench build/benchmarks/lazy_adam_bench]
      [--cpp-bench-quant build/benchmarks/lazy_adam_quant_bench] [--repeats 7] [--json out.json]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import fusekit.tensorflow as ft  # noqa: E402

R, N, D = 2_000_000, 564_096, 32
BYTES = N * (28 * D + 4)  # the C++ benchmark's count: m, v, var read and written, grad, index


def median_time(fn, repeats):
    fn()  # warm-up (tracing, first touch)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def op_tables(rng):
    var = tf.Variable(rng.random((R, D), dtype=np.float32) + 1)
    m = tf.Variable(tf.zeros((R, D)))
    v = tf.Variable(tf.zeros((R, D)))
    grad = tf.constant(rng.random((N, D), dtype=np.float32))
    idx = tf.constant(rng.permutation(R)[:N].astype(np.int32))
    return var, m, v, grad, idx


def bench_op(tables, repeats):
    var, m, v, grad, idx = tables
    lr = tf.constant(1e-3)

    def step():
        ft.resource_sparse_apply_lazy_adam(var, m, v, lr, grad, idx, copy_on_read=False)
    seconds = median_time(step, repeats)
    return dict(seconds=seconds, gbps=BYTES / seconds / 1e9)


def bench_cpp(path):
    """BM_LazyAdam at D = 32: the median step of its 15 iterations, from its GB/s counter."""
    out = subprocess.run([path, "--benchmark_filter=^BM_LazyAdam/D:32/",
                          "--benchmark_format=json"], capture_output=True, text=True,
                         check=True).stdout
    b = json.loads(out)["benchmarks"][0]
    return dict(name=b["name"], gbps=b["GB/s"], seconds=BYTES / (b["GB/s"] * 1e9))


def op8_tables(rng):
    import fusekit
    var = tf.Variable(rng.random((R, D), dtype=np.float32) + 1)
    codes = tf.Variable(tf.zeros((R, 2, D), tf.uint8))
    absmax = tf.Variable(tf.zeros((R, 2, 1)))
    grad = tf.constant(rng.random((N, D), dtype=np.float32))
    idx = tf.constant(rng.permutation(R)[:N].astype(np.int32))
    maps = (tf.constant(fusekit.create_dynamic_map(True)),
            tf.constant(fusekit.create_dynamic_map(False)))
    return var, codes, absmax, maps, grad, idx


def bench_op8(tables, repeats):
    var, codes, absmax, (qm, qv), grad, idx = tables
    lr = tf.constant(1e-3)

    def step():
        ft.resource_sparse_apply_lazy_adam_quant(var, codes, absmax, qm, qv, lr, grad, idx)
    return dict(seconds=median_time(step, repeats))


def bench_cpp_quant(path):
    """BM_LazyAdamQuant/float32/packed/D:32: its median step (manual time, ms)."""
    out = subprocess.run([path, "--benchmark_filter=^BM_LazyAdamQuant/float32/packed/D:32/",
                          "--benchmark_format=json"], capture_output=True, text=True,
                         check=True).stdout
    b = json.loads(out)["benchmarks"][0]
    scale = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9}[b["time_unit"]]
    return dict(name=b["name"], seconds=b["real_time"] * scale)


def sum_model(rows, seed=1):
    keras.utils.set_random_seed(seed)
    ids = keras.Input((1,), dtype="int32")
    x = keras.layers.Embedding(rows, D, name="table")(ids)
    x = keras.layers.Flatten()(x)
    out = keras.layers.Dense(1)(x)
    return keras.Model(ids, out)


def bench_keras_step(rows, n, make_optimizer, repeats, rng):
    model = sum_model(rows)
    model.compile(make_optimizer(), "mse")
    x = rng.permutation(rows)[:n].astype(np.int32).reshape(n, 1)
    y = rng.standard_normal((n, 1)).astype(np.float32)
    xt, yt = tf.constant(x), tf.constant(y)
    seconds = median_time(lambda: model.train_on_batch(xt, yt), repeats)
    state = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                for v in model.optimizer.variables)
    return seconds, state


def op_against_cpp(report, key, what, tables, bench, cpp_bench, rounds):
    """Rounds of (op, C++ benchmark) back to back, so that load from elsewhere hits both alike
    (one round of the op alone without a C++ benchmark); report[key + "_rounds"], and
    report[key + "_over_cpp"], the median ratio."""
    results = []
    for _ in range(rounds if cpp_bench else 1):
        op = bench(tables)
        cpp = cpp_bench() if cpp_bench else None
        results.append(dict(op=op, cpp=cpp))
        gbps = f", {op['gbps']:.1f} GB/s" if "gbps" in op else ""
        print(f"{what}: {op['seconds'] * 1e3:.1f} ms{gbps}" +
              (f"; C++ {cpp['name']}: {cpp['seconds'] * 1e3:.1f} ms; op / C++ = "
               f"{op['seconds'] / cpp['seconds']:.2f}" if cpp else ""), flush=True)
    report[key + "_rounds"] = results
    if cpp_bench:
        report[key + "_over_cpp"] = statistics.median(
            r["op"]["seconds"] / r["cpp"]["seconds"] for r in results)
        print(f"{key} / C++, median of {len(results)} rounds: {report[key + '_over_cpp']:.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--cpp-bench", help="path of benchmarks/lazy_adam_bench")
    parser.add_argument("--cpp-bench-quant", help="path of benchmarks/lazy_adam_quant_bench")
    parser.add_argument("--rounds", type=int, default=3, help="op / C++ rounds")
    parser.add_argument("--skip", default="", help="comma-separated: op,op8,keras,growth")
    parser.add_argument("--json")
    args = parser.parse_args()
    rng = np.random.default_rng(20261202)
    skip = set(filter(None, args.skip.split(",")))
    report = dict(date=time.strftime("%Y-%m-%d"), machine=platform.processor() or platform.machine(),
                  cpus=len(os.sched_getaffinity(0)), tensorflow=tf.__version__,
                  keras=keras.__version__)
    if "op" not in skip:
        op_against_cpp(report, "op", "op alone, seed shape", op_tables(rng),
                       lambda t: bench_op(t, args.repeats),
                       args.cpp_bench and (lambda: bench_cpp(args.cpp_bench)), args.rounds)
    if "op8" not in skip:
        op_against_cpp(report, "op8", "8-bit op alone, seed shape", op8_tables(rng),
                       lambda t: bench_op8(t, args.repeats),
                       args.cpp_bench_quant and (lambda: bench_cpp_quant(args.cpp_bench_quant)),
                       args.rounds)
    if "keras" not in skip:
        for name, make in (("keras.optimizers.Adam", keras.optimizers.Adam),
                           ("fusekit.tensorflow.LazyAdam", ft.LazyAdam),
                           ("fusekit.tensorflow.LazyAdam8bit", ft.LazyAdam8bit)):
            seconds, state = bench_keras_step(R, N, make, args.repeats, rng)
            report.setdefault("keras_step", {})[name] = seconds
            report.setdefault("keras_state_bytes", {})[name] = state
            print(f"keras step, Embedding({R}, {D}), {N} rows: {name}: {seconds * 1e3:.1f} ms, "
                  f"optimizer state {state / 2**20:.1f} MiB", flush=True)
        k = report["keras_step"]
        report["keras_speedup"] = k["keras.optimizers.Adam"] / k["fusekit.tensorflow.LazyAdam"]
        report["keras_speedup_8bit"] = (k["keras.optimizers.Adam"] /
                                        k["fusekit.tensorflow.LazyAdam8bit"])
        print(f"speed-up: {report['keras_speedup']:.1f}x (8-bit: "
              f"{report['keras_speedup_8bit']:.1f}x)", flush=True)
    if "growth" not in skip:
        for rows in (200_000, 2_000_000):
            seconds, _ = bench_keras_step(rows, 65_536, ft.LazyAdam, args.repeats, rng)
            report.setdefault("growth", {})[rows] = seconds
            print(f"LazyAdam keras step, 65,536 rows of {rows}: {seconds * 1e3:.1f} ms", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
