"""Sharded training on the CPU (gloo): train.py under `torchrun --nproc_per_node=2` against one
process, sharded checkpoints across world sizes, --export, and plan.py's memory arithmetic.

Every rank initializes the whole model from the same seed, then keeps its shards (train.init=full,
the default for models that fit), so a run starts from one process's weights at any world size; most
comparisons below start from a common checkpoint anyway, so they also hold for train.init=sharded
(each rank draws only its shards, on the CPU from its own generator). From a common state on, one
step is the same computation split differently. A step's
global batch is the same for 2 ranks x grad_accum 1 and 1 rank x grad_accum 2 (micro-batch i =
micro-step * world + rank draws its windows and its stochastic rounding from (seed, step, i)),
gradients are averaged with power-of-two divisions (exact), and the AdamW update is elementwise. What
can differ is the summation order of the gradient norm (~1e-7 relative); it changes the weights
only through clipping. So: bf16 with clipping agrees to rtol 1e-5, and with optim.grad_clip=0 the
losses are bit-identical, even under ufp4 with stochastic rounding.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / 'tests'))
import plan  # noqa: E402
import train  # noqa: E402
from conftest import full_unless  # noqa: E402
from test_train import VOCAB, records, write_dataset  # noqa: E402

TINY, MOE_TINY = str(ROOT / 'configs' / 'tiny.toml'), str(ROOT / 'configs' / 'moe-tiny.toml')


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp('data') / 'synthetic')


def args(config, data_dir, out_dir, *extra):
    """A tiny config shrunk for tests: 128-token vocabulary, 32-token windows, 4 sequences per micro-batch."""
    return [config, f'--data.dir={data_dir}', f'--log.out_dir={out_dir}', f'--model.vocab_size={VOCAB}',
            '--model.seq_len=32', '--train.device=cpu', '--train.eval_interval=4', '--data.eval_batches=2',
            '--optim.warmup_steps=5', '--data.batch_size=4', '--train.max_steps=8', *extra]


def torchrun(argv, n=2):
    """train.py in n processes (gloo on the CPU), as a user would start it."""
    env = dict(os.environ, OMP_NUM_THREADS='1', TRITON_INTERPRET='1')
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={n}', 'train.py']
    out = subprocess.run(cmd + argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return out.stdout


def losses(run_dir):
    return [r['loss'] for r in records(run_dir)]


def side(run_dir):
    return json.loads((Path(run_dir) / 'ckpt.json').read_text())


# ----------------------------------------------------------------------------- FSDP2 == one process
def test_fsdp_from_scratch_matches_one_process(data_dir, tmp_path):
    """No common checkpoint: 2 ranks draw the whole model from the seed (train.init=auto -> full), so
    their steps equal one process's (grad_accum 2, no clipping: bit-identical)."""
    common = ['--train.max_steps=4', '--optim.grad_clip=0', '--train.ckpt_interval=-1']
    train.main(args(TINY, data_dir, tmp_path / 'one', '--data.grad_accum=2', *common))
    torchrun(args(TINY, data_dir, tmp_path / 'two', *common))
    assert losses(tmp_path / 'two') == losses(tmp_path / 'one') and len(losses(tmp_path / 'one')) == 4


RECIPES = {'bf16': [], 'ufp4': ['--quant.recipe=ufp4', '--optim.grad_clip=0']}


@pytest.fixture(scope='module')
def reference(data_dir, tmp_path_factory):
    """Per recipe, with grad_accum 2 (the global batch of 2 ranks x grad_accum 1): a one-process run
    stopped at step 2 (the 2-rank runs' common start) and, apart from it, an uninterrupted
    one-process run of 8 steps, whose losses the 2-rank runs must repeat."""
    out = {}
    for recipe, extra in RECIPES.items():
        base, one = tmp_path_factory.mktemp(f'base-{recipe}'), tmp_path_factory.mktemp(f'one-{recipe}')
        train.main(args(TINY, data_dir, base, '--data.grad_accum=2', '--train.stop_after=2', *extra))
        train.main(args(TINY, data_dir, one, '--data.grad_accum=2', *extra))
        out[recipe] = base, losses(one)
    return out


