"""Copy pre-training rows and copy-token up-weighting of the SFT loss."""
from __future__ import annotations

import json

import numpy as np
import pytest

from matpo_jax.run.copy_pretraining import copy_batch, copy_sequence, corpus_token_stream
from matpo_jax.data.oracle import LocalCorpusTools, Oracle
from matpo_jax.data.synthetic_world import build_world
from matpo_jax.trainer import packing
from matpo_jax.data.sft_data import (SFTSequence, copy_loss_scale, copy_token_mask,
                                demonstration_sequences, demonstrations)
from matpo_jax.chat import ChatFormat
from matpo_jax.chat.tokenizer_training import train_tokenizer
from fixtures.losses import default_loss


@pytest.fixture(scope="module")
def world_chat(tmp_path_factory):
    world = build_world(seed=5, num_entities=40, num_questions=40, max_hops=2)
    oracle = Oracle(*(lambda t: (t.search, t.open))(LocalCorpusTools(world.documents)))
    demos = demonstrations(oracle, world.questions["train"][:4], "matpo")
    texts = [d.contents for d in world.documents]
    texts += [m["content"] for d in demos for c in [d, *d.workers] for m in c.messages]
    chat = ChatFormat(train_tokenizer(texts, 600))
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as f:
        for d in world.documents:
            f.write(json.dumps({"id": d.id, "title": d.title, "contents": d.contents}) + "\n")
    return chat, str(corpus), demos


def test_copy_rows_repeat_the_span_and_train_only_the_repeat(world_chat):
    chat, corpus, _ = world_chat
    stream = corpus_token_stream(chat, corpus)
    assert len(stream) > 1000
    sep = chat.tokenizer.encode("\n\n", add_special_tokens=False)
    seq = copy_sequence(stream, 100, 16, sep)
    assert len(seq) == 2 * 16 + len(sep)
    np.testing.assert_array_equal(seq.tokens[:16], stream[100:116])
    np.testing.assert_array_equal(seq.tokens[-16:], stream[100:116])
    assert not seq.trainable[:16 + len(sep)].any() and seq.trainable[-16:].all()

    batch = copy_batch(stream, sep, 3, seed=0, rows=2, max_len=128, span=20,
                       loss_config=default_loss())
    assert batch.shape == (2, 128)
    per_row = 128 // (2 * 20 + len(sep))
    for row in range(2):
        segs = batch.segment_ids[row]
        assert segs.max() == per_row
        for s in range(1, per_row + 1):
            toks, mask = batch.tokens[row][segs == s], batch.loss_mask[row][segs == s]
            np.testing.assert_array_equal(toks[:20], toks[-20:])
            # loss exactly on the repeat (every repeat token is predicted from earlier tokens)
            assert (mask[-20:] == 1).all() and (mask[:-20] == 0).all()
    assert (batch.loss_mask[batch.segment_ids == 0] == 0).all()
    # token-mean weights: the loss is a weighted mean over the loss tokens
    np.testing.assert_allclose((batch.loss_weights * batch.loss_mask).sum(), 1.0, rtol=1e-5)


def test_copy_batches_are_deterministic_by_seed_and_step(world_chat):
    chat, corpus, _ = world_chat
    stream = corpus_token_stream(chat, corpus)
    sep = chat.tokenizer.encode("\n\n", add_special_tokens=False)
    make = lambda seed, step: copy_batch(stream, sep, step, seed=seed, rows=2, max_len=256,
                                         span=32, loss_config=default_loss()).tokens
    np.testing.assert_array_equal(make(0, 5), make(0, 5))
    shuffled = copy_batch(stream, sep, 5, seed=0, rows=2, max_len=256, span=32,
                          loss_config=default_loss(), shuffle=True)
    again = copy_batch(stream, sep, 5, seed=0, rows=2, max_len=256, span=32,
                       loss_config=default_loss(), shuffle=True)
    np.testing.assert_array_equal(shuffled.tokens, again.tokens)
    for s in range(1, shuffled.segment_ids[0].max() + 1):
        toks = shuffled.tokens[0][shuffled.segment_ids[0] == s]
        np.testing.assert_array_equal(toks[:32], toks[-32:])
    assert not np.array_equal(make(0, 5), make(0, 6))
    assert not np.array_equal(make(0, 5), make(1, 5))


def test_copy_mask_marks_spans_repeated_from_the_context():
    # context (not trainable) 10 11 12 13 | turn (trainable) 20 11 12 21 | context 30 | turn 12 13
    tokens = [1, 2, 10, 11, 12, 13, 20, 11, 12, 21, 30, 12, 13, 2]
    trainable = [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1]
    mask = copy_token_mask(tokens, trainable, context_start=2)
    # bigram 11 12 is copied (plus 20, the token that starts the copy); 12 13 too
    expected = [0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0]
    np.testing.assert_array_equal(mask, np.asarray(expected, bool))
    # a span only in the system prompt (before context_start) does not count
    assert not copy_token_mask([10, 11, 1, 10, 11], [0, 0, 0, 1, 1], context_start=2).any()


def test_copy_weight_scales_exactly_the_marked_tokens(world_chat):
    chat, _, demos = world_chat
    seqs = demonstration_sequences(chat, demos, max_len=100_000)
    assert all(isinstance(s, SFTSequence) for s in seqs)
    marked = np.concatenate([s.copy_mask for s in seqs])
    assert marked.any() and (np.concatenate([s.trainable for s in seqs])[marked]).all()
    bins = packing.first_fit_decreasing([len(s) for s in seqs], 4096)
    base = packing.layout_bins(seqs, bins, len(bins), 4096, 4096, default_loss())
    scaled = packing.layout_bins(seqs, bins, len(bins), 4096, 4096, default_loss())
    copy_loss_scale(scaled, seqs, bins, 4.0)
    copy = np.zeros(base.shape, bool)
    for row, members in enumerate(bins):
        start = 0
        for i in members:
            copy[row, start:start + len(seqs[i])] = seqs[i].copy_mask
            start += len(seqs[i])
    loss = base.loss_mask > 0
    ratio = scaled.loss_weights[loss] / base.loss_weights[loss]
    c = ratio[copy[loss]]
    other = ratio[~copy[loss]]
    # one renormalisation constant, times 4 on exactly the marked tokens
    np.testing.assert_allclose(c, 4.0 * other[0], rtol=1e-5)
    np.testing.assert_allclose(other, other[0], rtol=1e-5)
    np.testing.assert_allclose((scaled.loss_weights * scaled.loss_mask).sum(),
                               (base.loss_weights * base.loss_mask).sum(), rtol=1e-5)
    unchanged = packing.layout_bins(seqs, bins, len(bins), 4096, 4096, default_loss())
    copy_loss_scale(unchanged, seqs, bins, 1.0)
    np.testing.assert_array_equal(unchanged.loss_weights, base.loss_weights)
