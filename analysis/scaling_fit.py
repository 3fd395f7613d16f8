"""Fit L(C) = E + A·C^(−α) per recipe to a sweep's losses; the FP4-to-BF16 gap as compute grows.

    python -m analysis.scaling_fit runs/sweep [--metric val|train] [--target "NAME=C"] [--out DIR]

Data: every finished run in SWEEP/sweep.json (analysis.sweep) gives one point (C, L): C = its
training FLOPs (flops_per_token × tokens), L = its final validation loss (--metric val) or its mean
training loss over the last 10% of steps (--metric train). Seeds give several points at one C.

Method (numpy only). C is divided by C0 = the geometric mean of the sweep's C for conditioning.
1. Profile over E: for each E on a grid below min(L), log(L − E) = log A' − α·log(C/C0) is a line;
   a least-squares line gives A', α, and the E whose curve has the least squared error in L wins.
2. Levenberg–Marquardt on (E, log A', α), minimizing the squared error in L (nonlinear least squares),
   with every step projected onto E ≥ 0 (an irreducible loss cannot be negative; with few, short
   runs the unconstrained optimum often is).
3. Uncertainty: residual bootstrap (refit to fit + resampled residuals, scaled by √(n/(n−3))),
   500 draws by default (--boot); intervals are the 16–84th percentiles (±1σ). With 3 points the
   curve interpolates them and no interval is given. A = A'·C0^α is reported for C in FLOPs.
The gap of recipe r is L_r(C) − L_bf16(C) and its relative size (L_r − L_bf16)/L_bf16, on the
sweep's compute range and extrapolated to the paper's scale. Extrapolation over orders of magnitude
rests on the power law holding all the way: read it as a trend, not a prediction.

Paper scale (assumptions, stated because the paper's token counts are not in this repository):
Dense 1.5B = this repo's dense-1.5b preset (N = 1.34B without the input embedding, flops_per_token
at seq 2048), trained (a) on this repo's configs/dense-1.5b.toml budget on 8 GPUs, (b) on D = 20·N
(Chinchilla). MoE 7.9B / 124B need their active parameter counts and token budgets: pass them as
--target "MoE 7.9B=<C>" once known.
"""
import argparse
import json
import math
from pathlib import Path

import numpy as np

from analysis import OUT, md_table, pyplot

N_BOOT = 500


def _line_fit(x, L, E):
    b1, b0 = np.polyfit(x, np.log(L - E), 1)
    return np.array([E, b0, -b1])  # (E, log A', alpha)


def _predict(p, x):
    return p[0] + np.exp(p[1] - p[2] * x)


def _levenberg_marquardt(p, x, L, iters=200):
    lam, sse = 1e-3, np.sum((_predict(p, x) - L) ** 2)
    for _ in range(iters):
        t = np.exp(p[1] - p[2] * x)
        r, J = p[0] + t - L, np.stack([np.ones_like(x), t, -x * t], 1)
        JtJ = J.T @ J
        step = np.linalg.solve(JtJ + lam * np.diag(np.diag(JtJ) + 1e-12), -J.T @ r)
        new = p + step
        new[0] = max(new[0], 0.0)  # E is an irreducible loss: projected onto E >= 0
        new_sse = np.sum((_predict(new, x) - L) ** 2)
        if new_sse < sse:
            p, sse, lam = new, new_sse, lam / 3
            if np.abs(step).max() < 1e-12:
                break
        else:
            lam *= 3
    return p


def fit_power_law(C, L, c0=None, start=None) -> dict:
    """Least-squares fit of L = E + A·C^(−α); returns E, A, alpha, c0, log_a0 (A' at C0), rmse.
    start: a previous fit to refine from (skips the profile over E)."""
    C, L = np.asarray(C, float), np.asarray(L, float)
    if len(np.unique(C)) < 3:
        raise ValueError(f"fitting E + A·C^(−α) needs at least 3 distinct compute values, got {len(np.unique(C))}; "
                         "train more rungs (analysis.sweep)")
    c0 = float(np.exp(np.mean(np.log(C)))) if c0 is None else c0
    x = np.log(C / c0)
    if start is None:
        grid = L.min() * (1 - np.logspace(-4, 0, 200))  # from just below min(L) down to 0
        cands = [_line_fit(x, L, E) for E in grid]
        p = min(cands, key=lambda q: np.sum((_predict(q, x) - L) ** 2))
    else:
        p = np.array([start["E"], start["log_a0"], start["alpha"]])
    p = _levenberg_marquardt(p, x, L)
    rmse = float(np.sqrt(np.mean((_predict(p, x) - L) ** 2)))
    return {"E": float(p[0]), "A": float(np.exp(p[1] + p[2] * math.log(c0))), "alpha": float(p[2]),
            "c0": c0, "log_a0": float(p[1]), "rmse": rmse, "n": len(L)}


