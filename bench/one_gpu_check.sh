#!/usr/bin/env bash
# The checks that need one GPU, in parts of a few minutes each (a lent GPU comes for ~10 minutes a
# call; compile caches in OUT/cache carry over between calls on the same machine):
#   bits    the kernel and quantized-linear tests on the GPU (scripts/gpu_tests.sh: compiled kernels
#           against the reference)
#   small   small.toml as shipped, every recipe (train.py's own log, bench/trainer_bench.py --warm),
#           then bf16 and ufp4 without CUDA graphs (train.compile_mode=default)
#   moe     moe-small.toml as shipped, every recipe; with OLD, bf16 and ufp4 of OLD's tree beside it
#   kernels bench/kernels_bench.py --no-sweep of this tree, then of OLD's (--tree), side by side
#   dense   dense-1.5b, whole model compiled, every recipe (bench/train_bench.py --compile full;
#           DENSE_COMPILE=block compiles a block at a time, minutes faster); with OLD, OLD's tree right after
#   tricks  dense-1.5b, whole model compiled: bf16, ufp4 and nvfp4, then ufp4 with IEEE division (--ieee-div)
#           and nvfp4 with two amax reads (--separate-amax): what the kernels' fast division (fp32 scales) and
#           one-read amax (e4m3 scales) buy at the step level, against the step of the same recipe
#   profile small (16 x 1024), bf16 and ufp4, whole model compiled with and without CUDA graphs: the
#           GPU kernels of 3 steps (where FP4's extra GPU time goes) and the host's Python profile
#   host    the host's cost of a quantize call (bench/launch_bench.py), then small bf16 and ufp4 without
#           CUDA graphs, twice each, alternating; with OLD, OLD's tree alternates with this one (a host-bound
#           step varies by tens of percent from run to run on a shared host: compare alternating runs)
#   [OLD=../old-checkout] [TAR=out.tgz] bench/one_gpu_check.sh DATA_DIR OUT_DIR PART...   (TAR: all in one file)
#   bench/one_gpu_check.sh data/shakespeare runs/gpu_check bits small
set -uo pipefail  # a failing part is reported and the others still run
cd "$(dirname "$0")/.."
if [ $# -lt 3 ]; then echo "usage: [OLD=DIR] bench/one_gpu_check.sh DATA_DIR OUT_DIR PART... (bits small moe kernels dense tricks profile host)" >&2; exit 2; fi
data=$(realpath "$1"); out=$(realpath -m "$2"); shift 2; py=${PYTHON:-python}; old=${OLD:+$(realpath "$OLD")}
mkdir -p "$out"
export TORCHINDUCTOR_CACHE_DIR=$out/cache/inductor TRITON_CACHE_DIR=$out/cache/triton
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$py" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)${old:+, OLD $old}"; date -u; } > "$out/machine.txt"
# the bench's own options before the config's overrides (what follows `--` goes to train.py); 4 side by
# side: 8 runs of small compiling at once ran out of an H100's 80 GB
tb() { "$py" bench/trainer_bench.py "$1" --steps 100 --skip 30 --eval-interval 50 --warm 4 "${@:2}"; }
for part in "$@"; do
    echo "=== $part ($(date -u +%H:%M:%S))"
    case $part in
    bits) scripts/gpu_tests.sh "$out/bits.txt" tests/test_kernels.py tests/test_quant.py > /dev/null 2>&1
          tail -3 "$out/bits.txt" ;;
    small) tb configs/small.toml --out-dir "$out/small" --json "$out/small.json" -- --data.dir="$data" > "$out/small.txt" 2>&1
           tb configs/small.toml --recipes bf16,ufp4 --label default --out-dir "$out/small" --json "$out/small_default.json" \
              -- --data.dir="$data" --train.compile_mode=default > "$out/small_default.txt" 2>&1
           tail -8 "$out/small.txt"; tail -3 "$out/small_default.txt" ;;
    moe) tb configs/moe-small.toml --out-dir "$out/moe" --json "$out/moe.json" -- --data.dir="$data" > "$out/moe.txt" 2>&1
         tail -8 "$out/moe.txt"
         if [ -n "$old" ]; then  # bf16 and ufp4 of both trees, evaluating only after the last step (a tree
             # before 6a72c1b needs that commit's moe.py change: its evaluation crashed under torch 2.11's compile)
             tb configs/moe-small.toml --recipes bf16,ufp4 --label noeval --eval-interval 1000 --out-dir "$out/moe" \
                 --json "$out/moe_noeval.json" -- --data.dir="$data" > "$out/moe_noeval.txt" 2>&1
             (cd "$old" && "$py" bench/trainer_bench.py configs/moe-small.toml --recipes bf16,ufp4 --label old --steps 100 \
                 --skip 30 --eval-interval 1000 --out-dir "$out/moe" --json "$out/moe_old.json" -- --data.dir="$data") \
                 > "$out/moe_old.txt" 2>&1; tail -3 "$out/moe_noeval.txt"; tail -3 "$out/moe_old.txt"
         fi ;;
    kernels) "$py" bench/kernels_bench.py --no-sweep --skip-check --out "$out/kernels.json" > "$out/kernels.txt" 2>&1
             [ -n "$old" ] && "$py" bench/kernels_bench.py --no-sweep --skip-check --tree "$old" --out "$out/kernels_old.json" \
                 > "$out/kernels_old.txt" 2>&1
             tail -12 "$out/kernels.txt" ;;
    dense) dc=${DENSE_COMPILE:-full}
           "$py" bench/train_bench.py --compile "$dc" --out "$out/dense.json" > "$out/dense.txt" 2>&1; tail -9 "$out/dense.txt"
           [ -n "$old" ] && (cd "$old" && "$py" bench/train_bench.py --compile "$dc" --out "$out/dense_old.json") \
               > "$out/dense_old.txt" 2>&1 && tail -9 "$out/dense_old.txt" ;;
    tricks) "$py" bench/train_bench.py --compile full --recipes bf16,ufp4,nvfp4 --out "$out/tricks.json" \
                > "$out/tricks.txt" 2>&1
            "$py" bench/train_bench.py --compile full --recipes ufp4 --ieee-div --out "$out/tricks_ieee.json" \
                > "$out/tricks_ieee.txt" 2>&1
            "$py" bench/train_bench.py --compile full --recipes nvfp4 --separate-amax --out "$out/tricks_amax.json" \
                > "$out/tricks_amax.txt" 2>&1
            grep -E "^(bf16|ufp4|nvfp4) " "$out"/tricks*.txt ;;
    profile) "$py" bench/train_bench.py --preset small --batch 16 --seq 1024 --compile full --recipes bf16,ufp4 \
                 --compile-mode default,reduce-overhead --profile 40 --host-profile 40 --out "$out/profile.json" \
                 > "$out/profile.txt" 2>&1; grep -E "^(bf16|ufp4) |GPU busy" "$out/profile.txt" ;;
    host) "$py" bench/launch_bench.py > "$out/launch.txt" 2>&1; cat "$out/launch.txt"
          [ -n "$old" ] && (cd "$old" && "$py" bench/launch_bench.py) > "$out/launch_old.txt" 2>&1
          for i in 1 2; do
              for tree in ${old:+"$old"} .; do
                  (cd "$tree" && "$py" bench/train_bench.py --preset small --batch 16 --seq 1024 --compile full \
                      --recipes bf16,ufp4 --compile-mode default --steps 40) > "$out/host_$i$([ "$tree" = . ] || echo _old).txt" 2>&1
                  echo "${tree}, run $i:"; grep -E "^(bf16|ufp4) " "$out/host_$i$([ "$tree" = . ] || echo _old).txt"
              done
          done ;;
    *) echo "unknown part $part: bits small moe kernels dense tricks profile host" >&2 ;;
    esac
done
echo "=== done ($(date -u +%H:%M:%S)): $out"
if [ -n "${TAR:-}" ]; then  # one file to carry back: the summaries and logs, not the compile caches or checkpoints
    tar czf "$TAR" -C "$out" --exclude=cache --exclude='*.pt' --exclude='ckpt*' . && echo "packed: $TAR"
fi
