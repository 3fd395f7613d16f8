"""The science tools (analysis/): closed forms, hand-computed metrics, synthetic fits, and a tiny
scaling sweep that trains real models through train.py on the CPU."""
import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import quant  # noqa: E402
from analysis import analyze, compare, monitor, scaling_fit, sweep  # noqa: E402

HAS_MPL = importlib.util.find_spec("matplotlib") is not None
PLOTS = [] if HAS_MPL else ["--no-plots"]
VOCAB = 128


# ----------------------------------------------------------------------------- grid geometry
def test_level_bias_closed_forms():
    e2m1 = dict(analyze.level_bias(quant.GRIDS["e2m1"]))
    assert e2m1 == {0.5: 0.0, 1.0: 0.0, 1.5: 0.0, 2.0: -0.125, 3.0: 0.0, 4.0: -0.25}
    for grid in ("e1m2", "int4"):
        assert [b for _, b in analyze.level_bias(quant.GRIDS[grid])] == [0.0] * 6, grid


@pytest.mark.parametrize("grid", list(quant.GRIDS))
def test_measured_bias_matches_closed_form(grid):
    """quant.fake_quantize rounds each whole bin to its level, so the measured mean error is the closed form."""
    for (q, closed), (q2, measured) in zip(analyze.level_bias(quant.GRIDS[grid]), analyze.measured_bias(grid)):
        assert q == q2 and measured == pytest.approx(closed, abs=1e-6), (grid, q)


# ----------------------------------------------------------------------------- monitor
def grid_exact(spec, rows=8, seed=0):
    """Blocks of grid values times a power-of-two scale, with g_max in every block: quantization is exact."""
    gen = torch.Generator().manual_seed(seed)
    levels = torch.tensor(spec.levels)
    idx = torch.randint(0, len(levels), (rows, 4 * spec.block), generator=gen)
    x = levels[idx] * torch.where(torch.rand(idx.shape, generator=gen) < 0.5, -1.0, 1.0)
    x[:, ::spec.block] = spec.g_max
    return x * 2.0 ** torch.randint(-3, 4, (rows, 1), generator=gen).float()


@pytest.mark.parametrize("spec", [quant.QuantSpec("e2m1"), quant.QuantSpec("e1m2"),
                                  quant.QuantSpec("e2m1", 32, "e8m0"), quant.QuantSpec("int4", 16, "e8m0")])
def test_identity_on_grid_exact_data(spec):
    x = grid_exact(spec)
    x_hat = quant.fake_quantize(x, spec)
    assert torch.equal(x_hat, x)
    s = monitor.stats(x, x_hat, spec)
    assert s["alpha"] == 1.0 and s["nmse"] == 0.0 and s["sqnr_db"] == math.inf
    assert s["clipped"] == 0.0 and s["underflow"] == 0.0


@pytest.mark.parametrize("rht", [False, True])
@pytest.mark.parametrize("scale", ["fp32", "e4m3"])
def test_monitor_alpha_is_the_direct_inner_product(rht, scale):
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    spec = quant.QuantSpec("e2m1", 16, scale, rht=rht)
    x_hat = quant.fake_quantize(x, spec)
    xd, hd = x.double(), x_hat.double()
    s = monitor.stats(x, x_hat, spec)
    assert s["alpha"] == pytest.approx(float((hd * xd).sum() / (xd * xd).sum()), rel=1e-6)
    assert s["nmse"] == pytest.approx(float(((hd - xd) ** 2).sum() / (xd * xd).sum()), rel=1e-5)
    assert s["alpha"] < 0.999  # E2M1 shrinks Gaussian data
    if rht:  # the GEMM path's rotated tensor gives the same numbers
        s_rot = monitor.stats(x, quant.fake_quantize(x, spec, keep_rotated=True), spec, rotated=True)
        for key in s:
            assert s_rot[key] == pytest.approx(s[key], rel=1e-5), key


