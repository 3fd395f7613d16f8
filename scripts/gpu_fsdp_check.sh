#!/usr/bin/env bash
# FSDP2 on one GPU against no sharding: configs/small.toml for STEPS steps (default 60) each way,
#   python train.py CONFIG ...                                              (train.parallel=none)
#   torchrun --nproc_per_node=1 train.py CONFIG ... --train.parallel=fsdp
# then the tokens/s of both (median over the steps after the 10th, from each run's log.jsonl), their
# ratio, peak memory and the last loss, and plan.py's memory estimate for the fsdp run. One rank has
# nothing to communicate, so the ratio is the cost of FSDP2's hooks and copies (bf16 weight copies,
# fp32 gradient reduction) on this model. The two runs start from different initial weights
# (FSDP2 initializes shards through DTensor's RNG), so their losses agree only roughly.
#
#   scripts/gpu_fsdp_check.sh                       # needs data/shakespeare: python data/prepare.py shakespeare
#   COMPILE=true scripts/gpu_fsdp_check.sh          # torch.compile both (adds ~1 min of compiling each)
#   scripts/gpu_fsdp_check.sh --quant.recipe=ufp4   # any train.py override, for both runs
# CONFIG, STEPS, OUT (default runs/gpu_fsdp_check) and PYTHON can be set in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
out=${OUT:-runs/gpu_fsdp_check}
common=("${CONFIG:-configs/small.toml}" --train.max_steps="${STEPS:-60}" --train.eval_interval=100000
        --train.compile="${COMPILE:-false}" --train.resume=false "$@")
start=$(date +%s)
"$py" train.py "${common[@]}" --log.out_dir="$out/none"
"$py" -m torch.distributed.run --standalone --nproc_per_node=1 train.py "${common[@]}" \
    --train.parallel=fsdp --log.out_dir="$out/fsdp"
"$py" - "$out" "$(( $(date +%s) - start ))" <<'PY'
import json, statistics, sys
out, seconds = sys.argv[1], sys.argv[2]
res = {}
for mode in ('none', 'fsdp'):
    recs = [json.loads(line) for line in open(f'{out}/{mode}/log.jsonl')]
    steady = [r['tok_s'] for r in recs[10:] if 'val_loss' not in r] or [r['tok_s'] for r in recs]
    res[mode] = statistics.median(steady), max(r['mem_gb'] for r in recs), recs[-1]['loss'], len(recs)
    print(f'{mode:5s} {res[mode][0]:12,.0f} tok/s  peak {res[mode][1]:6.2f} GB  loss at step {res[mode][3]} {res[mode][2]:.4f}')
print(f'fsdp / none tokens/s: {res["fsdp"][0] / res["none"][0]:.3f}   ({seconds} s for both runs)')
PY
echo "plan.py's estimate of the fsdp run's peak (eager PyTorch, no reserve; compiled runs keep less):"
"$py" plan.py "${common[@]}" --world-size 1 --reserve-gb 0 | grep -E '^  (total|activations kept)'
