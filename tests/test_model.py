"""Tests of model.py: fast, CPU-only except the last (compile on a GPU)."""
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import model as M  # noqa: E402


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return M.Transformer(M.get_config('tiny', **overrides))


def random_tokens(cfg, B, T, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (B, T), generator=g)


def expected_num_params(cfg):
    """Hand count: embedding + LM head, per block wq/wk/wv/wo + w1/w2/w3 + 2 norms, final norm."""
    D, E, V = cfg.d_model, cfg.d_model // cfg.n_head, cfg.vocab_size
    attn = D * E * cfg.n_head * 2 + D * E * cfg.n_kv_head * 2
    mlp = 3 * D * cfg.ffn_hidden
    return 2 * V * D + cfg.n_layer * (attn + mlp + 2 * D) + D


# ---------------------------------------------------------------- forward, shapes, causality

def test_forward_shapes_and_initial_loss():
    m = tiny_model()
    cfg = m.cfg
    idx = random_tokens(cfg, 2, 16)
    logits, loss = m(idx)
    assert logits.shape == (2, 16, cfg.vocab_size) and logits.dtype == torch.float32
    assert loss is None
    logits, loss = m(idx, idx)
    assert loss.shape == () and loss.dtype == torch.float32
    # a fresh model predicts nearly uniformly: loss close to ln(V)
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.1


def test_targets_minus_one_are_ignored():
    m = tiny_model()
    idx = random_tokens(m.cfg, 2, 16)
    tgt = random_tokens(m.cfg, 2, 16, seed=2)
    logits, _ = m(idx)
    masked = tgt.clone()
    masked[:, 8:] = -1
    _, loss = m(idx, masked)
    V = m.cfg.vocab_size
    ref = nn.functional.cross_entropy(logits[:, :8].reshape(-1, V), tgt[:, :8].reshape(-1))
    torch.testing.assert_close(loss, ref)


def test_bad_inputs_raise():
    m = tiny_model()
    with pytest.raises(ValueError, match="seq_len"):
        m(random_tokens(m.cfg, 1, m.cfg.seq_len + 1))
    with pytest.raises(ValueError, match=r"\[batch, time\]"):
        m(random_tokens(m.cfg, 1, 8)[0])


def test_causal():
    m = tiny_model()
    idx = random_tokens(m.cfg, 2, 32)
    t = 20
    idx2 = idx.clone()
    idx2[:, t] = (idx2[:, t] + 1) % m.cfg.vocab_size
    a, _ = m(idx)
    b, _ = m(idx2)
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=1e-6)
    assert (a[:, t:] - b[:, t:]).abs().amax(dim=-1).min() > 1e-4  # every later position sees it


# ---------------------------------------------------------------- attention and RoPE references

