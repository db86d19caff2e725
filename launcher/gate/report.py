"""The gate report for people: a rich table on the terminal, a JSON file, a self-contained HTML page."""
from __future__ import annotations

import os
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape as _markup_escape
from rich.table import Table

from .result import CheckResult, GateReport

_STYLE = {"pass": "green", "fail": "red", "error": "bold red", "skipped": "dim"}
_COLOR = {"pass": "#1a7f37", "fail": "#cf222e", "error": "#a40e26", "skipped": "#6e7781"}


# -- terminal --------------------------------------------------------------------------

def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def key_metrics(check: CheckResult) -> str:
    m = check.metrics
    if check.name == "acceptance" and "mean_acceptance_length" in m:
        parts = [f"MAL {_fmt(m.get('mean_acceptance_length'), 2)}", f"rate {_fmt(m.get('acceptance_rate'))}"]
        per_pos = m.get("per_position") or []
        if per_pos:
            parts.append("per-pos " + " ".join(_fmt(p, 2) for p in per_pos))
        base = m.get("baseline") or {}
        if base.get("mean_acceptance_length") is not None:
            parts.append(f"baseline MAL {_fmt(base['mean_acceptance_length'], 2)}")
        return ", ".join(parts)
    if check.name == "gsm8k" and "accuracy" in m:
        lo, hi = m.get("wilson95", [None, None])
        return (f"acc {_fmt(m['accuracy'])} [{_fmt(lo)}, {_fmt(hi)}] n={m.get('num_questions')}, "
                f"strict {_fmt(m.get('strict_accuracy'))}, flexible {_fmt(m.get('flexible_accuracy'))}")
    if check.name == "target" and "nll_increase" in m:
        return (f"NLL {m['nll_increase']:+.4f} vs stock, prefix {_fmt(m.get('prefix_agreement'))}, "
                f"identical {m.get('prompts_identical')}/{m.get('prompts')}")
    if check.name == "speed" and "ratio" in m:
        ref, got = m.get("reference_decode_tok_s") or {}, m.get("decode_tok_s") or {}
        parts = [f"B={b} {_fmt(r, 2)}x ({_fmt(got.get(b), 1)}/{_fmt(ref.get(b), 1)} tok/s)"
                 for b, r in m["ratio"].items()]
        return ", ".join(parts) + f", min {_fmt(m.get('min_ratio'), 2)}" + ("" if m.get("enforced") else
                                                                             ", report-only")
    if check.name == "smoke" and "completion_tokens" in m:
        return f"{m['completion_tokens']} tokens, {_fmt(m.get('latency_s'), 2)} s"
    return ""


def render_table(report: GateReport, console: Console) -> None:
    verdict = "[bold green]GATE PASSED[/]" if report.passed else "[bold red]GATE FAILED[/]"
    title = f"{verdict}  {escape_markup(report.model)} @ {escape_markup(report.endpoint)}"
    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("check")
    table.add_column("status")
    table.add_column("metrics", overflow="fold")
    table.add_column("reason", overflow="fold")
    table.add_column("time", justify="right")
    for c in report.checks:
        table.add_row(c.name, f"[{_STYLE[c.status]}]{c.status}[/]", escape_markup(key_metrics(c)),
                      escape_markup(c.reason), f"{c.duration_s:.1f} s")
    console.print(table)
    ctx = report.context
    bits = [f"{k}={ctx[k]}" for k in ("profile", "profile_hash", "vllm_version", "radiance_version", "arch")
            if k in ctx]
    if bits:
        console.print("[dim]" + escape_markup("  ".join(bits)) + "[/]")
    if not report.passed:
        console.print(f"[red]{escape_markup(report.reason)}[/]")


def escape_markup(text: str) -> str:
    return _markup_escape(str(text))


# -- JSON ------------------------------------------------------------------------------

def save(report: GateReport, reports_dir: str | os.PathLike) -> Path:
    """Write the report as ``gate-<profile>-<UTC timestamp>.json``; never overwrites an earlier one."""
    directory = Path(reports_dir).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    stem = "gate-" + _safe(str(report.context.get("profile") or report.model)) + "-" + \
        datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    text = report.to_json()
    for n in range(1000):
        path = directory / (f"{stem}.json" if n == 0 else f"{stem}-{n}.json")
        try:
            with open(path, "x", encoding="utf-8") as fh:
                fh.write(text + "\n")
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"could not find a free report name under {directory}")


def _safe(name: str) -> str:
    out = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name).strip("._")
    return out[:60] or "endpoint"


# -- HTML ------------------------------------------------------------------------------

