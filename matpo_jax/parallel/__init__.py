"""Device mesh and partitioning: how parameters, batches and caches are laid out over chips."""
from matpo_jax.parallel.mesh import (BATCH_AXES, MESH_AXES, MeshShapeError, batch_sharding,
                                     is_multi_host_env, make_mesh, maybe_initialize_distributed,
                                     resolve_mesh_shape)
from matpo_jax.parallel.partitioning import (PARTITION_RULES, UnmatchedParameterError,
                                             cache_shardings, fit_spec, param_shardings,
                                             path_to_str, shard_model, sharding_for, spec_for)
