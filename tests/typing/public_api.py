"""That fusekit's types are real: scripts/typecheck.sh type-checks this file with mypy, then runs
it.

`uses()` calls the public API as a user would and pins the types mypy infers with `assert_type`
(which fails on Any as on any other type). `misuses()` is never run: each of its lines is wrong,
and mypy must say so. Their `# type: ignore[code]` comments are checked under warn_unused_ignores
(pyproject.toml): were a type Any (no stub for the extension, a class hidden behind the module
`__getattr__` of fusekit.torch, no py.typed), mypy would report nothing on that line, the ignore
would be unused, and the check would fail.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from typing_extensions import assert_type

import fusekit
import fusekit.torch


def uses() -> None:
    # The extension's classes, from its generated stub (fusekit/_fusekit.pyi).
    var = np.zeros(300, np.float32)
    grad = np.ones(300, np.float32)
    m = np.zeros(300, np.float32)
    v = np.zeros(300, np.float32)
    plan = fusekit.AdamWPlan((var, grad, m, v), {"weight_decay": 0.01})
    assert_type(plan.implementation, str)
    stats = plan.run((var, grad, m, v), step=0, lr=1e-3)
    assert_type(stats, fusekit.AdamWStats)
    assert_type(stats.elements_skipped_nonfinite, int)
    assert stats.elements_skipped_nonfinite == 0 and float(var[0]) < 0.0
    try:
        plan.run((var, grad, m, v[:10]), step=1, lr=1e-3)
    except fusekit.Error as e:  # a ValueError with the aclnn status code
        assert_type(e.code, int)
        refusal: ValueError = e
        assert "v" in str(refusal)
    else:
        raise AssertionError("a v of the wrong shape was accepted")

    # fusekit.torch: the optimizers (loaded on first use at run time, visible to mypy), the LoRA
    # op and module, the memory helpers.
    model = nn.Linear(8, 4)
    opt = fusekit.torch.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    assert_type(opt, fusekit.torch.AdamW)
    base_class: torch.optim.Optimizer = opt
    model(torch.ones(2, 8)).sum().backward()
    base_class.step()
    eight = fusekit.torch.AdamW8bit(model.parameters(), min_8bit_size=1, state_format="fp8",
                                    guard_lost_v=True)
    assert_type(eight, fusekit.torch.AdamW8bit)
    eight.step()
    assert "scale1" in eight.state[model.weight]
    dense_formats: tuple[str, ...] = fusekit.STATE_FORMATS
    row_formats: tuple[str, ...] = fusekit.SPARSE_STATE_FORMATS
    assert "fp8_ue3m5" in dense_formats and "fp8_ue3m5" not in row_formats
    finer = fusekit.torch.AdamW8bit(model.parameters(), min_8bit_size=1, state_format="fp8_ue3m5")
    finer.step()
    assert "scale2_ue3m5" in finer.state[model.weight]
    table = nn.Embedding(16, 4, sparse=True)
    sparse = fusekit.torch.SparseAdam(table.parameters(), lr=1e-2)
    assert_type(sparse, fusekit.torch.SparseAdam)
    table(torch.tensor([1, 3])).sum().backward()
    sparse.step()

    lora = fusekit.torch.MultiLoRALinear(nn.Linear(8, 4), num_adapters=2, rank=2)
    assert_type(lora.in_features, int)
    y: torch.Tensor = lora(torch.ones(3, 8), torch.tensor([0, -1, 1]))  # Module.__call__: Any
    assert_type(lora.forward(torch.ones(3, 8), torch.tensor([0, -1, 1])), torch.Tensor)
    assert y.shape == (3, 4)
    out = fusekit.torch.add_lora(torch.zeros(3, 4), torch.ones(3, 8), lora.lora_b,
                                 torch.tensor([0, 1, -1]), lora.lora_a)
    assert_type(out, torch.Tensor)
    assert_type(fusekit.torch.empty_hugepage((4, 4)), torch.Tensor)
    assert_type(fusekit.torch.hugepage_backed_fraction(out), float)
    assert sorted(TORCH_NAMES) == sorted(fusekit.torch.__all__), "a new name: add it to TORCH_NAMES"


# Every public name of fusekit.torch, as mypy sees it (a name missing from the imports under
# TYPE_CHECKING there is an error here); uses() checks that this is all of __all__.
TORCH_NAMES = {
    "SparseAdam": fusekit.torch.SparseAdam,
    "LazyAdam": fusekit.torch.LazyAdam,
    "SparseAdamStats": fusekit.torch.SparseAdamStats,
    "SparseAdam8bit": fusekit.torch.SparseAdam8bit,
    "StepStats": fusekit.torch.StepStats,
    "AdamW": fusekit.torch.AdamW,
    "Adam": fusekit.torch.Adam,
    "AdamW8bit": fusekit.torch.AdamW8bit,
    "Adam8bit": fusekit.torch.Adam8bit,
    "FusedEmbeddingBag": fusekit.torch.FusedEmbeddingBag,
    "add_lora": fusekit.torch.add_lora,
    "add_lora_": fusekit.torch.add_lora_,
    "MultiLoRALinear": fusekit.torch.MultiLoRALinear,
    "empty_hugepage": fusekit.torch.empty_hugepage,
    "zeros_hugepage": fusekit.torch.zeros_hugepage,
    "to_hugepages": fusekit.torch.to_hugepages,
    "advise_hugepages": fusekit.torch.advise_hugepages,
    "hugepage_backed_fraction": fusekit.torch.hugepage_backed_fraction,
}


def misuses() -> None:
    var = np.zeros(300, np.float32)
    plan = fusekit.AdamWPlan((var, var, var, var), {})
    plan.run((var, var, var, var), step="1")  # type: ignore[arg-type]
    plan.implementation = "reference"  # type: ignore[misc]
    stats = plan.run((var, var, var, var))
    count: str = stats.elements_skipped_nonfinite  # type: ignore[assignment]
    not_impl: NotImplementedError = fusekit.Error("x")  # type: ignore[assignment]

    model = nn.Linear(8, 4)
    fusekit.torch.AdamW(model.parameters(), lr="1e-3")  # type: ignore[arg-type]
    fusekit.torch.AdamWW(model.parameters())  # type: ignore[attr-defined]
    fusekit.torch.Adam8bit(model.parameters(), guard_lost_v="yes")  # type: ignore[arg-type]
    fusekit.torch.MultiLoRALinear(model, num_adapters="2", rank=2)  # type: ignore[arg-type]
    fusekit.torch.add_lora(torch.zeros(3, 4), torch.ones(3, 8), torch.zeros(2, 1, 4, 2),
                           torch.tensor([0, 1, -1]), scale="2")  # type: ignore[arg-type]
    print(count, not_impl)


if __name__ == "__main__":
    uses()
    print("tests/typing/public_api.py: the public API ran as type-checked")
