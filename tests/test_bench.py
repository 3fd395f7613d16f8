"""bench/trainer_bench.py on the CPU: the warm-up runs, the timed runs, and ratios read from the logs."""
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from test_train import VOCAB, write_dataset

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.full
def test_trainer_bench_reads_its_runs_logs(tmp_path):
    data_dir, out = write_dataset(tmp_path / "data"), tmp_path / "runs"
    cmd = [sys.executable, str(ROOT / "bench" / "trainer_bench.py"), str(ROOT / "configs" / "tiny.toml"),
           "--recipes", "bf16,ufp4", "--steps", "6", "--skip", "2", "--eval-interval", "3", "--warm", "2",
           "--out-dir", str(out), "--json", str(tmp_path / "r.json"), "--",
           "--train.device=cpu", "--train.compile=false", f"--data.dir={data_dir}", f"--model.vocab_size={VOCAB}",
           "--model.seq_len=32", "--data.batch_size=4", "--data.eval_batches=2"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)  # another cwd: paths resolve
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warm-up: 2 runs, 2 side by side" in proc.stdout
    for r in ("bf16", "ufp4"):  # the warm-up ran 4 steps with an evaluation; the timed run its 6
        warm = [json.loads(line) for line in (out / "warm" / f"tiny-{r}" / "log.jsonl").read_text().splitlines()]
        assert [w["step"] for w in warm] == [1, 2, 3, 4] and "val_loss" in warm[1]
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["device"] == "cpu" and [r["recipe"] for r in res["results"]] == ["bf16", "ufp4"]  # where they ran
    for r in res["results"]:
        log = [json.loads(line) for line in (out / f"tiny-{r['recipe']}" / "log.jsonl").read_text().splitlines()]
        kept = [x for x in log if x["step"] > 2]
        assert r["steps"] == 6 and r["final_loss"] == log[-1]["loss"]
        assert r["median_tok_s"] == pytest.approx(statistics.median(x["tok_s"] for x in kept))
    bf16, ufp4 = res["results"]
    assert bf16["x_bf16_median"] == 1.0
    assert ufp4["x_bf16_median"] == pytest.approx(bf16["median_tok_s"] / ufp4["median_tok_s"])
