"""One run per workdir (issue 23 item 3): a second run is refused with one line naming the
holder's pid and host; the lock of a dead run is taken over. Holders are real processes."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.gcs_emulator import gcs_root, gcs_server  # noqa: F401
from matpo_jax.run.workdir_lock import LOCK_FILE, WorkdirInUse, workdir_lock

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "synthetic_tiny.py")
HOLD = ("import sys, time\nfrom matpo_jax.run.workdir_lock import workdir_lock\n"
        "with workdir_lock(sys.argv[1]):\n    print('locked', flush=True)\n    time.sleep(600)\n")


@pytest.fixture
def holder(tmp_path):
    """A process holding the lock of tmp_path/run until the test ends (or kills it)."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(workdir)], cwd=REPO,
                               env=dict(os.environ, PYTHONPATH=str(REPO)),
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "locked"
    yield workdir, process
    process.kill()
    process.wait()


def test_a_second_holder_is_refused_naming_pid_and_host(holder):
    workdir, process = holder
    with pytest.raises(WorkdirInUse) as refused:
        with workdir_lock(str(workdir)):
            pytest.fail("two holders of one workdir")
    message = str(refused.value)
    assert "\n" not in message
    assert f"pid {process.pid} on host {socket.gethostname()}" in message


def test_the_lock_of_a_killed_run_is_taken_over(holder):
    workdir, process = holder
    process.send_signal(signal.SIGKILL)
    process.wait()
    with workdir_lock(str(workdir)):  # free: the kernel released the dead run's lock
        saved = json.loads((workdir / LOCK_FILE).read_text())
        assert saved["pid"] == os.getpid() and saved["host"] == socket.gethostname()
    with workdir_lock(str(workdir)):  # and released again at the end of a run
        pass


def test_train_on_a_workdir_in_use_stops_with_one_line_before_writing(holder):
    workdir, process = holder
    result = subprocess.run(
        [sys.executable, "-m", "matpo_jax.train", f"--config={TINY}", f"--workdir={workdir}"],
        cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO)),
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith(f"FATAL config error: --workdir={workdir} is in use by another "
                               f"run: pid {process.pid} on host {socket.gethostname()}")
    assert sorted(os.listdir(workdir)) == [LOCK_FILE]  # the holder's files only


def test_on_gcs_a_live_lock_refuses_and_a_stale_one_is_taken_over(gcs_root, monkeypatch):
    from matpo_jax.report import files
    from matpo_jax.run import workdir_lock as lock_lib

    monkeypatch.setattr(lock_lib, "SETTLE_S", 0.0)
    workdir = f"{gcs_root}/run"
    with workdir_lock(workdir):
        with pytest.raises(WorkdirInUse, match=f"pid {os.getpid()} on host "):
            with workdir_lock(workdir):
                pytest.fail("two holders of one workdir")
    assert not files.run_path(workdir, LOCK_FILE).exists()  # released at the end
    # A run that died on another host long ago (no heartbeat for STALE_AFTER_S): taken over.
    files.write_json_atomic(files.run_path(workdir, LOCK_FILE),
                            {"pid": 1, "host": "gone-host", "token": "old", "heartbeat": 0})
    with workdir_lock(workdir):
        assert json.loads(files.run_path(workdir, LOCK_FILE).read_text())["pid"] == os.getpid()


def test_is_held_names_a_live_holder_without_taking_the_lock(holder, tmp_path):
    from matpo_jax.run.workdir_lock import is_held
    workdir, process = holder
    assert not is_held(str(tmp_path / "nothing"))  # no lock file
    assert is_held(str(workdir)) and is_held(str(workdir))  # asking twice takes nothing
    with pytest.raises(WorkdirInUse):  # the holder still holds it
        with workdir_lock(str(workdir)):
            pass
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not is_held(str(workdir))  # the file stays, naming a dead pid
