"""Metrics JSONL + TensorBoard writers, rollout statistics and the progress bar (the PNG figures:
test_plots.py, test_compare.py)."""
import io
import math
import struct

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

from matpo_jax.agents.trajectory import Rollout, ToolCallRecord
from matpo_jax.report.metrics import (MetricsWriter, Progress, load_metrics, read_records, 
                               split_role)
from matpo_jax.agents.rollout_metrics import rollout_stats, summarize_by_role


def read_tensorboard_scalars(logdir):
    """An independent reader of the TFRecord event files: checks both CRCs of every record and
    returns {tag: [(step, value), ...]}."""
    files = sorted(logdir.glob("events.out.tfevents.*"))
    assert files, f"no event file in {logdir}"
    scalars = {}
    for path in files:
        data = path.read_bytes()
        assert len(data) > 0
        offset = 0
        while offset < len(data):
            header = data[offset:offset + 8]
            (length,) = struct.unpack("Q", header)
            (header_crc,) = struct.unpack("I", data[offset + 8:offset + 12])
            payload = data[offset + 12:offset + 12 + length]
            (payload_crc,) = struct.unpack("I", data[offset + 12 + length:offset + 16 + length])
            assert header_crc == masked_crc32c(header) and payload_crc == masked_crc32c(payload)
            offset += 16 + length
            event = event_pb2.Event.FromString(payload)
            for value in event.summary.value:
                content = value.tensor.string_val[0].decode() if value.HasField("tensor") \
                    else value.simple_value
                scalars.setdefault(value.tag, []).append((event.step, content))
    return scalars


def write_fake_run(workdir, seed=0, steps=12, offset=0.0):
    """A run whose reward rises, with per-role lengths and tool calls."""
    rng = np.random.default_rng(seed)
    with MetricsWriter(workdir) as writer:
        for step in range(steps):
            writer.write(step, {
                "reward_mean": offset + step / steps + 0.05 * rng.standard_normal(),
                "accuracy": offset + step / (2 * steps),
                "loss": 1.0 / (step + 1),
                "response_tokens_mean/planner": 100.0 + 5 * step,
                "response_tokens_mean/worker": 300.0 - 5 * step,
                "tool_calls_mean/worker": 2.0 + 0.1 * step,
            })
            if step % 4 == 0:  # eval records land at the same steps, written separately
                writer.write(step, {"eval/accuracy": 0.3 + 0.01 * step})
    return workdir / "metrics.jsonl"


def test_jsonl_round_trip_and_flush_per_write(tmp_path):
    writer = MetricsWriter(tmp_path)
    record = writer.write(3, {"loss": jnp.float32(0.5), "accuracy": np.array([0.25]), "count": 7,
                              "flag": True, "nan": float("nan")})
    # Readable before close: flushed on every write, so a crash loses nothing.
    on_disk = read_records(tmp_path / "metrics.jsonl")
    assert on_disk[0]["step"] == 3 and on_disk[0]["loss"] == 0.5 and on_disk[0]["count"] == 7.0
    assert on_disk[0]["accuracy"] == 0.25 and on_disk[0]["flag"] == 1.0
    assert math.isnan(on_disk[0]["nan"]) and abs(on_disk[0]["time"] - record["time"]) < 1e-6
    writer.write(4, {"loss": 0.25})
    writer.write(4, {"eval/accuracy": 0.5})
    with pytest.raises(ValueError, match="'bad'"):
        writer.write(5, {"bad": np.zeros(3)})
    with pytest.raises(ValueError, match="'text'"):
        writer.write(5, {"text": "hello"})
    writer.close()
    merged = load_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in merged] == [3, 4]
    assert merged[1]["loss"] == 0.25 and merged[1]["eval/accuracy"] == 0.5


def test_torn_line_and_resume_truncation(tmp_path):
    path = write_fake_run(tmp_path, steps=10)
    with open(path, "a") as f:
        f.write('{"step": 10, "loss": 0.')  # the process died mid-line
    assert [r["step"] for r in load_metrics(path)] == list(range(10))
    # Resuming from the checkpoint at step 5 drops the records of steps 6.. that will be redone.
    with MetricsWriter(tmp_path, resume_step=5, tensorboard=False) as writer:
        writer.write(6, {"loss": 123.0})
    records = load_metrics(path)
    assert [r["step"] for r in records] == list(range(7))
    assert records[-1] == {"step": 6, "time": records[-1]["time"], "loss": 123.0}
    assert "eval/accuracy" in records[4]  # merged eval record of step 4 survived


