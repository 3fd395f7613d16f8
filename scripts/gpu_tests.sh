#!/usr/bin/env bash
# The whole test suite on a GPU machine, the tests marked `full` included: on CUDA the kernel tests
# run compiled kernels against the reference (bit for bit), and the GPU-only tests (kept-kernel
# launch path, torch.compile, fast launch) run instead of skipping. The output, with the machine, the
# versions and the commit at its top and the reasons of any skip at its end, goes to OUT.
#   [NPROC=4] scripts/gpu_tests.sh [OUT] [PYTEST_ARGS...]     (NPROC test processes share the GPU)
#   scripts/gpu_tests.sh bench/results/gpu_tests_h100.txt
#   scripts/gpu_tests.sh /tmp/t.txt tests/test_kernels.py      # one file
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_tests_$(date -u +%Y-%m-%d).txt}; shift || true
py=${PYTHON:-python}
tests=("$@"); [ ${#tests[@]} -eq 0 ] && tests=(tests)

if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "no CUDA device: this script is for a GPU machine (the CPU suite is: python -m pytest -q -n 2 tests)" >&2
    exit 2
fi
mkdir -p "$(dirname "$out")"
{
    echo "# NPROC=${NPROC:-4} scripts/gpu_tests.sh ${tests[*]}  ($(date -u '+%Y-%m-%d %H:%M UTC'))"
    echo "# commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/# GPU /'
    "$py" -c 'import torch, triton; print(f"# torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}")'
} > "$out"
env -u TRITON_INTERPRET "$py" -m pytest -q -n "${NPROC:-4}" --full -rs --durations=20 -p no:cacheprovider "${tests[@]}" 2>&1 | tee -a "$out"
status=${PIPESTATUS[0]}
echo "# exit status $status" >> "$out"
echo "output: $out" >&2
exit "$status"
