"""Compare training runs with BF16 runs of the same seed: signed loss differences, with 95 % intervals over seeds.

    python -m analysis.compare runs/science/recipes-small/*/            # run directories
    python -m analysis.compare studies/logs --pair ufp4,e2m1 --pair nvfp4,e2m1   # compact logs
    python -m analysis.compare runs/pilot/logs/dense-small --power 0.1     # seeds needed for ±0.1 points

Every run is read against the baseline run (recipe bf16, or --baseline-recipe) of the same seed,
which saw the same initial weights and the same batches; a run of another seed, model, data, batch,
step count or schedule is refused (analysis.runlog.check_pair). Per run, three numbers:
  val     (V − V_bf16) / V_bf16, V the held-out loss at the final step (both runs evaluate there);
  train   the mean over the last --window fraction of the steps (default 20 %) of (L − L_bf16) / L_bf16,
          the two training losses taken at the same step;
  |train| the mean of |L − L_bf16| / L_bf16 over the same steps (the paper's metric; it has a floor:
          per-step noise alone makes it positive).
The first two are signed: below zero, the recipe's loss is below bf16's. Runs are grouped by model
and recipe (quant recipe plus overrides); each group gets the mean and the 95 % Student-t interval
over its seeds. A pair A,B (default ufp4,e2m1 where both ran) gets the per-seed difference A − B of
the val and train numbers, with its interval: below zero, A ends closer to (or further below) bf16.
Inputs are run directories (log.jsonl + config.json) or compact logs (analysis.runlog), or
directories of compact logs. --power H adds the study design's step: from the seed spread of the
runs given (2-3 pilot seeds), the number of seeds whose interval is ±H points (analysis.stats).
"""
import argparse
import json
from pathlib import Path

import numpy as np

from analysis import OUT, md_table, pyplot
from analysis.runlog import check_pair, expand, load
from analysis.stats import fmt_ci, mean_ci, seeds_needed

METRICS = ("val", "train", "abs_train")


def window_steps(common, max_step: int, window: float):
    """The common steps in the last `window` fraction of the run: step > (1 − window) · max_step."""
    return common > (1 - window) * max_step


def paired_metrics(run: dict, base: dict, window: float) -> dict:
    """The val, train and |train| numbers of a run against its baseline (see the module doc)."""
    check_pair(run, base)
    last = {r["dir"]: int(r["steps"].max()) for r in (run, base)}
    for r in (run, base):
        if last[r["dir"]] != r["max_steps"] or (r["val_steps"].size == 0 or r["val_steps"][-1] != r["max_steps"]):
            raise SystemExit(f"{r['dir']} logged {last[r['dir']]} of {r['max_steps']} steps, or did not evaluate at "
                             "the last one: compare finished runs (train.py evaluates at max_steps)")
    v_run, v_base = run["val_loss"][-1], base["val_loss"][-1]
    common, ia, ib = np.intersect1d(run["steps"], base["steps"], return_indices=True)
    keep = window_steps(common, run["max_steps"], window)
    if not keep.any():
        raise SystemExit(f"{run['dir']}: no step in the last {window:.0%} of the run is logged by both runs")
    rel = (run["loss"][ia][keep] - base["loss"][ib][keep]) / base["loss"][ib][keep]
    return {"dir": run["dir"], "baseline": base["dir"], "model": run["model"], "recipe": run["recipe"],
            "seed": run["seed"], "val_step": int(run["max_steps"]), "val": float((v_run - v_base) / v_base),
            "train": float(rel.mean()), "abs_train": float(np.abs(rel).mean()), "n_steps": int(keep.sum()),
            "val_loss": float(v_run), "tok_s": run["tok_s"], "card": run["card"], "commit": run["commit"]}


def pick_baseline(run: dict, baselines: list) -> dict:
    """The baseline of the run's model and seed; none or several is an error."""
    same = [b for b in baselines if b["model"] == run["model"] and b["seed"] == run["seed"]]
    if len(same) != 1:
        seeds = sorted({b["seed"] for b in baselines if b["model"] == run["model"]})
        raise SystemExit(f"{run['dir']}: {len(same)} baseline runs with model [{run['model']}] and seed {run['seed']} "
                         f"(baseline seeds of that model: {seeds}); give exactly one bf16 run per seed")
    return same[0]


