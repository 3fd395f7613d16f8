"""Tests of moe.py, all on the CPU.

The references are written here from the definitions, not from moe.py: a per-token loop over each
token's chosen experts (routing re-derived from the scores), per-expert compositions of
quant.gemm_operands / fake_quantize on zero-padded token groups (docs/NUMERICS.md §6), the
DeepSeek-V3 balance loss by its formula, and hand-counted preset sizes.
"""
import dataclasses
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import model as M  # noqa: E402
import moe  # noqa: E402
import quant  # noqa: E402
import rht  # noqa: E402
from conftest import full_unless  # noqa: E402

# the kernels on CPU tensors: Triton's interpreter, which conftest.py picks where there is no GPU
CPU_KERNELS = pytest.mark.skipif(os.environ.get('TRITON_INTERPRET') != '1', reason='needs TRITON_INTERPRET=1')


def small_cfg(**moe_kw):
    kw = {**dict(n_routed_experts=6, top_k=2, expert_hidden=16, n_shared_experts=1), **moe_kw}
    return M.ModelConfig(n_layer=2, n_head=2, n_kv_head=2, d_model=32, ffn_hidden=64, seq_len=32,
                         vocab_size=64, moe=moe.MoEConfig(**kw))


def make_layer(seed=0, **moe_kw):
    torch.manual_seed(seed)
    return moe.MoE(small_cfg(**moe_kw))


def reference_route(layer, x_TD):
    """Top-k by score + bias (inside the best groups), weights from the plain scores."""
    c = layer.cfg
    logits = x_TD.double() @ layer.router.weight.double().t()
    scores = logits.sigmoid() if c.score_func == 'sigmoid' else logits.softmax(-1)
    sel = scores + layer.expert_bias.double()
    if c.n_groups > 1:
        per = c.n_routed_experts // c.n_groups
        for t in range(len(sel)):
            g_score = [sel[t, g * per:(g + 1) * per].topk(min(2, per)).values.sum() for g in range(c.n_groups)]
            best = torch.stack(g_score).detach().topk(c.topk_groups).indices.tolist()
            for g in range(c.n_groups):
                if g not in best:
                    sel[t, g * per:(g + 1) * per] = -math.inf
    idx = sel.topk(c.top_k, -1).indices
    w = scores.gather(-1, idx)
    if c.score_func == 'sigmoid':
        w = w / w.sum(-1, keepdim=True)
    return idx, w * c.route_scale


def reference_forward(layer, x_TD):
    """Every token through each of its top-k experts one by one, plus the shared experts."""
    idx, w = reference_route(layer, x_TD.detach())
    idx = idx.tolist()
    e1, e2, e3 = layer.experts.w1_EFD, layer.experts.w2_EDF, layer.experts.w3_EFD
    logits = x_TD @ layer.router.weight.t()  # the weights again, differentiably
    scores = logits.sigmoid() if layer.cfg.score_func == 'sigmoid' else logits.softmax(-1)
    out = []
    for t, x in enumerate(x_TD):
        ws = scores[t, idx[t]]
        ws = (ws / ws.sum() if layer.cfg.score_func == 'sigmoid' else ws) * layer.cfg.route_scale
        y = sum(ws[k] * (e2[e] @ (F.silu(e1[e] @ x) * (e3[e] @ x))) for k, e in enumerate(idx[t]))
        sh = layer.shared
        out.append(y + sh.w2.weight @ (F.silu(sh.w1.weight @ x) * (sh.w3.weight @ x)))
    return torch.stack(out), torch.tensor(idx)


def forward_and_grads(layer, x_BSD, fn):
    x = x_BSD.clone().requires_grad_()
    layer.zero_grad()
    y = fn(x)
    g = torch.randn_like(y, generator=torch.Generator().manual_seed(5))
    (y * g).sum().backward()
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in layer.named_parameters()}


# ---------------------------------------------------------------- config and dispatch

