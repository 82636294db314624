"""Smoke test of ``python -m fusekit.bench``: the quick mode (small shapes, one repeat) runs every
section, checks that each LoRA path computes fusekit's update, and writes the table, the JSON and
the chart. No timing is asserted: the figures of a quick run mean nothing."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
bench = pytest.importorskip("fusekit.bench")

SECTIONS = ("lazy_adam", "embedding_bag", "adam8bit", "lora", "overhead")


def _has(mod):
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    png, js = d / "bench.png", d / "bench.json"
    threads = torch.get_num_threads()
    plot = ["--plot", str(png)] if _has("matplotlib") else ["--no-plot"]
    report = bench.run(["--quick", "--repeats", "1", "--threads", "1", "--json", str(js)] + plot)
    assert torch.get_num_threads() == threads  # --threads is undone on the way out
    return report, png, js


def test_quick_runs_every_section(quick_report):
    report, _, _ = quick_report
    sections = {r["section"] for r in report["results"]}
    assert set(SECTIONS) <= sections
    for r in report["results"]:
        assert r["seconds"] > 0 and r["repeats"] >= 1
        assert r["note"] != "MISMATCH", r  # every LoRA path computed fusekit's update
    impls = {r["impl"] for r in report["results"]}
    assert {"torch.optim.SparseAdam", "torch.optim.AdamW(fused)", "fusekit.lazy_adam (4 KiB pages)",
            "fusekit.apply_adam_w_quant", "vLLM torch bgmv (gather+einsum)",
            "fusekit.torch.FusedEmbeddingBag",
            "torch x.add_(1), 1 element"} <= impls


def test_quick_table_and_comparisons(quick_report):
    report, _, _ = quick_report
    comps = report["comparisons"]
    assert comps and all(c["speedup"] > 0 for c in comps)
    assert any(c["target"] == ">= 10x" for c in comps)
    assert any(c["target"] == "< 10 us" for c in comps)
    table = report["table"].splitlines()
    assert table[0].startswith("| case | fusekit | peer | speed-up")
    assert len(table) == 2 + len(comps)
    meta = report["meta"]
    for key in ("date", "cpu", "thp_enabled", "fusekit_threads", "torch_threads",
                "OMP_WAIT_POLICY", "versions"):
        assert key in meta
    assert meta["quick"] is True


def test_quick_writes_json_and_plot(quick_report):
    report, png, js = quick_report
    with open(js) as f:
        loaded = json.load(f)
    assert loaded["comparisons"] == json.loads(json.dumps(report["comparisons"]))
    pytest.importorskip("matplotlib")  # in the test environment (requirements/test.txt)
    assert png.exists() and png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def no_matplotlib(monkeypatch):
    """matplotlib made unimportable, as on a machine without it (None in sys.modules makes
    `import matplotlib` raise ImportError)."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_plot_without_matplotlib_is_refused_before_running(no_matplotlib, tmp_path, capsys):
    png = tmp_path / "never.png"
    with pytest.raises(SystemExit) as e:
        bench.run(["--quick", "--repeats", "1", "--plot", str(png)])
    assert e.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "matplotlib is not installed" in err and "--no-plot" in err and str(png) in err
    assert not png.exists()


def test_default_chart_without_matplotlib_is_skipped_with_a_note(no_matplotlib, quick_report,
                                                                tmp_path, capsys, monkeypatch):
    _, _, js = quick_report
    monkeypatch.setattr(bench.report, "default_plot_path", lambda: str(tmp_path / "default.png"))
    report = bench.run(["--from-json", str(js)])  # no --plot: the chart is an extra
    assert report["comparisons"]
    assert "chart not written: matplotlib is not installed" in capsys.readouterr().out
    assert not (tmp_path / "default.png").exists()


def test_only_refuses_unknown_section():
    with pytest.raises(SystemExit):
        bench.run(["--quick", "--only", "lazy_adam,nope", "--no-plot"])


def test_vllm_reference_paths_agree():
    """The three torch LoRA paths the benchmark times compute the same thing as a plain loop."""
    g = torch.Generator().manual_seed(0)
    B, H, R, W = 12, 24, 4, 3
    x = torch.randn(B, H, generator=g)
    a = torch.randn(W, R, H, generator=g)
    b = torch.randn(W, H, R, generator=g)
    idx = torch.tensor([i % W for i in range(B)])[torch.randperm(B, generator=g)]
    want = torch.zeros(B, H)
    for i in range(B):
        want[i] = 0.5 * (b[idx[i]] @ (a[idx[i]] @ x[i]))
    groups = bench.Groups(idx, W)
    for f in (lambda y: bench.vllm_add_lora(y, x, a.unsqueeze(1), b.unsqueeze(1), idx, 0.5),
              lambda y: bench.sgmv_matmul(y, x, a, b, groups, 0.5),
              lambda y: bench.grouped_bmm(y, x, a, b, groups, 0.5)):
        y = torch.zeros(B, H)
        f(y)
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)


def test_command_line_quick_overhead(tmp_path):
    """The module runs as ``python -m fusekit.bench`` (one small section, a child process), and
    ``--omp-wait-policy passive`` re-runs it with the variable set before torch is imported."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("OMP_WAIT_POLICY", None)
    p = subprocess.run([sys.executable, "-m", "fusekit.bench", "--quick", "--only", "overhead",
                        "--repeats", "1", "--no-plot", "--omp-wait-policy", "passive",
                        "--json", str(tmp_path / "o.json")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "speed-up" in p.stdout and "< 10 us" in p.stdout
    meta = json.loads((tmp_path / "o.json").read_text())["meta"]
    assert meta["OMP_NUM_THREADS"] == "1"
    assert meta["OMP_WAIT_POLICY"] == "PASSIVE"


def test_from_json_replays_without_running(quick_report, tmp_path):
    _, _, js = quick_report
    report = bench.run(["--from-json", str(js), "--no-plot"])
    assert report["comparisons"] and report["table"].startswith("| case | fusekit | peer")
    pytest.importorskip("matplotlib")
    png = tmp_path / "again.png"
    bench.run(["--from-json", str(js), "--plot", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
