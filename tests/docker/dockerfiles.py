"""The Dockerfiles as the structure tests read them: instructions (parsed by the `dockerfile-parse`
library: continuations, comments, line numbers), grouped into stages, with ARG defaults and build-arg
expansion the way the classic builder does it (``${VAR:-default}`` included, which the library's own
substitution lacks)."""
from __future__ import annotations

import io
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass
class Instruction:
    op: str          # upper-case keyword
    args: str        # the rest, continuation lines joined
    line: int        # 1-based line of the keyword


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def ops(self, op: str) -> list[Instruction]:
        return [i for i in self.instructions if i.op == op]


@dataclass
class Dockerfile:
    path: Path
    global_args: dict[str, str | None]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)


def instructions(text: str) -> list[Instruction]:
    from dockerfile_parse import DockerfileParser

    parser = DockerfileParser(fileobj=io.BytesIO(text.encode()))
    # continuation lines joined with single spaces, as the builder's shell sees them
    return [Instruction(i["instruction"], " ".join(i["value"].split()), i["startline"] + 1)
            for i in parser.structure if i["instruction"] != "COMMENT"]


def parse_args(arg_text: str) -> tuple[str, str | None]:
    name, eq, default = arg_text.partition("=")
    return name.strip(), (default.strip().strip('"') if eq else None)


def parse(path: Path) -> Dockerfile:
    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    for ins in instructions(path.read_text()):
        if ins.op == "FROM":
            parts = ins.args.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        elif not stages:
            if ins.op == "ARG":
                k, v = parse_args(ins.args)
                global_args[k] = v
        else:
            stages[-1].instructions.append(ins)
    return Dockerfile(path, global_args, stages)


def expand(text: str, values: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        name = m[1] or m[3]
        if name in values:
            return values[name]
        return m[2] if m[2] is not None else ""
    return _VAR.sub(sub, text)


def stage_args(stage: Stage, build_args: dict[str, str]) -> dict[str, str]:
    """The ARG values in force at the end of a stage, given --build-arg values."""
    values: dict[str, str] = {}
    for ins in stage.ops("ARG"):
        k, default = parse_args(ins.args)
        if k in build_args:
            values[k] = build_args[k]
        elif default is not None:
            values[k] = expand(default, values)
    return values


def _key_values(stage: Stage, op: str, values: dict[str, str], chained: bool) -> dict[str, str]:
    """KEY=VALUE pairs of a stage's LABEL or ENV lines; ENV values see the ENV keys set before them."""
    out: dict[str, str] = {}
    for ins in stage.ops(op):
        for token in shlex.split(ins.args):
            k, _, v = token.partition("=")
            out[k] = expand(v, {**values, **out} if chained else values)
    return out


def labels(stage: Stage, values: dict[str, str]) -> dict[str, str]:
    return _key_values(stage, "LABEL", values, chained=False)


def env(stage: Stage, values: dict[str, str]) -> dict[str, str]:
    return _key_values(stage, "ENV", values, chained=True)
