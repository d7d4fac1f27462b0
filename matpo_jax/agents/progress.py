"""A progress line for long rollout batches (a 200-question evaluation of a real model on a CPU
runs for half an hour): how many episodes have finished, at most once a minute."""
from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


class EpisodeProgress:
    """Counts finished episodes (planners or single agents; workers counted apart) and logs
    `rollouts: 120 of 200 episodes done (190 workers), 412 s` every `every_s` seconds."""

    def __init__(self, every_s: float = 60.0, clock=time.monotonic):
        self.every_s, self.clock = every_s, clock
        self.start = self.last = clock()
        self.episodes = self.workers = 0

    def finished(self, is_worker: bool, total_episodes) -> bool:
        """Records one finished rollout; returns whether a line was logged. total_episodes: a
        callable, asked only when a line is due."""
        if is_worker:
            self.workers += 1
        else:
            self.episodes += 1
        now = self.clock()
        if now - self.last < self.every_s:
            return False
        total = total_episodes()
        if self.episodes >= total:  # the batch is over: its own summary follows
            return False
        self.last = now
        log.info("rollouts: %d of %d episodes done (%d workers), %.0f s", self.episodes, total,
                 self.workers, now - self.start)
        return True
