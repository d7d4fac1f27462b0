"""Issue 48 item 9: launch scripts refuse typos before anything is provisioned. A misspelt launch
flag given to resume.sh reached only run.sh, after create.sh had created (in a dry run: printed
the creation of) a default v5e-64 slice and set it up; a launch flag after CONFIG WORKDIR, or
spelled with dashes, went to the detached `train` and its step (the secrets, the skipped checks)
silently did not happen; --accelerator=v5e-0 was accepted; follow-up commands dropped
--project."""
import pytest

from test_launch_scripts import V5P, dry_run


def test_resume_refuses_an_unknown_flag_before_creating_anything():
    result = dry_run("resume.sh", "--acclerator=v5p-128", "--mode=queued",
                     "configs/qwen3_4b_musique.py", "gs://bucket/run1", expect_ok=False)
    assert result.returncode == 1 and result.stdout == ""  # no create, no setup, no train
    assert result.stderr.strip().splitlines() == [
        "error: unknown flag '--acclerator=v5p-128' before CONFIG WORKDIR (see --help); train's "
        "own flags go after them"]


@pytest.mark.parametrize("script", ["run.sh", "resume.sh"])
@pytest.mark.parametrize("misplaced, spelled", [("--env-file=s.env", "env_file"),
                                                ("--skip-checks", "skip_checks"),
                                                ("--skip_logs", "skip_logs")])
def test_a_launch_flag_after_config_workdir_is_refused(script, misplaced, spelled):
    """(A script's own flags spelled exactly are read anywhere, as before: they are applied.)"""
    args = [*V5P["flags"], "configs/qwen3_4b_musique.py", "gs://bucket/run1",
            "--config.rl.lr=3e-6", misplaced]
    result = dry_run(script, *args, expect_ok=False)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"error: '{misplaced}' is a launch flag (--{spelled}), but after CONFIG WORKDIR every "
        "flag goes to train: put it before CONFIG"]


def test_a_train_flag_spelled_with_dashes_is_refused():
    result = dry_run("run.sh", *V5P["flags"], "configs/qwen3_4b_musique.py", "gs://bucket/run1",
                     "--allow-config-change=train.steps", expect_ok=False)
    assert result.returncode == 1 and result.stdout == ""
    assert "train's flags are spelled with underscores (--allow_config_change)" in result.stderr


@pytest.mark.parametrize("accelerator", ["v5e-0", "v5p-00", "v6e-"])
def test_an_empty_slice_is_refused(accelerator):
    result = dry_run("create.sh", f"--accelerator={accelerator}", expect_ok=False)
    assert result.returncode == 1 and result.stdout == ""
    assert f"--accelerator={accelerator}: expected FAMILY-SIZE" in result.stderr


def test_follow_up_commands_keep_the_project(tmp_path):
    _, stderr = dry_run("create.sh", *V5P["flags"])
    assert "next: launch/setup.sh --name=matpo-p --accelerator=v5p-128 --zone=us-east5-a " \
           "--project=proj" in stderr
    _, stderr = dry_run("run.sh", *V5P["flags"], "configs/qwen3_4b_musique.py",
                        "gs://bucket/run1", "--skip_checks")
    assert "tpu-vm ssh matpo-p --zone=us-east5-a --project=proj --worker=0" in stderr
    assert "launch/logs.sh --name=matpo-p --accelerator=v5p-128 --zone=us-east5-a " \
           "--project=proj" in stderr
