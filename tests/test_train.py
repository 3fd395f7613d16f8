"""train.py end to end on the CPU: short runs of configs/tiny.toml on a synthetic dataset written
in the data/prepare.py format (meta.json + uint16 shards), run in-process through train.main."""
import dataclasses
import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import rundir  # noqa: E402
import train  # noqa: E402

CONFIG = str(ROOT / 'configs' / 'tiny.toml')
VOCAB = 128
RECORD_KEYS = {'step', 'loss', 'lr', 'grad_norm', 'tokens', 'tok_s', 'mfu', 'mem_gb'}


def write_dataset(root: Path) -> Path:
    """A learnable token stream: next = (5 * prev + 3) % 127 nine times in ten, else random;
    documents of 200 tokens, each followed by the end-of-text token (127 here)."""
    rng = np.random.default_rng(0)
    eot = VOCAB - 1

    def split(n_docs):
        out = []
        for _ in range(n_docs):
            t = int(rng.integers(eot))
            for _ in range(200):
                t = (5 * t + 3) % eot if rng.random() < 0.9 else int(rng.integers(eot))
                out.append(t)
            out.append(eot)
        return np.array(out, dtype=np.uint16)

    root.mkdir(parents=True, exist_ok=True)
    meta = {'source': 'synthetic', 'tokenizer': 'gpt2', 'vocab_size': VOCAB, 'eot_token': eot, 'dtype': 'uint16'}
    for name, shards in (('train', [split(60), split(40)]), ('val', [split(20)])):
        files = []
        for i, tokens in enumerate(shards):
            tokens.tofile(root / f'{name}_{i:03d}.bin')
            files.append(f'{name}_{i:03d}.bin')
        meta[name] = {'shards': files, 'tokens': int(sum(len(s) for s in shards)), 'documents': []}
    (root / 'meta.json').write_text(json.dumps(meta))
    return root


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp('data') / 'synthetic')


def args(data_dir, out_dir, *extra):
    """configs/tiny.toml shrunk for tests: a 128-token vocabulary, 32-token windows, CPU."""
    return [CONFIG, f'--data.dir={data_dir}', f'--log.out_dir={out_dir}', f'--model.vocab_size={VOCAB}',
            '--model.seq_len=32', '--train.device=cpu', '--train.eval_interval=10', '--data.eval_batches=2',
            '--optim.warmup_steps=5', '--data.batch_size=8', *extra]


def records(out_dir):
    return [json.loads(line) for line in (Path(out_dir) / 'log.jsonl').read_text().splitlines()]


def error_of(argv) -> str:
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    assert e.value.code not in (0, None)
    return str(e.value)


@pytest.fixture(scope='module')
def runs(data_dir, tmp_path_factory):
    """30 steps with the bf16 and the ufp4 recipe (ufp4 with an RHT override passed through)."""
    out = {}  # ufp4 with one layer: on the CPU every 4-bit GEMM runs the PyTorch reference quantizer
    for recipe, extra in (('bf16', []), ('ufp4', ['--quant.rht=fprop,wgrad', '--model.n_layer=1'])):
        out[recipe] = tmp_path_factory.mktemp(recipe)
        train.main(args(data_dir, out[recipe], '--train.max_steps=30', f'--quant.recipe={recipe}', *extra))
    return out


@pytest.mark.parametrize('recipe', ['bf16', 'ufp4'])
def test_loss_falls(runs, recipe):
    losses = [r['loss'] for r in records(runs[recipe])]
    assert len(losses) == 30
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert first > np.log(VOCAB) - 0.5  # starts near chance
    assert last < first - 1.0, (first, last)


def test_git_commit_says_when_the_tree_differs(tmp_path):
    """A run records the commit and whether tracked files differ from it (its results are then of other code)."""
    if shutil.which('git') is None:
        pytest.skip('needs git')
    git = functools.partial(subprocess.run, cwd=tmp_path, check=True, capture_output=True)
    git(['git', 'init', '-q'])
    (tmp_path / 'a.py').write_text('x = 1\n')
    git(['git', 'add', 'a.py'])
    git(['git', '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qm', 'a'])
    sha = git(['git', 'rev-parse', 'HEAD'], text=True).stdout.strip()
    (tmp_path / 'b.py').write_text('untracked\n')  # untracked files do not count
    assert rundir.git_commit(tmp_path) == sha and len(sha) == 40
    (tmp_path / 'a.py').write_text('x = 2\n')
    assert rundir.git_commit(tmp_path) == sha + '-dirty'
    assert rundir.git_commit(tmp_path / 'nowhere') == 'unknown'


