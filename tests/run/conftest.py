"""Fixtures of the run tests: the local OpenAI-compatible judge server."""
from fixtures.judge_server import judge_server  # noqa: F401  (a fixture)
