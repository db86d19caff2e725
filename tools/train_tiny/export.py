"""Assemble the trained model directory from the trainer's output (runs here, on CPU).

    python -m tools.train_tiny.export --train-out DIR --data .cache/train_tiny --out models/tiny-qwen3.5-trained

The architecture is the one the trainer ran (``--arch`` in its log).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from tools.tinymodel import generate, weights


def export(train_out: Path, data_dir: Path, out: Path) -> Path:
    import torch
    from tokenizers import Tokenizer

    from tools.tinymodel import config
    from tools.tinymodel.tokenizer import IM_END, PAD

    tensors = {}
    for part in ("weights_a.pt", "weights_b.pt"):
        tensors.update(torch.load(train_out / part))
    log = json.loads((train_out / "train_log.json").read_text())
    arch = config.ARCHS[log["args"].get("arch", "tiny-qwen3next")]
    order = [name for name, _, _ in config.tensor_layout(arch=arch)]
    if sorted(tensors) != sorted(order):
        raise SystemExit(f"trainer output does not match the {arch.name} tensor layout")

    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(data_dir / name, out / name)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = {"pad": tok.token_to_id(PAD), "im_end": tok.token_to_id(IM_END)}
    generate.write_configs(out, ids, arch=arch)
    weights.save({n: tensors[n].contiguous() for n in order}, out).chmod(0o644)
    data_info = json.loads((data_dir / "data_info.json").read_text())
    generate.write_metadata(out, {
        "kind": "trained",
        **({} if arch is config.QWEN3_NEXT else {"arch": arch.name}),
        "seed": log["args"]["seed"],
        "train_args": log["args"],
        "train_device": log["device"],
        "train_torch": log["torch"],
        "train_seconds": log["train_seconds"],
        "final_losses": log["final"],
        "heldout": log["heldout"],
        "data": data_info,
    })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-out", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=Path(".cache/train_tiny"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    print(export(args.train_out, args.data, args.out))


if __name__ == "__main__":
    main()
