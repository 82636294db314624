"""Multi-LoRA generation in vLLM on CPU: stock vLLM, vLLM with fusekit's plugin, and no LoRA at
all, in one run (each in a process of its own, the same model, adapters and prompts).

The model is made here, offline: a Llama of hidden 2048 (4 layers, 16 heads, 4 KV heads,
intermediate 5632, vocabulary 32000: ~340M parameters) with random weights, and three LoRA
adapters of rank 16 on all seven projections (q, k, v, o, gate, up, down), random A and B, in
PEFT's format. Prompts are random token ids (no tokenizer: vLLM runs with skip_tokenizer_init),
each generating exactly --tokens tokens (greedy, EOS ignored); the requests cycle through the three
adapters (and, with --base-every N, every Nth request has none).

    python examples/vllm/bench_multi_lora.py [--prompts 24] [--tokens 32] [--dtype bfloat16]
                                             [--repeats 3] [--rounds 1]
                                             [--json out/vllm_bench.json]

Run it with the interpreter of ``scripts/python_env.sh vllm`` and fusekit installed as a
distribution (vLLM's worker processes load plugins from entry points only), e.g.
``pip install --target SITE dist/fusekit-*.whl`` and ``PYTHONPATH=SITE``. Reports, per
configuration, the median seconds of the timed generate calls, tokens per second, the LoRA
overhead (time with mixed adapters / time without LoRA), and the seconds of each batch spent
inside the punica wrapper's LoRA methods (stock vLLM's torch ops, or fusekit's AddLora), clocked
in vLLM's worker process (``LLM.collective_rpc``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
from typing import Dict, List

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = {  # name: (enable_lora, FUSEKIT_VLLM)
    "no LoRA": (False, "0"),
    "stock vLLM LoRA": (True, "0"),
    "vLLM + fusekit": (True, "1"),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make(workdir: str, rank: int, adapters: int):
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    path = os.path.join(workdir, "model")
    if os.path.exists(os.path.join(path, "config.json")):
        return
    torch.manual_seed(20261208)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                      num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
                      max_position_embeddings=512, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(path, safe_serialization=True)
    g = torch.Generator().manual_seed(20261209)
    for k in range(adapters):
        ap = os.path.join(workdir, f"adapter{k}")
        os.makedirs(ap, exist_ok=True)
        tensors = {}
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and name.rsplit(".", 1)[-1] in TARGETS:
                tensors[f"base_model.model.{name}.lora_A.weight"] = (
                    torch.randn(rank, mod.in_features, generator=g) / mod.in_features ** 0.5)
                tensors[f"base_model.model.{name}.lora_B.weight"] = (
                    torch.randn(mod.out_features, rank, generator=g) / rank ** 0.5)
        save_file(tensors, os.path.join(ap, "adapter_model.safetensors"))
        with open(os.path.join(ap, "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank,
                       "lora_alpha": rank, "target_modules": TARGETS, "bias": "none",
                       "lora_dropout": 0.0, "base_model_name_or_path": path}, f)


def child(args):
    """One configuration, in this process: LLM, a warm-up generate, --repeats timed ones."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    enable_lora = args.child != "no LoRA"
    llm = LLM(model=os.path.join(args.workdir, "model"), dtype=args.dtype, max_model_len=256,
              enforce_eager=True, enable_lora=enable_lora, max_loras=args.adapters,
              max_lora_rank=args.rank, max_num_seqs=args.prompts, skip_tokenizer_init=True,
              gpu_memory_utilization=args.memory, seed=0)
    import random
    rnd = random.Random(20261210)
    prompts = [TokensPrompt(prompt_token_ids=[rnd.randrange(3, 32000) for _ in range(16)])
               for _ in range(args.prompts)]
    lora = None
    if enable_lora:
        lora = [None if args.base_every and i % args.base_every == args.base_every - 1 else
                LoRARequest(f"adapter{i % args.adapters}", 1 + i % args.adapters,
                            os.path.join(args.workdir, f"adapter{i % args.adapters}"))
                for i in range(args.prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, min_tokens=args.tokens,
                            ignore_eos=True, detokenize=False)
    if enable_lora:  # the LoRA methods' own time, measured inside the engine's worker
        assert all(llm.collective_rpc(_install_timer))
    llm.generate(prompts, params, lora_request=lora, use_tqdm=False)  # warm-up (loads adapters)
    times, lora_times = [], []
    for _ in range(args.repeats):
        if enable_lora:
            llm.collective_rpc(_read_timer, args=(True,))
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
        times.append(time.perf_counter() - t0)
        if enable_lora:
            lora_times.append(sum(llm.collective_rpc(_read_timer, args=(True,))))
        assert all(len(o.outputs[0].token_ids) == args.tokens for o in outs)
    print("RESULT " + json.dumps({"times": times, "lora_method_times": lora_times}), flush=True)


def _install_timer(worker):
    """Run in vLLM's worker process (LLM.collective_rpc): wraps PunicaWrapperCPU's LoRA entry
    points, whichever they are there (vLLM's, or fusekit's once the plugin has patched them), with
    a clock. Nested calls (stock add_lora_linear calls add_shrink and add_expand) count once."""
    import time as _time

    from vllm.lora.punica_wrapper import punica_cpu

    cls = punica_cpu.PunicaWrapperCPU
    if hasattr(cls, "_bench_total"):
        return True
    total, depth = [0.0], [0]
    cls._bench_total = total
    for name in ("add_lora_linear", "add_lora_logits", "add_lora_embedding", "add_shrink",
                 "add_expand"):
        fn = getattr(cls, name)

        def timed(*a, __fn=fn, **kw):
            depth[0] += 1
            t0 = _time.perf_counter()
            try:
                return __fn(*a, **kw)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    total[0] += _time.perf_counter() - t0

        setattr(cls, name, timed)
    return True


def _read_timer(worker, reset):
    """Run in the worker: the seconds spent in the LoRA methods since the last reset."""
    from vllm.lora.punica_wrapper import punica_cpu

    total = punica_cpu.PunicaWrapperCPU._bench_total
    got = total[0]
    if reset:
        total[0] = 0.0
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--adapters", type=int, default=3)
    ap.add_argument("--base-every", type=int, default=0,
                    help="every Nth request without an adapter (0: none)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the three configurations in turn this many times (a process each)")
    ap.add_argument("--memory", type=float, default=0.1,
                    help="vLLM's gpu_memory_utilization: on CPU, the fraction of host memory "
                         "it reserves")
    ap.add_argument("--workdir", default=str(ROOT / "out" / "vllm_bench"))
    ap.add_argument("--json", default=str(ROOT / "out" / "vllm_bench.json"))
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    os.makedirs(args.workdir, exist_ok=True)
    t0 = time.perf_counter()
    make(args.workdir, args.rank, args.adapters)
    print(f"model and adapters in {args.workdir} ({time.perf_counter() - t0:.0f} s)", flush=True)
    runs: Dict[str, Dict[str, List[float]]] = {
        name: {"times": [], "lora_method_times": []} for name in CONFIGS}
    round_overhead: Dict[str, List[float]] = {"stock vLLM LoRA": [], "vLLM + fusekit": []}
    for rnd in range(args.rounds):  # configurations in turn, round after round: drift hits all
        round_median = {}
        for name, (_, flag) in CONFIGS.items():
            # A function sent to the worker (collective_rpc) needs vLLM's pickle-based
            # serialization.
            env = dict(os.environ, FUSEKIT_VLLM=flag, VLLM_TARGET_DEVICE="cpu",
                       VLLM_ALLOW_INSECURE_SERIALIZATION="1")
            p = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child", name],
                               env=env, capture_output=True, text=True)
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            if p.returncode != 0 or line is None:
                sys.exit(f"{name}: failed (exit {p.returncode})\n{p.stdout[-3000:]}\n"
                         f"{p.stderr[-6000:]}")
            if flag == "1" and "runs LoRA on fusekit's AddLora" not in p.stdout + p.stderr:
                sys.exit(f"{name}: the fusekit plugin did not load (is fusekit installed as a "
                         "distribution, with its entry point?)")
            got = json.loads(line[len("RESULT "):])
            runs[name]["times"] += got["times"]
            runs[name]["lora_method_times"] += got["lora_method_times"]
            round_median[name] = statistics.median(got["times"])
            print(f"  round {rnd + 1}/{args.rounds} {name}: {round_median[name]:.2f} s per batch",
                  flush=True)
        for name in round_overhead:
            round_overhead[name].append(round_median[name] / round_median["no LoRA"])
    results = {}
    for name in CONFIGS:
        times = runs[name]["times"]
        med = statistics.median(times)
        results[name] = {"times_s": times, "median_s": med,
                         "tokens_per_s": args.prompts * args.tokens / med}
        extra = ""
        if runs[name]["lora_method_times"]:
            lt = runs[name]["lora_method_times"]
            results[name].update(lora_methods_s=lt, lora_methods_median_s=statistics.median(lt))
            extra = f", {statistics.median(lt):.2f} s of it in the LoRA methods"
        print(f"{name:>18}: {med:.2f} s per batch (median of {len(times)}), "
              f"{results[name]['tokens_per_s']:.1f} tokens/s{extra}", flush=True)
    base = results["no LoRA"]["median_s"]
    for name in ("stock vLLM LoRA", "vLLM + fusekit"):
        results[name]["lora_overhead"] = results[name]["median_s"] / base
        results[name]["lora_overhead_per_round"] = round_overhead[name]
        print(f"{name:>18}: LoRA overhead {results[name]['lora_overhead']:.2f}x (time / no LoRA; "
              f"per round: {', '.join(f'{r:.2f}x' for r in round_overhead[name])})")
    speedup = results["stock vLLM LoRA"]["median_s"] / results["vLLM + fusekit"]["median_s"]
    print(f"fusekit plugin vs stock vLLM LoRA: {speedup:.2f}x")
    methods_ratio = (results["stock vLLM LoRA"]["lora_methods_median_s"] /
                     results["vLLM + fusekit"]["lora_methods_median_s"])
    print(f"LoRA methods' own time, stock / fusekit: {methods_ratio:.1f}x")
    import torch
    import vllm
    out = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
           "machine": {"platform": platform.platform(), "cpus": len(os.sched_getaffinity(0)),
                       "vllm": vllm.__version__, "torch": torch.__version__},
           "config": {k: v for k, v in vars(args).items() if k != "child"},
           "results": results, "plugin_vs_stock": speedup,
           "lora_methods_stock_vs_plugin": methods_ratio}
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
