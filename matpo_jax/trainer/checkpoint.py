"""Training checkpoints with Orbax: parameters, optimizer state, step, RNG key and data position.

One checkpoint per saved step, in <directory>/<step>/ with these items:
  params, opt_state  array trees (Orbax StandardSave), each host writing its own shards;
  extras             (optional) any other array tree, e.g. the TrainState's counters and RNG;
  meta               JSON: the step, the RNG key as raw key data, every host's data-iterator state
                     (grain `get_state()`: a dict, or bytes) and any caller metadata.
Restoring reads arrays straight onto the shardings of a target tree, so a run saved on one mesh
resumes on another. Saves are atomic: Orbax writes into `<step>.orbax-checkpoint-tmp-*` and renames
it when complete (a commit marker on object stores), and never lists an unfinished step.

A checkpoint that cannot be read back (a truncated array file, corrupt metadata, an empty step
directory, non-finite parameters) is set aside as `<step>.invalid` with a one-line warning, and
`restore_latest` falls back to the newest one that restores; setting it aside also keeps rotation
from counting it, so rotation never deletes the newest valid checkpoint in its favour.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

PyTree = Any
log = logging.getLogger(__name__)
INVALID_SUFFIX = ".invalid"  # a step directory set aside because it did not restore


@dataclasses.dataclass
class Restored:
    """What a checkpoint gives back."""

    step: int
    params: PyTree
    opt_state: PyTree | None  # None when restoring parameters only
    rng: jax.Array | None
    data_state: Any  # this host's data-iterator state as saved (dict, bytes, ...) or None
    metadata: dict
    extras: PyTree | None = None  # None when not asked for or not in the checkpoint


def abstract_like(tree: PyTree, shardings: PyTree | None = None) -> PyTree:
    """A restore target: ShapeDtypeStructs of `tree` (arrays or abstract arrays) carrying either
    their own sharding or, when given, the matching leaf of `shardings` (a different mesh)."""
    if shardings is None:
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
            tree)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


class Checkpointer:
    """Saves every `save_every` steps (0: only forced saves, e.g. the last step), keeps the newest
    `keep`, restores the newest.

    With `async_save`, `save` returns once the arrays are copied off the devices and the files are
    written in the background while training goes on; call `wait_until_finished()` (or `close()`)
    before reading the checkpoint or exiting.
    """

    def __init__(self, directory: str | epath.PathLike, *, save_every: int = 1, keep: int = 3,
                 async_save: bool = True):
        self.save_every = save_every
        self.directory = epath.Path(directory)
        if not str(self.directory).startswith(("gs://", "s3://")):
            self.directory = self.directory.absolute()  # Orbax refuses relative paths
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            save_interval_steps=max(1, save_every),
            enable_async_checkpointing=async_save,
            create=True,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    # --------------------------------------------------------------------------------- saving
    def should_save(self, step: int) -> bool:
        return self.save_every > 0 and self._manager.should_save(step)

    def save(self, step: int, *, params: PyTree, opt_state: PyTree, rng: jax.Array | None = None,
             data_state: Any = None, metadata: dict | None = None, extras: PyTree | None = None,
             force: bool = False) -> bool:
        """Saves if `step` is due (or `force`); returns whether a save was started.

        Every host must call this (the arrays are written collectively). `rng` must be the same
        on every host; `data_state` is this host's iterator state and may differ per host.
        `extras`: one more array tree (restored by passing a target for it).
        """
        if not (force or self.should_save(step)):
            return False
        meta = {
            "step": int(step),
            "rng": _encode_rng(rng),
            "data_states": _all_hosts(_encode_data_state(data_state)),
            "metadata": metadata or {},
        }
        items = dict(params=ocp.args.StandardSave(params),
                     opt_state=ocp.args.StandardSave(opt_state), meta=ocp.args.JsonSave(meta))
        if extras is not None:
            items["extras"] = ocp.args.StandardSave(extras)
        return self._manager.save(step, args=ocp.args.Composite(**items), force=force)

    # ------------------------------------------------------------------------------- restoring
    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def restore_latest(self, params: PyTree, opt_state: PyTree | None = None,
                       extras: PyTree | None = None, *, set_aside: bool = True
                       ) -> Restored | None:
        """Restores the newest checkpoint that reads back whole onto the targets; None when there
        is no checkpoint. Newer ones that do not (see the module doc) are set aside, each with a
        one-line warning naming it; a reader that does not own the directory (evaluate, export:
        `set_aside=False`) only skips them, with the same warning. When none restores, nothing is
        set aside and the error names the directory (a target that fits no checkpoint, e.g.
        another model, fails them all)."""
        failed = []
        for step in sorted(self.all_steps(), reverse=True):
            try:
                restored = self.restore(step, params, opt_state, extras)
                if not _all_finite(restored.params):
                    raise ValueError("non-finite parameters")
            except Exception as error:  # noqa: BLE001 -- any failure to read means: not valid
                failed.append((step, f"{type(error).__name__}: "
                                     f"{(str(error).strip().splitlines() or [''])[0][:200]}"))
                continue
            for bad, reason in failed:
                if not set_aside:
                    log.warning("checkpoint %s is unreadable (%s); using step %d, the newest "
                                "that restores", self.directory / str(bad), reason, step)
                    continue
                log.warning("checkpoint %s is unreadable (%s); set aside as %s%s, resuming from "
                            "step %d", self.directory / str(bad), reason, bad, INVALID_SUFFIX, step)
                self._set_aside(bad)
            return restored
        if failed:
            raise RuntimeError(f"no checkpoint in {self.directory} restores (newest, step "
                               f"{failed[0][0]}: {failed[0][1]}); move the directory aside to "
                               f"start this phase over")
        return None

    def restore(self, step: int, params: PyTree, opt_state: PyTree | None = None,
                extras: PyTree | None = None) -> Restored:
        """Restores `step`. `params` / `opt_state` / `extras` are target trees (arrays or
        ShapeDtypeStructs, see `abstract_like`) fixing structure, dtypes and shardings;
        opt_state None skips it; extras None (or a checkpoint saved without them) skips them."""
        items = dict(params=ocp.args.StandardRestore(abstract_like(params)),
                     meta=ocp.args.JsonRestore())
        if opt_state is not None:
            items["opt_state"] = ocp.args.StandardRestore(abstract_like(opt_state))
        with_extras = extras is not None and (self.directory / str(step) / "extras").exists()
        if with_extras:
            items["extras"] = ocp.args.StandardRestore(abstract_like(extras))
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        meta = restored["meta"]
        if not isinstance(meta, dict) or "step" not in meta:
            raise ValueError(f"meta of step {step} holds no step: {str(meta)[:80]!r}")
        data_states = meta.get("data_states") or [None]
        host_state = data_states[jax.process_index() % len(data_states)]
        return Restored(
            step=int(meta["step"]),
            params=restored["params"],
            opt_state=restored["opt_state"] if opt_state is not None else None,
            rng=_decode_rng(meta.get("rng")),
            data_state=_decode_data_state(host_state),
            metadata=meta.get("metadata", {}),
            extras=restored["extras"] if with_extras else None,
        )

    def _set_aside(self, step: int) -> None:
        """Renames <step> to <step>.invalid (.invalid-2, ... when taken) so that neither a later
        restore nor rotation counts it, then rereads the step list. The primary host renames."""
        if jax.process_index() == 0:
            source = self.directory / str(step)
            target, n = self.directory / f"{step}{INVALID_SUFFIX}", 1
            while target.exists():
                n += 1
                target = self.directory / f"{step}{INVALID_SUFFIX}-{n}"
            source.rename(target)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"checkpoint_set_aside_{step}")
        self._manager.reload()

    # ------------------------------------------------------------------------------- lifecycle
    def wait_until_finished(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Finishes pending writes and releases Orbax's background threads."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _all_finite(tree: PyTree) -> bool:
    for leaf in jax.tree.leaves(tree):
        if jnp.issubdtype(leaf.dtype, jnp.inexact) and not bool(jnp.isfinite(leaf).all()):
            return False
    return True


# ------------------------------------------------------------------------- JSON-side encodings
def _encode_rng(rng: jax.Array | None) -> dict | None:
    """A typed key or a legacy uint32 key as raw key data, so JSON holds it bit-exactly."""
    if rng is None:
        return None
    typed = jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
    data = jax.random.key_data(rng) if typed else rng
    if isinstance(data, jax.Array) and not data.is_fully_addressable:
        data = data.addressable_data(0)  # replicated on every host: the local copy is the value
    data = np.asarray(data)
    return {
        "typed": bool(typed),
        "impl": str(jax.random.key_impl(rng)) if typed else None,
        "dtype": str(data.dtype),
        "shape": list(data.shape),
        "data": data.ravel().tolist(),
    }


def _decode_rng(encoded: dict | None) -> jax.Array | None:
    if encoded is None:
        return None
    data = np.asarray(encoded["data"], dtype=encoded["dtype"]).reshape(encoded["shape"])
    if encoded["typed"]:
        return jax.random.wrap_key_data(data, impl=encoded["impl"])
    return jnp.asarray(data)


def _encode_data_state(state: Any) -> Any:
    # grain's DataLoader iterators give bytes (a JSON document); dataset iterators give dicts.
    if isinstance(state, (bytes, bytearray)):
        return {"__bytes_base64__": base64.b64encode(bytes(state)).decode("ascii")}
    return state


def _decode_data_state(state: Any) -> Any:
    if isinstance(state, dict) and set(state) == {"__bytes_base64__"}:
        return base64.b64decode(state["__bytes_base64__"])
    return state


def _all_hosts(value: Any) -> list:
    """Every host's JSON-able `value`, in process order (JSON is written by the primary host)."""
    if jax.process_count() == 1:
        return [value]
    text = np.frombuffer(json.dumps(value).encode(), dtype=np.uint8)
    longest = int(np.max(multihost_utils.process_allgather(np.array([text.size]))))
    padded = np.zeros(longest, np.uint8)
    padded[:text.size] = text
    gathered = multihost_utils.process_allgather(padded)  # [hosts, longest]
    return [json.loads(bytes(row).rstrip(b"\0").decode()) for row in np.asarray(gathered)]
