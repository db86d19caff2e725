"""The fixed text the tokenizer is trained on: GSM8K train questions plus a few stdlib modules.

Everything is read in a fixed, sorted order so the same inputs always give the same corpus; its
SHA-256 goes into radiance_tiny.json because the stdlib part follows the local Python install.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path

GSM8K_ENV = "RADIANCE_TINY_GSM8K_DIR"

# Plain, stable, code-heavy modules present in every CPython 3.10+ build.
STDLIB_FILES = (
    "bisect.py",
    "colorsys.py",
    "fnmatch.py",
    "heapq.py",
    "json/decoder.py",
    "json/encoder.py",
    "keyword.py",
    "shlex.py",
    "string.py",
    "textwrap.py",
)

# Used when no GSM8K data is reachable (an installed wheel, a container): the generator must
# never fail for lack of data, it only yields a different (still deterministic) tokenizer.
BUILTIN_CORPUS = """\
Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.
How many clips did Natalia sell altogether in April and May?
Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.
How much did she earn? Betty is saving money for a new wallet which costs $100.
def add(a, b):
    return a + b

class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y

{"name": "tiny", "values": [1, 2, 3], "nested": {"ok": true, "ratio": 0.5}}
for i in range(10):
    print(i, i * i)
"""


@dataclass(frozen=True)
class Corpus:
    texts: tuple[str, ...]
    sources: tuple[str, ...]
    sha256: str


def default_gsm8k_dir() -> Path:
    """``$RADIANCE_TINY_GSM8K_DIR``, else ``../shared/data/gsm8k`` beside the repository root."""
    from radiance import envs

    env = envs.get(GSM8K_ENV)
    if env:
        return Path(env)
    repo_root = Path(__file__).resolve().parents[2]
    return repo_root.parent / "shared" / "data" / "gsm8k"


def gsm8k_questions(data_dir: Path) -> list[str]:
    path = data_dir / "train.jsonl"
    if not path.is_file():
        return []
    questions = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line:
                questions.append(json.loads(line)["question"])
    return questions


def stdlib_sources() -> list[tuple[str, str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for rel in sorted(STDLIB_FILES):
        path = root / rel
        if path.is_file():
            out.append((f"stdlib:{rel}", path.read_text(encoding="utf-8")))
    return out


def build(gsm8k_dir: Path | None = None) -> Corpus:
    data_dir = default_gsm8k_dir() if gsm8k_dir is None else Path(gsm8k_dir)
    texts: list[str] = []
    sources: list[str] = []
    questions = gsm8k_questions(data_dir)
    if questions:
        texts += questions
        sources.append(f"gsm8k:{data_dir.name}/train.jsonl ({len(questions)} questions)")
    for name, text in stdlib_sources():
        texts.append(text)
        sources.append(name)
    if not questions:
        texts.append(BUILTIN_CORPUS)
        sources.append("builtin")
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    return Corpus(tuple(texts), tuple(sources), digest.hexdigest())
