"""GEMMs apart vs joined, and the quantized linear's fwd+bwd per recipe/grouping, dense-1.5b shapes."""
import sys, os, json, torch
sys.path.insert(0, os.getcwd())
import quant
torch.manual_seed(0)
dev = "cuda"
def timeit(fn, n=20, w=5):
    for _ in range(w): fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n
M, K = 16384, 2048
res = {}
for name, parts in (("qkv", [2048] * 3), ("gate_up", [5632] * 2), ("o", [2048]), ("down", None)):
    k = 5632 if name == "down" else K
    parts = parts or [2048]
    x = torch.randn(M, k, device=dev, dtype=torch.bfloat16)
    ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for n in parts]
    dys = [torch.randn(M, n, device=dev, dtype=torch.bfloat16) for n in parts]
    wj, dyj = torch.cat(ws), torch.cat(dys, 1)
    r = {}
    r["fprop_apart"] = timeit(lambda: [x @ w.t() for w in ws])
    r["fprop_joined"] = timeit(lambda: x @ wj.t())
    def dgrad_apart():
        d = dys[0] @ ws[0]
        for dy, w in zip(dys[1:], ws[1:]):
            d = torch.addmm(d, dy, w)
    r["dgrad_apart"] = timeit(dgrad_apart)
    r["dgrad_joined"] = timeit(lambda: dyj @ wj)
    r["wgrad_apart"] = timeit(lambda: [dy.t() @ x for dy in dys])
    r["wgrad_joined"] = timeit(lambda: dyj.t() @ x)
    r["cat_dy"] = timeit(lambda: torch.cat(dys, 1))
    # the quantized linear, eager, fwd + bwd
    wp = [w.float().requires_grad_() for w in ws]
    xr = x.clone().requires_grad_()
    for rec, sizes in (("bf16", None), ("ufp4", (len(parts),)), ("ufp4-nv", (1,) * len(parts)),
                       ("ufp4-nv", (len(parts),)), ("nvfp4", (1,) * len(parts))):
        recipe = quant.RECIPES[rec]
        signs = quant.rht_lib.random_signs(0).to(dev)
        def fb():
            with torch.autocast("cuda", torch.bfloat16):
                if rec == "bf16":
                    y = torch.nn.functional.linear(xr, torch.cat(wp))
                    ys = [y]
                else:
                    ys = quant._qlinear(xr, tuple(wp), None, recipe, signs, "", sizes)
                    ys = ys if isinstance(ys, tuple) else (ys,)
            torch.autograd.backward(ys, [torch.ones_like(yy) for yy in ys])
        r[f"fb_{rec}_{'x'.join(map(str, sizes or (0,)))}"] = timeit(fb, n=10, w=3)
    res[name] = r
    print(name, {k: round(v, 4) for k, v in r.items()}, flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "gemm_probe.json"), "w"), indent=1)
