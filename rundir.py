"""
The run directory (train.py's log.out_dir): who writes it, what becomes of an older run in it, its
checkpoints, and what a run records of itself in config.json (run_info: commit, code tree, versions, card).

Files: config.json, log.jsonl, `lock` (the pid and host of the trainer writing here) and the two
newest checkpoints. One file: ckpt.pt with ckpt.pt.sha256 beside it, and the one before as
ckpt.prev.pt (+ .sha256). Sharded (fsdp, ddp): ckpt.json and ckpt.prev.json, each naming its
ckpt-<step>/ directory (written by every rank with torch.distributed.checkpoint) and the sha256 of
every file in it.

Integrity. A save writes NAME.tmp, hashes it, moves the last checkpoint to its .prev name and then
renames: stopped at any point (kill -9, a full disk), the directory still holds an intact checkpoint,
and a failed save removes its .tmp. A checkpoint whose bytes do not match its sha256 is skipped, by
name, and the newest intact one is used.

No code from files. Checkpoints are read with torch.load(weights_only=True); the sharded format's
.metadata pickle is read by an unpickler that builds only the classes such metadata is made of, so a
crafted file is refused before anything in it runs. ckpt.json may only name a ckpt-<step> directory
inside the run directory.

A run never destroys another: starting afresh where a run is, its files move to old-<time>/ first
(train.py does that only once the new run has checked its inputs).
"""
import hashlib
import json
import os
import pickle
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict
from importlib import metadata
from pathlib import Path, PosixPath, PurePosixPath

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.serialization
from torch.distributed.checkpoint import filesystem, metadata as dcp_meta
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

RUN_FILES = ('config.json', 'log.jsonl', 'ckpt.pt', 'ckpt.pt.sha256', 'ckpt.prev.pt', 'ckpt.prev.pt.sha256',
             'ckpt.json', 'ckpt.prev.json')
SHARDED_DIR = re.compile(r'ckpt-\d{7}')


# ----------------------------------------------------------------------------- the directory
def run_files(run_dir: Path) -> list[Path]:
    """The files and checkpoint directories of a run in run_dir (not the moved-aside old-* ones)."""
    if not run_dir.is_dir():
        return []
    return sorted(p for p in run_dir.iterdir() if p.name in RUN_FILES or SHARDED_DIR.fullmatch(p.name))


def move_aside(run_dir: Path) -> Path | None:
    """Move the run in run_dir into run_dir/old-<UTC time>/; returns that directory (None: no run)."""
    files = run_files(run_dir)
    if not files:
        return None
    old = run_dir / time.strftime('old-%Y%m%d-%H%M%S', time.gmtime())
    old = old if not old.exists() else old.with_name(f'{old.name}-{os.getpid()}')
    old.mkdir()
    for f in files:
        os.replace(f, old / f.name)
    return old


def check_writable(run_dir: Path):
    """A clear error now, not a traceback at the first write, where run_dir cannot be a run directory."""
    parent = next((p for p in [run_dir, *run_dir.parents] if p.exists()), Path('.'))
    if not parent.is_dir():
        raise SystemExit(f'run directory: {parent} is a file, not a directory; pick another --log.out_dir')
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SystemExit(f'run directory: {parent} is not writable by this user; pick another --log.out_dir')


def take_lock(run_dir: Path) -> Path:
    """Create run_dir/lock (pid, host) for this process, or stop: another trainer writes here. A lock
    left by a process that no longer runs on this host is taken over."""
    lock, me = run_dir / 'lock', {'pid': os.getpid(), 'host': socket.gethostname()}
    run_dir.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            with open(lock, 'x') as f:  # exclusive: of two processes, one creates it
                f.write(json.dumps(me) + '\n')
            return lock
        except FileExistsError:
            holder = read_json(lock, 'lock file', missing_ok=True) or {}
            if holder.get('host') == me['host'] and not pid_alive(holder.get('pid')):
                print(f'{lock}: taking over the lock of process {holder.get("pid")}, which no longer runs')
                lock.unlink(missing_ok=True)
                continue
            raise SystemExit(f'run directory {run_dir} is in use by process {holder.get("pid")} on '
                             f'{holder.get("host")} ({lock}). Wait for it or stop it, or pick another '
                             f'--log.out_dir; if no trainer runs there any more, delete {lock}')
    raise SystemExit(f'{lock}: could not take the lock; delete it if no trainer runs there')


