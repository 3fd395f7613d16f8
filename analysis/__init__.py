"""Science tools for nanofp4: what 4-bit quantization does to tensors, GEMM chains and training runs.

    python -m analysis.analyze grid                  # grid geometry, signal gain/NMSE/SQNR per format
    python -m analysis.analyze chain [--ckpt PATH]   # multiplicative signal loss over a chain of GEMMs
    python -m analysis.analyze tensors --ckpt PATH   # real operands of a trained model: NMSE, ΔSQNR, B_eff
    python -m analysis.compare RUN_OR_LOG ... [--pair A,B] [--power HALF]   # signed differences vs bf16, intervals
    python -m analysis.verdict LOGS_DIR [--tensors T.json] [--gradients G.json]   # the claims table
    python -m analysis.gradients --ckpt BF16_CKPT --recipe ufp4 --recipe e2m1   # gradient shrinkage per layer
    python -m analysis.runlog RUN_DIR ... --out DIR       # compact logs (one gzipped JSONL per run)
    python -m analysis.sweep --ladder tiny-ladder --recipes bf16,ufp4 --out runs/sweep
    python -m analysis.sweep --study dense-small --out runs/study --results LOGS_DIR --gpus 0 --jobs 4
    python -m analysis.scaling_fit runs/sweep

Run them from the repository root (they import quant, model and train from there). The per-operand
statistics a training run can log are ../monitor.py; stats.py the t intervals and the seed count for a
given interval; paper.json the UFP4 paper's figures that verdict quotes. Figures are PNGs (matplotlib, a plotting-only
dependency); every command also prints and writes its tables as markdown.
"""
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"  # default output directory (git-ignored)


def pyplot():
    """matplotlib.pyplot with the file-only Agg backend, or a clear error naming the fix."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise SystemExit("plots need matplotlib: pip install matplotlib (or pass --no-plots)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def md_table(headers, rows) -> str:
    """A markdown table; floats are printed with 5 significant digits unless already strings."""
    def cell(v):
        return f"{v:.5g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(map(str, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