def test_code_tree_names_the_code_that_ran(tmp_path):
    """A copy of the tree whose .git is older than its files records the old commit (dirty); its code's tree
    id equals that of the commit the files came from, and a change outside the code leaves it alone."""
    if shutil.which('git') is None:
        pytest.skip('needs git')
    git = functools.partial(subprocess.run, cwd=tmp_path, check=True, capture_output=True, text=True)

    def commit(message):
        git(['git', 'add', '-A'])
        git(['git', '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qm', message])
        return git(['git', 'rev-parse', 'HEAD']).stdout.strip()

    git(['git', 'init', '-q'])
    (tmp_path / 'a.py').write_text('x = 1\n')
    (tmp_path / 'notes.md').write_text('one\n')
    old = commit('old')
    (tmp_path / 'a.py').write_text('x = 2\n')
    (tmp_path / 'cfg').mkdir()
    (tmp_path / 'cfg' / 'b.toml').write_text('[x]\n')
    new = commit('new')
    git(['git', 'reset', '-q', '--soft', old])  # the stale .git: HEAD is old, the files are new's
    assert rundir.git_commit(tmp_path) == old + '-dirty'
    ran = rundir.code_tree(tmp_path)
    assert ran == rundir.code_tree(tmp_path, new) != rundir.code_tree(tmp_path, old) and len(ran) == 40
    (tmp_path / 'notes.md').write_text('two\n')  # not code
    assert rundir.code_tree(tmp_path) == ran
    (tmp_path / 'c.py').write_text('y = 0\n')  # new code, committed nowhere
    assert rundir.code_tree(tmp_path) not in (ran, rundir.code_tree(tmp_path, old))
    assert rundir.code_tree(tmp_path / 'nowhere') == 'unknown'


def test_run_files(runs):
    recs = records(runs['ufp4'])
    assert [r['step'] for r in recs] == list(range(1, 31))
    for r in recs:
        assert RECORD_KEYS <= set(r)
        assert all(np.isfinite(r[k]) for k in RECORD_KEYS)
    assert [r['step'] for r in recs if 'val_loss' in r] == [10, 20, 30]
    assert recs[-1]['tokens'] == 30 * 8 * 32
    assert recs[4]['lr'] == pytest.approx(3e-3) and recs[-1]['lr'] < recs[10]['lr']
    info = json.loads((runs['ufp4'] / 'config.json').read_text())
    assert {'torch', 'triton', 'numpy', 'python'} <= set(info['versions'])
    assert info['versions']['torch'] == torch.__version__ and info['git_commit']
    assert info['config']['train']['max_steps'] == 30 and info['config']['model']['overrides']['seq_len'] == 32
    assert info['config']['quant'] == {'recipe': 'ufp4', 'backend': 'auto', 'overrides': {'rht': 'fprop,wgrad'}}
    assert info['recipe']['fprop_x']['rht'] and not info['recipe']['dgrad_dy']['rht']
    assert info['recipe']['wgrad_x']['rht'] and info['recipe']['fprop_x']['grid'] == 'e1m2'
    assert info['model_config']['seq_len'] == 32 and info['autocast_dtype'] == 'float32'
    assert (runs['ufp4'] / 'ckpt.pt').is_file() and not list(runs['ufp4'].glob('*.tmp'))


