"""Bad inputs and faults: each is a clear error (exit code, the problem and the fix named) that
leaves an earlier run's files as they were; checkpoints that are corrupt, half written (kill -9, a
full disk) or crafted to run code; stopping on a signal; resuming with other settings; the e4m3
tensor scale of a tiny tensor. Short runs of configs/tiny.toml in-process (tests/test_train.py's
synthetic data); kill -9 kills a second process (marked full: slower)."""
import errno
import json
import os
import pickle
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / 'tests'))
import kernels  # noqa: E402
import plan  # noqa: E402
import quant  # noqa: E402
import rundir  # noqa: E402
import train  # noqa: E402
from analysis import analyze  # noqa: E402
from test_train import CONFIG, VOCAB, args, records, write_dataset  # noqa: E402


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp('data') / 'synthetic')


def snapshot(folder: Path) -> dict:
    """Every file under folder: its bytes."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob('*')) if p.is_file()}


def fails(argv, code=None) -> str:
    """train.main(argv) stops with an error; its message."""
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    assert e.value.code not in (0, None) and (code is None or e.value.code == code), e.value.code
    return str(e.value)


@pytest.fixture(scope='module')
def earlier(data_dir, tmp_path_factory):
    """A finished 4-step run (checkpoints at 2 and 4): the run that bad inputs must leave alone."""
    out = tmp_path_factory.mktemp('earlier')
    train.main(args(data_dir, out, '--train.max_steps=4', '--train.ckpt_interval=2'))
    return out


# ----------------------------------------------------------------------------- bad inputs: a table
BAD = [  # (arguments, words the message must hold: the problem and the valid range or the fix)
    (['--data.batch_size=0'], ['data.batch_size=0', '>= 1']),
    (['--data.batch_size=-4'], ['data.batch_size=-4', '>= 1']),
    (['--data.grad_accum=0'], ['data.grad_accum=0', '>= 1']),
    (['--data.eval_batches=0'], ['data.eval_batches=0', '>= 1']),
    (['--train.eval_interval=0'], ['train.eval_interval=0', '>= 1']),
    (['--train.max_steps=0'], ['train.max_steps=0', '>= 1']),
    (['--train.max_steps=-5'], ['train.max_steps=-5', '>= 1']),
    (['--train.ckpt_interval=-5'], ['train.ckpt_interval=-5', '>= -1']),
    (['--optim.lr=-1e-3'], ['optim.lr=-0.001', '>= 0']),
    (['--optim.lr=nan'], ['optim.lr=nan', '>= 0']),
    (['--optim.beta2=1.5'], ['optim.beta2=1.5', '[0, 1)']),
    (['--quant.recipe=nvfp4', '--quant.bf16_last=-1'], ['bf16_last=-1', 'fraction']),
    (['--sample', '--sample.temperature=-1'], ['sample.temperature=-1.0', '>= 0']),
    (['--sample', '--sample.top_k=-3'], ['sample.top_k=-3', '>= 0']),
    (['--quant.recipe=ufp4'], ['trained with [quant]', '--train.resume=false', '--log.out_dir=']),
]


@pytest.mark.parametrize('extra,words', BAD, ids=[' '.join(b[0]) for b in BAD])
def test_bad_value_is_named_and_changes_nothing(data_dir, earlier, extra, words):
    before = snapshot(earlier)
    msg = fails(args(data_dir, earlier, *extra))
    assert all(w in msg for w in words), msg
    assert snapshot(earlier) == before


def test_unreadable_files_are_named(data_dir, earlier, tmp_path):
    before = snapshot(earlier)
    bad = tmp_path / 'bad.toml'
    bad.write_text('[train\nmax_steps = 3\n')
    msg = fails([str(bad), f'--log.out_dir={earlier}'])
    assert str(bad) in msg and 'not valid TOML' in msg
    corpus = write_dataset(tmp_path / 'corpus')
    (corpus / 'meta.json').write_text('{"dtype": "uint16",')
    msg = fails(args(corpus, earlier))
    assert str(corpus / 'meta.json') in msg and 'cannot be parsed' in msg
    assert snapshot(earlier) == before


def test_token_ids_beyond_the_vocab(data_dir, earlier, tmp_path):
    before = snapshot(earlier)
    corpus = write_dataset(tmp_path / 'corpus')
    tokens = np.fromfile(corpus / 'train_001.bin', dtype=np.uint16)
    tokens[123] = 500
    tokens.tofile(corpus / 'train_001.bin')
    msg = fails(args(corpus, earlier))
    assert 'train_001.bin' in msg and 'token id 500' in msg and f'vocab_size {VOCAB}' in msg
    assert snapshot(earlier) == before
    cached = json.loads((corpus / 'meta.json').read_text())['max_token']  # each shard's max, cached
    assert cached['train_000.bin'][1] == VOCAB - 1 and cached['train_001.bin'] == [len(tokens), 500]


def test_triton_backend_needs_a_gpu(data_dir, earlier, monkeypatch):
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    before = snapshot(earlier)
    msg = fails(args(data_dir, earlier, '--quant.backend=triton'))
    assert 'CUDA GPU' in msg and '--quant.backend=auto' in msg
    assert snapshot(earlier) == before


def test_run_directory_that_is_a_file_or_read_only(data_dir, tmp_path):
    (tmp_path / 'file').write_text('x')
    assert 'is a file' in fails(args(data_dir, tmp_path / 'file' / 'run'))
    if os.geteuid() == 0:
        pytest.skip('root writes into read-only directories')
    ro = tmp_path / 'ro'
    ro.mkdir(mode=0o555)
    assert 'not writable' in fails(args(data_dir, ro / 'run')) and not (ro / 'run').exists()


@pytest.mark.parametrize('argv,words', [
    (['--gpu-gb', '-5'], ['--gpu-gb=-5.0', '> 0']),
    (['--mfu', '0'], ['--mfu=0.0', '(0, 1]']),
    (['--world-size', '0'], ['--world-size=0', '>= 1']),
    (['--gpus', '3'], ['unrecognized argument', '--section.key=value']),
])
def test_plan_flags(capsys, argv, words):
    world = [] if '--world-size' in argv else ['--world-size', '8']
    with pytest.raises(SystemExit) as e:
        plan.main([CONFIG, *world, *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and 'usage: python plan.py' in err and all(w in err for w in words), err


def test_plan_batch_zero():
    with pytest.raises(SystemExit, match=r'data.batch_size=0 is out of range; valid: >= 1'):
        plan.main([CONFIG, '--world-size', '8', '--data.batch_size=0'])


# ----------------------------------------------------------------------------- the run directory
def test_fresh_start_moves_the_old_run_aside(data_dir, tmp_path):
    run = tmp_path / 'run'
    train.main(args(data_dir, run, '--train.max_steps=2'))
    before = snapshot(run)
    # a new run that fails on its inputs touches nothing
    fails(args(tmp_path / 'nowhere', run, '--train.resume=false', '--quant.recipe=ufp4'))
    assert snapshot(run) == before
    train.main(args(data_dir, run, '--train.max_steps=2', '--train.resume=false', '--model.n_layer=1'))
    old = [p for p in run.iterdir() if p.name.startswith('old-')]
    assert len(old) == 1 and snapshot(old[0]) == before  # the first run, byte for byte
    assert json.loads((run / 'config.json').read_text())['model_config']['n_layer'] == 1
    assert [r['step'] for r in records(run)] == [1, 2] and not (run / 'lock').exists()


def test_no_op_run_writes_nothing(data_dir, earlier, capsys):
    before = snapshot(earlier)
    train.main(args(data_dir, earlier, '--train.max_steps=4', '--data.grad_accum=2'))
    out = capsys.readouterr().out
    assert 'nothing to do' in out and snapshot(earlier) == before
    assert f'checkpoint: {earlier / "ckpt.pt"}; log: {earlier / "log.jsonl"}' in out  # where the run is


def test_lock_of_a_live_trainer_refuses_and_a_dead_ones_is_taken(data_dir, tmp_path):
    run = tmp_path / 'run'
    run.mkdir()
    host = __import__('socket').gethostname()
    (run / 'lock').write_text(json.dumps({'pid': os.getppid(), 'host': host}))  # a live process
    msg = fails(args(data_dir, run, '--train.max_steps=2'))
    assert f'in use by process {os.getppid()}' in msg and 'delete' in msg and not (run / 'log.jsonl').exists()
    dead = subprocess.Popen(['true'])
    dead.wait()
    (run / 'lock').write_text(json.dumps({'pid': dead.pid, 'host': host}))
    train.main(args(data_dir, run, '--train.max_steps=2'))
    assert [r['step'] for r in records(run)] == [1, 2] and not (run / 'lock').exists()


# ----------------------------------------------------------------------------- checkpoints
@pytest.fixture(scope='module')
def straight(data_dir, tmp_path_factory):
    """4 uninterrupted steps: what every interrupted run must end with, bit for bit."""
    out = tmp_path_factory.mktemp('straight')
    train.main(args(data_dir, out, '--train.max_steps=4'))
    return out


def assert_same_run(a: Path, b: Path):
    ra, rb = records(a), records(b)
    assert [r['step'] for r in rb] == [1, 2, 3, 4]
    for key in ('loss', 'grad_norm', 'lr', 'tokens'):
        assert [r[key] for r in ra] == [r[key] for r in rb], key
    assert ra[-1]['val_loss'] == rb[-1]['val_loss']
    ca, cb = (torch.load(d / 'ckpt.pt', weights_only=True) for d in (a, b))
    assert ca['step'] == cb['step'] == 4
    for k in ca['model']:
        assert torch.equal(ca['model'][k], cb['model'][k]), k


def test_corrupt_checkpoint_is_skipped_by_name(data_dir, straight, tmp_path, capsys):
    run = tmp_path / 'run'
    train.main(args(data_dir, run, '--train.max_steps=4', '--train.ckpt_interval=1', '--train.stop_after=3'))
    blob = bytearray((run / 'ckpt.pt').read_bytes())
    blob[len(blob) // 2:len(blob) // 2 + 4096] = bytes(4096)  # 4 KB of the weights zeroed
    (run / 'ckpt.pt').write_bytes(bytes(blob))
    train.main(args(data_dir, run, '--train.max_steps=4'))
    out = capsys.readouterr().out
    assert f'{run / "ckpt.pt"} does not match its sha256' in out and 'resumed from ckpt.prev.pt at step 2' in out
    assert_same_run(straight, run)
    # every checkpoint corrupt: an error that names them and the way out
    for name in ('ckpt.pt', 'ckpt.prev.pt'):
        (run / name).write_bytes(b'not a checkpoint')
    before = snapshot(run)
    msg = fails(args(data_dir, run, '--train.max_steps=6'))
    assert 'no intact checkpoint' in msg and 'ckpt.prev.pt' in msg and '--train.resume=false' in msg
    assert snapshot(run) == before


def test_disk_full_during_save(data_dir, straight, tmp_path):
    run = tmp_path / 'run'
    train.main(args(data_dir, run, '--train.max_steps=2'))
    good = (run / 'ckpt.pt').read_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(good) // 2, hard))
    try:
        msg = fails(args(data_dir, run, '--train.max_steps=4'))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert f'writing {run / "ckpt.pt"} failed' in msg and 'full disk' in msg and 'intact' in msg
    assert (run / 'ckpt.pt').read_bytes() == good and not list(run.glob('*.tmp'))
    train.main(args(data_dir, run, '--train.max_steps=4'))
    assert_same_run(straight, run)


KILLER = '''
import os, signal, sys
sys.path.insert(0, {root!r})
import rundir, train
keep = rundir.keep_previous
def keep_then_die(path):  # the old checkpoint is moved to ckpt.prev.pt, the new one not yet in place
    keep(path)
    os.kill(os.getpid(), signal.SIGKILL)
rundir.keep_previous = keep_then_die
train.main({argv!r})
'''


@pytest.mark.full  # a second Python process: ~10 s of imports
def test_kill_9_during_save(data_dir, straight, tmp_path):
    run = tmp_path / 'run'
    train.main(args(data_dir, run, '--train.max_steps=2'))
    argv = args(data_dir, run, '--train.max_steps=4', '--train.ckpt_interval=1')
    p = subprocess.run([sys.executable, '-c', KILLER.format(root=str(ROOT), argv=argv)], capture_output=True,
                       env={**os.environ, 'TRITON_INTERPRET': '1'})
    assert p.returncode == -signal.SIGKILL
    assert not (run / 'ckpt.pt').exists() and (run / 'ckpt.prev.pt').exists()  # the worst moment
    assert (run / 'ckpt.pt.tmp').exists() and json.loads((run / 'lock').read_text())['pid'] != os.getpid()
    train.main(args(data_dir, run, '--train.max_steps=4'))  # its lock is taken over: its process is gone
    assert_same_run(straight, run)
    assert not list(run.glob('*.tmp')) and not (run / 'lock').exists()


# ----------------------------------------------------------------------------- no code from files
class Payload:
    """Unpickled, it would create the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f'touch {self.marker}',)


