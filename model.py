"""
A Llama-style decoder: RMSNorm, rotary position embeddings, grouped-query attention and a
SwiGLU MLP, with an untied input embedding and LM head and no biases anywhere.

Precision. Only the nn.Linear layers inside `model.layers[i]` (attention wq/wk/wv/wo and the
MLP w1/w2/w3) are candidates for 4-bit GEMMs; quant.convert swaps them later, and this file never
calls it. Each linear is called on its own; a module's `shared_input` names those that read one
input (wq, wk, wv; w1, w3), which convert may join into one GEMM of each kind. Everything else
stays high precision in every recipe: the embedding and LM head, the norms (computed in fp32),
RoPE (fp32 cos/sin, applied in fp32), the attention score/value BMMs and softmax (inside
scaled_dot_product_attention), and the cross-entropy (on fp32 logits).
Under torch.autocast(bf16) the residual stream stays fp32, because the embedding output is fp32
and every sublayer output is added onto it.

Shape suffixes: B batch, T time (sequence), D d_model, H query heads, K key/value heads,
E head_dim, V vocab, F ffn_hidden.
"""
import difflib
import math
from dataclasses import dataclass, fields, replace
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

import moe


@dataclass(kw_only=True)
class ModelConfig:
    n_layer: int
    n_head: int
    n_kv_head: int        # n_kv_head < n_head gives grouped-query attention
    d_model: int
    ffn_hidden: int       # SwiGLU hidden width (w1, w3: D -> F; w2: F -> D)
    seq_len: int          # maximum context; RoPE tables are precomputed up to it
    vocab_size: int = 50257  # GPT-2 tokenizer
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    moe: Optional[object] = None  # a moe.MoEConfig: layers >= n_dense_layers get an MoE FFN
    n_dense_layers: int = 0

    def __post_init__(self):
        self.validate()

    def validate(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type is int and (isinstance(v, bool) or not isinstance(v, int)):
                raise TypeError(f"ModelConfig.{f.name} must be an int, got {v!r}")
            if f.type is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise TypeError(f"ModelConfig.{f.name} must be a float, got {v!r}")
        for name in ('n_layer', 'n_head', 'n_kv_head', 'd_model', 'ffn_hidden', 'seq_len',
                     'vocab_size', 'rope_theta', 'norm_eps', 'init_std'):
            if not getattr(self, name) > 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_head != 0:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_head={self.n_head}")
        if (self.d_model // self.n_head) % 2 != 0:
            raise ValueError(f"head_dim = d_model/n_head = {self.d_model // self.n_head} must be "
                             "even for RoPE; change d_model or n_head")
        if self.n_head % self.n_kv_head != 0:
            raise ValueError(f"n_head={self.n_head} must be a multiple of n_kv_head={self.n_kv_head}")
        if not 0 <= self.n_dense_layers <= self.n_layer:
            raise ValueError(f"n_dense_layers={self.n_dense_layers} must lie in "
                             f"[0, n_layer={self.n_layer}]")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


PRESETS: dict[str, ModelConfig] = {
    # trains on a CPU in seconds; most of its 6.5M parameters are the two GPT-2 vocab matrices
    'tiny': ModelConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=64, ffn_hidden=192, seq_len=64),
    # ~87M parameters (61M without the input embedding), for GPU ablations
    'small': ModelConfig(n_layer=12, n_head=8, n_kv_head=4, d_model=512, ffn_hidden=1408,
                         seq_len=1024),
    # the UFP4 paper's Dense 1.5B: ~1.44B parameters with the GPT-2 vocab
    'dense-1.5b': ModelConfig(n_layer=24, n_head=16, n_kv_head=16, d_model=2048, ffn_hidden=5632,
                              seq_len=2048),
}

# the MoE presets (moe-tiny, moe-small, moe-7.9b, moe-124b) live beside MoEConfig in moe.py
PRESETS.update({name: ModelConfig(**kw) for name, kw in moe.MOE_PRESETS.items()})


def get_config(name: str, **overrides) -> ModelConfig:
    """A copy of PRESETS[name] with some fields replaced (validated again)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; valid presets: {', '.join(PRESETS)}")
    valid = [f.name for f in fields(ModelConfig)]
    for key in overrides:
        if key not in valid:
            near = difflib.get_close_matches(key, valid, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ValueError(f"unknown ModelConfig field {key!r}{hint}; "
                             f"valid fields: {', '.join(valid)}")
    return replace(PRESETS[name], **overrides)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # normalized in (at least) fp32 whatever the input dtype, returned in the input dtype
        dt = torch.promote_types(x.dtype, torch.float32)
        return F.rms_norm(x.to(dt), (x.size(-1),), self.weight.to(dt), self.eps).type_as(x)


def rope_tables(seq_len: int, head_dim: int, theta: float, device=None):
    """fp32 cos/sin tables [seq_len, head_dim/2]: angle(t, i) = t * theta^(-2i/head_dim)."""
    even = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
    inv_freq = 1.0 / theta ** (even / head_dim)
    angles_TE = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles_TE.cos(), angles_TE.sin()


def apply_rope(x_BTHE, cos_TE, sin_TE):
    """Rotate each pair (x[i], x[i + E/2]) by the angle of its position; computed in (at least) fp32."""
    x1, x2 = x_BTHE.to(torch.promote_types(x_BTHE.dtype, torch.float32)).chunk(2, dim=-1)
    cos, sin = cos_TE[None, :, None, :], sin_TE[None, :, None, :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x_BTHE)


class Attention(nn.Module):
    shared_input = ("wq", "wk", "wv")  # linears that read one input (quant.convert may join them)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.n_head * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x_BTD, cos_TE, sin_TE):
        B, T, _ = x_BTD.shape
        q_BTD, k_BTD, v_BTD = self.wq(x_BTD), self.wk(x_BTD), self.wv(x_BTD)
        q_BTHE = apply_rope(q_BTD.view(B, T, self.n_head, self.head_dim), cos_TE, sin_TE)
        k_BTKE = apply_rope(k_BTD.view(B, T, self.n_kv_head, self.head_dim), cos_TE, sin_TE)
        v_BTKE = v_BTD.contiguous().view(B, T, self.n_kv_head, self.head_dim)  # not a view of q's storage
        # query head h attends with kv head h // (n_head / n_kv_head) (enable_gqa semantics)
        y_BHTE = F.scaled_dot_product_attention(
            q_BTHE.transpose(1, 2), k_BTKE.transpose(1, 2), v_BTKE.transpose(1, 2),
            is_causal=True, enable_gqa=self.n_kv_head != self.n_head)
        return self.wo(y_BHTE.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""
    shared_input = ("w1", "w3")  # linears that read one input (quant.convert may join them)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)
        self.w3 = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)

    def forward(self, x_BTD):
        return self.w2(F.silu(self.w1(x_BTD)) * self.w3(x_BTD))


def make_ffn(cfg: ModelConfig, layer_idx: int) -> nn.Module:
    """The FFN of block `layer_idx`: an MoE for layers >= n_dense_layers when cfg.moe is set."""
    if cfg.moe is not None and layer_idx >= cfg.n_dense_layers:
        return moe.MoE(cfg)
    return MLP(cfg)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = make_ffn(cfg, layer_idx)

    def forward(self, x_BTD, cos_TE, sin_TE):
        x_BTD = x_BTD + self.attn(self.attn_norm(x_BTD), cos_TE, sin_TE)
        return x_BTD + self.ffn(self.ffn_norm(x_BTD))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()  # catches fields changed after construction
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        # RoPE tables: derived from the config, so not saved in checkpoints (persistent=False)
        cos, sin = rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta)
        self.register_buffer('rope_cos', cos, persistent=False)
        self.register_buffer('rope_sin', sin, persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """(Re)initialize every parameter and buffer in place; works after to_empty() from meta.

        Matrices ~ N(0, init_std^2), except the residual-branch outputs (wo, w2, also inside an
        MoE) ~ N(0, init_std^2 / (2 n_layer)); 1-D parameters (norm weights) = 1. Submodules that
        define their own init_weights() (e.g. an MoE FFN with other state) run it afterwards.
        """
        cfg = self.cfg
        cos, sin = rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta, device=self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)
        out_std = cfg.init_std / math.sqrt(2 * cfg.n_layer)
        for name, p in self.named_parameters():
            parts = name.split('.')
            if p.dim() == 1:
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=out_std if 'wo' in parts or 'w2' in parts else cfg.init_std)
        for m in self.modules():
            if m is not self and hasattr(m, 'init_weights'):
                m.init_weights()

    def forward(self, idx_BT, targets_BT=None):
        """Logits [B, T, V] (bf16 under autocast) and the mean cross-entropy in fp32, or None.

        Targets equal to -1 are ignored. FFNs that expose a tensor `aux_loss` after their forward
        (e.g. an MoE load-balancing loss) have it added to the loss.
        """
        if idx_BT.dim() != 2:
            raise ValueError(f"idx must be [batch, time] token ids, got shape {tuple(idx_BT.shape)}")
        T = idx_BT.size(1)
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds the model's seq_len={self.cfg.seq_len}; "
                             "crop the input or build the model with a larger seq_len")
        cos_TE, sin_TE = self.rope_cos[:T], self.rope_sin[:T]
        x_BTD = self.tok_emb(idx_BT)
        for block in self.layers:
            x_BTD = block(x_BTD, cos_TE, sin_TE)
        logits_BTV, loss = self.head(x_BTD, targets_BT)
        if targets_BT is None:
            return logits_BTV, None
        aux = [b.ffn.aux_loss for b in self.layers if getattr(b.ffn, 'aux_loss', None) is not None]
        if aux:
            loss = loss + sum(aux)
        return logits_BTV, loss

    def head(self, x_BTD, targets_BT=None):
        """Final norm, LM head and cross-entropy (fp32 logits), apart so that it can be compiled
        on its own when each block is compiled separately."""
        logits_BTV = self.lm_head(self.norm(x_BTD))
        if targets_BT is None:
            return logits_BTV, None
        return logits_BTV, F.cross_entropy(logits_BTV.float().flatten(0, 1), targets_BT.flatten(), ignore_index=-1)

    def num_params(self, exclude_embedding: bool = True, active: bool = False) -> int:
        """Parameter count; the input embedding is left out by default (it does no matmul).
        active: only those one token uses (an MoE's routed experts it is not sent to are left out)."""
        n = sum(p.numel() for p in self.parameters())
        if active:
            n -= sum(b.ffn.inactive_params() for b in self.layers if isinstance(b.ffn, moe.MoE))
        return n - self.tok_emb.weight.numel() if exclude_embedding else n

    def flops_per_token(self, seq_len: Optional[int] = None) -> int:
        """Training FLOPs per token (forward + backward), the convention used for MFU.

        6N for the matmuls with the N weights a token uses (N excludes the input embedding, a
        lookup, and an MoE's unchosen routed experts; it includes the LM head), plus attention
        scores and values: 2 BMMs x 2 FLOPs x 3 (fwd+bwd)
        x n_layer x d_model x seq_len, halved for the causal mask = 6 n_layer d_model seq_len.
        """
        cfg = self.cfg
        seq_len = cfg.seq_len if seq_len is None else seq_len
        n = self.num_params(exclude_embedding=True, active=True)
        return 6 * n + 6 * cfg.n_layer * cfg.d_model * seq_len

    @torch.no_grad()
    def generate(self, idx_BT, max_new_tokens: int, temperature: float = 1.0,
                 top_k: Optional[int] = None):
        """Append max_new_tokens sampled tokens to idx [B, T]; each step sees the last seq_len
        tokens. temperature 0 is greedy; top_k keeps only the k most likely tokens."""
        if max_new_tokens < 0 or temperature < 0:
            raise ValueError(f"need max_new_tokens >= 0 and temperature >= 0, "
                             f"got {max_new_tokens} and {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be a positive int or None, got {top_k}")
        for _ in range(max_new_tokens):
            logits_BV = self(idx_BT[:, -self.cfg.seq_len:])[0][:, -1, :].float()
            if temperature == 0:
                next_B1 = logits_BV.argmax(dim=-1, keepdim=True)
            else:
                logits_BV = logits_BV / temperature
                if top_k is not None:
                    kth = torch.topk(logits_BV, min(top_k, logits_BV.size(-1))).values[:, [-1]]
                    logits_BV = logits_BV.masked_fill(logits_BV < kth, float('-inf'))
                next_B1 = torch.multinomial(F.softmax(logits_BV, dim=-1), num_samples=1)
            idx_BT = torch.cat([idx_BT, next_B1], dim=1)
        return idx_BT
