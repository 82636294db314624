"""fusekit's torch optimizers as DeepSpeed's client optimizer under ZeRO-2 and ZeRO-3 with the
optimizer offloaded to the CPU (2 gloo ranks on loopback, DeepSpeed's CPU accelerator; the
DeepSpeed lane of the integration tests, its own environment: requirements/deepspeed.txt).

tests/integration/deepspeed_train.py: fusekit.torch.AdamW and AdamW8bit (dynamic map and fp8 state)
against torch.optim.AdamW as the client optimizer in the same configuration: the losses of 12 steps
within 1% of torch's, torch's run must learn, the state kept as each optimizer keeps it (uint8
codes for AdamW8bit: DeepSpeed's flat partition is large); and save_checkpoint after step 7,
load_checkpoint, the last 5 steps again: the same losses bit for bit (the optimizer's state went
through DeepSpeed's checkpoint and came back whole)."""
import pytest

pytest.importorskip("deepspeed")
torch = pytest.importorskip("torch")

from launch import HERE, ranks  # noqa: E402


@pytest.mark.parametrize("stage", [2, 3], ids=["zero2", "zero3"])
def test_deepspeed_zero_offload_client_optimizers(tmp_path, stage):
    out = tmp_path / "runs.pt"
    ranks(HERE / "deepspeed_train.py", stage, tmp_path / "ckpt", out,
          env={"LOCAL_RANK": None, "DS_ACCELERATOR": "cpu"})
    runs = torch.load(out, weights_only=True)
    lt = runs["torch"]["losses"]
    assert lt[-1] < 0.8 * lt[0], lt  # the yardstick learns
    for which, run in runs.items():
        assert run["again"] == run["losses"][-len(run["again"]):], (which, run)
        if which != "torch":
            for a, b in zip(run["losses"], lt):
                assert abs(a - b) <= 0.01 * abs(b), (which, run["losses"], lt)
    assert runs["fusekit"]["state_dtype"] == "torch.float32"
    assert runs["fusekit8bit"]["state_dtype"] == "torch.uint8"
    assert runs["fusekit_fp8"]["state_dtype"] == "torch.uint8"
    assert runs["fusekit_fp8"]["state_keys"] == ["scale1", "scale2", "state1", "state2", "step"]
    assert runs["fusekit_fp8_ue3m5"]["state_dtype"] == "torch.uint8"
    assert runs["fusekit_fp8_ue3m5"]["state_keys"] == ["scale1", "scale2_ue3m5", "state1",
                                                       "state2", "step"]
