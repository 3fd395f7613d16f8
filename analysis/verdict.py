"""The verdict table: each claim of the UFP4 paper, the paper's figure, ours with its 95 % interval, and
whether it reproduces, decided by the interval.

    python -m analysis.verdict studies/logs \\
        --tensors bench/results/analysis/tensors_d256_registry-mix/tensors.json.gz \\
        --gradients studies/gradients-<step>/gradients.json

Sources: compact run logs (analysis.runlog; every *.jsonl.gz under the directory), the operand study
of analysis.analyze tensors (the SQNR sign flip) and analysis.gradients (gradient shrinkage). The
paper's figures are read from analysis/paper.json, which cites where each comes from.

Each claim has a direction. Ours is a mean over seeds (or layers, or batches) with its t interval:
  reproduces              the whole interval lies on the claimed side of zero;
  does not                the whole interval lies on the other side;
  cannot tell at this scale   the interval contains zero (or one seed: no interval).
Loss claims use the paired per-seed difference of the final held-out loss relative to bf16
(analysis.compare's val), in percentage points: a − b < 0 means a ends with the lower loss. The paper's
loss figures are its own differences: of its mean |L − L_bf16| / L_bf16 (last 1000 steps) for the
recipe comparisons, of its Table 2 mean losses (relative) for the ablation.
"""
import argparse
import gzip
import json
from pathlib import Path

import numpy as np

from analysis import OUT, md_table
from analysis.compare import compare, pair
from analysis.runlog import load
from analysis.stats import mean_ci

PAPER = Path(__file__).resolve().parent / "paper.json"
DENSE, MOE = "small", "moe-small"
RHT_ROWS = {"none": "rht_none", "wgrad": "rht_wgrad", "dgrad,wgrad": "rht_dgrad_wgrad",
            "fprop,wgrad": "rht_fprop_wgrad"}  # the ablation's RHT scopes -> their paper.json keys


def loss_gap(fig, a: str, b: str) -> str:
    return f"{fig[a]['value'] - fig[b]['value']:+.3f} points ({fig[a]['where']})"


def rel_gap(fig, a: str, b: str) -> str:
    return f"{100 * (fig[a]['value'] / fig[b]['value'] - 1):+.3f} % ({fig[a]['where']})"


def sqnr_gain(fig, grid: str) -> str:
    return f"{fig[f'sqnr_fc2_{grid}_rht']['value'] - fig[f'sqnr_fc2_{grid}_plain']['value']:+.2f} dB"


