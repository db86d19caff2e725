"""`radiance bench PROFILE`: the profile's model, stock and with its feature sets, timed by vLLM."""
from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import click

from radiance import envs

from .. import console, errors, paths, platforms
from ._common import JSON_OPT, PROFILE_ARG, check_knobs, load


def _ints(option: str, raw: str) -> list[int]:
    try:
        values = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise errors.UsageError(f"{option} {raw!r}: not a comma-separated list of integers — fix: e.g. "
                                f"{option} 1,8,32") from None
    if not values or any(v < 1 for v in values):
        raise errors.UsageError(f"{option} {raw!r}: give integers >= 1 — fix: e.g. {option} 1,8,32")
    return values


def _pairs(option: str, items: tuple[str, ...], example: str, form: str = "NAME=VALUE") -> list[tuple[str, str]]:
    """NAME=VALUE items of a repeatable option, each refused in one line when it is not one."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise errors.UsageError(f"{option} {item!r}: expected {form} — fix: e.g. {option} {example}")
        out.append((key, value))
    return out


def _engine_env(items: tuple[str, ...], sets) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Every engine's extra environment, and each named set's own (``SET:NAME=VALUE``): a set's wins."""
    from ..bench import plan

    pairs = _pairs("--engine-env", items, "VLLM_LOGGING_LEVEL=DEBUG", "[SET:]NAME=VALUE")
    try:
        common, per_set = plan.engine_env(pairs, sets)
    except ValueError as exc:
        raise errors.UsageError(f"--engine-env {exc}") from None
    for extra in [{}, *per_set.values()]:   # every engine's, then each set's: a bad knob would only decline a feature
        problems = envs.validate_all({**os.environ, **common, **extra})
        if problems:
            raise errors.UsageError(f"--engine-env: {problems[0]} — fix: correct its value (see radiance/envs.py)")
    return common, per_set


def _with_vllm_args(profile, items: tuple[str, ...]):
    """The profile with --vllm-arg overrides, validated by the profile's own rules (a managed flag is refused)."""
    if not items:
        return profile
    from ruamel.yaml import YAML

    from ..profile import Profile

    args = dict(profile.vllm_args)
    for key, raw in _pairs("--vllm-arg", items, "enforce-eager=true", "KEY=VALUE"):
        value = YAML(typ="safe").load(raw) if raw.strip() else None
        # A JSON object or list (hf-overrides, compilation-config) goes to vLLM as the text it was given.
        args[key] = raw if isinstance(value, (dict, list)) else value
    from pydantic import ValidationError

    try:
        return Profile.model_validate({**profile.model_dump(), "vllm_args": args})
    except ValidationError as exc:
        msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise errors.UsageError(f"--vllm-arg: vllm_args.{msg}") from None


def _verdict(ll: dict) -> str:
    extra = [f"{ll[k]} {k}" for k in ("unstable", "unscorable") if ll.get(k)]
    aside = (", " + ", ".join(extra)) if extra else ""
    if ll.get("violations"):
        return f"[red]{ll['violations']} violations[/red] ({ll['positions']} scored{aside})"
    if ll.get("inconclusive") or not ll.get("ok"):
        return f"[yellow]inconclusive[/yellow] ({ll.get('positions', 0)} scored{aside})"
    return f"[green]ok[/green] ({ll['positions']} scored, {ll['ties']} ties{aside})"


def _inconclusive(report: dict) -> list[str]:
    """``set S B=N: 0 positions scored (...)`` for each batch whose lossless check scored nothing, in the
    sets without a violation (a violation is the worse verdict and is reported as such)."""
    out = []
    for s in report["sets"]:
        ll = s.get("lossless")
        if not ll or ll.get("violations") or ll.get("ok"):
            continue
        rows = {r["batch"]: r["lossless"] for r in s.get("results", []) if r.get("lossless")}
        for b in ll.get("inconclusive_batches") or [b for b, r in rows.items() if not r.get("positions")] or ["?"]:
            why = [f"{rows[b][k]} {k}" for k in ("unscorable", "unstable") if b in rows and rows[b].get(k)]
            out.append(f"set {s['set']} B={b}: 0 positions scored" + (f" ({', '.join(why)})" if why else ""))
    return out


