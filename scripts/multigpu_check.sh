#!/usr/bin/env bash
# FSDP2 on NGPU GPUs of one host against one GPU, with the same global batch (eager, no checkpoints
# unless needed):
#   (the config's schedule: its 500 warmup steps keep the first 50 steps stable, so the runs compare
#   the arithmetic, not how an unstable start amplifies rounding; the results of 2026-11-30 in
#   bench/results/ were made with a 10-step warmup instead)
#   1. dense-1.5b under bf16 and ufp4 for STEPS steps on 1 GPU (torchrun, FSDP2, grad_accum = NGPU;
#      the two recipes side by side on GPUs 0 and 1) and on NGPU GPUs (grad_accum 1): the losses of
#      every step compared, and tokens/s per GPU (median after step 10) at NGPU over 1 GPU;
#   2. the bf16 NGPU run stops at step 40 with a sharded checkpoint; a copy resumes on 1 GPU and the
#      run itself on NGPU GPUs: steps 41..STEPS compared (a checkpoint written at N resumes at M);
#   3. the plain one-GPU trainer (train.parallel=none) for tokens/s without FSDP's hooks (beside part 1
#      on a third GPU when there is one);
#   4. moe-small under ufp4 on NGPU GPUs for MOE_STEPS steps: the load statistics (max/mean tokens
#      per expert, per layer) at the start and the end.
#   scripts/multigpu_check.sh DATA_DIR OUT_DIR           # NGPU (default 2), STEPS (50), MOE_STEPS (100)
#   SKIP_EXTRAS=1 scripts/multigpu_check.sh ...          # part 1 only
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-data/registry-mix}; out=${2:-runs/multigpu_check}
py=${PYTHON:-python}; n=${NGPU:-2}; steps=${STEPS:-50}; moe_steps=${MOE_STEPS:-100}
run() {  # run NPROC GPUS OUT_DIR ARGS...: torchrun on the given GPUs
    local nproc=$1 gpus=$2 dir=$3; shift 3
    CUDA_VISIBLE_DEVICES=$gpus "$py" -m torch.distributed.run --standalone --nproc_per_node="$nproc" \
        train.py configs/dense-1.5b.toml --data.dir="$data" --train.max_steps="$steps" --train.compile=false \
        --train.eval_interval=100000 --data.eval_batches=1 --train.ckpt_interval=-1 \
        --log.out_dir="$out/$dir" "$@" > "$out/$dir.out" 2>&1
}
all=$(seq -s, 0 $((n - 1)))
mkdir -p "$out"
start=$(date +%s)
plain() {  # the plain one-GPU trainer on GPU $1
    CUDA_VISIBLE_DEVICES=$1 "$py" train.py configs/dense-1.5b.toml --data.dir="$data" --train.max_steps=30 \
        --train.compile=false --train.eval_interval=100000 --data.eval_batches=1 --train.ckpt_interval=-1 \
        --data.grad_accum="$n" --train.parallel=none --log.out_dir="$out/bf16-1gpu-plain" > "$out/bf16-1gpu-plain.out" 2>&1
}
run 1 0 bf16-1gpu --data.grad_accum="$n" & run 1 1 ufp4-1gpu --data.grad_accum="$n" --quant.recipe=ufp4 &
[ "${SKIP_EXTRAS:-0}" = 1 ] || [ "$n" -lt 3 ] || plain 2 &  # a spare GPU: no stage of its own
wait
if [ "${SKIP_EXTRAS:-0}" = 1 ]; then
    run "$n" "$all" bf16-${n}gpu
else
    run "$n" "$all" bf16-${n}gpu --train.stop_after=40 --train.ckpt_interval=0
    cp -r "$out/bf16-${n}gpu" "$out/bf16-${n}gpu-resumed-1gpu"
    run "$n" "$all" bf16-${n}gpu --train.ckpt_interval=0
    run 1 0 bf16-${n}gpu-resumed-1gpu --data.grad_accum="$n" --train.ckpt_interval=0 &
    [ "$n" -ge 3 ] || plain 1 &
    wait
fi
run "$n" "$all" ufp4-${n}gpu --quant.recipe=ufp4
[ "${SKIP_EXTRAS:-0}" = 1 ] || CUDA_VISIBLE_DEVICES=$all "$py" -m torch.distributed.run --standalone --nproc_per_node="$n" train.py \
    configs/moe-small.toml --data.dir="$data" --quant.recipe=ufp4 --train.max_steps="$moe_steps" \
    --train.compile=false --train.eval_interval=100000 --data.eval_batches=1 --train.ckpt_interval=-1 \
    --log.out_dir="$out/moe-small-ufp4-${n}gpu" > "$out/moe-small-ufp4-${n}gpu.out" 2>&1
"$py" - "$out" "$n" "$(( $(date +%s) - start ))" <<'PY'
import json, os, statistics, sys
out, n, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def recs(name):
    return {r['step']: r for r in map(json.loads, open(f'{out}/{name}/log.jsonl'))}
def per_gpu(r, world):
    return statistics.median([x['tok_s'] for s, x in r.items() if s > 10]) / world
print(f'{n} GPUs vs 1 GPU, same global batch; {seconds} s in all')
for recipe in ('bf16', 'ufp4'):
    a, b = recs(f'{recipe}-1gpu'), recs(f'{recipe}-{n}gpu')
    rel = [abs(a[s]['loss'] - b[s]['loss']) / a[s]['loss'] for s in sorted(a) if s in b]
    print(f'{recipe}: {len(rel)} steps, loss 1 GPU {a[max(a)]["loss"]:.4f} vs {n} GPUs {b[max(b)]["loss"]:.4f} at step {max(a)}; '
          f'max |dL|/L {max(rel):.2e}, mean {statistics.mean(rel):.2e}; tokens/s per GPU: 1 GPU {per_gpu(a, 1):,.0f}, '
          f'{n} GPUs {per_gpu(b, n):,.0f} ({per_gpu(b, n) / per_gpu(a, 1):.3f})')
if not os.path.exists(f'{out}/bf16-1gpu-plain/log.jsonl'):
    sys.exit()
plain = recs('bf16-1gpu-plain')
print(f'bf16 plain one-GPU trainer (no FSDP): {per_gpu(plain, 1):,.0f} tokens/s; {n}-GPU FSDP per GPU / plain: '
      f'{per_gpu(recs(f"bf16-{n}gpu"), n) / per_gpu(plain, 1):.3f}')
a, b = recs(f'bf16-{n}gpu'), recs(f'bf16-{n}gpu-resumed-1gpu')
tail = [s for s in sorted(b) if s > 40]
rel = [abs(a[s]['loss'] - b[s]['loss']) / a[s]['loss'] for s in tail]
print(f'checkpoint at step 40 on {n} GPUs, resumed on 1 GPU: steps {tail[0]}..{tail[-1]}, max |dL|/L vs the '
      f'{n}-GPU continuation {max(rel):.2e}')
m = recs(f'moe-small-ufp4-{n}gpu')
for s in (1, 10, max(m)):
    loads = {k: round(v, 2) for k, v in m[s].items() if k.startswith('moe_load_') and k != 'moe_load_max'}
    print(f'moe-small ufp4 on {n} GPUs, step {s}: loss {m[s]["loss"]:.4f}, max/mean expert load worst '
          f'{m[s]["moe_load_max"]:.2f}, per layer {loads}')
print(f'moe-small ufp4 tokens/s per GPU: {per_gpu(m, n):,.0f}')
PY
