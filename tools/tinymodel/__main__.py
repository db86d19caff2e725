"""``python -m tools.tinymodel --out DIR [--seed 0] [--force]``: write the tiny test model.

Variant options for numerics tests (weights.py explains them): ``--mlp-only-layers 0,1,2``
(dense MLPs there; one layer must stay MoE), ``--embed-scale 16`` (decisive greedy logits),
``--norm-std 0.1`` (a distinct weight per RMSNorm), ``--fp8-blocks`` (a block-fp8 checkpoint:
e4m3 weights with 128x128 ``weight_scale_inv`` and a ``quantization_config``; see fp8.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tools.tinymodel import generate_into, is_complete
from tools.tinymodel.corpus import GSM8K_ENV


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory to write the checkpoint into.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random weights.")
@click.option("--force", is_flag=True, help="Replace OUT if it already holds files.")
@click.option("--gsm8k-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              envvar=GSM8K_ENV,
              help=f"GSM8K data dir for the tokenizer corpus (env {GSM8K_ENV}; "
                   "default ../shared/data/gsm8k beside the repo, else a built-in corpus).")
@click.option("--mlp-only-layers", default="", show_default=True,
              help="Comma-separated decoder layers with a dense MLP instead of sparse MoE "
                   "(at least one layer must stay MoE).")
@click.option("--embed-scale", default=1.0, show_default=True, type=float,
              help="Multiply the token embeddings: makes greedy top-1 choices decisive.")
@click.option("--norm-std", default=0.0, show_default=True, type=float,
              help="Std of random Gemma-style RMSNorm offsets (0: all zeros).")
@click.option("--fp8-blocks", is_flag=True,
              help="Store the block-alignable linears as fp8 e4m3 with 128x128 weight_scale_inv "
                   "(the DeepSeek/Qwen FP8 checkpoint format).")
def main(out: Path, seed: int, force: bool, gsm8k_dir: Path | None, mlp_only_layers: str,
         embed_scale: float, norm_std: float, fp8_blocks: bool) -> None:
    """Write a tiny random-weight Qwen3-Next (with one MTP layer) that vLLM loads on CPU."""
    from tools.tinymodel import config

    try:
        dense = config.check_mlp_only_layers(int(i) for i in mlp_only_layers.split(",") if i.strip())
    except ValueError as exc:
        click.echo(f"error: --mlp-only-layers {mlp_only_layers!r}: {exc}", err=True)
        sys.exit(2)
    if out.exists() and any(out.iterdir()) and not force:
        state = "a tiny model" if is_complete(out) else "files"
        click.echo(f"error: {out} already holds {state}; pass --force to replace it", err=True)
        sys.exit(2)
    generate_into(out, seed=seed, gsm8k_dir=gsm8k_dir, mlp_only_layers=dense, embed_scale=embed_scale,
                  norm_std=norm_std, fp8_blocks=fp8_blocks)
    click.echo(str(out))


if __name__ == "__main__":
    main()
