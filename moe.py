"""Mixture-of-experts FFN: a token-choice top-k router, fine-grained routed experts and shared experts.

Routing. The router (an nn.Linear named `router`, computed in fp32 and never quantized) scores every
token against the E routed experts with a sigmoid (DeepSeek-V3) or a softmax. A token picks its top-k
experts, optionally only inside the best `topk_groups` of `n_groups` expert groups. Selection adds a
per-expert bias that no gradient touches: after every optimizer step update_bias() moves it by
±bias_update_rate toward the experts that got fewer tokens (auxiliary-loss-free balancing), so load
evens out without a loss term that pulls against the LM loss. The combine weights are the unbiased
scores of the chosen experts (sigmoid scores renormalized over the k) times route_scale. An optional
sequence-level balance loss (seq_aux_loss_coef > 0) is left in `aux_loss`; model.py adds it.

Dispatch is dropless: every (token, slot) pair is copied into one buffer sorted by expert. Each
expert's group starts at a multiple of 16 (of the block, for 32-element blocks) and is padded with
zero rows; the buffer has a fixed size, the unused tail going to the last expert. The experts run as
grouped GEMMs (SwiGLU, w1 and w3 side by side in one): torch._grouped_mm on CUDA, a loop over experts
elsewhere. On CUDA no shape or branch depends on the routing, so nothing waits for the GPU and the
layer compiles to one graph (e4m3 scales aside: below).

Quantization. Each grouped GEMM is one autograd Function with the recipe's six operand roles, the
grouped twin of quant.QLinearFn (docs/NUMERICS.md §6):
  fprop  y = x·w[e]ᵀ    x rows along D, w[e] along D           (fprop_x, fprop_w)
  dgrad  dx = dy·w[e]   dy rows along F, w[e] along F (dim 1)   (dgrad_dy, dgrad_w)
  wgrad  dw[e] = dyᵀ·x  dy and x along the tokens (dim 0)       (wgrad_dy, wgrad_x)
Groups are aligned and zero-padded, so no block spans two experts: quantizing the whole buffer gives
what quantizing each expert's tokens alone gives; likewise w[E, N, K] along N is quantized as the
columns of one [E·N, K] matrix. Two cases are done expert by expert instead: the e4m3 scale (its fp32
tensor scale belongs to one expert, as for separate tensors; the token groups' bounds are then read
on the host) and 16x16 weight tiles. Shared experts are plain nn.Linear layers that quant.convert
swaps like the dense MLP; convert_experts() hands the routed experts their recipe.

Shape suffixes: B batch, S sequence, T tokens (B·S), D d_model, E routed experts, K top_k,
F expert_hidden, G expert groups, M rows of the sorted padded buffer, N output features, L layers.
"""
import logging
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from torch.distributed.tensor import DTensor

import quant
import rht as rht_lib

log = logging.getLogger("nanofp4.moe")


