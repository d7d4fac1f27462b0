"""A rerun of a workdir must be the same experiment: config.json is compared first, changed fields
are refused (total steps and cadences may be allowed), and the record is written atomically."""
from __future__ import annotations

import dataclasses
import os

import pytest

from matpo_jax.config import (RESUME_SAFE_FIELDS, ConfigError, apply_overrides, base_config,
                              check_resume, config_changes, read_saved_config, save_config,
                              to_typed)
from matpo_jax.report.files import write_json_atomic


def typed(overrides=None):
    return to_typed(apply_overrides(base_config(), overrides), check_files=False)


def test_a_fresh_workdir_and_an_identical_rerun_pass(tmp_path):
    cfg = typed("rl.lr=3e-4,eval.datasets=synthetic_multihop")
    assert check_resume(cfg, tmp_path / "new") == []
    save_config(cfg, tmp_path / "run")
    assert check_resume(typed("rl.lr=3e-4"), tmp_path / "run") == []
    # The ConfigDict a config file builds and its typed config are recorded alike.
    assert config_changes(read_saved_config(tmp_path / "run"),
                          apply_overrides(base_config(), "rl.lr=3e-4")) == {}


def test_changed_fields_are_listed_one_line_each(tmp_path):
    save_config(typed(), tmp_path)
    with pytest.raises(ConfigError) as error:
        check_resume(typed("rollout.mode=single,rl.lr=0.5,data.batch_size=3"), tmp_path)
    problems = error.value.problems
    assert [p.split(" = ")[0] for p in problems[:-1]] == [
        "data.batch_size", "rl.lr", "rollout.mode"]
    assert problems[1] == (f"rl.lr = 0.5, but the run in {tmp_path} has 1e-05 "
                           f"({tmp_path / 'config.json'})")
    assert problems[-1] == ("refusing to resume with a changed config: a new --workdir starts a "
                            "fresh run")


def test_only_total_steps_and_cadences_may_be_allowed(tmp_path):
    save_config(typed(), tmp_path)
    longer = typed("train.steps=300,train.checkpoint_every=50")
    with pytest.raises(ConfigError, match="--allow_config_change=train.checkpoint_every,"
                                          "train.steps accepts"):
        check_resume(longer, tmp_path)
    with pytest.raises(ConfigError, match="train.checkpoint_every = 50"):
        check_resume(longer, tmp_path, "train.steps")
    assert check_resume(longer, tmp_path, "train.steps, train.checkpoint_every") == [
        "train.checkpoint_every", "train.steps"]
    with pytest.raises(ConfigError, match="--allow_config_change=rl.lr: only train.steps"):
        check_resume(longer, tmp_path, "train.steps,rl.lr")
    assert set(RESUME_SAFE_FIELDS) <= {f"train.{f.name}" for f in
                                       dataclasses.fields(type(longer.train))}


def test_unreadable_record_is_named(tmp_path):
    (tmp_path / "config.json").write_text('{"rl": {"lr": 1e-')  # torn by an old, in-place writer
    with pytest.raises(ConfigError, match=f"{tmp_path}/config.json: unreadable"):
        check_resume(typed(), tmp_path)


def test_json_is_replaced_atomically(tmp_path):
    path = write_json_atomic(tmp_path / "eval" / "final.json", {"a": 1}, indent=1)
    write_json_atomic(path, {"a": 2})
    assert path.read_text() == '{"a": 2}\n'
    assert os.listdir(path.parent) == ["final.json"]  # no temporary left behind
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})  # a failed write keeps the old file whole
    assert path.read_text() == '{"a": 2}\n' and os.listdir(path.parent) == ["final.json"]


def test_run_experiment_refuses_before_writing(tmp_path):
    from matpo_jax.run.experiment import run_experiment

    saved = save_config(typed(), tmp_path)
    before = saved.read_bytes()
    with pytest.raises(ConfigError, match="rollout.mode = 'single'"):
        run_experiment(typed("rollout.mode=single"), str(tmp_path))
    assert saved.read_bytes() == before and os.listdir(tmp_path) == ["config.json"]
    with pytest.raises(TypeError, match="typed config"):
        run_experiment(base_config(), str(tmp_path))


def _edit_record(workdir, edit):
    import json
    path = os.path.join(workdir, "config.json")
    with open(path) as f:
        record = json.load(f)
    edit(record)
    write_json_atomic(path, record)


def test_a_run_older_than_a_field_resumes_at_its_default_and_not_otherwise(tmp_path, caplog):
    """Schema drift: a run recorded before the code gained `rl.optimizer` (and with a field the
    code has since dropped) resumes when the new field is at its default, naming both; set to
    anything else, the new field is a change like any other."""
    save_config(typed(), tmp_path)

    def predate(record):
        del record["rl"]["optimizer"]
        record["rl"]["retired_knob"] = 3
    _edit_record(tmp_path, predate)
    with caplog.at_level("INFO"):
        assert check_resume(typed(), tmp_path) == []
    assert "rl.optimizer = 'adamw'" in caplog.text and "rl.retired_knob = 3" in caplog.text
    with pytest.raises(ConfigError) as error:
        check_resume(typed("rl.optimizer=sgd"), tmp_path)
    assert error.value.problems[0].startswith("rl.optimizer = 'sgd', but the run in")
    with pytest.raises(ConfigError):  # a recorded field changed still refuses, drift or not
        check_resume(typed("rl.lr=0.5"), tmp_path)
