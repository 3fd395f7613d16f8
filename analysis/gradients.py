"""Shrinkage on real gradients: every recipe's gradients and activations against BF16's, on one checkpoint.

    python -m analysis.gradients --ckpt runs/study/bf16-s1337/ckpt.pt --recipe ufp4 --recipe e2m1 \\
        --recipe "ufp4 rht=none" --batches 32 --draws 4 --out runs/study/gradients

The paper's account of E2M1: round-to-nearest on its non-uniform grid pulls values toward zero, so
every quantized GEMM returns a slightly shrunken product, and the shrinkage multiplies through the
layers of the backward pass, most for the blocks furthest from the loss. Here that is measured
directly. The checkpoint's weights are loaded into the model once per recipe (unquantized: bf16);
for each of --batches training batches (fixed windows, not the ones training drew) both run forward
and backward, and for every matrix of every block (the weight gradient g of each linear; the MoE
experts' stacked weights) and for every block's attention, FFN and residual output y:

    projection ratio  ⟨g, g_bf16⟩ / |g_bf16|²   (1: no shrinkage; below 1: shrunken along g_bf16)
    cosine            ⟨g, g_bf16⟩ / (|g| |g_bf16|)
    forward gain      ⟨y, y_bf16⟩ / |y_bf16|²   (the same projection for the outputs)

The recipe's gradient of a batch is averaged over --draws stochastic-rounding draws first (each
draw a different torch seed), so its SR noise does not lower the cosine. Each number is then a mean
over batches with its 95 % t interval. Output: gradients.json (with every batch's ratio, for
analysis.verdict), gradients.md, and gradients.png (ratio against block index, one line per recipe).
"""
import argparse
import json
from pathlib import Path

import numpy as np
import torch

import quant
import train
from analysis import OUT, md_table, pyplot
from analysis.stats import mean_ci
from model import get_config

OUTPUTS = ("attn", "ffn", "block")  # the per-block outputs whose forward gain is measured


def parse_recipe(label: str):
    """'ufp4 rht=none sr=none' -> quant.Recipe (analysis.compare's labels)."""
    name, *items = label.split()
    overrides = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"--recipe {label!r}: expected NAME [key=value ...], e.g. 'ufp4 rht=none'")
        overrides[key] = value
    try:
        return quant.recipe_from_overrides(name, **overrides)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"--recipe {label!r}: {e}") from e


def build(ckpt: dict, recipe, device):
    """The checkpoint's model with its block linears (and MoE experts) converted under recipe."""
    c = ckpt["config"]["model"]
    model = train.build_model(get_config(c["preset"], **c["overrides"]), recipe, device)
    model.load_state_dict(ckpt["model"])
    return model


def matrices(model) -> dict:
    """{name: parameter} of every matrix in the transformer blocks, in block order."""
    return {n: p for n, p in model.named_parameters() if n.startswith("layers.") and p.dim() >= 2}


def step(model, x, y, autocast) -> tuple:
    """One forward and backward: ({matrix: grad}, {(block, output): activation}), in fp32."""
    outs, handles = {}, []
    for i, block in enumerate(model.layers):
        for name, mod in (("attn", block.attn), ("ffn", block.ffn), ("block", block)):
            handles.append(mod.register_forward_hook(
                lambda m, inp, out, key=(i, name): outs.__setitem__(key, out.detach().float())))
    model.zero_grad(set_to_none=True)
    try:
        with autocast:
            loss = model(x, y)[1]
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    return {n: p.grad.detach().float().clone() for n, p in matrices(model).items()}, outs


def averaged_step(model, x, y, autocast, draws: int, seed: int) -> tuple:
    """step() averaged over `draws` stochastic-rounding draws (torch seeded per draw)."""
    grads, outs = {}, {}
    for d in range(draws):
        torch.manual_seed(int(np.random.SeedSequence([seed, d]).generate_state(1)[0]))
        g, o = step(model, x, y, autocast)
        for src, dst in ((g, grads), (o, outs)):
            for k, v in src.items():
                dst[k] = dst[k] + v / draws if k in dst else v / draws
    return grads, outs


def projection(a: torch.Tensor, ref: torch.Tensor) -> tuple:
    """(⟨a, ref⟩ / |ref|², cosine) in float64."""
    a, ref = a.double().flatten(), ref.double().flatten()
    dot = torch.dot(a, ref)
    return (dot / torch.dot(ref, ref)).item(), (dot / (a.norm() * ref.norm())).item()


def measure(ckpt: dict, recipes: dict, batches: list, draws: int, device, autocast) -> dict:
    """{recipe label: {'grads': {matrix: {'ratio': [...], 'cos': [...]}}, 'outputs': {(block, out): [...]}}},
    one value per batch, against the bf16 model (recipe 'bf16') on the same batches."""
    ref = build(ckpt, quant.RECIPES["bf16"], device)
    refs = [step(ref, x, y, autocast) for x, y in batches]
    del ref
    out = {}
    for label, recipe in recipes.items():
        model = build(ckpt, recipe, device)
        res = {"grads": {}, "outputs": {}}
        for b, ((x, y), (g_ref, o_ref)) in enumerate(zip(batches, refs)):
            g, o = averaged_step(model, x, y, autocast, draws, seed=b)
            for name in g_ref:
                ratio, cos = projection(g[name], g_ref[name])
                res["grads"].setdefault(name, {"ratio": [], "cos": []})
                res["grads"][name]["ratio"].append(ratio)
                res["grads"][name]["cos"].append(cos)
            for key in o_ref:
                res["outputs"].setdefault(key, []).append(projection(o[key], o_ref[key])[0])
        out[label] = res
    return out