def claims(dense: str, moe: str) -> list:
    """Every row of the table: the claim, where ours comes from, the claimed sign, the paper's figure."""
    rows = [
        {"claim": "UFP4 ends below E2M1 (dense)", "kind": "pair", "model": dense, "a": "ufp4", "b": "e2m1", "sign": -1,
         "paper": lambda f: loss_gap(f, "loss_err_dense1.5b_ufp4", "loss_err_dense1.5b_e2m1")},
        {"claim": "UFP4 ends below E2M1 (MoE)", "kind": "pair", "model": moe, "a": "ufp4", "b": "e2m1", "sign": -1,
         "paper": lambda f: loss_gap(f, "loss_err_moe7.9b_ufp4", "loss_err_moe7.9b_e2m1")},
        {"claim": "UFP4 ends below NVFP4", "kind": "pair", "model": dense, "a": "ufp4", "b": "nvfp4", "sign": -1,
         "paper": None},
        {"claim": "UFP4 ends below MXFP4", "kind": "pair", "model": dense, "a": "ufp4", "b": "mxfp4", "sign": -1,
         "paper": None},
        {"claim": "ufp4-nv (e4m3 scales) ends below E2M1", "kind": "pair", "model": dense, "a": "ufp4-nv", "b": "e2m1",
         "sign": -1, "paper": None},
    ]
    for rht, key in RHT_ROWS.items():
        rows.append({"claim": f"Table 2: RHT on {rht} ends above full RHT (SR on)", "kind": "pair", "model": dense,
                     "a": f"ufp4 rht={rht}", "b": "ufp4", "sign": +1,
                     "paper": lambda f, key=key: rel_gap(f, f"ablation_{key}", "ablation_ufp4")})
    rows.append({"claim": "SR on dY helps (full RHT): without it the loss ends higher", "kind": "pair", "model": dense,
                 "a": "ufp4 sr=none", "b": "ufp4", "sign": +1,
                 "paper": lambda f: rel_gap(f, "ablation_ufp4_no_sr", "ablation_ufp4")})
    for rht in RHT_ROWS:
        rows.append({"claim": f"SR on dY helps (RHT on {rht})", "kind": "pair", "model": dense,
                     "a": f"ufp4 rht={rht} sr=none", "b": f"ufp4 rht={rht}", "sign": +1, "paper": None})
    rows += [
        {"claim": "RHT lowers E2M1's SQNR on outlier-heavy fc2 inputs (dB)", "kind": "tensors", "grid": "e2m1",
         "sign": -1, "paper": lambda f: sqnr_gain(f, "e2m1")},
        {"claim": "RHT raises E1M2's SQNR on outlier-heavy fc2 inputs (dB)", "kind": "tensors", "grid": "e1m2",
         "sign": +1, "paper": lambda f: sqnr_gain(f, "e1m2")},
        {"claim": "E2M1 shrinks the gradient of the first block (projection ratio − 1)", "kind": "gradients",
         "terms": (("e2m1", "first"),), "sign": -1, "paper": None},
        {"claim": "E2M1's gradient ratio falls with depth from the loss (first block − last, by batch)",
         "kind": "gradients", "terms": (("e2m1", "first"), ("e2m1", "last")), "sign": -1, "paper": None},
        {"claim": "UFP4's first-block gradient ratio is above E2M1's (paired by batch)", "kind": "gradients",
         "terms": (("ufp4", "first"), ("e2m1", "first")), "sign": +1, "paper": None},
        {"claim": "E2M1 shrinks the forward signal (last block's output gain − 1)", "kind": "forward",
         "recipe": "e2m1", "sign": -1, "paper": None},
    ]
    return rows


def decide(ci: dict, sign: int) -> str:
    if ci["n"] < 2:
        return "cannot tell at this scale (one sample)"
    lo, hi = sorted((sign * (ci["mean"] - ci["half"]), sign * (ci["mean"] + ci["half"])))
    return "reproduces" if lo > 0 else "does not" if hi < 0 else "cannot tell at this scale"


def ours_pair(rows: list, c: dict):
    present = {(r["model"], r["recipe"]) for r in rows}
    if not {(c["model"], c["a"]), (c["model"], c["b"])} <= present:
        return None
    p = pair(rows, c["model"], c["a"], c["b"])
    return {k: 100 * p["val"][k] if k in ("mean", "half", "sd") else p["val"][k] for k in p["val"]}, "points"


def ours_tensors(tensors: list, c: dict):
    """ΔSQNR from RHT of the fc2 inputs (fprop_x), one value per layer."""
    deltas = [r[c["grid"]]["delta_sqnr_db"] for r in tensors if r["linear"] == "fc2" and r["role"] == "fprop_x"]
    return (mean_ci(deltas), "dB") if deltas else None


def block_ratio(grads: dict, recipe: str, which: str):
    """Per batch: the mean projection ratio over the matrices of the recipe's first or last block."""
    layers = grads["recipes"].get(recipe, {}).get("layers", [])
    if not layers:
        return None
    block = (min if which == "first" else max)(layer["block"] for layer in layers)
    return np.mean([layer["ratio_per_batch"] for layer in layers if layer["block"] == block], axis=0)


def ours_gradients(grads: dict, c: dict):
    """One term: its ratio − 1; two: their difference, batch by batch."""
    per_batch = [block_ratio(grads, recipe, which) for recipe, which in c["terms"]]
    if any(v is None for v in per_batch):
        return None
    values = per_batch[0] - 1 if len(per_batch) == 1 else per_batch[0] - per_batch[1]
    return mean_ci(values), "ratio"


