"""User errors at the entry points (train, demo) are one line naming the field, flag or file, and
exit 2, before any model work; --verbose keeps the traceback. The entry points run as subprocesses,
as a user runs them; every case fails before jax is imported except the mesh check."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from matpo_jax.config import base_config, save_config, to_typed

REPO = Path(__file__).resolve().parents[2]
BASE = str(REPO / "configs" / "base.py")
REPRO = str(REPO / "configs" / "synthetic_repro.py")


def run(module: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", f"matpo_jax.{module}", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)


def one_fatal_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines[0].startswith("FATAL config error: ")
    return lines[0].removeprefix("FATAL config error: ")


def test_missing_config_file_and_missing_flag(tmp_path):
    line = one_fatal_line(run("train", "--config=configs/nope.py", f"--workdir={tmp_path}/w"))
    assert line == "config file configs/nope.py does not exist"
    line = one_fatal_line(run("train", f"--workdir={tmp_path}/w"))
    assert line == "--config is required (e.g. --config=configs/base.py)"
    assert not (tmp_path / "w").exists()  # nothing was created for a run that cannot start


def test_wrong_type_inside_a_config_file_names_file_and_line(tmp_path):
    config = tmp_path / "bad.py"
    config.write_text("from matpo_jax.config import base_config\n\n\ndef get_config(arg=None):\n"
                      "    c = base_config()\n    c.rl.lr = 'fast'\n    return c\n")
    line = one_fatal_line(run("train", f"--config={config}", f"--workdir={tmp_path}/w"))
    assert line.startswith(f"{config}:6 (c.rl.lr = 'fast'): TypeError: ")
    assert "'lr'" in line


def test_wrong_type_after_the_colon_and_in_an_override(tmp_path):
    line = one_fatal_line(run("train", f"--config={REPRO}:noise=high", f"--workdir={tmp_path}"))
    assert line == f"{REPRO}:noise=high: noise = 'high': expected float"
    line = one_fatal_line(run("train", f"--config={BASE}", "--config.rollout.group_size=2.5",
                              f"--workdir={tmp_path}"))
    assert line == "rollout.group_size = '2.5': expected int"


def test_unknown_field_and_invalid_values(tmp_path):
    line = one_fatal_line(run("train", f"--config={BASE}", "--config.rl.lrr=1",
                              f"--workdir={tmp_path}"))
    assert line == "unknown field rl.lrr (did you mean rl.lr?)"
    line = one_fatal_line(run("train", f"--config={BASE}", "--config.rl.lr=inf",
                              f"--workdir={tmp_path}"))
    assert line == "rl.lr = inf: must be finite"


def test_the_demo_takes_the_same_overrides(tmp_path):
    """`demo --config.x=...` was an unknown absl flag; now it is the train command line: a good
    override is applied and validated with the rest, a bad one names its field."""
    line = one_fatal_line(run("demo", "--config.train.steps=3", "--config.rl.lr=-1",
                              f"--workdir={tmp_path}"))
    assert line == "rl.lr = -1.0: must be > 0"
    line = one_fatal_line(run("demo", "--config.rl.lrr=1", f"--workdir={tmp_path}"))
    assert line == "unknown field rl.lrr (did you mean rl.lr?)"


def test_unwritable_workdir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    line = one_fatal_line(run("train", f"--config={BASE}", f"--workdir={blocker}/run"))
    assert line == f"--workdir={blocker}/run: cannot create it (Not a directory)"


def test_verbose_keeps_the_traceback(tmp_path):
    result = run("train", f"--config={BASE}", "--config.rl.lr=nan", f"--workdir={tmp_path}",
                 "--verbose")
    assert result.returncode != 0 and "Traceback" in result.stderr
    assert "rl.lr = nan: must be a number, got nan" in result.stderr


def test_mesh_that_does_not_match_the_devices(tmp_path):
    result = run("train", f"--config={BASE}", "--config.mesh.data=3", "--config.mesh.fsdp=1",
                 f"--workdir={tmp_path}", timeout=300)
    line = one_fatal_line(result)
    assert line.startswith("mesh.data*mesh.fsdp*mesh.tensor = 3 but ") and line.endswith("devices")


def test_changed_config_on_resume_is_refused_before_anything_is_written(tmp_path):
    """The workdir holds a run (its config.json): a rerun with other settings lists each changed
    field and stops; config.json is left as it was."""
    workdir = tmp_path / "run"
    saved = save_config(to_typed(base_config()), workdir)
    before = saved.read_bytes()
    result = run("train", f"--config={BASE}:rollout.mode=single,rl.lr=0.5,data.batch_size=3",
                 "--config.train.steps=150", f"--workdir={workdir}")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "FATAL config error: 5 config problems:"
    assert sorted(line.split(" = ")[0].strip() for line in lines[1:5]) == [
        "data.batch_size", "rl.lr", "rollout.mode", "train.steps"]
    assert f"rl.lr = 0.5, but the run in {workdir} has 1e-05" in result.stderr
    assert "--allow_config_change=train.steps accepts the change of train.steps" in lines[5]
    assert saved.read_bytes() == before
    assert sorted(os.listdir(workdir)) == ["config.json"]
    # Only total steps and cadences may be allowed to change.
    line = one_fatal_line(run("train", f"--config={BASE}", "--allow_config_change=rl.lr",
                              f"--workdir={workdir}"))
    assert line.startswith("--allow_config_change=rl.lr: only train.steps, ")
    assert json.loads(saved.read_text())["rl"]["lr"] == 1e-5


def test_a_config_file_that_exits_or_returns_none_is_reported_as_such(tmp_path):
    """Before: sys.exit(0) in get_config made `train` exit 0 having done nothing, and a None
    was reported as '--config is required'."""
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\n\n\ndef get_config(arg=None):\n    sys.exit(0)\n")
    line = one_fatal_line(run("train", f"--config={exits}", f"--workdir={tmp_path}/w"))
    assert line == (f"{exits}:5 (sys.exit(0)): the config file called sys.exit(0) instead of "
                    f"returning a config")
    none = tmp_path / "none.py"
    none.write_text("from matpo_jax.config import base_config\n\n\ndef get_config(arg=None):\n"
                    "    c = base_config()\n")
    line = one_fatal_line(run("train", f"--config={none}", f"--workdir={tmp_path}/w"))
    assert line == (f"config file {none}: get_config() returned NoneType (a missing return?), "
                    f"not a config")
    assert not (tmp_path / "w").exists()
