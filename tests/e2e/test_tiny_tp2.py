"""The seeds' deployment in miniature, for real: `radiance up profiles/tiny-cpu-tp2.yaml` (the trained tiny
Qwen3.5 at TP=2 on vLLM CPU, all four patches on), then the same profile with features turned off, each
served once and asked the same greedy questions through the gateway, alone and 8 at a time.

* all four on: ready, the gate passed with the profile's calibrated thresholds, `radiance status --json`
  lists the four features applied, and the fp8-stream install line counts the fused sites;
* dynamic-draft + w4-drafter are draft-side: turning both off must not change one token ("all" against
  "target_only");
* fp8-stream against the same radiance_fp8 linears without the contract must not change one token either
  ("target_only" against "int4_only": the epilogue and the stock path quantise with the same arithmetic).
Three servers prove the two pairs by sharing "target_only". How far int4-head moves the greedy path is a
measurement, not an assertion: the gate's target check decides it, and `tools/target_calibration.py`
measures it per feature set (benchmarks/results/target_check_tiny_2026-12-02.json).
The comparison servers skip the gate (`--skip-gate`): what they are for is their tokens.

One more server runs all four with three faults injected (tests/e2e/inject_fault: a sitecustomize on the
engine's PYTHONPATH, set through that variant's profile env and so in no other process, launcher or
production), one bring-up for all three:
* dynamic-draft's depth policy raises in the engine core: the scheduler every rank follows goes back to the
  configured depth, and `radiance status` says so for every rank;
* fp8-stream's epilogue raises on TP rank 0 mid-forward: every rank turns the stream off together at the
  same forward (the fault rides the next forward's first all-reduce);
* the fused two-rank all-reduce op returns a wrong sum on TP rank 1: its load-time self-test finds it and
  it is off on both ranks, one line each saying why.
No hang (each request is bounded), no split: the server keeps serving the same tokens, and `radiance
status` names the rank that faulted.
"""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from .conftest import REPO, start

pytestmark = pytest.mark.e2e
PROFILE = REPO / "profiles" / "tiny-cpu-tp2.yaml"
MAX_TOKENS = 48
PROMPTS = {
    "code": ["def f0(x):\n    return x + 0\n\ndef f1(x):\n    return x + 1\n\ndef f2(x):\n",
             "import json\nimport os\nimport sys\n\n\ndef main(argv=None):\n"],
    "json": ['[{"id": 1, "name": "a", "ok": true}, {"id": 2, "name": "b", "ok": true}, {"id": 3, "name": ',
             '{"users": [{"name": "x", "age": 3}, {"name": "y", "age": 4}, {"name": "z", "age": '],
    "prose": ["Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
              "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
              "The quick brown fox jumps over the lazy dog. The quick brown fox"],
}
FLAT = [p for kind in PROMPTS.values() for p in kind]
VARIANTS = {  # name -> features turned off (the rest as the profile ships them)
    "all": {},
    "target_only": {"dynamic_draft": False, "w4_drafter": False},
    "int4_only": {"dynamic_draft": False, "w4_drafter": False, "fp8_stream": False},
}
FAULT_ENV = {"E2E_DRAFT_FAULT_AFTER": "40",
             # 7 epilogues a forward: past the load's dummy runs, inside the first prompts
             "E2E_FP8_FAULT_RANK": "0", "E2E_FP8_FAULT_AFTER": "200",
             "E2E_FUSED_AR_PLANT_RANK": "1",
             "PYTHONPATH": str(Path(__file__).resolve().parent / "inject_fault")}


def _variant_profile(tmp: Path, name: str, off: dict, profile: Path = PROFILE, env: dict | None = None) -> Path:
    data = yaml.safe_load(profile.read_text())
    data["name"] = f"{data['name']}-{name}".replace("_", "-")
    for feature, value in off.items():
        data["features"][feature] = value
    if env:  # the engine's environment only (the profile's env:), never the launcher's
        data.setdefault("env", {}).update(env)
    path = tmp / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _complete(base: str, prompt: str, model: str = "tiny-tp2") -> list[int]:
    r = httpx.post(base + "/v1/completions", timeout=300, json={
        "model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True})
    r.raise_for_status()
    return list(r.json()["choices"][0]["token_ids"])


def _serve(tmp_root: Path, name: str, off: dict, profile: Path = PROFILE, model: str = "tiny-tp2",
           engine_env: dict | None = None) -> dict:
    """Bring the profile (with ``off`` turned off; those variants, and any with ``engine_env``, skip the
    gate) up once, ask every prompt alone and then all at once, read its status and engine log, take it
    down."""
    env = dict(engine_env or {})
    if "PYTHONPATH" in env and os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] += os.pathsep + os.environ["PYTHONPATH"]
    path = profile if not (off or env) else _variant_profile(tmp_root, name, off, profile, env)
    args = () if not (off or env) else ("--skip-gate",)
    dep = start(tmp_root / name, str(path), args=args)
    try:
        assert dep.up.returncode == 0, f"{name}: radiance up exited {dep.up.returncode}:\n{dep.up.stdout}\n" \
                                       f"{dep.up.stderr}"
        alone = [_complete(dep.base, p, model) for p in FLAT]
        with ThreadPoolExecutor(8) as pool:
            batch = list(pool.map(lambda p: _complete(dep.base, p, model), FLAT))
        status = dep.status()
        log = Path(dep.state()["engine_log"]).read_text()
        return {"alone": alone, "batch": batch, "status": status, "log": log}
    finally:
        dep.down()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    if not (REPO / "models" / "tiny-qwen3.5-trained" / "model.safetensors").exists():
        pytest.skip("the trained tiny Qwen3.5 is not in models/")
    root = tmp_path_factory.mktemp("tiny-tp2")
    out = {name: _serve(root, name, off) for name, off in VARIANTS.items()}
    out["fault"] = _serve(root, "fault", {}, engine_env=FAULT_ENV)
    return out


def _prefix_agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, list[int | None]]:
    same = total = 0
    first = []
    for x, y in zip(a, b):
        total += len(x)
        d = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None)
        first.append(d)
        same += len(x) if d is None else d
    return same / total, first


