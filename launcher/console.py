"""All CLI output goes through here: rich on a terminal, plain when piped, JSON on request.

NO_COLOR is honoured by rich itself; progress goes to stderr so --json stdout stays clean.
"""
from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def error(message: str) -> None:
    # One line, no markup interpretation: messages carry paths and brackets.
    err.print(f"error: {message}", markup=False, style="bold red")


def warn(message: str) -> None:
    err.print(f"warning: {message}", markup=False, style="yellow")


def info(message: str) -> None:
    err.print(message, markup=False)


def table(title: str, columns: list[str], rows: list[list[str]], styles: dict[int, str] | None = None) -> Table:
    t = Table(title=title, title_justify="left", show_lines=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    for row in rows:
        t.add_row(*row)
    return t


STATUS_STYLE = {"ok": "green", "pass": "green", "applied": "green", "warn": "yellow", "skipped": "yellow",
                "disabled": "dim", "declined": "yellow", "fail": "red", "error": "red",
                "failed-at-runtime": "red", "partial": "yellow", "mixed": "yellow"}


def styled(status: str) -> str:
    style = STATUS_STYLE.get(status, "")
    return f"[{style}]{status}[/{style}]" if style else status