def release_lock(run_dir: Path):
    """Remove run_dir/lock if this process holds it."""
    lock = run_dir / 'lock'
    if lock.is_file() and read_json(lock, 'lock file', missing_ok=True) == {'pid': os.getpid(),
                                                                             'host': socket.gethostname()}:
        lock.unlink()


def open_run(run_dir: Path, start: int, info: dict, log=print):
    """Rank 0, once a run has checked its inputs: take the lock; starting afresh (start 0), move an
    older run aside; resuming, keep the log up to the checkpoint's step; write config.json (info)."""
    take_lock(run_dir)
    for half_written in run_dir.glob('*.tmp'):  # by a process that was killed while saving
        half_written.unlink()
    jsonl = run_dir / 'log.jsonl'
    if not start and (old := move_aside(run_dir)):
        log(f'{run_dir} held a run: its files are now in {old}')
    kept = [line for line in jsonl.read_text().splitlines()
            if json.loads(line)['step'] <= start] if start and jsonl.is_file() else []
    write_atomic(jsonl, ''.join(line + '\n' for line in kept))  # drop steps after the checkpoint
    write_atomic(run_dir / 'config.json', json.dumps(info, indent=2, default=str) + '\n')


def where(run_dir: Path, ckpt: Path | None, config: str) -> str:
    """The end of a run: where its files are and how to sample from it."""
    if ckpt is None:
        return f'log: {run_dir / "log.jsonl"} (no checkpoint: train.ckpt_interval=-1)'
    first = (f'python train.py {config} --export --log.out_dir={run_dir}, then ' if ckpt.suffix == '.json' else '')
    return (f'checkpoint: {ckpt}; log: {run_dir / "log.jsonl"}; config: {run_dir / "config.json"}\n'
            f'sample from it: {first}python train.py {config} --sample --log.out_dir={run_dir}')


# ----------------------------------------------------------------------------- stopping on a signal
class Stopped(Exception):
    """SIGINT or SIGTERM ended the run after a step (and its checkpoint)."""

    def __init__(self, got: list, step: int, ckpt: Path | None):
        self.signum, self.step, self.ckpt = (got[0] if got else signal.SIGTERM), step, ckpt
        self.code = 128 + self.signum  # 130 for SIGINT, 143 for SIGTERM, as a shell reports them
        super().__init__(f'stopped at step {step}')

    def message(self, argv: list) -> str:
        saved = f'checkpoint {self.ckpt} is at step {self.step}' if self.ckpt else 'no checkpoint (ckpt_interval=-1)'
        argv = [a for a in argv if not a.startswith('--train.resume=')]  # 'false' would start afresh
        launcher = 'the same torchrun command without --train.resume' if 'TORCHELASTIC_RUN_ID' in os.environ \
            else 'python train.py ' + ' '.join(argv)
        return (f'{signal.Signals(self.signum).name}: stopped after step {self.step}; {saved}. '
                f'To resume, run {launcher}')