def compare(runs: list, baseline_recipe: str, window: float) -> list:
    """One row per non-baseline run."""
    baselines = [r for r in runs if r["recipe"] == baseline_recipe]
    if not baselines:
        raise SystemExit(f"no run of recipe {baseline_recipe!r} among the inputs: the baselines are read from "
                         "them (or pass --baseline-recipe)")
    return [paired_metrics(r, pick_baseline(r, baselines), window) for r in runs if r["recipe"] != baseline_recipe]


def groups(rows: list) -> dict:
    """(model, recipe) -> {metric: mean_ci over seeds, 'seeds': [...]}."""
    out = {}
    for r in rows:
        out.setdefault((r["model"], r["recipe"]), []).append(r)
    return {k: {"seeds": sorted(r["seed"] for r in g), "tok_s": float(np.median([r["tok_s"] for r in g])),
                **{m: mean_ci([r[m] for r in g]) for m in METRICS}} for k, g in out.items()}


def pair(rows: list, model: str, a: str, b: str) -> dict:
    """The per-seed differences a − b of the val and train numbers, over the seeds both ran."""
    by = {name: {r["seed"]: r for r in rows if r["model"] == model and r["recipe"] == name} for name in (a, b)}
    seeds = sorted(set(by[a]) & set(by[b]))
    if not seeds:
        raise SystemExit(f"--pair {a},{b}: no seed of model [{model}] ran both recipes "
                         f"({a}: {sorted(by[a])}, {b}: {sorted(by[b])})")
    return {"model": model, "a": a, "b": b, "seeds": seeds,
            "unpaired": sorted(set(by[a]) ^ set(by[b])),
            **{m: mean_ci([by[a][s][m] - by[b][s][m] for s in seeds]) for m in ("val", "train")}}


def pct(ci: dict) -> str:
    return fmt_ci({**ci, "mean": 100 * ci["mean"], "half": 100 * ci["half"]})


def report(rows: list, pairs: list, window: float) -> str:
    g = groups(rows)
    table = [[model, recipe, len(v["seeds"]), pct(v["val"]), pct(v["train"]), pct(v["abs_train"]), f"{v['tok_s']:,.0f}"]
             for (model, recipe), v in sorted(g.items())]
    w = f"last {window:.0%} of steps"
    text = ("## Loss against bf16 of the same seed (%; mean ± 95 % t interval over seeds)\n\n"
            + md_table(["model", "recipe", "seeds", "val: final held-out loss, (V − V_bf16)/V_bf16",
                        f"train: mean (L − L_bf16)/L_bf16, {w}", f"paper: mean |L − L_bf16|/L_bf16, {w}",
                        "tokens/s (median)"], table))
    if pairs:
        text += ("\n\n## Paired differences A − B over seeds (percentage points; < 0: A's loss is lower)\n\n"
                 + md_table(["model", "A − B", "seeds", "val", "train", "unpaired seeds"],
                            [[p["model"], f"{p['a']} − {p['b']}", len(p["seeds"]), pct(p["val"]), pct(p["train"]),
                              ", ".join(map(str, p["unpaired"])) or "–"] for p in pairs]))
    per_run = md_table(["run", "baseline", "seed", "val (%)", "train (%)", "|train| (%)", "final val loss", "card"],
                       [[r["dir"], r["baseline"], r["seed"], 100 * r["val"], 100 * r["train"], 100 * r["abs_train"],
                         r["val_loss"], r["card"]] for r in rows])
    return text + f"\n\n### Per run\n\n{per_run}"


def power(rows: list, pairs: list, half: float) -> str:
    """How many seeds give a 95 % interval of ±half percentage points, from the seed spread of the
    runs at hand (pilot seeds): per recipe against bf16 and per pair, for the val and train numbers."""
    def need(ci):
        return "–" if ci["n"] < 2 else seeds_needed(100 * ci["sd"], half)

    def sd(ci):
        return "–" if ci["n"] < 2 else f"{100 * ci['sd']:.3f}"
    table = [[model, recipe, v["val"]["n"], sd(v["val"]), need(v["val"]), sd(v["train"]), need(v["train"])]
             for (model, recipe), v in sorted(groups(rows).items())]
    table += [[p["model"], f"{p['a']} − {p['b']}", p["val"]["n"], sd(p["val"]), need(p["val"]), sd(p["train"]),
               need(p["train"])] for p in pairs]
    return (f"## Power: seeds for ±{half:g} points (95 % t interval), from the seed spread of these runs\n\n"
            + md_table(["model", "recipe or pair", "pilot seeds", "val sd (points)",
                        f"seeds for ±{half:g} points (val)", "train sd (points)",
                        f"seeds for ±{half:g} points (train)"], table))


