"""The judge's limits (issue 23 item 4): one deadline bounds a whole attempt (headers trickled
one line at a time cannot hold a grade), and the config sets the judge's timeout and retries."""
import time

import pytest

from fixtures.fault_server import FaultServer
from matpo_jax.config import base_config, to_typed
from matpo_jax.config.errors import ConfigError
from matpo_jax.config.configdict import apply_overrides
from matpo_jax.rl import judge as judge_lib
from matpo_jax.run.runtime import make_judge


def header_line_every(interval_s: float, lines: int = 40):
    """200, then one header line per interval: every read is quick, the headers end late."""

    def behaviour(handler):
        handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for n in range(lines):
            if handler.server.fault_server.stopping.wait(interval_s):
                return
            handler.wfile.write(b"X-Slow-%d: yes\r\n" % n)
            handler.wfile.flush()

    return behaviour


def test_trickled_headers_end_at_the_judge_deadline():
    with FaultServer({"/v1/chat/completions": header_line_every(0.5)}) as server:
        judge = judge_lib.LLMJudge(judge_lib.JudgeConfig(
            base_url=server.url + "/v1", model="m", api_key_env="MATPO_NO_KEY", timeout_s=1.0,
            max_retries=0))
        start = time.monotonic()
        with pytest.raises(judge_lib.JudgeError, match="1 attempts"):
            judge.grade("q", "gold", "prediction")
        elapsed = time.monotonic() - start
    assert elapsed < 2.0, f"grade() took {elapsed:.1f} s with timeout_s=1, max_retries=0"


def test_the_config_sets_the_judge_timeout_and_retries():
    cfg = to_typed(apply_overrides(base_config(), {
        "reward.method": "judge", "reward.judge_url": "http://127.0.0.1:1/v1",
        "reward.judge_timeout_s": "2.5", "reward.judge_max_retries": "0"}))
    config = make_judge(cfg.reward).config
    assert (config.timeout_s, config.max_retries) == (2.5, 0)
    for field, value in (("reward.judge_timeout_s", "0"), ("reward.judge_max_retries", "-1")):
        with pytest.raises(ConfigError, match=field):
            to_typed(apply_overrides(base_config(), {field: value}))


def test_only_a_reply_that_is_a_grade_is_parsed():
    for reply, grade in (("A", "A"), ("  C\n", "C"), ("Grade: B", "B"), ("**A**", "A"),
                         ("A = CORRECT", "A"), ("B (INCORRECT)", "B"), ("C.", "C")):
        assert judge_lib.parse_grade(reply) == grade, reply
    for reply in ("A wrong answer: B", "correct", "B or A", "A = INCORRECT", "I think A", ""):
        with pytest.raises(judge_lib.JudgeError):
            judge_lib.parse_grade(reply)
