"""
Train a nanofp4 model. One script, read top to bottom: config -> distributed init -> data ->
model -> quantization -> parallelize -> optimizer -> compile -> loop.

    python train.py configs/tiny.toml [--section.key=value ...]    # e.g. --quant.recipe=ufp4
    torchrun --nproc_per_node=8 train.py configs/dense-1.5b.toml    # FSDP2 over 8 GPUs
    python train.py configs/tiny.toml --sample                     # text from the run's checkpoint
    python train.py configs/tiny.toml --export                     # sharded checkpoint -> ckpt.pt

Config: TOML sections [model] [data] [train] [optim] [quant] [log] [sample], one flat dataclass
each (below); `--section.key=value` overrides are type-checked against the field. [model] takes
`preset` (model.PRESETS) and any ModelConfig field; [quant] takes `recipe` (quant.RECIPES), and any
other [quant] key but `backend` goes, as a string, to quant.recipe_from_overrides.

Parallelism (train.parallel): 'fsdp' shards weights, gradients and optimizer states over the ranks
(FSDP2, one unit per transformer block and the root), 'ddp' keeps a whole copy per rank, 'none' is
one process; 'auto' is fsdp under torchrun. Every mode runs the same code: the model is built on the
meta device, allocated and initialized, then sharded (or not); with train.init=sharded each rank
initializes only its shards, and the initial weights then depend on the world size.

The run directory (log.out_dir) holds config.json (resolved config, git commit, package versions),
log.jsonl (a record per step) and the checkpoint: ckpt.pt, one file written by one process (model,
optimizer, step, config), or for fsdp/ddp ckpt-<step>/, written by every rank with
torch.distributed.checkpoint and committed by ckpt.json (step, config, directory); the one before
stays as ckpt.prev.*. Each carries a sha256, and the newest intact one is resumed (rundir.py: saving,
checking, the run's lock, no code from files). Either kind loads at any world size; --export turns
the sharded one into ckpt.pt. Randomness follows the seed and the position: micro-batch i = micro-step *
world + rank of a step draws its windows (numpy) and its stochastic rounding (torch's generators,
reseeded) from (seed, step, i). So a resumed run repeats an uninterrupted one bit for bit (on the
CPU), and world size and grad_accum can be traded without changing the batch. train.resume: 'auto'
continues from the newest checkpoint if any, 'true' requires one, 'false' starts afresh (an older
run's files move to old-<time>/ once the new run has checked its inputs). A resumed run says what
differs from the saved one; the LR schedule is always that of the current settings, so a larger
max_steps stretches the decay from the resumed step on. train.stop_after=N ends this invocation after N
steps with a checkpoint (job time limits), as does SIGINT or SIGTERM (exit 130 or 143; the same again
stops at once). A non-finite loss or gradient norm stops the run before the optimizer step: weights
and checkpoint never see it.
"""
import dataclasses
import difflib
import functools
import json
import logging
import math
import os
import resource
import sys
import time
import tomllib
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

import expert_parallel
import moe
import quant
import rundir
from data.loader import get_batch, load_data
from data.tokenizer import get_tokenizer
from model import ModelConfig, Transformer, get_config
from rundir import find_checkpoint, load_checkpoint, save_checkpoint  # noqa: F401 (tests use them)

PEAK_FLOPS = 989e12  # dense bf16 FLOP/s of one H100/H200 SXM: the denominator of MFU


# ----------------------------------------------------------------------------- config
@dataclass
class ModelSection:
    preset: str = 'tiny'  # a name in model.PRESETS
    overrides: dict = field(default_factory=dict)  # every other [model] key: a ModelConfig field


@dataclass
class DataConfig:
    dir: str = 'data/shakespeare'  # meta.json + uint16 shards, made by data/prepare.py
    batch_size: int = 8  # sequences per micro-step and rank
    grad_accum: int = 1  # micro-steps per optimizer step
    eval_batches: int = 4  # fixed validation batches per rank


@dataclass
class TrainConfig:
    max_steps: int = 200
    seed: int = 1337
    device: str = 'auto'  # auto (cuda if available) | cpu | cuda
    dtype: str = 'auto'  # autocast: auto (bfloat16 on CUDA, float32 on CPU) | bfloat16 | float32
    compile: bool = False
    compile_mode: str = 'auto'  # auto | default | reduce-overhead (CUDA graphs: no per-kernel launch cost
                                # on the host; one process on a GPU). auto: CUDA graphs where they can run
    parallel: str = 'auto'  # auto (fsdp under torchrun, else none) | fsdp | ddp | none
    ep: int = 1  # expert parallelism (fsdp): routed experts split over this many ranks (expert_parallel.py)
    activation_checkpointing: bool = False  # keep only each block's input; recompute the rest
    init: str = 'auto'  # fsdp: full | sharded (each rank draws only its shards) | auto: see sharded_init
    eval_interval: int = 50
    ckpt_interval: int = 0  # 0: a checkpoint at the end only; -1: none at all (benchmarks)
    resume: str = 'auto'  # auto | true | false
    stop_after: int = 0  # end this invocation after this many steps; 0: run to max_steps