def test_all_four_applied_and_the_gate_passed(served):
    st = served["all"]["status"]
    assert st["ready"] is True and st["gate"]["passed"] is True, json.dumps(st["gate"])[:2000]
    patches = {p["feature"]: p["status"] for p in st["patches"] if p["feature"]}
    for feature in ("dynamic_draft", "w4_drafter", "int4_head", "fp8_stream"):
        assert patches.get(feature) == "applied", (feature, patches)
    log = served["all"]["log"]
    installed = [ln for ln in log.splitlines() if "radiance: fp8-stream installed:" in ln]
    assert len(installed) == 2, log[-3000:]  # one line per TP rank
    # 4 layers: every layer's post-attention site, layers 1-3's input sites; the last down_proj feeds
    # model.norm (and the MTP drafter) as stock.
    assert all("3 input + 4 post-attention epilogues over 4 layers (7 all-reduces fused)" in ln
               for ln in installed), installed
    assert "w4-drafter converted 4 drafter linears" in log and "int4-head: lm_head" in log
    assert "latched off" not in log
    proved = [ln for ln in log.splitlines() if "fused two-rank all-reduce epilogue proved itself" in ln]
    assert len(proved) == 2 and all("bit for bit against gloo at M=1, 5, 64" in ln for ln in proved), proved
    assert "epilogue is off" not in log


def test_draft_side_features_are_lossless(served):
    for mode in ("alone", "batch"):
        got, want = served["all"][mode], served["target_only"][mode]
        diff = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
        assert all(len(t) == MAX_TOKENS for t in got + want)
        assert not diff, f"{mode}: prompts {diff} changed with dynamic-draft + w4-drafter on"


def test_fp8_stream_equals_the_stock_fp8_path(served):
    for mode in ("alone", "batch"):
        agree, first = _prefix_agreement(served["target_only"][mode], served["int4_only"][mode])
        assert agree == 1.0, f"{mode}: fp8-stream changed the greedy path (first differing token per " \
                             f"prompt: {first})"


def test_a_fault_in_the_depth_policy_turns_dynamic_draft_off_for_every_rank(served):
    got = served["fault"]
    for mode in ("alone", "batch"):  # still serving, and the target still decides every token
        assert got[mode] == served["target_only"][mode], mode
    log = got["log"]
    assert "injected fault (test) after 40 steps" in log, log[-3000:]
    latched = [ln for ln in log.splitlines() if "dynamic_draft latched off at run time" in ln]
    assert len(latched) == 1, latched  # one scheduler, one latch
    patches = {p["feature"]: p for p in got["status"]["patches"] if p["feature"]}
    row = patches["dynamic_draft"]
    assert row["status"] == "failed-at-runtime", row
    assert "engine core" in row["reason"] and "injected fault" in row["reason"], row
    assert row["ranks"] == [0, 1] or row["ranks"] == ["0", "1"], row
    assert got["status"]["ready"] is True


def test_a_fault_in_fp8_stream_on_one_rank_turns_it_off_on_every_rank_together(served):
    got = served["fault"]
    log = got["log"]
    assert "injected fault (test) after 200 fp8-stream epilogues" in log, log[-3000:]
    latched = [ln for ln in log.splitlines() if "fp8_stream latched off at run time" in ln]
    assert len(latched) == 2, latched  # rank 0 with its fault, rank 1 told by the all-reduce
    assert any("fault on TP rank 0 at forward" in ln and "injected fault" in ln for ln in latched), latched
    assert any("TP rank(s) 0 faulted at forward" in ln for ln in latched), latched
    forwards = {ln.split(" at forward ")[1].split(":")[0].split(";")[0] for ln in latched}
    assert len(forwards) == 1, latched  # the same forward on both ranks
    row = next(p for p in got["status"]["patches"] if p["feature"] == "fp8_stream")
    assert row["status"] == "failed-at-runtime", row
    assert "rank 0: fault on TP rank 0" in row["reason"] and "rank 1: TP rank(s) 0 faulted" in row["reason"], row
    # the outputs: test_a_fault_on_one_rank_turns_dynamic_draft_off_on_every_rank_together compares them


def test_a_planted_all_reduce_difference_turns_the_fused_epilogue_off_on_both_ranks(served):
    log = served["fault"]["log"]
    why = "(rank 1: M=1: sum (new residual): 1 of 256 differ against gloo's all-reduce + add_rms_quant)"
    off = [ln for ln in log.splitlines()
           if "radiance: fp8-stream: the fused two-rank all-reduce epilogue is off on every rank" in ln]
    assert len(off) == 2 and all(why in ln for ln in off), off  # one line per rank, the same verdict
    installed = [ln for ln in log.splitlines() if "radiance: fp8-stream installed:" in ln]
    assert len(installed) == 2 and all(why in ln for ln in installed), installed  # and the outcome says it
    assert "proved itself" not in log