def crafted_checkpoint(path: Path, marker: Path):
    torch.save({'model': Payload(marker), 'optimizer': {}, 'step': 10, 'config': {}}, path)
    (path.parent / (path.name + '.sha256')).write_text(f'{rundir.sha256_of(path)}  {path.name}\n')


def test_analyze_refuses_a_crafted_checkpoint(tmp_path):
    marker = tmp_path / 'ran'
    crafted_checkpoint(tmp_path / 'ckpt.pt', marker)
    with pytest.raises(SystemExit, match='refusing to load'):
        analyze.load_checkpoint(tmp_path / 'ckpt.pt')
    assert not marker.exists()


def test_resume_refuses_a_crafted_checkpoint(data_dir, tmp_path):
    marker, run = tmp_path / 'ran', tmp_path / 'run'
    run.mkdir()
    crafted_checkpoint(run / 'ckpt.pt', marker)
    msg = fails(args(data_dir, run, '--train.max_steps=2'))
    assert 'refusing to load' in msg and 'nothing in it was run' in msg and not marker.exists()


@pytest.fixture
def sharded(data_dir, tmp_path):
    """A 2-step run saved as a sharded checkpoint (fsdp in one process)."""
    run = tmp_path / 'run'
    train.main(args(data_dir, run, '--train.max_steps=2', '--train.parallel=fsdp'))
    return run


