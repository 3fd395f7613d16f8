#!/usr/bin/env bash
# One batch of a recipe study (docs/STUDIES.md), end to end: the runs of a named study of
# analysis.sweep, several side by side on each GPU, paired by seed, each leaving its compact log in
# RESULTS/logs/<study>/; then the comparison with intervals and the power step (seeds needed for
# ±0.1 points), the gradient study on the first bf16 run's checkpoints (dense study), and the
# verdict table over every log in RESULTS/logs. Run directories (checkpoints) stay in OUT; a rerun
# skips finished runs, so a study can be completed batch after batch.
#   scripts/science.sh STUDY DATA_DIR OUT_DIR RESULTS_DIR [GPUS] [JOBS_PER_GPU] [analysis.sweep args ...]
#   scripts/science.sh dense-small data/registry-mix runs/study studies 0 4 \
#       --runs bf16,e2m1,ufp4 --seeds 1337,1338,1339          # the pilot
# `--deadline SECONDS` (an analysis.sweep argument) stops the batch cleanly in time for a GPU loan's end:
# running runs checkpoint, the script exits with status 3 before the comparison, and the same command
# goes on from the checkpoints (while OUT_DIR is still there). A run whose complete compact log is in
# RESULTS_DIR/logs counts as finished wherever it ran: with RESULTS_DIR in the tree (committed), a
# batch goes on on a new machine, losing only the runs that were cut short.
# DATA_DIR may also be the corpus packed for the trip to a GPU machine (uint16 shards, 67 MB -> 24 MB):
#   tar -C data -cJf runs/registry-mix.tar.xz registry-mix
# it is unpacked once into OUT_DIR/data/.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 4 ]; then
    echo "usage: scripts/science.sh STUDY DATA_DIR OUT_DIR RESULTS_DIR [GPUS] [JOBS_PER_GPU] [sweep args ...]" >&2
    exit 2
fi
study=$1; data=$2; out=$3; results=$4; gpus=${5:-0}; jobs=${6:-4}
shift $(( $# < 6 ? $# : 6 ))
py=${PYTHON:-python}
if [[ "$data" == *.tar.xz ]]; then
    name=$(basename "$data" .tar.xz)
    [ -f "$out/data/$name/meta.json" ] || { mkdir -p "$out/data" && tar -C "$out/data" -xJf "$data"; }
    [ -f "$out/data/$name/meta.json" ] || { echo "$data holds no $name/meta.json" >&2; exit 2; }
    data=$out/data/$name
fi

"$py" -m analysis.sweep --study "$study" --out "$out" --results "$results/logs" --gpus "$gpus" --jobs "$jobs" \
    --set data.dir="$data" "$@"
"$py" -m analysis.compare "$results/logs/$study" --power 0.1 --out "$results/compare-$study"
for snap in "$out/$study"/bf16-s*/snap-*.pt; do
    [ -e "$snap" ] || continue
    [ "$study" = dense-small ] || continue   # the gradient study reads the dense model
    step=$(basename "$snap" .pt); step=${step#snap-}
    "$py" -m analysis.gradients --ckpt "$snap" --batches 32 --draws 2 --batch 8 --out "$results/gradients-$step" \
        --recipe ufp4 --recipe e2m1 --recipe nvfp4 --recipe mxfp4 --recipe ufp4-nv \
        --recipe "ufp4 rht=none" --recipe "ufp4 sr=none"
done
last=$(ls -d "$results"/gradients-* 2>/dev/null | sort | tail -n 1 || true)
tensors=bench/results/analysis/tensors_d256_registry-mix/tensors.json.gz
"$py" -m analysis.verdict "$results/logs" --tensors "$tensors" ${last:+--gradients "$last/gradients.json"} \
    --out "$results/verdict"
