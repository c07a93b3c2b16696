#!/usr/bin/env bash
# One call on a lent CUDA machine (issue 11, item 5): the GPU figures of the torch backend and the
# CUDA tests, one piece at a time, inside a fixed time budget.
#
#   BUDGET=540 bash bench/gpu_session.sh                         # every piece, in this order
#   PIECES="llm-bf16 llm-fp8" BUDGET=540 bash bench/gpu_session.sh
#   PIECES=fused BUDGET=560 bash bench/gpu_session.sh                  # issue 42's decode step (make gpu-wheels first)
#
# Pieces (each with its own time limit; a failing or stopped piece does not stop the next):
#   inductor    bench/gpu_inductor.py: the decode step and the pipeline compiled in-process, CUDA graphs
#               (on an H100: 50 s of setup, 35-70 s a decode format, 280 s for the pipeline with
#               flow and HiFT compiled)
#   fused       the fused kernels' CUDA test, then (if it passes)
#               bench/gpu_inductor.py on the hand-fused Triton step (backends/torch/fused_decode.py): BF16
#               and FP8 weights at batch 1 and 8, the Inductor-compiled BF16 step in the same call as the
#               baseline, the pipeline with the fused LLM step, then three other tilings and INT8
#   bound       bench/decode_bound.py: the eager decode step, growing cache vs CUDA graph (no compile)
#   tests       the `gpu`-marked tests, one pytest run per test so that a stopped run keeps the others
#   llm-bf16    bench/llm_decode.py --formats bf16 (build, then time); llm-fp8, llm-int8 likewise
#   pipeline    bench/pipeline_speed.py on recipes/h100-torch.yaml (build, then time)
#
# The AOTInductor builds of the 0.5B engines, on an H100 machine (16 cores) on 2026-11-25, three
# builders in parallel: model 33 s, LLM export 71 s, its BF16 re-export 108 s, HiFT CUDA package
# 104 s, flow export + BF16 104 s, and the LLM's two CUDA packages unfinished after 180 s. A piece
# that builds 0.5B engines needs most of a 10-minute call on its own; the pieces therefore run one
# after the other, never side by side.
# Logs and result files go to $OUT/session.tgz; the summary is printed last.
set -u
OUT=${OUT:-artifacts/gpu-session}
BUDGET=${BUDGET:-540}
ART=${ART:-/tmp/cosy-art}
PIECES=${PIECES:-inductor tests llm-bf16 pipeline llm-fp8 llm-int8}
LOGS=/tmp/cosy-logs
rm -rf "$LOGS"
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
SUMMARY=$LOGS/summary.txt
note() { echo "$*" | tee -a "$SUMMARY"; }

# run NAME CAP_S CMD...: CMD with a limit of min(CAP_S, time left - 20 s), its output in NAME.log.
run() {
  local name=$1 cap=$2 t s rc
  shift 2
  t=$(($(left) - 20))
  [ "$cap" -lt "$t" ] && t=$cap
  if [ "$t" -lt 15 ]; then note "SKIP $name: no time left"; return 99; fi
  s=$(date +%s)
  timeout -k 5 "$t" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  note "$name: rc=$rc in $(($(date +%s) - s)) s (limit $t s)"
  return $rc
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.get_device_capability())"
  echo "cpus $THREADS"
  python3 -c "import pydantic, onnx, onnxruntime, yaml, soundfile; print('imports ok')"
} >"$LOGS/env.txt" 2>&1
tee -a "$SUMMARY" <"$LOGS/env.txt"

decode() {  # decode FORMAT: build the LLM engine in FORMAT for this GPU, then time it
  run "llm-$1" 480 python3 bench/llm_decode.py --device cuda --formats "$1" --threads "$THREADS" --tokens 64 --min-seconds 0 \
    --artifacts "$ART" && cp "$ART/bench/llm_decode-cuda.json" "$LOGS/llm_decode-cuda-$1.json"
}

