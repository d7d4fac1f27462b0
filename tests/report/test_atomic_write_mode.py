"""Files written atomically get the mode a plain open() gives them (0666 less the umask), not
mkstemp's 0600: under umask 022 config.json, eval/ and plots/ were unreadable to a TensorBoard
server or a teammate. A file replaced keeps its own mode."""
import os
import stat

import pytest

from matpo_jax.report.files import write_json_atomic, write_text_atomic


@pytest.fixture
def umask():
    old = os.umask(0o022)
    os.umask(old)

    def set_mask(mask):
        os.umask(mask)
    yield set_mask
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_files_follow_the_umask(tmp_path, umask):
    umask(0o022)
    path = write_json_atomic(tmp_path / "run" / "config.json", {"a": 1})
    plain = tmp_path / "plain.txt"
    plain.write_text("x")  # what open() gives under the same umask
    assert mode(path) == mode(plain) == 0o644
    umask(0o077)
    write_text_atomic(tmp_path / "private.txt", "x")
    assert mode(tmp_path / "private.txt") == 0o600


def test_a_replaced_file_keeps_its_mode(tmp_path, umask):
    umask(0o022)
    path = write_json_atomic(tmp_path / "summary.json", {"a": 1})
    os.chmod(path, 0o640)
    write_json_atomic(path, {"a": 2})
    assert mode(path) == 0o640 and path.read_text() == '{"a": 2}\n'
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_the_umask_is_read_without_changing_it(umask):
    from matpo_jax.report.files import current_umask
    for mask in (0o022, 0o077, 0o002):
        umask(mask)
        assert current_umask() == mask and os.umask(mask) == mask