@dataclass
class OptimConfig:
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # the schedule ends at lr * min_lr_ratio
    schedule: str = 'cosine'  # cosine | wsd (warmup, stable, linear decay)
    warmup_steps: int = 20
    decay_frac: float = 0.2  # wsd: the last fraction of the steps decays
    weight_decay: float = 0.1  # on the matrices of linear layers only
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0: no clipping (the norm is logged either way)


@dataclass
class QuantSection:
    recipe: str = 'bf16'  # a name in quant.RECIPES
    backend: str = 'auto'  # quantizer: auto (Triton kernels on CUDA) | torch (reference) | triton
    overrides: dict = field(default_factory=dict)  # every other [quant] key, as a string


@dataclass
class LogConfig:
    out_dir: str = 'runs/tiny'
    quant_stats_interval: int = 0  # every N steps (0: never) log alpha, NMSE, clipped and underflow
                                   # fractions per layer and operand role (that step runs eagerly)


@dataclass
class SampleConfig:
    num_samples: int = 3
    max_new_tokens: int = 200
    temperature: float = 0.8
    top_k: int = 200  # 0: no top-k
    prompt: str = ''  # empty: start from the end-of-text token


@dataclass
class Config:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    quant: QuantSection = field(default_factory=QuantSection)
    log: LogConfig = field(default_factory=LogConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)


CHOICES = {'train.device': ('auto', 'cpu', 'cuda'), 'train.dtype': ('auto', 'bfloat16', 'float32'),
           'train.resume': ('auto', 'true', 'false'), 'optim.schedule': ('cosine', 'wsd'),
           'train.parallel': ('auto', 'fsdp', 'ddp', 'none'), 'train.init': ('auto', 'full', 'sharded'),
           'train.compile_mode': ('auto', 'default', 'reduce-overhead'),
           'quant.backend': ('auto', 'torch', 'triton')}
USAGE = 'usage: python train.py CONFIG.toml [--section.key=value ...] [--sample | --export]'
# the valid values of every numeric field ([model] and [quant] are checked where they are resolved);
# floats must also be finite
RANGES = {'data.batch_size': '>= 1', 'data.grad_accum': '>= 1', 'data.eval_batches': '>= 1',
          'train.max_steps': '>= 1', 'train.seed': '>= 0', 'train.eval_interval': '>= 1',
          'train.ckpt_interval': '>= -1 (0: at the end only, -1: none)', 'train.stop_after': '>= 0',
          'optim.lr': '>= 0', 'optim.min_lr_ratio': '[0, 1]', 'optim.warmup_steps': '>= 0', 'optim.decay_frac': '[0, 1]',
          'optim.weight_decay': '>= 0', 'optim.beta1': '[0, 1)', 'optim.beta2': '[0, 1)', 'optim.eps': '> 0',
          'optim.grad_clip': '>= 0 (0: no clipping)', 'log.quant_stats_interval': '>= 0 (0: never)',
          'sample.num_samples': '>= 1', 'sample.max_new_tokens': '>= 1', 'sample.temperature': '>= 0 (0: greedy)',
          'sample.top_k': '>= 0 (0: no top-k)'}


def in_range(v, words: str) -> bool:
    """v within a range as RANGES writes it: '>= 1', '> 0', '[0, 1]' or '[0, 1)', then any comment."""
    r = words.split(' (')[0]
    if r[0] == '[':
        lo, hi = (float(x) for x in r[1:-1].split(','))
        return lo <= v and (v <= hi if r[-1] == ']' else v < hi)
    op, bound = r.split()
    return v >= float(bound) if op == '>=' else v > float(bound)


def scalar_fields(cls) -> dict:
    """Name -> type of a dataclass's bool/int/float/str fields (the ones a config can set)."""
    return {f.name: f.type for f in dataclasses.fields(cls) if f.type in (bool, int, float, str)}


