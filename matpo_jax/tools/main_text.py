"""A page's main text (trafilatura) in worker processes that the call's deadline can end.

trafilatura walks the page in Python with many regexes, and on some pages its time grows faster
than the page: 2 MB of short paragraphs took 42 s here, 2 MB of `<b>x</b>` 17 s with the GIL held
for up to 1.8 s at a time. In the tool's thread that would hold `open` past its deadline and
stall every other thread of the process (rollouts, the sampler's host callbacks). So it runs in a
worker process (`python -m matpo_jax.tools.main_text_worker`: a fresh interpreter, not a fork of
one running JAX's threads, and not multiprocessing's spawn, which re-runs the caller's main
script): the caller waits at most until its deadline, then the worker is killed and the caller
gets None (and falls back to every visible word, html_text.py). Idle workers serve the next page.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

import matpo_jax

READY = "ready"  # a worker's first message, once its imports are done
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(matpo_jax.__file__)))


def extract_main_text(html: str, url: str | None) -> tuple[str, str]:
    """(title, main text) by trafilatura ("" where it finds none): what a worker computes."""
    import trafilatura  # heavy; only `open` on real pages needs it

    document = trafilatura.bare_extraction(html, url=url, with_metadata=True,
                                           include_comments=False, include_tables=True)
    if document is None:
        return "", ""
    return getattr(document, "title", None) or "", getattr(document, "text", None) or ""


class _Worker:
    """One worker process and the two pipes to it (jobs in, results out)."""

    def __init__(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT,
                                                          env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "matpo_jax.tools.main_text_worker"], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        self.jobs = Connection(os.dup(self.process.stdin.fileno()), readable=False)
        self.results = Connection(os.dup(self.process.stdout.fileno()), writable=False)
        self.process.stdin.close()
        self.process.stdout.close()
        self.ready = False

    def wait_ready(self, deadline: float) -> bool:
        if not self.ready and self.results.poll(max(0.0, deadline - time.monotonic())):
            self.ready = self.results.recv() == READY
        return self.ready

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.jobs.close()
        self.results.close()


class MainTextPool:
    """Up to `max_workers` extractions at once, each ended at its caller's deadline."""

    def __init__(self, max_workers: int = 4):
        self._slots = threading.BoundedSemaphore(max_workers)
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def warm(self) -> None:
        """Starts one worker ahead of the first page (a start takes seconds: the imports)."""
        with self._lock:
            if not self._idle:
                self._idle.append(_Worker())

    def extract(self, html: str, url: str | None, deadline: float) -> tuple[str, str] | None:
        """(title, main text), or None when it was not ready by `deadline` (time.monotonic())
        or trafilatura failed on the page."""
        if not self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return None
        try:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            worker = worker or _Worker()
            try:
                if not worker.wait_ready(deadline):  # still starting: kept for the next page
                    with self._lock:
                        self._idle.append(worker)
                    return None
                worker.jobs.send((html, url))  # quick: a ready worker is reading its pipe
                if not worker.results.poll(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError
                status, value = worker.results.recv()
            except (TimeoutError, EOFError, OSError):  # too slow, or the worker died
                worker.kill()
                return None
            with self._lock:
                self._idle.append(worker)
            return value if status == "ok" else None
        finally:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


_SHARED: MainTextPool | None = None
_SHARED_LOCK = threading.Lock()


def shared_pool() -> MainTextPool:
    """The process's pool (its workers serve every `open` of every toolbox)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = MainTextPool()
        return _SHARED
