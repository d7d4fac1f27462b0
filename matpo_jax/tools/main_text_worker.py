"""The worker process of main_text.py: (html, url) jobs on stdin, results on stdout.

    python -m matpo_jax.tools.main_text_worker

Messages are multiprocessing.connection frames (pickles; both ends are ours). The first one out
is READY, once trafilatura is imported; then one ("ok", (title, text)) or ("error", kind) per
job. Anything trafilatura prints goes to stderr, never into the result pipe.
"""
import os
import sys
from multiprocessing.connection import Connection

from matpo_jax.tools.main_text import READY, extract_main_text


def serve() -> None:
    jobs = Connection(os.dup(0), writable=False)
    results = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)  # stray prints: to stderr
    sys.stdout = sys.stderr
    import trafilatura  # noqa: F401 - imported before READY: a job then runs at once

    results.send(READY)
    while True:
        try:
            html, url = jobs.recv()
        except (EOFError, OSError):  # the parent closed the pipe or exited
            return
        try:
            results.send(("ok", extract_main_text(html, url)))
        except Exception as e:  # noqa: BLE001 - a page trafilatura trips on ends no worker
            results.send(("error", type(e).__name__))


if __name__ == "__main__":
    serve()
