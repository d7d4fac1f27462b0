"""Issue 48 item 11: evaluate and plan printed tracebacks where train prints one line (an unknown
dataset, a typo'd config path, a missing checkpoint, an unknown topology, a missing libtpu);
--hbm_per_chip_gib=0 silently skipped train's memory check; --workdir='~/x' created a literal
./~ directory. Every entry point runs as a process, as a user runs it."""
from __future__ import annotations

import importlib.util
import os

import pytest

from test_entry_point_errors import BASE, REPO, one_fatal_line, run

TINY = str(REPO / "configs" / "synthetic_tiny.py")


def test_evaluate_user_errors_are_one_line(tmp_path):
    work = f"--workdir={tmp_path / 'bench'}"
    line = one_fatal_line(run("evaluate", "--config=configs/synthetic_tny.py", work))
    assert line == "config file configs/synthetic_tny.py does not exist"
    line = one_fatal_line(run("evaluate", f"--config={TINY}", "--datasets=musiqeu", work))
    assert line.startswith("--datasets: 'musiqeu' is not a dataset; known datasets are ")
    line = one_fatal_line(run("evaluate", f"--config={TINY}", "--datasets=frames",
                              f"--checkpoint={tmp_path / 'no_run'}", work))
    assert line == f"--checkpoint={tmp_path / 'no_run'}: no such directory"
    line = one_fatal_line(run("evaluate", f"--config={TINY}", "--samples=0", work))
    assert line == "--samples=0 must be >= 1"


def test_plan_user_errors_are_one_line():
    line = one_fatal_line(run("plan", "--config=configs/synthetic_tny.py", "--topology=v5e-8"))
    assert line == "config file configs/synthetic_tny.py does not exist"
    line = one_fatal_line(run("plan", f"--config={BASE}", "--config.rl.lrr=1",
                              "--topology=v5e-8"))
    assert line.startswith("unknown field rl.lrr")
    line = one_fatal_line(run("plan", f"--config={BASE}", "--topology=v9x-8"))
    assert line.startswith("--topology: topology 'v9x-8': expected e.g. v5e-8")
    if importlib.util.find_spec("libtpu") is None:
        line = one_fatal_line(run("plan", f"--config={BASE}", "--topology=v5e-8"))
        assert line == ("--topology=v5e-8: compiling for a TPU slice needs libtpu, which this "
                        "environment lacks (pip install 'jax[tpu]')")


@pytest.mark.parametrize("budget", ["0", "-4"])
def test_a_memory_budget_that_is_not_positive_is_refused(tmp_path, budget):
    line = one_fatal_line(run("train", f"--config={BASE}", f"--hbm_per_chip_gib={budget}",
                              f"--workdir={tmp_path / 'w'}"))
    assert line.startswith(f"--hbm_per_chip_gib={budget}: must be > 0")
    assert not (tmp_path / "w").exists()


def test_a_quoted_tilde_workdir_means_home_not_a_tilde_folder(tmp_path, monkeypatch):
    from matpo_jax.config import check_workdir

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert check_workdir("~/runs/x") == str(tmp_path / "home" / "runs" / "x")
    assert (tmp_path / "home" / "runs" / "x").is_dir() and not (tmp_path / "~").exists()
