"""A run resumed twice logs every row once, in metrics.jsonl and in TensorBoard: the writer
sessions of experiment.py and the train loop (write_once of the evaluations, truncate_after of
the steps about to be redone) around two crashes. Before: TensorBoard, which reads every event
file of the folder, showed each redone step twice (the crashed session's value and the new one),
and a second session within the same second reused the first's event file name."""
from __future__ import annotations

import struct

from tensorboardX.proto import event_pb2

from matpo_jax.report.metrics import MetricsWriter, load_metrics, read_records

STEPS, CHECKPOINT_EVERY = 6, 2


def tensorboard_view(logdir) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)]} as TensorBoard shows it: files in name order; a SessionLog START at
    step s (a restart, event file version 2) discards the events read so far at steps >= s."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 16 + length
            if event.HasField("session_log") and \
                    event.session_log.status == event_pb2.SessionLog.START:
                scalars = {tag: [(s, v) for s, v in points if s < event.step]
                           for tag, points in scalars.items()}
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def session(workdir, resume_step, crash_after=None):
    """One process's life: the SFT evaluation row, RL steps from the last checkpoint (each step's
    loss is 10 * step + the session's number, so a stale value is visible), the final row."""
    number = 0 if resume_step is None else resume_step
    with MetricsWriter(workdir, resume_step=resume_step) as writer:
        writer.write_once(0, {"eval/accuracy": 0.1})
        start = resume_step or 0
        writer.truncate_after(start)  # the train loop, after restoring the checkpoint
        for step in range(start + 1, STEPS + 1):
            writer.write(step, {"loss": 10.0 * step + number})
            if step == crash_after:
                return  # killed: rows up to here logged, checkpoints only every 2 steps
        writer.write_once(STEPS, {"eval/accuracy": 0.6})


def test_a_run_resumed_twice_logs_every_row_once(tmp_path):
    session(tmp_path, None, crash_after=3)  # checkpoint at 2
    session(tmp_path, 2, crash_after=5)  # checkpoint at 4
    session(tmp_path, 4)

    records = read_records(tmp_path / "metrics.jsonl")
    pairs = [(r["step"], key) for r in records for key in r if key not in ("step", "time")]
    assert len(pairs) == len(set(pairs)), pairs  # no (step, metric) logged twice
    steps = [r["step"] for r in records]
    assert steps == sorted(steps) and [r["step"] for r in load_metrics(
        tmp_path / "metrics.jsonl")] == list(range(STEPS + 1))

    view = tensorboard_view(tmp_path / "tensorboard")
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 3
    for tag, points in view.items():
        tag_steps = [s for s, _ in points]
        assert tag_steps == sorted(set(tag_steps)), (tag, points)  # strictly increasing
    # The values of the session that last ran each step.
    assert view["loss"] == [(1, 10.0), (2, 20.0), (3, 32.0), (4, 42.0), (5, 54.0), (6, 64.0)]
    assert [(s, round(v, 6)) for s, v in view["eval/accuracy"]] == [(0, 0.1), (STEPS, 0.6)]
