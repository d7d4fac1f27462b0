"""The grid runner: dependencies respected, a failure stops only what waits for it, finished jobs
skipped, never more than `parallel` at once (real subprocesses writing marker files)."""
import os
import sys

import pytest

from matpo_jax.run.job_graph import Job, run_jobs

# Appends "<name> start" / "<name> end" to a shared file around a short sleep, then exits `rc`.
_STEP = ("import sys, time\n"
         "path, name, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])\n"
         "open(path, 'a').write(name + ' start\\n'); time.sleep(0.3)\n"
         "open(path, 'a').write(name + ' end\\n'); sys.exit(rc)\n")


def _job(tmp_path, name, after=(), rc=0, **kw):
    command = [sys.executable, "-c", _STEP, str(tmp_path / "trace"), name, str(rc)]
    return Job(name, command, log_path=str(tmp_path / "logs" / f"{name}.log"), after=after, **kw)


def _trace(tmp_path):
    return (tmp_path / "trace").read_text().split("\n")[:-1]


def test_dependencies_run_first_and_parallelism_is_bounded(tmp_path):
    jobs = [_job(tmp_path, "a"), _job(tmp_path, "b", after=("a",)), _job(tmp_path, "c"),
            _job(tmp_path, "d", after=("b", "c"))]
    assert run_jobs(jobs, parallel=2, echo=lambda _: None) == {}
    trace = _trace(tmp_path)
    assert sorted(trace) == sorted(f"{n} {e}" for n in "abcd" for e in ("start", "end"))
    for first, then in (("a", "b"), ("b", "d"), ("c", "d")):
        assert trace.index(f"{first} end") < trace.index(f"{then} start")
    running = peak = 0
    for line in trace:
        running += 1 if line.endswith("start") else -1
        peak = max(peak, running)
    assert peak == 2  # a and c together, never three


def test_a_failure_fails_only_what_waits_for_it(tmp_path):
    jobs = [_job(tmp_path, "bad", rc=3), _job(tmp_path, "child", after=("bad",)),
            _job(tmp_path, "grandchild", after=("child",)), _job(tmp_path, "other")]
    failed = run_jobs(jobs, parallel=1, echo=lambda _: None)
    assert set(failed) == {"bad", "child", "grandchild"}
    assert "exit status 3" in failed["bad"] and "bad.log" in failed["bad"]
    assert failed["child"] == "not run: bad failed"
    assert "other end" in _trace(tmp_path) and "child start" not in _trace(tmp_path)


def test_finished_jobs_are_skipped_and_setup_runs_before_the_command(tmp_path):
    order = []
    jobs = [_job(tmp_path, "old", done=lambda: True),
            _job(tmp_path, "new", after=("old",), before_start=lambda: order.append(
                os.path.exists(tmp_path / "trace")))]
    assert run_jobs(jobs, echo=lambda _: None) == {}
    assert _trace(tmp_path) == ["new start", "new end"] and order == [False]


def test_bad_graphs_are_refused_or_reported(tmp_path):
    with pytest.raises(ValueError, match="unknown jobs"):
        run_jobs([_job(tmp_path, "a", after=("ghost",))], echo=lambda _: None)
    with pytest.raises(ValueError, match="repeat"):
        run_jobs([_job(tmp_path, "a"), _job(tmp_path, "a")], echo=lambda _: None)
    cycle = [_job(tmp_path, "x", after=("y",)), _job(tmp_path, "y", after=("x",))]
    failed = run_jobs(cycle, echo=lambda _: None)
    assert set(failed) == {"x", "y"} and "cycle" in failed["x"]


def test_a_job_running_elsewhere_is_waited_for_not_started_twice(tmp_path):
    """A run an earlier grid started still runs: the job waits, then finds it finished."""
    finished = tmp_path / "finished"
    polls = []

    def busy():
        polls.append(1)
        if len(polls) >= 3:  # the other process ends after a few polls, having finished
            finished.write_text("done")
            return False
        return True

    job = _job(tmp_path, "elsewhere", busy=busy, done=finished.exists)
    messages = []
    assert run_jobs([job, _job(tmp_path, "next", after=("elsewhere",))], poll_s=0.01,
                    echo=messages.append) == {}
    assert len(polls) == 3 and _trace(tmp_path) == ["next start", "next end"]
    assert any("running in another process" in m for m in messages)
