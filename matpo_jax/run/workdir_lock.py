"""One run per workdir: a lock `<workdir>/run.lock`, held from before the first write to the end.

Two runs on one workdir would both write its checkpoints, metrics and config.json; the second
one started is refused with one line naming the holder (pid, host, start time).

Local (and NFS) workdirs: an flock on the file. The kernel releases it when the holder exits,
however it dies (SIGKILL, OOM), so a lock left by a dead process is simply free; the file only
says who holds it, for the refusal. It is never deleted: a run that deleted it could let two
others lock two different files of the same name.

Object stores (gs://) have no locks; there it is best effort (report/files.py's paths): the lock
is an object holding the holder and a heartbeat the holder rewrites every HEARTBEAT_S. A lock
whose heartbeat is older than STALE_AFTER_S (a preempted or killed run), or whose holder is a
dead pid on this host, is taken over. Two runs starting within a second may both write it; each
reads it back after SETTLE_S and only the one whose write stayed goes on.

Multi-process runs: only process 0 takes it (run/experiment.py).
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid

from matpo_jax.config.errors import ConfigError
from matpo_jax.report import files

log = logging.getLogger(__name__)
LOCK_FILE = "run.lock"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 180.0
SETTLE_S = 2.0


class WorkdirInUse(ConfigError):
    """Another live run holds the workdir (a user error: one line at the entry points)."""


def _holder() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "token": uuid.uuid4().hex,
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "heartbeat": time.time()}


def _refusal(workdir: str, holder: dict) -> WorkdirInUse:
    return WorkdirInUse(
        f"--workdir={workdir} is in use by another run: pid {holder.get('pid', '?')} on host "
        f"{holder.get('host', '?')}, started {holder.get('started', '?')}; wait for it to end "
        "or choose another workdir")


def _pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError):
        return True  # another user's process, or an unreadable pid: assume it runs
    return True


@contextlib.contextmanager
def workdir_lock(workdir: str):
    """Holds the workdir for the `with` body; raises WorkdirInUse when a live run holds it."""
    if files.is_remote(workdir):
        with _object_lock(workdir):
            yield
        return
    with _file_lock(workdir):
        yield


def is_held(workdir: str) -> bool:
    """Whether a live run of another process holds the workdir now, judged by the holder the
    lock names (never by locking: a probe that took the lock, even shared, could make a
    starting run's lock fail).
    Local: its holder's pid runs on this host (the flock dies with the holder, the file stays);
    an object store: its lock object is live. No lock file: not held."""
    if files.is_remote(workdir):
        holder = _read_object(files.run_path(workdir, LOCK_FILE))
        return bool(holder) and _is_live(holder)
    try:
        with open(os.path.join(workdir, LOCK_FILE), encoding="utf-8") as f:
            holder = json.loads(f.read() or "null")
    except (FileNotFoundError, ValueError):
        return False
    if not isinstance(holder, dict) or holder.get("host") != socket.gethostname():
        return False  # another host's run: its flock is not visible from here either
    return _pid_alive(holder.get("pid"))


# ============================================================================ local: flock
def _read_holder(fd: int) -> dict:
    for _ in range(20):  # the holder writes its line just after locking
        try:
            holder = json.loads(os.pread(fd, 4096, 0) or b"null")
        except ValueError:
            holder = None
        if isinstance(holder, dict):
            return holder
        time.sleep(0.05)
    return {}


@contextlib.contextmanager
def _file_lock(workdir: str):
    fd = os.open(os.path.join(workdir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _refusal(workdir, _read_holder(fd)) from None
        except OSError as error:  # a filesystem without locks (some FUSE mounts)
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            log.warning("%s: the filesystem cannot lock files; a second run on this workdir "
                        "would not be refused", workdir)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(_holder()) + "\n").encode(), 0)
        os.fsync(fd)
        yield
    finally:
        os.close(fd)  # releases the flock


# ============================================================================ object stores
def _read_object(path) -> dict | None:
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError:  # torn or foreign: not a holder
        return {}
    return holder if isinstance(holder, dict) else {}


def _is_live(holder: dict) -> bool:
    if time.time() - float(holder.get("heartbeat") or 0) > STALE_AFTER_S:
        return False
    if holder.get("host") == socket.gethostname():
        return _pid_alive(holder.get("pid"))
    return True


@contextlib.contextmanager
def _object_lock(workdir: str):
    path = files.run_path(workdir, LOCK_FILE)
    current = _read_object(path)
    if current and _is_live(current):
        raise _refusal(workdir, current)
    mine = _holder()
    files.write_json_atomic(path, mine)
    time.sleep(SETTLE_S)  # a run that wrote at the same moment: the last write stays
    current = _read_object(path) or {}
    if current.get("token") != mine["token"]:
        raise _refusal(workdir, current)
    stop = threading.Event()

    def beat():
        while not stop.wait(HEARTBEAT_S):
            try:
                files.write_json_atomic(path, {**mine, "heartbeat": time.time()})
            except Exception:  # noqa: BLE001 - a missed beat is retried; the run goes on
                log.warning("%s: could not refresh the workdir lock", workdir, exc_info=True)

    thread = threading.Thread(target=beat, daemon=True, name="workdir-lock-heartbeat")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        if (_read_object(path) or {}).get("token") == mine["token"]:
            path.unlink()