def test_monitor_clipped_and_underflow_fractions():
    block = torch.ones(32)
    block[0], block[1] = 7.5, 0.2  # e8m0: s = 2^(2-2) = 1, so 7.5 > 6 saturates and 0.2 rounds to 0
    x = block.repeat(4, 1)
    e8m0 = quant.QuantSpec("e2m1", 32, "e8m0")
    s = monitor.stats(x, quant.fake_quantize(x, e8m0), e8m0)
    assert s["clipped"] == 1 / 32 and s["underflow"] == 1 / 32
    fp32 = quant.QuantSpec("e2m1", 32, "fp32")  # s = 7.5/6: nothing clips, 0.2/1.25 = 0.16 still rounds to 0
    s = monitor.stats(x, quant.fake_quantize(x, fp32), fp32)
    assert s["clipped"] == 0.0 and s["underflow"] == 1 / 32
    rec = monitor.Recorder()
    rec("layers.0.ffn.w1", "fprop_x", x, quant.fake_quantize(x, e8m0), e8m0)
    rec("layers.1.ffn.w1", "fprop_x", x, quant.fake_quantize(x, fp32), fp32)
    assert rec.summary()["all"]["fprop_x"]["clipped"] == pytest.approx(1 / 64)
    assert rec.summary()["layers.0.ffn.w1"]["fprop_x"]["clipped"] == 1 / 32


def test_monitor_hook_in_qlinear_reports_every_role_with_direct_alpha():
    """quant.MONITOR receives each quantized operand of a QLinear; the recorded alpha equals a
    direct computation <x_hat, x>/|x|^2 on the operand quant.py quantized."""
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False))])
    holder = torch.nn.Module()
    holder.layers = layers
    quant.convert(holder, quant.recipe_from_overrides("e2m1", sr="none", rht="none"))
    seen, rec = {}, monitor.Recorder()

    def hook(layer, role, x, x_hat, spec, dim, *, signs=None, rotated=False):
        seen[role] = float((x_hat.double() * x.double()).sum() / (x.double() ** 2).sum())
        rec(layer, role, x, x_hat, spec, dim, signs=signs, rotated=rotated)

    x = torch.randn(32, 64, requires_grad=True)
    quant.MONITOR = hook
    try:
        holder.layers[0](x).square().sum().backward()
    finally:
        quant.MONITOR = None
    assert set(seen) == set(quant.ROLES)
    summary = rec.summary()["layers.0.0"]
    for role in quant.ROLES:
        assert summary[role]["alpha"] == pytest.approx(seen[role], rel=1e-6)


def test_monitor_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        monitor.stats(torch.zeros(2, 16), torch.zeros(2, 32), quant.QuantSpec())


def test_grid_command_writes_tables(tmp_path):
    analyze.main(["grid", "--rows", "16", "--out", str(tmp_path), *PLOTS])
    text = (tmp_path / "grid.md").read_text()
    assert "| e2m1 | 4 | -0.25 |" in text and "| e2m1 | 2 | -0.125 |" in text
    res = json.loads((tmp_path / "grid.json").read_text())
    assert {r["recipe"] for r in res["recipes"]} == set(quant.RECIPES) - {"bf16"}
    e2m1 = res["formats"]["e2m1/16/fp32/rtne"]["gaussian"]
    assert 0.99 < e2m1["alpha"] < 1 and 18 < e2m1["sqnr_db"] < 23
    assert (tmp_path / "grid.png").is_file() == HAS_MPL


def test_chain_gain_is_the_product_of_per_gemm_gains():
    weights = analyze.random_orthogonal(8, 128, seed=0)
    x0 = torch.randn(128, 128, generator=torch.Generator().manual_seed(0))
    e2m1 = analyze.chain(weights, x0, quant.QuantSpec("e2m1"))
    e1m2 = analyze.chain(weights, x0, quant.QuantSpec("e1m2"))
    assert e2m1["end_to_end"][-1] < 0.97 < 0.99 < e1m2["end_to_end"][-1]
    for r in (e2m1, e1m2):
        assert r["prod_eta"][-1] == pytest.approx(r["end_to_end"][-1], abs=0.01)
        assert r["exp_sum_delta"][-1] == pytest.approx(r["prod_eta"][-1], abs=0.002)
        assert r["prod_eta"][0] == r["eta"][0]