def ours_forward(grads: dict, c: dict):
    """The gain of the last block's output − 1 (its interval over batches, from gradients.json)."""
    gains = [f for f in grads["recipes"].get(c["recipe"], {}).get("forward", []) if f["output"] == "block"]
    if not gains:
        return None
    ci = max(gains, key=lambda f: f["block"])["gain"]
    return ci | {"mean": ci["mean"] - 1}, "gain"


def fmt(ci: dict, unit: str) -> str:
    text = f"{ci['mean']:+.3f}" + (f" ± {ci['half']:.3f}" if ci["n"] > 1 else "")
    return f"{text} {unit} (n={ci['n']})"


def verdict(runs: list, tensors, grads, paper: dict, dense: str = DENSE, moe: str = MOE) -> list:
    rows = compare(runs, "bf16", 0.2) if runs else []
    table = []
    for c in claims(dense, moe):
        found = (ours_pair(rows, c) if c["kind"] == "pair" else
                 ours_tensors(tensors, c) if c["kind"] == "tensors" and tensors is not None else
                 ours_gradients(grads, c) if c["kind"] == "gradients" and grads is not None else
                 ours_forward(grads, c) if c["kind"] == "forward" and grads is not None else None)
        paper_text = c["paper"](paper["figures"]) if c["paper"] else "– (no figure in the paper)"
        if found is None:
            table.append({"claim": c["claim"], "paper": paper_text, "ours": "not run", "verdict": "not run"})
            continue
        ci, unit = found
        table.append({"claim": c["claim"], "paper": paper_text, "ours": fmt(ci, unit), "verdict": decide(ci, c["sign"]),
                      "ci": ci})
    return table


def read_json(path: Path):
    """A JSON file, gzipped if its name ends in .gz."""
    return json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m analysis.verdict", description=__doc__.split("\n")[0])
    p.add_argument("logs", type=Path, help="directory of compact run logs (*.jsonl.gz, searched recursively)")
    p.add_argument("--tensors", type=Path, help="tensors.json(.gz) of analysis.analyze tensors (the SQNR sign flip)")
    p.add_argument("--gradients", type=Path, help="gradients.json(.gz) of analysis.gradients (gradient shrinkage)")
    p.add_argument("--paper", type=Path, default=PAPER, help="the paper's figures (default analysis/paper.json)")
    p.add_argument("--dense", default=DENSE, help="model label of the dense study")
    p.add_argument("--moe", default=MOE, help="model label of the MoE study")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if not args.logs.is_dir():
        raise SystemExit(f"{args.logs} is not a directory of compact run logs (python -m analysis.runlog writes them)")
    for path in (args.tensors, args.gradients):
        if path is not None and not path.is_file():
            raise SystemExit(f"no file {path}")
    runs = [load(f) for f in sorted(args.logs.rglob("*.jsonl.gz"))]
    tensors = read_json(args.tensors) if args.tensors else None
    grads = read_json(args.gradients) if args.gradients else None
    paper = json.loads(args.paper.read_text())
    table = verdict(runs, tensors, grads, paper, args.dense, args.moe)
    cards = sorted({r["card"] for r in runs}) or ["–"]
    commits = sorted({r["commit"][:7] for r in runs}) or ["–"]
    text = (md_table(["claim", "paper", "ours (95 % interval)", "verdict"],
                     [[t["claim"], t["paper"], t["ours"], t["verdict"]] for t in table])
            + f"\n\n{len(runs)} runs from {args.logs} (cards: {', '.join(cards)}; commits: {', '.join(commits)}). "
            f"Paper: {paper['source']}.")
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "verdict.md").write_text(text + "\n")
    (args.out / "verdict.json").write_text(json.dumps(table, indent=1) + "\n")
    return table


if __name__ == "__main__":
    main()
