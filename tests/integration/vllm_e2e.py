"""vLLM offline generation with LoRA adapters against transformers, as one script: a tiny random
Llama (made here, offline, with a tokenizer trained here), three LoRA adapters of different ranks
and target modules written in PEFT's format, and a batch that mixes all adapters with base-model
requests while every max_loras slot is occupied (the case where stock vLLM adds the last slot's
adapter to base requests). The reference is transformers with each adapter merged into the weights
(W + alpha / r * B A), greedy.

    vllm_e2e.py WORKDIR OUT     writes {"vllm": [token ids per request], "reference": [...],
                                "requests": [adapter name or None]} to OUT (torch.save)
"""
import json
import os
import sys

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
    return path, model, fast


def module_shapes(model):
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in name:
            out[name] = (mod.in_features, mod.out_features)
    return out


def make_adapters(root, base_path, model):
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(20261207)
    shapes = module_shapes(model)
    adapters = {}
    for name, (r, alpha, targets) in ADAPTERS.items():
        path = os.path.join(root, name)
        os.makedirs(path, exist_ok=True)
        tensors, merged = {}, {}
        for mod, (fin, fout) in shapes.items():
            if mod.rsplit(".", 1)[-1] not in targets:
                continue
            a = torch.randn(r, fin, generator=g) / fin ** 0.5
            b = torch.randn(fout, r, generator=g) * 2.0 / r ** 0.5  # PEFT starts B at 0: random
            tensors[f"base_model.model.{mod}.lora_A.weight"] = a.contiguous()
            tensors[f"base_model.model.{mod}.lora_B.weight"] = b.contiguous()
            merged[mod] = (alpha / r) * (b @ a)
        save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
        with open(os.path.join(path, "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r,
                       "lora_alpha": alpha, "target_modules": targets, "bias": "none",
                       "lora_dropout": 0.0, "base_model_name_or_path": base_path,
                       "fan_in_fan_out": False, "use_rslora": False, "modules_to_save": None},
                      f)
        adapters[name] = (path, merged)
    return adapters


def requests():
    """(prompt, adapter or None) for a batch that mixes every adapter with base requests."""
    names = list(ADAPTERS) + [None]
    return [(p, names[(i + k) % len(names)]) for k in range(2) for i, p in enumerate(PROMPTS)]


def reference(model, tok, adapters, reqs):
    out = []
    base = {k: v.clone() for k, v in model.state_dict().items()}
    for prompt, name in reqs:
        model.load_state_dict(base)
        if name is not None:
            sd = model.state_dict()
            with torch.no_grad():
                for mod, delta in adapters[name][1].items():
                    sd[f"{mod}.weight"] += delta
            model.load_state_dict(sd)
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                                 min_new_tokens=NEW_TOKENS, pad_token_id=2)
        out.append(gen[0, ids.shape[1]:].tolist())
    model.load_state_dict(base)
    return out


def run_vllm(base_path, adapters, reqs):
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest
    llm = LLM(model=base_path, dtype="float32", max_model_len=128, enforce_eager=True,
              enable_lora=True, max_loras=len(ADAPTERS), max_lora_rank=16, max_num_seqs=16,
              gpu_memory_utilization=0.1, seed=0)
    ids = {name: i + 1 for i, name in enumerate(ADAPTERS)}
    lora = [LoRARequest(name, ids[name], adapters[name][0]) if name else None
            for _, name in reqs]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS,
                            ignore_eos=True)
    outs = llm.generate([p for p, _ in reqs], params, lora_request=lora)
    return [list(o.outputs[0].token_ids) for o in outs]


def main():
    root, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    base_path, model, tok = make_model(root)
    adapters = make_adapters(root, base_path, model)
    reqs = requests()
    ref = reference(model, tok, adapters, reqs)
    got = run_vllm(base_path, adapters, reqs)
    torch.save({"vllm": got, "reference": ref, "requests": [n for _, n in reqs]}, out)


if __name__ == "__main__":
    main()