def reference_attention(attn, x, theta):
    """Attention written out in fp64: complex-number RoPE, explicit repeat_interleave, softmax."""
    B, T, _ = x.shape
    H, K, E = attn.n_head, attn.n_kv_head, attn.head_dim
    x = x.double()
    q = (x @ attn.wq.weight.double().T).view(B, T, H, E)
    k = (x @ attn.wk.weight.double().T).view(B, T, K, E)
    v = (x @ attn.wv.weight.double().T).view(B, T, K, E)
    inv_freq = theta ** (-torch.arange(0, E, 2, dtype=torch.float64) / E)
    rot = torch.polar(torch.ones(T, E // 2, dtype=torch.float64),
                      torch.arange(T, dtype=torch.float64)[:, None] * inv_freq)  # e^{i t w}

    def rope(z):  # pair (z[i], z[i + E/2]) is the complex number z[i] + i z[i + E/2]
        c = torch.complex(z[..., :E // 2], z[..., E // 2:]) * rot[None, :, None, :]
        return torch.cat([c.real, c.imag], dim=-1)

    q, k = rope(q).transpose(1, 2), rope(k).transpose(1, 2)  # [B, H, T, E], [B, K, T, E]
    v = v.transpose(1, 2)
    k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(E)
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    probs = torch.softmax(scores.masked_fill(future, float('-inf')), dim=-1)
    y = (probs @ v).transpose(1, 2).reshape(B, T, H * E)
    return y @ attn.wo.weight.double().T


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_gqa_matches_reference_fp64(n_kv_head):
    m = tiny_model(n_kv_head=n_kv_head)
    attn = m.layers[0].attn.double()
    T = 24
    x = torch.randn(3, T, m.cfg.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    got = attn(x, m.rope_cos[:T].double(), m.rope_sin[:T].double())
    want = reference_attention(attn, x, m.cfg.rope_theta)
    # the model's RoPE tables are fp32, the reference's angles fp64
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_rope_relative_property():
    m = tiny_model()
    E = m.cfg.head_dim
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(E, generator=g), torch.randn(E, generator=g)

    def rot(v, pos):  # a single vector at position pos
        return M.apply_rope(v.view(1, 1, 1, E), m.rope_cos[pos:pos + 1], m.rope_sin[pos:pos + 1]).view(E)

    torch.testing.assert_close(rot(q, 0), q)  # position 0 is the identity
    torch.testing.assert_close(rot(q, 37).norm(), q.norm())  # a rotation
    for diff in (0, 3, 17):
        dots = torch.stack([rot(q, n + diff) @ rot(k, n) for n in (0, 5, 20, 40)])
        torch.testing.assert_close(dots, dots[:1].expand(4), rtol=1e-5, atol=1e-5)
    assert (rot(q, 3) @ rot(k, 0) - rot(q, 17) @ rot(k, 0)).abs() > 1e-3  # depends on the difference


# ---------------------------------------------------------------- configs and counts

DENSE = [n for n, c in M.PRESETS.items() if c.moe is None]  # MoE counts: tests/test_moe.py


@pytest.mark.parametrize("name", DENSE)
def test_param_counts(name):
    cfg = M.get_config(name)
    with torch.device('meta'):
        m = M.Transformer(cfg)
    total = m.num_params(exclude_embedding=False)
    assert total == expected_num_params(cfg)
    assert m.num_params() == total - cfg.vocab_size * cfg.d_model
    assert m.num_params(exclude_embedding=True) == m.num_params()


def test_preset_sizes():
    def total(name):
        with torch.device('meta'):
            return M.Transformer(M.get_config(name)).num_params(exclude_embedding=False)
    assert total('dense-1.5b') == 1_439_078_400
    assert abs(total('dense-1.5b') - 1.44e9) < 0.01e9
    assert 50e6 <= total('small') <= 125e6
    assert total('tiny') == 6_531_520
    assert M.PRESETS['dense-1.5b'].head_dim == 128 and M.PRESETS['dense-1.5b'].seq_len == 2048


def test_flops_per_token():
    for name in DENSE:
        cfg = M.get_config(name)
        with torch.device('meta'):
            m = M.Transformer(cfg)
        n = expected_num_params(cfg) - cfg.vocab_size * cfg.d_model
        assert m.flops_per_token() == 6 * n + 6 * cfg.n_layer * cfg.d_model * cfg.seq_len
        assert m.flops_per_token(100) == 6 * n + 6 * cfg.n_layer * cfg.d_model * 100
    with torch.device('meta'):
        m = M.Transformer(M.get_config('dense-1.5b'))
    assert m.flops_per_token() == 6 * 1_336_152_064 + 6 * 24 * 2048 * 2048


def test_get_config_errors_and_overrides():
    with pytest.raises(ValueError, match="tiny, small, dense-1.5b"):
        M.get_config('huge')
    with pytest.raises(ValueError, match="did you mean 'd_model'"):
        M.get_config('tiny', d_modle=128)
    with pytest.raises(ValueError, match="divisible by n_head"):
        M.get_config('tiny', n_head=5)
    with pytest.raises(ValueError, match="multiple of n_kv_head"):
        M.get_config('tiny', n_kv_head=3)
    with pytest.raises(ValueError, match="even for RoPE"):
        M.get_config('tiny', d_model=36, n_head=4, n_kv_head=4)
    with pytest.raises(TypeError, match="n_layer must be an int"):
        M.get_config('tiny', n_layer=2.0)
    with pytest.raises(ValueError, match="n_dense_layers"):
        M.get_config('tiny', n_dense_layers=3)
    cfg = M.get_config('tiny', n_layer=3, rope_theta=500000)
    assert cfg.n_layer == 3 and M.PRESETS['tiny'].n_layer == 2  # presets are not mutated


def test_dense_layers_before_moe_do_not_need_moe():
    # every layer < n_dense_layers stays a dense MLP, so moe.py is not imported here
    m = tiny_model(moe=object(), n_dense_layers=2)
    assert all(isinstance(b.ffn, M.MLP) for b in m.layers)


# ---------------------------------------------------------------- init, aux loss, generate

def test_init_weights_after_meta():
    cfg = M.get_config('tiny')
    with torch.device('meta'):
        m = M.Transformer(cfg)
    m.to_empty(device='cpu')
    torch.manual_seed(0)
    m.init_weights()
    for name, p in m.named_parameters():
        assert torch.isfinite(p).all(), name
    out_std = cfg.init_std / math.sqrt(2 * cfg.n_layer)
    assert abs(m.tok_emb.weight.std().item() / cfg.init_std - 1) < 0.02
    assert abs(m.lm_head.weight.std().item() / cfg.init_std - 1) < 0.02
    for b in m.layers:
        for lin, std in [(b.attn.wq, cfg.init_std), (b.attn.wk, cfg.init_std), (b.attn.wv, cfg.init_std),
                         (b.ffn.w1, cfg.init_std), (b.ffn.w3, cfg.init_std),
                         (b.attn.wo, out_std), (b.ffn.w2, out_std)]:
            assert abs(lin.weight.std().item() / std - 1) < 0.1
            assert abs(lin.weight.mean().item()) < 0.1 * std
        assert torch.equal(b.attn_norm.weight, torch.ones(cfg.d_model))
        assert torch.equal(b.ffn_norm.weight, torch.ones(cfg.d_model))
    ref = M.Transformer(cfg)
    assert torch.equal(m.rope_cos, ref.rope_cos) and torch.equal(m.rope_sin, ref.rope_sin)
    assert 'rope_cos' not in m.state_dict()
    _, loss = m(random_tokens(cfg, 2, 16), random_tokens(cfg, 2, 16, seed=2))
    assert torch.isfinite(loss)


def test_linears_are_plain_nn_linear_in_layers():
    m = tiny_model()
    names = {n.split('.')[-1] for n, mod in m.layers.named_modules() if type(mod) is nn.Linear}
    assert names == {'wq', 'wk', 'wv', 'wo', 'w1', 'w2', 'w3'}
    assert all(mod.bias is None for mod in m.modules() if isinstance(mod, nn.Linear))


def test_aux_loss_is_added():
    class WithAux(nn.Module):
        def __init__(self, ffn):
            super().__init__()
            self.ffn, self.aux_loss = ffn, None

        def forward(self, x):
            self.aux_loss = torch.tensor(0.25)
            return self.ffn(x)

    m = tiny_model()
    idx = random_tokens(m.cfg, 2, 16)
    _, plain = m(idx, idx)
    m.layers[1].ffn = WithAux(m.layers[1].ffn)
    _, with_aux = m(idx, idx)
    torch.testing.assert_close(with_aux, plain + 0.25)


def test_generate_greedy():
    m = tiny_model()
    prompt = random_tokens(m.cfg, 2, 5)
    out = m.generate(prompt, 7, temperature=0)
    assert out.shape == (2, 12) and torch.equal(out[:, :5], prompt)
    assert torch.equal(out, m.generate(prompt, 7, temperature=0))
    assert torch.equal(out, m.generate(prompt, 7, temperature=1.0, top_k=1))
    assert torch.equal(out, m.generate(prompt, 7, temperature=1e-4))  # sharpened to the argmax
    for j in range(5, 12):
        assert torch.equal(m(out[:, :j])[0][:, -1].argmax(-1), out[:, j])
    assert torch.equal(m.generate(prompt, 0), prompt)


def test_generate_crops_context_and_samples_within_top_k():
    m = tiny_model()
    L = m.cfg.seq_len
    prompt = random_tokens(m.cfg, 1, L + 6)
    out = m.generate(prompt, 3, temperature=0)
    assert out.shape == (1, L + 9)
    for j in range(L + 6, L + 9):
        assert torch.equal(m(out[:, j - L:j])[0][:, -1].argmax(-1), out[:, j])
    torch.manual_seed(5)
    a = m.generate(prompt[:, :8], 4, temperature=1.5, top_k=5)
    torch.manual_seed(5)
    b = m.generate(prompt[:, :8], 4, temperature=1.5, top_k=5)
    assert torch.equal(a, b)
    for j in range(8, 12):
        top5 = m(a[:, :j])[0][0, -1].topk(5).indices
        assert a[0, j] in top5
    with pytest.raises(ValueError, match="temperature"):
        m.generate(prompt[:, :4], 2, temperature=-1.0)


# ---------------------------------------------------------------- precision and training

def test_autocast_bf16_close_to_fp32():
    m = tiny_model()
    idx, tgt = random_tokens(m.cfg, 2, 32), random_tokens(m.cfg, 2, 32, seed=2)
    _, loss32 = m(idx, tgt)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        logits, loss16 = m(idx, tgt)
    assert logits.dtype == torch.bfloat16 and loss16.dtype == torch.float32
    assert abs(loss16.item() - loss32.item()) < 1e-2 * loss32.item()
    loss16.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in m.parameters())


def test_adamw_reduces_loss_on_repeated_batch():
    m = tiny_model()
    idx = random_tokens(m.cfg, 4, 32)
    x, y = idx[:, :-1], idx[:, 1:]
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(15):
        _, loss = m(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.compile is only tested on a GPU")
def test_compile_matches_eager_on_gpu():
    m = tiny_model().cuda()
    idx = random_tokens(m.cfg, 2, 64).cuda()
    with torch.autocast('cuda', dtype=torch.bfloat16):
        _, eager = m(idx, idx)
        _, compiled = torch.compile(m)(idx, idx)
    torch.testing.assert_close(compiled, eager, rtol=2e-2, atol=0)
