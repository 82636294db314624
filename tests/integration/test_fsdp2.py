"""fusekit's torch optimizers under PyTorch FSDP2 (fully_shard), 2 gloo ranks on loopback.

- tests/integration/fsdp2_train.py: fusekit.torch.AdamW and AdamW8bit (dynamic map and fp8 state)
  against torch.optim.AdamW in the same setting (the peer a user replaces), float32 and bfloat16
  parameters, with and without CPUOffloadPolicy: the losses of 20 steps within 1% of torch's,
  torch's run must learn, AdamW's parameters close to float32 rounding, the state sharded as
  DTensors (each rank holds its half), the 8-bit state where min_8bit_size says, and the
  parameters' storage never replaced.
- tests/integration/fsdp2_dcp.py: a save through torch.distributed.checkpoint, restart in new
  processes and resume equal bit for bit to the uninterrupted run, for AdamW and AdamW8bit in
  both state formats; and the same checkpoint loaded at another world size: the float32 state
  resharded exactly, the 8-bit state (whose blocks lie inside each shard) refused.
"""
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from launch import HERE, ranks  # noqa: E402


@pytest.mark.parametrize("offload", [False, True], ids=["no_offload", "cpu_offload"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fsdp2_optimizers_match_torch_adamw(tmp_path, dtype, offload):
    out = tmp_path / "runs.pt"
    ranks(HERE / "fsdp2_train.py", dtype, int(offload), out)
    runs = torch.load(out, weights_only=True)
    theirs = runs["torch"]
    lt = theirs["losses"]
    assert lt[-1] < 0.8 * lt[0], lt  # the yardstick learns
    for which in ("fusekit", "fusekit8bit", "fusekit_fp8", "fusekit_fp8_ue3m5"):
        ours = runs[which]
        lo = ours["losses"]
        for a, b in zip(lo, lt):
            assert abs(a - b) <= 0.01 * abs(b), (which, lo, lt)
        assert ours["state_is_dtensor"] and ours["storage_kept"], which
        # Each rank's state is its shard: about half the parameters (rows split over 2 ranks,
        # unevenly), the shards adding up to the whole.
        assert ours["state_numel_all_ranks"] == ours["param_numel"], which
        assert 0.4 < ours["state_local_numel"] / ours["param_numel"] < 0.6, which
    assert runs["fusekit"]["state_8bit"] == 0
    assert runs["fusekit8bit"]["state_8bit"] == 2  # the two weights of >= 1024 elements
    assert runs["fusekit_fp8"]["state_8bit"] == 2
    assert "qmap1" in runs["fusekit8bit"]["state_keys"]
    assert runs["fusekit_fp8"]["state_keys"] == ["scale1", "scale2", "state1", "state2", "step"]
    assert runs["fusekit_fp8_ue3m5"]["state_8bit"] == 2
    assert runs["fusekit_fp8_ue3m5"]["state_keys"] == ["scale1", "scale2_ue3m5", "state1",
                                                       "state2", "step"]
    if dtype == "float32":  # torch keeps bfloat16 moments for bfloat16 parameters: not comparable
        for name, w in runs["fusekit"]["params"].items():
            torch.testing.assert_close(w, theirs["params"][name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("opt", ["adamw", "adamw8bit", "adamw8bit_fp8", "adamw8bit_fp8_ue3m5"])
def test_dcp_save_restart_resume_is_bitwise_the_uninterrupted_run(tmp_path, opt):
    """12 steps straight, against 7 steps, torch.distributed.checkpoint save (the optimizer's
    DTensor state: every rank's shard), new processes, load, 5 more steps: the same bits."""
    script = HERE / "fsdp2_dcp.py"
    ranks(script, opt, "run", 12, tmp_path / "straight.pt")
    ranks(script, opt, "save", 7, tmp_path / "ckpt")
    ranks(script, opt, "resume", 5, tmp_path / "ckpt", tmp_path / "resumed.pt")
    straight = torch.load(tmp_path / "straight.pt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)
    for name, w in straight.items():
        assert torch.equal(w, resumed[name]), name
    # The same checkpoint at world size 1: AdamW's float32 state is resharded by DCP, exactly;
    # the 8-bit state is refused by name (its absmax rows are per shard), nothing loaded.
    ranks(script, opt, "reload", 0, tmp_path / "ckpt", tmp_path / "reload.pt", world=1)
    got = torch.load(tmp_path / "reload.pt", weights_only=True)
    saved = torch.load(tmp_path / "ckpt" / "full_state.pt", weights_only=True)
    if opt == "adamw":
        assert "refused" not in got, got
        assert got["state"].keys() == saved.keys()
        for i, st in saved.items():
            for key, t in st.items():
                assert torch.equal(got["state"][i][key], t), (i, key)
    else:
        key = "absmax1" if opt == "adamw8bit" else "scale1"
        assert "refused" in got and key in got["refused"], got