for piece in $PIECES; do
  case $piece in
    inductor)
      # The pipeline last: the H100 lease of 2026-11-27 measured it (RTF 0.0631, first chunk 128.5 ms)
      # with the step whose matrices were not merged yet; batch 8 and the AOTInductor package never ran.
      run inductor 420 python3 bench/gpu_inductor.py --device cuda --threads "$THREADS" --artifacts "$ART" \
        --phases decode,format=fp8,batch8,aoti,format=bf16-tuned,pipeline --compile-flow \
        --budget $(($(left) < 420 ? $(left) - 40 : 380))
      cp "$ART/bench/gpu_inductor-cuda.json" "$LOGS/" 2>/dev/null ;;
    fused)
      # The compiled kernels' correctness first (a minute): a failing check leaves the lease for a fix.
      # The split-reduction and dependent-launch check does not gate: those tilings' rows carry their
      # own logit cosine, and the others do not use them.
      run fused-test 110 python3 -m pytest -q -p no:cacheprovider -m gpu -x tests/backends/test_fused_decode.py \
        -k compiled_kernels || { note "fused: kernels failed their CUDA check, bench skipped"; continue; }
      run fused-test-split-pdl 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/backends/test_fused_decode.py \
        -k "dependent_launches or fused_attention"
      # The tilings at batch 1 (the default is the first H200 lease's fastest), then the fastest of
      # them at batch 8, in FP8 and INT8, and in the pipeline.
      sweep=${FUSED_SWEEP:-default,op-split2-pdl,fm-pdl,fm-r24-pdl,fm-r24,fm,f3,f3-pdl-w4,f3-w4-s1,fm-w4,fm-r40,fm-s1}
      run fused 560 python3 bench/gpu_inductor.py --device cuda --threads "$THREADS" --artifacts "$ART" \
        --phases "${FUSED_PHASES:-$(echo "$sweep" | sed 's/\([^,]*\)/format=fused-bf16\/\1@1/g'),format=fused-bf16/best@8,format=fused-fp8/best,pipeline,format=fused-int8/best@1}" \
        --pipeline-llm fused-bf16/best --budget $(($(left) < 560 ? $(left) - 40 : 520))
      cp "$ART/bench/gpu_inductor-cuda.json" "$LOGS/gpu_inductor-cuda-fused.json" 2>/dev/null ;;
    bound)
      run bound 150 python3 bench/decode_bound.py --device cuda --threads "$THREADS" --tokens 48 --artifacts "$ART" \
        && cp "$ART/bench/decode_bound-cuda.json" "$LOGS/" ;;
    tests)
      set -f  # node ids such as test_x[int8] are not file patterns
      for t in $(python3 -m pytest -q --collect-only -m gpu -p no:cacheprovider tests/backends/test_torch.py \
                 tests/families/cosyvoice2/test_llm_static_step.py 2>/dev/null | grep '::'); do
        run "test-$(echo "$t" | sed 's/.*:://; s/[^A-Za-z0-9_.-]/_/g')" 240 python3 -m pytest -q -p no:cacheprovider \
          -o tmp_path_retention_policy=none --tb=short "$t"
      done
      set +f ;;
    llm-*) decode "${piece#llm-}" ;;
    pipeline)
      run pipeline 540 python3 bench/pipeline_speed.py --recipe recipes/h100-torch.yaml --artifacts "$ART" \
        --threads "$THREADS" --cases flow,hift,end_to_end,first_chunk \
        && cp "$ART/bench/pipeline_speed-h100-torch.json" "$LOGS/" ;;
    *) note "unknown piece '$piece'" ;;
  esac
done

note "done at t=$(($(date +%s) - T0)) s"
for f in "$LOGS"/*.log; do
  echo "---- $(basename "$f")"
  grep -E '^\||RTF|quality|passed|failed|Error' "$f" | tail -20
done
echo "---- summary"; cat "$SUMMARY"
tar -czf "$OUT/session.tgz" -C "$LOGS" . 2>/dev/null
