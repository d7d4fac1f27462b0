"""The one exception of the config layer: each problem it carries is one line naming its field."""
from __future__ import annotations

from typing import Iterable


class ConfigError(ValueError):
    """An invalid experiment configuration (or command line); each problem names its field, flag
    or file. Entry points print it without a traceback and exit 2."""

    def __init__(self, problems: str | Iterable[str]):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = f"{len(self.problems)} config problems:\n  " + "\n  ".join(self.problems)
        super().__init__(message)
