"""Runs a set of commands that depend on one another, a few at a time (a grid of training runs).

Each job is a command with the jobs it waits for; `run_jobs` starts the first ready job in list
order whenever a slot is free, so the list's order is the priority. A job's output goes to its log
file, one progress line per start and finish goes to the console, and a failed job fails only
the jobs that wait for it: the rest of the grid still runs, and the failures are returned.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
import time
from typing import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class Job:
    name: str
    command: Sequence[str]
    log_path: str
    after: tuple[str, ...] = ()  # names of the jobs that must succeed first
    before_start: Callable[[], None] | None = None  # runs just before the command (same thread)
    done: Callable[[], bool] = lambda: False  # already finished: skipped, counts as a success
    # Already running in another process (a run an earlier, interrupted grid started): the job
    # waits for it to end, then counts as done if it finished, else runs.
    busy: Callable[[], bool] = lambda: False


class _Grid:
    def __init__(self, jobs: Sequence[Job], cwd: str | None, echo: Callable[[str], None],
                 poll_s: float = 10.0):
        names = [j.name for j in jobs]
        if len(set(names)) != len(names):
            raise ValueError(f"job names repeat: {sorted(n for n in names if names.count(n) > 1)}")
        for job in jobs:
            missing = [a for a in job.after if a not in names]
            if missing:
                raise ValueError(f"job {job.name} waits for unknown jobs {missing}")
        self.pending = list(jobs)
        self.succeeded: set[str] = set()
        self.failed: dict[str, str] = {}
        self.cwd, self.echo, self.poll_s = cwd, echo, poll_s
        self.lock = threading.Condition()
        self.running = 0
        self.total, self.started_at = len(jobs), time.time()

    def _take(self) -> Job | None:
        """The first pending job whose dependencies succeeded (None: nothing left to start);
        jobs behind a failure fail at once. Waits while jobs that others need still run."""
        with self.lock:
            while True:
                for job in list(self.pending):
                    blocked = [a for a in job.after if a in self.failed]
                    if blocked:
                        self.pending.remove(job)
                        self.failed[job.name] = f"not run: {blocked[0]} failed"
                        self.lock.notify_all()
                        continue
                    if all(a in self.succeeded for a in job.after):
                        self.pending.remove(job)
                        self.running += 1
                        return job
                if not self.pending:
                    return None
                if self.running == 0:  # nothing runs that could unblock them: a cycle
                    for job in self.pending:
                        self.failed[job.name] = "not run: its dependencies form a cycle"
                    self.pending.clear()
                    return None
                self.lock.wait()

    def _finish(self, job: Job, error: str | None) -> None:
        with self.lock:
            self.running -= 1
            if error is None:
                self.succeeded.add(job.name)
            else:
                self.failed[job.name] = error
            finished = len(self.succeeded) + len(self.failed)
            elapsed = (time.time() - self.started_at) / 60
            self.echo(f"[{finished}/{self.total}, {elapsed:.1f} min] {job.name}: "
                      + ("done" if error is None else f"FAILED ({error})"))
            self.lock.notify_all()

    def worker(self) -> None:
        while (job := self._take()) is not None:
            error = None
            try:
                if job.busy():
                    self.echo(f"{job.name}: running in another process; waiting for it to end")
                    while job.busy():
                        time.sleep(self.poll_s)
                if job.done():
                    self.echo(f"{job.name}: already finished")
                else:
                    if job.before_start is not None:
                        job.before_start()
                    self.echo(f"{job.name}: started (log {job.log_path})")
                    os.makedirs(os.path.dirname(os.path.abspath(job.log_path)), exist_ok=True)
                    with open(job.log_path, "a") as log:
                        rc = subprocess.run(list(job.command), cwd=self.cwd, stdout=log,
                                            stderr=subprocess.STDOUT).returncode
                    if rc:
                        error = f"exit status {rc}; see {job.log_path}"
            except Exception as err:  # noqa: BLE001 - reported as this job's failure
                error = f"{type(err).__name__}: {err}"
            self._finish(job, error)


def run_jobs(jobs: Sequence[Job], *, parallel: int = 1, cwd: str | None = None,
             echo: Callable[[str], None] = print, poll_s: float = 10.0) -> dict[str, str]:
    """Runs `jobs` (at most `parallel` at once); returns {name: why} of those that failed or
    could not run. Jobs already `done()` are skipped; a `busy()` one is waited for (polled
    every `poll_s` seconds), holding its slot."""
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    grid = _Grid(jobs, cwd, echo, poll_s)
    threads = [threading.Thread(target=grid.worker, daemon=True) for _ in range(parallel)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return dict(grid.failed)
