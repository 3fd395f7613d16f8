"""Compare training runs with a BF16 baseline: the paper's BF16-relative loss error.

    python -m analysis.compare runs/e2m1-s1 runs/ufp4-s1 runs/ufp4-s2 --baseline runs/bf16-s1 --last 1000

For a run and its baseline, take the steps both logged; the window is the last N of them (steps >
last common step − N). The metric is the mean over the window of |L − L_bf16| / L_bf16, comparing
the two losses at the same step before averaging. It is computed for the training loss and, where
both runs evaluated inside the window, for the validation loss. Runs are grouped by model and recipe
(quant recipe plus overrides) and reported as mean ± std over seeds (std with ddof=1; one seed: "–").

Baselines: with several --baseline runs, each run is compared with the baseline of the same model
config and the same seed, or the only baseline of its model config; anything else is an error.
A run directory is what train.py writes: log.jsonl (one record per step: step, loss, val_loss on
evaluation steps) and config.json (the resolved config).
"""
import argparse
import json
from pathlib import Path

import numpy as np

from analysis import OUT, md_table, pyplot


def read_run(run_dir) -> dict:
    run_dir = Path(run_dir)
    log, cfg_path = run_dir / "log.jsonl", run_dir / "config.json"
    if not log.is_file() or not cfg_path.is_file():
        raise SystemExit(f"{run_dir} is not a train.py run directory (needs log.jsonl and config.json)")
    recs = {}
    for n, line in enumerate(log.read_text().splitlines(), 1):
        rec = json.loads(line)
        if "step" not in rec or "loss" not in rec:
            raise SystemExit(f"{log}:{n}: a record without 'step' and 'loss': {line[:100]}")
        recs[rec["step"]] = rec  # a step logged twice: the later record wins
    if not recs:
        raise SystemExit(f"{log} is empty: the run has not logged a step yet")
    cfg = json.loads(cfg_path.read_text())["config"]
    steps = np.array(sorted(recs))
    val = [s for s in steps if recs[s].get("val_loss") is not None]
    q, m = cfg["quant"], cfg["model"]
    return {"dir": str(run_dir), "seed": cfg["train"]["seed"],
            "recipe": q["recipe"] + "".join(f" {k}={v}" for k, v in sorted(q["overrides"].items())),
            "model": m["preset"] + "".join(f" {k}={v}" for k, v in sorted(m["overrides"].items())),
            "steps": steps, "loss": np.array([recs[s]["loss"] for s in steps], dtype=float),
            "val_steps": np.array(val, dtype=int),
            "val_loss": np.array([recs[s]["val_loss"] for s in val], dtype=float)}


def relative_error(steps, loss, base_steps, base_loss, last: int, window_end=None):
    """(mean |L − L_b| / L_b, mean L, n) over the common steps > window_end − last (window_end:
    the last common step by default). n = 0 (and NaNs) when no common step falls in the window."""
    common, ia, ib = np.intersect1d(steps, base_steps, return_indices=True)
    end = common.max() if window_end is None and common.size else window_end
    keep = common > end - last if common.size else np.zeros(0, bool)
    if not keep.any():
        return float("nan"), float("nan"), 0
    a, b = loss[ia][keep], base_loss[ib][keep]
    return float(np.mean(np.abs(a - b) / b)), float(np.mean(a)), int(keep.sum())


def pick_baseline(run, baselines) -> dict:
    same_model = [b for b in baselines if b["model"] == run["model"]]
    same_seed = [b for b in same_model if b["seed"] == run["seed"]]
    if len(same_model) == 1 or len(same_seed) == 1:
        return same_model[0] if len(same_model) == 1 else same_seed[0]
    raise SystemExit(f"{run['dir']}: found {len(same_model)} baselines with model [{run['model']}] and "
                     f"{len(same_seed)} of those with seed {run['seed']}; pass exactly one matching --baseline")


