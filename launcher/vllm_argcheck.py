"""A profile's ``vllm_args`` read by vLLM's own argument parser, before any engine starts.

    python -m launcher.vllm_argcheck '{"enforce-eager": "maybe-yes"}'     -> JSON {flag: [problems]}

Run in a subprocess by `radiance check` where vLLM is importable (importing its parser pulls in
torch: seconds, and nothing `radiance up` should pay twice). Each flag is parsed on its own, so a
problem names the field it came from, and a flag's verdict depends on that flag alone (the launcher keeps
it per flag: launcher.preflight.vllm_args_problems). A value that argparse leaves over (``--enforce-eager
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
    return [p for found in by_flag(vllm_args).values() for p in found]


def by_flag(vllm_args: dict) -> dict[str, list[str]]:
    """Each flag's problems (one line each, ``vllm_args.KEY: ... — fix: ...``; none where vLLM takes it)."""
    import difflib

    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())

    def error(message: str):
        raise _ParseError(message)

    parser.error = error  # argparse would print usage and exit; we want the message
    known = [o[2:] for o in parser._option_string_actions if o.startswith("--")]
    out: dict[str, list[str]] = {}
    for key, value in vllm_args.items():
        out[key] = []
        flags = render_vllm_args({key: value})
        if not flags:
            continue
        try:
            ns = parser.parse_args(["--model", "model", *flags])
        except _ParseError as exc:
            msg = " ".join(str(exc).split())
            if msg.startswith("unrecognized arguments"):
                close = difflib.get_close_matches(key, known, n=1)
                fix = f"did you mean {close[0]}?" if close else "remove it (`python -m " \
                    "vllm.entrypoints.openai.api_server --help` lists vLLM's flags)"
                out[key].append(f"vllm_args.{key}: --{key} is not one of vLLM's flags — fix: {fix}")
            else:
                out[key].append(f"vllm_args.{key}: vLLM rejects {' '.join(flags)}: {msg} — fix: see "
                                "`python -m vllm.entrypoints.openai.api_server --help`")
            continue
        if getattr(ns, "model_tag", None) is not None:
            out[key].append(f"vllm_args.{key}: --{key} takes no value, {value!r} would be read as the model — "
                            f"fix: {key}: true (or false)")
    return out


def main(argv: list[str]) -> int:
    print(json.dumps(by_flag(json.loads(argv[0]) if argv else {})))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