@pytest.mark.parametrize('kw, words', [
    (dict(expert_hidden=40), 'multiple of 16'), (dict(top_k=9), 'top_k'), (dict(n_groups=5), 'n_groups'),
    (dict(score_func='relu'), 'score_func'), (dict(n_groups=4, topk_groups=1, top_k=3), 'topk_groups'),
])
def test_config_rejects_bad_values(kw, words):
    with pytest.raises(ValueError, match=words):
        moe.MoEConfig(**{'n_routed_experts': 8, **kw})
    with pytest.raises(TypeError, match='MoEConfig'):
        moe.MoE(M.ModelConfig(n_layer=1, n_head=2, n_kv_head=2, d_model=32, ffn_hidden=64, seq_len=8,
                              moe=object()))


@pytest.mark.parametrize('align', [16, 32])
def test_dispatch_places_every_slot_in_aligned_groups(align):
    E, T, K = 7, 45, 3
    g = torch.Generator().manual_seed(0)
    idx = torch.stack([torch.randperm(E - 1, generator=g)[:K] for _ in range(T)])  # expert 6 gets nothing
    rows, offs, counts, M_ = moe.dispatch(idx, E, align)
    assert counts.tolist() == torch.bincount(idx.flatten(), minlength=E).tolist() and counts[6] == 0
    assert M_ % align == 0 and offs[-1] == M_ and rows.unique().numel() == T * K  # every slot, once
    starts = [0] + offs[:-1].tolist()
    for e in range(E):
        assert starts[e] % align == 0
        r = rows[idx == e]
        assert r.numel() == counts[e] and bool(((r >= starts[e]) & (r < starts[e] + counts[e])).all())
        if e < E - 1:  # a group is its tokens padded up to the next multiple of align
            assert offs[e] - starts[e] == -(-counts[e] // align) * align


# ---------------------------------------------------------------- the layer against a per-token loop

@pytest.mark.parametrize('kw', [dict(), dict(score_func='softmax'),
                                dict(n_groups=3, topk_groups=2, route_scale=2.5)])
def test_moe_matches_per_token_loop(kw):
    layer = make_layer(**kw)
    layer.expert_bias.copy_(torch.linspace(-0.05, 0.05, 6))  # moves the choice, not the weights
    x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(1))
    y, dx, grads = forward_and_grads(layer, x, layer)
    loop = lambda x: reference_forward(layer, x.view(-1, 32))[0].view(2, 12, 32)
    y_ref, dx_ref, grads_ref = forward_and_grads(layer, x, loop)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-5, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-5, atol=1e-6, msg=name)
    assert grads['router.weight'].abs().sum() > 0 and grads['experts.w2_EDF'].abs().sum() > 0


def test_no_token_is_dropped_when_all_pick_the_same_experts():
    layer = make_layer()
    layer.expert_bias.copy_(torch.tensor([0., 0., 0., 5., 5., 0.]))  # every token picks 3 and 4
    x = torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(2))
    layer.train()
    y = layer(x)
    assert layer.load_E.tolist() == [0, 0, 0, 64, 64, 0]
    y_ref, idx = reference_forward(layer, x.view(-1, 32))
    assert sorted(set(idx.flatten().tolist())) == [3, 4]
    torch.testing.assert_close(y.view(-1, 32), y_ref, rtol=1e-5, atol=1e-6)


def test_grouped_mm_matches_loop(monkeypatch):
    if not hasattr(torch, '_grouped_mm'):
        pytest.skip('this PyTorch has no torch._grouped_mm')
    layer = make_layer()
    x = torch.randn(2, 24, 32, generator=torch.Generator().manual_seed(3))
    y, dx, grads = forward_and_grads(layer, x, layer)
    monkeypatch.setitem(moe.GEMM, 'name', 'grouped')
    y2, dx2, grads2 = forward_and_grads(layer, x, layer)
    torch.testing.assert_close(y2, y, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dx2, dx, rtol=1e-5, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(grads2[name], grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_autocast_bf16_runs_experts_in_bf16():
    layer = make_layer()
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(4))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), layer(x), rtol=0.05, atol=0.02)


