"""The training data as train.py reads it: the uint16 token shards that data/prepare.py lists in
meta.json, checked when opened (every shard present, every token id below the model's vocabulary),
and random windows of them drawn from a key, so that the same key always gives the same batch."""
import json
import os
from pathlib import Path

import numpy as np
import torch


def load_data(data_dir: str, seq_len: int, vocab_size: int) -> dict:
    """{'train': [shards], 'val': [shards]}: uint16 token memmaps listed in data_dir/meta.json."""
    meta_path = Path(data_dir) / 'meta.json'
    if not meta_path.is_file():
        raise SystemExit(f'data: no {meta_path}; make it with `python data/prepare.py shakespeare` '
                         f'(or `python data/prepare.py SOURCE --out {data_dir}`), or set --data.dir')
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SystemExit(f'data: {meta_path} cannot be parsed ({e}); make it again with data/prepare.py') from e
    if meta['dtype'] != 'uint16' or meta['vocab_size'] > vocab_size:
        raise SystemExit(f"data: {meta_path} has dtype {meta['dtype']} and vocab_size {meta['vocab_size']}; "
                         f'this trainer reads uint16 tokens below the model vocab_size {vocab_size}')
    splits = {}
    for split in ('train', 'val'):
        paths = [Path(data_dir) / name for name in meta[split]['shards']]
        if missing := [p for p in paths if not p.is_file()]:
            raise SystemExit(f'data: shard {missing[0]} in {meta_path} is missing; run data/prepare.py again')
        shards = [np.memmap(p, dtype=np.uint16, mode='r') for p in paths]
        check_token_ids(meta_path, meta, paths, shards, vocab_size)
        splits[split] = [s for s in shards if len(s) > seq_len]  # shorter ones hold no whole window
        if not splits[split]:
            raise SystemExit(f'data: no {split} shard of {data_dir} has more than seq_len={seq_len} '
                             'tokens; use a smaller --model.seq_len or more data')
    return splits


def check_token_ids(meta_path: Path, meta: dict, paths: list, shards: list, vocab_size: int):
    """Every token id below the model's vocab_size: the max of each shard, cached in meta.json
    (max_token: {shard: [size, max]}; a shard of another size is read again)."""
    cache, changed = meta.setdefault('max_token', {}), False
    for path, shard in zip(paths, shards):
        if cache.get(path.name, [None])[0] != len(shard):
            cache[path.name], changed = [len(shard), int(shard.max()) if len(shard) else 0], True
    if changed and os.access(meta_path.parent, os.W_OK):  # a read-only corpus is checked again next time
        tmp = meta_path.with_name(meta_path.name + '.tmp')
        tmp.write_text(json.dumps(meta, indent=1) + '\n')
        os.replace(tmp, meta_path)
    if bad := [(p, cache[p.name][1]) for p in paths if cache[p.name][1] >= vocab_size]:
        raise SystemExit(f'data: {bad[0][0]} holds token id {bad[0][1]}, beyond the model vocab_size {vocab_size}; '
                         "prepare it with the model's tokenizer, or raise --model.vocab_size")


def get_batch(shards: list, key: list[int], batch_size: int, seq_len: int, device):
    """x, y: [B, T] int64 from B random windows; the same key always gives the same windows."""
    rng = np.random.default_rng(key)
    starts = np.array([len(s) - seq_len for s in shards])  # windows of T+1 tokens in each shard
    ends = np.cumsum(starts)
    picks = rng.integers(0, ends[-1], size=batch_size)
    shard = np.searchsorted(ends, picks, side='right')
    offset = picks - (ends - starts)[shard]
    xy_BT1 = torch.from_numpy(np.stack([shards[i][o:o + seq_len + 1] for i, o in zip(shard, offset)])
                              .astype(np.int64))
    if device.type == 'cuda':
        xy_BT1 = xy_BT1.pin_memory().to(device, non_blocking=True)
    return xy_BT1[:, :-1].contiguous(), xy_BT1[:, 1:].contiguous()
