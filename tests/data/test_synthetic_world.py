import json
import re

import numpy as np
import pytest

from matpo_jax.data import synthetic_world as sw


def _sentences(text):
    return re.split(r"(?<=\.) ", text)


def _records(world):
    return [q.to_record() for q in world.all_questions()]


def test_same_seed_same_bytes_and_different_seed_differs(world, small_world_kwargs):
    again = sw.build_world(seed=7, noise=0.0, **small_world_kwargs)
    assert again.corpus_jsonl().encode() == world.corpus_jsonl().encode()
    assert _records(again) == _records(world)
    other = sw.build_world(seed=8, noise=0.0, **small_world_kwargs)
    assert other.corpus_jsonl() != world.corpus_jsonl()
    assert {q["question"] for q in _records(other)} != {q["question"] for q in _records(world)}


def test_written_corpus_is_jsonl_with_unique_ids(world, tmp_path):
    path = world.write_corpus(tmp_path / "corpus.jsonl")
    raw = open(path, "rb").read()
    assert raw == world.corpus_jsonl().encode()
    rows = [json.loads(line) for line in raw.decode().splitlines()]
    assert all(list(row) == ["id", "title", "contents"] for row in rows)
    assert len({row["id"] for row in rows}) == len(rows) == len(world.documents)


def test_noise_lengthens_pages_but_keeps_world_and_questions(world, noisy_world):
    assert _records(noisy_world) == _records(world)  # same facts, doc ids, questions
    clean = np.array([len(d.contents.split()) for d in world.documents])
    noisy = np.array([len(d.contents.split()) for d in noisy_world.documents])
    assert clean.max() <= 80  # short pages at noise 0 (~40-110 tokens)
    assert noisy.mean() > 3 * clean.mean()
    for a, b in zip(world.documents, noisy_world.documents):  # noise only inserts sentences
        clean_sentences = _sentences(a.contents)
        assert [s for s in _sentences(b.contents) if s in clean_sentences] == clean_sentences


def test_every_split_has_every_hop_count(world):
    for split in sw.SPLITS:
        hops = {q.num_hops for q in world.questions[split]}
        assert hops == {1, 2, 3, 4}, split


def test_chains_are_consistent_and_each_fact_is_on_its_page(world):
    for q in world.all_questions():
        assert q.hops[0].subject_name in q.question  # start entity named verbatim
        assert q.answer == q.hops[-1].answer
        assert q.question == sw.multi_hop_question([h.relation for h in q.hops], q.hops[0].subject_name)
        for prev, hop in zip(q.hops, q.hops[1:]):
            assert hop.subject_id == prev.object_id and hop.subject_name == prev.answer
        for hop in q.hops:
            doc = world.document(hop.doc_id)
            assert doc.entity_id == hop.subject_id and doc.title == hop.subject_name
            facts = [t.format(s=hop.subject_name, o=hop.answer)
                     for t in sw.RELATION_BY_PHRASE[hop.relation].templates]
            assert any(f in doc.contents for f in facts), (hop, doc.contents)
        assert len({h.subject_id for h in q.hops}) == q.num_hops  # no entity visited twice
        assert q.hops[-1].object_id != q.hops[0].subject_id
        assert sw.hops_from_json(q.chain_json()) == q.hops
    texts = [q.question for q in world.all_questions()]
    assert len(set(texts)) == len(texts)  # names are unique, so a chain has one question


def test_split_rule_no_test_fact_or_entity_in_train(world):
    def facts(split):
        return {f for q in world.questions[split] for f in q.facts()}

    def entities(split):
        return {e for q in world.questions[split] for h in q.hops for e in (h.subject_id, h.object_id)
                if e is not None}

    train_facts, train_entities = facts("train"), entities("train")
    for split in ("validation", "test"):
        assert facts(split) and not facts(split) & train_facts
        assert not entities(split) & train_entities
        chains = {q.facts() for q in world.questions[split]}
        assert not chains & {q.facts() for q in world.questions["train"]}
    for q in world.all_questions():  # every entity on a chain lives in the question's split
        assert all(world.entity(h.subject_id).split == q.split for h in q.hops)
    assert len({q.id for q in world.all_questions()}) == sum(len(v) for v in world.questions.values())


def test_near_duplicate_names_exist_and_differ_slightly(world):
    twins = [e for e in world.entities if e.twin_of]
    assert len(twins) >= 5
    for twin in twins:
        original = world.entity(twin.twin_of).name
        assert twin.name != original and twin.type == world.entity(twin.twin_of).type
        assert twin.name.split()[:-1] == original.split()[:-1]  # only the last word changes
        assert abs(len(twin.name) - len(original)) <= 1
    titles = {d.title for d in world.documents}
    assert all(t.name in titles for t in twins)


