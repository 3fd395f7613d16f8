#!/usr/bin/env bash
# The README's recipe comparisons on registry-mix, end to end: `small` dense under six recipes (two
# seeds for bf16, ufp4, e2m1) and the RHT/SR ablation of ufp4, `moe-small` under bf16/ufp4/e2m1
# (analysis.sweep's studies recipes-small and recipes-moe-small, eager, side by side on the GPUs),
# then the operand study on the trained bf16 model and the BF16-relative loss errors with plots.
#   scripts/science.sh [DATA_DIR] [OUT_DIR] [GPUS] [JOBS_PER_GPU]
#   scripts/science.sh data/registry-mix runs/science 0,1 4
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-data/registry-mix}; out=${2:-runs/science}; gpus=${3:-0}; jobs=${4:-4}
py=${PYTHON:-python}

"$py" -m analysis.sweep --study recipes-moe-small,recipes-small --out "$out" --gpus "$gpus" --jobs "$jobs" \
    --set data.dir="$data" --set train.compile=false
"$py" -m analysis.analyze tensors --ckpt "$out/recipes-small/bf16-s1337/ckpt.pt" --out "$out/tensors"
"$py" -m analysis.analyze chain --ckpt "$out/recipes-small/bf16-s1337/ckpt.pt" --out "$out/chain"
"$py" -m analysis.compare "$out"/recipes-small/*/ --baseline "$out"/recipes-small/bf16-s*/ --last 100 \
    --out "$out/compare-small"
"$py" -m analysis.compare "$out"/recipes-moe-small/*/ --baseline "$out"/recipes-moe-small/bf16-s1337/ --last 100 \
    --out "$out/compare-moe-small"
