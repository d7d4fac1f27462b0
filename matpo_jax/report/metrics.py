"""Run metrics: a JSON line per record in <workdir>/metrics.jsonl, TensorBoard event files and a
progress bar with ETA. (The per-role rollout statistics are agents.rollout_metrics.rollout_stats.)

Key convention: a metric that exists per role ends in "/<role>" ("response_tokens_mean/planner",
"response_tokens_mean/worker"), so TensorBoard shows the roles side by side and `plots.py` draws
them on one axes. Everything is written and flushed per call: a crash loses nothing already logged.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import tqdm
from matpo_jax.report.files import is_remote, makedirs, open_append, run_path, write_text_atomic

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
ROLES = ("planner", "worker", "single")  # the roles of agents.trajectory


def split_role(key: str) -> tuple[str, str | None]:
    """Splits a role suffix off: "tool_calls_mean/worker" -> ("tool_calls_mean", "worker")."""
    base, _, last = key.rpartition("/")
    return (base, last) if base and last in ROLES else (key, None)


def to_scalar(name: str, value: Any) -> float:
    """A python/numpy/jax scalar (or 1-element array) as a float; anything else is an error."""
    try:
        array = np.asarray(value)
        if array.size != 1 or array.dtype.kind not in "biuf":
            raise TypeError
        return float(array.reshape(()))
    except (TypeError, ValueError):
        raise ValueError(f"metric {name!r} is not a numeric scalar: {value!r}") from None


class MetricsWriter:
    """Appends metrics to metrics.jsonl and TensorBoard, flushing both on every write.

    On a resumed run pass `resume_step`: records of the crashed run's steps after it (which are
    about to be redone) are dropped so the log reads as one run. Only the primary host should
    write; the others pass `enabled=False` and get a writer that does nothing.

    On an object-store workdir (gs://) metrics.jsonl is rewritten whole on every write (objects
    cannot be appended to), and TensorBoard events go to a local temporary folder whose event file
    is uploaded to <workdir>/tensorboard/ after every write (tensorboardX writes local files).
    """

    def __init__(self, workdir: str | Path, *, tensorboard: bool = True,
                 resume_step: int | None = None, enabled: bool = True):
        self.enabled = enabled
        self.path = run_path(workdir, METRICS_FILE)
        self._file = None
        self._tb = None
        self._tb_upload = None  # (local event file folder, workdir's tensorboard folder)
        if not enabled:
            return
        makedirs(self.path.parent)
        if resume_step is not None:
            self._drop_after(resume_step)
        self._file = open_append(self.path)
        if tensorboard:
            # tensorboardX's SummaryWriter hands events to a background thread and its flush()
            # does not wait for them; its synchronous EventsWriter makes "written" mean on disk.
            # Imported here: tensorboardX imports torch (seconds), which a run without
            # TensorBoard files never needs.
            from tensorboardX.event_file_writer import EventsWriter

            logdir = run_path(workdir, TENSORBOARD_DIR)
            if is_remote(workdir):
                local = tempfile.mkdtemp(prefix="matpo_tensorboard_")
                self._tb_upload = (local, logdir)
                logdir = Path(local)
            logdir.mkdir(parents=True, exist_ok=True)
            # The file name holds whole seconds: a resume within the same second would reuse
            # (and truncate) the last session's file. A nanosecond suffix keeps names unique
            # and in time order, the order TensorBoard reads them in.
            self._tb = EventsWriter(str(logdir / "events"),
                                    filename_suffix=f".{time.time_ns():020d}")
            if resume_step is not None:
                self._restart_events(resume_step)

    def _drop_after(self, step: int) -> None:
        if self.path.exists():
            kept = [r for r in read_records(self.path) if r.get("step", -1) <= step]
            write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def truncate_after(self, step: int) -> None:
        """Drops the records of steps after `step` (a resumed run is about to redo them)."""
        if not self.enabled:
            return
        self._file.close()
        self._drop_after(step)
        self._file = open_append(self.path)
        if self._tb is not None:
            self._restart_events(step)

    def _restart_events(self, step: int) -> None:
        """TensorBoard's restart marker: a SessionLog START at step + 1 makes it discard the
        crashed run's events of the steps about to be redone (they sit in the older event file,
        which TensorBoard reads too); without it every redone step showed twice."""
        from tensorboardX.proto import event_pb2

        self._tb.write_event(event_pb2.Event(
            wall_time=time.time(), step=int(step) + 1,
            session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))
        self._tb.flush()
        self._upload_events()

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict:
        """Logs one record {step, time, **metrics}; values must be numeric scalars."""
        record = {"step": int(step), "time": time.time()}
        record.update({name: to_scalar(name, value) for name, value in metrics.items()})
        if not self.enabled:
            return record
        self._file.write(json.dumps(record) + "\n")  # NaN/inf written as JSON5 tokens, read back
        self._file.flush()
        if self._tb is not None:
            from tensorboardX.proto import summary_pb2

            summary = summary_pb2.Summary(value=[
                summary_pb2.Summary.Value(tag=name, simple_value=value)
                for name, value in record.items() if name not in ("step", "time")])
            self._write_event(record["step"], record["time"], summary)
        return record

    def write_once(self, step: int, metrics: Mapping[str, Any]) -> dict | None:
        """Logs the record unless metrics.jsonl has one at `step` with the same metrics already:
        an evaluation a resumed run logged before it stopped is not logged twice."""
        if self.enabled and self.path.exists():
            names = set(metrics)
            if any(r.get("step") == step and names <= set(r) for r in read_records(self.path)):
                return None
        return self.write(step, metrics)

    def write_text(self, step: int, tag: str, text: str) -> None:
        """A text sample (e.g. one decoded rollout) for TensorBoard's text tab."""
        if self._tb is not None:
            from tensorboardX import summary as tensorboard_summary

            self._write_event(int(step), time.time(), tensorboard_summary.text(tag, text))

    def _write_event(self, step: int, wall_time: float, summary) -> None:
        from tensorboardX.proto import event_pb2

        self._tb.write_event(event_pb2.Event(wall_time=wall_time, step=step, summary=summary))
        self._tb.flush()
        self._upload_events()

    def _upload_events(self) -> None:
        """Remote workdirs: the local event file, copied whole over its object."""
        if self._tb_upload is not None:
            local, remote = self._tb_upload
            for name in os.listdir(local):
                (remote / name).write_bytes(Path(local, name).read_bytes())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
            self._upload_events()
            if self._tb_upload is not None:
                shutil.rmtree(self._tb_upload[0], ignore_errors=True)
                self._tb_upload = None

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_records(path: str | Path) -> list[dict]:
    """The raw records of a metrics.jsonl in file order; a torn last line (crash) is skipped."""
    records = []
    for line in run_path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def load_metrics(path: str | Path) -> list[dict]:
    """One merged record per step, sorted by step (train and eval records of a step are joined;
    for a key written twice at one step the later value wins)."""
    by_step: dict[int, dict] = {}
    for record in read_records(path):
        if "step" in record:
            by_step.setdefault(int(record["step"]), {}).update(record)
    return [by_step[step] for step in sorted(by_step)]