@pytest.mark.parametrize('recipe,half', [('bf16', 10), ('ufp4', 5)])
def test_exact_resume(data_dir, tmp_path, recipe, half):
    """N steps, stop, resume for N more == 2N steps straight: the same bits. ufp4 draws its
    stochastic-rounding seeds from torch's RNG, so this also checks the RNG state is restored."""
    straight, resumed = tmp_path / 'straight', tmp_path / 'resumed'
    common = [f'--train.max_steps={2 * half}', f'--quant.recipe={recipe}', '--train.eval_interval=2',
              '--data.grad_accum=2'] + (['--model.n_layer=1'] if recipe == 'ufp4' else [])
    train.main(args(data_dir, straight, *common))
    train.main(args(data_dir, resumed, *common, f'--train.stop_after={half}'))
    assert [r['step'] for r in records(resumed)] == list(range(1, half + 1))
    assert torch.load(resumed / 'ckpt.pt', weights_only=False)['step'] == half
    train.main(args(data_dir, resumed, *common))
    a, b = records(straight), records(resumed)
    assert [r['step'] for r in b] == list(range(1, 2 * half + 1))
    assert sum('val_loss' in r for r in b) == half
    for key in ('loss', 'grad_norm', 'lr', 'val_loss'):
        assert [r.get(key) for r in a] == [r.get(key) for r in b], key
    ca, cb = (torch.load(d / 'ckpt.pt', weights_only=False) for d in (straight, resumed))
    assert ca['step'] == cb['step'] == 2 * half
    assert ca['model'].keys() == cb['model'].keys()
    for k in ca['model']:
        assert torch.equal(ca['model'][k], cb['model'][k]), k
    for pa, pb in zip(ca['optimizer']['state'].values(), cb['optimizer']['state'].values()):
        assert torch.equal(pa['exp_avg'], pb['exp_avg']) and torch.equal(pa['exp_avg_sq'], pb['exp_avg_sq'])


def test_moe_trains_balances_and_resumes(data_dir, tmp_path):
    """moe-tiny: routed experts get the recipe, the expert bias moves every step (and is saved),
    and a resumed run repeats the straight one."""
    straight, resumed = tmp_path / 'straight', tmp_path / 'resumed'
    common = [str(ROOT / 'configs' / 'moe-tiny.toml'), '--train.max_steps=6', '--quant.recipe=ufp4']
    train.main([*common, *args(data_dir, straight)[1:]])
    train.main([*common, *args(data_dir, resumed)[1:], '--train.stop_after=3'])
    train.main([*common, *args(data_dir, resumed)[1:]])
    a, b = records(straight), records(resumed)
    assert [r['loss'] for r in a] == [r['loss'] for r in b]
    assert all(r['moe_load_max'] >= 1.0 and 'moe_load_1' in r for r in a)
    state = torch.load(straight / 'ckpt.pt', weights_only=False)['model']
    assert state['layers.1.ffn.expert_bias'].abs().sum() > 0
    assert torch.equal(state['layers.1.ffn.expert_bias'],
                       torch.load(resumed / 'ckpt.pt', weights_only=False)['model']['layers.1.ffn.expert_bias'])


def test_resume_rejects_other_model(data_dir, tmp_path):
    train.main(args(data_dir, tmp_path, '--train.max_steps=2'))
    msg = error_of(args(data_dir, tmp_path, '--train.max_steps=4', '--quant.recipe=ufp4'))
    assert 'quant' in msg and '--log.out_dir' in msg
    msg = error_of(args(data_dir, tmp_path / 'none', '--train.resume=true'))
    assert 'no checkpoint' in msg


def test_non_finite_loss_stops_and_keeps_checkpoint(data_dir, tmp_path):
    train.main(args(data_dir, tmp_path, '--train.max_steps=5'))
    ckpt = tmp_path / 'ckpt.pt'
    before = ckpt.read_bytes()
    msg = error_of(args(data_dir, tmp_path, '--train.max_steps=20', '--optim.lr=1e30', '--optim.warmup_steps=0'))
    assert 'non-finite' in msg and str(ckpt) in msg
    assert ckpt.read_bytes() == before and not list(tmp_path.glob('*.tmp'))
    recs = records(tmp_path)
    assert 6 <= len(recs) < 20 and all(np.isfinite(r['loss']) for r in recs)
    # resuming with a sane lr continues from step 5: the log's records after it are replaced
    train.main(args(data_dir, tmp_path, '--train.max_steps=8'))
    recs = records(tmp_path)
    assert [r['step'] for r in recs] == list(range(1, 9)) and max(r['lr'] for r in recs) < 1


def test_checkpoint_refuses_non_finite_weights(tmp_path):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    with torch.no_grad():
        model.weight[0, 0] = float('nan')
    with pytest.raises(RuntimeError, match='non-finite weights'):
        train.save_checkpoint(tmp_path / 'ckpt.pt', model, opt, 1, train.Config())
    assert not list(tmp_path.iterdir())


