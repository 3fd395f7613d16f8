"""Expert parallelism on the CPU (gloo): ep ranks against one process, checkpoints across ep sizes,
and the errors for an ep that cannot be laid out.

The comparison. n ranks with ep = n each take B sequences of one global batch; the reference is one
process with all n·B sequences in one micro-batch. The rows an expert's owner receives come source
rank by source rank, each in token order: the reference's rows for that expert, in its order and in
the same aligned groups. So the routed experts compute the same products; what differs is summation
order elsewhere: the loss is a mean of n means, the dense weights' gradients sum n·B sequences in one
GEMM in the reference and n partial sums (FSDP2's reduce-scatter) here. Those are fp32 rounding
differences (~1e-7 relative), which the next step carries on (AdamW's first steps move every weight
by about lr, whatever the gradient's size): rtol 1e-6 on the losses of two steps and 1e-4 on every
gradient (relative norm of the difference), for bf16 and for ufp4 with round-to-nearest everywhere
(sr=none); there, in step 1, the loss and the expert gradients are bit
for bit the reference's (every 4-bit block, along D or along an expert's tokens, holds the same
values). ufp4 as defined rounds the gradients stochastically, and the draws follow the buffers'
shapes, which differ: the first loss (the forward rounds to nearest) is still exact, the first
gradients are two draws of one unbiased estimate (within 0.5 relative at this tiny batch), and the
losses agree to 1e-2.
Two experts get a bias of -1e3 so that no token picks them: with ep = 2 one rank holds an idle
expert, with ep = 4 a rank holds two idle experts and receives no rows at all.
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / 'tests'))
import expert_parallel  # noqa: E402
import moe  # noqa: E402
import plan  # noqa: E402
import train  # noqa: E402
from test_fsdp import MOE_TINY, args, losses, side, torchrun  # noqa: E402
from test_train import VOCAB, write_dataset  # noqa: E402

B, S, STEPS, IDLE = 2, 32, 2, (0, 1)
RECIPES = {'bf16': {}, 'ufp4-rtne': {'sr': 'none'}, 'ufp4': {}}


def run_steps(recipe: str, ep: int, rank: int = 0, world: int = 1, n: int = 1) -> dict:
    """STEPS optimizer steps of moe-tiny on this rank's B sequences of an n·B-sequence batch (the
    whole batch in one process: world 1): losses, full gradients and the final expert bias."""
    cfg = train.Config()
    cfg.model.preset, cfg.train.ep = 'moe-tiny', ep
    cfg.model.overrides = dict(vocab_size=VOCAB, seq_len=S)
    cfg.quant.recipe, cfg.quant.overrides = recipe.split('-')[0], RECIPES[recipe]
    mcfg, qrecipe = train.resolve(cfg)
    torch.manual_seed(0)
    model, _ = train.parallelize(train.build_model(mcfg, qrecipe, torch.device('meta')), cfg,
                                 'fsdp' if world > 1 else 'none', torch.device('cpu'), bf16=False)
    for _, layer in moe.moe_layers(model):
        layer.expert_bias[list(IDLE)] = -1e3
    opt = train.make_optimizer(model, train.OptimConfig(lr=1e-2))
    xy = torch.randint(0, VOCAB, (n * B, S + 1), generator=torch.Generator().manual_seed(1))
    x, y = (t[rank * (n // world) * B:(rank + 1) * (n // world) * B] for t in (xy[:, :-1], xy[:, 1:]))
    out = {'loss': [], 'grads': []}
    for step in range(STEPS):
        torch.manual_seed(100 + step)  # stochastic rounding
        loss = model(x, y)[1]
        loss.backward()
        clip = expert_parallel.clip_grad_norm_ if ep > 1 else torch.nn.utils.clip_grad_norm_
        clip(list(model.parameters()), 1.0)
        grads = {k: (p.grad.full_tensor() if hasattr(p.grad, 'full_tensor') else p.grad).clone()
                 for k, p in model.named_parameters()}
        if world > 1:
            dist.all_reduce(loss := loss.detach().clone())
        out['loss'].append(loss.item() / world)
        out['grads'].append(grads)
        opt.step()
        opt.zero_grad()
        moe.update_bias(model)
    out['bias'] = [layer.expert_bias.clone() for _, layer in moe.moe_layers(model)]
    return out


def worker(out_path: str, ep: int, recipes: list):
    """Under torchrun: every recipe with this ep; rank 0 saves the results."""
    dist.init_process_group('gloo')
    world = dist.get_world_size()
    try:
        res = {r: run_steps(r, ep, dist.get_rank(), world, world) for r in recipes}
        if dist.get_rank() == 0:
            torch.save(res, out_path)
    finally:
        dist.destroy_process_group()


def run_workers(tmp_path, n, ep, recipes):
    env = dict(os.environ, OMP_NUM_THREADS='1', TRITON_INTERPRET='1')
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={n}', __file__,
           str(tmp_path / 'ep.pt'), str(ep), *recipes]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return torch.load(tmp_path / 'ep.pt', weights_only=True)


def compare(got, want, recipe, same_groups):
    """Losses and gradients of STEPS steps (module docstring for the tolerances)."""
    if recipe == 'ufp4' or (recipe != 'bf16' and not same_groups):  # other draws or other 4-bit blocks
        assert got['loss'][0] == want['loss'][0]
        loss_rtol, grad_bound, grads = 1e-2, 0.5, got['grads'][:1]
    else:
        loss_rtol, grad_bound, grads = 1e-6, 1e-4, got['grads']
    np.testing.assert_allclose(got['loss'], want['loss'], rtol=loss_rtol, err_msg=recipe)
    for g, w in zip(grads, want['grads']):
        assert g.keys() == w.keys()
        for k in w:
            err = (g[k] - w[k]).norm() / w[k].norm()
            assert err <= grad_bound, (recipe, k, err.item())
    experts = [k for k in want['grads'][0] if '.experts.' in k]
    if recipe == 'ufp4-rtne' and same_groups:  # the same rows in the same groups: step 1's expert gradients exact
        assert got['loss'][0] == want['loss'][0]
        assert all(torch.equal(got['grads'][0][k], want['grads'][0][k]) for k in experts)
        # global loads: the same bias updates (the routing of step 2 follows step 1's SR draws)
        assert all(torch.equal(a, b) for a, b in zip(got['bias'], want['bias']))
    for step in got['grads']:  # idle experts get no gradient at all, the others do
        for k in experts:
            assert not step[k][list(IDLE)].any() and step[k].abs().sum() > 0, k


def check_against_one_process(tmp_path, n, ep):
    recipes = list(RECIPES)
    got = run_workers(tmp_path, n, ep, recipes)
    for recipe in recipes:
        compare(got[recipe], run_steps(recipe, 1, n=n), recipe, same_groups=ep == n)


def test_ep2_matches_one_process(tmp_path):
    check_against_one_process(tmp_path, 2, 2)


@pytest.mark.full
@pytest.mark.parametrize('ep', [2, 4])
def test_4_ranks_match_one_process(tmp_path, ep):
    """4 ranks: ep = 4 (a rank whose experts get no tokens), and ep = 2, where FSDP2 also shards
    every rank's experts over the 2 ranks that hold the same ones. There an expert's rows are split
    between the 2 ep groups, each aligned on its own, so under ufp4 the wgrad's 4-bit blocks along
    the tokens differ from one process's: the tolerances of stochastic rounding apply."""
    check_against_one_process(tmp_path, 4, ep)


