#!/usr/bin/env bash
# The appliance inside vLLM's GPU build on the H200 machine (docs/benchmarks.md, "Inside vLLM on the H200"):
#   bash benchmarks/h200_inside_vllm.sh STEP COMMIT [SETS] [extra radiance bench options]
# STEP: tiny | planted | big | headscale (one call each) | table-start, then table-poll until it prints the bench's exit code
# after ../shared/gpu/stage.py's pieces are in /tmp/stage (README there) and .gpu/proj holds this
# checkout's wheel, the launcher's two packages the machine lacks (ruamel.yaml, docker) and, for the steps that
# start vLLM's OpenAI server (headscale: the gate), what its router imports and the staged wheels leave out
# (`pip download --no-deps model_hosting_container_standards jmespath supervisor`). Each STEP is one
# call of at most 10 minutes; results go to $OUT (JSON report + the radiance lines of the engine logs).
# Staging takes half the calls when this checkout's own files do not travel beside each piece (every call
# carries the tracked tree, ~34 MiB): `git rm -r -q --cached . && echo '*' >> .git/info/exclude`, then
# `python3 ../shared/gpu/stage.py --out .gpu/s` (61 MiB pieces: 21 instead of 48, ~4.5 s a call), and
# `git reset -q` + the old exclude file before the run calls. The files stay on disk throughout.
# Issue 37's next table (docs/benchmarks.md, thirteenth to nineteenth sessions): every set on the runner
# `radiance up` gives it (V2), each 27B-shaped engine started once and kept, all asleep but the one measured
# (--keep-reference --take-turns: vLLM's sleep mode at level 2, the dummy weights drawn again on waking), at the
# profile's 0.9: at 0.47 beside stock an engine holds ~22 requests, not B = 32 (eighteenth session), and level 1
# parks 51 GiB of weights an engine in host memory, which killed the second engine on this 125 GiB host
# (nineteenth session). A sleeping engine kept 1.73 GiB of the device at level 1 (its context, what vLLM
# allocates outside its sleep pool): four engines leave the last one ~2 GiB above its 0.9 on an H100, five
# only ~0.5 GiB, so on an H100 the table is stock and the three features alone (int4-head alone is also the
# flagship as shipped), and an H200 takes the combined set as a fifth. With the autotuning verdicts carried (below): stock ~140 s, each
# set ~100 s, a measurement of 3 profiles x 3 batches ~40 s, a switch a few seconds (not yet measured): ~1050 s
# after staging for four engines and three rounds:
#   table-start COMMIT "stock,only-int4_head,only-dynamic_draft,only-w4_drafter" --keep-reference --take-turns
#     --rounds 3 --repeat 1 + the three --acceptance profiles + the kernel-config arg   (carry .gpu/proj .gpu/cache)
# Level 2 has not yet run on a device: the first table-poll should show each engine's "sleep took" and the
# first "wake took" lines. Should the wake or the redraw fail, every set says so in the report; what is left of
# the session then goes to fresh engines (no --keep-reference), --rounds 1: ~140 s a set after stock's start.
# Where failed starts have eaten the device time (the twentieth session's did: 1501 s), fewer sets with what
# is left after staging: ~650 s "stock,only-dynamic_draft" --rounds 3; ~400 s "stock,only-int4_head"
# --rounds 1, which proves the level-2 path (sleep, wake, redraw, measure) with one unrepeated pair. The
# report is rewritten after every measured pair, so WATCH can be what is left less ~30 s: a call cut short
# keeps each pair it measured.
# Twenty-first session (H100): that table ran, level 2 and all (start call 560 s, one poll 362 s; sleep 0.1-1.5 s,
# wake 0.25-0.52 s), and the fault it showed (the synthetic rates lost over a level-2 sleep) is fixed. Next,
# issue 37's fourth point with dynamic-draft's rebuilt estimate, the same options and ~920 s after staging:
#   table-start COMMIT "stock,only-dynamic_draft,stock/k1,stock/k2" ... (an H200 adds stock/k3 as a fifth set)
# then, with ~400 s left, "stock,dynamic_draft+w4_drafter+int4_head" --rounds 1. Four of that session's
# dynamic-draft B = 8 runs stepped at 177-270 ms throughout (23-28 ms otherwise): with
# --vllm-arg enable-logging-iteration-details=true (every set alike; logging only) each poll leaves every step's
# time and tokens in $OUT/steps-SET.log.gz, to say whether the steps themselves are slow or the engine waits
# between them.
# Twenty-second session (H100; ~850 s lost to starts that failed): "stock,only-dynamic_draft,stock/k1" with
# those options, 580 s + a 92 s poll after staging. The rebuilt estimate holds depth 4 code-like (1.00x / 0.95x /
# 1.01x stock); the stall is the engine idle ~10 s between two runs (docs/benchmarks.md). Next:
#   table-start COMMIT "stock,only-dynamic_draft,stock/k2,stock/k3" --rounds 4 ... (~1100 s after staging),
# then what is left to "stock,dynamic_draft+int4_head" --rounds 3.
# Twenty-third session: the stall's likeliest cause is a Triton kernel compiled on first use (a new depth gives
# new token counts, and Triton specializes on them); the bench left vLLM's JIT warm-up off, and with it vLLM's
# JIT monitor, which logs "... during inference" for each compile or autotune after warm-up. So every set now
# runs at that default (no kernel-config arg), and one table takes issue 37's fourth point in one call, at the
# two cited acceptance profiles (acceptance 0 left out for time), six engines at 0.85 (a sleeping engine keeps
# ~1.73 GiB: six at 0.9 would not fit an H100):
#   table-start COMMIT "stock,only-dynamic_draft,stock/k1,stock/k2,stock/k3,dynamic_draft+int4_head"
#     --keep-reference --take-turns --rounds 3 --repeat 1 + the two --acceptance profiles
#     --vllm-arg gpu-memory-utilization=0.85 --vllm-arg enable-logging-iteration-details=true
# It ran (H100, ~850 s lost to starts that failed) as "stock,only-dynamic_draft" --rounds 4 alone: 566 s + a 42 s
# poll after staging (the JIT warm-up: 34 s of the first engine's start, 10 s of the second). No stall in 24
# cells; code-like B = 8 0.89x, its host share per step ~3.4 ms over stock's (docs/benchmarks.md). Next, first
# whether dynamic-draft's path costs that at stock's own depth (~650 s), then the plan above:
#   table-start COMMIT "stock,only-dynamic_draft" --rounds 4 ... --engine-env RADIANCE_DRAFT_PIN_DEPTH=4
# Twenty-fourth session: 64 tokens a request is ~16 decode steps a run, too few to tell 3 ms a step from the
# prefill subtracted and the tail; and the pinned path belongs beside the unpinned one in the same call. So three
# sets, the third dynamic-draft pinned at stock's depth (a set's own env: SET:NAME=VALUE), 192 tokens, 3 rounds
# (~37 s a set and round at 64 tokens, 21 of them the wake and the weights drawn again: ~1000 s after staging):
#   table-start COMMIT "stock,only-dynamic_draft,dynamic_draft" --keep-reference --take-turns --rounds 3
#     --repeat 1 --max-tokens 192 + the two --acceptance profiles --vllm-arg enable-logging-iteration-details=true
#     --engine-env dynamic_draft:RADIANCE_DRAFT_PIN_DEPTH=4 --vllm-arg cudagraph-metrics=true
# (the last: vLLM's table of the graph each step replayed, FULL / PIECEWISE / NONE by token count, every ~10 s:
# a depth the target or the drafter has no full graph for would show there, kept with the step lines)
# No machine came that session (1306 s of failed starts). Fit to what is left after staging: with ~900 s the
# above at --max-tokens 128 and the code-like profile alone (~37 s a set and round, 3 rounds + ~420 s of starts);
# with ~550 s "stock,dynamic_draft" alone, the pinned set against stock; prose-like again once these agree.
# Below ~450 s after staging measure nothing: that session's last 494 s got an H100, and one engine alone was
# still loading at 262 s (the bench's start ~30 s, vLLM's engine core 2 min after it, then load and capture).
# Twenty-sixth session: V2's graph table sent some of dynamic-draft's tail steps piecewise (a step between two
# capture sizes missed its depth's full graph); dynamic-draft now widens it (radiance/draft/patch_graphs.py), so
# the pinned set above replays stock's graphs and measures the rest of the path. Same call, that tree's commit.
# A machine can be taken back mid-call ("taken back for other work"): nothing of that call's $OUT comes back.
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
# Triton keeps its autotuning verdicts on disk: each engine after the first skips the GDN kernels' sweeps
# (~110 s of a cold start on this machine), which is most of what one call can spend.
export TRITON_CACHE_AUTOTUNING=1
# ...and a fresh machine need not sweep either: every call leaves the verdicts (*.autotune.json, a few KB;
# Triton keys each by its version, the target, the kernel's source and the tuning key, so a verdict from
# another Triton or GPU architecture is never read) in $OUT/triton-autotune.tgz. Copied to .gpu/cache/ here
# and carried (carry [".gpu/proj", ".gpu/cache"]), the next machine starts with them: the eighteenth
# session's stock engine spent 104 s of its 343 s start in its first profiling run, the next engine 1.6 s.
# Verdicts change which kernel configuration runs, never what it computes, and every set of a call reads the same.
TRITON_CACHE=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
if [ -f .gpu/cache/triton-autotune.tgz ]; then
  mkdir -p "$TRITON_CACHE" && tar -xzf .gpu/cache/triton-autotune.tgz -C "$TRITON_CACHE" \
    && echo "triton autotune verdicts carried in: $(tar -tzf .gpu/cache/triton-autotune.tgz | grep -c autotune.json)"