def parse_value(key: str, value, typ):
    """A TOML value or a command-line string, checked against the field's type and CHOICES."""
    if isinstance(value, str) and typ is bool:
        value = {'true': True, 'false': False}.get(value.strip().lower(), value)
    elif isinstance(value, str) and typ in (int, float):
        try:
            value = typ(value)
        except ValueError:
            pass  # reported just below
    if typ is float and type(value) is int:
        value = float(value)
    if type(value) is not typ:
        raise SystemExit(f'config: {key} expects {typ.__name__}, got {value!r}')
    if value not in CHOICES.get(key, (value,)):
        raise SystemExit(f"config: {key}={value!r} is not valid; valid: {', '.join(CHOICES[key])}")
    if typ in (int, float) and not (math.isfinite(value) and in_range(value, RANGES.get(key, '> -inf'))):
        raise SystemExit(f"config: {key}={value!r} is out of range; valid: {RANGES.get(key, 'a finite number')}")
    return value


def unknown(kind: str, name: str, valid) -> SystemExit:
    near = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.0)
    hint = f" (did you mean '{near[0]}'?)" if near else ''
    return SystemExit(f"config: unknown {kind} '{name}'{hint}; valid: {', '.join(valid)}")


def load_config(path: str, overrides: list[str]) -> Config:
    """Read the TOML file, apply the `--section.key=value` overrides, check every key and type."""
    if not Path(path).is_file():
        raise SystemExit(f'config: no file {path}; the configs are in configs/*.toml\n{USAGE}')
    try:
        raw, items = tomllib.loads(Path(path).read_text(encoding='utf-8')), []
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SystemExit(f'config: {path} is not valid TOML: {e}') from e
    for section, table in raw.items():
        if not isinstance(table, dict):
            raise SystemExit(f"config: {path}: key '{section}' must be inside a [section]")
        items += [(section, key, value) for key, value in table.items()]
    for arg in overrides:
        key, eq, value = arg.removeprefix('--').partition('=')
        section, dot, name = key.partition('.')
        if not arg.startswith('--') or not eq or not dot:
            raise SystemExit(f"config: cannot read argument '{arg}'\n{USAGE}")
        items.append((section, name, value))
    cfg = Config()
    sections = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    for section, key, value in items:
        if section not in sections:
            raise unknown('section', section, sections)
        obj, valid = sections[section], scalar_fields(type(sections[section]))
        if section == 'quant' and key not in valid:  # quant.recipe_from_overrides checks these
            obj.overrides[key] = (','.join(map(str, value)) if isinstance(value, list)
                                  else str(value).lower() if isinstance(value, bool) else str(value))
            continue
        if section == 'model':  # preset, or a ModelConfig field (model.get_config's overrides)
            valid |= scalar_fields(ModelConfig)
        if key not in valid:
            raise unknown('key', f'{section}.{key}', [f'{section}.{k}' for k in valid])
        value = parse_value(f'{section}.{key}', value, valid[key])
        if section == 'model' and key != 'preset':
            obj.overrides[key] = value
        else:
            setattr(obj, key, value)
    return cfg


# ----------------------------------------------------------------------------- helpers
def init_distributed(device_name: str):
    """torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; a plain `python train.py` is a group of one."""
    if device_name == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('train.device=cuda but no CUDA device is visible; use --train.device=cpu')
    rank, world = int(os.environ.get('RANK', 0)), int(os.environ.get('WORLD_SIZE', 1))
    cuda = device_name == 'cuda' or (device_name == 'auto' and torch.cuda.is_available())
    device = torch.device('cuda', int(os.environ.get('LOCAL_RANK', 0))) if cuda else torch.device('cpu')
    if cuda:
        torch.cuda.set_device(device)
    if 'RANK' in os.environ:
        dist.init_process_group('nccl' if cuda else 'gloo', device_id=device if cuda else None)
    else:
        dist.init_process_group('nccl' if cuda else 'gloo', store=dist.HashStore(), rank=0, world_size=1)
    return rank, world, device


def resolve(cfg: Config):
    """The ModelConfig and the quant.Recipe that the [model] and [quant] sections name."""
    try:
        return (get_config(cfg.model.preset, **cfg.model.overrides),
                quant.recipe_from_overrides(cfg.quant.recipe, **cfg.quant.overrides))
    except (ValueError, TypeError) as e:  # their messages name the bad preset, key or value
        raise SystemExit(f'config: {e}') from e


def build_model(mcfg: ModelConfig, recipe, device):
    """The Transformer (fp32 master weights) with its block linears and routed experts (MoE)
    converted under the recipe. On the meta device nothing is allocated (see parallelize)."""
    with device:
        model = Transformer(mcfg)
    return moe.convert_experts(quant.convert(model, recipe), recipe)


