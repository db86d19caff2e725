"""``python -m launcher.tinymodel --out DIR [--seed 0] [--force]``: write the tiny test model."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from launcher.tinymodel import generate_into, is_complete
from launcher.tinymodel.corpus import GSM8K_ENV


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory to write the checkpoint into.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random weights.")
@click.option("--force", is_flag=True, help="Replace OUT if it already holds files.")
@click.option("--gsm8k-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              envvar=GSM8K_ENV,
              help=f"GSM8K data dir for the tokenizer corpus (env {GSM8K_ENV}; "
                   "default ../shared/data/gsm8k beside the repo, else a built-in corpus).")
def main(out: Path, seed: int, force: bool, gsm8k_dir: Path | None) -> None:
    """Write a tiny random-weight Qwen3-Next (with one MTP layer) that vLLM loads on CPU."""
    if out.exists() and any(out.iterdir()) and not force:
        state = "a tiny model" if is_complete(out) else "files"
        click.echo(f"error: {out} already holds {state}; pass --force to replace it", err=True)
        sys.exit(2)
    generate_into(out, seed=seed, gsm8k_dir=gsm8k_dir)
    click.echo(str(out))


if __name__ == "__main__":
    main()
