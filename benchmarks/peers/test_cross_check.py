"""Correctness cross-check behind the sampler comparison: on one checkpoint directory loaded by each
side's own loader, tunix's Sampler and our slot sampler produce the same greedy tokens and the same
log-probs (to float32 rounding), and the two models' forwards give the same logits. A speed ratio
between two samplers means something only if they compute the same thing.

Runs in the peers venv (`make bench-peers`); elsewhere it skips, since it needs tunix.
"""
import os
import sys

import numpy as np
import pytest

pytest.importorskip("tunix")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import ours_side  # noqa: E402
import tunix_side  # noqa: E402

PROMPT, STEPS, BATCH = 16, 32, 8
# float32 rounding of a ~1.5-magnitude logit through a few layers: measured ~1.5e-6.
LOGIT_TOL = 1e-4


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    path = common.write_checkpoint("4M", str(tmp_path_factory.mktemp("ckpt") / "4M"))
    return ours_side.load(path), tunix_side.load(path)


@pytest.fixture(scope="module")
def prompts():
    return common.prompts(BATCH, PROMPT, common.SIZES["4M"]["vocab_size"], seed=7)


def test_forward_logits_agree(models, prompts):
    ours, tunix = models
    mine, theirs = ours_side.forward_logits(ours, prompts), tunix_side.forward_logits(tunix, prompts)
    assert mine.shape == theirs.shape == (BATCH, PROMPT, common.SIZES["4M"]["vocab_size"])
    np.testing.assert_allclose(mine, theirs, rtol=0, atol=LOGIT_TOL)


def test_greedy_tokens_and_logprobs_agree(models, prompts):
    ours, tunix = models
    mine, my_logprobs = ours_side.Generator(ours, PROMPT + STEPS)(prompts, STEPS)
    theirs, their_logprobs = tunix_side.generate(
        tunix_side.make_sampler(tunix, PROMPT + STEPS), prompts, STEPS, logprobs=True)
    np.testing.assert_array_equal(mine, theirs)
    np.testing.assert_allclose(my_logprobs, their_logprobs, rtol=0, atol=LOGIT_TOL)
    # Not a degenerate run: greedy decoding of a random model still varies across rows and steps.
    assert len(np.unique(mine)) > STEPS


def test_decoded_continuation_matches_a_fresh_forward(models, prompts):
    """Both samplers' KV caches reproduce the cache-free forward: the argmax of tunix's forward
    logits over prompt + our greedy tokens is our next greedy token at every step."""
    ours, tunix = models
    mine, _ = ours_side.Generator(ours, PROMPT + STEPS)(prompts, STEPS)
    context = np.concatenate([prompts, mine], axis=1)
    logits = tunix_side.forward_logits(tunix, context[:, :-1])
    np.testing.assert_array_equal(logits[:, PROMPT - 1:].argmax(-1), mine)
