#!/bin/bash
# The commands that made this folder's files: one H100 80GB HBM3, torch 2.11, triton 3.6, 2026-12-07,
# commit bd2e2dc, from the repository root, with data/shakespeare prepared (python data/prepare.py shakespeare).
# bench/one_gpu_check.sh DATA OUT bits small runs the same checks (as fixed after this run).
set -u
R=runs/gpu_check; D=$PWD/data/shakespeare; mkdir -p $R
export TORCHINDUCTOR_CACHE_DIR=$R/cache/inductor TRITON_CACHE_DIR=$R/cache/triton
# bits (gpu_tests_kernels_quant.txt): every kernel and quantized-linear test, --full, compiled kernels on the GPU
NPROC=4 scripts/gpu_tests.sh $R/gpu_tests_kernels_quant.txt tests/test_kernels.py tests/test_quant.py
# small as shipped, every recipe, train.py's own log (small.txt, small.json)
python bench/trainer_bench.py configs/small.toml --warm 4 --steps 100 --skip 30 --eval-interval 50 \
    --out-dir $R/small --json $R/small.json -- --data.dir=$D > $R/small.txt 2>&1
# small without CUDA graphs (small_default.txt, small_default.json)
python bench/trainer_bench.py configs/small.toml --recipes bf16,ufp4 --warm 2 --label default --steps 100 --skip 30 \
    --eval-interval 50 --out-dir $R/small --json $R/small_default.json -- --data.dir=$D --train.compile_mode=default \
    > $R/small_default.txt 2>&1
# moe-small's evaluation crash (moedbg.txt, trimmed to the run header and the error; fixed in 6a72c1b)
python train.py configs/moe-small.toml --train.max_steps=4 --train.eval_interval=2 --train.ckpt_interval=-1 \
    --train.resume=false --log.out_dir=$R/moedbg --data.dir=$D > $R/moedbg.txt 2>&1

# --- later the same day (15:29-15:52 UTC), commit 862d723, same kind of card (H100 80GB HBM3)
# moe_ep1.txt: moe-small at ep=1 against the tree before expert parallelism (OLD=05a789d with 6a72c1b's moe.py),
# one run each, evaluation only after the last step; its table made from the four --json files
for r in ufp4 bf16; do
  python bench/trainer_bench.py configs/moe-small.toml --recipes $r --steps 60 --skip 20 --eval-interval 1000 \
      --label new --out-dir $R/moe --json $R/moe_new_$r.json -- --data.dir=$D
  (cd $OLD && python bench/trainer_bench.py configs/moe-small.toml --recipes $r --steps 60 --skip 20 \
      --eval-interval 1000 --label old --out-dir $R/moe --json $R/moe_old_$r.json -- --data.dir=$D)
done
# kernels_old_new.txt: the kernels of this tree and of the pre-reshape tree (OLD2=47951a6); the two JSON files are in
# git history (commit 6188eea)
python bench/kernels_bench.py --no-sweep --skip-check --out $R/kernels.json
python bench/kernels_bench.py --no-sweep --skip-check --tree $OLD2 --out $R/kernels_old.json
python bench/kernels_bench.py --compare $R/kernels_old.json $R/kernels.json > $R/kernels_old_new.txt
# small_bench_old_new.txt: the step on random tokens, with and without CUDA graphs, this tree then OLD2's
SB="--preset small --batch 16 --seq 1024 --compile full --recipes bf16,ufp4 --compile-mode reduce-overhead,default --steps 20"
python bench/train_bench.py $SB --out $R/small_bench.json; (cd $OLD2 && python bench/train_bench.py $SB --out $R/small_bench_old.json)
# small_shipped_noeval.txt: small as shipped, evaluation only after the last step (compare small.txt: one at step 50)
python bench/trainer_bench.py configs/small.toml --recipes bf16,ufp4,nvfp4 --steps 80 --skip 30 --eval-interval 1000 \
    --out-dir $R/small3 --json $R/small_shipped.json -- --data.dir=$D

# --- evening (18:43-18:55 UTC), tree 4b45702, one H100 80GB HBM3; R=runs/gpuA, OLD = 05a789d with 6a72c1b's moe.py
# moe_ep1_bf16_repeat.txt: moe-small bf16, this tree and OLD interleaved (new1, old1, new2, old2), tables from the JSON files
for i in 1 2; do
  python bench/trainer_bench.py configs/moe-small.toml --recipes bf16 --steps 60 --skip 20 --eval-interval 1000 \
      --label new$i --out-dir $R/moe --json $R/moe_new$i.json -- --data.dir=$D
  (cd $OLD && python bench/trainer_bench.py configs/moe-small.toml --recipes bf16 --steps 60 --skip 20 \
      --eval-interval 1000 --label old$i --out-dir $R/moe --json $R/moe_old$i.json -- --data.dir=$D)
done
# small_eval_in_window.txt: small as shipped, evaluation at step 50; the first command ran out of its call's time after
# its bf16 run, so ufp4 and nvfp4 ran in the next call on the same machine (warm caches); the table from the logs
timeout 240 python bench/trainer_bench.py configs/small.toml --recipes bf16,ufp4,nvfp4 --warm 3 --steps 100 --skip 30 \
    --eval-interval 50 --out-dir $R/small --json $R/small.json -- --data.dir=$D
python bench/trainer_bench.py configs/small.toml --recipes ufp4,nvfp4 --steps 100 --skip 30 --eval-interval 50 --label b \
    --out-dir $R/small --json $R/small_b.json -- --data.dir=$D