def _table(report: dict) -> None:
    from ..bench import rounds as bench_rounds

    rows = []
    acc = report.get("acceptance") or {}
    many = len(acc.get("profiles") or []) > 1
    synthetic = acc.get("kind") == "synthetic"
    n = report["options"].get("rounds", 1)
    for s in report["sets"]:
        name = bench_rounds.set_label(s, n)
        if "error" in s:
            rows.append([name, s.get("runner", ""), *(["-"] if many else []), "-", "-", "-",
                         *(["-"] if synthetic else []), "-", "-", "[red]error[/red]: " + s["error"][:80]])
            continue
        for r in s["results"]:
            ll = r.get("lossless")
            verdict = "" if ll is None else _verdict(ll)
            tok = f"{r['decode_tok_s']:.0f}"
            ratio, exp = bench_rounds.ratio_cell(r, "vs_stock"), bench_rounds.ratio_cell(r, "vs_stock_expected")
            if "decode_tok_s_spread" in r:  # median of the rounds [min-max]
                sp = r["decode_tok_s_spread"]
                tok += f" [{sp['min']:.0f}-{sp['max']:.0f}]"
            rows.append([name, s["runner"], *([r.get("acceptance", "")] if many else []), str(r["batch"]), tok, ratio,
                         *([exp] if synthetic else []), f"{r['ms_per_step']:.2f}",
                         f"{r['mean_acceptance_length']:.2f}" if r.get("mean_acceptance_length") else "",
                         verdict])
    how = ("synthetic acceptance per row" if many else
           f"synthetic acceptance {'/'.join(str(x) for x in acc['rates'])}" if acc.get("kind") == "synthetic"
           else "the model's own acceptance")
    console.out.print(console.table(
        f"radiance bench {report['profile_name']} on {report['device']} (commit {report['commit']}; "
        f"{report['options']['max_tokens']} tokens per request, greedy; {how}"
        + (f"; median of {report['options'].get('rounds_done', n)} interleaved rounds [min-max]" if n > 1 else "")
        + ")",
        ["set", "runner", *(["acceptance"] if many else []), "B", "decode tok/s",
         f"vs {report.get('reference') or 'stock'}",
         # the step time at the rates' expected acceptance: the synthetic sampler's luck left out (rounds.add_expected)
         *(["B=1 at expected acceptance"] if synthetic else []), "ms/step", "accept len", "lossless"], rows))


# two engines of vLLM's default 0.9 cannot share a device; 0.47 each leaves the CUDA context and what vLLM
# keeps outside its budget room beside them
TWO_ENGINE_UTILIZATION = 0.47


def _check_keep_reference(profile, profile_path: str, sets, platform: str, take_turns: bool) -> None:
    if len(sets) < 2 or sets[0].plugin or sets[0].depth is not None:
        raise errors.UsageError(f"--keep-reference: the first of --sets is the reference and must be stock or "
                                f"stock@v2, followed by the sets to measure beside it (got "
                                f"{', '.join(s.name for s in sets)}) — fix: e.g. --sets stock@v2,only-int4_head")
    if take_turns and platform not in (platforms.CUDA.name, platforms.ROCM.name):
        raise errors.UsageError(f"--take-turns: vLLM's sleep mode needs a CUDA or ROCm GPU, not the {platform} "
                                "platform — fix: leave --take-turns out")
    if take_turns and str(profile.vllm_args.get("load-format") or "") != "dummy":
        # a sleeping engine's weights are dropped and drawn again on waking: only random weights come back
        raise errors.UsageError(f"--take-turns: {profile_path}: vllm_args.load-format is not dummy, and a "
                                "sleeping engine's weights are dropped and drawn again at random — fix: a "
                                "dummy-weight profile, or --keep-reference without --take-turns")
    if platform == platforms.CPU.name or take_turns:
        return   # a sleeping engine leaves the device to the one measured: the profile's budget stands
    util = float(profile.vllm_args.get("gpu-memory-utilization") or 0.9)
    if util > TWO_ENGINE_UTILIZATION:
        raise errors.UsageError(f"--keep-reference: {profile_path}: vllm_args.gpu-memory-utilization {util:g} "
                                f"leaves no room for a second engine on the device — fix: --vllm-arg "
                                f"gpu-memory-utilization={TWO_ENGINE_UTILIZATION}")


@click.command("bench")
@PROFILE_ARG
@click.option("--sets", "sets_spec", default=None, metavar="SETS",
              help="Comma-separated feature sets: stock, all, no-FEATURE, only-FEATURE, a+b, each with an optional "
                   "@v1/@v2 runner (without one: the runner `radiance up` gives those features). Default: stock, "
                   "stock@v1 (GPU, where the profile's features run on V1), all, and each enabled feature off in "
                   "turn.")