def parallel_mode(c: TrainConfig, world: int) -> str:
    torchrun = 'TORCHELASTIC_RUN_ID' in os.environ  # launched by torchrun, even with one process
    mode = c.parallel if c.parallel != 'auto' else 'fsdp' if world > 1 or torchrun else 'none'
    if mode == 'none' and world > 1:
        raise SystemExit(f'train.parallel=none is one process, but {world} were started; use fsdp or ddp')
    return mode


def compile_mode(c: TrainConfig, mode: str, device) -> tuple:
    """(torch.compile's mode or None for no compile, why). CUDA graphs replay a whole step's kernels
    with one host call, so a small model's FP4 step (hundreds of quantize calls) no longer waits on the
    host; they need one process on a GPU (collectives and FSDP2's hooks are not captured here)."""
    if not c.compile:
        if c.compile_mode == 'reduce-overhead':
            raise SystemExit('train.compile_mode=reduce-overhead compiles the model: add --train.compile=true '
                             '(or use train.compile_mode=auto)')
        return None, 'train.compile=false'
    if c.compile_mode == 'reduce-overhead' and device.type != 'cuda':
        raise SystemExit(f'train.compile_mode=reduce-overhead captures CUDA graphs, and this run is on {device}; '
                         'use train.compile_mode=auto or default')
    if c.compile_mode == 'reduce-overhead' and mode != 'none':
        raise SystemExit(f'train.compile_mode=reduce-overhead (CUDA graphs) runs in one process, not under '
                         f'{mode}; use train.compile_mode=auto or default there')
    if c.compile_mode != 'auto':
        return c.compile_mode, f'train.compile_mode={c.compile_mode}'
    if device.type != 'cuda':
        return 'default', f'auto: no CUDA graphs on {device.type}'
    if mode != 'none':
        return 'default', f'auto: no CUDA graphs under {mode} (one process only)'
    return 'reduce-overhead', 'auto: CUDA graphs, one process on a GPU'


def sharded_init(model, c: TrainConfig, mode: str, device) -> bool:
    """Whether each rank initializes only its shards (fsdp; train.init 'auto': when the fp32 weights
    take over a quarter of the device's memory). Otherwise (full) every rank draws the whole model
    from the same seed before sharding, so the weights are those of one process at any world size."""
    if mode == 'fsdp' and c.init == 'auto':
        weight_bytes = 4 * sum(p.numel() for p in model.parameters())
        return device.type == 'cuda' and weight_bytes > torch.cuda.get_device_properties(device).total_memory / 4
    return mode == 'fsdp' and c.init == 'sharded'


def parallelize(model, cfg: Config, mode: str, device, bf16: bool, sharded: bool = False):
    """Shard (fsdp) or replicate (ddp) a model built on the meta device, and allocate and initialize
    every parameter and buffer (RoPE tables, MoE expert bias): before sharding, or (sharded) after it,
    so that no rank ever holds all of them. Returns the module to call and the one that holds the
    parameters (the same but for DDP's wrapper)."""
    if cfg.train.activation_checkpointing:  # the blocks' own forward, so parameter names are unchanged
        for block in model.layers:
            block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward, use_reentrant=False)
    if not sharded:
        model.to_empty(device=device).init_weights()
    if mode == 'fsdp':
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        # Blocks gather bf16 copies of their weights (fp32 without bf16 autocast) and reduce the
        # gradients in fp32. Block inputs are not cast and the embedding keeps fp32 weights, so the
        # residual stream stays fp32 as in one process; norm and MoE router weights are rounded to
        # bf16 (their arithmetic stays fp32).
        low = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                                   reduce_dtype=torch.float32, cast_forward_inputs=False)
        if cfg.train.ep > 1:  # routed experts split over ep ranks, then sharded over the others
            expert_parallel.shard_experts(model, cfg.train.ep, device.type, low)
        for block in model.layers:
            fully_shard(block, mesh=mesh, mp_policy=low)
        fully_shard(model.tok_emb, mesh=mesh, mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.float32))
        fully_shard(model, mesh=mesh, mp_policy=low)
    if sharded:
        model.to_empty(device=device).init_weights()
    if mode == 'ddp':  # DDP copies rank 0's weights to the others; no buffer broadcast: each rank
        # counts its own MoE load (moe.update_bias sums them)
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == 'cuda' else None,
                                       broadcast_buffers=False), model
    return model, model