# ----------------------------------------------------------------------------- compare
def write_run(run_dir: Path, losses: dict, recipe="bf16", seed=1, val=None, model=None):
    """A run directory as train.py writes it: log.jsonl and config.json."""
    run_dir.mkdir(parents=True)
    with open(run_dir / "log.jsonl", "w") as f:
        for step, loss in losses.items():
            rec = {"step": step, "loss": loss} | ({"val_loss": val[step]} if val and step in val else {})
            f.write(json.dumps(rec) + "\n")
    cfg = {"quant": {"recipe": recipe, "overrides": {}}, "train": {"seed": seed},
           "model": {"preset": "tiny", "overrides": model or {}}}
    (run_dir / "config.json").write_text(json.dumps({"config": cfg}))
    return run_dir


def test_compare_metric_by_hand(tmp_path):
    base = write_run(tmp_path / "bf16", {s: 4.0 - 0.1 * s for s in range(1, 11)}, val={5: 3.6, 10: 3.0})
    # the FP4 runs log steps 3..12: only the common steps 3..10 count; the window is the last 4 of them
    a = write_run(tmp_path / "a", {s: 4.0 - 0.1 * s + 0.01 * s for s in range(3, 13)}, "ufp4", 1, val={10: 3.3})
    b = write_run(tmp_path / "b", {s: 4.0 - 0.1 * s - 0.02 for s in range(3, 13)}, "ufp4", 2)
    rows = compare.main([str(a), str(b), "--baseline", str(base), "--last", "4", "--out", str(tmp_path / "o"), *PLOTS])
    window = [7, 8, 9, 10]
    want_a = np.mean([0.01 * s / (4.0 - 0.1 * s) for s in window])
    want_b = np.mean([0.02 / (4.0 - 0.1 * s) for s in window])
    assert rows[0]["train_rel_err"] == pytest.approx(want_a) and rows[1]["train_rel_err"] == pytest.approx(want_b)
    assert rows[0]["n_steps"] == 4 and rows[0]["last_step"] == 10
    assert rows[0]["val_rel_err"] == pytest.approx(0.1) and math.isnan(rows[1]["val_rel_err"])
    assert rows[0]["mean_loss"] == pytest.approx(np.mean([4.0 - 0.09 * s for s in window]))
    mean, std = 100 * np.mean([want_a, want_b]), 100 * np.std([want_a, want_b], ddof=1)
    assert f"| ufp4 | 2 | {mean:.4f} ± {std:.4f} |" in (tmp_path / "o" / "compare.md").read_text()
    assert (tmp_path / "o" / "compare.png").is_file() == HAS_MPL


def test_compare_baseline_matching(tmp_path):
    b1 = compare.read_run(write_run(tmp_path / "b1", {1: 2.0}, seed=1))
    b2 = compare.read_run(write_run(tmp_path / "b2", {1: 2.0}, seed=2))
    run = compare.read_run(write_run(tmp_path / "r", {1: 2.0}, "ufp4", seed=2))
    assert compare.pick_baseline(run, [b1, b2]) is b2
    run3 = compare.read_run(write_run(tmp_path / "r3", {1: 2.0}, "ufp4", seed=3))
    with pytest.raises(SystemExit, match="exactly one matching"):
        compare.pick_baseline(run3, [b1, b2])
    other = compare.read_run(write_run(tmp_path / "o", {1: 2.0}, "ufp4", model={"d_model": 32}))
    with pytest.raises(SystemExit, match="0 baselines"):
        compare.pick_baseline(other, [b1, b2])
    with pytest.raises(SystemExit, match="not a train.py run directory"):
        compare.read_run(tmp_path / "nothing")


# ----------------------------------------------------------------------------- scaling fit
def test_fit_recovers_a_known_power_law():
    rng = np.random.default_rng(0)
    C = np.repeat(np.geomspace(1e15, 1e19, 6), 2)
    E, A, alpha = 1.9, 2000.0, 0.2
    L = E + A * C ** -alpha + rng.normal(0, 0.003, C.size)
    fit = scaling_fit.fit_power_law(C, L)
    assert fit["E"] == pytest.approx(E, abs=0.02) and fit["alpha"] == pytest.approx(alpha, abs=0.01)
    assert fit["A"] == pytest.approx(A, rel=0.2)
    boots = scaling_fit.bootstrap(C, L, fit, n_boot=200)
    lo, hi = np.percentile([b["alpha"] for b in boots], [2.5, 97.5])
    assert lo < alpha < hi and hi - lo < 0.02
    exact = scaling_fit.fit_power_law(C, E + A * C ** -alpha)  # no noise: the same numbers back
    assert exact["E"] == pytest.approx(E, abs=1e-4) and exact["alpha"] == pytest.approx(alpha, abs=1e-4)
    with pytest.raises(ValueError, match="at least 3 distinct"):
        scaling_fit.fit_power_law([1e15, 1e15, 1e16], [3.0, 3.1, 2.9])


