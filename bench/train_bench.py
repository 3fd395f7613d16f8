"""Training-step benchmark: every recipe side by side with bf16, in one process on one GPU.

    python bench/train_bench.py --preset dense-1.5b --batch 8 --seq 2048 \
        --recipes bf16,ufp4,e2m1,nvfp4,mxfp4,ufp4-nv --baseline --out bench/results/train.json
    python bench/train_bench.py --preset small --batch 16 --seq 1024 --compile full \
        --compile-mode default,reduce-overhead       # small models: with and without CUDA graphs

For each recipe a fresh model (fp32 master weights, bf16 autocast, fused AdamW; compiled per block
with the LM head + loss compiled apart, or as a whole) runs `--warmup` steps, then `--steps` timed
steps on random tokens. Printed per
recipe (and compile mode): step time, ratio to the bf16 step of the same mode measured in this run,
the host's time to issue a step (the loop's time before it waits for the GPU: close to the step time
when the step is host-bound), tokens/s, MFU (model.flops_per_token over 989 TFLOP/s dense bf16) and
peak memory. `--baseline` adds the NVFP4 recipe through the
plain-PyTorch reference quantizer of quant.py (no Triton), eager and compiled: the fake-quant a
user would write by hand, so the speed-up of the kernels is measured, not assumed.
"""

import argparse
import cProfile
import functools
import gc
import json
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import kernels  # noqa: E402
import model as model_lib  # noqa: E402
import moe  # noqa: E402
import quant  # noqa: E402

PEAK_FLOPS = 989e12


