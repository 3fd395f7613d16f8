"""Training runs as the analysis tools read them: a train.py run directory, or its compact log.

A run directory holds config.json (the resolved config, git commit, card) and log.jsonl (a record per
step). The compact log is what a study keeps and commits: one gzipped JSONL file per run, a header
line, then one line per step with the fields the analysis needs,

    {"kind": "run", "name": ..., "config": {...}, "seed": ..., "commit": ..., "card": ..., ...}
    {"step": 1, "loss": ..., "grad_norm": ..., "tok_s": ...}
    {"step": 40, "loss": ..., ..., "val_loss": ...}                    # evaluation steps

    python -m analysis.runlog runs/science/recipes-small/*/ --out studies/logs

`load` reads either form into one dict (steps, losses, the pairing key below); `pack` writes the
compact form of a run directory.

Pairing. Two runs can be compared step by step only if they saw the same initial weights and the
same batches: same seed, model, data (directory, global batch, evaluation set), steps and
optimizer schedule. `pair_key` is everything but the seed; `check_pair` names what differs.
"""
import argparse
import gzip
import json
from pathlib import Path

import numpy as np

STEP_FIELDS = ("step", "loss", "grad_norm", "tok_s", "val_loss")  # lr: the config's schedule gives it
HEADER_FIELDS = ("config", "model_config", "recipe", "world_size", "parallel", "device", "autocast_dtype",
                 "git_commit", "code_tree", "versions", "card")


def _records(lines, where: str) -> dict:
    recs = {}
    for n, line in enumerate(lines, 1):
        rec = json.loads(line)
        if "step" not in rec or "loss" not in rec:
            raise SystemExit(f"{where}:{n}: a record without 'step' and 'loss': {line[:100]}")
        recs[rec["step"]] = rec  # a step logged twice: the later record wins
    if not recs:
        raise SystemExit(f"{where} has no step record: the run has not logged a step yet")
    return recs


def read_dir(run_dir: Path) -> tuple:
    """(header, step records) of a train.py run directory."""
    log, cfg_path = run_dir / "log.jsonl", run_dir / "config.json"
    if not log.is_file() or not cfg_path.is_file():
        raise SystemExit(f"{run_dir} is not a train.py run directory (needs log.jsonl and config.json)")
    info = json.loads(cfg_path.read_text())
    header = {"kind": "run", "name": run_dir.name, "seed": info["config"]["train"]["seed"],
              **{k: info[k] for k in HEADER_FIELDS if k in info}}
    return header, _records(log.read_text().splitlines(), str(log))


def read_packed(path: Path) -> tuple:
    """(header, step records) of a compact log (NAME.jsonl.gz)."""
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines()
    header = json.loads(lines[0]) if lines else {}
    if header.get("kind") != "run":
        raise SystemExit(f"{path}: the first line is not a run header ({{\"kind\": \"run\", ...}}); "
                         "write compact logs with `python -m analysis.runlog RUN_DIR --out DIR`")
    return header, _records(lines[1:], str(path))


def compact(rec: dict) -> dict:
    """The STEP_FIELDS of a step record; losses keep every digit, tokens/s and the gradient norm 4."""
    out = {k: rec[k] for k in STEP_FIELDS if k in rec}
    for k in ("tok_s", "grad_norm"):
        if k in out:
            out[k] = float(f"{out[k]:.4g}")
    return out


def pack(run_dir, out_dir) -> Path:
    """Write OUT_DIR/<run name>.jsonl.gz from a run directory: the header, then the STEP_FIELDS of
    every step."""
    header, recs = read_dir(Path(run_dir))
    out = Path(out_dir) / f"{header['name']}.jsonl.gz"
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(header)] + [json.dumps(compact(recs[s])) for s in sorted(recs)]
    out.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), 9, mtime=0))  # the same bytes every time
    return out


def label(section: dict, name_key: str) -> str:
    """'ufp4 rht=none': a section's name plus its overrides, sorted."""
    return section[name_key] + "".join(f" {k}={v}" for k, v in sorted(section.get("overrides", {}).items()))


def pair_key(cfg: dict, world: int) -> dict:
    """What two runs must share to be compared step by step (all but the seed): the model, the data
    and its global batch and evaluation set, the steps and the optimizer."""
    d, t = cfg.get("data", {}), cfg.get("train", {})
    per_rank = d.get("batch_size", 0) * world
    return {"model": label(cfg["model"], "preset"), "data.dir": d.get("dir"),
            "global batch (sequences)": per_rank * d.get("grad_accum", 1),
            "eval sequences": per_rank * d.get("eval_batches", 0), "train.max_steps": t.get("max_steps"),
            "train.eval_interval": t.get("eval_interval"), "optim": cfg.get("optim")}


def load(path) -> dict:
    """A run from its directory or its compact log: header fields, labels and step arrays."""
    path = Path(path)
    header, recs = read_packed(path) if path.name.endswith(".jsonl.gz") else read_dir(path)
    cfg = header["config"]
    steps = np.array(sorted(recs))
    val = [s for s in steps if recs[s].get("val_loss") is not None]
    tok_s = [recs[s]["tok_s"] for s in steps[1:] if "tok_s" in recs[s]]  # step 1 includes warmup/compile
    return {"dir": str(path), "name": header.get("name", path.name), "seed": cfg["train"]["seed"],
            "recipe": label(cfg["quant"], "recipe"), "model": label(cfg["model"], "preset"),
            "key": pair_key(cfg, header.get("world_size", 1)), "max_steps": cfg["train"].get("max_steps"),
            "commit": header.get("git_commit", "unknown"), "card": header.get("card", "unknown"),
            "tok_s": float(np.median(tok_s)) if tok_s else float("nan"),
            "steps": steps, "loss": np.array([recs[s]["loss"] for s in steps], dtype=float),
            "val_steps": np.array(val, dtype=int),
            "val_loss": np.array([recs[s]["val_loss"] for s in val], dtype=float)}


def check_pair(run: dict, base: dict):
    """Refuse (SystemExit naming the difference and the fix) to compare runs that did not see the
    same weights and batches."""
    if run["seed"] != base["seed"]:
        raise SystemExit(f"{run['dir']} (seed {run['seed']}) cannot be compared with {base['dir']} (seed "
                         f"{base['seed']}): runs of different seeds start from different weights and batches; "
                         "give the baseline of the same seed")
    diff = [k for k in run["key"] if run["key"][k] != base["key"][k]]
    if diff:
        what = "; ".join(f"{k}: {run['key'][k]} vs {base['key'][k]}" for k in diff)
        raise SystemExit(f"{run['dir']} cannot be compared with {base['dir']}: they differ in {what}. Compare "
                         "runs of one study (same model, data, batch, steps and schedule)")


def expand(paths) -> list:
    """Run directories and compact logs named by paths: a directory holding *.jsonl.gz files stands
    for all of them."""
    found = []
    for p in map(Path, paths):
        packed = sorted(p.glob("*.jsonl.gz")) if p.is_dir() and not (p / "config.json").is_file() else []
        found += packed or [p]
    return found


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m analysis.runlog", description="Write compact logs (one "
                                "gzipped JSONL per run) of train.py run directories")
    p.add_argument("runs", nargs="+", help="run directories")
    p.add_argument("--out", type=Path, required=True, help="directory for the NAME.jsonl.gz files")
    args = p.parse_args(argv)
    outs = [pack(d, args.out) for d in args.runs]
    for o in outs:
        print(f"{o} ({o.stat().st_size / 1e3:.1f} kB)")
    return outs


if __name__ == "__main__":
    main()