def test_scaling_fit_cli_on_a_synthetic_sweep(tmp_path):
    """Losses from known laws for bf16 and a recipe 2% worse: the reported gap is 2% everywhere."""
    runs = []
    for c in np.geomspace(1e15, 1e18, 5):
        for recipe, factor in (("bf16", 1.0), ("ufp4", 1.02)):
            loss = factor * (2.0 + 500.0 * c ** -0.18)
            d = write_run(tmp_path / f"{recipe}-{c:.0e}", {10: loss + 0.01}, recipe, val={10: loss})
            runs.append({"name": d.name, "dir": str(d), "recipe": recipe, "steps": 10, "compute": c})
    (tmp_path / "sweep.json").write_text(json.dumps({"runs": runs}))
    fits = scaling_fit.main([str(tmp_path), "--out", str(tmp_path / "o"), "--target", "far=1e21", "--boot", "50",
                             *PLOTS])
    assert fits["bf16"]["alpha"] == pytest.approx(0.18, abs=1e-3) and fits["bf16"]["E"] == pytest.approx(2.0, abs=1e-3)
    c = np.array([1e15, 1e21])
    gap = scaling_fit.predict(fits["ufp4"], c) / scaling_fit.predict(fits["bf16"], c) - 1
    assert gap == pytest.approx([0.02, 0.02], abs=1e-3)
    text = (tmp_path / "o" / "scaling_fit.md").read_text()
    assert "far" in text and "Dense 1.5B" in text and "assumed" in text
    assert (tmp_path / "o" / "scaling_fit.png").is_file() == HAS_MPL
    with pytest.raises(SystemExit, match="NAME=FLOPS"):
        scaling_fit.main([str(tmp_path), "--target", "oops", "--no-plots"])