@pytest.mark.parametrize('recipe', full_unless(['ufp4'], ['bf16', 'ufp4']))
def test_fsdp_matches_one_process(reference, data_dir, tmp_path, recipe):
    """2 ranks (FSDP2; with activation checkpointing under ufp4) resume the one-process checkpoint
    and repeat the uninterrupted one-process run's losses (steps 1-2 are the checkpoint's own log)."""
    base, want = reference[recipe]
    shutil.copytree(base, tmp_path, dirs_exist_ok=True)
    extra = RECIPES[recipe] + (['--train.activation_checkpointing=true'] if recipe == 'ufp4' else [])
    stdout = torchrun(args(TINY, data_dir, tmp_path, *extra))
    assert '2 x cpu | fsdp' in stdout and 'resumed from ckpt.pt at step 2' in stdout
    got = losses(tmp_path)
    assert len(got) == len(want) == 8 and got[:2] == want[:2]
    if recipe == 'bf16':  # clipping: the gradient norm's summation order differs
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=0)
    else:  # no clipping: the same arithmetic, bit for bit
        assert got == want
    assert side(tmp_path)['step'] == 8 and side(tmp_path)['world_size'] == 2
    assert sorted(p.name for p in tmp_path.glob('ckpt-*')) == ['ckpt-0000008']  # older ones removed
    assert not list(tmp_path.glob('*.tmp'))


@pytest.mark.full
def test_checkpoints_across_world_sizes(data_dir, tmp_path):
    """moe-tiny under ufp4 (stochastic rounding, routed experts sharded along E, expert bias): 8
    steps in one process, against the same 8 steps passed between world sizes and formats:
    1 process (ckpt.pt) -> 2 ranks -> 1 rank (FSDP2) -> 2 ranks -> 1 process -> 2 ranks. (val_loss
    differs: every rank evaluates data.eval_batches batches of its own.)"""
    one, hop = tmp_path / 'one', tmp_path / 'hop'
    common = ['--quant.recipe=ufp4', '--optim.grad_clip=0']
    train.main(args(MOE_TINY, data_dir, one, '--data.grad_accum=2', *common))

    def step(n, until, *extra):
        argv = args(MOE_TINY, data_dir, hop, *common, f'--train.stop_after={until}', *extra)
        return torchrun(argv) if n == 2 else train.main(argv + ['--data.grad_accum=2'])

    step(1, 1)  # step 1 in one process: the same initial weights as `one`
    step(2, 2)  # steps 2-3 on 2 ranks: a 2-rank sharded checkpoint
    assert side(hop) == {**side(hop), 'step': 3, 'world_size': 2}
    step(1, 1, '--train.parallel=fsdp')  # step 4: FSDP2 in one process reads the 2-rank shards
    assert side(hop)['step'] == 4 and side(hop)['world_size'] == 1
    step(2, 1)  # step 5: 2 ranks read the 1-rank shards
    step(1, 1)  # step 6: one process, unsharded, reads the sharded checkpoint and writes ckpt.pt
    assert torch.load(hop / 'ckpt.pt', weights_only=True)['step'] == 6 and side(hop)['step'] == 5
    stdout = step(2, 2)  # steps 7-8: 2 ranks read ckpt.pt, the newer checkpoint
    assert 'resumed from ckpt.pt at step 6' in stdout
    a, b = records(one), records(hop)
    assert [r['step'] for r in b] == list(range(1, 9))
    assert [r['loss'] for r in a] == [r['loss'] for r in b]
    assert [r['moe_load_max'] for r in a] == [r['moe_load_max'] for r in b]


def test_export_and_sample(reference, data_dir, tmp_path, capsys):
    """--export writes the newest sharded checkpoint as ckpt.pt, equal to torch's own converter's
    output; --sample asks for it first, then reads it."""
    shutil.copytree(reference['bf16'][0], tmp_path, dirs_exist_ok=True)
    torchrun(args(TINY, data_dir, tmp_path, '--train.max_steps=4'))
    sample = [TINY, f'--log.out_dir={tmp_path}', '--train.device=cpu', '--sample', '--sample.num_samples=1',
              '--sample.max_new_tokens=4', '--sample.prompt=a']
    with pytest.raises(SystemExit, match='--export'):  # ckpt.pt is older (step 2) than the shards
        train.main(sample)
    train.main(args(TINY, data_dir, tmp_path, '--export'))
    ours = torch.load(tmp_path / 'ckpt.pt', weights_only=True)
    dcp_to_torch_save(tmp_path / 'ckpt-0000004', tmp_path / 'theirs.pt')
    theirs = torch.load(tmp_path / 'theirs.pt', weights_only=False)
    assert ours['step'] == 4 and ours['config']['model']['overrides']['vocab_size'] == VOCAB
    assert ours['model'].keys() == theirs['model'].keys()
    assert all(torch.equal(v, theirs['model'][k]) for k, v in ours['model'].items())
    for name, state in ours['optimizer']['state'].items():
        assert all(torch.equal(v, theirs['optimizer']['state'][name][k]) for k, v in state.items())
    capsys.readouterr()
    train.main(sample)
    assert 'ckpt.pt (step 4' in capsys.readouterr().out


