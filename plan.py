"""
Plan a run before asking for GPUs: for a config and a world size, the parameters, the memory one
GPU needs under FSDP2 (train.py with train.parallel=fsdp) and the communication of one step.
Nothing is allocated: the model is built on the meta device; the rest is the arithmetic below.

    python plan.py configs/moe-124b.toml --world-size 64 [--ep 8] [--section.key=value ...]
        [--gpu-gb 141] [--reserve-gb 8] [--gpus-per-node 8] [--bw-intra 300] [--bw-inter 45] [--mfu 0.4]

Memory of one GPU (GB = 1e9 bytes). P parameters, N GPUs; fully_shard splits every tensor along
dim 0, padded to a multiple of N, so a GPU holds P/N and a little more.
  weights, gradients   fp32 shards: 4 + 4 bytes x P/N
  AdamW                exp_avg and exp_avg_sq, fp32 shards: 8 bytes x P/N
  accumulation         with grad_accum > 1 the micro-steps skip the reduce-scatter, so FSDP2 keeps
                       unsharded fp32 gradients: 4 bytes x P, the whole model's, on every GPU
  gathered             the bf16 copies FSDP2 all-gathers: the block computed now and the next one
                       (prefetch), and in the backward that block's bf16 gradient and its fp32 copy
                       for the reduce-scatter: 2+2+2+4 bytes x the largest block; the root (final
                       norm, LM head) stays gathered from its forward to its backward: 2+2+4 bytes
  activations          what autograd keeps for the backward in eager PyTorch (torch.compile often
                       keeps less), per block, for T = B x S tokens of a micro-batch (bf16 = 2 bytes,
                       the residual stream and norms fp32 = 4 bytes; D width, H heads, K kv heads
                       of width E, F the MLP width, k experts per token of width Fe, shared width Fs,
                       M ~ T k rows of the expert-sorted buffer):
                         attention  4TD (norm input) + 3 x 2TD (its output cast for wq, wk, wv;
                                    1 x when a 4-bit recipe joins them: quant.convert)
                                    + 2TD (q) + 2 x 2TKE (k, v) + 2TD (output, = wo's input) + 4TH
                         MLP        4TD + 2 x 2TD (casts for w1, w3; 1 x joined) + 4 x 2TF (w1 x,
                                    silu, w3 x, their product)
                         MoE        4TD + 4TD (fp32 router input) + 4TE (scores) + 4TkD (the
                                    copies of each token, fp32, kept by index_copy) + 2MD (sorted
                                    tokens) + 4 x 2MFe + 4TkD (the experts' outputs, fp32, kept to
                                    weight them) + shared experts 2 x 2TD (1 x joined) + 4 x 2TFs
                       With recipe.pack_saved the quantized linears keep their input as codes + scales
                       (0.5 + scale bytes / block per element) in place of the casts and w2's input.
                       With activation checkpointing only each block's input is kept, 4TD.
  LM head              fp32 log-probabilities 4TV kept, plus at their peak the bf16 logits, their
                       fp32 copy and the gradient: 2 + 4 + 4 bytes x TV
  working set          one block's activations once more: rebuilt from its input (checkpointing)
                       or the gradients of its activations in the backward
  quantization         4-bit recipes: two bf16 copies of the largest weight (quantized operands)
  reserve              CUDA context, NCCL buffers, allocator fragmentation (--reserve-gb)

Communication of one GPU per step (a ring moves (N-1)/N of the tensor through every GPU):
  all-gather of the bf16 block weights in the forward and again in the backward (blocks reshard
  after their forward), the root's once, the fp32 embedding twice: every micro-step;
  reduce-scatter of the fp32 gradients: once per step. Time = bytes / bandwidth, NVLink inside a
  node (--bw-intra, GB/s per GPU), the network once the group spans nodes (--bw-inter); compute =
  training FLOPs (model.flops_per_token) / (--mfu x 989 TFLOP/s). FSDP2 overlaps the two, so a step
  takes about the larger; when communication is larger, the run is communication-bound.

Expert parallelism (--ep, train.ep; expert_parallel.py): a GPU holds E/ep experts of every MoE layer,
still sharded over the n/ep GPUs that hold the same ones, so their states stay 16 bytes x P/n, but a
block gathers only its E/ep experts, over n/ep GPUs: (n/ep - 1)/(n/ep) of their bytes. In place of
the rest, tokens move: per MoE layer and micro-step, T k rows of D activations (bf16) go out to the
experts and come back, and their gradients likewise: 4 x T k D x a bytes (6 x with activation
checkpointing, which runs the forward twice), of which (ep-1)/ep leave the GPU under balanced routing,
(ep-g)/ep leave its node of g GPUs. The all-to-all sits between the router and the experts, so it is
not overlapped: it adds to the step.
"""
import argparse
import math
import sys
from dataclasses import dataclass