@click.option("--batch", "batch_raw", default="1,8,32", show_default=True, metavar="B,...",
              help="Concurrent requests per timed run.")
@click.option("--max-tokens", type=click.IntRange(2, 8192), default=128, show_default=True,
              help="Tokens generated per request (greedy, ignore_eos).")
@click.option("--prompt-tokens", type=click.IntRange(0, 8192), default=0,
              help="Cut each prompt to this many tokens (0: as written).")
@click.option("--repeat", type=click.IntRange(1, 20), default=1, show_default=True,
              help="Timed runs per batch; the median is reported.")
@click.option("--rounds", type=click.IntRange(1, 20), default=1, show_default=True,
              help="Run every set this many times, interleaved (stock, set, stock, set, ...), each a fresh engine; "
                   "the report gives the median of the rounds and their spread, ratios taken within a round.")
@click.option("--keep-reference", is_flag=True,
              help="Start the first set (stock) once and keep it loaded; start each other set once beside it and "
                   "alternate the two --rounds times (stock, set, stock, set, ...). One engine start per set "
                   "instead of one per set per round; on a GPU both engines share it (gpu-memory-utilization <= 0.47).")
@click.option("--take-turns", is_flag=True,
              help="With --keep-reference, on a GPU, for dummy-weight profiles: every set's engine is started "
                   "once and kept asleep (vLLM's sleep mode, level 2: weights and KV cache dropped; the weights "
                   "are drawn again at random on waking) but the one measured, so each runs with the profile's "
                   "own gpu-memory-utilization; --rounds rounds of stock and every set. The report says so.")
@click.option("--acceptance", "acceptance_raw", multiple=True, metavar="synthetic:R1,R2,...",
              help="vLLM's synthetic rejection sampling at these per-position (unconditional) acceptance rates, "
                   "for dummy-weight profiles, whose drafts are otherwise never accepted; the report says so. "
                   "Repeatable: every set's engine runs each profile in turn (one start per set).")
@click.option("--lossless", "lossless_raw", default="1,8", show_default=True, metavar="B,...",
              help="Batches whose outputs are re-scored: every emitted token must be the target's argmax "
                   "for its prefix (within --eps). 'none' skips it.")
@click.option("--allow-inconclusive", is_flag=True,
              help="Exit 0 (with a warning) when a lossless check scored no position in a batch, instead of "
                   "exit 6 (inconclusive).")
@click.option("--eps", type=click.FloatRange(0.0, 10.0), default=None,
              help="Logit margin under which a non-argmax token counts as a tie (default 0.25).")
@click.option("--platform", type=click.Choice(platforms.WANTED), default="auto", show_default=True,
              help="Override the profile's runtime.platform.")
@click.option("--commit", default=None,
              help="Commit recorded in the report (default: this checkout's HEAD; pass it where the checkout's "
                   "git metadata is not the tree's).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Write the JSON report here (default: $RADIANCE_HOME/reports/bench-PROFILE-TIME.json).")
@click.option("--engine-env", multiple=True, metavar="[SET:]NAME=VALUE",
              help="Extra environment for every engine, or with SET: for that set's alone (repeatable), e.g. "
                   "VLLM_LOGGING_LEVEL=DEBUG or dynamic_draft:RADIANCE_DRAFT_PIN_DEPTH=4; a set's RADIANCE_* "
                   "knobs are recorded in the report.")
@click.option("--vllm-arg", "vllm_arg", multiple=True, metavar="KEY=VALUE",
              help="Override one of the profile's vllm_args for every set (repeatable), e.g. enforce-eager=true; "
                   "recorded in the report.")