def test_some_entities_have_two_pages(world):
    pages = {}
    for d in world.documents:
        pages.setdefault(d.entity_id, []).append(d.id)
    assert any(len(v) == 2 for v in pages.values())
    assert set(pages) == {e.id for e in world.entities}


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="noise"):
        sw.build_world(0, noise=1.5)
    with pytest.raises(ValueError, match="max_hops"):
        sw.build_world(0, max_hops=5)


def test_plain_fact_style_states_every_fact_one_way_and_changes_nothing_else(world,
                                                                           small_world_kwargs):
    plain = sw.build_world(seed=7, noise=0.0, fact_style="plain", **small_world_kwargs)
    assert [q.to_record() for q in plain.all_questions()] == [
        q.to_record() for q in world.all_questions()]
    assert [(d.id, d.title) for d in plain.documents] == [(d.id, d.title) for d in world.documents]
    varied_only = 0
    for q in plain.all_questions():
        for hop in q.hops:
            fact = sw.plain_template(sw.RELATION_BY_PHRASE[hop.relation]).format(
                s=hop.subject_name, o=hop.answer)
            assert fact in plain.document(hop.doc_id).contents
            varied_only += fact not in world.document(hop.doc_id).contents
    assert varied_only > 0  # the varied world words some of these facts differently
    with pytest.raises(ValueError, match="fact_style"):
        sw.build_world(seed=7, fact_style="fancy", **small_world_kwargs)


def test_sft_split_has_its_own_entities_and_leaves_the_rest_alone(world, small_world_kwargs):
    assert sw.SFT_SPLIT not in world.questions  # off by default: the three-split world
    carved = sw.build_world(seed=7, noise=0.0, sft_fraction=0.35, **small_world_kwargs)
    assert list(carved.questions) == [*sw.SPLITS, sw.SFT_SPLIT]

    def entities(split):
        return {e for q in carved.questions[split] for h in q.hops
                for e in (h.subject_id, h.object_id) if e is not None}
    demo_entities = entities(sw.SFT_SPLIT)
    assert demo_entities and len(carved.questions[sw.SFT_SPLIT]) > 0.3 * len(
        carved.questions["train"])
    for split in sw.SPLITS:  # no RL, validation or test question touches an SFT entity
        assert carved.questions[split] and not entities(split) & demo_entities, split
    # Every fact of an SFT entity is on a page that no other split's chain visits.
    train_docs = {h.doc_id for q in carved.questions["train"] for h in q.hops}
    assert not train_docs & {h.doc_id for q in carved.questions[sw.SFT_SPLIT] for h in q.hops}
    with pytest.raises(ValueError, match="sft_fraction"):
        sw.build_world(seed=7, sft_fraction=0.7, **small_world_kwargs)


def test_name_lexicon_shares_name_words_across_splits_but_not_entities(world, small_world_kwargs):
    lexical = sw.build_world(seed=7, noise=0.0, name_words=40, **small_world_kwargs)
    fixed = set(sw._ORG_SUFFIXES) | set(sw._PLACE_PREFIXES) | set(sw._WORK_ADJECTIVES) | set(
        sw._WORK_NOUNS) | {"The"}

    def name_words(w, split):
        return {word for e in w.entities if e.split == split and not e.twin_of
                for word in e.name.split() if word not in fixed}
    held_out = name_words(lexical, "validation") | name_words(lexical, "test")
    # every non-twin name is built from the 40-word stock, so held-out names reuse train words
    assert len(name_words(lexical, "train") | held_out) <= 40
    assert len(held_out - name_words(lexical, "train")) <= 0.2 * len(held_out)
    # without it most held-out words are new (the setting a tiny model cannot copy well)
    fresh_held_out = name_words(world, "validation") | name_words(world, "test")
    assert len(fresh_held_out - name_words(world, "train")) > 0.5 * len(fresh_held_out)
    # still a closed world per split: distinct names, no held-out entity in a train chain
    assert len({e.name for e in lexical.entities}) == len(lexical.entities)
    def chain_entities(split):
        return {e for q in lexical.questions[split] for h in q.hops
                for e in (h.subject_id, h.object_id) if e is not None}
    for split in ("validation", "test"):
        assert chain_entities(split) and not chain_entities("train") & chain_entities(split)
    with pytest.raises(ValueError, match="name_words"):
        sw.build_world(seed=7, name_words=5, **small_world_kwargs)