def test_sharded_metadata_that_runs_code_is_refused(data_dir, sharded, tmp_path):
    marker = tmp_path / 'ran'
    side = json.loads((sharded / 'ckpt.json').read_text())
    meta = sharded / side['dir'] / '.metadata'
    meta.write_bytes(pickle.dumps(Payload(marker)))
    side['sha256']['.metadata'] = rundir.sha256_of(meta)  # a checksum does not stop an attacker
    (sharded / 'ckpt.json').write_text(json.dumps(side))
    for extra in (['--export'], ['--train.max_steps=3', '--train.parallel=fsdp']):
        msg = fails(args(data_dir, sharded, *extra))
        assert 'refusing to read' in msg and 'posix.system' in msg and 'nothing in it was run' in msg
        assert not marker.exists()
    side['dir'] = '../../elsewhere'
    (sharded / 'ckpt.json').write_text(json.dumps(side))
    assert "'dir' '../../elsewhere'" in fails(args(data_dir, sharded, '--export'))


def test_sharded_save_on_a_full_disk(data_dir, sharded, monkeypatch):
    before = snapshot(sharded)

    def full_disk(state, checkpoint_id):  # the shards start to be written, then the disk is full
        Path(checkpoint_id).mkdir()
        (Path(checkpoint_id) / '__0_0.distcp').write_bytes(b'partial')
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(rundir.dcp, 'save', full_disk)
    msg = fails(args(data_dir, sharded, '--train.max_steps=3', '--train.parallel=fsdp'))
    assert f'writing {sharded / "ckpt.json"} failed: No space left on device' in msg and 'intact' in msg
    assert not (sharded / 'ckpt-0000003').exists()
    ckpts = lambda files: {k: v for k, v in files.items() if str(k).startswith('ckpt')}  # noqa: E731
    assert ckpts(snapshot(sharded)) == ckpts(before) and len(ckpts(before)) == 3  # ckpt.json, .metadata, shard