def test_bad_key_names_the_nearest(data_dir, tmp_path):
    assert "did you mean 'train.max_steps'" in error_of(args(data_dir, tmp_path, '--train.max_step=3'))
    assert "did you mean 'model.n_layer'" in error_of(args(data_dir, tmp_path, '--model.n_layers=3'))
    assert "did you mean 'optim'" in error_of(args(data_dir, tmp_path, '--optm.lr=1'))
    msg = error_of(args(data_dir, tmp_path, '--train.max_steps=ten'))
    assert 'train.max_steps expects int' in msg and "'ten'" in msg
    assert 'expects bool' in error_of(args(data_dir, tmp_path, '--train.compile=yes'))
    assert 'valid: auto, torch, triton' in error_of(args(data_dir, tmp_path, '--quant.backend=cuda'))
    assert 'valid: auto, default, reduce-overhead' in error_of(args(data_dir, tmp_path, '--train.compile_mode=max'))
    assert 'cannot read' in error_of(args(data_dir, tmp_path, 'max_steps=3'))
    assert 'no file' in error_of([str(tmp_path / 'nope.toml')])
    assert "unknown model preset 'tiney'" in error_of(args(data_dir, tmp_path, '--model.preset=tiney'))
    assert 'fprp' in error_of(args(data_dir, tmp_path, '--quant.recipe=ufp4', '--quant.rht=fprp'))
    assert 'rht_resample' in error_of(args(data_dir, tmp_path, '--quant.rht_resampel=true'))


def test_cuda_graphs_need_one_process():
    c = train.TrainConfig(compile=True, compile_mode='reduce-overhead', parallel='ddp')
    mode = train.parallel_mode(c, 1)
    with pytest.raises(SystemExit, match='reduce-overhead.*one process'):
        train.compile_mode(c, mode, torch.device('cuda', 0))
    none = dataclasses.replace(c, parallel='none')
    assert train.compile_mode(none, train.parallel_mode(none, 1), torch.device('cuda', 0))[0] == 'reduce-overhead'


def test_compile_mode_auto_and_errors():
    """auto takes CUDA graphs exactly where they can run (one process on a GPU) and says why; an
    explicit reduce-overhead where they cannot is an error naming the reason, before any work."""
    cuda, cpu = torch.device('cuda', 0), torch.device('cpu')
    auto = train.TrainConfig(compile=True)
    assert auto.compile_mode == 'auto'
    assert train.compile_mode(auto, 'none', cuda) == ('reduce-overhead', 'auto: CUDA graphs, one process on a GPU')
    mode, why = train.compile_mode(auto, 'fsdp', cuda)
    assert mode == 'default' and 'fsdp' in why
    mode, why = train.compile_mode(auto, 'none', cpu)
    assert mode == 'default' and 'cpu' in why
    assert train.compile_mode(dataclasses.replace(auto, compile=False), 'none', cuda)[0] is None
    assert train.compile_mode(dataclasses.replace(auto, compile_mode='default'), 'none', cuda)[0] == 'default'
    graphs = dataclasses.replace(auto, compile_mode='reduce-overhead')
    assert train.compile_mode(graphs, 'none', cuda)[0] == 'reduce-overhead'
    with pytest.raises(SystemExit, match='CUDA graphs.*cpu'):
        train.compile_mode(graphs, 'none', cpu)
    with pytest.raises(SystemExit, match='train.compile=true'):
        train.compile_mode(dataclasses.replace(graphs, compile=False), 'none', cuda)


def test_bad_config_file_key(data_dir, tmp_path):
    cfg = tmp_path / 'bad.toml'
    cfg.write_text(Path(CONFIG).read_text().replace('eval_interval', 'eval_intervall'))
    assert "did you mean 'train.eval_interval'" in error_of([str(cfg)])


def test_config_values(tmp_path):
    cfg = tmp_path / 'c.toml'
    cfg.write_text('[model]\npreset = "small"\nn_layer = 3\n[optim]\nlr = 1\n'
                   '[quant]\nrecipe = "ufp4"\nrht = ["fprop", "wgrad"]\nrht_resample = true\nblock = 32\n')
    c = train.load_config(str(cfg), ['--optim.lr=2e-3', '--train.compile=TRUE', '--model.rope_theta=5e5'])
    assert c.model.preset == 'small' and c.model.overrides == {'n_layer': 3, 'rope_theta': 5e5}
    assert c.optim.lr == 2e-3 and c.train.compile is True and c.train.max_steps == train.TrainConfig().max_steps
    assert c.quant.overrides == {'rht': 'fprop,wgrad', 'rht_resample': 'true', 'block': '32'}
    mcfg, recipe = train.resolve(c)
    assert mcfg.n_layer == 3 and mcfg.d_model == 512 and recipe.rht_resample
    assert recipe.fprop_x.rht and not recipe.dgrad_w.rht and recipe.wgrad_x.block == 32
    cfg.write_text('[optim]\nlr = "fast"\n')
    with pytest.raises(SystemExit, match="optim.lr expects float, got 'fast'"):
        train.load_config(str(cfg), [])
    cfg.write_text('lr = 1\n')
    with pytest.raises(SystemExit, match='inside a \\[section\\]'):
        train.load_config(str(cfg), [])


