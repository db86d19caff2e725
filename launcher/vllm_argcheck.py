"""A profile's ``vllm_args`` read by vLLM's own argument parser, before any engine starts.

    python -m launcher.vllm_argcheck '{"enforce-eager": "maybe-yes"}'     -> JSON list of problems

Run in a subprocess by `radiance check` where vLLM is importable (importing its parser pulls in
torch: seconds, and nothing `radiance up` should pay twice). Each flag is parsed on its own, so a
problem names the field it came from. A value that argparse leaves over (``--enforce-eager
maybe-yes``: an on/off flag followed by a word) lands in vLLM's positional ``model_tag``, which
would silently replace the model: that is a problem too.
"""
from __future__ import annotations

import json
import sys

from .engine_args import render_vllm_args


class _ParseError(Exception):
    pass


def problems(vllm_args: dict) -> list[str]:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())

    def error(message: str):
        raise _ParseError(message)

    parser.error = error  # argparse would print usage and exit; we want the message
    out = []
    for key, value in vllm_args.items():
        flags = render_vllm_args({key: value})
        if not flags:
            continue
        try:
            ns = parser.parse_args(["--model", "model", *flags])
        except _ParseError as exc:
            out.append(f"vllm_args.{key}: vLLM rejects {' '.join(flags)}: {exc} — fix: see "
                       "`python -m vllm.entrypoints.openai.api_server --help`")
            continue
        if getattr(ns, "model_tag", None) is not None:
            out.append(f"vllm_args.{key}: --{key} takes no value, {value!r} would be read as the model — "
                       f"fix: {key}: true (or false)")
    return out


def main(argv: list[str]) -> int:
    print(json.dumps(problems(json.loads(argv[0]) if argv else {})))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