# ----------------------------------------------------------------------------- sweep, end to end
def write_dataset(root: Path) -> Path:
    """meta.json + uint16 shards (data/prepare.py's format): a noisy affine token chain."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    meta = {"source": "synthetic", "tokenizer": "gpt2", "vocab_size": VOCAB, "eot_token": VOCAB - 1, "dtype": "uint16"}
    for split, n in (("train", 20000), ("val", 4000)):
        t, out = 0, []
        for _ in range(n):
            t = (3 * t + 7) % (VOCAB - 1) if rng.random() < 0.9 else int(rng.integers(VOCAB - 1))
            out.append(t)
        np.array(out, dtype=np.uint16).tofile(root / f"{split}_000.bin")
        meta[split] = {"shards": [f"{split}_000.bin"], "tokens": n, "documents": ["synthetic"]}
    (root / "meta.json").write_text(json.dumps(meta))
    return root


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    if not (ROOT / "train.py").is_file():
        pytest.skip("train.py is missing: the sweep trains through it")
    data = write_dataset(tmp_path_factory.mktemp("data") / "synthetic")
    out = tmp_path_factory.mktemp("sweep")
    argv = ["--ladder", "tiny-ladder", "--recipes", "bf16,ufp4", "--seeds", "1", "--tokens-per-param", "0.03",
            "--out", str(out), "--set", f"data.dir={data}", "--set", f"model.vocab_size={VOCAB}",
            "--set", "train.device=cpu", "--set", "data.batch_size=4", "--set", "data.eval_batches=1"]
    return out, sweep.main(argv), argv


def test_sweep_trains_a_compute_matched_ladder(tiny_sweep, capsys):
    out, runs, argv = tiny_sweep
    assert [r["name"] for r in runs] == ["t32-bf16-s1", "t32-ufp4-s1", "t64-bf16-s1", "t64-ufp4-s1"]
    by_rung = {}
    for r in runs:
        recs = [json.loads(s) for s in (Path(r["dir"]) / "log.jsonl").read_text().splitlines()]
        assert recs[-1]["step"] == r["steps"] and "val_loss" in recs[-1] and (Path(r["dir"]) / "ckpt.pt").is_file()
        assert r["steps"] == math.ceil(0.03 * r["params"] / (4 * 32)) and r["tokens"] == r["steps"] * 4 * 32
        assert r["compute"] == r["flops_per_token"] * r["tokens"]
        by_rung.setdefault(r["rung"], set()).add((r["params"], r["compute"]))
    assert all(len(v) == 1 for v in by_rung.values())  # every recipe at a rung: the same N and C
    (n32, c32), (n64, c64) = by_rung["t32"].pop(), by_rung["t64"].pop()
    assert n64 > 4 * n32 and c64 > c32
    assert json.loads((out / "sweep.json").read_text())["runs"] == json.loads(json.dumps(runs))
    capsys.readouterr()
    sweep.main(argv)  # a second call finds every run finished
    assert capsys.readouterr().out.count("already finished") == 4
    with pytest.raises(SystemExit, match="unknown recipe 'fp5'"):
        sweep.main(argv[:2] + ["--recipes", "bf16,fp5", "--out", str(out), "--dry-run"])


def test_tools_read_the_sweep(tiny_sweep, tmp_path):
    out, runs, _ = tiny_sweep
    dirs = [r["dir"] for r in runs]
    rows = compare.main(dirs + ["--baseline", dirs[0], dirs[2], "--last", "5", "--out", str(tmp_path), "--no-plots"])
    assert [r["recipe"] for r in rows] == ["ufp4", "ufp4"] and all(0 <= r["train_rel_err"] < 0.5 for r in rows)
    with pytest.raises(SystemExit, match="at least 3"):
        scaling_fit.main([str(out), "--no-plots", "--out", str(tmp_path)])
    ckpt = str(Path(runs[3]["dir"]) / "ckpt.pt")
    analyze.main(["tensors", "--ckpt", ckpt, "--out", str(tmp_path), "--no-plots"])
    res = json.loads((tmp_path / "tensors.json").read_text())
    assert len(res) == 2 * 2 * 6  # 2 layers x fc1/fc2 x six operands
    for r in res:
        for g in ("e2m1", "e1m2"):
            assert 0 < r[g]["plain"]["b_eff"] <= 1 and 8 < r[g]["plain"]["sqnr_db"] < 40
            assert r[g]["delta_sqnr_db"] == pytest.approx(10 * math.log10(r[g]["plain"]["nmse"] / r[g]["rht"]["nmse"]))
    assert "sign flip" in (tmp_path / "tensors.md").read_text()
    analyze.main(["chain", "--ckpt", ckpt, "--depth", "4", "--width", "64", "--tokens", "64", "--out", str(tmp_path),
                  "--no-plots"])
    assert "trained: e1m2/16/fp32/rtne/rht" in json.loads((tmp_path / "chain.json").read_text())


@pytest.mark.full
def test_study_runs_side_by_side(tmp_path):
    """A named study through the parallel pool: every run trains with its recipe and quant overrides."""
    if not (ROOT / "train.py").is_file():
        pytest.skip("train.py is missing: the sweep trains through it")
    data = write_dataset(tmp_path / "synthetic")
    argv = ["--study", "tiny-study", "--out", str(tmp_path / "out"), "--gpus", "0", "--jobs", "2",
            "--set", f"data.dir={data}", "--set", f"model.vocab_size={VOCAB}", "--set", "train.device=cpu",
            "--set", "data.batch_size=2", "--set", "data.eval_batches=1"]
    runs = sweep.main(argv)
    assert [r["name"] for r in runs] == ["bf16-s1337", "ufp4-sr-none-s1337"]
    for r in runs:
        assert Path(r["dir"]).parent.name == "tiny-study" and sweep.finished(r)
        cfg = json.loads((Path(r["dir"]) / "config.json").read_text())["config"]
        assert cfg["quant"]["recipe"] == r["recipe"] and cfg["train"]["max_steps"] == 6
    cfg = json.loads((Path(runs[1]["dir"]) / "config.json").read_text())["config"]
    assert cfg["quant"]["overrides"] == {"sr": "none"}
    with pytest.raises(SystemExit, match="needs --gpus"):
        sweep.main(argv[:4] + ["--jobs", "2", "--dry-run"])