def test_write_once_skips_a_record_a_resumed_run_logged_already(tmp_path):
    """The evaluation rows at step 0 and at the end are written once, however often the run is
    started: a second start finds them and writes nothing."""
    for start in range(2):
        with MetricsWriter(tmp_path, tensorboard=False, resume_step=None if start == 0 else 3) \
                as writer:
            first = writer.write_once(0, {"eval/accuracy": 0.1, "curve/accuracy": 0.2})
            if start == 0:
                writer.write(1, {"loss": 1.0})
            else:
                assert first is None
            writer.write_once(1, {"eval/accuracy": 0.3})  # new keys at a logged step: written
    records = read_records(tmp_path / "metrics.jsonl")
    assert [(r["step"], sorted(set(r) - {"step", "time"})) for r in records] == [
        (0, ["curve/accuracy", "eval/accuracy"]), (1, ["loss"]), (1, ["eval/accuracy"])]


def test_tensorboard_events_are_written_and_readable(tmp_path):
    writer = MetricsWriter(tmp_path)
    for step in range(5):
        writer.write(step, {"loss": 1.0 / (step + 1), "reward_mean/planner": 0.1 * step})
    writer.write_text(4, "sample/planner", "<tool_call>search</tool_call>")
    # Flushed per write: the events are on disk before close.
    scalars = read_tensorboard_scalars(tmp_path / "tensorboard")
    writer.close()
    assert [s for s, _ in scalars["loss"]] == [0, 1, 2, 3, 4]
    np.testing.assert_allclose([v for _, v in scalars["loss"]], [1, 1 / 2, 1 / 3, 1 / 4, 1 / 5],
                               rtol=1e-6)
    np.testing.assert_allclose([v for _, v in scalars["reward_mean/planner"]],
                               [0, 0.1, 0.2, 0.3, 0.4], rtol=1e-6, atol=1e-7)
    assert scalars["sample/planner/text_summary"] == [(4, "<tool_call>search</tool_call>")]


def test_disabled_writer_writes_nothing(tmp_path):
    with MetricsWriter(tmp_path / "run", enabled=False) as writer:
        assert writer.write(1, {"loss": 1})["loss"] == 1.0
    assert not (tmp_path / "run").exists()


def test_summaries_by_role_and_rollout_stats():
    assert split_role("tool_calls_mean/worker") == ("tool_calls_mean", "worker")
    assert split_role("eval/accuracy") == ("eval/accuracy", None)
    stats = summarize_by_role("len", [1, 3, 10], ["planner", "planner", "worker"])
    assert stats == {"len_mean/planner": 2.0, "len_min/planner": 1.0, "len_max/planner": 3.0,
                     "len_mean/worker": 10.0, "len_min/worker": 10.0, "len_max/worker": 10.0}

    planner = Rollout(0, "planner", 0, 0, None, finish_reason="answer", num_turns=3,
                      child_ids=[1, 2])
    planner.append([1, 2, 3], trainable=False)
    planner.append([4, 5], trainable=True, logprobs=[-0.1, -0.2])
    planner.tool_calls = [ToolCallRecord(0, "subagent", {}, True),
                          ToolCallRecord(1, None, None, False, error="unparseable")]
    workers = []
    for i, n in ((1, 4), (2, 6)):
        worker = Rollout(i, "worker", 0, 0, 0, finish_reason="max_turns", num_turns=2)
        worker.append(range(n), trainable=True)
        worker.tool_calls = [ToolCallRecord(0, "search", {"q": "x"}, True, tool_failed=(i == 2))]
        workers.append(worker)
    stats = rollout_stats([planner, *workers])
    assert stats["response_tokens_mean/planner"] == 2.0
    assert stats["response_tokens_mean/worker"] == 5.0
    assert stats["context_tokens_max/planner"] == 5.0
    assert stats["worker_calls_mean/planner"] == 2.0
    assert stats["tool_calls_mean/worker"] == 1.0
    assert stats["invalid_tool_call_frac/planner"] == 0.5
    assert stats["invalid_tool_call_frac/worker"] == 0.0
    assert stats["tool_failure_frac/worker"] == 0.5
    assert stats["finish_answer_frac/planner"] == 1.0
    assert stats["finish_max_turns_frac/worker"] == 1.0
    assert stats["rollouts/worker"] == 2.0


def test_progress_bar_shows_steps_eta_and_metrics():
    out = io.StringIO()
    with Progress(total=10, initial=2, keys=("loss",), file=out) as bar:
        bar.update({"loss": 0.125, "ignored": 1.0})
        bar.update({"loss": jnp.float32(0.0625)})
    text = out.getvalue()
    assert "4/10" in text and "loss=0.0625" in text and "ignored" not in text
    assert "<" in text  # tqdm's "elapsed<remaining" ETA field


