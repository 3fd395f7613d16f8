"""Fingerprints of the quantize kernel's sm_90 machine code (compiled with no GPU: kernels.compile_quantize
and the nvdisasm Triton ships) for 116 configurations: spec x dim x RHT x codes or dequant x bf16 or fp32.
A refactor that keeps every fingerprint keeps the kernels' instructions, so their timings stand.

  python sass_fingerprint.py REPO OUT.txt      (REPO: the checkout whose kernels.py to compile)
"""
import hashlib
import itertools
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, sys.argv[1])
import kernels  # noqa: E402
import quant  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

Q = quant.QuantSpec
BIN = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")
specs = [Q("e2m1", 16, "fp32"), Q("e1m2", 16, "fp32"), Q("e2m1", 16, "e4m3"), Q("e2m1", 32, "e8m0"),
         Q("e1m2", 16, "fp32", "sr"), Q("int4", 16, "fp32") if "int4" in quant.GRIDS else Q("e1m2", 16, "e8m0"),
         Q("e2m1", 16, "fp32", block_2d=True), Q("e1m2", 16, "e4m3", "sr")]
out = []
for spec, dim, rht, codes, dt in itertools.product(specs, (-1, 0), (False, True), (True, False), (torch.bfloat16, torch.float32)):
    if spec.block_2d and (rht or dim == 0):
        continue
    try:
        k = kernels.compile_quantize((512, 768), dt, levels=spec.levels, block=spec.block, scale_mode=spec.scale,
                                     sr=spec.rounding == "sr", rht=rht, block_2d=spec.block_2d, dim=dim, want_codes=codes)
    except Exception as e:
        out.append(f"{spec} {dim} {rht} {codes} {dt} ERROR {type(e).__name__}")
        continue
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    txt = subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", f.name], capture_output=True, text=True).stdout
    ins = "\n".join(m.group(1) for m in re.finditer(r"/\*[0-9a-f]+\*/\s+([^;]*;)", txt))
    out.append(f"{spec.grid} {spec.block} {spec.scale} {spec.rounding} 2d={spec.block_2d} dim={dim} rht={rht} codes={codes} {dt} {hashlib.sha1(ins.encode()).hexdigest()[:12]} {ins.count(chr(10))}")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print(len(out), "configs")