fi
save_verdicts() { [ -d "$TRITON_CACHE" ] && (cd "$TRITON_CACHE" && find . -name '*.autotune.json' | tar -czf "$OUT/triton-autotune.tgz" -T -) 2>/dev/null; }
trap save_verdicts EXIT
bench() { timeout "${LIMIT:-$((565 - SECONDS))}" python3 -m launcher bench --commit "$commit" "$@"; echo "bench rc=$?"; }
logs() { grep -h -E "radiance|Error|error:|Traceback|AOT|compil|declin|latched|took|takes|Capturing|captur|autotun|profil|KV cache|Loading|backend|[Aa]sync|schedul" \
           /tmp/rh/reports/*"$1"*-logs/*.log 2>/dev/null | grep -v -E "DeprecationWarning|warnings.warn|replaced vllm" \
           | cut -c1-400 | tail -n 600 > "$OUT/$1.log"; }
# the planted violation (every draft accepted, tests/e2e/plant_accept_all) on the sets in $1: the check must fail
planted() { bench profiles/tiny-gpu.yaml --sets "$1" --batch 8 --max-tokens 64 --lossless 8 "${@:2}" \
              --engine-env PYTHONPATH="$PWD/tests/e2e/plant_accept_all:$PYTHONPATH" --out "$OUT/planted.json"; }
# the engine logs out of $OUT (only reports come back whole) to where logs() reads them; $1: a glob prefix
move_logs() { mkdir -p /tmp/rh/reports; for d in "$OUT"/$1-logs; do [ -d "$d" ] && mv "$d" /tmp/rh/reports/; done; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
case "$step" in
  tiny)  # stock and draft-side, timed 3x and re-scored at B = 1 and 8; then a planted violation (every draft accepted).
    # Extra options (e.g. --vllm-arg async-scheduling=false, without which dynamic-draft declines) go to both,
    # so that the planted engine reuses stock's compiled graphs; the planted run keeps the call's last 120 s.
    sets=${3:-stock,no-int4_head}
    LIMIT=$(( ${PLANTED:-1} != 0 ? 445 - SECONDS : 565 - SECONDS )) bench profiles/tiny-gpu.yaml --sets "$sets" --batch 1,8,32 \
      --max-tokens 128 --repeat 3 "${@:4}" --out "$OUT/tiny-${sets//[,@+\/]/_}.json"
    # PLANTED=0 leaves the planted run out (the call's time then goes to the timed sets: LIMIT 565).
    if [ "${PLANTED:-1}" != 0 ]; then
      LIMIT=$((565 - SECONDS)) planted stock "${@:4}"
    fi
    move_logs '*'
    logs "tiny-${sets//[,@+\/]/_}"; logs planted ;;
  planted)  # the planted violation alone (every draft accepted), on each runner named: the check must fail
    # (bench exit 1, violations in every set) on V2, the runner vLLM picks on GPUs, and on V1
    planted "${3:-stock,stock@v1}" "${@:4}"
    move_logs '*'
    logs planted ;;
  big)  # Qwen3.5-27B shapes, random weights: per-step cost of stock and each single-GPU feature on its runner.
    # The report is rewritten after each set, straight into $OUT: a call that runs out keeps what it measured.
    sets=${3:-stock,only-int4_head,only-w4_drafter}
    bench profiles/qwen3.5-27b-dummy-tp1.yaml --sets "$sets" --batch 1,8,32 --max-tokens 64 --repeat 3 \
      --lossless none "${@:4}" --out "$OUT/big-${sets//[,@+\/]/_}.json"
    move_logs 'big-*'; logs big ;;
  table-start|table-poll)  # one bench longer than a call: started in its own session (the machine keeps it
    # running between calls, README of the device tool), then watched by back-to-back calls; each call copies
    # the report as it stands (rewritten after every set) and the engine logs' radiance lines into $OUT.
    mkdir -p /tmp/table
    if [ "$step" = table-start ]; then
      sets=${3:?sets}
      # its own copy of the checkout: a later call's copy of the tree may be rewritten under a running bench
      # (the copy's git metadata is stale: git ls-files would miss files added since)
      rm -rf /tmp/table && mkdir -p /tmp/table/src && cp -r launcher radiance models profiles benchmarks pyproject.toml /tmp/table/src/
      { printf 'cd /tmp/table/src && export PYTHONPATH=/tmp/table/src:%q && exec python3 -m launcher bench ' "$PYTHONPATH"
        printf 'profiles/qwen3.5-27b-dummy-tp1.yaml --commit %q --sets %q ' "$commit" "$sets"
        printf '%q ' --batch 1,8,32 --max-tokens 64 --repeat 3 --lossless none "${@:4}" --out /tmp/table/report.json
        printf '> /tmp/table/bench.log 2>&1\n'; } > /tmp/table/run.sh
      cat /tmp/table/run.sh
      setsid nohup bash -c 'bash /tmp/table/run.sh; echo $? > /tmp/table/rc' < /dev/null > /dev/null 2>&1 &
    fi
    # the report is copied at every look: a call cut short (the session's device time spent) keeps it
    while [ ! -f /tmp/table/rc ] && [ "$SECONDS" -lt "${WATCH:-540}" ]; do
      sleep 10; cp /tmp/table/report.json "$OUT/" 2>/dev/null; save_verdicts
    done
    cp /tmp/table/report.json "$OUT/" 2>/dev/null; tail -n 60 /tmp/table/bench.log; cat /tmp/table/rc 2>/dev/null
    grep -h -E "radiance|Error|Traceback|declin|latched|took|KV cache|[Aa]sync|during inference|JIT monitor|utotun" /tmp/table/report-logs/*.log 2>/dev/null \
      | grep -v -E "DeprecationWarning|warnings.warn" | cut -c1-300 | tail -n 400 > "$OUT/table.log"
    # vLLM's per-step lines (--vllm-arg enable-logging-iteration-details=true), each set's apart and compressed:
    # a step's time and tokens beside the bench's "B=..." lines, for runs whose steps are slow throughout; and
    # vLLM's JIT monitor (on with its default JIT warm-up): a kernel compiled or autotuned while serving, in time
    for f in /tmp/table/report-logs/*.log; do
      [ -f "$f" ] && grep -h -E "Iteration\(|radiance bench:|during inference|utotun|CUDAGraph|^\| " "$f" | gzip > "$OUT/steps-$(basename "$f" .log).log.gz"
    done ;;
  headscale)  # issue 38: the gate's target check against int4-head's plan forced to 4-bit up to 40 rows on the
    # trained tiny model (benchmarks/gate_head_scale.sh says what each of its three runs expects)
    bash benchmarks/gate_head_scale.sh profiles/tiny-gpu.yaml "${3:-40}"; echo "headscale rc=$?" ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
ls -la "$OUT"