def predict(fit: dict, C):
    return _predict(np.array([fit["E"], fit["log_a0"], fit["alpha"]]), np.log(np.asarray(C, float) / fit["c0"]))


def bootstrap(C, L, fit: dict, n_boot=N_BOOT, seed=0) -> list:
    """Refits to fit + resampled residuals; [] when the fit has no degrees of freedom left."""
    C, L = np.asarray(C, float), np.asarray(L, float)
    n = len(L)
    if n <= 3:
        return []
    pred = predict(fit, C)
    resid = (L - pred) * math.sqrt(n / (n - 3))
    rng = np.random.default_rng(seed)
    fits = []
    for _ in range(n_boot):
        Lb = pred + rng.choice(resid, n)
        if Lb.min() <= 0:
            continue
        fits.append(fit_power_law(C, Lb, fit["c0"], start=fit))
    return fits


def load_points(sweep_dir: Path, metric: str) -> dict:
    """{recipe: (C array, L array)} from the finished runs of a sweep; unfinished runs are listed."""
    manifest = sweep_dir / "sweep.json"
    if not manifest.is_file():
        raise SystemExit(f"no {manifest}: run python -m analysis.sweep --out {sweep_dir} first")
    points, missing = {}, []
    for run in json.loads(manifest.read_text())["runs"]:
        log = Path(run["dir"]) / "log.jsonl"
        if not log.is_file():  # a sweep directory copied elsewhere: its runs sit beside sweep.json
            log = sweep_dir / run["name"] / "log.jsonl"
        recs = [json.loads(s) for s in log.read_text().splitlines()] if log.is_file() else []
        if not recs or recs[-1]["step"] < run["steps"]:
            missing.append(run["name"])
            continue
        if metric == "val":
            if recs[-1].get("val_loss") is None:
                raise SystemExit(f"{log}: the last step has no val_loss; use --metric train")
            loss = recs[-1]["val_loss"]
        else:
            tail = recs[-max(1, len(recs) // 10):]
            loss = float(np.mean([r["loss"] for r in tail]))
        c, l = points.setdefault(run["recipe"], ([], []))
        c.append(run["compute"])
        l.append(loss)
    if missing:
        print(f"not finished, left out: {', '.join(missing)}")
    return {r: (np.array(c), np.array(l)) for r, (c, l) in points.items()}


def paper_targets() -> dict:
    """{name: C} for Dense 1.5B under the two stated token-budget assumptions."""
    import torch
    import train
    from model import Transformer, get_config
    root = Path(__file__).resolve().parents[1]
    cfg = train.load_config(str(root / "configs" / "dense-1.5b.toml"), [])
    with torch.device("meta"):
        m = Transformer(get_config(cfg.model.preset))
    fpt, n = m.flops_per_token(), m.num_params()
    tokens = cfg.train.max_steps * cfg.data.batch_size * m.cfg.seq_len * cfg.data.grad_accum * 8
    return {f"Dense 1.5B, configs/dense-1.5b.toml on 8 GPUs ({tokens / 1e9:.2f}B tokens)": float(fpt * tokens),
            f"Dense 1.5B, D = 20·N = {20 * n / 1e9:.1f}B tokens (assumed)": float(fpt * 20 * n)}


def interval(values) -> str:
    if not len(values):
        return "–"
    lo, hi = np.percentile(values, [16, 84])
    return f"[{lo:.4g}, {hi:.4g}]"


def report(points: dict, targets: dict, baseline: str, n_boot=N_BOOT):
    fits = {r: fit_power_law(c, l) for r, (c, l) in points.items()}
    boots = {r: bootstrap(*points[r], fits[r], n_boot) for r in points}
    rows = [[r, f["n"], f["E"], interval([b["E"] for b in boots[r]]), f["A"], f["alpha"],
             interval([b["alpha"] for b in boots[r]]), f["rmse"]] for r, f in fits.items()]
    text = [md_table(["recipe", "points", "E", "E 68%", "A (C in FLOPs)", "α", "α 68%", "rmse"], rows)]
    if baseline in fits:
        c_all = np.concatenate([c for c, _ in points.values()])
        evals = {"sweep min C": c_all.min(), "sweep max C": c_all.max()} | targets
        gap_rows = []
        for r in fits:
            if r == baseline:
                continue
            for name, c in evals.items():
                lb, lr = float(predict(fits[baseline], c)), float(predict(fits[r], c))
                rel = [float((predict(br, c) - predict(bb, c)) / predict(bb, c))
                       for br, bb in zip(boots[r], boots[baseline])]
                gap_rows.append([r, name, f"{c:.3e}", lb, lr, lr - lb, f"{100 * (lr - lb) / lb:.3f}",
                                 interval(np.array(rel) * 100)])
        text.append(md_table(["recipe", "at", "C (FLOPs)", f"L {baseline}", "L recipe", "gap ΔL",
                              "gap (%)", "gap 68% (%)"], gap_rows))
    else:
        text.append(f"(no {baseline} runs: no gap)")
    return fits, boots, "\n\n".join(text)


def plot(path, points, fits, boots, targets, baseline):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    c_all = np.concatenate([c for c, _ in points.values()])
    c_hi = max([c_all.max()] + list(targets.values()))
    inside, beyond = np.geomspace(c_all.min(), c_all.max(), 100), np.geomspace(c_all.max(), c_hi, 100)
    for k, (r, (c, l)) in enumerate(points.items()):
        color = "k" if r == baseline else f"C{k}"
        f = fits[r]
        axes[0].plot(c, l, "o", color=color, ms=4)
        axes[0].plot(inside, predict(f, inside), color=color,
                     label=f"{r}: {f['E']:.3f} + {f['A']:.3g}·C^−{f['alpha']:.3f}")
        axes[0].plot(beyond, predict(f, beyond), "--", color=color)
        if r != baseline and baseline in fits:
            grid = np.geomspace(c_all.min(), c_hi, 200)
            rel = 100 * (predict(f, grid) - predict(fits[baseline], grid)) / predict(fits[baseline], grid)
            axes[1].plot(grid, rel, color=color, label=r)
            if boots[r] and boots[baseline]:
                band = [100 * (predict(br, grid) - predict(bb, grid)) / predict(bb, grid)
                        for br, bb in zip(boots[r], boots[baseline])]
                axes[1].fill_between(grid, *np.percentile(band, [16, 84], axis=0), color=color, alpha=0.2)
    for name, c in targets.items():
        for ax in axes:
            ax.axvline(c, color="gray", ls=":", lw=1)
        axes[1].text(c, 0, name.split(",")[0], rotation=90, fontsize=7, va="bottom")
    axes[0].set(ylabel="loss", title="L(C) = E + A·C^−α (dashed: extrapolated)")
    axes[1].set(ylabel="%", title=f"gap (L − L_{baseline}) / L_{baseline} (band: 68%)")
    axes[1].axhline(0, color="k", lw=0.5)
    for ax in axes:
        ax.set(xscale="log", xlabel="training compute C (FLOPs)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m analysis.scaling_fit", description=__doc__.split("\n")[0])
    p.add_argument("sweep", type=Path, help="a directory written by analysis.sweep")
    p.add_argument("--metric", choices=("val", "train"), default="val")
    p.add_argument("--baseline", default="bf16", help="the recipe the gap is measured against")
    p.add_argument("--target", action="append", default=[], metavar="NAME=C",
                   help="another compute (FLOPs) to extrapolate to, e.g. 'MoE 7.9B=3.1e21'")
    p.add_argument("--boot", type=int, default=N_BOOT, help="bootstrap draws")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    targets = paper_targets()
    for t in args.target:
        name, _, c = t.rpartition("=")
        try:
            targets[name] = float(c)
        except ValueError:
            name = ""
        if not name:
            raise SystemExit(f"--target {t!r}: expected NAME=FLOPS, e.g. 'MoE 7.9B=3.1e21'")
    points = load_points(args.sweep, args.metric)
    for r, (c, _) in points.items():
        if len(np.unique(c)) < 3:
            raise SystemExit(f"recipe {r}: {len(np.unique(c))} compute values finished; fitting E + A·C^(−α) "
                             "needs at least 3 (a ladder with more rungs)")
    fits, boots, text = report(points, targets, args.baseline, args.boot)
    text = (f"## Scaling fits, {args.metric} loss, {args.sweep}\n\nMethod: profile over E + line fit in log space, "
            f"then Levenberg–Marquardt in L; residual bootstrap ({args.boot} draws) for the 68% intervals.\n\n{text}")
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaling_fit.md").write_text(text + "\n")
    (args.out / "scaling_fit.json").write_text(json.dumps({"fits": fits, "targets": targets}, indent=1) + "\n")
    if not args.no_plots:
        plot(args.out / "scaling_fit.png", points, fits, boots, targets, args.baseline)
    print(f"wrote {args.out / 'scaling_fit'}.md, .json" + ("" if args.no_plots else ", .png"))
    return fits


if __name__ == "__main__":
    main()
