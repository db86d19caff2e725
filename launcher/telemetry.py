"""The plugin's counters, as the endpoint shows them.

The dynamic-draft controller runs in vLLM's worker; it writes its counters as JSON
(``RADIANCE_REPORT_DIR/draft-<pid>.json``: ``{"pid", "time", "counters": {name: int}}``). The gateway
sums every such file and appends them to the engine's /metrics as ``radiance:draft_<name>_total``
counters, next to vLLM's own ``vllm:spec_decode_*`` ones; `radiance status` shows the same sums.
The JSON is the contract: nothing here imports the plugin.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def read_counters(report_dir: Path | None) -> dict[str, int]:
    if report_dir is None:
        return {}
    total: dict[str, int] = {}
    for f in sorted(Path(report_dir).glob("draft-*.json")):
        try:
            counters = json.loads(f.read_text()).get("counters", {})
        except (OSError, json.JSONDecodeError, AttributeError):
            continue  # a file being rewritten; the next scrape reads it
        for name, value in counters.items():
            if _NAME.match(name) and isinstance(value, (int, float)):
                total[name] = total.get(name, 0) + int(value)
    return total


def render_prometheus(counters: dict[str, int]) -> str:
    lines = []
    for name in sorted(counters):
        metric = f"radiance:draft_{name}_total"
        lines.append(f"# HELP {metric} dynamic-draft controller counter {name!r} (summed over workers).")
        lines.append(f"# TYPE {metric} counter")
        lines.append(f"{metric} {counters[name]}")
    return "\n".join(lines) + ("\n" if lines else "")
