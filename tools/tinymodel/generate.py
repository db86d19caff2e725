"""Write a complete HF-format checkpoint directory for the tiny Qwen3-Next."""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

from tools.tinymodel import config
from tools.tinymodel import corpus as corpus_mod

# Bump when the written bytes change for the same seed, so cached copies are regenerated.
FORMAT_VERSION = 1
METADATA_FILE = "radiance_tiny.json"


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_tokenizer(out_dir: Path, gsm8k_dir: Path | None = None) -> tuple[dict[str, int], dict]:
    """Train and save the tokenizer; return its special ids and the corpus provenance."""
    from tools.tinymodel import tokenizer

    corpus = corpus_mod.build(gsm8k_dir)
    tok = tokenizer.train(corpus)
    ids = tokenizer.save(tok, out_dir)
    provenance = {
        "corpus_sha256": corpus.sha256,
        "corpus_sources": list(corpus.sources),
        "tokenizer_vocab": tok.get_vocab_size(),
    }
    return ids, provenance


def write_configs(out_dir: Path, ids: dict[str, int], mlp_only_layers=(), quantization: dict | None = None,
                  arch: config.Arch = config.QWEN3_NEXT) -> None:
    hf = config.hf_config(bos_id=None, eos_id=ids["im_end"], pad_id=ids["pad"], mlp_only_layers=mlp_only_layers,
                          arch=arch)
    if quantization is not None:
        hf["quantization_config"] = quantization
    _write_json(out_dir / "config.json", hf)
    _write_json(
        out_dir / "generation_config.json",
        {
            "bos_token_id": None,
            "eos_token_id": [ids["im_end"], ids["pad"]],
            "pad_token_id": ids["pad"],
        },
    )


def write_metadata(out_dir: Path, extra: dict) -> None:
    import safetensors
    import tokenizers

    files = sorted(p.name for p in out_dir.iterdir() if p.is_file() and p.name != METADATA_FILE)
    meta = {
        "format_version": FORMAT_VERSION,
        "generator": "tools.tinymodel",
        "python": platform.python_version(),
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
        "files_sha256": {name: _sha256(out_dir / name) for name in files},
        **extra,
    }
    _write_json(out_dir / METADATA_FILE, meta)


def write_model(out_dir: Path, seed: int = 0, gsm8k_dir: Path | None = None, *, mlp_only_layers=(),
                embed_scale: float = 1.0, norm_std: float = 0.0, fp8_blocks: bool = False,
                arch: config.Arch = config.QWEN3_NEXT) -> Path:
    """Generate the random-weight model of ``arch`` into an existing, empty ``out_dir``.

    ``mlp_only_layers`` / ``embed_scale`` / ``norm_std``: a variant for numerics tests (dense MLPs
    where listed, decisive greedy logits, distinct norm weights); see weights.py. ``fp8_blocks``:
    store the block-alignable linears as a block-fp8 checkpoint (fp8.py). The defaults write the
    standard model, byte for byte.
    """
    from tools.tinymodel import weights

    out_dir = Path(out_dir)
    mlp_only_layers = config.check_mlp_only_layers(mlp_only_layers, arch)
    ids, provenance = write_tokenizer(out_dir, gsm8k_dir)
    state = weights.random_state_dict(seed, mlp_only_layers, embed_scale, norm_std, arch)
    quantization = None
    if fp8_blocks:
        from tools.tinymodel import fp8

        state, quantization = fp8.convert(state, config.tensor_layout(mlp_only_layers, arch))
    write_configs(out_dir, ids, mlp_only_layers, quantization, arch)
    weights.save(state, out_dir)
    variant = {}
    if mlp_only_layers or embed_scale != 1.0 or norm_std or fp8_blocks:
        variant = {"variant": {"mlp_only_layers": list(mlp_only_layers), "embed_scale": embed_scale,
                               "norm_std": norm_std}}
        if fp8_blocks:
            variant["variant"]["fp8_blocks"] = True
    arch_meta = {} if arch is config.QWEN3_NEXT else {"arch": arch.name}
    write_metadata(out_dir, {"kind": "random", "seed": seed, **arch_meta, **provenance, **variant})
    return out_dir