def write_html(report: GateReport, path: str | os.PathLike) -> Path:
    """A single page with no external assets or scripts: verdict, checks, the per-position acceptance
    curve (with the baseline when it ran) and the GSM8K result, both drawn as inline SVG."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(report), encoding="utf-8")
    return path


def render_html(report: GateReport) -> str:
    verdict = "PASSED" if report.passed else "FAILED"
    colour = _COLOR["pass" if report.passed else "fail"]
    rows = "\n".join(
        f"<tr><td>{escape(c.name)}</td><td style='color:{_COLOR[c.status]};font-weight:600'>{c.status}</td>"
        f"<td>{escape(key_metrics(c))}</td><td>{escape(c.reason)}</td><td>{c.duration_s:.1f} s</td></tr>"
        for c in report.checks)
    ctx_rows = "\n".join(f"<tr><th>{escape(str(k))}</th><td>{escape(_ctx_value(v))}</td></tr>"
                         for k, v in report.context.items())
    sections = [_acceptance_section(report.check("acceptance")), _gsm8k_section(report.check("gsm8k"))]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>RADIANCE gate: {escape(verdict)} ({escape(report.model)})</title>
<style>
body{{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:60rem;
color:#1f2328;padding:0 1rem}}
h1 span{{color:{colour}}} table{{border-collapse:collapse;margin:.5rem 0 1.5rem}}
td,th{{border:1px solid #d0d7de;padding:.3rem .6rem;text-align:left;vertical-align:top;font-size:.9rem}}
th{{background:#f6f8fa}} .note{{color:#57606a;font-size:.85rem}} svg text{{font-size:12px;fill:#1f2328}}
</style></head><body>
<h1>Gate <span>{escape(verdict)}</span></h1>
<p>{escape(report.reason)}</p>
<p class="note">{escape(report.model)} at {escape(report.endpoint)} · {escape(report.started_at)} ·
{report.duration_s:.1f} s</p>
<h2>Checks</h2>
<table><tr><th>check</th><th>status</th><th>metrics</th><th>reason</th><th>time</th></tr>
{rows}</table>
{''.join(sections)}
<h2>Context</h2>
<table>{ctx_rows}</table>
</body></html>
"""


def _ctx_value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v) or "(none)"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {x}" for k, x in v.items()) or "(none)"
    return str(v)


def _acceptance_section(check: CheckResult | None) -> str:
    if check is None:
        return ""
    head = f"<h2>Acceptance <small style='color:{_COLOR[check.status]}'>{check.status}</small></h2>"
    m = check.metrics
    on = [p for p in (m.get("per_position") or [])]
    base = (m.get("baseline") or {}).get("per_position") or []
    if not on:
        return head + f"<p class='note'>{escape(check.reason or 'no per-position figures')}</p>"
    series = [("features on", on, "#0969da")]
    if base:
        series.append(("baseline (features off)", base, "#bf8700"))
    thresholds = (m.get("thresholds") or {}).get("min_per_position")
    svg = per_position_svg(series, thresholds)
    kinds = m.get("by_kind") or {}
    kind_rows = "".join(
        f"<tr><td>{escape(k)}</td><td>{_fmt(v.get('mean_acceptance_length'), 2)}</td>"
        f"<td>{_fmt(v.get('acceptance_rate'))}</td><td>{v.get('num_drafts', 'n/a')}</td></tr>"
        for k, v in kinds.items())
    kind_table = ("<table><tr><th>kind</th><th>mean acceptance length</th><th>acceptance rate</th>"
                  f"<th>drafts</th></tr>{kind_rows}</table>") if kind_rows else ""
    tele = (m.get("radiance") or {})
    tele_rows = "".join(f"<tr><td>{escape(k)}</td><td>{_fmt(v)}</td><td>{section}</td></tr>"
                        for section in ("delta", "current") for k, v in (tele.get(section) or {}).items())
    tele_table = ("<h3>radiance draft telemetry</h3><table><tr><th>series</th><th>value</th><th></th></tr>"
                  f"{tele_rows}</table>") if tele_rows else ""
    return (head + f"<p>Mean acceptance length {_fmt(m.get('mean_acceptance_length'), 2)}, acceptance rate "
            f"{_fmt(m.get('acceptance_rate'))}, {m.get('num_drafts')} drafts "
            f"(prompt set {escape(str((m.get('prompt_set') or {}).get('name')))}).</p>"
            + svg + kind_table + tele_table)