# ----------------------------------------------------------------------------- train.py: checkpoints
@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp('data') / 'synthetic')


def experts_of(state: dict) -> dict:
    return {k: v for k, v in state.items() if '.ffn.expert' in k}


def test_resume_across_ep_sizes(data_dir, tmp_path):
    """moe-tiny, bf16, no clipping: 2 steps on 2 ranks with ep=2 (and activation checkpointing: the
    all-to-alls run again in the backward), a sharded checkpoint of global expert tensors; step 3 in
    one FSDP2 rank with ep=1 from it, then --export: the losses and the exported weights are one
    process's (grad_accum 2) to fp32 rounding (module docstring)."""
    one, hop = tmp_path / 'one', tmp_path / 'hop'
    common = ['--optim.grad_clip=0', '--train.max_steps=3']
    train.main(args(MOE_TINY, data_dir, one, '--data.grad_accum=2', *common))
    stdout = torchrun(args(MOE_TINY, data_dir, hop, '--train.ep=2', '--train.stop_after=2',
                           '--train.activation_checkpointing=true', *common))
    assert '2 x cpu | fsdp (ep=2)' in stdout and side(hop)['step'] == 2
    train.main(args(MOE_TINY, data_dir, hop, '--train.parallel=fsdp', '--data.grad_accum=2', *common))
    assert side(hop)['step'] == 3 and side(hop)['world_size'] == 1
    np.testing.assert_allclose(losses(hop), losses(one), rtol=1e-6)
    train.main(args(MOE_TINY, data_dir, hop, '--export'))
    got, want = (experts_of(torch.load(d / 'ckpt.pt', weights_only=True)['model']) for d in (hop, one))
    assert got.keys() == want.keys() and len(got) == 4  # w1, w2, w3 and the bias, each [E, ...]
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)