@pytest.mark.full
def test_sharded_init(data_dir, tmp_path):
    """train.init=sharded: weights initialized after sharding, on 2 ranks (one step at lr 0 writes them out): finite,
    with the initializer's spread, and no shard a copy of another (each rank draws its own)."""
    torchrun(args(TINY, data_dir, tmp_path, '--train.max_steps=1', '--optim.lr=0', '--train.init=sharded'))
    dcp_to_torch_save(tmp_path / 'ckpt-0000001', tmp_path / 'full.pt')
    model = torch.load(tmp_path / 'full.pt', weights_only=False)['model']
    std = train.get_config('tiny').init_std
    for name, w in model.items():
        assert torch.isfinite(w).all(), name
        if w.dim() == 2:  # rows [0, n/2) live on rank 0, the rest on rank 1
            half = w.shape[0] // 2
            assert not torch.equal(w[:half], w[half:2 * half]), name
            if not name.endswith(('wo.weight', 'w2.weight')):  # those are scaled down by depth
                assert abs(w.std().item() / std - 1) < 0.2, name
        else:
            assert torch.equal(w, torch.ones_like(w)), name  # RMSNorm weights


def test_meta_init_covers_every_parameter_and_buffer():
    """build on meta + parallelize (allocate, init_weights) == a model built directly, for every
    buffer (RoPE tables, MoE expert bias) and in the distribution of every parameter."""
    dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)
    try:
        cfg = train.Config()
        cfg.model.preset, cfg.quant.recipe = 'moe-tiny', 'ufp4'
        mcfg, recipe = train.resolve(cfg)
        torch.manual_seed(0)
        direct = train.build_model(mcfg, recipe, torch.device('cpu'))
        for mode in ('none', 'fsdp'):
            meta = train.build_model(mcfg, recipe, torch.device('meta'))
            model, _ = train.parallelize(meta, cfg, mode, torch.device('cpu'), bf16=False)
            bufs, want = dict(model.named_buffers()), dict(direct.named_buffers())
            assert bufs.keys() == want.keys() and {'rope_cos', 'layers.1.ffn.expert_bias'} <= bufs.keys()
            assert all(torch.equal(bufs[k], want[k]) for k in want), mode
            params = {k: (v.full_tensor() if hasattr(v, 'full_tensor') else v) for k, v in model.named_parameters()}
            for name, p in direct.named_parameters():
                q = params[name]
                assert q.shape == p.shape and not q.is_meta and torch.isfinite(q).all(), name
                if p.dim() == 1:
                    assert torch.equal(q, p), name
                else:  # same initializer: stds agree within sampling error
                    assert abs(q.std().item() / p.std().item() - 1) < 0.2, name
    finally:
        dist.destroy_process_group()


def test_parallel_mode():
    c = train.TrainConfig()
    assert train.parallel_mode(c, 1) == 'none' and train.parallel_mode(c, 4) == 'fsdp'
    os.environ['TORCHELASTIC_RUN_ID'] = 'test'  # torchrun with one process: FSDP2 too
    try:
        assert train.parallel_mode(c, 1) == 'fsdp'
    finally:
        del os.environ['TORCHELASTIC_RUN_ID']
    c.parallel = 'fsdp'
    assert train.parallel_mode(c, 1) == 'fsdp'
    c.parallel = 'none'
    with pytest.raises(SystemExit, match='use fsdp or ddp'):
        train.parallel_mode(c, 2)
    with pytest.raises(SystemExit, match="valid: auto, fsdp, ddp, none"):
        train.load_config(TINY, ['--train.parallel=zero3'])


# ----------------------------------------------------------------------------- plan.py
def saved_by_autograd(model, x, bf16):
    """Bytes of the distinct storages autograd keeps for the backward, FSDP's gathered weights aside."""
    seen = {}

    def pack(t):
        if not (isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter)):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf16), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, x)
    return sum(seen.values())