@JSON_OPT
def command(profile_path: str, sets_spec: str | None, batch_raw: str, max_tokens: int, prompt_tokens: int,
            repeat: int, rounds: int, keep_reference: bool, take_turns: bool, acceptance_raw: tuple[str, ...],
            lossless_raw: str, allow_inconclusive: bool,
            eps: float | None, platform: str, commit: str | None,
            out_path: str | None, engine_env: tuple[str, ...], vllm_arg: tuple[str, ...], as_json: bool) -> None:
    """Run PROFILE's model stock and with its feature sets, at each batch size, through vLLM's offline
    engine (one fresh engine per set, started exactly as `radiance up` starts it), and print decode
    tok/s, ms per step, acceptance and the lossless check. Writes a JSON report (date, device, commit).
    """
    import signal
    import sys

    from ..bench import plan, rounds as bench_rounds, run
    from ..bench.lossless import DEFAULT_EPS
    from ..preflight import resolve_platform

    profile = _with_vllm_args(load(profile_path), vllm_arg)
    check_knobs()
    batches = _ints("--batch", batch_raw)
    profiles: list[list[float]] = []
    for raw in acceptance_raw:
        try:
            rates = bench_rounds.parse_acceptance(raw)
        except ValueError as exc:
            raise errors.UsageError(f"--acceptance: {exc}") from None
        if profile.drafter.type == "none":
            raise errors.UsageError(f"--acceptance: {profile_path}: the profile has no drafter (drafter.type: "
                                    "none) — fix: a profile with an MTP or DFlash drafter")
        if len(rates) < profile.drafter.num_speculative_tokens:
            raise errors.UsageError(f"--acceptance: {len(rates)} rates for drafter.num_speculative_tokens "
                                    f"{profile.drafter.num_speculative_tokens} — fix: give one rate per position")
        profiles.append(rates)
    acceptance = profiles or None
    lossless_batches = [] if lossless_raw.strip().lower() == "none" else _ints("--lossless", lossless_raw)
    if platform == platforms.AUTO:
        if profile.runtime.platform != platforms.AUTO:
            platform = profile.runtime.platform
        else:
            from .. import hardware

            platform = resolve_platform(profile, hardware.probe_all())
    if acceptance is not None and platform == platforms.CPU.name:
        # vLLM 0.32's CPU sampler asserts "Synthetic acceptance not supported with CPU sampling" at the
        # first step: refuse here rather than kill every engine
        raise errors.UsageError("--acceptance: vLLM's synthetic rejection sampling runs on GPUs only, not on "
                                "the cpu platform — fix: leave --acceptance out on CPU")
    sets = plan.parse(sets_spec or plan.default_sets(profile, platform), profile, platform)
    common_env, set_env = _engine_env(engine_env, sets)
    if take_turns and not keep_reference:
        raise errors.UsageError("--take-turns: only with --keep-reference (every set's engine kept loaded, one "
                                "awake at a time) — fix: add --keep-reference, or leave --take-turns out")
    if keep_reference:
        _check_keep_reference(profile, profile_path, sets, platform, take_turns)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(out_path) if out_path else paths.reports_dir() / f"bench-{profile.name}-{stamp}.json"
    opts = run.Options(batches=batches, max_tokens=max_tokens, prompt_tokens=prompt_tokens, repeat=repeat,
                       lossless_batches=[b for b in lossless_batches if b in batches],
                       eps=DEFAULT_EPS if eps is None else eps, engine_env=common_env, set_env=set_env,
                       timeout_s=profile.runtime.startup_timeout_s + 1200, acceptance=acceptance, rounds=rounds,
                       keep_reference=keep_reference, take_turns=take_turns)
    out.parent.mkdir(parents=True, exist_ok=True)
    # A bench stopped by SIGTERM (a CI timeout, `timeout`) unwinds like ^C, so the running set's engine is
    # stopped with it instead of running on in its own session.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    def save(report: dict) -> None:
        out.write_text(json.dumps(report, indent=1) + "\n")

    report = run.bench(profile, profile_path, platform, sets, opts, commit or run.git_commit(),
                       out.parent / f"{out.stem}-logs", on_set=save)
    save(report)
    if as_json:
        console.print_json(report)
    else:
        _table(report)
        console.info(f"report: {out}")
    failed = [s["set"] for s in report["sets"] if "error" in s]
    lossy = [s["set"] for s in report["sets"] if s.get("lossless") and s["lossless"].get("violations")]
    unsure = _inconclusive(report)
    if unsure and (failed or lossy or allow_inconclusive):
        console.warn(f"bench: the lossless check scored nothing in {'; '.join(unsure)} (see 'unscorable' and "
                     "'unstable' in the report)")
    if failed:
        raise errors.LauncherError(f"bench: set(s) {', '.join(failed)} failed (report: {out})")
    if lossy:
        raise errors.LauncherError(f"bench: set(s) {', '.join(lossy)} emitted tokens that are not the target's "
                                   f"argmax (report: {out})")
    if unsure and not allow_inconclusive:
        raise errors.LauncherError(f"bench: lossless check inconclusive for {'; '.join(unsure)}: nothing "
                                   f"verified there (report: {out}) — fix: check another batch (--lossless), or pass "
                                   "--allow-inconclusive to accept it", errors.INCONCLUSIVE)
