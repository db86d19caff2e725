#!/usr/bin/env bash
# The appliance inside vLLM's GPU build on the H200 machine (docs/benchmarks.md, "Inside vLLM on the H200"):
#   bash benchmarks/h200_inside_vllm.sh STEP COMMIT
# after ../shared/gpu/stage.py's pieces are in /tmp/stage (README there) and .gpu/proj holds this
# checkout's wheel and the launcher's two packages the machine lacks (ruamel.yaml, docker). Each STEP is one
# call of at most 10 minutes; results go to $OUT (JSON report + the radiance lines of the engine logs).
set -uo pipefail
step=$1 commit=$2
OUT=${OUT:-/tmp/radiance-out}; mkdir -p "$OUT"
if [ ! -f /tmp/site/vllm/__init__.py ]; then
  cat /tmp/stage/part.* | tar -x -C /tmp && rm -f /tmp/stage/part.* || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/gpu-wheels/*.whl || exit 1
fi
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/proj "${WHEELS:-.gpu/proj}"/*.whl || exit 1
# The checkout first (its models/ and data are found from the package), the staged vLLM before the image's torch,
# the wheel's metadata for the plugin's entry point.
export PYTHONPATH=$PWD:/tmp/site:/tmp/proj VLLM_USE_FLASHINFER_SAMPLER=0 RADIANCE_HOME=/tmp/rh PYTHONUNBUFFERED=1
bench() { timeout "${LIMIT:-540}" python3 -m launcher bench --commit "$commit" "$@"; echo "bench rc=$?"; }
logs() { grep -h -E "radiance|Error|error:|Traceback|AOT|compil|declin|latched" /tmp/rh/reports/*"$1"*-logs/*.log \
           2>/dev/null | grep -v -E "DeprecationWarning|warnings.warn" | cut -c1-400 | tail -n 400 > "$OUT/$1.log"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
case "$step" in
  tiny1)  # stock, then patched (draft-side; + int4-head), then stock again: one machine, nothing cleared
    bench profiles/tiny-gpu.yaml --sets stock,no-int4_head,all,stock@v1 --batch 1,8,32 --max-tokens 128 \
      --out /tmp/rh/reports/tiny1.json; cp /tmp/rh/reports/tiny1.json "$OUT/"; logs tiny1 ;;
  tiny2)  # vLLM's default runner; a planted violation; the head at verification rows
    bench profiles/tiny-gpu.yaml --sets stock@v2 --batch 1,8,32 --max-tokens 128 --out /tmp/rh/reports/tiny2.json
    cp /tmp/rh/reports/tiny2.json "$OUT/"; logs tiny2
    LIMIT=150 bench profiles/tiny-gpu.yaml --sets stock --batch 8 --max-tokens 64 --lossless 8 \
      --engine-env PYTHONPATH="$PWD/tests/e2e/plant_accept_all:$PYTHONPATH" --out /tmp/rh/reports/planted.json
    cp /tmp/rh/reports/planted.json "$OUT/"
    timeout 120 python3 benchmarks/bench_int4_head_rows.py --commit "$commit" --json "$OUT/int4_head_rows.json" \
      > /dev/null ;;
  big1) bench profiles/qwen3.5-27b-dummy-tp1.yaml --sets stock,all,only-int4_head --batch 1,8,32 --max-tokens 64 \
          --out /tmp/rh/reports/big1.json; cp /tmp/rh/reports/big1.json "$OUT/"; logs big1 ;;
  big2) bench profiles/qwen3.5-27b-dummy-tp1.yaml --sets only-dynamic_draft,only-w4_drafter,stock@v2 --batch 1,8,32 \
          --max-tokens 64 --out /tmp/rh/reports/big2.json; cp /tmp/rh/reports/big2.json "$OUT/"; logs big2 ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
ls -la "$OUT"
