#!/usr/bin/env bash
# One call on a lent CUDA machine (issue 11, item 5): every GPU figure of the torch backend and the
# CUDA tests, inside a fixed time budget, most important first.
#
#   BUDGET=540 bash bench/gpu_session.sh      # on the GPU machine, in the repository root
#
# Phase 1 compiles in parallel (the compiles are CPU-bound and partly single-threaded): the engines
# of recipes/h100-torch.yaml (LLM and flow BF16, HiFT FP32), the LLM decode step in FP8 and INT8,
# and `make test-gpu`'s tests. Phase 2 times, one thing at a time so that nothing else shares the
# GPU: the LLM decode step (bench/llm_decode.py, BF16 then FP8 then INT8) and the end-to-end
# pipeline (bench/pipeline_speed.py). Every piece has its own time limit and a failing piece does
# not stop the others. Logs and result files go to $OUT/session.tgz; the summary is printed last.
set -u
OUT=${OUT:-artifacts/gpu-session}
BUDGET=${BUDGET:-540}
ART=${ART:-/tmp/cosy-art}
LOGS=/tmp/cosy-logs
mkdir -p "$OUT" "$LOGS" "$ART"
T0=$(date +%s)
THREADS=$(nproc)
export PYTHONUNBUFFERED=1

# Python packages the machine's image lacks travel as wheels in .whl/ (make gpu-wheels).
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

left() { echo $((BUDGET - ($(date +%s) - T0))); }
elapsed() { echo $(($(date +%s) - T0)); }
SUMMARY=$LOGS/summary.txt
note() { echo "$*" | tee -a "$SUMMARY"; }

# run NAME CAP_S CMD...: run CMD with a limit of min(CAP_S, time left - RESERVE_S), log to NAME.log.
RESERVE=25
run() {
  local name=$1 cap=$2 t
  shift 2
  t=$(($(left) - RESERVE))
  [ "$cap" -lt "$t" ] && t=$cap
  if [ "$t" -lt 15 ]; then note "SKIP $name: no time left"; return 99; fi
  local s=$(date +%s)
  timeout -k 5 "$t" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  note "$name: rc=$rc in $(($(date +%s) - s)) s (limit $t s, at t=$(elapsed) s)"
  return $rc
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.get_device_capability())"
  echo "cpus $THREADS"; (g++ --version || gcc --version) 2>&1 | head -1
  python3 -c "import pydantic, onnx, onnxruntime, yaml, soundfile; print('imports ok')"
} >"$LOGS/env.txt" 2>&1
cat "$LOGS/env.txt" | tee -a "$SUMMARY"

# ---- phase 1: compile (parallel). Both builders share the model and LLM export steps (the cache's
# per-key locks make one wait for the other); the pipeline builds HiFT and flow first, then finds
# the BF16 LLM engine the decode builder compiled (the same cache key).
(run test-gpu 330 nice -n 10 python3 -m pytest -q -m gpu -p no:cacheprovider -o tmp_path_retention_policy=none \
   tests/backends/test_torch.py tests/models/test_llm_static_step.py) &
P_TEST=$!
(for fmt in bf16 fp8 int8; do
   run "build-llm-$fmt" 360 python3 bench/llm_decode.py --device cuda --formats "$fmt" --artifacts "$ART" --build-only \
     && touch "$LOGS/built-$fmt"
 done) &
P_LLM=$!
run build-pipeline 380 python3 bench/pipeline_speed.py --recipe recipes/h100-torch.yaml --artifacts "$ART" --build-only \
  && touch "$LOGS/built-pipeline"
# Timings must not share the GPU or the CPU: wait for the other compiles, within a bound.
for p in $P_LLM $P_TEST; do
  while kill -0 "$p" 2>/dev/null && [ "$(left)" -gt 230 ]; do sleep 2; done
  if kill -0 "$p" 2>/dev/null; then
    note "stopping pid $p at t=$(elapsed) s to leave time for the timings"
    pkill -f -- "-m pytest -q -m gpu" ; pkill -f -- "-m cosycompile build"; pkill -f -- "--build-only"; kill "$p"
  fi
done
wait 2>/dev/null

# ---- phase 2: time (sequential)
decode() {
  run "decode-$1" "$2" python3 bench/llm_decode.py --device cuda --formats "$1" --threads "$THREADS" --tokens 64 \
    --artifacts "$ART" && cp "$ART/bench/llm_decode-cuda.json" "$LOGS/llm_decode-cuda-$1.json"
}
[ -e "$LOGS/built-bf16" ] && decode bf16 120
[ -e "$LOGS/built-pipeline" ] && run pipeline-h100-torch 200 python3 bench/pipeline_speed.py --recipe recipes/h100-torch.yaml \
  --artifacts "$ART" --threads "$THREADS" --cases flow,hift,end_to_end,first_chunk && cp "$ART/bench/pipeline_speed-h100-torch.json" "$LOGS/"
[ -e "$LOGS/built-fp8" ] && decode fp8 90
[ -e "$LOGS/built-int8" ] && decode int8 90

note "done at t=$(elapsed) s"
for f in "$LOGS"/decode-*.log "$LOGS"/pipeline-*.log; do
  [ -e "$f" ] && { echo "---- $f"; grep -E '^\||RTF|quality|copy throughput|^engines|Error|error' "$f" | tail -30; }
done
echo "---- test-gpu"; tail -15 "$LOGS/test-gpu.log" 2>/dev/null
echo "---- summary"; cat "$SUMMARY"
tar -czf "$OUT/session.tgz" -C "$LOGS" . 2>/dev/null