def compare(runs, baselines, last: int) -> list:
    """One row per run (a run that is its own baseline is skipped)."""
    rows = []
    for run in runs:
        base = pick_baseline(run, baselines)
        if Path(base["dir"]).resolve() == Path(run["dir"]).resolve():
            continue
        err, mean_loss, n = relative_error(run["steps"], run["loss"], base["steps"], base["loss"], last)
        end = np.intersect1d(run["steps"], base["steps"]).max()
        verr, _, vn = relative_error(run["val_steps"], run["val_loss"], base["val_steps"], base["val_loss"], last, end)
        rows.append({"dir": run["dir"], "baseline": base["dir"], "model": run["model"], "recipe": run["recipe"],
                     "seed": run["seed"], "train_rel_err": err, "val_rel_err": verr, "mean_loss": mean_loss,
                     "n_steps": n, "n_val": vn, "last_step": int(end)})
    return rows


def mean_std(values, scale=1.0) -> str:
    v = np.array([x for x in values if np.isfinite(x)]) * scale
    if not v.size:
        return "–"
    return f"{v.mean():.4f} ± {v.std(ddof=1):.4f}" if v.size > 1 else f"{v.mean():.4f} ± –"


def group_table(rows) -> str:
    groups = {}
    for r in rows:
        groups.setdefault((r["model"], r["recipe"]), []).append(r)
    table = [[model, recipe, len(g), mean_std([r["train_rel_err"] for r in g], 100),
              mean_std([r["val_rel_err"] for r in g], 100), mean_std([r["mean_loss"] for r in g]),
              min(r["n_steps"] for r in g)] for (model, recipe), g in groups.items()]
    return md_table(["model", "recipe", "seeds", "train |L−L_bf16|/L_bf16 (%)", "val rel. err (%)",
                     "mean train loss", "steps in window"], table)


def moving_average(v, w: int):
    return np.convolve(v, np.ones(w) / w, mode="valid")


def plot(out: Path, runs, baselines):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    base_dirs = {Path(b["dir"]).resolve() for b in baselines}
    extra = [b for b in baselines if all(Path(r["dir"]).resolve() != Path(b["dir"]).resolve() for r in runs)]
    for k, run in enumerate(runs + extra):
        is_base = Path(run["dir"]).resolve() in base_dirs
        color, label = ("k" if is_base else f"C{k % 10}"), Path(run["dir"]).name
        w = max(1, len(run["loss"]) // 50)
        axes[0].plot(run["steps"][w - 1:], moving_average(run["loss"], w), color=color, lw=1,
                     label=label + (" (baseline)" if is_base else ""))
        axes[0].plot(run["val_steps"], run["val_loss"], "o", color=color, ms=3)
        if is_base:
            continue
        base = pick_baseline(run, baselines)
        common, ia, ib = np.intersect1d(run["steps"], base["steps"], return_indices=True)
        rel = np.abs(run["loss"][ia] - base["loss"][ib]) / base["loss"][ib]
        w = max(1, min(w, len(rel)))
        axes[1].plot(common[w - 1:], 100 * moving_average(rel, w), color=color, label=label)
    axes[0].set(xlabel="step", ylabel="loss", yscale="log", title="training loss (moving average), val loss (dots)")
    axes[1].set(xlabel="step", ylabel="%", title="|L − L_bf16| / L_bf16, step-aligned (moving average)")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m analysis.compare", description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="run directories (train.py --log.out_dir)")
    p.add_argument("--baseline", nargs="+", required=True, help="the BF16 run(s)")
    p.add_argument("--last", type=int, default=1000, help="average over the last N common steps")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    if args.last < 1:
        raise SystemExit(f"--last must be a positive number of steps, got {args.last}")
    runs, baselines = [read_run(d) for d in args.runs], [read_run(d) for d in args.baseline]
    rows = compare(runs, baselines, args.last)
    per_run = md_table(["run", "baseline", "seed", "train rel. err (%)", "val rel. err (%)", "mean loss", "steps"],
                       [[r["dir"], r["baseline"], r["seed"], 100 * r["train_rel_err"], 100 * r["val_rel_err"],
                         r["mean_loss"], r["n_steps"]] for r in rows])
    text = (f"## BF16-relative loss error over the last {args.last} common steps\n\n{group_table(rows)}\n\n"
            f"### Per run\n\n{per_run}")
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compare.md").write_text(text + "\n")
    (args.out / "compare.json").write_text(json.dumps(rows, indent=1) + "\n")
    if not args.no_plots:
        plot(args.out, runs, baselines)
    return rows


if __name__ == "__main__":
    main()
