"""World assets built by several runs at once (the seeds of a grid) are built once, not raced."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREPARE = """
import sys
from matpo_jax.config import load_config_file
from matpo_jax.data.world_assets import prepare_world
cfg = load_config_file(sys.argv[1], "data.num_entities=60,data.num_questions=120,model.arch.vocab_size=600")
assets = prepare_world(cfg, sys.argv[2])
print(assets.tokenizer_dir, len(assets.chat.tokenizer))
"""


def test_concurrent_runs_share_one_world(tmp_path):
    config = os.path.join(REPO, "configs", "synthetic_tiny.py")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, "-c", PREPARE, config, str(tmp_path)], cwd=REPO,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    last_lines = [out.strip().splitlines()[-1] for out, _ in outs]
    assert last_lines[0] == last_lines[1]  # the same tokenizer directory and size
    assert not [n for n in os.listdir(tmp_path / "synthetic_multihop" / os.listdir(
        tmp_path / "synthetic_multihop")[0]) if n.startswith("incomplete")]


def test_a_data_dir_without_a_writable_lock_is_used_read_only(tmp_path):
    """A complete data dir on read-only storage: the lock file cannot be opened for writing
    (here: a directory stands where it would be), and the world is read without it."""
    from matpo_jax.data import world_assets

    (tmp_path / ".prepare.lock").mkdir()
    entered = []
    with world_assets.exclusive(str(tmp_path)):
        entered.append(True)
    assert entered == [True]