def plot(out: Path, runs: list, baseline_recipe: str, window: float):
    """Per recipe: the mean signed difference (L − L_bf16)/L_bf16 over seeds along the steps (moving
    average), with its 95 % band; the last-window boundary dashed."""
    plt = pyplot()
    models = sorted({r["model"] for r in runs})
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 5), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in runs if r["model"] == model]
        base = {r["seed"]: r for r in mine if r["recipe"] == baseline_recipe}
        for k, recipe in enumerate(sorted({r["recipe"] for r in mine} - {baseline_recipe})):
            curves = []
            for r in (r for r in mine if r["recipe"] == recipe and r["seed"] in base):
                b = base[r["seed"]]
                common, ia, ib = np.intersect1d(r["steps"], b["steps"], return_indices=True)
                rel = (r["loss"][ia] - b["loss"][ib]) / b["loss"][ib]
                w = max(1, len(rel) // 25)
                curves.append((common[w - 1:], np.convolve(rel, np.ones(w) / w, mode="valid")))
            if not curves:
                continue
            n = min(len(c[1]) for c in curves)
            steps, ys = curves[0][0][:n], np.stack([c[1][:n] for c in curves]) * 100
            ci = [mean_ci(col) for col in ys.T]
            mean = np.array([c["mean"] for c in ci])
            ax.plot(steps, mean, color=f"C{k % 10}", label=f"{recipe} (n={len(curves)})")
            if len(curves) > 1:
                half = np.array([c["half"] for c in ci])
                ax.fill_between(steps, mean - half, mean + half, color=f"C{k % 10}", alpha=0.2)
        ax.axhline(0, color="k", lw=0.8)
        ax.axvline((1 - window) * max(r["max_steps"] for r in mine), color="k", ls="--", lw=0.8)
        ax.set(xlabel="step", ylabel="(L − L_bf16) / L_bf16 (%)", title=f"{model}: mean over seeds, 95 % band")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=120)
    plt.close(fig)


def parse_pairs(items, rows) -> list:
    """The --pair A,B items for every model that ran both (default: ufp4,e2m1 where both ran)."""
    recipes = {(r["model"], r["recipe"]) for r in rows}
    models = sorted({m for m, _ in recipes})
    if not items:
        return [pair(rows, m, "ufp4", "e2m1") for m in models if {(m, "ufp4"), (m, "e2m1")} <= recipes]
    out = []
    for item in items:
        a, comma, b = item.partition(",")
        if not comma or not a or not b:
            raise SystemExit(f"--pair {item!r}: expected two recipe labels A,B, e.g. --pair ufp4,e2m1")
        both = [m for m in models if {(m, a), (m, b)} <= recipes]
        if not both:
            raise SystemExit(f"--pair {item}: no model ran both {a!r} and {b!r}; recipes: "
                             f"{', '.join(sorted({r for _, r in recipes}))}")
        out += [pair(rows, m, a, b) for m in both]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m analysis.compare", description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="run directories, compact logs, or directories of compact logs")
    p.add_argument("--baseline-recipe", default="bf16", help="the recipe label of the baseline runs")
    p.add_argument("--window", type=float, default=0.2, help="fraction of the steps (at the end) for train")
    p.add_argument("--pair", action="append", default=[], metavar="A,B",
                   help="paired difference A − B over seeds (repeatable; default ufp4,e2m1 where both ran)")
    p.add_argument("--power", type=float, default=None, metavar="HALF",
                   help="also print how many seeds give a 95 %% interval of ±HALF percentage points")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    if args.power is not None and args.power <= 0:
        raise SystemExit(f"--power is a half-width in percentage points (> 0), got {args.power}")
    if not 0 < args.window <= 1:
        raise SystemExit(f"--window is a fraction of the steps in (0, 1], got {args.window}")
    runs = [load(path) for path in expand(args.runs)]
    rows = compare(runs, args.baseline_recipe, args.window)
    pairs = parse_pairs(args.pair, rows)
    text = report(rows, pairs, args.window) + (f"\n\n{power(rows, pairs, args.power)}" if args.power else "")
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compare.md").write_text(text + "\n")
    (args.out / "compare.json").write_text(json.dumps({"runs": rows, "pairs": pairs}, indent=1) + "\n")
    if not args.no_plots:
        plot(args.out, runs, args.baseline_recipe, args.window)
    print(f"wrote {args.out / 'compare'}.md, .json" + ("" if args.no_plots else ", .png"))
    return rows, pairs


if __name__ == "__main__":
    main()