def run_one(args, recipe, backend="auto", compile_blocks=True, compile_mode=None):
    torch.manual_seed(0)
    quant.set_backend(backend)
    cfg = model_lib.get_config(args.preset, seq_len=args.seq)
    with torch.device("meta"):
        m = model_lib.Transformer(cfg)
    m.to_empty(device="cuda")
    m.init_weights()
    r = quant.recipe_from_overrides(recipe, **args.quant) if recipe != "bf16" else quant.RECIPES["bf16"]
    moe.convert_experts(quant.convert(m, r), r)
    graphs = compile_mode == "reduce-overhead"
    mode = dict(mode=compile_mode) if compile_mode and compile_mode != "default" else {}
    if compile_blocks and args.compile in ("block", "blocks"):
        for block in m.layers:
            block.compile(**mode)
        if args.compile == "block":
            m.head = torch.compile(m.head, **mode)
    elif compile_blocks and args.compile == "full":
        m.compile(**mode)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda")
    y = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda")

    def step():
        if graphs:  # a new step: the graphs' last outputs are done
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", torch.bfloat16):
            _, loss = m(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.time()
    for _ in range(args.warmup):
        loss = step()
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    host_ms = (time.perf_counter() - t0) * 1e3 / args.steps  # the host's time to issue a step
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / args.steps
    busy_ms = None
    if args.profile:  # the GPU kernels of 3 more steps, most total time first
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        events = prof.key_averages()
        busy_ms = sum(e.self_device_time_total for e in events) / 3e3  # us over 3 steps -> ms a step
        table = events.table(sort_by="cuda_time_total", row_limit=args.profile)
        print(f"--- profile: {recipe} ({backend}), 3 steps, GPU busy {busy_ms:.1f} ms of a {ms:.1f} ms step"
              f"\n{table}", flush=True)
    if args.host_profile:  # where the host's time goes (Python functions and ops) in 2 more steps
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2):
            step()
        torch.cuda.synchronize()
        prof.disable()
        print(f"--- host profile: {recipe} ({backend}), 2 steps", flush=True)
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(args.host_profile)
    tokens = args.batch * args.seq
    compiled = args.compile + (" graphs" if graphs else "")
    res = dict(recipe=recipe, backend=backend, compiled=compiled if compile_blocks else "none",
               step_ms=ms, host_ms=host_ms, gpu_busy_ms=busy_ms, tok_s=tokens / ms * 1e3,
               mfu=m.flops_per_token(args.seq) * tokens / (ms * 1e-3) / PEAK_FLOPS,
               peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30, loss=float(loss.detach()),
               warmup_s=warm_s)
    m = opt = x = y = loss = None  # (the closure step holds them too: set, not deleted)
    gc.collect()
    torch.cuda.empty_cache()
    torch._dynamo.reset()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="dense-1.5b")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--recipes", default="bf16,ufp4,e2m1,nvfp4,mxfp4,ufp4-nv")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", default="block", choices=["block", "blocks", "full", "none"],
                    help="compile each transformer block and the LM head + loss apart (default), the blocks "
                         "only (head eager), the whole model, or nothing")
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile's mode, or several comma-separated to run each recipe in each side by side: "
                         "default | reduce-overhead (CUDA graphs, no host launch cost) | max-autotune-no-cudagraphs")
    ap.add_argument("--baseline", action="store_true", help="also time nvfp4 through the PyTorch reference")
    ap.add_argument("--quant", action="append", default=[], metavar="KEY=VALUE",
                    help="a quant override for every FP4 recipe (repeatable), e.g. pack_saved=true")
    ap.add_argument("--profile", type=int, default=0, metavar="ROWS",
                    help="also print the top ROWS GPU kernels of 3 profiled steps per recipe, and the GPU's busy "
                         "time a step (well under the step time: the step waits on the host)")
    ap.add_argument("--host-profile", type=int, default=0, metavar="ROWS",
                    help="also print the ROWS functions with the most host time in 2 cProfiled steps per recipe")
    ap.add_argument("--ieee-div", action="store_true",
                    help="the kernels divide y the IEEE way (fast_div=False: the same bits), to time the fast division")
    ap.add_argument("--separate-amax", action="store_true",
                    help="e4m3 operands take their rows' and columns' tensor amaxes in two reads, not one "
                         "(kernels.tensor_amax_both off: the same bits), to time the one-read amax")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    bad = [kv for kv in args.quant if "=" not in kv]
    if bad:
        sys.exit(f"--quant {bad[0]!r}: expected KEY=VALUE, e.g. --quant pack_saved=true")
    args.quant = dict(kv.split("=", 1) for kv in args.quant)
    for name in args.recipes.split(","):  # bad names or keys: an error before any GPU work
        try:
            if name != "bf16":
                quant.recipe_from_overrides(name, **args.quant)
        except ValueError as e:
            sys.exit(f"--recipes/--quant: {e}")
    if not torch.cuda.is_available():
        sys.exit("train_bench.py needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = True
    if args.ieee_div:  # every kernel call goes through kernels.quantize, looked up by name
        kernels.quantize = functools.partial(kernels.quantize, fast_div=False)
    if args.separate_amax:  # the fused paths then leave each tensor amax to its quantize call's own pass
        quant._amax_both = lambda *a: (None, None)
    modes = args.compile_mode.split(",")
    bad = [m for m in modes if m not in ("default", "reduce-overhead", "max-autotune-no-cudagraphs")]
    if bad:
        sys.exit(f"--compile-mode {bad[0]!r}: valid: default, reduce-overhead, max-autotune-no-cudagraphs")
    runs = [(r, "auto", True, m) for m in modes for r in args.recipes.split(",")]
    if args.baseline:
        runs += [("nvfp4", "torch", False, None), ("nvfp4", "torch", True, modes[0])]
    results = []
    for recipe, backend, comp, cmode in runs:
        try:
            res = run_one(args, recipe, backend, comp, cmode)
        except Exception as e:  # report the failure, measure the other recipes
            print(f"FAILED {recipe} ({backend}): {type(e).__name__}: {e}", flush=True)
            gc.collect()
            torch.cuda.empty_cache()
            torch._dynamo.reset()
            continue
        results.append(res)
        print(json.dumps(res), flush=True)
    bases = {r["compiled"]: r for r in results if r["recipe"] == "bf16"}
    hdr = (f"{'recipe':<10} {'quantizer':<10} {'compiled':<12} {'step ms':>8} {'x bf16':>7} {'host ms':>8} {'tok/s':>9} "
           f"{'MFU':>6} {'peak GiB':>9}")
    print(f"\n{args.preset}, batch {args.batch} x {args.seq}, quant overrides {args.quant or 'none'}, "
          f"{'IEEE division, ' if args.ieee_div else ''}{'two amax reads, ' if args.separate_amax else ''}"
          f"{torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}\n{hdr}")
    for r in results:
        base = bases.get(r["compiled"]) or next(iter(bases.values()), None)  # (uncompiled: the first mode's)
        r["ratio_vs_bf16"] = r["step_ms"] / base["step_ms"] if base else None
        quantizer = "-" if r["recipe"] == "bf16" else "triton" if r["backend"] == "auto" else r["backend"]
        ratio = f"{r['ratio_vs_bf16']:>7.3f}" if base else f"{'-':>7}"
        print(f"{r['recipe']:<10} {quantizer:<10} {r['compiled']:<12} {r['step_ms']:>8.1f} {ratio} {r['host_ms']:>8.1f} "
              f"{r['tok_s']:>9.0f} "
              f"{r['mfu'] * 100:>5.1f}% {r['peak_mem_gib']:>9.1f}")
    if args.out:
        meta = dict(preset=args.preset, batch=args.batch, seq=args.seq, quant_overrides=args.quant, ieee_div=args.ieee_div,
                    separate_amax=args.separate_amax,
                    gpu=torch.cuda.get_device_name(),
                    torch=torch.__version__, date=time.strftime("%Y-%m-%d"),
                    mfu_formula="model.flops_per_token(seq) = 6*N + 6*n_layer*d_model*seq (N without input embedding), / 989e12")
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, results=results), f, indent=1)


if __name__ == "__main__":
    main()
