"""train.py as shipped, every recipe one after another on one GPU: tokens/s from each run's own log.

    python bench/trainer_bench.py configs/small.toml --recipes bf16,ufp4,e2m1,nvfp4,mxfp4,ufp4-nv \
        --steps 300 --out-dir runs/trainer_bench [-- --train.compile_mode=default ...]

Each recipe trains `--steps` steps of the config (its data, batch, compile mode; no checkpoints) in a
fresh process, into OUT_DIR/<config>-<recipe>/. From its log.jsonl, after the first `--skip` steps
(compilation, CUDA graph capture): the median of the per-step tokens/s, and the wall-clock tokens/s
from the log's time_s (evaluation and logging included). Ratios are to the bf16 run of this call.
Arguments after `--` go to every train.py run.

`--warm N` first runs every recipe for 4 steps (one evaluation included), N processes at a time, into
OUT_DIR/warm/: torch.compile's caches (Inductor's and Triton's, shared by the processes) are then
filled, so the timed runs, one at a time, load their graphs instead of compiling them one after another.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


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
    ap.add_argument("--warm", type=int, default=0, metavar="N",
                    help="fill the compile caches first: every recipe 4 steps, N processes side by side")
    args, extra = ap.parse_known_args()
    extra = [a for a in extra if a != "--"]
    if args.warm < 0:
        sys.exit(f"--warm {args.warm}: the number of processes side by side, 0 (no warm-up) or more")
    name = Path(args.config).stem + (f"-{args.label}" if args.label else "")
    config, out_dir = Path(args.config).resolve(), Path(args.out_dir).resolve()  # train.py runs in ROOT
    recipes = args.recipes.split(",")

    def train_cmd(recipe, steps, eval_interval, run_dir):
        return [sys.executable, str(ROOT / "train.py"), str(config), f"--quant.recipe={recipe}",
                f"--train.max_steps={steps}", f"--train.eval_interval={eval_interval}",
                "--train.ckpt_interval=-1", "--train.resume=false", f"--log.out_dir={run_dir}", *extra]

    if args.warm:
        t0 = time.time()
        warm_dir = out_dir / "warm"
        warm_dir.mkdir(parents=True, exist_ok=True)
        for i in range(0, len(recipes), args.warm):
            batch = {}
            for r in recipes[i:i + args.warm]:
                with open(warm_dir / f"{name}-{r}.log", "w") as f:
                    batch[r] = subprocess.Popen(train_cmd(r, 4, 2, warm_dir / f"{name}-{r}"), cwd=ROOT,
                                                stdout=f, stderr=subprocess.STDOUT)
            for r, proc in batch.items():
                if proc.wait():  # the timed run will fail the same way and say so; go on
                    print(f"warm-up of {r} failed (exit {proc.returncode}): {warm_dir / f'{name}-{r}.log'}", flush=True)
        print(f"warm-up: {len(recipes)} runs, {args.warm} side by side, {time.time() - t0:.0f} s", flush=True)
    results = []
    for recipe in recipes:
        run_dir = out_dir / f"{name}-{recipe}"
        cmd = train_cmd(recipe, args.steps, args.eval_interval, run_dir)
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode:
            print(f"FAILED {recipe} (exit {proc.returncode}):\n{proc.stderr[-3000:]}", flush=True)
            continue
        mode = next((line.split("| compile ")[1].split(" |")[0] for line in proc.stderr.splitlines() + proc.stdout.splitlines()
                     if "| compile " in line), "?")
        info = json.loads((run_dir / "config.json").read_text())  # where it ran: the card on CUDA, else the device
        device = info["card"] if info["device"].startswith("cuda") else info["device"]
        res = dict(recipe=recipe, compile=mode, device=device, run_s=time.time() - t0,
                   **read_log(run_dir / "log.jsonl", args.skip))
        results.append(res)
        print(json.dumps(res), flush=True)
    base = next((r for r in results if r["recipe"] == "bf16"), None)
    print(f"\n{name}: train.py as shipped, {args.steps} steps (first {args.skip} left out), "
          f"{', '.join(sorted({r['device'] for r in results})) or '-'}, {time.strftime('%Y-%m-%d')}, "
          f"extra args {extra or 'none'}")
    print(f"{'recipe':<9} {'median tok/s':>13} {'x bf16':>7} {'wall tok/s':>11} {'x bf16':>7} {'val loss':>9}  compile")
    for r in results:
        r["x_bf16_median"] = base["median_tok_s"] / r["median_tok_s"] if base else None
        r["x_bf16_wall"] = base["wall_tok_s"] / r["wall_tok_s"] if base else None
        print(f"{r['recipe']:<9} {r['median_tok_s']:>13,.0f} {r['x_bf16_median'] or 0:>7.3f} {r['wall_tok_s']:>11,.0f} "
              f"{r['x_bf16_wall'] or 0:>7.3f} {r['val_loss'] or 0:>9.4f}  {r['compile']}")
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        Path(args.json).write_text(json.dumps(dict(
            config=args.config, steps=args.steps, skip=args.skip, extra=extra, date=time.strftime("%Y-%m-%d"),
            device=", ".join(sorted({r["device"] for r in results})) or None,
            commit=commit.stdout.strip() or None, results=results), indent=1))


if __name__ == "__main__":
    main()
