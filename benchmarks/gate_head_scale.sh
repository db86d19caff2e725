#!/usr/bin/env bash
# Issue 38's GPU point on one machine: the gate's target check scores the head decode serves. int4-head's plan
# is forced to "4-bit up to ROWS rows per call, bf16 above" (what the H200 chose for Qwen3.5-27B's head; the
# trained tiny model's own head is declined by the speed rule on a GPU) with the test-only plant
# tests/e2e/plant_head_scale; then
#   1. `radiance gate --record-reference`: the stock reference, on this machine (features off);
#   2. `radiance up --gate-only` with the undamaged 4-bit head: expected to pass (exit 0);
#   3. the same with every output row's first group scale x2 in the 4-bit head: expected to fail its target
#      check (exit 3). If prompt logprobs scored the bf16 head kept above ROWS rows, 3 would pass.
# Usage: bash benchmarks/gate_head_scale.sh [BASE_PROFILE] [ROWS]   (default profiles/tiny-gpu.yaml, 40)
# EAGER=1 serves all three without torch.compile and CUDA graphs: the head's plan and the scoring path are the
# same, and a fresh GPU machine is spared the tiny model's cold compile (for a call beside a longer run).
# Results (the gate reports, the reference, a summary) go to $OUT. Runs on a CPU too (profiles/tiny-cpu.yaml),
# where the plan is forced the same way; `benchmarks/h200_inside_vllm.sh headscale` runs it on the GPU machine.
set -uo pipefail
base=${1:-profiles/tiny-gpu.yaml} rows=${2:-40}
OUT=${OUT:-/tmp/radiance-out}; mkdir -p "$OUT"
work=$(mktemp -d)
export RADIANCE_HOME=${RADIANCE_HOME:-$work/home}
python3 - "$base" "$work" "$rows" "$PWD/tests/e2e/plant_head_scale" <<'EOF' || exit 1
import os, sys
from pathlib import Path
import yaml
base, work, rows, plant = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
data = yaml.safe_load(Path(base).read_text())
data["name"] = f"{data['name']}-headscale"   # both runs share the reference recorded under this name
gate = data.setdefault("gate", {})
target = gate.setdefault("target", {})
target["enabled"] = True
target.setdefault("max_nll_increase", 0.02)       # the tiny profiles' bounds (profiles/tiny-cpu.yaml)
target.setdefault("min_prefix_agreement", 0.2)
gate.setdefault("speed", {})["enabled"] = False  # a forced 4-bit head on a head this small is slower by design
gate.setdefault("gsm8k", {})["enabled"] = False
if os.environ.get("EAGER") == "1":
    data.setdefault("vllm_args", {})["enforce-eager"] = True
env = data.setdefault("env", {})
env.update(E2E_INT4_HEAD_ROWS=rows, PYTHONPATH=os.pathsep.join(filter(None, [plant, os.environ.get("PYTHONPATH")])))
(work / "ok.yaml").write_text(yaml.safe_dump(data))
env["E2E_HEAD_SCALE_ERROR"] = "2.0"
(work / "planted.yaml").write_text(yaml.safe_dump(data))
EOF
t0=$SECONDS
python3 -m launcher gate "$work/ok.yaml" --record-reference; rec=$?
python3 -m launcher up "$work/ok.yaml" --gate-only; ok=$?
python3 -m launcher up "$work/planted.yaml" --gate-only; planted=$?
cp "$RADIANCE_HOME"/references/*-headscale.json "$OUT/" 2>/dev/null
n=0; for f in $(ls -t "$RADIANCE_HOME"/reports/*.json 2>/dev/null | head -n 2); do n=$((n + 1)); cp "$f" "$OUT/gate_$n.json"; done
grep -H "int4-head" "$RADIANCE_HOME"/deployments/*/engine.log* 2>/dev/null | cut -c1-400 | head -n 20 > "$OUT/int4_head.log"
summary="record-reference rc=$rec (0 expected), undamaged rc=$ok (0 expected), planted rc=$planted (3 expected), $((SECONDS - t0)) s"
echo "$summary" | tee "$OUT/summary.txt"
# one result document: each gate run's verdict and target check, beside what ran them
python3 - "$OUT" "$base" "$rows" "$rec" "$ok" "$planted" "${COMMIT:-$(git rev-parse HEAD 2>/dev/null)}" <<'PY' || true
import json, os, platform, sys
from datetime import datetime, timezone
from pathlib import Path
out, base, rows, rec, ok, planted, commit = sys.argv[1:8]
runs = {}
for name, f in (("planted", "gate_1.json"), ("undamaged", "gate_2.json")):  # newest first: planted ran last
    p = Path(out, f)
    if p.exists():
        d = json.loads(p.read_text())
        runs[name] = {"passed": d.get("passed"), "profile": d.get("context", {}).get("profile"),
                      "target": next((c for c in d["checks"] if c["name"] == "target"), None)}
try:
    import torch
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({platform.machine()})"
except Exception:
    device = "unknown"
doc = {"kind": "gate_head_scale", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
       "commit": commit, "device": device, "profile": base, "forced_w4_max_rows": int(rows),
       "enforce_eager": os.environ.get("EAGER") == "1",
       "exit_codes": {"record_reference": int(rec), "undamaged": int(ok), "planted": int(planted)},
       "expected": {"record_reference": 0, "undamaged": 0, "planted": 3}, "runs": runs}
Path(out, "head_scale.json").write_text(json.dumps(doc, indent=1))
PY
[ "$rec" = 0 ] && [ "$ok" = 0 ] && [ "$planted" = 3 ]