# ---------------------------------------------------------------- balancing

def test_bias_update_moves_load_toward_uniform():
    layer = make_layer(bias_update_rate=0.01)
    holder = torch.nn.Module()  # update_bias walks model.layers[i].ffn
    holder.layers = torch.nn.ModuleList([torch.nn.Module()])
    holder.layers[0].ffn = layer
    g = torch.Generator().manual_seed(6)
    x = torch.randn(4, 32, 32, generator=g) + 0.5  # inputs share a direction ...
    with torch.no_grad():
        layer.router.weight.normal_(0, 0.2, generator=g)
        layer.router.weight[:2] += 0.1  # ... that experts 0 and 1 like: ~2.5x the mean load
    layer.train()
    history = []
    for step in range(80):
        with torch.no_grad():
            layer(x)
        if step == 0:
            assert moe.load_stats(holder)['moe_load_0'] == pytest.approx(
                layer.load_E.max().item() / layer.load_E.mean().item())
        stats = moe.update_bias(holder)
        assert layer.load_E.sum() == 0
        history.append(stats['moe_load_max'])
        if step == 0:
            assert (layer.expert_bias[:2] < 0).all() and (layer.expert_bias[2:] > 0).all()
    assert history[0] > 2.3 and max(history[-10:]) < 1.1, history


def test_seq_aux_loss_matches_formula():
    layer = make_layer(seq_aux_loss_coef=0.1)
    x = torch.randn(3, 10, 32, generator=torch.Generator().manual_seed(7))
    layer.eval()
    layer(x)
    assert layer.aux_loss is None  # training only
    layer.train()
    layer(x)
    idx, _ = reference_route(layer, x.view(-1, 32))
    s = (x.view(-1, 32).double() @ layer.router.weight.double().t()).sigmoid().view(3, 10, 6)
    E, K, S = 6, 2, 10
    ref = 0
    for b in range(3):
        f = torch.bincount(idx.view(3, -1)[b], minlength=E).double() * E / (K * S)
        P = (s[b] / s[b].sum(-1, keepdim=True)).mean(0)
        ref += (f * P).sum() / 3
    assert layer.aux_loss.item() == pytest.approx(0.1 * ref.item(), rel=1e-5)
    layer.aux_loss.backward()
    assert layer.router.weight.grad.abs().sum() > 0
    with torch.no_grad():
        layer.router.weight.zero_()  # equal scores: sum_e f_e P_e = 1 whatever the picks
    layer(x)
    assert layer.aux_loss.item() == pytest.approx(0.1)


# ---------------------------------------------------------------- quantized expert GEMMs

@pytest.mark.parametrize('pack', ['false', 'true'])
@pytest.mark.parametrize('name, backend', [(n, 'torch') for n in ['ufp4', 'e2m1', 'nvfp4', 'mxfp4', 'ufp4-nv']]
                         + full_unless([('ufp4', 'triton')], [pytest.param(n, 'triton', marks=CPU_KERNELS)
                                                              for n in ['ufp4', 'mxfp4']]))