@dataclass(frozen=True)
class MoEConfig:
    n_routed_experts: int = 8
    top_k: int = 2
    expert_hidden: int = 32         # F: SwiGLU width of one routed expert (a multiple of 16)
    n_shared_experts: int = 1       # always-on experts, run as one SwiGLU of width n_shared * F
    score_func: str = "sigmoid"     # sigmoid | softmax
    n_groups: int = 1               # group-limited routing: experts come only from the best
    topk_groups: int = 1            #   topk_groups of n_groups equal groups (1, 1: off)
    route_scale: float = 1.0        # multiplies the combine weights
    bias_update_rate: float = 1e-3  # balancing bias step per update_bias() call (0: off)
    seq_aux_loss_coef: float = 0.0  # sequence-level balance loss weight (0: off)

    def __post_init__(self):
        E, K, G = self.n_routed_experts, self.top_k, self.n_groups
        F_ = self.expert_hidden
        problems = [
            (self.score_func not in ("sigmoid", "softmax"), f"score_func={self.score_func!r}: sigmoid or softmax"),
            (not 1 <= K <= E, f"top_k={K} must lie in [1, n_routed_experts={E}]"),
            (F_ <= 0 or F_ % 16, f"expert_hidden={F_} must be a positive multiple of 16 (the 4-bit block)"),
            (self.n_shared_experts < 0, f"n_shared_experts={self.n_shared_experts} must be >= 0"),
            (G < 1 or E % G, f"n_groups={G} must divide n_routed_experts={E}"),
            (not 1 <= self.topk_groups <= G, f"topk_groups={self.topk_groups} must lie in [1, n_groups={G}]"),
            (K > self.topk_groups * (E // max(G, 1)), f"top_k={K} exceeds the experts in topk_groups groups"),
            (min(self.bias_update_rate, self.seq_aux_loss_coef) < 0, "the rate and the loss coef must be >= 0"),
        ]
        for bad, msg in problems:
            if bad:
                raise ValueError(f"MoEConfig: {msg}")


# ----------------------------------------------------------------------------- grouped GEMMs
GEMM = {"name": "auto", "logged": set()}  # auto (grouped on CUDA bf16), grouped, loop


def set_gemm(name: str):
    """Choose the expert GEMM: 'grouped' (torch._grouped_mm), 'loop' (one matmul per expert), 'auto'."""
    quant.check_choice("expert GEMM", name, ("auto", "grouped", "loop"))
    GEMM["name"] = name


def _grouped(a) -> bool:
    use = GEMM["name"] == "grouped" or (GEMM["name"] == "auto" and a.is_cuda and a.dtype == torch.bfloat16)
    if use and not hasattr(torch, "_grouped_mm"):
        raise RuntimeError("torch._grouped_mm is missing in this PyTorch; use set_gemm('loop') or torch >= 2.8")
    path = "torch._grouped_mm" if use else "a loop over experts"
    if not torch.compiler.is_compiling() and path not in GEMM["logged"]:  # a log call breaks the graph
        log.info(f"expert GEMMs: {path}")
        GEMM["logged"].add(path)
    return use


def _bounds(offs_E):
    ends = offs_E.tolist()  # a host sync: only the loop paths (no _grouped_mm, e4m3 buffers) need it
    return list(zip([0] + ends[:-1], ends))


# The loops run eagerly under torch.compile (bounds are data): one graph break per GEMM, no recompiles
@torch.compiler.disable
def _loop_gmm(a_MK, b_EKN, offs_E):
    return torch.cat([a_MK[s:e] @ b_EKN[i] for i, (s, e) in enumerate(_bounds(offs_E))])


@torch.compiler.disable
def _loop_gmm_wgrad(dy_MN, x_MK, offs_E):
    return torch.stack([dy_MN[s:e].t() @ x_MK[s:e] for s, e in _bounds(offs_E)])


def _gmm(a_MK, b_EKN, offs_E):
    """[M, N]: the rows of group e times b[e]."""
    return torch._grouped_mm(a_MK, b_EKN, offs=offs_E) if _grouped(a_MK) else _loop_gmm(a_MK, b_EKN, offs_E)


def _gmm_wgrad(dy_MN, x_MK, offs_E):
    """[E, N, K]: dy[rows of e]ᵀ · x[rows of e]; zero for a group without rows."""
    if not _grouped(dy_MN):
        return _loop_gmm_wgrad(dy_MN, x_MK, offs_E)
    dw_ENK = torch._grouped_mm(dy_MN.t(), x_MK, offs=offs_E)
    return torch.where((torch.diff(offs_E, prepend=offs_E[:1] * 0) > 0)[:, None, None], dw_ENK, 0)


def _fake_quantize(t, spec, dim, signs, keep_rotated, offs_E):
    """quant.fake_quantize of an [E, N, K] weight or an [M, ·] buffer, each expert's slice on its own.
    SR draws from torch's global generators, as in quant.gemm_operands."""
    q = lambda p, d: quant.fake_quantize(p, spec, d, signs=signs, keep_rotated=keep_rotated)
    if spec.scale != "e4m3" and not spec.block_2d:  # every block lies inside one expert: one call
        # [E, N, K] along N: the columns of [E·N, K] (the kernels read them in place, no transpose)
        if t.dim() == 3 and dim % 3 == 1 and t.shape[1] % spec.block == 0:
            return q(t.flatten(0, 1), 0).unflatten(0, t.shape[:2])
        return q(t, dim)
    if t.dim() == 3:
        return torch.stack([q(w, dim - 1 if dim > 0 else dim) for w in t.unbind(0)])
    return _quantize_groups(q, t, dim, offs_E)


@torch.compiler.disable
def _quantize_groups(q, t_M, dim, offs_E):
    return torch.cat([p if p.numel() == 0 else q(p, dim) for p in (t_M[s:e] for s, e in _bounds(offs_E))])


def _gemm_operands(a, spec_a, dim_a, b, spec_b, dim_b, signs, offs_E):
    """quant.gemm_operands for grouped GEMMs: the same keep_rotated rule."""
    both = quant.both_rotated(spec_a, spec_b)
    return [t if s is None else quant.dequantize_any(t, both) if isinstance(t, quant.QTensor)
            else _fake_quantize(t, s, d, signs, both, offs_E) for t, s, d in ((a, spec_a, dim_a), (b, spec_b, dim_b))]


def experts_pack_saved(recipe) -> bool:
    """recipe.pack_saved for the experts: quant.packs_saved, and no e4m3 scale (its tensor scale is per expert)."""
    return quant.packs_saved(recipe) and recipe.wgrad_x.scale != "e4m3"


def _grouped_fprop(x_MK, offs_E, recipe, signs, w_parts):
    w_ENK = torch.cat(w_parts, 1) if len(w_parts) > 1 else w_parts[0]
    qx, qw = _gemm_operands(x_MK, recipe.fprop_x, -1, w_ENK, recipe.fprop_w, -1, signs, offs_E)
    return _gmm(qx, qw.transpose(1, 2), offs_E)


class _GroupedLinearFn(torch.autograd.Function):
    """y_MN = x_MK · w_ENK[e]ᵀ on the rows of every expert e (ends offs_E), with the recipe's six roles.
    The weights come as parts [E, N_i, K] joined along N here, so that only the parts are saved; x
    is saved as is, or (recipe.pack_saved) as its wgrad operand's codes + scales."""

    @staticmethod
    def forward(ctx, x_MK, offs_E, recipe, signs, *w_parts):
        # groups are aligned to the block: one quantization of the whole buffer when packed
        quant.keep_for_backward(ctx, x_MK, recipe, signs, experts_pack_saved(recipe), offs_E, *w_parts)
        ctx.recipe, ctx.signs = recipe, signs
        return _grouped_fprop(x_MK, offs_E, recipe, signs, w_parts)

    @staticmethod
    def backward(ctx, dy_MN):
        r, signs = ctx.recipe, ctx.signs
        x_MK, (offs_E, *w_parts) = quant.kept_for_backward(ctx)  # x_MK: or its packed wgrad operand
        w_ENK = torch.cat(w_parts, 1) if len(w_parts) > 1 else w_parts[0]
        dy_MN = dy_MN.to(w_ENK.dtype)
        qdy, qw = _gemm_operands(dy_MN, r.dgrad_dy, -1, w_ENK, r.dgrad_w, 1, signs, offs_E)
        dx_MK = _gmm(qdy, qw, offs_E)
        qdy, qx = _gemm_operands(dy_MN, r.wgrad_dy, 0, x_MK, r.wgrad_x, 0, signs, offs_E)
        dw_ENK = _gmm_wgrad(qdy, qx, offs_E)
        return dx_MK, None, None, None, *dw_ENK.split([w.shape[1] for w in w_parts], 1)


def grouped_linear(x_MK, w_ENK, offs_E, recipe, signs=None):
    """The rows of expert e (offs_E[e-1]:offs_E[e], int32 ends, aligned to 16) times w_ENK[e]ᵀ.
    w_ENK may be a tuple of weights: one GEMM, their outputs side by side (as w1, w3 of a SwiGLU).
    signs: the RHT signs (default: those of recipe.rht_seed)."""
    parts = tuple(w_ENK) if isinstance(w_ENK, (tuple, list)) else (w_ENK,)
    if signs is None:
        signs = rht_lib.random_signs(recipe.rht_seed).to(x_MK.device)
    if not torch.is_grad_enabled():  # evaluation: the forward alone (torch.compile of 2.11 passed a
        return _grouped_fprop(x_MK, offs_E, recipe, signs, parts)  # Function's arguments shifted under no_grad)
    return _GroupedLinearFn.apply(x_MK, offs_E, recipe, signs, *parts)


# ----------------------------------------------------------------------------- the MoE layer
def dispatch(idx_TK, n_experts: int, align: int = 16):
    """Where every (token, slot) goes in the expert-sorted buffer: rows [T, K], group ends offs [E]
    (int32; the last group also owns the unused tail), tokens per expert [E] and the buffer size M,
    fixed by T, K and E so that no host sync is needed. Groups start at multiples of align."""
    flat = idx_TK.flatten()
    counts_E = flat.new_zeros(n_experts).scatter_add_(0, flat, torch.ones_like(flat))
    padded_E = (counts_E + align - 1) // align * align
    expert, order = flat.sort(stable=True)
    rank = torch.arange(flat.numel(), device=flat.device) - (counts_E.cumsum(0) - counts_E)[expert]
    rows = torch.empty_like(flat).scatter_(0, order, (padded_E.cumsum(0) - padded_E)[expert] + rank)
    M = -(-(flat.numel() + (align - 1) * n_experts) // align) * align
    offs_E = padded_E.cumsum(0)
    offs_E[-1] = M
    return rows.view_as(idx_TK), offs_E.int(), counts_E, M


class SwiGLU(nn.Module):
    shared_input = ("w1", "w3")  # linears that read one input (quant.convert may join them)

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)
        self.w3 = nn.Linear(d_model, hidden, bias=False)

    def forward(self, x_TD):
        return self.w2(F.silu(self.w1(x_TD)) * self.w3(x_TD))


class GroupedExperts(nn.Module):
    """E SwiGLU experts, one [E, ...] tensor per projection, run as grouped GEMMs under `recipe`."""

    def __init__(self, n_experts: int, d_model: int, hidden: int):
        super().__init__()
        self.w1_EFD = nn.Parameter(torch.empty(n_experts, hidden, d_model))
        self.w2_EDF = nn.Parameter(torch.empty(n_experts, d_model, hidden))
        self.w3_EFD = nn.Parameter(torch.empty(n_experts, hidden, d_model))
        self.recipe, self.rht_seed = quant.RECIPES["bf16"], 0
        self.register_buffer("rht_signs", rht_lib.random_signs(0), persistent=False)  # quant.set_rht

    def block(self) -> int:
        """The largest quantization block of the recipe (16 at least): the alignment of expert groups."""
        return max([16] + [s.block for s in self.recipe.specs().values() if s is not None])

    def forward(self, x_MD, offs_E):
        dev, F_, dtype = x_MD.device.type, self.w1_EFD.shape[1], quant.compute_dtype(x_MD)
        if F_ % self.block():
            raise ValueError(f"expert_hidden={F_} must be a multiple of {self.block()}, the block of recipe "
                             f"[{self.recipe.describe()}]: change expert_hidden or the block")
        # under expert parallelism the weights are DTensors split along E: this rank's experts
        w1, w2, w3 = (w.to_local() if isinstance(w, DTensor) else w for w in (self.w1_EFD, self.w2_EDF, self.w3_EFD))
        with torch.autocast(dev, enabled=False):
            lin = lambda a, w: grouped_linear(a, w, offs_E, self.recipe, self.rht_signs)
            # w1 and w3 as one [E, 2F, D] GEMM, so x is quantized once; F is a multiple of the block,
            # so no block of that weight or of its [M, 2F] output gradient spans w1 and w3
            h1_MF, h3_MF = lin(x_MD.to(dtype), (w1.to(dtype), w3.to(dtype))).chunk(2, -1)
            return lin(F.silu(h1_MF) * h3_MF, w2.to(dtype))

    def extra_repr(self):
        return f"{tuple(self.w1_EFD.shape)} (E, F, D), recipe=[{self.recipe.describe()}]"


class MoE(nn.Module):
    """The FFN of an MoE block; built by model.make_ffn from a ModelConfig whose .moe is a MoEConfig."""

    def __init__(self, cfg):
        super().__init__()
        m = cfg.moe
        if not isinstance(m, MoEConfig):
            raise TypeError(f"ModelConfig.moe must be a moe.MoEConfig, got {type(m).__name__}")
        self.cfg, self.init_std = m, cfg.init_std
        self.out_std = cfg.init_std / math.sqrt(2 * cfg.n_layer)
        self.router = nn.Linear(cfg.d_model, m.n_routed_experts, bias=False)
        self.experts = GroupedExperts(m.n_routed_experts, cfg.d_model, m.expert_hidden)
        self.shared = SwiGLU(cfg.d_model, m.n_shared_experts * m.expert_hidden) if m.n_shared_experts else None
        self.register_buffer("expert_bias", torch.zeros(m.n_routed_experts))
        # tokens per expert since update_bias(), this rank's: counted in place, so a compiled graph (a
        # CUDA graph too) only adds to it (train.py's DDP does not broadcast buffers)
        self.register_buffer("load_E", torch.zeros(m.n_routed_experts), persistent=False)
        self.aux_loss = None
        self.dispatcher = None  # expert_parallel.Dispatcher under expert parallelism: replaces routed()
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        for name, p in self.named_parameters():
            w2 = any(part.startswith("w2") for part in name.split("."))
            nn.init.normal_(p, std=self.out_std if w2 else self.init_std)
        self.expert_bias.zero_()
        self.load_E.zero_()
        quant.set_rht(self.experts, self.experts.rht_seed)

    def inactive_params(self) -> int:
        """Parameters a token does not use: the routed experts it is not sent to."""
        return (self.cfg.n_routed_experts - self.cfg.top_k) * self.experts.w1_EFD[0].numel() * 3

    def route(self, x_TD):
        """Expert ids [T, K], fp32 combine weights [T, K] and fp32 scores [T, E]."""
        m = self.cfg
        with torch.autocast(x_TD.device.type, enabled=False):
            logits_TE = F.linear(x_TD.float(), self.router.weight.float())
        scores_TE = logits_TE.sigmoid() if m.score_func == "sigmoid" else logits_TE.softmax(-1)
        sel_TE = scores_TE.detach() + self.expert_bias  # the bias steers the choice, not the weights
        if m.n_groups > 1:  # a group's score: the sum of its two best experts (DeepSeek-V3)
            sel_TGE = sel_TE.unflatten(-1, (m.n_groups, -1))
            group_TG = sel_TGE.topk(min(2, sel_TGE.shape[-1]), -1).values.sum(-1)
            best_TG = group_TG.topk(m.topk_groups, -1).indices
            keep_TG = torch.zeros_like(group_TG, dtype=torch.bool).scatter(-1, best_TG, True)
            sel_TE = sel_TGE.masked_fill(~keep_TG.unsqueeze(-1), -math.inf).flatten(-2)
        idx_TK = sel_TE.topk(m.top_k, -1).indices
        w_TK = scores_TE.gather(-1, idx_TK)
        if m.score_func == "sigmoid":
            w_TK = w_TK / w_TK.sum(-1, keepdim=True)
        return idx_TK, w_TK * m.route_scale, scores_TE

    def forward(self, x_BSD):
        m, (B, S, D) = self.cfg, x_BSD.shape
        x_TD = x_BSD.reshape(-1, D)
        idx_TK, w_TK, scores_TE = self.route(x_TD)
        y_TKD, counts_E = (self.routed if self.dispatcher is None else self.dispatcher)(x_TD, idx_TK)
        y_TD = (y_TKD.float() * w_TK.unsqueeze(-1)).sum(1).to(y_TKD.dtype)
        if self.shared is not None:
            y_TD = y_TD + self.shared(x_TD)
        self.aux_loss = None
        if self.training:
            self.load_E += counts_E
            if m.seq_aux_loss_coef > 0:
                self.aux_loss = self.seq_aux_loss(idx_TK.view(B, S, -1), scores_TE.view(B, S, -1))
        return y_TD.view(B, S, D)

    def routed(self, x_TD, idx_TK):
        """Every token's outputs of its k experts [T, K, D], and the tokens per expert [E]."""
        rows_TK, offs_E, counts_E, M = dispatch(idx_TK, self.cfg.n_routed_experts, self.experts.block())
        x_TKD = x_TD.repeat_interleave(idx_TK.shape[1], 0)
        x_MD = x_TD.new_zeros(M, x_TD.shape[1]).index_copy(0, rows_TK.flatten(), x_TKD)
        return self.experts(x_MD, offs_E)[rows_TK], counts_E

    def seq_aux_loss(self, idx_BSK, scores_BSE):
        """DeepSeek-V3's sequence-wise balance loss: coef · Σ_e f_e·P_e averaged over sequences, with
        f_e = E · (share of the sequence's S·K picks that went to e), P_e = mean normalized score."""
        (B, _, E), picks = scores_BSE.shape, idx_BSK.flatten(1)
        f_BE = scores_BSE.new_zeros(B, E).scatter_add_(1, picks, scores_BSE.new_ones(picks.shape))
        f_BE = f_BE * E / picks.shape[1]
        p_BE = (scores_BSE / scores_BSE.sum(-1, keepdim=True)).mean(1)
        return self.cfg.seq_aux_loss_coef * (f_BE * p_BE).sum(-1).mean()


# ----------------------------------------------------------------------------- model-level helpers
def moe_layers(model):
    return [(i, b.ffn) for i, b in enumerate(model.layers) if isinstance(b.ffn, MoE)]


def convert_experts(model, recipe):
    """Give the routed experts of model.layers the recipe (after quant.convert; same bf16_first/last)."""
    recipe = quant.RECIPES[recipe] if isinstance(recipe, str) else recipe
    n = len(model.layers)
    first, last = quant.n_blocks(recipe.bf16_first, n), quant.n_blocks(recipe.bf16_last, n)
    for i, ffn in moe_layers(model):
        if first <= i < n - last:
            ffn.experts.recipe = recipe
            quant.set_rht(ffn.experts, recipe.rht_seed)
    return model


def resample_rht(model, step: int):
    """A fresh RHT sign vector for the routed experts this step (recipe.rht_resample)."""
    for _, ffn in moe_layers(model):
        quant.set_rht(ffn.experts, ffn.experts.recipe.rht_seed + step)


def _load_LE(layers):
    return torch.stack([m.load_E for _, m in layers])


def _stats(layers, load_LE) -> dict:
    ratio = (load_LE.amax(-1) / load_LE.mean(-1).clamp(min=1e-9)).tolist()
    return {"moe_load_max": max(ratio), **{f"moe_load_{i}": r for (i, _), r in zip(layers, ratio)}}


def load_stats(model) -> dict:
    """max/mean tokens per expert (1.0 = balanced) of every MoE layer, moe_load_<layer>, and the
    worst, moe_load_max, from this rank's training forwards since the last update_bias."""
    layers = moe_layers(model)
    return _stats(layers, _load_LE(layers)) if layers else {}


@torch.no_grad()
def update_bias(model) -> dict:
    """Once per optimizer step, on every rank: bias += rate · sign(mean load − load) from the tokens
    counted since the last call, summed over ranks; returns their load_stats and resets the counts."""
    layers = moe_layers(model)
    if not layers:
        return {}
    load_LE = _load_LE(layers)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(load_LE)
    for (_, m), load_E in zip(layers, load_LE):
        m.expert_bias += m.cfg.bias_update_rate * torch.sign(load_E.mean() - load_E)
        m.load_E.zero_()
    return _stats(layers, load_LE)


# ----------------------------------------------------------------------------- presets
# ModelConfig keyword arguments (model.py builds them); total / active params with the GPT-2 vocab.
MOE_PRESETS = {
    # CPU in seconds: a dense layer, then 8 experts of width 32, top-2 + 1 shared
    "moe-tiny": dict(n_layer=2, n_head=4, n_kv_head=2, d_model=64, ffn_hidden=192, seq_len=64, n_dense_layers=1,
                     moe=MoEConfig(n_routed_experts=8, top_k=2, expert_hidden=32)),
    # GPU ablations: the `small` shape, ~224M total, ~88M active (small: 87M)
    "moe-small": dict(n_layer=12, n_head=8, n_kv_head=4, d_model=512, ffn_hidden=1408, seq_len=1024,
                      n_dense_layers=1, moe=MoEConfig(n_routed_experts=32, top_k=4, expert_hidden=288)),
    # the paper's MoE 7.9B (24 x 1536, 16 heads, 128 experts top-8 + 1 shared, layer 0 dense); kv heads,
    # widths and routing groups (DeepSeek-V3 / Ling style) chosen here: ~7.98B total, ~0.85B active
    "moe-7.9b": dict(n_layer=24, n_head=16, n_kv_head=4, d_model=1536, ffn_hidden=4096, seq_len=2048,
                     n_dense_layers=1, moe=MoEConfig(n_routed_experts=128, top_k=8, expert_hidden=560,
                                                      n_groups=8, topk_groups=4, route_scale=2.5)),
    # the paper's MoE 124B (512 experts top-8 + 1 shared, layer 0 dense); depth, width, expert size
    # and routing groups chosen here: ~124.8B total, ~4.3B active
    "moe-124b": dict(n_layer=39, n_head=32, n_kv_head=4, d_model=4096, ffn_hidden=12288, seq_len=2048,
                     n_dense_layers=1, moe=MoEConfig(n_routed_experts=512, top_k=8, expert_hidden=512,
                                                      n_groups=8, topk_groups=4, route_scale=2.5)),
}
