"""Build the training token streams (code, JSON, prose) with the tiny model's tokenizer.

Runs here (CPU, needs ``tokenizers``); the result travels to the GPU machine, where only torch exists.
Deterministic: files are read in sorted order and the JSON comes from a seeded ``random.Random``.

    python -m tools.train_tiny.data --out .cache/train_tiny
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sysconfig
from pathlib import Path

from tools.tinymodel import corpus as corpus_mod
from tools.tinymodel import tokenizer as tok_mod

EXCLUDED_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__", "lib2to3", "turtledemo"}
MAX_CODE_TOKENS = 5_000_000
JSON_TOKENS = 2_000_000
HELDOUT_DOCS = 8  # per domain, the last documents: evaluation only

_NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory",
          "niaj", "olivia", "peggy", "rupert", "sybil", "trent", "victor", "walter", "yvonne"]
_WORDS = ["alpha", "beta", "gamma", "delta", "cache", "queue", "worker", "report", "invoice", "order",
          "user", "admin", "guest", "draft", "final", "pending", "active", "closed", "north", "south"]
_LEVELS = ["DEBUG", "INFO", "INFO", "INFO", "WARNING", "ERROR"]


def stdlib_code() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(
        p for p in root.rglob("*.py")
        if not (set(p.relative_to(root).parts[:-1]) & EXCLUDED_DIRS)
    )
    return [p.read_text(encoding="utf-8", errors="replace") for p in paths]


def _record(rng: random.Random, i: int) -> dict:
    name = rng.choice(_NAMES)
    return {
        "id": i,
        "name": name,
        "email": f"{name}.{i}@example.{rng.choice(['com', 'org', 'net'])}",
        "active": rng.random() < 0.7,
        "score": round(rng.uniform(0, 100), 2),
        "tags": rng.sample(_WORDS, rng.randint(0, 4)),
    }


def json_document(rng: random.Random) -> str:
    kind = rng.randrange(4)
    indent = rng.choice([None, 2, 4])
    if kind == 0:
        start = rng.randint(1, 5000)
        obj = {"users": [_record(rng, start + j) for j in range(rng.randint(2, 12))]}
    elif kind == 1:
        obj = {
            "service": rng.choice(_WORDS),
            "version": f"{rng.randint(0, 3)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}",
            "replicas": rng.randint(1, 8),
            "limits": {"cpu": rng.choice(["250m", "500m", "1", "2"]), "memory": rng.choice(["256Mi", "1Gi", "4Gi"])},
            "env": {w.upper(): rng.choice(_WORDS) for w in rng.sample(_WORDS, rng.randint(1, 6))},
            "ports": [{"name": rng.choice(_WORDS), "port": rng.randint(1000, 9999)} for _ in range(rng.randint(1, 4))],
        }
    elif kind == 2:
        lines = []
        for j in range(rng.randint(3, 15)):
            lines.append(json.dumps({
                "ts": f"2024-0{rng.randint(1, 9)}-{rng.randint(10, 28)}T{rng.randint(10, 23)}:{rng.randint(10, 59)}:00Z",
                "level": rng.choice(_LEVELS),
                "logger": f"{rng.choice(_WORDS)}.{rng.choice(_WORDS)}",
                "msg": f"{rng.choice(_WORDS)} {rng.choice(_WORDS)} {j}",
                "request_id": rng.randint(10000, 99999),
            }))
        return "\n".join(lines)
    else:
        obj = {
            "matrix": [[rng.randint(0, 9) for _ in range(rng.randint(2, 6))] for _ in range(rng.randint(2, 6))],
            "series": {w: [round(rng.random(), 3) for _ in range(rng.randint(2, 8))] for w in rng.sample(_WORDS, 3)},
        }
    return json.dumps(obj, indent=indent)


def encode_docs(tok, docs, eot: int, limit: int | None = None) -> list[int]:
    ids: list[int] = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(eot)
        if limit is not None and len(ids) >= limit:
            break
    return ids[:limit] if limit is not None else ids


def build(out_dir: Path, seed: int = 0, gsm8k_dir: Path | None = None) -> dict:
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = tok_mod.train(corpus_mod.build(gsm8k_dir))
    tok_mod.save(tok, out_dir)  # the trained model ships exactly this tokenizer
    eot = tok.token_to_id(tok_mod.PAD)

    rng = random.Random(seed)
    code_docs = stdlib_code()
    prose_docs = corpus_mod.gsm8k_questions(gsm8k_dir or corpus_mod.default_gsm8k_dir())
    json_docs: list[str] = []
    while sum(len(d) for d in json_docs) < JSON_TOKENS * 3:  # ~3 chars per token
        json_docs.append(json_document(rng))

    streams, held, info = {}, {}, {}
    for name, docs in (("code", code_docs), ("json", json_docs), ("prose", prose_docs)):
        train_docs, eval_docs = docs[:-HELDOUT_DOCS], docs[-HELDOUT_DOCS:]
        ids = encode_docs(tok, train_docs, eot, MAX_CODE_TOKENS if name == "code" else None)
        streams[name] = torch.tensor(ids, dtype=torch.int16)
        held[name] = torch.tensor(encode_docs(tok, eval_docs, eot), dtype=torch.int16)
        info[name] = {"docs": len(train_docs), "tokens": len(ids), "heldout_tokens": int(held[name].numel())}
    digest = hashlib.sha256()
    for name in sorted(streams):
        digest.update(streams[name].numpy().tobytes())
    info["sha256"] = digest.hexdigest()
    torch.save({"train": streams, "heldout": held, "info": info}, out_dir / "tokens.pt")
    (out_dir / "data_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gsm8k-dir", type=Path, default=None)
    args = ap.parse_args()
    print(json.dumps(build(args.out, args.seed, args.gsm8k_dir), indent=2))


if __name__ == "__main__":
    main()
