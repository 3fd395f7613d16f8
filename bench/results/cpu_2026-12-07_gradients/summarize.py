"""Summaries of the gradients.json files in this directory (python bench/results/cpu_2026-12-07_gradients/summarize.py
> bench/results/cpu_2026-12-07_gradients/summary.md; arguments: the run folders, default all).

ratio: per batch, the mean over all block matrices (or one block's matrices) of the projection ratio, then the
mean over batches with its 95 % t interval (analysis.stats.mean_ci). Differences between recipes and the slope
against block index are paired per batch (every recipe saw the same batches). cosine: the JSON keeps only each
matrix's mean and interval, so the block average is the mean of the means and its half-width the mean of the
half-widths (an upper bound on the half-width of the averaged quantity).
"""
import gzip
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from analysis.stats import mean_ci  # noqa: E402

HERE = Path(__file__).resolve().parent


PACKED = HERE / "seeds1339-1351_step150.json.gz"  # seeds 1339-1351 at step 150, {seed: gradients.json}


def load(name):
    if name.startswith("seed") and not (HERE / name).exists():  # e.g. "seed1340/step150"
        return json.loads(gzip.decompress(PACKED.read_bytes()))[name[4:].split("/")[0]]
    p = HERE / name / "gradients.json"
    return json.loads(p.read_text() if p.exists() else gzip.decompress(p.with_suffix(".json.gz").read_bytes()))


def exists(name):
    return (HERE / name).exists() or (name.startswith("seed") and PACKED.exists()
                                       and name[4:].split("/")[0] in json.loads(gzip.decompress(PACKED.read_bytes())))


def per_batch(layers, blocks=None):
    rows = [L["ratio_per_batch"] for L in layers if blocks is None or L["block"] in blocks]
    return np.mean(np.array(rows), axis=0)  # [batches]


def fmt(c, d=4):
    return f"{c['mean']:.{d}f} ± {c['half']:.{d}f}"


def summary(name):
    J = load(name)
    recs = J["recipes"]
    nblk = max(L["block"] for L in next(iter(recs.values()))["layers"]) + 1
    out = {"run": name, "step": J["step"], "batches": J["batches"], "draws": J["draws"], "recipes": {}}
    for label, s in recs.items():
        L = s["layers"]
        allb = per_batch(L)
        blocks = [per_batch(L, {b}) for b in range(nblk)]
        B = np.array(blocks)  # [block, batch]
        x = np.arange(nblk) - (nblk - 1) / 2
        slope = (x[:, None] * (B - B.mean(0))).sum(0) / (x ** 2).sum()  # per batch, ratio per block index
        cos_m = float(np.mean([l["cos"]["mean"] for l in L]))
        cos_h = float(np.mean([l["cos"]["half"] for l in L]))
        cos_blk = [float(np.mean([l["cos"]["mean"] for l in L if l["block"] == b])) for b in range(nblk)]
        out["recipes"][label] = {
            "ratio": mean_ci(allb.tolist()), "cos": {"mean": cos_m, "half_upper": cos_h},
            "ratio_per_block": [mean_ci(b.tolist()) for b in blocks], "cos_per_block": cos_blk,
            "slope_per_block": mean_ci(slope.tolist()),
            "block0_minus_last": mean_ci((B[0] - B[-1]).tolist()),
            "forward_gain_block_output": [f["gain"] for f in s["forward"] if f["output"] == "block"],
            "_allb": allb}
    pairs = [("e2m1", "ufp4"), ("e2m1 rht=none", "ufp4 rht=none"), ("ufp4 rht=none", "ufp4"),
             ("e2m1 rht=none", "e2m1"), ("nvfp4", "ufp4-nv"), ("mxfp4", "ufp4")]
    out["paired_ratio_diff"] = {f"{a} - {b}": mean_ci((out["recipes"][a]["_allb"] - out["recipes"][b]["_allb"]).tolist())
                                for a, b in pairs if a in recs and b in recs}
    for r in out["recipes"].values():
        del r["_allb"]
    return out


def across_seeds(names):
    """E2M1 against UFP4 at one training point over seeds: each seed's mean over batches, then the mean
    over seeds with its 95 % t interval (the seeds are the units; batches only average within one)."""
    rows = {"e2m1 block 0 ratio - 1": [], "e2m1 block 0 - block 7": [], "ufp4 - e2m1, block 0 (paired)": [],
            "ufp4 - e2m1, all matrices (paired)": [], "e2m1 last block's output gain - 1": []}
    for name in names:
        recs = load(name)["recipes"]
        u, e = recs["ufp4"]["layers"], recs["e2m1"]["layers"]
        last = max(L["block"] for L in e)
        rows["e2m1 block 0 ratio - 1"].append(float(np.mean(per_batch(e, {0}))) - 1)
        rows["e2m1 last block's output gain - 1"].append(
            [f["gain"] for f in recs["e2m1"]["forward"] if f["output"] == "block"][-1]["mean"] - 1)
        rows["e2m1 block 0 - block 7"].append(float(np.mean(per_batch(e, {0}) - per_batch(e, {last}))))
        rows["ufp4 - e2m1, block 0 (paired)"].append(float(np.mean(per_batch(u, {0}) - per_batch(e, {0}))))
        rows["ufp4 - e2m1, all matrices (paired)"].append(float(np.mean(per_batch(u) - per_batch(e))))
    return {k: dict(per_seed=v, **mean_ci(v)) for k, v in rows.items()}


SEEDS_AT_150 = ["step150"] + [f"seed{s}/step150" for s in range(1338, 1352)]  # seeds 1337-1351 (those run)


if __name__ == "__main__":
    names = sys.argv[1:] or ["step50", "step150", "step500"] + [n for n in SEEDS_AT_150[1:] if exists(n)]
    res = {n: summary(n) for n in names}
    seeds = [n for n in SEEDS_AT_150 if exists(n)] if not sys.argv[1:] else []
    if len(seeds) > 1:
        res["across_seeds_step150"] = across_seeds(seeds)
    for s, o in res.items():
        if s == "across_seeds_step150":
            continue
        print(f"\n### {o['run']}: step {o['step']} ({o['batches']} batches x {o['draws']} draws)")
        print("| recipe | ratio (all blocks) | cosine (all blocks; ± upper bound) | slope of ratio per block | "
              "block0 - block7 ratio | ratio per block 0..7 |")
        print("|---|---|---|---|---|---|")
        for label, r in o["recipes"].items():
            pb = " ".join(f"{c['mean']:.3f}" for c in r["ratio_per_block"])
            print(f"| {label} | {fmt(r['ratio'])} | {r['cos']['mean']:.4f} ± {r['cos']['half_upper']:.4f} | "
                  f"{fmt(r['slope_per_block'], 5)} | {fmt(r['block0_minus_last'])} | {pb} |")
        print("\nforward gain of the residual output, block 0 .. last:")
        for label, r in o["recipes"].items():
            g = r["forward_gain_block_output"]
            print(f"  {label}: {fmt(g[0])} .. {fmt(g[-1])}")
        print("\npaired ratio differences (all blocks):")
        for k, c in o["paired_ratio_diff"].items():
            print(f"  {k}: {fmt(c, 5)}")
    if "across_seeds_step150" in res:
        print(f"\n### step 150 over seeds ({', '.join(seeds)}): per seed, then mean ± 95 % t interval over seeds")
        for k, c in res["across_seeds_step150"].items():
            print(f"  {k}: {' '.join(f'{v:+.4f}' for v in c['per_seed'])} -> {c['mean']:+.4f} ± {c['half']:.4f}")
