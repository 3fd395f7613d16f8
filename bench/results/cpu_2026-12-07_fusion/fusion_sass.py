"""Does Triton's enable_fp_fusion change the quantize kernel's sm_90 machine code? Each kind compiled with
fusion off (as shipped) and on, no GPU needed (Triton 3.6's ptxas and cuobjdump); prints one line a case.
    env -u TRITON_INTERPRET python bench/results/cpu_2026-12-07_fusion/fusion_sass.py [--rotated-back]
(--rotated-back: the RHT cases with the dequantized output rotated back, keep_rotated=False)."""
import os, re, subprocess, sys, tempfile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../.."))
import torch, triton, kernels
tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")

def sass(k):
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    out = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    ins = [re.sub(r"/\*[0-9a-f]{4}\*/", "", l).split(";")[0].strip() for l in out.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", l)]
    return ins

def quantize_kernel(shape, dtype, levels, block, scale_mode, sr, rht, block_2d, dim, want_codes, fusion):
    p = kernels._plan(tuple(shape), dtype, False, tuple(levels), block, scale_mode, sr, rht, block_2d, dim, torch.bfloat16,
                      KEEP_ROTATED, want_codes, not want_codes, None, True)
    bf16 = dtype == torch.bfloat16
    x_type = ("*i16" if bf16 else "*fp32") if p.colwise else ("*i32" if bf16 else "*i64")
    types = [x_type, "*fp32" if want_codes else "*bf16", "*i64" if want_codes else "*fp32",
             ("*fp32" if scale_mode == "fp32" else "*u8") if want_codes else "*fp32", "*fp32",
             "*i32" if scale_mode == "e4m3" else "*fp32", "*fp32", "*fp32", "i32", "i32", "i32"]
    names = kernels._quantize_kernel.arg_names
    constexprs = dict(p.constexprs, SEED_PTR=False)
    signature = dict(zip(names, types), **{k: "constexpr" for k in constexprs})
    hints = {(i,): [["tt.divisibility", 16]] for i in range(10)}
    src = triton.compiler.ASTSource(kernels._quantize_kernel, signature, constexprs, hints)
    opts = dict(p.options); opts["enable_fp_fusion"] = fusion
    return triton.compile(src, target=triton.backends.compiler.GPUTarget("cuda", 90, 32), options=opts)

KEEP_ROTATED = "--rotated-back" not in sys.argv
E2M1 = kernels.E2M1_LEVELS; E1M2 = tuple(i * 0.5 for i in range(8))
cases = []
for lv, name in ((E2M1, "e2m1"), (E1M2, "e1m2")):
    for scale, block in (("fp32", 16), ("e4m3", 16), ("e8m0", 32)):
        for sr in (False, True):
            for rht in (False, True):
                for dim in (-1, 0):
                    for codes in ((True, False) if KEEP_ROTATED else (False,) if rht else ()):
                        cases.append((name, lv, scale, block, sr, rht, False, dim, codes))
    if KEEP_ROTATED:
        cases += [(name, lv, "fp32", 16, False, False, True, -1, codes) for codes in (True, False)]
diff = 0
for dtype in (torch.bfloat16, torch.float32) if KEEP_ROTATED else (torch.bfloat16,):
    for (name, lv, scale, block, sr, rht, b2d, dim, codes) in cases:
        a = sass(quantize_kernel((4096, 4096), dtype, lv, block, scale, sr, rht, b2d, dim, codes, False))
        b = sass(quantize_kernel((4096, 4096), dtype, lv, block, scale, sr, rht, b2d, dim, codes, True))
        same = a == b
        nf = lambda s: sum("FFMA" in i for i in s)
        diff += not same
        print(f"{str(dtype)[6:]:8s} {name} {scale} b{block} sr={int(sr)} rht={int(rht)} 2d={int(b2d)} dim={dim} "
              f"{'codes' if codes else 'dequant'}: {'same' if same else 'DIFFER'} ({len(a)} vs {len(b)} instr, FFMA {nf(a)} vs {nf(b)})", flush=True)
print("differ:", diff, "of", (2 if KEEP_ROTATED else 1) * len(cases))