import torch

import expert_parallel
import moe
import quant
import train

GB = 1e9
BATCHES = (1, 2, 4, 8, 16, 32)
RANGES = [('world_size', lambda v: v >= 1, '>= 1'), ('gpu_gb', lambda v: v > 0, '> 0'),
          ('reserve_gb', lambda v: v >= 0, '>= 0'), ('gpus_per_node', lambda v: v >= 1, '>= 1'),
          ('bw_intra', lambda v: v > 0, '> 0'), ('bw_inter', lambda v: v > 0, '> 0'),
          ('mfu', lambda v: 0 < v <= 1, '(0, 1]')]


@dataclass
class Setup:
    """The model (on the meta device) as FSDP2 groups it, and what the memory depends on."""
    model: torch.nn.Module
    mcfg: object         # model.ModelConfig
    recipe: object       # quant.Recipe
    act_bytes: int       # 2: bf16 autocast (train.py on CUDA); 4: float32
    grad_accum: int
    reserve: float       # bytes
    ep: int = 1          # expert-parallel degree

    def experts(self, block) -> int:  # routed expert parameters of one block (0: dense)
        return self.numel(block.ffn.experts.parameters()) if isinstance(block.ffn, moe.MoE) else 0

    def numel(self, params) -> int:
        return sum(p.numel() for p in params)

    @property
    def blocks(self) -> list:  # one FSDP2 unit each: what a GPU gathers (its E/ep experts)
        return [self.numel(b.parameters()) - self.experts(b) * (self.ep - 1) // self.ep for b in self.model.layers]

    @property
    def root(self) -> int:  # the root unit: final norm and LM head (the embedding is a unit of its own)
        return self.numel(self.model.norm.parameters()) + self.numel(self.model.lm_head.parameters())


def setup(cfg, reserve_gb: float, ep: int = 1) -> Setup:
    mcfg, recipe = train.resolve(cfg)
    model = train.build_model(mcfg, recipe, torch.device('meta'))
    act_bytes = 4 if cfg.train.dtype == 'float32' else 2
    return Setup(model, mcfg, recipe, act_bytes, cfg.data.grad_accum, reserve_gb * GB, ep)


def shard_numel(p, n: int) -> int:
    """Elements of one GPU's shard of p: dim 0 split in n, padded (fully_shard's layout)."""
    rows = p.shape[0] if p.dim() else 1
    return math.ceil(rows / n) * (p.numel() // max(rows, 1))


def joined(block) -> tuple:
    """Whether quant.convert joined (wq, wk, wv) and the MLP's or shared experts' (w1, w3) into one
    quantized linear (one kept copy of their input)."""
    mlp = block.ffn.shared if isinstance(block.ffn, moe.MoE) else block.ffn
    is_joined = lambda layer: isinstance(layer, quant.QLinear) and layer.join is not None  # noqa: E731
    return is_joined(block.attn.wq), mlp is not None and is_joined(mlp.w1)


def packed_bytes(recipe, experts: bool = False) -> float:
    """Bytes per element of X kept as codes + scales (recipe.pack_saved: quant.packs_saved, moe.experts_pack_saved for
    the routed experts' grouped GEMMs), else 0."""
    if not (moe.experts_pack_saved(recipe) if experts else quant.packs_saved(recipe)):
        return 0.0
    s = recipe.wgrad_x
    return 0.5 + (4 if s.scale == "fp32" else 1) / s.block


def block_activations(mcfg, ffn, T: int, a: int, r: int = 4, joins: tuple = (False, False),
                      packed: float = 0.0, packed_experts: float = 0.0) -> dict:
    """Bytes autograd keeps for one block's backward (module docstring); a = activation bytes;
    joins = joined(block): linears of one input that run as one quantized linear keep one cast of it; packed =
    packed_bytes(recipe): the quantized linears keep their input as that many bytes per element
    (the casts and w2's input are then freed; wo's input stays, kept by the attention);
    packed_experts = packed_bytes(recipe, experts=True), the same for the routed experts."""
    D, H, K, E = mcfg.d_model, mcfg.n_head, mcfg.n_kv_head, mcfg.head_dim
    F = mcfg.ffn_hidden
    cast = a != r  # under bf16 autocast every linear keeps its own bf16 copy of the fp32 norm output
    casts_attn, casts_mlp = (1 if joins[0] else 3), (1 if joins[1] else 2)
    kept_in = lambda n: n * packed if packed else (n * a if cast else r)  # noqa: E731 (per T x D)
    attn = r * T * D + kept_in(casts_attn) * T * D + 2 * a * T * D + 2 * a * T * K * E + 4 * T * H + 4 * T
    attn += packed * T * D  # wo's input, packed beside the attention's own copy
    if not isinstance(ffn, moe.MoE):
        mlp = r * T * D + kept_in(casts_mlp) * T * D + (3 * a + (packed or a)) * T * F + 4 * T
        return {'attention': attn, 'ffn': mlp}
    m, k = ffn.cfg, ffn.cfg.top_k
    Fs = m.n_shared_experts * m.expert_hidden
    M = -(-(T * k + 15 * m.n_routed_experts) // 16) * 16  # moe.dispatch: groups padded to 16 rows
    routing = 4 * T * m.n_routed_experts + 28 * T * k  # scores; ids, rows and weights per (token, slot)
    pe = packed_experts or a  # the sorted tokens and w2's input, kept whole or packed
    experts = r * T * k * D + pe * M * D + (3 * a + pe) * M * m.expert_hidden + 4 * T * k * D
    shared_in = casts_mlp * (packed or (a if cast else 0)) * T * D  # fp32: the router's input is X
    shared = shared_in + (3 * a + (packed or a)) * T * Fs if Fs else 0
    return {'attention': attn, 'ffn': 2 * r * T * D + 4 * T + routing + experts + shared}


def head_activations(mcfg, T: int, a: int, r: int = 4) -> int:
    """Bytes kept by the final norm, the LM head and the loss (log-probabilities, token ids)."""
    D, V = mcfg.d_model, mcfg.vocab_size
    return r * T * D + (a if a != r else r) * T * D + 4 * T + 4 * T * V + 16 * T


def memory(s: Setup, B: int, ac: bool, n: int) -> dict:
    """Bytes per GPU by kind, for micro-batch B, activation checkpointing on or off, n GPUs."""
    T, a, params = B * s.mcfg.seq_len, s.act_bytes, list(s.model.parameters())
    experts = {p for b in s.model.layers if s.experts(b) for p in b.ffn.experts.parameters()}
    # under expert parallelism: E/ep experts, split along dim 1 over the n/ep GPUs that hold them
    held = [(p.shape[0] // s.ep * shard_numel(p[0], n // s.ep), p.numel() // s.ep) if p in experts and s.ep > 1
            else (shard_numel(p, n), p.numel()) for p in params]
    per_block = [sum(block_activations(s.mcfg, b.ffn, T, a, joins=joined(b), packed=packed_bytes(s.recipe),
                                       packed_experts=packed_bytes(s.recipe, True)).values())
                 for b in s.model.layers]
    return {
        'weights (fp32 shard)': 4 * sum(h[0] for h in held),
        'gradients (fp32 shard)': 4 * sum(h[0] for h in held),
        'AdamW states (fp32 shards)': 8 * sum(h[0] for h in held),
        'unsharded gradients (grad_accum > 1)': 4 * sum(h[1] for h in held) if s.grad_accum > 1 else 0,
        'gathered weights, block gradients': (3 * a + 4) * max(s.blocks) + (2 * a + 4) * s.root,
        'activations kept': len(per_block) * 4 * T * s.mcfg.d_model if ac else sum(per_block),
        'LM head (kept + logits at their peak)': head_activations(s.mcfg, T, a) + (2 + 4) * T * s.mcfg.vocab_size,
        'working set (one block)': max(per_block),
        'quantization scratch': 2 * 2 * max(h[1] for h in held) if s.recipe.quantized() else 0,
        'reserve': s.reserve,
    }


def total_gb(s: Setup, B: int, ac: bool, n: int) -> float:
    return sum(memory(s, B, ac, n).values()) / GB


def communication(s: Setup, n: int) -> tuple:
    """(all-gather bytes, reduce-scatter bytes) through one GPU per step. Under expert parallelism
    the E/ep experts of a GPU go round the n/ep GPUs that hold them, the rest round all n."""
    ring, emb = (n - 1) / n, s.numel(s.model.tok_emb.parameters())
    dp = n // s.ep
    local = sum(s.experts(b) for b in s.model.layers) / s.ep  # this GPU's experts
    dense, ring_dp = sum(s.blocks) - local, (dp - 1) / dp
    gather = s.grad_accum * (ring * (2 * s.act_bytes * dense + s.act_bytes * s.root + 2 * 4 * emb)
                             + ring_dp * 2 * s.act_bytes * local)
    return gather, 4 * (ring * (s.numel(s.model.parameters()) - local * s.ep) + ring_dp * local)


def all_to_all(s: Setup, B: int, ac: bool, g: int) -> tuple:
    """(bytes that leave the GPU, bytes that leave its node) per step in the token all-to-alls of
    expert parallelism, under balanced routing; g GPUs per node."""
    moes = [b.ffn for b in s.model.layers if isinstance(b.ffn, moe.MoE)]
    if s.ep == 1 or not moes:
        return 0.0, 0.0
    T, k = B * s.mcfg.seq_len * s.grad_accum, moes[0].cfg.top_k
    rows = (6 if ac else 4) * T * k * s.mcfg.d_model * s.act_bytes * len(moes)
    return rows * (s.ep - 1) / s.ep, rows * max(0, s.ep - g) / s.ep


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], allow_abbrev=False,
                                 usage='python plan.py CONFIG --world-size N [--section.key=value ...] [options]')
    ap.add_argument('config')
    ap.add_argument('--world-size', type=int, required=True, help='GPUs (FSDP2 ranks)')
    ap.add_argument('--ep', type=int, default=1, help='expert-parallel degree (train.ep)')
    ap.add_argument('--gpu-gb', type=float, default=141.0, help='memory of one GPU, GB (H200: 141)')
    ap.add_argument('--reserve-gb', type=float, default=8.0, help='CUDA context, NCCL, fragmentation')
    ap.add_argument('--gpus-per-node', type=int, default=8)
    ap.add_argument('--bw-intra', type=float, default=300.0, help='GB/s per GPU inside a node (NVLink)')
    ap.add_argument('--bw-inter', type=float, default=45.0, help='GB/s per GPU across nodes (a 400 Gb/s NIC)')
    ap.add_argument('--mfu', type=float, default=0.4, help='assumed model FLOPs utilization')
    args, overrides = ap.parse_known_args(argv)
    for arg in overrides:  # the rest are --section.key=value for train.load_config
        key, eq, _ = arg.removeprefix('--').partition('=')
        if not (arg.startswith('--') and eq and '.' in key):
            ap.error(f'unrecognized argument {arg!r}; config overrides are --section.key=value')
    for flag, ok, words in RANGES:
        if not (ok(getattr(args, flag)) and math.isfinite(getattr(args, flag))):
            ap.error(f"--{flag.replace('_', '-')}={getattr(args, flag)} is out of range; valid: {words}")
    cfg = train.load_config(args.config, overrides)
    s = setup(cfg, args.reserve_gb, args.ep)
    expert_parallel.check(args.ep, args.world_size, s.mcfg, 'fsdp')
    report(args, cfg, s)


def report(args, cfg, s: Setup):
    model, n, cap = s.model, args.world_size, args.gpu_gb
    B, ac, S, accum = cfg.data.batch_size, cfg.train.activation_checkpointing, s.mcfg.seq_len, cfg.data.grad_accum
    moes = [b.ffn for b in model.layers if isinstance(b.ffn, moe.MoE)]
    print(f'{cfg.model.preset} ({args.config}) on {n} GPUs of {cap:g} GB, FSDP2 (train.parallel=fsdp), '
          + (f'expert parallelism ep={s.ep}, ' if s.ep > 1 else '') +
          f'recipe {cfg.quant.recipe}, activations {"fp32" if s.act_bytes == 4 else "bf16"}')
    print(f'parameters: {model.num_params(False) / 1e9:.3f}B total ({model.num_params() / 1e9:.3f}B without the '
          f'input embedding), {model.num_params(True, active=True) / 1e9:.3f}B active per token (without the '
          f'embedding); {len(model.layers)} blocks ({len(moes)} MoE), the largest {max(s.blocks) / 1e9:.3f}B')
    print(f'batch: {B} x {S} tokens per micro-step and GPU, grad_accum {accum}: '
          f'{B * S * accum * n:,} tokens per step')

    print(f'\nmemory per GPU, GB (data.batch_size={B}; activation checkpointing off | on):')
    off, on = memory(s, B, False, n), memory(s, B, True, n)
    for k in off:
        print(f'  {k:38s} {off[k] / GB:9.1f}' + (f' | {on[k] / GB:.1f}' if on[k] != off[k] else ''))
    t_off, t_on = total_gb(s, B, False, n), total_gb(s, B, True, n)
    fit = lambda gb: 'fits' if gb <= cap else 'does not fit'
    print(f'  {"total":38s} {t_off:9.1f} | {t_on:.1f}   ({fit(t_off)} | {fit(t_on)} in {cap:g} GB)')
    print('\nGB per GPU by micro-batch (data.batch_size); * = does not fit')
    print(' ' * 28 + ''.join(f'{b:>9d}' for b in BATCHES))
    for name, on_ in (('checkpointing off', False), ('checkpointing on', True)):
        row = [total_gb(s, b, on_, n) for b in BATCHES]
        print(f'  {name:26s}' + ''.join(f'{v:8.1f}{"*" if v > cap else " "}' for v in row))

    gather, scatter = communication(s, n)
    nodes = math.ceil(n / args.gpus_per_node)
    bw = args.bw_intra if nodes == 1 else args.bw_inter
    t_comm = (gather + scatter) / (bw * GB)
    flops = model.flops_per_token(S) * B * S * accum
    t_comp = flops / (args.mfu * train.PEAK_FLOPS)
    print(f'\ncommunication per GPU and step: all-gather {gather / GB:,.1f} GB (weights, forward and backward, '
          f'every micro-step) + reduce-scatter {scatter / GB:,.1f} GB (fp32 gradients)')
    print(f'  at {bw:g} GB/s ({"one node" if nodes == 1 else f"{nodes} nodes: the network"}): {t_comm:.2f} s; '
          f'compute {flops:.3g} FLOP at {100 * args.mfu:.0f}% MFU: {t_comp:.2f} s -> '
          + (f'communication-bound, x{t_comm / t_comp:.1f}' if t_comm > t_comp else
             f'compute-bound (communication {100 * t_comm / t_comp:.0f}% of compute, overlapped)'))
    t_a2a = expert_report(args, s, B, ac, t_comm, t_comp, moes) if s.ep > 1 else 0.0
    verdict(args, cfg, s, t_comm, t_comp, moes, bw, t_a2a)


def expert_report(args, s: Setup, B: int, ac: bool, t_comm, t_comp, moes) -> float:
    """The expert-parallel part of the report; returns the all-to-all's time (not overlapped)."""
    n, g, ep, m = args.world_size, args.gpus_per_node, s.ep, moes[0].cfg
    gpu, node = all_to_all(s, B, ac, g)
    t_a2a = (gpu - node) / (args.bw_intra * GB) + node / (args.bw_inter * GB)
    local = sum(s.experts(b) for b in s.model.layers) / ep
    print(f'expert parallelism, ep={ep}: a GPU holds {m.n_routed_experts // ep} of the {m.n_routed_experts} '
          f'experts of each MoE layer ({local / 1e9:.2f}B parameters, {16 * local / n * ep / GB:.1f} GB of fp32 '
          'weights, gradients and AdamW states, ' + (f'sharded over the {n // ep} GPUs that hold the same experts)'
                                                      if n > ep else 'not sharded further)'))
    print(f'  token all-to-all per GPU and step: {gpu / GB:,.1f} GB out of the GPU, {node / GB:,.1f} GB of them '
          f'out of the node ({"6" if ac else "4"} passes of T k D bf16 per MoE layer; '
          f'ep {"<=" if ep <= g else ">"} {g} GPUs per node): {t_a2a:.2f} s, not overlapped')
    print(f'  step ~ max(FSDP2 {t_comm:.2f} s, compute {t_comp:.2f} s) + all-to-all {t_a2a:.2f} s = '
          f'{max(t_comm, t_comp) + t_a2a:.2f} s')
    return t_a2a


def verdict(args, cfg, s: Setup, t_comm, t_comp, moes, bw, t_a2a=0.0):
    n, cap, B, ac = args.world_size, args.gpu_gb, cfg.data.batch_size, cfg.train.activation_checkpointing
    now = total_gb(s, B, ac, n)
    best = {on: max([b for b in BATCHES if total_gb(s, b, on, n) <= cap], default=0) for on in (False, True)}
    print('\nverdict:')
    if now <= cap:
        print(f'  fits as configured (batch_size={B}, activation_checkpointing={str(ac).lower()}): '
              f'{now:.0f} of {cap:g} GB')
    elif best[False] or best[True]:
        print(f'  does not fit as configured ({now:.0f} GB).')
    if best[False]:
        print(f'  without activation checkpointing: data.batch_size <= {best[False]}')
    if best[True]:
        print(f'  with --train.activation_checkpointing=true: data.batch_size <= {best[True]}')
    if not (best[False] or best[True]):
        more = next((k for k in (2 ** i for i in range(14)) if k > n and total_gb(s, 1, True, k) <= cap), None)
        print(f'  does not fit on {n} GPUs, not even with batch_size=1 and activation checkpointing; '
              + (f'FSDP2 alone needs >= {more} GPUs' if more else 'FSDP2 alone cannot hold it'))
    if s.grad_accum > 1:
        print('  grad_accum > 1 keeps unsharded fp32 gradients between micro-steps (above): for large models '
              'prefer grad_accum = 1 and a larger batch_size or more GPUs')
    b, step = max(best.values()), max(t_comm, t_comp) + t_a2a
    if step > t_comp and s.ep > 1:
        expert_verdict(args, s, B, ac, t_comm, t_comp, t_a2a, moes, b)
    elif t_comm > t_comp:
        print(f'  communication-bound: a step takes ~{t_comm:.1f} s, not ~{t_comp:.1f} s. FSDP2 moves about 8 '
              'bytes per parameter through every GPU each step whatever the world size, so neither more GPUs nor '
              'grad_accum help; only more tokens per micro-step do' + (f' (batch_size={b}, the largest that fits: '
              f'still x{t_comm / (t_comp * b / B):.1f})' if b > B else '') + '.')
    if moes and s.ep == 1:
        experts = sum(f.experts.w1_EFD.numel() * 3 for f in moes)
        T, D = B * s.mcfg.seq_len * s.grad_accum, s.mcfg.d_model
        a2a = 4 * 2 * T * moes[0].cfg.top_k * D * len(moes)  # dispatch + combine, forward + backward, bf16
        print(f'  MoE: the routed experts ({experts / 1e9:.1f}B parameters, '
              f'{100 * experts / s.model.num_params(False):.0f}%) are sharded like dense weights: every GPU '
              'gathers every expert and runs all of them on its own tokens. Expert parallelism (--ep, train.ep) '
              f'keeps experts in place and moves tokens instead: an all-to-all of up to ~{a2a / GB:,.0f} GB per GPU '
              f'and step (T k D bf16, 4 times per MoE layer) in place of gathering and '
              f'reduce-scattering {experts * 8 * (n - 1) / n / GB:,.0f} GB of expert weights and gradients.')


def expert_verdict(args, s: Setup, B: int, ac: bool, t_comm, t_comp, t_a2a, moes, b_max: int):
    """Why an expert-parallel step is not compute-bound, and what the unbuilt remedies would buy."""
    n, g, ep, k = args.world_size, args.gpus_per_node, s.ep, moes[0].cfg.top_k
    step = max(t_comm, t_comp) + t_a2a
    why = [f'the all-to-all ({t_a2a:.2f} s) is not overlapped' + (
        ' and alone exceeds compute (both grow with the tokens: a larger batch does not help)'
        if t_a2a > t_comp else '')]
    if t_comm > t_comp:
        why.append(f'FSDP2 ({t_comm:.2f} s) exceeds compute: ' + (
            f'each GPU still gathers its 1/{ep} of the experts over {n // ep} GPUs on other nodes'
            if ep < n and n > g else 'the dense weights alone'))
    print(f'  communication-bound: a step takes ~{step:.1f} s, not ~{t_comp:.1f} s, because ' + '; '.join(why) + '.')
    nodes, t_limited = math.ceil(ep / g), t_a2a
    if nodes > 1:  # node-limited routing: a token's experts on at most m nodes, one copy per node
        m = min(4, nodes)
        cut = k * (ep - g) / ep / (m * (nodes - 1) / nodes)
        gpu, node = all_to_all(s, B, ac, g)
        t_limited = (gpu - node) / (args.bw_intra * GB) + node / cut / (args.bw_inter * GB)
        print(f"  node-limited routing (not built: each token's {k} experts on at most {m} of the {nodes} nodes of "
              f'its ep group, one copy per node, fanned out inside) would cut the bytes leaving the node x{cut:.1f}: '
              f'all-to-all ~{t_limited:.2f} s')
    print(f'  overlapping the all-to-all with compute (not built: two halves of the micro-batch in flight) would '
          f'take the step to ~max(FSDP2, compute, all-to-all) = {max(t_comm, t_comp, t_a2a):.2f} s')
    x = b_max / B  # compute and all-to-all scale with the micro-batch, FSDP2 does not
    best = max(t_comm, t_comp * x, t_limited * x)
    print(f'  with overlap{" and node-limited routing" if nodes > 1 else ""}, at batch_size={b_max} (the largest '
          f'that fits): ~max(FSDP2 {t_comm:.2f} s, compute {t_comp * x:.2f} s, all-to-all {t_limited * x:.2f} s) '
          f'= {best:.2f} s -> ' + ('compute-bound' if best <= t_comp * x else 'still communication-bound'))


if __name__ == '__main__':
    main(sys.argv[1:])