def block_of(name: str) -> int:
    return int(name.split(".")[1])


def summarize(raw: dict) -> dict:
    """The JSON form: per recipe, per matrix and per block output, means with 95 % intervals."""
    result = {}
    for label, res in raw.items():
        layers = [{"layer": name, "block": block_of(name), "ratio": mean_ci(v["ratio"]), "cos": mean_ci(v["cos"]),
                   "ratio_per_batch": v["ratio"]} for name, v in res["grads"].items()]
        gains = [{"block": b, "output": o, "gain": mean_ci(v)} for (b, o), v in sorted(res["outputs"].items())]
        result[label] = {"layers": layers, "forward": gains}
    return result


def report(summary: dict) -> str:
    def ci(c):
        return f"{c['mean']:.5f} ± {c['half']:.5f}" if c["n"] > 1 else f"{c['mean']:.5f}"
    grad_rows = [[label, L["layer"], L["block"], ci(L["ratio"]), ci(L["cos"])]
                 for label, s in summary.items() for L in s["layers"]]
    fwd_rows = [[label, f["block"], f["output"], ci(f["gain"])] for label, s in summary.items() for f in s["forward"]]
    return ("## Weight gradients against bf16 (same batch; mean ± 95 % interval over batches)\n\n"
            + md_table(["recipe", "matrix", "block", "projection ratio ⟨g, g_bf16⟩/|g_bf16|²", "cosine"],
                       grad_rows)
            + "\n\n## Forward signal gain ⟨y, y_bf16⟩/|y_bf16|² of each block's outputs\n\n"
            + md_table(["recipe", "block", "output", "gain"], fwd_rows))


def plot(out: Path, summary: dict):
    """Projection ratio per block (mean over the block's matrices) against block index, per recipe."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for k, (label, s) in enumerate(summary.items()):
        blocks = sorted({L["block"] for L in s["layers"]})
        ratio = [np.mean([L["ratio"]["mean"] for L in s["layers"] if L["block"] == b]) for b in blocks]
        axes[0].plot(blocks, ratio, "o-", color=f"C{k % 10}", label=label)
        res = [f for f in s["forward"] if f["output"] == "block"]
        axes[1].plot([f["block"] for f in res], [f["gain"]["mean"] for f in res], "o-", color=f"C{k % 10}", label=label)
    for ax, title in zip(axes, ("weight gradient: ⟨g, g_bf16⟩/|g_bf16|² (mean over the block's matrices)",
                                "block output: ⟨y, y_bf16⟩/|y_bf16|²")):
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set(xlabel="block (0: nearest the input, furthest from the loss)", title=title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "gradients.png", dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m analysis.gradients", description=__doc__.split("\n")[0])
    p.add_argument("--ckpt", type=Path, required=True, help="ckpt.pt of a bf16 run (train.py)")
    p.add_argument("--recipe", action="append", default=[], help="a recipe label, e.g. 'ufp4 rht=none' "
                   "(repeatable; default: ufp4, e2m1, nvfp4, mxfp4, ufp4-nv)")
    p.add_argument("--batches", type=int, default=32, help="training batches to average over")
    p.add_argument("--draws", type=int, default=4, help="stochastic-rounding draws averaged per batch")
    p.add_argument("--batch", type=int, default=None, help="sequences per batch (default: the run's)")
    p.add_argument("--data", default=None, help="data directory (default: the run's)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--seed", type=int, default=0, help="picks the batches")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    if args.batches < 2 or args.draws < 1:
        raise SystemExit(f"--batches must be >= 2 (an interval needs two) and --draws >= 1; got {args.batches}, "
                         f"{args.draws}")
    if not args.ckpt.is_file():
        raise SystemExit(f"no checkpoint at {args.ckpt}; train.py writes RUN_DIR/ckpt.pt (--log.out_dir)")
    labels = args.recipe or ["ufp4", "e2m1", "nvfp4", "mxfp4", "ufp4-nv"]
    recipes = {label: parse_recipe(label) for label in labels}
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    ckpt = torch.load(args.ckpt, map_location="cpu", weights_only=True)
    cfg, mcfg = ckpt["config"], get_config(ckpt["config"]["model"]["preset"], **ckpt["config"]["model"]["overrides"])
    shards = train.load_data(args.data or cfg["data"]["dir"], mcfg.seq_len, mcfg.vocab_size)["train"]
    batches = [train.get_batch(shards, [args.seed, 7, b], args.batch or cfg["data"]["batch_size"], mcfg.seq_len, device)
               for b in range(args.batches)]
    summary = summarize(measure(ckpt, recipes, batches, args.draws, device, autocast))
    text = f"Checkpoint {args.ckpt} (step {ckpt['step']}), {args.batches} batches, {args.draws} SR draws each.\n\n"
    text += report(summary)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gradients.md").write_text(text + "\n")
    meta = {"ckpt": str(args.ckpt), "step": ckpt["step"], "batches": args.batches, "draws": args.draws,
            "device": str(device)}
    (args.out / "gradients.json").write_text(json.dumps({**meta, "recipes": summary}, indent=1) + "\n")
    if not args.no_plots:
        plot(args.out, summary)
    print(f"wrote {args.out / 'gradients'}.md, .json" + ("" if args.no_plots else ", .png"))
    return summary


if __name__ == "__main__":
    main()
