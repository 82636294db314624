"""fusekit against the peers a PyTorch user would pick, in one run, on the C++ benchmarks' shapes.

    python -m fusekit.bench [--quick] [--only lazy_adam,embedding_bag,torchrec,adam8bit,offload,
                                                  lora,overhead,omp]
                            [--repeats N] [--plot PATH] [--json PATH] [--no-plot]
                            [--omp-wait-policy inherit|passive|active|unset] [--threads N]
                            [--offload-sizes 64,512]
    python -m fusekit.bench --from-json PATH [--plot PATH]   # table and chart of a saved run

Sections (``--only`` picks some; all by default, ``omp`` not in ``--quick``):

- ``lazy_adam``: one SparseAdam step on an ``nn.Embedding``-like table, 2,000,000 x 32 float32,
  sparse gradient over 564,096 unique random rows: ``torch.optim.SparseAdam`` against
  ``fusekit.torch.SparseAdam`` (which gives the table huge pages in place), the raw
  :func:`fusekit.lazy_adam` on torch's 4 KiB-page tensors and on huge pages, and torch's fused
  dense Adam over the whole table with a dense gradient.
- ``embedding_bag``: one training step (forward, backward, optimizer) of a 1,000,000 x 32 table on
  8192 bags of 1-4 and of 40-60 ids (multi-hot): ``fusekit.torch.FusedEmbeddingBag`` (the Adam
  step fused into the backward) against ``nn.EmbeddingBag(sparse=True)`` with
  ``fusekit.torch.SparseAdam`` and with ``torch.optim.SparseAdam``; and its 8-bit state
  (``state="8bit"``, both state formats) against the float32 one (issue 32: within 1.2x).
- ``torchrec`` (in the environment of requirements/torchrec.txt; skipped where TorchRec is not
  importable): one training step of a TorchRec EmbeddingBagCollection (one 1,000,000 x 32 table,
  8192 bags of 1-4 and of 40-60 ids) under DistributedModelParallel on the CPU: fusekit's lazy
  Adam through ``fusekit.torchrec.sharders()`` against FBGEMM's CPU TBE rowwise Adagrad and the
  DENSE kernel with ``torch.optim.Adam``; and the 8-bit state (``fusekit.torch.SparseAdam8bit`` in
  backward, both state formats) against fusekit's float32 route (issue 32: within 1.2x).
- ``adam8bit``: one AdamW step on 64M float32 parameters: ``torch.optim.AdamW`` (foreach, fused),
  bitsandbytes' and torchao's ``AdamW8bit`` on the CPU (skipped, with the reason, where they do
  not run), ``fusekit.torch.AdamW8bit`` and the raw :func:`fusekit.apply_adam_w_quant`.
- ``offload``: one AdamW step of offloaded training (FSDP2's ``CPUOffloadPolicy``, DeepSpeed
  ZeRO-Offload) on 64M and 512M float32 parameters (512M where ~16 GiB is free):
  ``fusekit.torch.AdamW`` and ``AdamW8bit`` against ``torch.optim.AdamW`` (fused, foreach) and
  ``DeepSpeedCPUAdam`` (when deepspeed is importable: the environment of
  requirements/deepspeed.txt; it compiles its op once), on plain tensors and as one-rank DTensors
  (FSDP2's parameters); GB/s, and its ratio to a streaming yardstick measured in the same run
  (torch's ``a += s * b``). At 512M each peer runs beside ``fusekit.torch.AdamW`` in turn.
- ``lora``: multi-LoRA add, prefill (B=4096, H1=H2=4096, R=16, W=4) and decode (B=32, W=32, 8
  layers stepped in turn), float16 and bfloat16: ``fusekit.torch.add_lora_`` against vLLM's torch
  path (``vllm/lora/ops/torch_ops``: gather each row's A and B, einsum, a float32 shrink buffer as
  vLLM's CPU punica wrapper uses; its sgmv ops expand to the same bgmv), the sgmv style (rows
  grouped by adapter, one matmul pair per group) and a grouped bmm, both in the dtype.
- ``overhead``: microseconds per call on 1-element / 1-row problems through the Python API, with
  torch's ``x.add_(1)`` on a 1-element tensor as the yardstick; and tiny optimizer steps.
- ``omp``: whether ``OMP_WAIT_POLICY`` matters: the same short probe (a torch op, then a fusekit
  op) in child processes with the variable unset and ``passive``.

Times are medians of ``--repeats`` after a warm-up; the implementations of a case are timed in
turn, round by round (the machine is shared: a change of load reaches all of them), with a 30 ms
pause before each (torch's OpenMP threads spin ~8 ms after a parallel region) and one untimed
call (each is timed in its own steady state). The table prints each fusekit case against
each peer with the speed-up (peer time / fusekit time) and the target; ``--plot`` writes a bar
chart (default docs/python_bench.png when run from the checkout, else ./python_bench.png),
``--json`` everything.
``--quick`` runs small shapes in a few seconds (a smoke test; its figures mean nothing).

The package's modules, by concern: ``results`` (what a run records, its configuration),
``timing`` (medians after a warm-up, interleaved rounds), ``machine`` (the report's "meta" and
shared helpers), one module per section (``lazy``, ``embedding_bag``, ``torchrec_ebc``,
``adam8bit``, ``offload``, ``lora``, ``overhead``, ``omp``), ``report`` (table and chart) and
``cli`` (the command line; ``__main__`` runs it).
"""

from __future__ import annotations

from .adam8bit import bench_adam8bit
from .cli import main, run
from .embedding_bag import bench_embedding_bag
from .lazy import bench_lazy_adam
from .lora import (Groups, bench_lora, grouped_bmm, sgmv_matmul, vllm_add_lora, vllm_bgmv_expand,
                   vllm_bgmv_shrink)
from .machine import machine_info, state_bytes
from .offload import bench_offload
from .omp import bench_omp, omp_probe
from .torchrec_ebc import bench_torchrec
from .overhead import bench_overhead
from .report import default_plot_path, markdown_table, plot, print_table
from .results import SECTIONS, Comparison, Config, Recorder, Result, Skip
from .timing import Impl, measure, measure_interleaved, run_case

__all__ = [
    "SECTIONS", "Comparison", "Config", "Groups", "Impl", "Recorder", "Result", "Skip",
    "bench_adam8bit", "bench_embedding_bag", "bench_lazy_adam", "bench_lora", "bench_offload",
    "bench_omp", "bench_torchrec",
    "bench_overhead", "default_plot_path", "grouped_bmm", "machine_info", "main",
    "markdown_table", "measure", "measure_interleaved", "omp_probe", "plot", "print_table", "run",
    "run_case", "sgmv_matmul", "state_bytes", "vllm_add_lora", "vllm_bgmv_expand",
    "vllm_bgmv_shrink",
]