def test_sharded_checkpoint_exports_and_resumes(data_dir, sharded, capsys):
    train.main(args(data_dir, sharded, '--export'))
    assert torch.load(sharded / 'ckpt.pt', weights_only=True)['step'] == 2
    (sharded / 'ckpt.json').write_text('{"step": 2,')
    train.main(args(data_dir, sharded, '--train.max_steps=3', '--train.parallel=fsdp'))
    out = capsys.readouterr().out
    assert 'ckpt.json cannot be parsed' in out and [r['step'] for r in records(sharded)] == [1, 2, 3]


# ----------------------------------------------------------------------------- resuming, stopping
def test_resume_states_what_changed_and_tokens_stay_cumulative(data_dir, tmp_path, capsys):
    run = tmp_path / 'run'
    common = ['--optim.warmup_steps=1']
    train.main(args(data_dir, run, *common, '--train.max_steps=4', '--data.grad_accum=2', '--train.stop_after=2'))
    train.main(args(data_dir, run, *common, '--train.max_steps=8', '--train.stop_after=1'))
    out = capsys.readouterr().out
    assert 'resume: tokens per step 512 -> 256' in out and 'resume: data.grad_accum 2 -> 1' in out
    assert 'resume: train.max_steps 4 -> 8' in out and 'the LR schedule follows the new settings' in out
    assert [r['tokens'] for r in records(run)] == [512, 1024, 1280]
    saved = {'config': train.asdict(train.load_config(CONFIG, [])), 'world_size': 2}
    notes = train.resume_notes(saved, train.load_config(CONFIG, []), 1, 256, 64, 10)
    assert notes[:2] == ['world size 2 -> 1', 'tokens per step 512 -> 256']


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_after_the_step_with_a_checkpoint(data_dir, straight, tmp_path, monkeypatch, capsys, signum):
    run, calls, get_batch = tmp_path / 'run', [], train.get_batch

    def batch_then_signal(*a, **kw):  # the signal comes during step 2's forward
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signum)
        return get_batch(*a, **kw)

    monkeypatch.setattr(train, 'get_batch', batch_then_signal)
    handler = signal.getsignal(signum)
    argv = args(data_dir, run, '--train.max_steps=4', '--train.eval_interval=100')
    fails(argv, code=128 + signum)
    err = capsys.readouterr().err
    assert f'stopped after step 2; checkpoint {run / "ckpt.pt"} is at step 2' in err
    assert 'To resume, run python train.py ' + ' '.join(argv) in err and 'Traceback' not in err
    assert signal.getsignal(signum) is handler  # restored
    monkeypatch.setattr(train, 'get_batch', get_batch)
    train.main(args(data_dir, run, '--train.max_steps=4'))
    assert_same_run(straight, run)