@pytest.mark.full
def test_resume_from_ep4(data_dir, tmp_path):
    """One global batch of 4 micro-batches per step, passed between layouts: ep=4 on 4 ranks (steps
    1-2) -> ep=2 on 4 ranks, experts also sharded over 2 (step 3) -> ep=1 on 2 ranks (step 4) -> one
    process, ckpt.pt (step 5) -> ep=2 on 2 ranks from ckpt.pt (step 6): one process's losses."""
    one, hop = tmp_path / 'one', tmp_path / 'hop'
    common = ['--optim.grad_clip=0', '--train.max_steps=6', '--train.eval_interval=100']
    train.main(args(MOE_TINY, data_dir, one, '--data.grad_accum=4', *common))
    for n, ep, steps in ((4, 4, 2), (4, 2, 1), (2, 1, 1), (1, 1, 1), (2, 2, 1)):
        argv = args(MOE_TINY, data_dir, hop, f'--train.stop_after={steps}', f'--data.grad_accum={4 // n}', *common)
        if n == 1:
            train.main(argv)
            continue
        stdout = torchrun(argv + [f'--train.ep={ep}'], n)
        assert f'{n} x cpu | fsdp{f" (ep={ep})" if ep > 1 else ""} |' in stdout
    assert 'resumed from ckpt.pt at step 5' in stdout
    np.testing.assert_allclose(losses(hop), losses(one), rtol=1e-5)
    assert len(losses(hop)) == 6


# ----------------------------------------------------------------------------- errors, plan.py
def test_errors(data_dir, tmp_path):
    """An ep that cannot be laid out stops the run before any work, saying what to change."""
    for config, ep, message in ((MOE_TINY, 3, 'does not divide the 8 routed experts; use a divisor of 8'),
                                (MOE_TINY, 2, 'does not divide the world size 1; start a multiple of 2'),
                                (MOE_TINY, 0, 'must be >= 1'),
                                (str(ROOT / 'configs' / 'tiny.toml'), 2, 'the model has none')):
        with pytest.raises(SystemExit, match=message):
            train.main(args(config, data_dir, tmp_path, f'--train.ep={ep}'))
    assert not (tmp_path / 'log.jsonl').exists()
    with pytest.raises(SystemExit, match='runs under train.parallel=fsdp, not ddp'):
        expert_parallel.check(2, 2, train.get_config('moe-tiny'), 'ddp')
    big = str(ROOT / 'configs' / 'moe-124b.toml')
    with pytest.raises(SystemExit, match='does not divide the 512 routed experts'):
        plan.main([big, '--world-size', '64', '--ep', '3'])
    with pytest.raises(SystemExit, match='does not divide the world size 64'):
        plan.main([big, '--world-size', '64', '--ep', '128'])


def test_plan_ep_arithmetic():
    """plan.py under expert parallelism: the same state memory per GPU, a block gathers its E/ep
    experts, the experts move no FSDP2 bytes at ep = n, and the all-to-all counts 4 passes of
    T k D activations per MoE layer, (ep-1)/ep of them leaving the GPU."""
    cfg = train.load_config(MOE_TINY, ['--train.dtype=bfloat16'])
    one, two, four = (plan.setup(cfg, 0, ep) for ep in (1, 2, 4))
    experts = one.experts(one.model.layers[1])
    assert experts == 3 * 8 * 32 * 64 and one.experts(one.model.layers[0]) == 0
    for s in (two, four):
        assert plan.memory(s, 1, False, 4)['AdamW states (fp32 shards)'] == \
            plan.memory(one, 1, False, 4)['AdamW states (fp32 shards)']
        assert s.blocks[1] == one.blocks[1] - experts * (s.ep - 1) // s.ep
    gather1, scatter1 = plan.communication(one, 4)
    gather4, scatter4 = plan.communication(four, 4)
    assert gather1 - gather4 == pytest.approx(0.75 * 2 * 2 * experts)  # bf16, forward and backward
    assert scatter1 - scatter4 == pytest.approx(0.75 * 4 * experts)
    T, k, D = 64, 2, 64
    assert plan.all_to_all(one, 1, False, 8) == (0, 0)
    assert plan.all_to_all(two, 1, False, 8) == (4 * T * k * D * 2 / 2, 0)
    assert plan.all_to_all(four, 1, True, 2) == (6 * T * k * D * 2 * 3 / 4, 6 * T * k * D * 2 * 2 / 4)


def test_plan_report_ep(capsys):
    """The 124B MoE on 64 GPUs with ep = 8, 16, 64 (activation checkpointing): expert memory, the
    all-to-all, and why the step is still not compute-bound at these bandwidths."""
    for ep in (8, 16, 64):
        plan.main([str(ROOT / 'configs' / 'moe-124b.toml'), '--world-size', '64', '--ep', str(ep),
                   '--train.activation_checkpointing=true'])
        out = capsys.readouterr().out
        assert f'expert parallelism, ep={ep}: a GPU holds {512 // ep} of the 512 experts' in out
        assert '30.6 GB of fp32 weights, gradients and AdamW states' in out  # 16 bytes x experts / 64
        assert 'communication-bound: a step takes' in out and 'overlapping the all-to-all' in out
        assert ('node-limited routing' in out) == (ep > 8)
        if ep == 16:
            assert 'with overlap and node-limited routing, at batch_size=16' in out and '-> compute-bound' in out


if __name__ == '__main__':
    worker(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
