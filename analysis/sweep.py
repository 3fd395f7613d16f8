"""Sweeps: a ladder of model sizes under several recipes at one budget (scaling laws), or a named
study (a fixed list of recipe/ablation runs of one model), run one after another or in parallel.

    python -m analysis.sweep --ladder gpu-ladder --recipes bf16,ufp4,e2m1 --out runs/sweep --dry-run
    python -m analysis.sweep --ladder gpu-ladder --recipes bf16,ufp4,e2m1 --out runs/sweep --tokens-per-param 4
    python -m analysis.sweep --ladder tiny-ladder --recipes bf16,ufp4 --out /tmp/sweep \\
        --tokens-per-param 0.5 --set data.dir=/tmp/data --set model.vocab_size=128
    python -m analysis.compare /tmp/sweep/*/
    python -m analysis.scaling_fit /tmp/sweep
    python -m analysis.sweep --study recipes-small,recipes-moe-small --out runs/science --gpus 0,1 \\
        --jobs 4 --set data.dir=data/registry-mix      # compiled (CUDA graphs on one GPU), as the configs say

Parallel runs. With --gpus, runs start as soon as a slot is free: --jobs runs at a time on each GPU
(CUDA_VISIBLE_DEVICES), the most compute first. Small models leave an H200 mostly idle, so several runs on one
GPU finish sooner than the same runs one after another.

Studies (STUDIES) fix the model config, the step budget and a list of runs: a recipe, its quant
overrides (the ablations of docs/NUMERICS.md §8) and its seeds; every run of a study sees the same data
and schedule, so analysis.compare reads them against the bf16 runs of the same seed.

Every run of a seed starts from the same weights and sees the same batches, whatever its recipe.
The paired studies of docs/STUDIES.md (dense-small, moe-small) train one pass over the training
split (steps from data.dir/meta.json), evaluate on at least 1M tokens, keep no checkpoint once
finished (one is written at the end, or at a stop, to go on from) but the first seed's bf16 run's snapshots (snap-<step>.pt, for analysis.gradients), and with --results
write each finished run's compact log (analysis.runlog). --runs and --seeds pick a batch of them:

    python -m analysis.sweep --study dense-small --runs bf16,e2m1,ufp4 --seeds 1337,1338,1339 --out runs/study \
        --results studies/logs --gpus 0 --jobs 4 --set data.dir=data/registry-mix

Budget. A rung of N parameters (model.num_params(): every matmul weight, LM head included, input
embedding excluded) trains on D = tokens_per_param × N tokens (Chinchilla's compute-optimal ratio
is ~20), rounded up to whole steps; every recipe at a rung gets the same D, so the same compute
C = flops_per_token × D ≈ 6·N·D (model.flops_per_token adds the attention BMMs). With the GPT-2
vocabulary the LM head is most of N for the smallest rungs (12.9M of gpu-ladder's 15.8M at d=256).

Each run is `python train.py CONFIG --section.key=value ...` (or torchrun with --nproc) in its own
directory OUT/<rung>-<recipe>-s<seed>, so analysis.compare and analysis.scaling_fit find its
log.jsonl; OUT/sweep.json lists every run with N, D, C. A finished run (log at max_steps) is
skipped, and so, with --results, is one whose compact log there is complete (it ran on another
machine); an interrupted one resumes from its checkpoint (train.resume=auto). `--deadline SECONDS`
(or SIGTERM / Ctrl-C to the sweep) stops it cleanly: no run starts after it, the running ones get
SIGTERM (train.py finishes its step and checkpoints), and the sweep exits with status 3; the same
command goes on where it stopped (a GPU lent for minutes, a job's time limit).
The warmup is 5% of the steps and every run evaluates ~10 times (always at the last step).

MoE: a rung may set `model.preset` to a preset with an MoE config; no preset in model.PRESETS has
one yet and train.py cannot set ModelConfig.moe from the command line, so the ladders are dense.
(For MoE, C should count active parameters; num_params counts all experts.)
"""
import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

