"""A multi-process `train` whose peer never joins fails within --initialization_timeout_s with one
line naming the coordinator and the missing process (not jax's abort after 5 minutes)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "synthetic_tiny.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lone_process(tmp_path, process_id: int, coordinator: str):
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "matpo_jax.train", f"--config={TINY}", f"--workdir={tmp_path}/w",
         f"--coordinator={coordinator}", "--num_processes=2", f"--process_id={process_id}",
         "--initialization_timeout_s=8"],
        cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO)),
        capture_output=True, text=True, timeout=120)
    return result, time.monotonic() - start


def test_process_0_alone_names_the_process_that_never_joined(tmp_path):
    coordinator = f"127.0.0.1:{free_port()}"
    result, elapsed = lone_process(tmp_path, 0, coordinator)
    assert result.returncode == 3, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"FATAL: process 0 of 2 waited 8 s at the coordinator {coordinator} and not every "
        f"process joined: process 1 never joined; start every process with the same "
        f"--coordinator and --num_processes, or raise --initialization_timeout_s")
    assert "Check failure stack trace" not in result.stderr  # jax's abort never came
    assert elapsed < 60  # 8 s of waiting, plus starting python and jax on a busy machine


def test_a_process_whose_coordinator_is_absent_says_so(tmp_path):
    coordinator = f"127.0.0.1:{free_port()}"  # nothing listens there
    result, elapsed = lone_process(tmp_path, 1, coordinator)
    assert result.returncode == 3, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"FATAL: process 1 of 2 waited 8 s at the coordinator {coordinator} "
                           f"and not every process joined: process 0 (the coordinator, "
                           f"{coordinator}) is not reachable ("), last
    assert elapsed < 60
