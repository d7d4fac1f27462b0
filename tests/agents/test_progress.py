"""The rollout engine's progress line: once a minute at most, counting episodes and workers."""
import logging

from matpo_jax.agents.progress import EpisodeProgress


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_line_at_most_every_interval_with_episodes_and_workers(caplog):
    clock = Clock()
    progress = EpisodeProgress(every_s=60, clock=clock)
    asked = []

    def total():
        asked.append(1)
        return 4

    with caplog.at_level(logging.INFO, logger="matpo_jax.agents.progress"):
        clock.now = 10
        assert not progress.finished(True, total)  # too soon: the total is not even asked
        assert not asked
        clock.now = 61
        assert progress.finished(False, total)
        clock.now = 90
        assert not progress.finished(False, total)  # within the minute of the last line
        clock.now = 200
        assert progress.finished(True, total)
        clock.now = 400
        assert progress.finished(False, total)
        clock.now = 500
        assert not progress.finished(False, total)  # 4 of 4: the batch's own summary follows
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["rollouts: 1 of 4 episodes done (1 workers), 61 s",
                     "rollouts: 2 of 4 episodes done (2 workers), 200 s",
                     "rollouts: 3 of 4 episodes done (2 workers), 400 s"]
