"""Which quantize kernels one training step of each named recipe launches: orientation (rows: along the
last dim; cols: along dim 0), outputs (codes and/or the dequantized tensor), RHT, rounding and scale, with
how many launches. Runs the Triton kernels in the interpreter on the CPU (tiny and moe-tiny presets, one
forward and backward, pack_saved on as by default).

    python bench/results/cpu_2026-12-03_kernel_kinds/kernel_kinds.py      (from the repo root)
"""
import collections
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

import kernels  # noqa: E402
import model  # noqa: E402
import moe  # noqa: E402
import quant  # noqa: E402

seen = collections.Counter()
every = set()  # the kinds of all the steps
_quantize = kernels.quantize


def counted(x, **kw):
    outputs = "+".join(o for o, on in (("codes", kw.get("want_codes", True)),
                                       ("dequant", kw.get("want_dequant", True))) if on)
    seen[("cols" if kw.get("dim", -1) == 0 else "rows", outputs, "rht" if kw.get("rht_signs") is not None else "-",
          "sr" if kw.get("sr") else "rtne", kw.get("scale_mode", "fp32"))] += 1
    return _quantize(x, **kw)


kernels.quantize = counted
quant.set_backend("triton")
for preset in ("tiny", "moe-tiny"):
    for name in ("ufp4", "e2m1", "nvfp4", "mxfp4", "ufp4-nv"):
        seen.clear()
        torch.manual_seed(0)
        cfg = model.get_config(preset)
        m = model.Transformer(cfg)
        quant.convert(m, name)
        moe.convert_experts(m, quant.RECIPES[name])
        idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
        _, loss = m(idx, idx)
        loss.backward()
        every.update(seen)
        print(f"{preset} {name}:")
        for kind, n in sorted(seen.items()):
            print(f"    {' '.join(kind):38s} {n:3d}")
print("codes along rows launched by any step:", any(k[0] == "rows" and "codes" in k[1] for k in every))
