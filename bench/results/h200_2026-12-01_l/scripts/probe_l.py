"""Probes of call 1 of the twelfth set (run from the repo root), timed and bit-compared by the eleventh
set's probes.run_cases (kernels_bench.bench, L2 flushed by a read; each case's bits against the first
case of its spec, dim, output and variant).

  python probe_l.py tiles      column codes and dequant under wider tiles (BM 128, 256), and the rows
                               kernels at the default tiles (all 5 specs, alone and fused RHT)
  python probe_l.py mfirst     the same column cases with the grid's first axis along m (programs next
                               to each other in launch order read the same rows): run on a kernels.py
                               patched by mfirst_patch.py
(As run, the two were one script with the same cases, timer and printed columns.)
"""
import sys
sys.path.insert(0, "bench/results/h200_2026-12-01_k/scripts")
import probes  # noqa: E402

SPECS = probes.SPECS  # E2M1, UFP4, NVFP4, MXFP4, SR
CODES_TILES = [None, (128, 4, 4), (128, 2, 4), (128, 8, 8), (256, 2, 4), (256, 4, 8)]
DEQ_TILES = [None, (256, 2, 8)]


def cases(kind):
    """(spec, dim, output, variant, tma, tile)"""
    out = [(n, 0, "codes", v, False, t) for n in SPECS for v in ("alone", "fused_rht") for t in CODES_TILES]
    out += [(n, 0, "dequant", v, False, t) for n in SPECS for v in ("alone", "fused_rht") for t in DEQ_TILES]
    if kind == "tiles":
        out += [(n, -1, o, v, False, None) for n in SPECS for o in ("codes", "dequant") for v in ("alone", "fused_rht")]
    return out


if __name__ == "__main__":
    probes.run_cases(cases(sys.argv[1]), "bench",
                     lambda c: f"{c[0]:28s} dim {c[1]:2d} {c[2]:8s} {c[3]:10s} {str(c[5]):14s}")
