#!/usr/bin/env bash
# Every GPU number of the README's Results in one run of ~10 minutes on a machine with 2 H200s:
#   0. the kept-kernel launch path (kernels.FAST_LAUNCH) against kernel[grid], bit for bit; if it
#      fails, everything after runs with NANOFP4_FAST_LAUNCH=0 and the output says so;
#   1. FSDP2 on 2 GPUs against 1 GPU from scratch, dense-1.5b bf16 and ufp4 (scripts/multigpu_check.sh);
#   2. side by side: GPU 0 times (kernel tests on the GPU, kernels_bench, launch_bench, dense-1.5b
#      under every recipe and with --quant pack_saved=false, moe-small bf16/ufp4 compiled per block,
#      without and with CUDA graphs);
#      GPU 1 trains (the scaling ladder, and a small bf16 model whose operands analysis.analyze studies).
#      Host-bound timings (moe-small without CUDA graphs) read slower while GPU 1's jobs compile on
#      the same CPUs: time those alone for the README.
#   bench/h200_suite.sh DATA_DIR OUT_DIR
set -uo pipefail  # a failing part is reported and the others still run
cd "$(dirname "$0")/.."
data=${1:-data/registry-mix}; out=${2:-runs/h200_suite}; py=${PYTHON:-python}
mkdir -p "$out"
section() { echo "=== $* ($(date -u +%H:%M:%S))"; }

section "0. fast launch check"
if ! CUDA_VISIBLE_DEVICES=0 timeout 60 "$py" -m pytest -q tests/test_kernels.py -k fast > "$out/fast_launch_test.txt" 2>&1; then
    echo "FAST LAUNCH CHECK FAILED (see fast_launch_test.txt): NANOFP4_FAST_LAUNCH=0 from here on"
    export NANOFP4_FAST_LAUNCH=0
fi
tail -1 "$out/fast_launch_test.txt"

section "1. FSDP2, 2 GPUs vs 1 (SKIP_MULTIGPU=1 skips it)"
if [ "${SKIP_MULTIGPU:-0}" != 1 ]; then
    SKIP_EXTRAS=1 timeout 280 scripts/multigpu_check.sh "$data" "$out/multigpu" > "$out/multigpu.txt" 2>&1 || echo "multigpu: exit $?"
    tail -4 "$out/multigpu.txt"
fi

section "2. GPU 0 benchmarks | GPU 1 training"
(
    export CUDA_VISIBLE_DEVICES=0
    timeout 40 "$py" -m pytest -q tests/test_kernels.py -k "amax or sr_mean" > "$out/kernels_gpu_tests.txt" 2>&1
    timeout 70 "$py" bench/kernels_bench.py --skip-check --out "$out/kernels.json" > "$out/kernels.txt" 2>&1
    timeout 15 "$py" bench/launch_bench.py > "$out/launch.txt" 2>&1
    timeout 110 "$py" bench/train_bench.py --compile blocks --steps 8 --out "$out/dense1.5b.json" > "$out/dense1.5b.txt" 2>&1
    timeout 90 "$py" bench/train_bench.py --compile blocks --steps 6 --warmup 2 --recipes bf16,ufp4,nvfp4 \
        --quant pack_saved=false --out "$out/dense1.5b_unpacked.json" > "$out/dense1.5b_unpacked.txt" 2>&1
    timeout 120 "$py" bench/train_bench.py --preset moe-small --batch 16 --seq 1024 --recipes bf16,ufp4 \
        --compile block --out "$out/moe-small-block.json" > "$out/moe-small-block.txt" 2>&1
    timeout 150 "$py" bench/train_bench.py --preset moe-small --batch 16 --seq 1024 --recipes bf16,ufp4 \
        --compile block --compile-mode reduce-overhead --out "$out/moe-small-graphs.json" > "$out/moe-small-graphs.txt" 2>&1
) &
(
    export CUDA_VISIBLE_DEVICES=0,1
    timeout 260 "$py" -m analysis.sweep --ladder gpu-ladder --rungs d192,d256,d384,d512 --recipes bf16,ufp4,e2m1 \
        --tokens-per-param 0.15 --gpus 1 --jobs 4 --out "$out/ladder" --set data.dir="$data" \
        --set train.compile=false > "$out/ladder.txt" 2>&1 &
    CUDA_VISIBLE_DEVICES=1 timeout 150 "$py" train.py configs/small.toml --data.dir="$data" --train.max_steps=400 \
        --train.compile=false --train.eval_interval=200 --log.out_dir="$out/small-bf16" > "$out/small-bf16.txt" 2>&1 &&
    timeout 60 "$py" -m analysis.analyze tensors --ckpt "$out/small-bf16/ckpt.pt" --batch 4 --out "$out/tensors" \
        > "$out/tensors.txt" 2>&1 &&
    timeout 40 "$py" -m analysis.analyze chain --ckpt "$out/small-bf16/ckpt.pt" --out "$out/chain" > "$out/chain.txt" 2>&1
    wait
) &
wait
section "done"
for f in kernels_gpu_tests kernels launch dense1.5b dense1.5b_unpacked moe-small-block moe-small-graphs ladder tensors; do
    echo "--- $f"; grep -v "it/s" "$out/$f.txt" | tail -12
done
