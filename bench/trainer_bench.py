"""train.py as shipped, every recipe one after another on one GPU: tokens/s from each run's own log.

    python bench/trainer_bench.py configs/small.toml --recipes bf16,ufp4,e2m1,nvfp4,mxfp4,ufp4-nv \
        --steps 300 --out-dir runs/trainer_bench [-- --train.compile_mode=default ...]

Each recipe trains `--steps` steps of the config (its data, batch, compile mode; no checkpoints) in a
fresh process, into OUT_DIR/<config>-<recipe>/. From its log.jsonl, after the first `--skip` steps
(compilation, CUDA graph capture): the median of the per-step tokens/s, and the wall-clock tokens/s
from the log's time_s (evaluation and logging included). Ratios are to the bf16 run of this call.
Arguments after `--` go to every train.py run.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def read_log(path: Path, skip: int) -> dict:
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    kept = [r for r in recs if r["step"] > skip]
    if len(kept) < 2:
        raise SystemExit(f"{path}: {len(recs)} steps logged, need more than --skip={skip} + 1")
    tokens = kept[-1]["tokens"] - kept[0]["tokens"]
    return dict(steps=len(recs), median_tok_s=statistics.median(r["tok_s"] for r in kept),
                wall_tok_s=tokens / (kept[-1]["time_s"] - kept[0]["time_s"]),
                final_loss=recs[-1]["loss"], val_loss=next((r["val_loss"] for r in reversed(recs) if "val_loss" in r), None))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--recipes", default="bf16,ufp4,e2m1,nvfp4,mxfp4,ufp4-nv")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--skip", type=int, default=50, help="steps left out of the figures (compile, warmup)")
    ap.add_argument("--eval-interval", type=int, default=100)
    ap.add_argument("--out-dir", default="runs/trainer_bench")
    ap.add_argument("--label", default="", help="a suffix for the run directories (e.g. the compile mode)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args, extra = ap.parse_known_args()
    extra = [a for a in extra if a != "--"]
    name = Path(args.config).stem + (f"-{args.label}" if args.label else "")
    results = []
    for recipe in args.recipes.split(","):
        run_dir = Path(args.out_dir) / f"{name}-{recipe}"
        cmd = [sys.executable, str(ROOT / "train.py"), args.config, f"--quant.recipe={recipe}",
               f"--train.max_steps={args.steps}", f"--train.eval_interval={args.eval_interval}",
               "--train.ckpt_interval=-1", "--train.resume=false", f"--log.out_dir={run_dir}", *extra]
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode:
            print(f"FAILED {recipe} (exit {proc.returncode}):\n{proc.stderr[-3000:]}", flush=True)
            continue
        mode = next((line.split("| compile ")[1].split(" |")[0] for line in proc.stderr.splitlines() + proc.stdout.splitlines()
                     if "| compile " in line), "?")
        res = dict(recipe=recipe, compile=mode, run_s=time.time() - t0, **read_log(run_dir / "log.jsonl", args.skip))
        results.append(res)
        print(json.dumps(res), flush=True)
    base = next((r for r in results if r["recipe"] == "bf16"), None)
    print(f"\n{name}: train.py as shipped, {args.steps} steps (first {args.skip} left out), "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}, {time.strftime('%Y-%m-%d')}, "
          f"extra args {extra or 'none'}")
    print(f"{'recipe':<9} {'median tok/s':>13} {'x bf16':>7} {'wall tok/s':>11} {'x bf16':>7} {'val loss':>9}  compile")
    for r in results:
        r["x_bf16_median"] = base["median_tok_s"] / r["median_tok_s"] if base else None
        r["x_bf16_wall"] = base["wall_tok_s"] / r["wall_tok_s"] if base else None
        print(f"{r['recipe']:<9} {r['median_tok_s']:>13,.0f} {r['x_bf16_median'] or 0:>7.3f} {r['wall_tok_s']:>11,.0f} "
              f"{r['x_bf16_wall'] or 0:>7.3f} {r['val_loss'] or 0:>9.4f}  {r['compile']}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(config=args.config, steps=args.steps, skip=args.skip, extra=extra,
                                                   date=time.strftime("%Y-%m-%d"), results=results), indent=1))


if __name__ == "__main__":
    main()
