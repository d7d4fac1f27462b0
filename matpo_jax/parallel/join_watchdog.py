"""A bounded, readable failure when a process of a multi-process run never joins.

jax.distributed.initialize blocks until every process has registered with process 0's
coordination service; past its `initialization_timeout` the C++ client aborts the process (rc
134) with a stack trace about "another task died" that names no process. This watchdog fires
first: it prints one line naming this process, the coordinator and the processes not seen, and
ends the process. jax releases the GIL while it waits, so the watchdog's thread runs.
"""
from __future__ import annotations

import os
import socket
import sys
import threading

EXIT_CODE = 3  # distinct from a config error's 2: the command was right, a peer is missing
# jax's own deadline is set this much later, so this watchdog (not jax's abort) ends the wait.
JAX_MARGIN_S = 60


def _coordinator_reachable(coordinator: str) -> str | None:
    """None when a TCP connection to HOST:PORT opens, else why not."""
    host, _, port = coordinator.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
            return None
    except (OSError, ValueError) as error:
        return getattr(error, "strerror", None) or str(error)


def missing_peers_message(timeout_s: float, coordinator: str | None, num_processes: int | None,
                          process_id: int | None) -> str:
    """The line printed when the join times out."""
    where = f"the coordinator {coordinator}" if coordinator else "the cluster's coordinator"
    head = (f"FATAL: process {process_id} of {num_processes} waited {timeout_s:g} s at {where} "
            f"and not every process joined" if process_id is not None else
            f"FATAL: this process waited {timeout_s:g} s at {where} and not every process joined")
    advice = ("start every process with the same --coordinator and --num_processes, or raise "
              "--initialization_timeout_s")
    if num_processes is None or process_id is None:
        return f"{head}; {advice}"
    others = [i for i in range(num_processes) if i != process_id]
    if process_id == 0:  # the service registers peers silently: any of the others may be absent
        if len(others) == 1:
            return f"{head}: process {others[0]} never joined; {advice}"
        return f"{head}: one or more of processes {others} never joined; {advice}"
    unreachable = _coordinator_reachable(coordinator) if coordinator else None
    if unreachable:
        return (f"{head}: process 0 (the coordinator, {coordinator}) is not reachable "
                f"({unreachable}); {advice}")
    missing = [i for i in others if i != 0]
    who = f"one or more of processes {missing}" if missing else "process 0"
    return f"{head}: the coordinator is up, {who} never joined; {advice}"


class JoinWatchdog:
    """`with JoinWatchdog(...)` around jax.distributed.initialize: if it has not returned after
    `timeout_s`, prints missing_peers_message to stderr and exits the process (EXIT_CODE)."""

    def __init__(self, timeout_s: float, *, coordinator: str | None, num_processes: int | None,
                 process_id: int | None):
        self.timeout_s = timeout_s
        self._args = (timeout_s, coordinator, num_processes, process_id)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="join-watchdog", daemon=True)

    def _watch(self):
        if self._done.wait(self.timeout_s):
            return
        sys.stderr.write(missing_peers_message(*self._args) + "\n")
        sys.stderr.flush()
        os._exit(EXIT_CODE)  # initialize cannot be interrupted from Python: end the process

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        return False
