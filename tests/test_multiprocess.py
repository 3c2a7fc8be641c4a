"""SFT with two CPU processes (gloo) through torchrun: the multi-GPU/multi-node path, proved on a CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("trl")

from tests.train_helpers import demo_store  # noqa: E402


def test_two_process_sft_runs(tmp_path):
    from omrl.models import cached_tiny_model

    tiny = cached_tiny_model(hidden=32)
    store = demo_store(tmp_path / "s", n=16)
    omrl = shutil.which("omrl") or str(Path(sys.executable).parent / "omrl")
    out = tmp_path / "out"
    # torchrun is what `accelerate launch --multi_gpu` runs under the hood; on CPU the trainer picks gloo.
    # --standalone: torchrun picks a free port itself (a fixed port collided with other jobs on the machine).
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           omrl, "train", "sft",
           f"model={tiny}", f"store={store.path}", f"output_dir={out}", "batch_size=2", "max_steps=2",
           "logging_steps=1", "quiet=true"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((out / "omrl_sft.json").read_text())
    assert len(record["losses"]) == 2 and all(loss == loss and loss > 0 for loss in record["losses"])
    assert (out / "config.json").exists()
    assert record["world_size"] == 2  # both processes took part (gloo), rank 0 saved
