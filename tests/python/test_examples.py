"""The PyTorch recommendation example (examples/python/train_recsys.py) end to end at a tiny size:
every sparse optimizer it offers (torch's SparseAdam, fusekit's, and the 8-bit ones in both state
formats) trains, its JSON report is written, and the 8-bit runs land near the float32 run (the
example's own fidelity claim, docs/torch_sparse_adam8bit.md, at a size where it runs in seconds)."""
import importlib.util
import json
import math
import pathlib

import pytest

torch = pytest.importorskip("torch")

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "train_recsys.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("train_recsys_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    import sys
    sys.path.insert(0, str(EXAMPLE.parent))  # it imports recsys_data from beside it
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    return module


def test_train_recsys_every_optimizer_at_a_tiny_size(tmp_path):
    example = _load_example()
    report = tmp_path / "recsys.json"
    example.main(["--steps", "30", "--batch", "512", "--rows", "3000,2000", "--dim", "8",
                  "--heldout", "4000", "--optimizers", "fusekit,torch,fusekit8bit,fusekit8bit_fp8",
                  "--plot", "", "--json", str(report)])
    doc = json.loads(report.read_text())
    runs = {r["label"]: r for r in doc["results"]}
    assert len(runs) == 4, list(runs)
    losses = {label: r["heldout_log_loss"] for label, r in runs.items()}
    for label, loss in losses.items():
        assert math.isfinite(loss) and 0.0 < loss < math.log(2) + 0.05, (label, loss)
    fp32 = losses["fusekit.torch.SparseAdam"]
    for label in ("fusekit.torch.SparseAdam8bit", "fusekit.torch.SparseAdam8bit fp8"):
        assert abs(losses[label] / fp32 - 1) < 0.01, (label, losses)