@contextmanager
def stop_signals():
    """SIGINT and SIGTERM, while inside: the first is noted (the list it yields is not empty then) and
    training stops after its step; the same signal again stops at once (the last checkpoint stays
    whole). The other one is only noted: torchrun sends its workers SIGTERM after a Ctrl-C."""
    got = []

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if signum in got:
            print(f'{name} again: stopped in the middle of a step; the last checkpoint is intact, run the same '
                  'command to resume from it', file=sys.stderr)
            raise SystemExit(128 + signum)
        print(f'{name}: stopping after this step, with a checkpoint (again to stop at once)', file=sys.stderr)
        got.append(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def stop_requested(got: list, device) -> bool:
    """Whether any rank got a signal: every rank must stop after the same step."""
    flag = torch.tensor(float(bool(got)), device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() > 0


def pid_alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def read_json(path: Path, what: str, missing_ok=False):
    """A JSON file's value; an error that names the file if it cannot be parsed."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        if missing_ok:
            return None
        raise
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SystemExit(f'{what} {path} cannot be parsed ({e}); restore it or remove it') from e


def write_atomic(path: Path, text: str):
    tmp = path.with_name(path.name + '.tmp')
    tmp.write_text(text)
    os.replace(tmp, path)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- saving
def save_checkpoint(path: Path, model, opt, step: int, cfg, **info):
    """ckpt.pt: one file, by one process. ckpt.json (fsdp, ddp): every rank writes its shards to
    ckpt-<step>/ (torch.distributed.checkpoint), then rank 0 commits ckpt.json, which names them and
    their sha256. info (tokens, world_size) is stored beside the step. The optimizer state is keyed
    by parameter name (get_state_dict)."""
    bad = sum((~torch.isfinite(p.to_local() if isinstance(p, DTensor) else p)).sum() for p in model.parameters())
    if path.suffix == '.json':
        dist.all_reduce(bad)
    if bad.item():
        raise RuntimeError(f'step {step}: refusing to write a checkpoint with non-finite weights')
    if path.suffix == '.pt':
        model_sd, optim_sd = get_state_dict(model, opt)
        tmp = path.with_name(path.name + '.tmp')
        with failed_save(path, tmp):
            torch.save({'model': model_sd, 'optimizer': optim_sd, 'step': step, 'config': asdict(cfg), **info}, tmp)
            digest = sha256_of(tmp)
            keep_previous(path)
            write_atomic(path.with_name(path.name + '.sha256'), f'{digest}  {path.name}\n')
            os.replace(tmp, path)
        return
    save_sharded(path, model, opt, step, cfg, info)


def keep_previous(path: Path):
    """ckpt.pt -> ckpt.prev.pt (and its .sha256), ckpt.json -> ckpt.prev.json."""
    prev = prev_name(path)
    if path.exists():
        os.replace(path, prev)
    sums = path.with_name(path.name + '.sha256')
    if sums.exists():
        os.replace(sums, prev.with_name(prev.name + '.sha256'))


def prev_name(path: Path) -> Path:
    return path.with_name(f'{path.stem}.prev{path.suffix}')


@contextmanager
def failed_save(path: Path, *partial: Path):
    """Turn a save's OSError (no space, read-only) or torch's writer error into a message in words,
    removing what was half written: the last checkpoint is untouched."""
    try:
        yield
    except (OSError, RuntimeError, dcp.api.CheckpointException) as err:
        for p in partial:
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        free = shutil.disk_usage(path.parent).free
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err).splitlines()[0]
        raise SystemExit(f'checkpoint: writing {path} failed: {why} ({free / 1e9:.2f} GB free on that disk; a '
                         'full disk or a read-only directory?). The half-written file was removed and the last '
                         'checkpoint is intact; free space or pick another --log.out_dir, then run the same '
                         'command again to resume') from err


def save_sharded(path: Path, model, opt, step: int, cfg, info: dict):
    run_dir, name, rank, world = path.parent, f'ckpt-{step:07d}', dist.get_rank(), dist.get_world_size()
    if rank == 0:
        shutil.rmtree(run_dir / name, ignore_errors=True)  # a half-written one from a stopped run
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, opt)
    with failed_save(path, run_dir / name):
        dcp.save({'model': model_sd, 'optimizer': optim_sd}, checkpoint_id=run_dir / name)
        dist.barrier()  # every rank's shards and the metadata are written; each rank hashes some files
        files = sorted(p.name for p in (run_dir / name).iterdir())
        mine = {f: sha256_of(run_dir / name / f) for f in files[rank::world]}
        sums = [None] * world
        dist.all_gather_object(sums, mine)
        if rank == 0:
            side = {'step': step, 'dir': name, 'world_size': world, **info, 'config': asdict(cfg),
                    'sha256': {k: v for s in sums for k, v in sorted(s.items())}}
            tmp = path.with_name(path.name + '.tmp')
            tmp.write_text(json.dumps(side, indent=1) + '\n')
            keep_previous(path)
            os.replace(tmp, path)
            named = {name, *previous_dir(prev_name(path))}
            for old in run_dir.glob('ckpt-*'):
                if old.is_dir() and old.name not in named:
                    shutil.rmtree(old)
    dist.barrier()


def previous_dir(prev: Path) -> list:
    """The ckpt-<step> directory that ckpt.prev.json names ([] if none, or if it cannot be read: that
    checkpoint was skipped when this run started, and its directory goes)."""
    try:
        return [json.loads(prev.read_text())['dir']]
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        return []


# ----------------------------------------------------------------------------- finding and checking
def find_checkpoint(run_dir: Path, file_first=False, log=print):
    """The newest intact checkpoint of run_dir as (step, saved dict, path), or None if it has none:
    saved holds the config and the stored info (tokens, world_size). Corrupt ones are named and
    skipped; if every checkpoint is corrupt, that is an error. On a tie (after --export) the sharded
    one wins unless file_first: every rank would read all of ckpt.pt."""
    found, bad = [], []
    for name in ('ckpt.json', 'ckpt.prev.json', 'ckpt.pt', 'ckpt.prev.pt'):
        path = run_dir / name
        if path.is_file():
            try:
                found.append(read_sharded(path) if path.suffix == '.json' else read_file(path))
            except CorruptCheckpoint as e:
                bad.append(str(e))
    for b in bad:
        log(f'checkpoint skipped: {b}')
    if bad and not found:
        raise SystemExit(f'no intact checkpoint in {run_dir}: ' + '; '.join(bad) + '. Restore a copy, or start '
                         f'afresh with --train.resume=false (the old files move to {run_dir}/old-<time>/)')
    return max(found, key=lambda f: (f[0], (f[2].suffix == '.pt') == file_first)) if found else None


def find_checkpoint_once(run_dir: Path, log=print):
    """find_checkpoint on rank 0 (it reads every byte of the checkpoints), its answer sent to every rank."""
    box = [find_checkpoint(run_dir, log=log) if dist.get_rank() == 0 else None]
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    return box[0]


class CorruptCheckpoint(Exception):
    pass


def read_file(path: Path):
    """(step, saved, path) of a ckpt.pt after checking its sha256 (files from before checksums: none)."""
    sums = path.with_name(path.name + '.sha256')
    if sums.is_file():
        want = sums.read_text().split(' ')[0].strip()
        if sha256_of(path) != want:
            raise CorruptCheckpoint(f'{path} does not match its sha256 ({sums}): the file is corrupt')
    elif path.name != 'ckpt.pt':
        raise CorruptCheckpoint(f'{path} has no {sums.name}')
    try:  # mmap: only the step and the config are read here
        ckpt = torch.load(path, map_location='cpu', mmap=True, weights_only=True)
    except pickle.UnpicklingError as e:
        raise SystemExit(f'refusing to load {path}: it holds objects other than tensors and plain values, '
                         f'which train.py never writes; nothing in it was run. Delete it') from e
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CorruptCheckpoint(f'{path} cannot be read ({str(e).splitlines()[0]})') from e
    if not isinstance(ckpt, dict) or not {'model', 'optimizer', 'step', 'config'} <= set(ckpt):
        raise CorruptCheckpoint(f'{path} is not a checkpoint written by train.py')
    return ckpt['step'], {k: v for k, v in ckpt.items() if k not in ('model', 'optimizer')}, path


def read_sharded(path: Path):
    """(step, saved, directory) of a ckpt.json after checking where it points and the files' sha256."""
    try:
        side = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptCheckpoint(f'{path} cannot be parsed ({e})') from e
    if not (isinstance(side, dict) and isinstance(side.get('step'), int) and isinstance(side.get('config'), dict)):
        raise CorruptCheckpoint(f'{path} lacks the step or the config that train.py writes')
    name = side.get('dir')
    if not isinstance(name, str) or not SHARDED_DIR.fullmatch(name):
        raise SystemExit(f"refusing {path}: its 'dir' {name!r} is not a ckpt-<7 digits> directory inside "
                         f'{path.parent}; a ckpt.json written by train.py names one. Delete it')
    folder = path.parent / name
    if not folder.is_dir():
        raise CorruptCheckpoint(f'{folder}, named by {path}, is missing')
    sums = side.get('sha256', {})
    for f in sorted(folder.iterdir()):
        if sums and sums.get(f.name) != sha256_of(f):
            raise CorruptCheckpoint(f'{f} does not match its sha256 in {path}: the checkpoint is corrupt')
    if missing := [f for f in sums if not (folder / f).is_file()]:
        raise CorruptCheckpoint(f'{folder / missing[0]}, listed in {path}, is missing')
    return side['step'], {k: v for k, v in side.items() if k != 'sha256'}, folder


# ----------------------------------------------------------------------------- loading
def load_checkpoint(path: Path, model, opt):
    """Load either kind of checkpoint into a model and optimizer sharded any way: get_state_dict
    gives this rank's part (its shards under FSDP), and the loader fills it from the saved file or
    from whichever saved shards overlap it, so the world size may differ from the saving run's."""
    if path.suffix == '.pt':
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
        set_state_dict(model, opt, model_state_dict=ckpt['model'], optim_state_dict=ckpt['optimizer'],
                       options=StateDictOptions(full_state_dict=True))
        return
    reader = SafeReader(path)
    reader.read_metadata()  # refuses a crafted .metadata here, before dcp.load (which wraps errors)
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.load({'model': model_sd, 'optimizer': optim_sd}, storage_reader=reader)
    set_state_dict(model, opt, model_state_dict=model_sd, optim_state_dict=optim_sd)


def metadata_classes() -> dict:
    """(module, name) -> object for everything a DCP .metadata pickle may name: the metadata
    dataclasses, torch.Size, dtypes, layouts and paths."""
    m = dcp_meta
    objs = [m.Metadata, m.TensorStorageMetadata, m.TensorProperties, m.ChunkStorageMetadata,
            m.BytesStorageMetadata, m.MetadataIndex, m.StorageMeta, m._MEM_FORMAT_ENCODING,
            filesystem._StorageInfo, torch.Size, torch.serialization._get_layout, PosixPath, PurePosixPath]
    allowed = {(o.__module__, o.__qualname__): o for o in objs}
    allowed |= {('torch', n): getattr(torch, n) for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)}
    return allowed


class MetadataUnpickler(pickle.Unpickler):
    def __init__(self, f, path):
        super().__init__(f)
        self.path, self.allowed = path, metadata_classes()

    def find_class(self, module, name):
        if (module, name) not in self.allowed:
            raise SystemExit(f'refusing to read {self.path}: it names {module}.{name}, which checkpoint metadata '
                             'never holds (a crafted file?); nothing in it was run. Delete this checkpoint, or '
                             'take it from a source you trust')
        return self.allowed[(module, name)]


class SafeReader(filesystem.FileSystemReader):
    """torch.distributed.checkpoint's reader, with the metadata read by MetadataUnpickler."""

    def read_metadata(self, *args, **kwargs):
        path = Path(self._get_metadata_path(kwargs.get('rank')))
        try:
            with open(path, 'rb') as f:
                metadata = MetadataUnpickler(f, path).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
            raise SystemExit(f'{path} cannot be read as checkpoint metadata ({e}); the checkpoint is corrupt') from e
        if not isinstance(metadata, dcp_meta.Metadata):
            raise SystemExit(f'{path} holds a {type(metadata).__name__}, not checkpoint metadata')
        if getattr(metadata, 'storage_meta', None) is None:
            metadata.storage_meta = dcp_meta.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


# ----------------------------------------------------------------------------- what a run records of itself
CODE_FILES = ('*.py', '*.toml')  # what a run's numerics come from: the code and the configs


def _git(repo: Path, *args, env=None):
    """git's output in repo, or None (no git, not a repository, a failed command)."""
    try:
        return subprocess.run(['git', *args], cwd=repo, env=env, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (FileNotFoundError, subprocess.CalledProcessError):
        return None


def git_commit(repo: Path) -> str:
    """The commit checked out in repo, with '-dirty' if tracked files differ from it ('unknown' without git)."""
    commit = _git(repo, 'rev-parse', 'HEAD')
    if commit is None:
        return 'unknown'
    return commit + ('-dirty' if _git(repo, 'status', '--porcelain', '--untracked-files=no') else '')


def code_tree(repo: Path, commit: str | None = None) -> str:
    """The git tree id of repo's *.py and *.toml files as they are on disk, or at `commit`: equal ids, the
    same code. A run records it beside its commit, which a copy of the tree with a stale .git gets wrong;
    the commit a run's code came from: the one whose `code_tree(repo, commit)` equals it."""
    with tempfile.TemporaryDirectory() as tmp:  # a scratch index: the repository's own is not touched
        env = dict(os.environ, GIT_INDEX_FILE=str(Path(tmp) / 'index'))
        if commit is None:
            staged = _git(repo, 'add', '-A', '--', *CODE_FILES, env=env) is not None
        else:  # the commit's tree, less every file but the code's
            staged = (_git(repo, 'read-tree', commit, env=env) is not None
                      and _git(repo, 'rm', '-r', '-q', '--cached', '--ignore-unmatch', '--', '.',
                               *(f':!{p}' for p in CODE_FILES), env=env) is not None)
        tree = _git(repo, 'write-tree', env=env) if staged else None
    return tree or 'unknown'


def run_info() -> dict:
    """The git commit of this repository (and its code's tree id), the versions of the packages doing the
    work, the card (the current device's name)."""
    repo = Path(__file__).resolve().parent
    versions = {'python': platform.python_version(), 'torch': torch.__version__, 'numpy': np.__version__}
    try:
        versions['triton'] = metadata.version('triton')
    except metadata.PackageNotFoundError:
        versions['triton'] = 'not installed'
    card = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or 'cpu'
    return {'git_commit': git_commit(repo), 'code_tree': code_tree(repo), 'versions': versions, 'card': card}