import quant
import train
from analysis import runlog
from model import Transformer, get_config

ROOT = Path(__file__).resolve().parents[1]


def rung(n_layer, d_model, n_head, ffn_hidden, seq_len, lr=None) -> dict:
    """train.py overrides for one model shape: head_dim = d_model / n_head, 2 query heads per KV head."""
    out = {"model.n_layer": n_layer, "model.d_model": d_model, "model.n_head": n_head,
           "model.n_kv_head": max(1, n_head // 2), "model.ffn_hidden": ffn_hidden, "model.seq_len": seq_len}
    return out | ({"optim.lr": lr} if lr else {})


LADDERS = {
    # CPU: seconds per run with a small vocabulary (--set model.vocab_size=128)
    "tiny-ladder": {"config": "configs/tiny.toml", "rungs": {
        "t32": rung(1, 32, 2, 64, 32),
        "t64": rung(2, 64, 4, 128, 32)}},
    # one GPU, bf16 autocast; N = 10.8M, 15.8M, 29.0M, 49.3M, 86.7M, 142M; lr ~ 1e-3 · 512 / d_model
    "gpu-ladder": {"config": "configs/small.toml", "rungs": {
        "d192": rung(3, 192, 3, 512, 1024, 2.5e-3),
        "d256": rung(4, 256, 4, 704, 1024, 2e-3),
        "d384": rung(6, 384, 6, 1024, 1024, 1.3e-3),
        "d512": rung(8, 512, 8, 1408, 1024, 1e-3),
        "d640": rung(12, 640, 10, 1728, 1024, 8e-4),
        "d768": rung(16, 768, 12, 2048, 1024, 6.7e-4)}},
}


# The paper's comparisons at one GPU's scale (issue: the science). Each run: name -> (recipe, quant
# overrides, seeds); "ufp4" is the ablation's full-RHT + SR point.
TWO_SEEDS, ONE_SEED = (1337, 1338), (1337,)
STUDIES = {
    "recipes-small": {"config": "configs/small.toml", "steps": 400, "runs": {
        "bf16": ("bf16", {}, TWO_SEEDS),
        "ufp4": ("ufp4", {}, TWO_SEEDS),
        "e2m1": ("e2m1", {}, TWO_SEEDS),
        "nvfp4": ("nvfp4", {}, ONE_SEED),
        "mxfp4": ("mxfp4", {}, ONE_SEED),
        "ufp4-nv": ("ufp4-nv", {}, ONE_SEED),
        "ufp4-rht-none": ("ufp4", {"quant.rht": "none"}, ONE_SEED),
        "ufp4-rht-wgrad": ("ufp4", {"quant.rht": "wgrad"}, ONE_SEED),
        "ufp4-rht-dgrad-wgrad": ("ufp4", {"quant.rht": "dgrad,wgrad"}, ONE_SEED),
        "ufp4-rht-fprop-wgrad": ("ufp4", {"quant.rht": "fprop,wgrad"}, ONE_SEED),
        "ufp4-sr-none": ("ufp4", {"quant.sr": "none"}, ONE_SEED)}},
    "recipes-moe-small": {"config": "configs/moe-small.toml", "steps": 400, "runs": {
        "bf16": ("bf16", {}, ONE_SEED),
        "ufp4": ("ufp4", {}, ONE_SEED),
        "e2m1": ("e2m1", {}, ONE_SEED)}},
    # CPU (tests): two recipes of tiny
    "tiny-study": {"config": "configs/tiny.toml", "steps": 6, "runs": {
        "bf16": ("bf16", {}, ONE_SEED),
        "ufp4-sr-none": ("ufp4", {"quant.sr": "none"}, ONE_SEED)}},
}

# The studies of docs/STUDIES.md: one pass over the training split (epochs), an evaluation set of at
# least eval_tokens tokens (the same windows for every run of a seed), `evals` evaluations; the bf16
# runs of the first seed keep `snapshots` checkpoints along the way (analysis.gradients reads them),
# the other runs keep none.
FIVE_SEEDS, THREE_SEEDS = tuple(range(1337, 1342)), tuple(range(1337, 1340))
RHT_ROWS = {"none": "none", "wgrad": "wgrad", "dgrad-wgrad": "dgrad,wgrad", "fprop-wgrad": "fprop,wgrad"}
PAIRED = {"epochs": 1.0, "eval_tokens": 1_000_000, "evals": 4, "snapshots": 4}
STUDIES |= {
    "dense-small": PAIRED | {"config": "configs/small.toml", "runs": {
        **{r: (r, {}, FIVE_SEEDS) for r in ("bf16", "e2m1", "ufp4")},
        **{r: (r, {}, THREE_SEEDS) for r in ("nvfp4", "mxfp4", "ufp4-nv")},
        **{f"ufp4-rht-{k}": ("ufp4", {"quant.rht": v}, THREE_SEEDS) for k, v in RHT_ROWS.items()},
        "ufp4-sr-none": ("ufp4", {"quant.sr": "none"}, THREE_SEEDS),
        **{f"ufp4-rht-{k}-sr-none": ("ufp4", {"quant.rht": v, "quant.sr": "none"}, THREE_SEEDS)
           for k, v in RHT_ROWS.items()}}},
    "moe-small": PAIRED | {"config": "configs/moe-small.toml", "runs": {
        r: (r, {}, THREE_SEEDS) for r in ("bf16", "e2m1", "ufp4")}},
    # CPU (tests): the same machinery on tiny
    "tiny-paired": {"config": "configs/tiny.toml", "epochs": 0.02, "eval_tokens": 512, "evals": 2, "snapshots": 2,
                    "runs": {"bf16": ("bf16", {}, (1, 2)), "ufp4": ("ufp4", {"quant.sr": "none"}, (1, 2))}},
}


def as_args(overrides: dict) -> list:
    return [f"--{k}={v}" for k, v in overrides.items()]


def size_of(config: str, overrides: dict):
    """(tokens per step, N, flops per token) of a run; train.py parses (and checks) its config."""
    cfg = train.load_config(config, as_args(overrides))
    with torch.device("meta"):  # shapes only: no memory, no initialization cost
        model = Transformer(get_config(cfg.model.preset, **cfg.model.overrides))
    tokens_per_step = cfg.data.batch_size * model.cfg.seq_len * cfg.data.grad_accum
    return tokens_per_step, model.num_params(), model.flops_per_token()


def budget(steps: int) -> dict:
    """train.py overrides for a run of `steps` steps: 5% warmup, ~10 evaluations, a checkpoint at the end."""
    return {"train.max_steps": steps, "optim.warmup_steps": max(1, round(0.05 * steps)),
            "train.eval_interval": max(1, steps // 10), "train.ckpt_interval": 0}


def run_entry(config: str, rung: str, run_dir: Path, recipe: str, seed: int, overrides: dict, size: tuple) -> dict:
    """One run of a sweep: its directory, train.py arguments (checked by train.py), N, D and C;
    size = (tokens per step over all GPUs, N, flops per token)."""
    tokens_per_step, n_params, fpt = size
    overrides = overrides | {"quant.recipe": recipe, "train.seed": seed, "log.out_dir": run_dir}
    cfg = train.load_config(config, as_args(overrides))
    tokens = cfg.train.max_steps * tokens_per_step
    return {"name": run_dir.name, "rung": rung, "recipe": recipe, "seed": seed, "dir": str(run_dir),
            "params": n_params, "flops_per_token": fpt, "steps": cfg.train.max_steps, "tokens": tokens,
            "compute": fpt * tokens, "config": config, "args": as_args(overrides)}


def plan(ladder: str, recipes, seeds, tokens_per_param: float, user: dict, nproc: int, out: Path,
         rungs=None) -> list:
    """Every run of the sweep (of the named rungs, default all)."""
    spec = LADDERS[ladder]
    config = str(ROOT / spec["config"])
    for name in rungs or []:
        if name not in spec["rungs"]:
            raise SystemExit(f"--rungs: {ladder} has no rung {name!r}; valid: {', '.join(spec['rungs'])}")
    runs = []
    for name, shape in spec["rungs"].items():
        if rungs and name not in rungs:
            continue
        tokens_per_step, n_params, fpt = size_of(config, shape | user)
        tokens_per_step *= nproc
        steps = max(1, math.ceil(tokens_per_param * n_params / tokens_per_step))
        runs += [run_entry(config, name, out / f"{name}-{recipe}-s{seed}", recipe, seed,
                           shape | budget(steps) | user, (tokens_per_step, n_params, fpt))
                 for recipe in recipes for seed in seeds]
    return runs


def train_tokens(config: str, user: dict) -> int:
    """Tokens in the training split of the run's data.dir (its meta.json)."""
    data_dir = Path(train.load_config(config, as_args(user)).data.dir)
    meta = data_dir / "meta.json"
    if not meta.is_file():
        raise SystemExit(f"a study of whole passes reads the corpus size from {meta}, which is missing; "
                         "prepare the data (python data/prepare.py registry-mix) or --set data.dir=DIR")
    return json.loads(meta.read_text())["train"]["tokens"]


def paired_budget(spec: dict, config: str, user: dict, nproc: int) -> tuple:
    """(overrides, steps) of a study of whole passes: steps for spec['epochs'] passes over the training
    split, eval_batches for at least spec['eval_tokens'] evaluation tokens, spec['evals'] evaluations."""
    cfg, tokens_per_step = train.load_config(config, as_args(user)), size_of(config, user)[0]
    seq_len, tokens_per_step = tokens_per_step // (cfg.data.batch_size * cfg.data.grad_accum), tokens_per_step * nproc
    steps = max(1, math.ceil(spec["epochs"] * train_tokens(config, user) / tokens_per_step))
    eval_batches = math.ceil(spec["eval_tokens"] / (cfg.data.batch_size * seq_len * nproc))
    return {"train.max_steps": steps, "optim.warmup_steps": max(1, round(0.05 * steps)),
            "train.eval_interval": max(1, steps // spec["evals"]), "data.eval_batches": eval_batches,
            "train.ckpt_interval": 0}, steps  # 0: at the end and at a stop; the sweep drops it once finished


def plan_study(study: str, seeds, user: dict, nproc: int, out: Path, only=None) -> list:
    """Every run of a named study (seeds, if given, replace each run's own; only: these run names)."""
    spec = STUDIES[study]
    config = str(ROOT / spec["config"])
    unknown_runs = sorted(set(only or []) - set(spec["runs"]))
    if unknown_runs:
        raise SystemExit(f"--runs: {study} has no run {unknown_runs[0]!r}; valid: {', '.join(spec['runs'])}")
    tokens_per_step, n_params, fpt = size_of(config, user)
    base = paired_budget(spec, config, user, nproc)[0] if "epochs" in spec else budget(spec["steps"])
    runs = []
    for name, (recipe, quant_kw, run_seeds) in spec["runs"].items():
        if only and name not in only:
            continue
        for k, seed in enumerate(seeds or run_seeds):
            snap = spec.get("snapshots", 0) if recipe == "bf16" and not quant_kw and k == 0 else 0
            extra = {"train.ckpt_interval": max(1, base["train.max_steps"] // snap)} if snap else {}
            run = run_entry(config, study, out / f"{name}-s{seed}", recipe, seed, base | quant_kw | user | extra,
                            (tokens_per_step * nproc, n_params, fpt))
            runs.append(run | {"snapshots": bool(snap), "drop_ckpt": "epochs" in spec})
    return runs


def finished(run: dict) -> bool:
    log = Path(run["dir"]) / "log.jsonl"
    if not log.is_file() or not log.read_text().strip():
        return False
    return json.loads(log.read_text().splitlines()[-1])["step"] >= run["steps"]


def logged(run: dict, results) -> bool:
    """The run finished somewhere else: its compact log in results (RESULTS/<rung>/<name>.jsonl.gz) is of
    this run (its seed, recipe and what pairs it: model, data, batch, steps, schedule) and reaches its
    last step. A batch then goes on, on another machine, from the logs alone (the run directory, with
    its checkpoint, stayed on the machine that ran it)."""
    path = Path(results) / run["rung"] / f"{run['name']}.jsonl.gz" if results else None
    if path is None or not path.is_file():
        return False
    header, recs = runlog.read_packed(path)
    # the run's config as config.json holds it (through JSON: tuples become lists, paths strings)
    cfg = json.loads(json.dumps(dataclasses.asdict(train.load_config(run["config"], run["args"])), default=str))
    logged_cfg, world = header.get("config", {}), header.get("world_size", 1)
    return (header.get("seed") == run["seed"] and logged_cfg.get("quant") == cfg["quant"]
            and runlog.pair_key(logged_cfg, world) == runlog.pair_key(cfg, world) and max(recs) >= run["steps"])


SNAPSHOT_POLL_S = 2.0
STOP = threading.Event()  # set at --deadline or on SIGTERM/SIGINT: no new run; running ones get SIGTERM
STOPPED = 3  # the sweep's exit status when it stopped early (rerun to go on)


def snapshot(run_dir: Path, seen):
    """Copy a new ckpt.pt (train.py replaces it whole at every train.ckpt_interval) to
    snap-<step>.pt, so that checkpoints from along the run survive; returns its mtime."""
    ckpt = run_dir / "ckpt.pt"
    if not ckpt.is_file() or ckpt.stat().st_mtime_ns == seen:
        return seen
    mtime = ckpt.stat().st_mtime_ns
    tmp = run_dir / "ckpt-copy.tmp"
    shutil.copyfile(ckpt, tmp)  # an open file keeps its data even if train.py replaces ckpt.pt meanwhile
    step = torch.load(tmp, map_location="cpu", mmap=True, weights_only=True)["step"]
    os.replace(tmp, run_dir / f"snap-{step:07d}.pt")
    return mtime


def launch(run: dict, nproc: int, gpu=None):
    """Run train.py in a subprocess (on one GPU if given); its output goes to RUN_DIR/train.out (the tail
    is shown on failure)."""
    launcher = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run",
                                                    "--standalone", f"--nproc_per_node={nproc}"]
    cmd = launcher + [str(ROOT / "train.py"), run["config"], *run["args"]]
    Path(run["dir"]).mkdir(parents=True, exist_ok=True)
    out_file = Path(run["dir"]) / "train.out"
    with open(out_file, "w") as f:
        env = os.environ | ({"CUDA_VISIBLE_DEVICES": str(gpu)} if gpu is not None else {})
        proc, seen, signalled = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env), None, False
        while proc.poll() is None:
            if signalled:  # (STOP stays set: waiting on it would spin)
                time.sleep(SNAPSHOT_POLL_S)
            else:
                STOP.wait(SNAPSHOT_POLL_S)
            if STOP.is_set() and not signalled:  # (torchrun passes it on to its ranks)
                proc.send_signal(signal.SIGTERM)
                signalled = True
            seen = snapshot(Path(run["dir"]), seen) if run.get("snapshots") else seen
        if run.get("snapshots"):
            snapshot(Path(run["dir"]), seen)
    if signalled and proc.returncode in (143, -signal.SIGTERM):  # stopped (with a checkpoint if it had begun)
        return False
    if proc.returncode == 0 and run.get("drop_ckpt"):  # a finished paired run keeps its log, not its states
        for name in ("ckpt.pt", "ckpt.pt.sha256", "ckpt.prev.pt", "ckpt.prev.pt.sha256"):
            (Path(run["dir"]) / name).unlink(missing_ok=True)
    if proc.returncode != 0:
        tail = "\n".join(out_file.read_text().splitlines()[-15:])
        raise SystemExit(f"run {run['name']} failed (exit {proc.returncode}); its output is in {out_file}:\n"
                         f"{tail}\ncommand: {' '.join(cmd)}")
    return True


def report(k: int, n: int, run: dict, seconds: float, results=None):
    """Print a finished run's last loss; write its compact log into results (a directory) if given."""
    if results is not None:
        runlog.pack(run["dir"], results)
    recs = [json.loads(line) for line in (Path(run["dir"]) / "log.jsonl").read_text().splitlines()]
    last, speed = recs[-1], statistics.median(r["tok_s"] for r in recs[len(recs) // 10:])  # past compiling
    print(f"[{k}/{n}] {run['name']}: loss {last['loss']:.4f} val {last.get('val_loss', float('nan')):.4f} "
          f"in {seconds:.0f}s, {speed:,.0f} tok/s", flush=True)


def run_pool(runs: list, gpus: list, jobs: int, nproc: int, results=None):
    """Run every run, `jobs` at a time on each GPU, longest (most compute) first, then by seed (so that
    whole seeds finish first); the first failure stops new launches, lets the running ones finish,
    and is raised."""
    slots = [g for g in gpus for _ in range(jobs)]
    queue = sorted(runs, key=lambda r: (-r["compute"], r["seed"]))
    lock, errors, done = threading.Lock(), [], [0]

    def worker(gpu):
        while True:
            with lock:
                if not queue or errors or STOP.is_set():
                    return
                run = queue.pop(0)
            t0 = time.time()
            try:
                if not launch(run, nproc, gpu):
                    return
            except SystemExit as e:
                with lock:
                    errors.append(e)
                return
            with lock:
                done[0] += 1
                report(done[0], len(runs), run, time.time() - t0, results and results / run["rung"])

    threads = [threading.Thread(target=worker, args=(g,)) for g in slots]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def parse_set(items) -> dict:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or "." not in key:
            raise SystemExit(f"--set {item!r}: expected section.key=value, e.g. --set data.dir=data/shakespeare")
        out[key] = value
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m analysis.sweep", description=__doc__.split("\n")[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--ladder", choices=list(LADDERS), help="model sizes x --recipes at --tokens-per-param")
    p.add_argument("--rungs", default=None, help="comma list: train only these rungs of the ladder")
    what.add_argument("--study", help=f"comma list of named studies (runs in OUT/<study>/): {', '.join(STUDIES)}")
    p.add_argument("--recipes", default="bf16,ufp4,e2m1", help="comma list of quant.RECIPES names")
    p.add_argument("--seeds", default=None, help="comma list of train.seed values (ladder default: 1337; "
                   "study default: each run's own)")
    p.add_argument("--tokens-per-param", type=float, default=20.0, help="D = this x N tokens per run")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a train.py override for every run (repeatable), e.g. data.dir=data/registry-mix")
    p.add_argument("--nproc", type=int, default=1, help="GPUs per run (torchrun when > 1)")
    p.add_argument("--out", type=Path, required=True, help="sweep directory (one subdirectory per run)")
    p.add_argument("--gpus", default=None, help="comma list of GPU indices to run on in parallel, e.g. 0,1")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time on each GPU of --gpus")
    p.add_argument("--runs", default=None, help="comma list: only these runs of the study, e.g. bf16,e2m1,ufp4")
    p.add_argument("--results", type=Path, default=None, help="write each finished run's compact log "
                   "(analysis.runlog) to RESULTS/<study or rung>/<run>.jsonl.gz")
    p.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                   help="stop cleanly this long after the start (running runs checkpoint); rerun to go on")
    p.add_argument("--dry-run", action="store_true", help="print the plan, train nothing")
    args = p.parse_args(argv)
    if args.deadline is not None and args.deadline <= 0:
        raise SystemExit(f"--deadline must be a positive number of seconds, got {args.deadline}")
    if args.tokens_per_param <= 0:
        raise SystemExit(f"--tokens-per-param must be positive, got {args.tokens_per_param}")
    if args.jobs < 1 or (args.jobs > 1 and args.gpus is None):
        raise SystemExit(f"--jobs {args.jobs}: needs --gpus and a value >= 1, e.g. --gpus 0 --jobs 4")
    if args.runs and not args.study:
        raise SystemExit("--runs picks runs of a --study; a ladder takes --rungs and --recipes")
    if args.gpus is not None and args.nproc > 1:
        raise SystemExit("--gpus runs one-GPU runs side by side; with --nproc > 1 leave --gpus out")
    recipes = args.recipes.split(",")
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else ([] if args.study else [1337])
    for r in recipes:
        if r not in quant.RECIPES:
            raise SystemExit(f"--recipes: unknown recipe {r!r}; valid: {', '.join(quant.RECIPES)}")
    if args.study:
        for name in args.study.split(","):
            if name not in STUDIES:
                raise SystemExit(f"--study: unknown study {name!r}; valid: {', '.join(STUDIES)}")
        runs = [r for name in args.study.split(",")
                for r in plan_study(name, seeds, parse_set(args.set), args.nproc, args.out.resolve() / name,
                                    args.runs.split(",") if args.runs else None)]
        manifest = {"study": args.study, "nproc": args.nproc, "runs": runs}
    else:
        runs = plan(args.ladder, recipes, seeds, args.tokens_per_param, parse_set(args.set), args.nproc,
                    args.out.resolve(), args.rungs.split(",") if args.rungs else None)
        manifest = {"ladder": args.ladder, "recipes": recipes, "seeds": seeds,
                    "tokens_per_param": args.tokens_per_param, "nproc": args.nproc, "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for r in runs:
        print(f"{r['name']:28s} N={r['params'] / 1e6:8.3f}M  D={r['tokens'] / 1e6:9.3f}M  steps={r['steps']:6d}  "
              f"C={r['compute']:.3e}")
    if args.dry_run:
        return runs
    todo, results = [], args.results and args.results.resolve()
    for k, r in enumerate(runs, 1):
        if finished(r):
            print(f"[{k}/{len(runs)}] {r['name']}: already finished")
            if results is not None:
                runlog.pack(r["dir"], results / r["rung"])
        elif logged(r, results):
            print(f"[{k}/{len(runs)}] {r['name']}: already finished (its compact log is in {results / r['rung']})")
        else:
            todo.append(r)
    STOP.clear()
    timer = threading.Timer(args.deadline, STOP.set) if args.deadline else None
    handlers = {}
    if threading.current_thread() is threading.main_thread():  # SIGTERM/SIGINT: stop as at the deadline
        handlers = {sig: signal.signal(sig, lambda *_: STOP.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if timer:
            timer.start()
        if args.gpus is not None:
            run_pool(todo, [int(g) for g in args.gpus.split(",")], args.jobs, args.nproc, results)
        else:
            for k, r in enumerate(todo, 1):
                t0 = time.time()
                if STOP.is_set() or not launch(r, args.nproc):
                    break
                report(k, len(todo), r, time.time() - t0, results and results / r["rung"])
    finally:
        if timer:
            timer.cancel()
        for sig, h in handlers.items():
            signal.signal(sig, h)
    left = [r["name"] for r in todo if not finished(r)] if STOP.is_set() else []
    if left:
        print(f"stopped early: {len(left)} of {len(runs)} runs not finished ({', '.join(left)}); the same command "
              "goes on from their checkpoints", flush=True)
        raise SystemExit(STOPPED)
    return runs


if __name__ == "__main__":
    main()
