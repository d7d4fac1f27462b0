"""The synthetic world's builder is made quietly: tfds logged "Using custom data configuration:
<the whole config>" (~600 characters) every time a builder was made with a world outside
BUILDER_CONFIGS, which `make demo` does at every evaluation, between the progress bars. Every world
`make_config` spells is this builder's own config; tfds's checks on names stay."""
import logging

import pytest

from matpo_jax.data import synthetic_multihop


@pytest.fixture
def absl_records():
    """Every record the absl logger (tfds logs through it) emits, at any level."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    logger, handler = logging.getLogger("absl"), Keep(level=logging.DEBUG)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_a_world_config_builds_twice_without_a_log_line_about_it(absl_records, tmp_path):
    world = synthetic_multihop.make_config(num_entities=60, num_questions=40, max_hops=2)
    builders = [synthetic_multihop.SyntheticMultihop(
        config=world, data_dir=tmp_path, file_format=synthetic_multihop.FILE_FORMAT)
        for _ in range(2)]
    assert all(b.builder_config is world for b in builders)
    assert builders[0].data_dir == builders[1].data_dir
    assert "s0_e60_n0_q40_h2" in str(builders[0].data_dir)
    said = [r.getMessage() for r in absl_records]
    assert not [m for m in said if "custom data configuration" in m or world.name in m], said


def test_class_configs_and_their_names_keep_tfds_checks(absl_records, tmp_path):
    by_name = synthetic_multihop.SyntheticMultihop(
        config="tiny", data_dir=tmp_path, file_format=synthetic_multihop.FILE_FORMAT)
    assert by_name.builder_config is synthetic_multihop.SyntheticMultihop.builder_configs["tiny"]
    # A different world under a class config's name would share its data directory: refused.
    impostor = synthetic_multihop.make_config("tiny", num_entities=61)
    with pytest.raises(ValueError, match="Cannot name a custom BuilderConfig"):
        synthetic_multihop.SyntheticMultihop(config=impostor, data_dir=tmp_path,
                                             file_format=synthetic_multihop.FILE_FORMAT)
    with pytest.raises(ValueError, match="not found"):
        synthetic_multihop.SyntheticMultihop(config="no_such_world", data_dir=tmp_path,
                                             file_format=synthetic_multihop.FILE_FORMAT)