def grad_sync(model, sync: bool):
    """Gradient accumulation: reduce the gradients on the last micro-step only."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)
    return model.no_sync() if isinstance(model, DistributedDataParallel) and not sync else nullcontext()


def make_optimizer(model, o: OptimConfig):
    """AdamW. Weight decay only on the matrices of linear layers: norms have no scale to pull in,
    and decaying the token embedding only shrinks the rows of rare tokens."""
    groups = [{'params': [], 'weight_decay': o.weight_decay}, {'params': [], 'weight_decay': 0.0}]
    for name, p in model.named_parameters():
        groups[0 if p.ndim >= 2 and not name.startswith('tok_emb') else 1]['params'].append(p)
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=True)  # CPU too


def lr_at(step: int, o: OptimConfig, max_steps: int) -> float:
    """Linear warmup, then cosine or WSD (stable, then linear) decay to lr * min_lr_ratio."""
    if step < o.warmup_steps:
        return o.lr * (step + 1) / o.warmup_steps
    low = o.lr * o.min_lr_ratio
    if o.schedule == 'cosine':
        t = min(1.0, (step - o.warmup_steps) / max(1, max_steps - o.warmup_steps))
        return low + 0.5 * (o.lr - low) * (1 + math.cos(math.pi * t))
    decay_start = max(o.warmup_steps, int(max_steps * (1 - o.decay_frac)))
    t = min(1.0, max(0.0, (step - decay_start) / max(1, max_steps - decay_start)))
    return o.lr - (o.lr - low) * t


def autocast_for(cfg: Config, device):
    bf16 = cfg.train.dtype == 'bfloat16' or (cfg.train.dtype == 'auto' and device.type == 'cuda')
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16), 'bfloat16' if bf16 else 'float32'


# ----------------------------------------------------------------------------- resuming
def check_same_model(path: Path, saved: dict, cfg: Config):
    run_dir = Path(cfg.log.out_dir)
    for section in ('model', 'quant'):  # a run directory holds one model trained under one recipe
        old, new = ({k: v for k, v in c[section].items() if k != 'backend'} for c in (saved['config'], asdict(cfg)))
        if old != new:
            raise SystemExit(f'{path} was trained with [{section}] {old}, not {new}. To train this one beside it, '
                             f'add --log.out_dir={run_dir}-{cfg.quant.recipe}; to start afresh in {run_dir}, add '
                             f'--train.resume=false (its files then move to {run_dir}/old-<time>/)')


def resume_notes(saved: dict, cfg: Config, world: int, tokens_per_step: int, seq_len: int, start: int) -> list:
    """What differs from the run that wrote the checkpoint. The LR schedule is always that of the
    current max_steps and [optim]: a longer run stretches the decay from where it was (the lr jumps
    to the new schedule's value at the resumed step)."""
    old, old_world, notes = saved['config'], saved.get('world_size', 1), []
    old_tokens = old['data']['batch_size'] * seq_len * old['data']['grad_accum'] * old_world
    if old_world != world:
        notes.append(f'world size {old_world} -> {world}')
    if old_tokens != tokens_per_step:
        notes.append(f'tokens per step {old_tokens:,} -> {tokens_per_step:,}')
    for section in ('data', 'train', 'optim'):
        now = asdict(getattr(cfg, section))
        notes += [f'{section}.{k} {v} -> {now[k]}' for k, v in old[section].items()
                  if k not in ('resume', 'stop_after') and now.get(k) != v]
    lr_old = lr_at(start, OptimConfig(**old['optim']), old['train']['max_steps'])
    lr_new = lr_at(start, cfg.optim, cfg.train.max_steps)
    if lr_old != lr_new:
        notes.append(f'the LR schedule follows the new settings: step {start + 1} takes lr {lr_new:.3g}, '
                     f'not {lr_old:.3g}')
    return notes


def saved_config(cfg: Config, saved: dict) -> Config:
    """The config a checkpoint was trained with ([sample] from the command line)."""
    sections = {f.name: type(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    return Config(**{k: sections[k](**v) for k, v in saved.items() if k != 'sample'}, sample=cfg.sample)


@torch.no_grad()
def evaluate(model, val: list, cfg: Config, rank: int, seq_len: int, device, autocast) -> float:
    """Mean loss over a fixed set of validation windows (eval_batches per rank)."""
    model.eval()
    total = torch.zeros((), device=device)
    for i in range(cfg.data.eval_batches):
        x, y = get_batch(val, [cfg.train.seed, 1, i, rank], cfg.data.batch_size, seq_len, device)
        torch.compiler.cudagraph_mark_step_begin()  # under CUDA graphs (train.compile_mode); else a no-op
        with autocast:
            total += model(x, y)[1].float()
    dist.all_reduce(total)
    model.train()
    return total.item() / (cfg.data.eval_batches * dist.get_world_size())


# ----------------------------------------------------------------------------- training
def train(cfg: Config, rank: int, world: int, device, stop=()):
    """Returns the run's checkpoint (None with ckpt_interval=-1). stop (rundir.stop_signals): not
    empty once SIGINT or SIGTERM came; the step in flight finishes, is saved, and rundir.Stopped says so."""
    log = tqdm.write if rank == 0 else (lambda msg: None)
    c, o, run_dir = cfg.train, cfg.optim, Path(cfg.log.out_dir)
    mode, jsonl_path = parallel_mode(c, world), run_dir / 'log.jsonl'
    cmode, why = compile_mode(c, mode, device)
    ckpt_path = run_dir / ('ckpt.pt' if mode == 'none' else 'ckpt.json')  # ckpt.json names the shards
    rundir.check_writable(run_dir)
    found = rundir.find_checkpoint_once(run_dir, log) if c.resume != 'false' else None
    if c.resume == 'true' and found is None:
        raise SystemExit(f'train.resume=true but there is no checkpoint in {run_dir}')

    mcfg, recipe = resolve(cfg)
    expert_parallel.check(c.ep, world, mcfg, mode)
    seq_len, (autocast, autocast_dtype) = mcfg.seq_len, autocast_for(cfg, device)
    check_backend(cfg.quant.backend, device)
    quant.set_backend(cfg.quant.backend)
    if found:
        check_same_model(found[2], found[1], cfg)
    start = found[0] if found else 0
    last = min(c.max_steps, start + c.stop_after) if c.stop_after else c.max_steps
    if start >= last:  # and nothing is written
        log(f'nothing to do: {found[2]} is at step {start} of max_steps={c.max_steps}; raise --train.max_steps')
        return found[2]

    # data: windows of the model's context
    data = load_data(cfg.data.dir, seq_len, mcfg.vocab_size)
    tokens_per_step = cfg.data.batch_size * seq_len * cfg.data.grad_accum * world

    # model and quantization, on the meta device: shapes only
    raw_model = build_model(mcfg, recipe, torch.device('meta'))
    flops_per_step, n_params = raw_model.flops_per_token(seq_len) * tokens_per_step, raw_model.num_params()

    # weights, sharding, optimizer, compile. One seed everywhere. A sharded init draws each shard
    # on its rank: DTensor's RNG tracker (CUDA) gives it its part of one draw, which still differs
    # from one process's weights; the CPU has no tracker, so there each rank takes its own seed.
    sharded = sharded_init(raw_model, c, mode, device)
    torch.manual_seed(c.seed + (rank if sharded and device.type == 'cpu' else 0))
    model, raw_model = parallelize(raw_model, cfg, mode, device, autocast_dtype == 'bfloat16', sharded)
    opt = make_optimizer(raw_model, o)
    graphs = cmode == 'reduce-overhead'
    forward = torch.compile(model, mode=cmode) if cmode else model

    # resume; record what runs (the inputs are checked: only now is the run directory written)
    if found:
        load_checkpoint(found[2], raw_model, opt)
    tokens = found[1].get('tokens', start * tokens_per_step) if found else 0  # cumulative over resumes
    if rank == 0:
        info = {'config': asdict(cfg), 'model_config': asdict(mcfg), 'recipe': asdict(recipe), 'parallel': mode,
                'device': str(device), 'world_size': world, 'autocast_dtype': autocast_dtype, **rundir.run_info()}
        rundir.open_run(run_dir, start, info, log)
    log(f'{f"resumed from {found[2].name} at step {start}" if start else "new run"} in {run_dir} | {world} x '
        f'{device} | {mode}{f" (ep={c.ep})" if c.ep > 1 else ""} | autocast {autocast_dtype} '
        f'| compile {cmode or "off"} ({why}) '
        f'| activation checkpointing {c.activation_checkpointing} | {n_params / 1e6:.2f}M params (without the '
        f'embedding) | {tokens_per_step:,} tokens/step')
    log(f'recipe {cfg.quant.recipe} {cfg.quant.overrides or ""}: {recipe.describe()} | backend {cfg.quant.backend}')
    for note in resume_notes(found[1], cfg, world, tokens_per_step, seq_len, start) if found else []:
        log(f'resume: {note}')

    recent, t_start = [], time.perf_counter()
    for step in tqdm(range(start, last), initial=start, total=c.max_steps, disable=rank != 0, dynamic_ncols=True):
        t0 = time.perf_counter()
        lr = lr_at(step, o, c.max_steps)
        for group in opt.param_groups:
            group['lr'] = lr
        if recipe.rht_resample:  # a fresh RHT sign vector per step, the same on every rank
            quant.resample_rht(raw_model, step)
            moe.resample_rht(raw_model, step)
        loss_sum, monitor = torch.zeros((), device=device), None
        if cfg.log.quant_stats_interval and (step + 1) % cfg.log.quant_stats_interval == 0:
            from monitor import Recorder  # statistics of every quantized operand (quant.MONITOR)
            monitor = quant.MONITOR = Recorder()
        for micro in range(cfg.data.grad_accum):
            i = micro * world + rank  # this micro-batch's index in the step's global batch
            x, y = get_batch(data['train'], [c.seed, 0, step, i], cfg.data.batch_size, seq_len, device)
            # stochastic rounding draws from torch's generators (CPU and CUDA): reseed them from the key
            torch.manual_seed(int(np.random.SeedSequence([c.seed, 2, step, i]).generate_state(1)[0]))
            if graphs:  # a new micro-step: the CUDA graphs may overwrite the last one's outputs
                torch.compiler.cudagraph_mark_step_begin()
            with grad_sync(model, micro == cfg.data.grad_accum - 1):
                with autocast:
                    _, loss = (model if monitor else forward)(x, y)
                (loss / cfg.data.grad_accum).backward()
            loss_sum += loss.detach().float()
        quant.MONITOR = None
        clip = expert_parallel.clip_grad_norm_ if c.ep > 1 else torch.nn.utils.clip_grad_norm_  # two meshes
        norm = clip(raw_model.parameters(), o.grad_clip if o.grad_clip > 0 else math.inf)
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        dist.all_reduce(loss_sum)  # gradients are averaged already; the loss is, for the log
        loss_v, norm_v = loss_sum.item() / (cfg.data.grad_accum * world), norm.item()
        if not (math.isfinite(loss_v) and math.isfinite(norm_v)):
            raise SystemExit(f'step {step + 1}: non-finite loss {loss_v} or grad norm {norm_v}; stopped before '
                             f'the update. The last good checkpoint is {ckpt_path} (if written); lower '
                             '--optim.lr, raise --optim.warmup_steps or check the data and the recipe')
        opt.step()
        opt.zero_grad(set_to_none=True)
        moe_stats = moe.update_bias(raw_model)  # MoE load balancing (every rank); {} for a dense model

        done, dt = step + 1, time.perf_counter() - t0
        recent.append(loss_v)
        tokens += tokens_per_step
        rec = {'step': done, 'loss': loss_v, 'lr': lr, 'grad_norm': norm_v, 'tokens': tokens,
               'tok_s': tokens_per_step / dt, 'mfu': flops_per_step / dt / (PEAK_FLOPS * world),
               'mem_gb': torch.cuda.max_memory_allocated(device) / 1e9 if device.type == 'cuda'
               else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,  # peak; Linux: KiB
               **moe_stats}
        if monitor is not None:
            rec['quant'] = monitor.summary()
        if done % c.eval_interval == 0 or done == c.max_steps:
            mfu = f'{100 * rec["mfu"]:.1f}%' if device.type == 'cuda' else 'n/a'  # PEAK_FLOPS is a GPU's
            rec['val_loss'] = evaluate(forward, data['val'], cfg, rank, seq_len, device, autocast)
            log(f'step {done:6d}/{c.max_steps} | loss {np.mean(recent):.4f} | val {rec["val_loss"]:.4f} | '
                f'lr {lr:.2e} | gnorm {norm_v:.3f} | {rec["tok_s"]:,.0f} tok/s | mfu {mfu} | '
                f'mem {rec["mem_gb"]:.2f} GB')
            recent = []
        rec['time_s'] = time.perf_counter() - t_start  # since this invocation's first step: eval and logging too
        if rank == 0:
            with open(jsonl_path, 'a') as f:
                f.write(json.dumps(rec) + '\n')
        due = (c.ckpt_interval and done % c.ckpt_interval == 0) or done == last
        stopping = rundir.stop_requested(stop, device)
        if c.ckpt_interval >= 0 and (due or stopping):
            save_checkpoint(ckpt_path, raw_model, opt, done, cfg, tokens=tokens, world_size=world)
        if stopping:
            raise rundir.Stopped(stop, done, ckpt_path if c.ckpt_interval >= 0 else None)
    return ckpt_path if c.ckpt_interval >= 0 else None


def check_backend(backend: str, device):
    if backend == 'triton' and device.type != 'cuda' and os.environ.get('TRITON_INTERPRET') != '1':
        raise SystemExit('quant.backend=triton runs the Triton kernels, which need a CUDA GPU here (or '
                         'TRITON_INTERPRET=1, a slow CPU interpreter, for tests); use --quant.backend=auto')


def export(cfg: Config, world: int):
    """Write the run directory's newest checkpoint as one file, ckpt.pt, in one process on the CPU
    (the model and optimizer are built whole, then filled from the shards): for --sample, for
    reading the weights with plain torch.load, and for continuing with train.parallel=none."""
    run_dir = Path(cfg.log.out_dir)
    found = find_checkpoint(run_dir)
    if world > 1 or found is None:
        raise SystemExit(f'export: run it in one process, on a run directory with a checkpoint ({run_dir})')
    step, saved, path = found
    if path.suffix == '.pt':
        return print(f'{path} (step {step}) is already the newest checkpoint, as one file')
    saved_cfg = saved_config(cfg, saved['config'])
    model = build_model(*resolve(saved_cfg), torch.device('cpu'))
    opt = make_optimizer(model, saved_cfg.optim)
    load_checkpoint(path, model, opt)
    save_checkpoint(run_dir / 'ckpt.pt', model, opt, step, saved_cfg,
                    **{k: saved[k] for k in ('tokens', 'world_size') if k in saved})
    print(f'{path} (step {step}, saved by {saved["world_size"]} ranks) -> {run_dir / "ckpt.pt"}')


def sample(cfg: Config):
    """Print text generated by the run directory's checkpoint (its own model and recipe)."""
    run_dir = Path(cfg.log.out_dir)
    found = find_checkpoint(run_dir, file_first=True)
    if found is None:
        raise SystemExit(f'sample: no checkpoint in {run_dir}; train first, or point --log.out_dir at a run')
    if found[2].suffix != '.pt':
        raise SystemExit(f'sample: the newest checkpoint in {run_dir} is sharded ({found[2].name}); write it '
                         f'as one file first: python train.py CONFIG --export --log.out_dir={run_dir}')
    device = torch.device('cuda' if cfg.train.device != 'cpu' and torch.cuda.is_available() else 'cpu')
    ckpt = torch.load(found[2], map_location=device, weights_only=True)
    saved = saved_config(cfg, ckpt['config'])
    model = build_model(*resolve(saved), device)
    model.load_state_dict(ckpt['model'])
    model.eval()
    enc, s, autocast = get_tokenizer(), cfg.sample, autocast_for(cfg, device)[0]
    torch.manual_seed(cfg.train.seed)
    idx = torch.tensor([enc.encode(s.prompt) if s.prompt else [enc.eot_token]], device=device)
    print(f'{found[2]} (step {ckpt["step"]}, recipe {saved.quant.recipe}):')
    for i in range(s.num_samples):
        with torch.no_grad(), autocast:
            out = model.generate(idx, s.max_new_tokens, temperature=s.temperature, top_k=s.top_k or None)
        ids = out[0, 0 if s.prompt else 1:].tolist()  # without the end-of-text token it starts from
        ids = [t for t in ids if t < enc.n_vocab]  # a padded vocabulary has ids with no text
        print(f'--- sample {i + 1}\n{enc.decode(ids)}')


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith('--'):
        raise SystemExit(USAGE)
    cfg = load_config(argv[0], [a for a in argv[1:] if a not in ('--sample', '--export')])
    if '--sample' in argv:
        return sample(cfg)
    rank, world, device = init_distributed('cpu' if '--export' in argv else cfg.train.device)
    if rank == 0:  # quant.py logs which quantizer runs (the PyTorch reference or the Triton kernels)
        logging.basicConfig(level=logging.INFO, format='%(name)s: %(message)s')
    try:
        if '--export' in argv:
            return export(cfg, world)
        with rundir.stop_signals() as stop:
            ckpt = train(cfg, rank, world, device, stop)
        dist.barrier()  # no rank tears the process group down while another still uses it
        if rank == 0:
            print(rundir.where(Path(cfg.log.out_dir), ckpt, argv[0]))
    except rundir.Stopped as e:
        if rank == 0:
            print(e.message(argv), file=sys.stderr)
        raise SystemExit(e.code) from None
    finally:
        rundir.release_lock(Path(cfg.log.out_dir))
        dist.destroy_process_group()


if __name__ == '__main__':
    main()
