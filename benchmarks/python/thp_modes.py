"""What transparent huge pages give fusekit's LazyAdam from Python, in the THP mode the machine is
in now (/sys/kernel/mm/transparent_hugepage/enabled): one step at the seed shape (table 2,000,000
x 32 float32, 564,096 unique rows) on tensors as torch allocates them, and on the same tensors
moved once with fusekit.torch.to_hugepages. Prints the median step time and the fraction of the
table's bytes the kernel backs with huge pages.

  python3 benchmarks/python/thp_modes.py [--repeats 7]

docs/python.md ("Memory pages") has the figures for always / madvise / never.
"""
import argparse
import statistics
import time

import torch

import fusekit
import fusekit.torch as ft

R, N, D = 2_000_000, 564_096, 32


def step_times(table, m, v, grad, idx, repeats):
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        fusekit.lazy_adam(table, grad, idx, m, v, step=0, lr=1e-3)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])  # the first run is the warm-up


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip()
    g = torch.Generator().manual_seed(1)
    idx = torch.randperm(R, generator=g)[:N]
    grad = torch.randn(N, D, generator=g)
    table = torch.nn.Embedding(R, D).weight.detach()
    m, v = torch.zeros(R, D), torch.zeros(R, D)
    plain = step_times(table, m, v, grad, idx, args.repeats)
    frac_plain = ft.hugepage_backed_fraction(table)
    table2, m2, v2 = (ft.to_hugepages(t) for t in (table, m, v))
    moved = step_times(table2, m2, v2, grad, idx, args.repeats)
    frac_moved = ft.hugepage_backed_fraction(table2)
    print(f"THP {mode}: torch's tensors {plain * 1e3:.1f} ms (huge pages {frac_plain:.0%}), "
          f"moved with to_hugepages {moved * 1e3:.1f} ms (huge pages {frac_moved:.0%}), "
          f"threads {fusekit.get_num_threads()}")


if __name__ == "__main__":
    main()
