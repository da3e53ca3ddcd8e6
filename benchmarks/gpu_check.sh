#!/usr/bin/env bash
# The GPU check of docs/gpu.md, time-boxed: run from the repository root on a CUDA machine.
#   OUT=folder [DATA_DIR=MNIST's root] [BUDGET_S=450] benchmarks/gpu_check.sh
# Each step gets at most its own limit and what is left of BUDGET_S (a step that would get
# under 10 s is skipped); steps.jsonl says how each ended, log.txt holds all output.
set -u
OUT=${OUT:?set OUT to the folder for the results}
DATA_DIR=${DATA_DIR:-$(cd .. && pwd)/shared/data}
BUDGET=${BUDGET_S:-450}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
start=$(date +%s)

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 left t0 rc
  shift 2
  left=$(( BUDGET - ($(date +%s) - start) ))
  (( left < limit )) && limit=$left
  if (( limit < 10 )); then
    echo "{\"step\": \"$name\", \"skipped\": \"no time left\"}" >> "$OUT/steps.jsonl"
    return
  fi
  echo "== $name (at most ${limit}s)"
  t0=$(date +%s)
  timeout -k 5 "$limit" "$@"
  rc=$?
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $(( $(date +%s) - t0 )), \"limit_s\": $limit}" >> "$OUT/steps.jsonl"
}

{
  step env 60 python -m benchmarks.gpu_check env --out "$OUT/env.json"
  step engine 120 python -m benchmarks.gpu_check engine --out "$OUT/engine.json"
  step tests 90 python -m pytest -q -p no:cacheprovider -n 0 tests/dpsgd/test_sampling_precision.py
  step graphs 120 python -m pytest -q -p no:cacheprovider -n 0 tests/dpsgd/test_cuda_graphs.py \
    tests/dpsgd/test_static_shapes.py
  step dpsgd 180 python -m benchmarks.dpsgd --quick --out "$OUT/dpsgd-gpu.json"
  step memory 90 python -m benchmarks.gpu_check memory --out "$OUT/memory.json"
  step mnist 150 python -m simulations.centralized --dataset mnist --target-epsilon 3 \
    --data-dir "$DATA_DIR" --out "$OUT/mnist-eps3.json"
  step mnist-augmult 150 python -m simulations.centralized --dataset mnist --target-epsilon 3 \
    --augmult 4 --private-normalisation 8 --data-dir "$DATA_DIR" --out "$OUT/mnist-eps3-augmult4-norm8.json"
} 2>&1 | tee "$OUT/log.txt"
