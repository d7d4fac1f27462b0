"""Quiet third-party INFO chatter (Orbax, TFDS, bm25s) while keeping matpo_jax's own progress lines."""
from __future__ import annotations

import logging

from absl import logging as absl_logging

NOISY = ("absl", "orbax", "tensorflow_datasets", "bm25s", "jax", "urllib3", "etils")


def configure(verbose: bool = False) -> None:
    if verbose:
        return
    absl_logging.set_verbosity(absl_logging.WARNING)
    for name in NOISY:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("matpo_jax").setLevel(logging.INFO)
