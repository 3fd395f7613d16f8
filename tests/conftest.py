"""Shared test setup: the repository root on sys.path, and Triton's CPU interpreter where there is no
GPU (it must be chosen before triton is first imported, so it is set here, before any test module)."""
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
