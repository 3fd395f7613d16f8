#!/bin/bash
# CPU gradient-shrinkage measurement, 2026-12-07, run from the repository root (worktree of branch cpu-gradients).
# Machine: CPU only, 2 cores; every process limited to 2 threads.
set -x
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
PY=/work/venv/bin/python
RUN=runs/grad8
OUT=bench/results/cpu_2026-12-07_gradients
TRAIN="$PY train.py configs/tiny.toml --model.n_layer=8 --model.d_model=128 --model.seq_len=128 \
  --model.ffn_hidden=384 --data.batch_size=16 --train.device=cpu --train.max_steps=500 \
  --train.eval_interval=100 --train.ckpt_interval=0 --quant.recipe=bf16 --log.out_dir=$RUN"
mkdir -p $RUN/snap
# bf16 (unquantized; float32 on the CPU) training in three segments; ckpt.pt is copied after each
$TRAIN --train.stop_after=50;  cp $RUN/ckpt.pt $RUN/snap/step50.pt
$TRAIN --train.stop_after=100; cp $RUN/ckpt.pt $RUN/snap/step150.pt
$TRAIN;                        cp $RUN/ckpt.pt $RUN/snap/step500.pt
# gradients against bf16 on each snapshot, torch reference backend on the CPU (autocast off: fp32).
# Steps 500 and 150 get 32 batches, step 50 16 (~3 s per forward+backward on 2 cores: ~25 min a snapshot).
G="--recipe ufp4 --recipe e2m1 --recipe nvfp4 --recipe mxfp4 --recipe ufp4-nv"
$PY -m analysis.gradients --ckpt $RUN/snap/step500.pt $G --recipe "ufp4 rht=none" --recipe "e2m1 rht=none" \
  --batches 32 --draws 2 --device cpu --out $RUN/grad_step500
$PY -m analysis.gradients --ckpt $RUN/snap/step50.pt $G --recipe "ufp4 rht=none" --recipe "e2m1 rht=none" \
  --batches 16 --draws 2 --device cpu --out $RUN/grad_step50 --no-plots
$PY -m analysis.gradients --ckpt $RUN/snap/step150.pt $G --recipe "ufp4 rht=none" --recipe "e2m1 rht=none" \
  --batches 32 --draws 2 --device cpu --out $RUN/grad_step150 --no-plots
# a second seed to step 150 (5 recipes), into $OUT/seed1338/
RUN2=runs/grad8-s1338; mkdir -p $RUN2/snap
${TRAIN/--log.out_dir=$RUN/--train.seed=1338 --log.out_dir=$RUN2} --train.stop_after=150; cp $RUN2/ckpt.pt $RUN2/snap/step150.pt
$PY -m analysis.gradients --ckpt $RUN2/snap/step150.pt $G --batches 32 --draws 2 --device cpu --out $RUN2/grad_step150 --no-plots
# seeds 1339-1351 to step 150, ufp4 and e2m1 only, into $OUT/seed{1339,...,1351}/ (as seed 1338, with
# --train.seed=S and --recipe ufp4 --recipe e2m1)
# the JSONs (6 significant digits) gzipped to $OUT/step{50,150,500}/ and $OUT/seed1338/step150/; seeds 1339-1351
# packed into $OUT/seeds1339-1351_step150.json.gz ({seed: JSON}); then (the README's numbers):
# $PY $OUT/summarize.py > $OUT/summary.md