def series(records: Sequence[Mapping], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the records that carry `key`."""
    points = [(r["step"], r[key]) for r in records if key in r and r[key] is not None]
    steps, values = zip(*points) if points else ((), ())
    return np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64)


# ------------------------------------------------------------------------------ progress bar
class Progress:
    """A progress bar over training steps with ETA, showing a few metrics after each step.

    Resumed runs pass `initial` so the ETA counts only the steps still to do.
    """

    def __init__(self, total: int, *, initial: int = 0, desc: str = "train",
                 keys: Sequence[str] = ("reward_mean", "accuracy", "loss"), enabled: bool = True,
                 file=None):
        self.keys = tuple(keys)
        self._bar = tqdm.tqdm(total=total, initial=initial, desc=desc, unit="step",
                              disable=not enabled, file=file or sys.stderr, dynamic_ncols=True,
                              smoothing=0.3)  # RL steps vary a lot: weight recent ones

    def update(self, metrics: Mapping[str, Any] | None = None, steps: int = 1) -> None:
        if metrics:
            shown = {k: to_scalar(k, metrics[k]) for k in self.keys if k in metrics}
            self._bar.set_postfix({k: f"{v:.4g}" if math.isfinite(v) else str(v)
                                   for k, v in shown.items()}, refresh=False)
        self._bar.update(steps)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