def per_position_svg(series: list[tuple[str, list, str]], thresholds: list[float] | None = None,
                     width: int = 560, height: int = 300) -> str:
    """Acceptance rate per draft position, one polyline per series, optional threshold markers."""
    left, right, top, bottom = 50, 20, 20, 60
    pw, ph = width - left - right, height - top - bottom
    n = max(len(s[1]) for s in series)
    if thresholds:
        n = max(n, len(thresholds))

    def x(i: int) -> float:
        return left + (pw * (i + 0.5) / n)

    def y(v: float) -> float:
        return top + ph * (1.0 - max(0.0, min(1.0, v)))

    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
             f"viewBox='0 0 {width} {height}' role='img' aria-label='per-position acceptance rate'>"]
    for t in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f"<line x1='{left}' x2='{left + pw}' y1='{y(t):.1f}' y2='{y(t):.1f}' stroke='#d0d7de'/>")
        parts.append(f"<text x='{left - 8}' y='{y(t) + 4:.1f}' text-anchor='end'>{t:.2f}</text>")
    for i in range(n):
        parts.append(f"<text x='{x(i):.1f}' y='{top + ph + 18}' text-anchor='middle'>{i + 1}</text>")
    parts.append(f"<text x='{left + pw / 2:.1f}' y='{top + ph + 36}' text-anchor='middle'>draft position</text>")
    if thresholds:
        for i, t in enumerate(thresholds):
            parts.append(f"<line x1='{x(i) - 12:.1f}' x2='{x(i) + 12:.1f}' y1='{y(t):.1f}' y2='{y(t):.1f}' "
                         "stroke='#cf222e' stroke-width='2' stroke-dasharray='3 2'><title>threshold "
                         f"{t:.3f}</title></line>")
    for k, (label, values, colour) in enumerate(series):
        pts = [(x(i), y(v), v) for i, v in enumerate(values) if v is not None]
        if len(pts) > 1:
            parts.append(f"<polyline fill='none' stroke='{colour}' stroke-width='2' points='"
                         + " ".join(f"{px:.1f},{py:.1f}" for px, py, _ in pts) + "'/>")
        for px, py, v in pts:
            parts.append(f"<circle cx='{px:.1f}' cy='{py:.1f}' r='4' fill='{colour}'><title>{escape(label)}: "
                         f"{v:.3f}</title></circle>")
        lx = left + 10 + k * 220
        parts.append(f"<rect x='{lx}' y='{height - 16}' width='12' height='4' fill='{colour}'/>"
                     f"<text x='{lx + 18}' y='{height - 10}'>{escape(label)}</text>")
    parts.append("</svg>")
    return "".join(parts)


def _gsm8k_section(check: CheckResult | None) -> str:
    if check is None:
        return ""
    head = f"<h2>GSM8K <small style='color:{_COLOR[check.status]}'>{check.status}</small></h2>"
    m = check.metrics
    if "accuracy" not in m:
        return head + f"<p class='note'>{escape(check.reason or 'not run')}</p>"
    lo, hi = m.get("wilson95") or [m["accuracy"], m["accuracy"]]
    svg = accuracy_svg(m["accuracy"], lo, hi, m.get("threshold"), m.get("pass_floor"), _COLOR[check.status])
    which = f"fixed-seed subset, seed {m.get('seed')}" if m.get("subset") else "all"
    return (head + f"<p>{escape(check.reason)}</p>" + svg +
            f"<p class='note'>{m.get('num_questions')} questions ({which}), "
            f"{m.get('num_shots')}-shot, strict-match {_fmt(m.get('strict_accuracy'))}, flexible-extract "
            f"{_fmt(m.get('flexible_accuracy'))}, no number in {_fmt(m.get('invalid_rate'))} of answers, "
            f"{m.get('request_errors', 0)} failed requests.</p>")


def accuracy_svg(acc: float, lo: float, hi: float, threshold: float | None, floor: float | None,
                 colour: str, width: int = 560, height: int = 90) -> str:
    """A 0–1 axis with the accuracy, its Wilson interval, the threshold and the pass floor."""
    left, right = 20, 20
    pw = width - left - right

    def x(v: float) -> float:
        return left + pw * max(0.0, min(1.0, v))

    mid = 35
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
             f"viewBox='0 0 {width} {height}' role='img' aria-label='GSM8K accuracy'>",
             f"<line x1='{x(0)}' x2='{x(1)}' y1='{mid}' y2='{mid}' stroke='#d0d7de' stroke-width='8'/>"]
    for t in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f"<text x='{x(t):.1f}' y='{mid + 30}' text-anchor='middle'>{t:.2f}</text>")
    if floor is not None:
        parts.append(f"<rect x='{x(floor):.1f}' y='{mid - 14}' width='{x(1) - x(floor):.1f}' height='28' "
                     f"fill='#1a7f37' fill-opacity='0.12'><title>pass region ≥ {floor:.3f}</title></rect>")
    if threshold is not None:
        parts.append(f"<line x1='{x(threshold):.1f}' x2='{x(threshold):.1f}' y1='{mid - 18}' y2='{mid + 18}' "
                     f"stroke='#57606a' stroke-dasharray='3 2'><title>threshold {threshold:.3f}</title></line>")
    parts.append(f"<line x1='{x(lo):.1f}' x2='{x(hi):.1f}' y1='{mid}' y2='{mid}' stroke='{colour}' "
                 f"stroke-width='4'><title>Wilson 95%: {lo:.3f}–{hi:.3f}</title></line>")
    parts.append(f"<circle cx='{x(acc):.1f}' cy='{mid}' r='7' fill='{colour}'><title>accuracy {acc:.3f}"
                 "</title></circle>")
    parts.append(f"<text x='{x(acc):.1f}' y='{mid - 14}' text-anchor='middle'>{acc:.3f}</text>")
    parts.append("</svg>")
    return "".join(parts)
