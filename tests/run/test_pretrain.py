"""The reading warm start: its tasks, a shrunk rebuild through the command, and the hash check
that makes a run refuse weights other than the ones its config names."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from matpo_jax.config import ConfigError, load_config_file, to_typed
from matpo_jax.config.validation import file_sha256
from matpo_jax.data import synthetic_world
from matpo_jax.data.oracle import listed_ids
from matpo_jax.data.reading_tasks import ReadingTaskWriter
from matpo_jax.run.pretrain import WARM_START_FILE, tokenize_example

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "configs", "synthetic_tiny.py")
DEMO = os.path.join(REPO, "configs", "synthetic_demo.py")
DEMO_LISTINGS = os.path.join(REPO, "configs", "synthetic_demo_listings.py")


@pytest.fixture(scope="module")
def world():
    return synthetic_world.build_world(seed=0, num_entities=80, num_questions=40, max_hops=2,
                                       fact_style="plain", noise=0.05)


def test_reading_tasks_state_random_facts_the_page_shows(world):
    writer = ReadingTaskWriter(world.entities, seed=3, noise=(0.0, 0.3), max_response_chars=320)
    names = {e.id: e.name for e in world.entities}
    true_value = {(e.name, phrase): names.get(value, value)
                  for e in world.entities for phrase, value in e.facts.items()}
    examples = [writer.example(i) for i in range(200)]
    assert writer.example(17).text == examples[17].text  # a pure function of (seed, index)
    assert {e.kind for e in examples} == {"one_hop", "two_hop"}
    for example in examples:
        prompt = "".join(text for text, trained in example.segments if not trained)
        facts = [text for text, trained in example.segments if trained and text.startswith("Fact:")]
        assert facts[0] == f"Fact: {example.subject} {example.relation} {example.answer}.\n"
        assert all(f[len("Fact: "):].strip() in prompt for f in facts)  # each one is on a page
        assert (example.subject, example.relation) in true_value  # the world's names, relations
    # ... but what a page says is a fresh draw, not the world's fact about that subject
    agree = sum(true_value[e.subject, e.relation] == e.answer for e in examples)
    assert agree < 0.2 * len(examples), agree


def test_listing_tasks_open_the_result_that_states_the_fact(world):
    writer = ReadingTaskWriter(world.entities, seed=3, noise=(0.0, 0.3), listing_fraction=1.0)
    by_name = {e.name: e for e in world.entities}
    twins = {(e.id, e.twin_of) for e in world.entities if e.twin_of}
    seen, firsts = set(), 0
    for i in range(120):
        example = writer.example(i)
        assert example.kind == "listing"
        question, listing, call, fact = [text for text, _ in example.segments]
        assert [trained for _, trained in example.segments] == [False, False, True, True]
        assert question == f"What is the {example.relation} of {example.subject}?\n"
        ids = listed_ids(listing)
        assert len(ids) == 2 and example.answer in ids
        assert call == '{"name": "open", "arguments": {"id": "%s"}}\n' % example.answer
        # the fact line is the opened result's: its snippet shows it, the other's does not
        entries = listing.split("\n2. ")
        right = entries[ids.index(example.answer)]
        assert fact.startswith(f"Fact: {example.subject} {example.relation} ")
        assert fact[len("Fact: "):].strip().rstrip(".") in right
        firsts += ids[0] == example.answer
        other = ids[1 - ids.index(example.answer)]
        subject = by_name[example.subject]
        other_entity = by_name[other[len("page "):].removesuffix(" (2)")]
        if other_entity.id == subject.id:
            seen.add("second page")
            assert {example.answer, other} == {f"page {subject.name}", f"page {subject.name} (2)"}
        elif (subject.id, other_entity.id) in twins or (other_entity.id, subject.id) in twins:
            seen.add("twin")
        else:
            seen.add("other subject")
            assert other_entity.type == subject.type
    assert seen == {"second page", "twin", "other subject"}
    assert 30 < firsts < 90  # the right result first or second: the choice is read, not the rank


def test_listings_off_leave_the_warm_starts_tasks_as_they_were(world):
    """The committed warm start was built without listings: the same (seed, index) must still
    give the same task when listings are off, and some other when on."""
    plain = ReadingTaskWriter(world.entities, seed=3, noise=(0.0, 0.3))
    off = ReadingTaskWriter(world.entities, seed=3, noise=(0.0, 0.3), listing_fraction=0.0)
    on = ReadingTaskWriter(world.entities, seed=3, noise=(0.0, 0.3), listing_fraction=0.3)
    assert all(plain.example(i).text == off.example(i).text for i in range(40))
    kinds = [on.example(i).kind for i in range(200)]
    assert 30 < kinds.count("listing") < 90 and {"one_hop", "two_hop"} <= set(kinds)


def test_pieces_tokenize_as_the_whole_text(world, tmp_path):
    cfg = to_typed(load_config_file(TINY, f"data.num_entities=80,data.num_questions=40,"
                                          f"data.data_dir={tmp_path}"), check_files=False)
    from matpo_jax.data.world_assets import prepare_world
    chat = prepare_world(cfg, str(tmp_path)).chat
    writer = ReadingTaskWriter(world.entities, seed=0, noise=(0.0, 0.3), max_response_chars=320,
                               listing_fraction=0.3)
    for i in range(30):
        example = writer.example(i)
        ids, trained = tokenize_example(chat, example)
        assert ids.tolist() == chat.tokenizer.encode(example.text, add_special_tokens=False)
        first = "{" if example.kind == "listing" else "Fact:"
        assert chat.tokenizer.decode(ids[trained]).strip().startswith(first)


SHRUNK = ",".join([
    "model.arch.hidden_size=32", "model.arch.intermediate_size=64",
    "model.arch.num_hidden_layers=1", "model.arch.num_attention_heads=2",
    "model.arch.num_key_value_heads=1", "model.arch.head_dim=16", "model.arch.vocab_size=1024",
    "data.num_entities=60", "data.num_questions=240", "pretrain.steps=6",
    "pretrain.batch_size=2", "pretrain.eval_examples=16", "rl.pack_len=512",
    "rollout.max_context=512"])


def _pretrain(tmp_path, out):
    command = [sys.executable, "-m", "matpo_jax.pretrain", f"--config={TINY}:{SHRUNK},"
               f"data.data_dir={tmp_path / 'tfds'}", f"--workdir={tmp_path / 'work'}",
               f"--out={out}"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_a_shrunk_warm_start_rebuilds_and_a_run_refuses_other_bytes(tmp_path):
    out = tmp_path / "warm"
    _pretrain(tmp_path, out)
    files = set(os.listdir(out))
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            WARM_START_FILE} <= files
    summary = json.loads((out / WARM_START_FILE).read_text())
    assert summary["sha256"] == file_sha256(out / "model.safetensors")
    assert summary["steps"] == 6 and 0.0 <= summary["accuracy"]["pretrain/first_fact_exact/all"] <= 1
    assert summary["machine"]["platform"] == "cpu" and summary["machine"]["jax"]  # where it was made
    assert sorted(summary["files"]) == sorted(files - {WARM_START_FILE})  # what it wrote
    # Rerun: the finished phase resumes from its last checkpoint: the same bytes, into a new
    # directory or over its own earlier warm start (replaced whole: issue 48 item 8).
    _pretrain(tmp_path, tmp_path / "again")
    assert file_sha256(tmp_path / "again" / "model.safetensors") == summary["sha256"]
    _pretrain(tmp_path, out)
    assert file_sha256(out / "model.safetensors") == summary["sha256"]
    assert set(os.listdir(out)) == files

    # A run from it: accepted with the right hash, refused (one line, the field) otherwise.
    start = (f"model.hf_checkpoint={out},model.hf_checkpoint_sha256={summary['sha256']},"
             f"data.num_entities=60,data.num_questions=240")
    cfg = to_typed(load_config_file(TINY, start))
    assert cfg.model.hf_checkpoint == str(out)
    weights = bytearray((out / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (out / "model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(ConfigError, match=r"model\.hf_checkpoint_sha256 = .*has sha256"):
        to_typed(load_config_file(TINY, start))
    refused = subprocess.run([sys.executable, "-m", "matpo_jax.train", f"--config={TINY}:{start}",
                              f"--workdir={tmp_path / 'run'}"], cwd=REPO, capture_output=True,
                             text=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert refused.returncode == 2 and "model.hf_checkpoint_sha256" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.parametrize("config", [DEMO, DEMO_LISTINGS])
def test_the_demo_configs_name_their_committed_warm_starts_by_hash(config):
    cfg = to_typed(load_config_file(config))  # checks the directory and the hash
    summary = json.loads(open(os.path.join(cfg.model.hf_checkpoint, WARM_START_FILE)).read())
    assert summary["sha256"] == cfg.model.hf_checkpoint_sha256
    assert summary["accuracy"]["pretrain/first_fact_exact/all"] > 0.5
    # Pretrained as the config would rebuild it (the default's predates the option: no listings).
    assert summary["pretrain"].get("listing_fraction", 0.0) == cfg.pretrain.listing_fraction