def test_samples_start_without_the_end_of_text_token(tmp_path, capsys):
    cfg = train.load_config(CONFIG, [f'--log.out_dir={tmp_path}'])  # the GPT-2 vocabulary, untrained
    model = train.build_model(*train.resolve(cfg), torch.device('cpu'))
    model.init_weights()
    train.save_checkpoint(tmp_path / 'ckpt.pt', model, train.make_optimizer(model, cfg.optim), 1, cfg)
    train.main([CONFIG, f'--log.out_dir={tmp_path}', '--sample', '--sample.num_samples=1',
                '--sample.max_new_tokens=3', '--sample.temperature=0'])
    text = capsys.readouterr().out.split('--- sample 1\n')[1]
    assert text.strip() and not text.startswith('<|endoftext|>')


# ----------------------------------------------------------------------------- numerics
@pytest.mark.parametrize('magnitude', [1e-34, 1e-36, 1e-37])
def test_e4m3_tensor_scale_of_a_tiny_tensor(magnitude):
    """A tensor amax below 448 * 6 * 2**-128 made 1 / t overflow (every element -> +-6, error 1.5).
    With t >= quant.E4M3_T_MIN it quantizes like any other tensor; the kernels agree bit for bit."""
    x = torch.randn(32, 48, generator=torch.Generator().manual_seed(0)) * magnitude
    spec = quant.QuantSpec('e2m1', 16, 'e4m3')
    ref = quant.quantize(x, spec)
    y = ref.dequantize(torch.float32).double()
    err = (y - x.double()).norm() / x.double().norm()
    assert err < 0.15 and float(ref.tensor_scale) >= quant.E4M3_T_MIN, err
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'  # (the interpreter on a CPU)
    codes, scales, t, dq = kernels.quantize(x.to(dev), levels=spec.levels, block=16, scale_mode='e4m3', sr=False,
                                            rht_signs=None, block_2d=False, dim=-1, out_dtype=torch.float32)
    assert torch.equal(t.cpu(), ref.tensor_scale) and torch.equal(codes.cpu(), ref.codes)
    assert torch.equal(dq.cpu(), ref.dequantize(torch.float32))