def test_wrong_dtype(data_dir, tmp_path):
    msg = error_of(args(data_dir, tmp_path, '--train.dtype=fp16'))
    assert 'train.dtype' in msg and 'bfloat16' in msg and 'float32' in msg


def test_missing_data(tmp_path):
    msg = error_of(args(tmp_path / 'nowhere', tmp_path / 'run'))
    assert 'meta.json' in msg and 'python data/prepare.py shakespeare' in msg
    broken = write_dataset(tmp_path / 'broken')
    (broken / 'val_000.bin').unlink()
    assert 'val_000.bin' in error_of(args(broken, tmp_path / 'run'))


def test_schedules():
    o = train.OptimConfig(lr=1.0, min_lr_ratio=0.1, warmup_steps=10, schedule='cosine')
    assert train.lr_at(0, o, 100) == pytest.approx(0.1) and train.lr_at(9, o, 100) == pytest.approx(1.0)
    assert train.lr_at(55, o, 100) == pytest.approx(0.55) and train.lr_at(100, o, 100) == pytest.approx(0.1)
    o.schedule, o.decay_frac = 'wsd', 0.2
    assert train.lr_at(50, o, 100) == 1.0 and train.lr_at(79, o, 100) == 1.0
    assert train.lr_at(90, o, 100) == pytest.approx(0.55) and train.lr_at(100, o, 100) == pytest.approx(0.1)


def test_batches_are_a_function_of_the_key(data_dir):
    data = train.load_data(str(data_dir), 32, VOCAB)
    x1, y1 = train.get_batch(data['train'], [1, 0, 7, 0, 0], 8, 32, torch.device('cpu'))
    x2, _ = train.get_batch(data['train'], [1, 0, 7, 0, 0], 8, 32, torch.device('cpu'))
    x3, _ = train.get_batch(data['train'], [1, 0, 7, 0, 1], 8, 32, torch.device('cpu'))
    assert x1.shape == (8, 32) and torch.equal(x1, x2) and not torch.equal(x1, x3)
    assert torch.equal(x1[:, 1:], y1[:, :-1])


def test_sample(runs, capsys):
    train.main([CONFIG, f'--log.out_dir={runs["bf16"]}', '--train.device=cpu', '--sample',
                '--sample.num_samples=2', '--sample.max_new_tokens=8', '--sample.prompt=a'])
    out = capsys.readouterr().out
    assert 'step 30' in out and out.count('--- sample') == 2


def test_quant_monitor_in_the_log(data_dir, tmp_path):
    """--log.quant_stats_interval=N adds per-layer, per-role statistics to every Nth JSONL record."""
    train.main(args(data_dir, tmp_path, '--train.max_steps=4', '--quant.recipe=e2m1', '--model.n_layer=1',
                    '--log.quant_stats_interval=2'))
    recs = records(tmp_path)
    assert ['quant' in r for r in recs] == [False, True, False, True]
    stats = recs[1]['quant']
    assert set(stats['all']) == {'fprop_x', 'fprop_w', 'dgrad_dy', 'dgrad_w', 'wgrad_dy', 'wgrad_x'}
    assert 'layers.0.ffn.w2' in stats and 'layers.0.attn.wq' in stats
    for role in stats['all'].values():
        assert 0.8 < role['alpha'] < 1.1 and 0 < role['nmse'] < 0.1 and 0 <= role['underflow'] < 1


def test_no_checkpoint_with_interval_minus_one(data_dir, tmp_path):
    """--train.ckpt_interval=-1 (benchmarks) trains and logs but writes no checkpoint."""
    train.main(args(data_dir, tmp_path / 'run', '--train.max_steps=2', '--train.ckpt_interval=-1'))
    assert [r['step'] for r in records(tmp_path / 'run')] == [1, 2]
    assert not (tmp_path / 'run' / 'ckpt.pt').exists() and not (tmp_path / 'run' / 'ckpt.json').exists()