def test_quantized_grouped_gemms_equal_per_expert_fake_quantize(monkeypatch, name, backend, pack):
    """y, dX and dW of every expert = its own tokens, zero-padded to the block, through
    quant.gemm_operands (the six roles) with the PyTorch reference; an expert with no tokens gets
    dW = 0. backend: the quantizer of the grouped path (triton: the kernels, in the CPU interpreter);
    pack: recipe.pack_saved (x kept as the wgrad operand's codes + scales)."""
    monkeypatch.setitem(quant.BACKEND, 'name', backend)
    r = quant.recipe_from_overrides(name, sr='none', pack_saved=pack)
    align = max(s.block for s in r.specs().values())
    Kd, N, sizes = 64, 32, [5, 0, 23, 16, 1, 40]
    E, T = len(sizes), sum(sizes)
    g = torch.Generator().manual_seed(8)
    expert_T = torch.cat([torch.full((n,), e) for e, n in enumerate(sizes)])[torch.randperm(T, generator=g)]
    rows, offs, _, M_ = moe.dispatch(expert_T[:, None], E, align)
    rows = rows[:, 0]
    x_T, dy_T = torch.randn(T, Kd, generator=g), torch.randn(T, N, generator=g)
    x_T[3, :16] *= 50  # an outlier block
    w = (torch.randn(E, N, Kd, generator=g) * 0.1).requires_grad_()
    x_M = torch.zeros(M_, Kd).index_copy(0, rows, x_T).requires_grad_()
    y_M = moe.grouped_linear(x_M, w, offs, r)
    y_M.backward(torch.zeros(M_, N).index_copy(0, rows, dy_T))

    monkeypatch.setitem(quant.BACKEND, 'name', 'torch')
    signs = rht.random_signs(r.rht_seed)
    for e, n in enumerate(sizes):
        if n == 0:
            assert w.grad[e].abs().max() == 0
            continue
        pad = lambda t: torch.cat([t, t.new_zeros(-(-n // align) * align - n, t.shape[1])])
        xe, dye, we = pad(x_T[expert_T == e]), pad(dy_T[expert_T == e]), w[e].detach()
        qx, qw = quant.gemm_operands(xe, r.fprop_x, -1, we, r.fprop_w, -1, signs)
        qdy, qw2 = quant.gemm_operands(dye, r.dgrad_dy, -1, we, r.dgrad_w, 0, signs)
        qdy3, qx3 = quant.gemm_operands(dye, r.wgrad_dy, 0, xe, r.wgrad_x, 0, signs)
        re = rows[expert_T == e]
        torch.testing.assert_close(y_M.detach()[re], (qx @ qw.t())[:n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x_M.grad[re], (qdy @ qw2)[:n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(w.grad[e], qdy3.t() @ qx3, rtol=1e-5, atol=1e-5)
    exact = torch.einsum('tk,tnk->tn', x_T, w.detach()[expert_T])
    assert (y_M.detach()[rows] - exact).abs().max() > 1e-3


@pytest.mark.parametrize('name', ['bf16', 'ufp4', 'nvfp4'])
def test_grouped_forward_without_grad_equals_the_autograd_path(name):
    """Evaluation (no grad) runs the grouped forward without the autograd Function (torch 2.11's
    compile passed the Function its arguments shifted there): the same bits as with grad, eager and
    compiled, and it records no graph."""
    r = quant.RECIPES[name] if name == 'bf16' else quant.recipe_from_overrides(name, sr='none')
    g = torch.Generator().manual_seed(3)
    offs = torch.tensor([16, 16, 48, 64], dtype=torch.int32)  # one expert with no rows
    x, w = torch.randn(64, 32, generator=g), torch.randn(4, 48, 32, generator=g).requires_grad_()
    want = moe.grouped_linear(x, w, offs, r)
    assert want.requires_grad
    with torch.no_grad():
        got = moe.grouped_linear(x, w, offs, r)
        compiled = torch.compile(lambda a, b: moe.grouped_linear(a, b, offs, r), backend='aot_eager')(x, w)
    assert not got.requires_grad and got.grad_fn is None
    assert torch.equal(got, want.detach()) and torch.equal(compiled, want.detach())


@pytest.mark.parametrize('name', ['ufp4', 'mxfp4'])
def test_pack_saved_experts_keep_fewer_bytes_and_the_same_gradients(name):
    """recipe.pack_saved in the grouped GEMM, stochastic rounding of dY on: the same bits as keeping
    x (the draws come in the same order), and fewer bytes kept for the backward."""
    def run(pack):
        r = quant.recipe_from_overrides(name, pack_saved=pack)
        g = torch.Generator().manual_seed(3)
        offs = torch.tensor([32, 64, 128], dtype=torch.int32)
        x = torch.randn(128, 64, generator=g).requires_grad_()
        w = (torch.randn(3, 64, 64, generator=g) * 0.1).requires_grad_()
        kept = {}

        def hook(t):
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        torch.manual_seed(5)
        with torch.autograd.graph.saved_tensors_hooks(hook, lambda t: t):
            y = moe.grouped_linear(x, w, offs, r)
        y.backward(torch.randn(y.shape, generator=g))
        return x.grad, w.grad, sum(kept.values())
    (dx, dw, n_x), (dx_p, dw_p, n_p) = run('false'), run('true')
    assert torch.equal(dx, dx_p) and torch.equal(dw, dw_p)
    assert n_p < n_x - 128 * 64 * 4 * 0.7  # x (fp32) replaced by ~0.75 bytes per element


@pytest.mark.parametrize('backend', ['torch', pytest.param('triton', marks=CPU_KERNELS)])
@pytest.mark.parametrize('spec', [quant.QuantSpec('e1m2', 16, 'fp32', rht=True), quant.QuantSpec('e2m1', 16),
                                  quant.QuantSpec('e2m1', 32, 'e8m0')], ids=['ufp4', 'e2m1-fp32', 'mxfp4'])
def test_expert_weights_along_dim1_are_the_columns_of_one_matrix(monkeypatch, backend, spec):
    """dgrad_w quantizes w[E, N, K] along N. As the columns of the [E·N, K] matrix (one call, no
    transpose) it equals the reference quantizing each expert's [N, K] along dim 0 alone, bit for bit:
    with N a multiple of the block, no block or RHT group spans two experts."""
    monkeypatch.setitem(quant.BACKEND, 'name', backend)
    g = torch.Generator().manual_seed(12)
    w = torch.randn(3, 64, 24, generator=g).bfloat16()
    w[1, 5:9] *= 40  # outliers in expert 1: large scales that must stay in its own blocks
    signs = rht.random_signs(0)
    for keep in (False, True):
        got = moe._fake_quantize(w, spec, 1, signs, keep, None)
        ref = torch.stack([quant.quantize(w[e], spec, 0, signs=signs).dequantize(keep_rotated=keep)
                           for e in range(3)])
        assert torch.equal(got, ref)
        assert got.is_contiguous() or backend == 'torch'  # the kernel writes w's own layout
    assert not torch.equal(got, w)
    with pytest.raises(ValueError, match='multiple of 16'):  # E·N = 48 would pass; N = 24 must not
        moe._fake_quantize(torch.randn(2, 24, 16), quant.QuantSpec(), 1, signs, False, None)


def test_stochastic_rounding_of_dy_is_unbiased_per_expert():
    """nvfp4 as published (SR on dY, e4m3 scales: quantized expert by expert, a seed each): the
    mean dW over many steps approaches the product with dY unquantized."""
    r = quant.RECIPES['nvfp4']
    sizes, Kd, N = [7, 0, 20], 32, 16
    g = torch.Generator().manual_seed(11)
    expert_T = torch.cat([torch.full((n,), e) for e, n in enumerate(sizes)])
    rows, offs, _, M_ = moe.dispatch(expert_T[:, None], 3, 16)
    x_M = torch.zeros(M_, Kd).index_copy(0, rows[:, 0], torch.randn(len(expert_T), Kd, generator=g))
    dy_M = torch.zeros(M_, N).index_copy(0, rows[:, 0], torch.randn(len(expert_T), N, generator=g))
    w = torch.randn(3, N, Kd, generator=g).requires_grad_()
    runs = []
    for _ in range(40):
        w.grad = None
        moe.grouped_linear(x_M, w, offs, r).backward(dy_M)
        runs.append(w.grad.clone())
    unbiased = moe.grouped_linear(x_M, w, offs, dataclasses.replace(r, wgrad_dy=None))
    expect = torch.autograd.grad(unbiased, w, dy_M)[0]
    err = lambda dw: ((dw - expect).norm() / expect.norm()).item()
    assert err(torch.stack(runs).mean(0)) < 0.3 * err(runs[0]) and err(runs[0]) > 0.01
    assert not torch.equal(runs[0], runs[1])


def test_convert_experts_honours_bf16_blocks():
    cfg = M.ModelConfig(**{**moe.MOE_PRESETS['moe-tiny'], 'n_layer': 8, 'vocab_size': 64})

    def bf16_experts(recipe):  # MoE blocks 1..7 whose routed experts stayed high precision
        m = moe.convert_experts(quant.convert(M.Transformer(cfg), recipe), recipe)
        ffn = m.layers[3].ffn
        assert isinstance(ffn.shared.w1, quant.QLinear) and type(ffn.router) is torch.nn.Linear
        return m, [b.ffn.experts.recipe is quant.RECIPES['bf16'] for b in m.layers[1:]]

    m, bf16 = bf16_experts(quant.recipe_from_overrides('nvfp4', bf16_first='2'))  # last: 15% of 8 = 1
    assert bf16 == [True, False, False, False, False, False, True]
    m, bf16 = bf16_experts(quant.recipe_from_overrides('ufp4', bf16_first='0.25', bf16_last='0.3'))
    assert bf16 == [True, False, False, False, False, True, True]  # blocks 0-1 and 6-7 of 8
    moe.resample_rht(m, 5)
    assert m.layers[3].ffn.experts.rht_seed == 5


def test_layer_with_32_element_blocks_aligns_groups_to_32(monkeypatch):
    layer = make_layer(expert_hidden=32)
    x = torch.randn(2, 13, 32, generator=torch.Generator().manual_seed(10))
    y_bf16, _, _ = forward_and_grads(layer, x, layer)
    layer.experts.recipe = quant.recipe_from_overrides('mxfp4', sr='none')
    seen, real = [], moe.grouped_linear
    spy = lambda x, w, offs, *a: seen.append(offs.tolist()) or real(x, w, offs, *a)
    monkeypatch.setattr(moe, 'grouped_linear', spy)
    y, dx, grads = forward_and_grads(layer, x, layer)
    err = (y - y_bf16).norm() / y_bf16.norm()
    assert 1e-3 < err < 0.3 and torch.isfinite(dx).all() and grads['experts.w1_EFD'].abs().sum() > 0
    assert len(seen) == 2 and all(o % 32 == 0 for o in seen[0]) and seen[0][0] > 0  # w1 and w3 fused, w2
    layer = make_layer(expert_hidden=16)  # the F = 16 reduction cannot hold a 32-element block
    layer.experts.recipe = quant.RECIPES['mxfp4']
    with pytest.raises(ValueError, match='expert_hidden=16 must be a multiple of 32'):
        layer(x)


@pytest.mark.skipif(not hasattr(torch, '_grouped_mm'), reason='this PyTorch has no torch._grouped_mm')
@pytest.mark.full
@pytest.mark.parametrize('recipe, backend, compiler', [
    ('bf16', 'torch', 'inductor'), ('ufp4', 'torch', 'aot_eager'),
    pytest.param('ufp4', 'triton', 'aot_eager', marks=CPU_KERNELS)])
def test_compiled_moe_layer_is_one_graph_that_matches_eager(monkeypatch, recipe, backend, compiler):
    """The MoE FFN of moe-tiny under torch.compile on the CUDA path (bf16 autocast, torch._grouped_mm,
    for backend 'triton' the quantizer's custom op): one graph, with no break per expert nor for the
    first call's log lines, and the eager output and gradients. ufp4 without SR (deterministic); the
    4-bit recipe is traced with aot_eager, as Inductor takes a minute on a CPU to build the reference."""
    monkeypatch.setitem(moe.GEMM, 'name', 'grouped')
    monkeypatch.setitem(moe.GEMM, 'logged', set())  # the compiled call comes first, so it would log
    monkeypatch.setitem(quant.BACKEND, 'name', backend)
    monkeypatch.setitem(quant.BACKEND, 'logged', set())
    torch.manual_seed(0)
    r = quant.recipe_from_overrides(recipe, **({} if recipe == 'bf16' else dict(sr='none')))
    cfg = M.ModelConfig(**{**moe.MOE_PRESETS['moe-tiny'], 'vocab_size': 64})
    layer = moe.convert_experts(quant.convert(M.Transformer(cfg), r), r).layers[1].ffn
    g = torch.Generator().manual_seed(13)
    x, w = torch.randn(2, 32, 64, generator=g), torch.randn(2, 32, 64, generator=g)

    def run(fn):
        xr = x.clone().requires_grad_()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            y = fn(xr)
        (y.float() * w).sum().backward()
        grads = [p.grad.clone() for p in layer.parameters()]
        layer.zero_grad()
        return [y.detach().float(), xr.grad] + grads

    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    try:
        compiled = run(torch.compile(layer, backend=compiler))
        assert dict(counters['graph_break']) == {} and counters['stats']['unique_graphs'] == 1
    finally:
        torch._dynamo.reset()
    eager = run(layer)
    for c, e in zip(compiled, eager):
        assert (c - e).norm() <= 1e-2 * e.norm()
    if recipe != 'bf16':  # the compiled layer quantizes: far from bf16, as eager is
        monkeypatch.setattr(layer.experts, 'recipe', quant.RECIPES['bf16'])
        y_bf16 = run(layer)[0]
        assert (compiled[0] - eager[0]).norm() < 0.1 * (y_bf16 - eager[0]).norm()


# ---------------------------------------------------------------- presets

def hand_count(p):
    c, D, V = p['moe'], p['d_model'], p.get('vocab_size', 50257)
    hd = D // p['n_head']
    attn = 2 * D * hd * (p['n_head'] + p['n_kv_head'])
    routed = 3 * D * c.expert_hidden
    moe_layer = c.n_routed_experts * (D + routed) + c.n_shared_experts * routed
    dense, n_moe = p['n_dense_layers'], p['n_layer'] - p['n_dense_layers']
    total = 2 * V * D + D + p['n_layer'] * (attn + 2 * D) + dense * 3 * D * p['ffn_hidden'] + n_moe * moe_layer
    return total, total - n_moe * (c.n_routed_experts - c.top_k) * routed


@pytest.mark.parametrize('name, target', [('moe-7.9b', 7.9e9), ('moe-124b', 124e9)])
def test_big_presets_build_on_meta_with_the_right_size(name, target):
    cfg = M.ModelConfig(**moe.MOE_PRESETS[name])
    with torch.device('meta'):
        m = M.Transformer(cfg)
    total = m.num_params(exclude_embedding=False)
    active = total - sum(b.ffn.inactive_params() for b in m.layers if isinstance(b.ffn, moe.MoE))
    assert (total, active) == hand_count(moe.MOE_PRESETS[name])
    assert abs(total / target - 1) < 0.03, total
    assert isinstance(m.layers[0].ffn, M.MLP) and all(isinstance(b.ffn, moe.MoE) for b in m.layers[1:])


def test_small_preset_matches_small_active_params():
    total, active = hand_count(moe.MOE_PRESETS['moe-small'])
    with torch.device('meta'):
        small = M.Transformer(M.get_config('small')).num_params(exclude_embedding=False)
    assert abs(active / small - 1) < 0.03 and total > 2 * active


@pytest.mark.skipif('moe-tiny' not in M.PRESETS, reason='the MoE presets are not in model.PRESETS')
@pytest.mark.parametrize('name', list(moe.MOE_PRESETS))
def test_model_counts_active_params_for_flops(name):
    cfg = M.get_config(name)
    with torch.device('meta'):
        m = M.Transformer(cfg)
    total, active = hand_count(moe.MOE_PRESETS[name])
    emb = cfg.vocab_size * cfg.d_model
    assert m.num_params(exclude_embedding=False) == total and m.num_params(active=True) == active - emb
    assert m.flops_per_token() == 6 * (active - emb) + 6 * cfg.n_layer * cfg.d_model * cfg.seq_len


# ---------------------------------------------------------------- training

def batch(vocab, B=4, T=32, seed=9):
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (B, 1), generator=g)
    seq = (start * 5 + torch.arange(T + 1) * 3) % vocab  # a learnable pattern
    return seq[:, :-1], seq[:, 1:]


@pytest.mark.parametrize('recipe', ['bf16', 'ufp4'])
def test_moe_tiny_trains(recipe):
    torch.manual_seed(0)
    cfg = M.ModelConfig(**{**moe.MOE_PRESETS['moe-tiny'], 'vocab_size': 128, 'seq_len': 32})
    m = moe.convert_experts(quant.convert(M.Transformer(cfg), recipe), recipe)
    assert m.layers[1].ffn.experts.recipe is quant.RECIPES[recipe]
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x, y = batch(128, T=16)
    losses = []
    for _ in range(15):
        loss = m(x, y)[1]
        loss.backward()
        opt.step()
        opt.zero_grad()
        stats = moe.update_bias(m)
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 0.5 * losses[0], losses
    assert stats['moe_load_max'] >= 1 and m.layers[1].ffn.expert_bias.abs().sum() > 0


def write_dataset(root: Path, vocab=128):
    rng = np.random.default_rng(0)
    meta = {'source': 'synthetic', 'tokenizer': 'gpt2', 'vocab_size': vocab, 'eot_token': vocab - 1,
            'dtype': 'uint16'}
    for split, n in (('train', 20000), ('val', 4000)):
        t = np.cumsum(rng.integers(1, 4, n)) % (vocab - 1)
        t.astype(np.uint16).tofile(root / f'{split}_000.bin')
        meta[split] = {'shards': [f'{split}_000.bin'], 'tokens': n, 'documents': []}
    (root / 'meta.json').write_text(json.dumps(meta))
    return root


@pytest.mark.skipif('moe-tiny' not in M.PRESETS, reason='the MoE presets are not in model.PRESETS')
def test_train_py_runs_moe_tiny(tmp_path):
    import train
    data, out = write_dataset(tmp_path), tmp_path / 'run'
    argv = [f'--data.dir={data}', f'--log.out_dir={out}', '--model.vocab_size=128', '--model.seq_len=32',
            '--train.device=cpu', '--train.max_steps=15', '--train.eval_interval=15', '--data.eval_batches=1',
            '--data.batch_size=4', '--optim.warmup_steps=3', '--optim.lr=1e-2']
    config = str(ROOT / 'configs' / 'moe-tiny.toml')
    cfg = train.load_config(config, argv + ['--quant.recipe=ufp4'])
    m = train.build_model(*train.resolve(cfg), torch.device('cpu'))
    assert m.layers[1].ffn.experts.recipe.fprop_x.grid == 'e1m2'  # convert_experts ran
    train.main([config, *argv])
    recs = [json.loads(line) for line in (out / 'log.jsonl').read_text().splitlines()]
    assert recs[-1]['loss'] < recs[0]['loss'] - 1.0 and recs[-1]['moe_load_max'] >= 1
    state = torch.load(out / 'ckpt.pt', weights_only=False)['model']
    assert state['layers.1.ffn.expert_bias'].abs().sum() > 0  # update_bias ran every step