@pytest.mark.parametrize('pack', [False, True])
@pytest.mark.parametrize('preset,bf16,name', [('tiny', False, 'ufp4'), ('tiny', True, 'ufp4'), ('moe-tiny', False, 'ufp4'),
                                              ('moe-tiny', True, 'ufp4'), ('tiny', True, 'ufp4-nv')])
def test_plan_activations_match_autograd(preset, bf16, name, pack):
    """plan.py's per-block formulas against what autograd really keeps, under FSDP2 in one process
    (fp32, and bf16 autocast with bf16 gathered weights). The CPU's RMSNorm also keeps the
    normalized input (4TD per norm; the fused CUDA kernel does not): added here."""
    dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)
    try:
        cfg = train.Config()
        cfg.model.preset, cfg.quant.recipe = preset, name
        cfg.quant.overrides = {'pack_saved': str(pack).lower()}
        cfg.model.overrides = dict(vocab_size=VOCAB, seq_len=32, n_layer=3, d_model=128, n_head=8, n_kv_head=2)
        mcfg, recipe = train.resolve(cfg)
        model, _ = train.parallelize(train.build_model(mcfg, recipe, torch.device('meta')), cfg, 'fsdp',
                                     torch.device('cpu'), bf16)
        B, T, a = 4, 4 * 32, 2 if bf16 else 4
        got = saved_by_autograd(model, torch.randint(0, VOCAB, (B, 32)), bf16)
        want = (sum(sum(plan.block_activations(mcfg, b.ffn, T, a, joins=plan.joined(b), packed=plan.packed_bytes(recipe),
                                                packed_experts=plan.packed_bytes(recipe, True)).values())
                    for b in model.layers)
                + plan.head_activations(mcfg, T, a) + (2 * mcfg.n_layer + 1) * 4 * T * mcfg.d_model)
        assert want == pytest.approx(got, rel=0.01)
    finally:
        dist.destroy_process_group()


def test_plan_report(capsys):
    """The 124B MoE on 64 H200: does not fit as configured, fits with activation checkpointing,
    is communication-bound, and says what expert parallelism would change."""
    plan.main([str(ROOT / 'configs' / 'moe-124b.toml'), '--world-size', '64'])
    out = capsys.readouterr().out
    assert '124.761B total' in out and 'on 64 GPUs' in out
    assert 'does not fit as configured' in out
    assert 'with --train.activation_checkpointing=true: data.batch_size <= 16' in out
    assert 'communication-bound' in out and 'Expert parallelism (--ep, train.ep)' in out
    plan.main([str(ROOT / 'configs' / 'moe-124b.toml'), '--world-size', '8'])
    assert 'does not fit on 8 GPUs' in capsys.readouterr().out
    plan.main([TINY, '--world-size', '1', '--data.batch_size=2', '--train.activation_checkpointing=true'])
    out = capsys.readouterr().out
    assert 'fits as configured (batch_size=2, activation_checkpointing=true)' in out


def test_plan_memory_arithmetic():
    """States: 16 bytes per parameter, split over the ranks (with fully_shard's padding); the
    unsharded gradients of accumulation; activations linear in the micro-batch; communication."""
    s = plan.setup(train.load_config(TINY, []), reserve_gb=0)
    params = list(s.model.parameters())
    P, rows = s.numel(params), sum(p[0].numel() for p in params)  # padding: under a row per tensor
    one, three = plan.memory(s, 1, False, 1), plan.memory(s, 1, False, 3)
    assert one['weights (fp32 shard)'] == 4 * P and one['AdamW states (fp32 shards)'] == 8 * P
    assert P / 3 * 4 <= three['weights (fp32 shard)'] <= (P / 3 + rows) * 4
    assert three['unsharded gradients (grad_accum > 1)'] == 0 and three['reserve'] == 0
    s.grad_accum = 2
    assert plan.memory(s, 1, False, 3)['unsharded gradients (grad_accum > 1)'] == 4 * P
    a1, a2 = (plan.memory(s, b, False, 3)['activations kept'] for b in (1, 2))
    assert a2 == 2 * a1 and plan.memory(s, 2, True, 3)['activations kept'] < a2
    gather, scatter = plan.communication(s, 4)
    assert scatter == pytest.approx(0.75 * 4 * P)
    emb = s.model.tok_emb.weight.numel()
    assert gather == pytest.approx(2 * 0.75 * (2 * 2 * sum(s.blocks) + 2 * s.root + 2 * 4 * emb))
