"""
The GPT-2 byte-level BPE (OpenAI's r50k ranks) through tiktoken, built without any network access.

`tiktoken.get_encoding("gpt2")` downloads vocab.bpe/encoder.json on first use and caches them in a
writable directory. We ship the same ranks as data/gpt2.tiktoken instead (each line is
`base64(token bytes) rank`; 50,256 lines; MIT, OpenAI; see data/README.md) and parse it here, so
the tokenizer works on an offline machine with a read-only checkout. The file's sha256 is checked
once per process; a wrong or damaged file is an error, never a silently different vocabulary.

Token ids: 0..50255 are the BPE ranks, 50256 is <|endoftext|> (the document separator), 50257 ids
in all, so every id fits in a uint16.
"""
import base64
import functools
import hashlib
from pathlib import Path

import tiktoken

GPT2_FILE = Path(__file__).resolve().with_name("gpt2.tiktoken")
GPT2_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
EOT_TOKEN = 50256
N_VOCAB = 50257
# GPT-2's pre-tokenizer regex (tiktoken_ext.openai_public.r50k_pat_str): contractions, letter runs,
# digit runs, punctuation runs, each with an optional leading space, then whitespace.
R50K_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""

_FIX = ("restore it with `git checkout data/gpt2.tiktoken`, or take whisper/assets/gpt2.tiktoken "
        "from `pip download --no-deps --no-binary :all: openai-whisper==20250625`")


def load_ranks(path=GPT2_FILE) -> dict[bytes, int]:
    """Parse a .tiktoken ranks file after checking its sha256 against GPT2_SHA256."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GPT-2 ranks file {path} is missing: {_FIX}")
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != GPT2_SHA256:
        raise ValueError(f"GPT-2 ranks file {path} has sha256 {digest}, expected {GPT2_SHA256} "
                         f"(damaged or not the GPT-2 ranks): {_FIX}")
    ranks = {}
    for line in raw.splitlines():
        token_b64, rank = line.split()
        ranks[base64.b64decode(token_b64)] = int(rank)
    assert sorted(ranks.values()) == list(range(EOT_TOKEN)), "ranks must be exactly 0..50255"
    return ranks


@functools.lru_cache(maxsize=4)
def get_tokenizer(path=GPT2_FILE) -> tiktoken.Encoding:
    """The GPT-2 tiktoken.Encoding, built from the local ranks file (cached per path)."""
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=R50K_PAT_STR,
        mergeable_ranks=load_ranks(path),
        special_tokens={"<|endoftext|>": EOT_TOKEN},
        explicit_n_vocab=N_VOCAB,
    )
