"""The one training loop of every phase (copy pre-training, SFT, RL).

It owns what the phases share: the optimizer, the TrainState, the jitted step, the Orbax
checkpointer, restore, the progress line, the metric records and the saves. A phase supplies only
what differs: `batch_fn(step, state) -> StepBatch` (the packed batch of one step, the phase's own
metrics, and whether to log the step) and a data iterator whose position is checkpointed. A phase
whose step does more (RL: evaluation, the consumed-questions record) writes the step's body itself
over `session()`: update, log, save, the pieces `run` calls.

Resume is exact: a checkpoint holds the WHOLE TrainState (params, optimizer state, step and
optimizer-step counters, skipped-update count, non-finite streak, RNG) plus the data-iterator
position, and the metrics file is cut back to the restored step, so a resumed run logs the same
rows and ends with the same parameters as one that never stopped.

Non-finite guard: the step never applies an update that would put a non-finite number into the
state (trainer/step.py) and counts it; after `max_nonfinite_steps` consecutive steps that skipped an
update the loop stops with `NonFiniteTraining`, naming the step and the last good checkpoint.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import Any, Callable, Iterator, Mapping, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from matpo_jax.report import metrics as metrics_lib
from matpo_jax.trainer import checkpoint as ckpt_lib
from matpo_jax.trainer import step as step_lib
from matpo_jax.trainer.stability import SpikeCounter
from matpo_jax.trainer.packing import PackedBatch

log = logging.getLogger(__name__)
# The TrainState fields a checkpoint holds besides params and optimizer state.
COUNTER_FIELDS = ("step", "optimizer_steps", "skipped_steps", "nonfinite_streak", "rng")


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    name: str = "train"  # progress-line label and log prefix
    steps: int = 0  # the phase's total steps
    checkpoint_dir: str | None = None  # None: no checkpoints (the phase redoes itself on resume)
    checkpoint_every: int = 0  # 0: only the last step
    keep_checkpoints: int = 3
    async_checkpointing: bool = True
    log_every: int = 1  # metric records every n steps (and the last)
    max_nonfinite_steps: int = 3  # consecutive steps with a skipped update that stop the run; 0: never
    seed: int = 0  # the TrainState's RNG
    metric_prefix: str = ""  # prepended to the train step's metric names ("sft/")
    progress_keys: tuple[str, ...] = ("loss",)
    # JSON the phase's checkpoints record beside the step (run/provenance.py: the run's config
    # and tokenizer, which readers of the checkpoint check what they pair it with against)
    checkpoint_metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Called with a checkpoint's metadata before the loop resumes from it; raises to refuse it
    # (run/provenance.check_base: LoRA adapters resume only over the base they were trained on).
    restore_check: Callable[[Mapping[str, Any]], None] | None = None


@dataclasses.dataclass
class StepBatch:
    """What a phase hands the loop for one step."""

    batch: PackedBatch
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)  # logged as named
    log: bool = True  # False: train on the batch but log no record (e.g. SFT's copy rehearsal)


class DataIterator(Protocol):
    """A data iterator whose position is checkpointed (grain's iterators are)."""

    def get_state(self) -> Any: ...

    def set_state(self, state: Any) -> None: ...


class NonFiniteTraining(RuntimeError):
    """Too many consecutive steps whose update would have made the state non-finite."""


def _counters(state: step_lib.TrainState) -> dict:
    return {name: getattr(state, name) for name in COUNTER_FIELDS}


class TrainLoop:
    """Builds the optimizer, state and step of one phase; `run` trains it to `config.steps`."""

    def __init__(self, config: LoopConfig, model: nnx.Module,
                 optimizer: step_lib.OptimizerConfig, step_config: step_lib.TrainStepConfig,
                 mesh: Mesh):
        self.config = config
        self.tx = step_lib.make_optimizer(optimizer)
        self.graphdef, self.state, self.shardings = step_lib.init_train_state(
            model, self.tx, mesh, seed=config.seed)
        self.step_config = step_config
        self.mesh = mesh
        self.step_fn = step_lib.make_train_step(self.graphdef, self.tx, step_config, mesh,
                                                self.shardings,
                                                step_lib.learning_rate_schedule(optimizer))
        self._all_finite = jax.jit(step_lib.tree_all_finite)
        self.last_saved: int | None = None
        self.spikes = SpikeCounter()  # grad_norm_spike(s) in every record

    # ------------------------------------------------------------------------------ checkpoints
    def _checkpointer(self) -> ckpt_lib.Checkpointer | None:
        c = self.config
        if c.checkpoint_dir is None:
            return None
        return ckpt_lib.Checkpointer(c.checkpoint_dir, save_every=c.checkpoint_every or c.steps,
                                     keep=c.keep_checkpoints, async_save=c.async_checkpointing)

    def _restore(self, checkpoints: ckpt_lib.Checkpointer | None,
                 data: DataIterator | None) -> int:
        """The newest valid checkpoint into self.state (and the data position); its step."""
        if checkpoints is None:
            return 0
        state = self.state
        restored = checkpoints.restore_latest(state.params, state.opt_state,
                                              extras=_counters(state))
        if restored is None:
            return 0
        if self.config.restore_check is not None:
            self.config.restore_check(restored.metadata or {})
        if restored.extras is not None:
            counters = restored.extras
        else:  # a checkpoint from before counters were saved: the step is all it knows
            counters = {"step": jnp.asarray(restored.step, jnp.int32)}
            log.warning("%s checkpoint %d holds no counters; skipped-update counts restart at 0",
                        self.config.name, restored.step)
        self.state = state.replace(params=restored.params, opt_state=restored.opt_state,
                                   **counters)
        if data is not None and restored.data_state is not None:
            data.set_state(restored.data_state)
        self.last_saved = restored.step
        log.info("%s resumed at step %d", self.config.name, restored.step)
        return restored.step

    def _last_good(self) -> str:
        if self.last_saved is None:
            return "none (no checkpoint saved yet)" if self.config.checkpoint_dir else \
                "none (this phase saves no checkpoints)"
        return f"{self.config.checkpoint_dir}/{self.last_saved}"

    def _save(self, checkpoints: ckpt_lib.Checkpointer, step: int, data: DataIterator | None,
              force: bool) -> None:
        if not (force or checkpoints.should_save(step)):
            return
        if not bool(self._all_finite(self.state.params)):  # the step guard makes this a backstop
            raise NonFiniteTraining(f"{self.config.name} step {step}: non-finite parameters, not "
                                    f"saved; the last good checkpoint is {self._last_good()}")
        state = self.state
        if checkpoints.save(step, params=state.params, opt_state=state.opt_state,
                            extras=_counters(state), metadata=dict(self.config.checkpoint_metadata),
                            data_state=None if data is None else data.get_state(), force=force):
            self.last_saved = step

    # ------------------------------------------------------------------------------- the loop
    def run(self, batch_fn: Callable[[int, step_lib.TrainState], StepBatch], *,
            writer: metrics_lib.MetricsWriter | None = None, data: DataIterator | None = None,
            on_start: Callable[[int, step_lib.TrainState], step_lib.TrainState] | None = None,
            ) -> step_lib.TrainState:
        """Resumes from the newest valid checkpoint, then trains the remaining steps.

        batch_fn(step, state): the 0-based step's batch (state: the parameters before it).
        on_start(start, state) -> state: called once before the first step trained (not when the
        phase is already complete), e.g. to build the data or change the initial parameters.
        A phase whose step does more than make a batch writes its own body over `session`.
        """
        with self.session(writer=writer, data=data, on_start=on_start) as session:
            for step in session.steps:
                item = batch_fn(step, self.state)
                record = session.update(item.batch)
                record.update(item.metrics)
                session.log(step + 1, record, item.log)
                session.save(step + 1)
        return self.state

    @contextlib.contextmanager
    def session(self, *, writer: metrics_lib.MetricsWriter | None = None,
                data: DataIterator | None = None,
                on_start: Callable[[int, step_lib.TrainState], step_lib.TrainState] | None = None,
                ) -> Iterator["Session"]:
        """The phase restored from its newest valid checkpoint (and `data` to its position), its
        metrics file cut back to there; the checkpointer is closed on exit (see `run`)."""
        c = self.config
        checkpoints = self._checkpointer()
        try:
            start = self._restore(checkpoints, data)
            if writer is not None:
                writer.truncate_after(start)  # rows of steps about to be redone
                self._replay_spikes(writer, start)
            if on_start is not None and start < c.steps:
                self.state = on_start(start, self.state)
            with metrics_lib.Progress(c.steps, initial=start, desc=c.name,
                                      keys=c.progress_keys) as bar:
                yield Session(self, range(start, c.steps), checkpoints, writer, data, bar)
        finally:
            if checkpoints is not None:
                checkpoints.close()

    def _replay_spikes(self, writer: metrics_lib.MetricsWriter, start: int) -> None:
        """A resumed phase's spike history: the logged grad norms of its steps up to `start`
        (every step's with train.log_every = 1, so the count goes on as if uninterrupted)."""
        key = f"{self.config.metric_prefix}grad_norm"
        if not writer.enabled or not writer.path.exists():
            return
        for record in metrics_lib.read_records(writer.path):
            if key in record and 0 < record.get("step", 0) <= start:
                self.spikes.update(float(record[key]))


class Session:
    """One step's pieces, in the order a step runs them: `update` (the train step on a batch),
    `log` (its record), `save` (the checkpoint when due)."""

    def __init__(self, loop: TrainLoop, steps: range, checkpoints, writer, data, bar):
        self.loop, self.steps, self._checkpoints = loop, steps, checkpoints
        self._writer, self._data, self._bar = writer, data, bar

    @property
    def state(self) -> step_lib.TrainState:
        return self.loop.state

    def update(self, batch: PackedBatch) -> dict[str, float]:
        """Applies the train step to `batch`; its metrics (prefixed) and grad-norm spikes."""
        loop, prefix = self.loop, self.loop.config.metric_prefix
        t0 = time.perf_counter()
        loop.state, step_metrics = loop.step_fn(loop.state, batch)
        record = {f"{prefix}{k}": float(np.asarray(v)) for k, v in step_metrics.items()}
        record[f"{prefix}time_update_s"] = time.perf_counter() - t0
        grad_norm = record.get(f"{prefix}grad_norm")
        if grad_norm is not None:
            record.update({f"{prefix}{k}": v for k, v in loop.spikes.update(grad_norm).items()})
        return record

    def log(self, step: int, record: Mapping[str, float], log: bool = True) -> None:
        """Writes the record of step `step` (1-based) when logged and due; stops the run after
        too many consecutive steps with a skipped update."""
        c = self.loop.config
        due = step % c.log_every == 0 or step == c.steps
        logged = log and due
        if logged and self._writer is not None:
            self._writer.write(step, record)
        self._bar.update(record if logged else None)
        streak = int(record[f"{c.metric_prefix}nonfinite_streak"])
        if c.max_nonfinite_steps and streak >= c.max_nonfinite_steps:
            raise NonFiniteTraining(
                f"{c.name} step {step}: {streak} consecutive steps with a non-finite loss, "
                f"gradient or updated parameter (their updates were skipped; "
                f"max_nonfinite_steps={c.max_nonfinite_steps}); the last good checkpoint is "
                f"{self.loop._last_good()}")

    def save(self, step: int) -> None:
        """Saves after step `step` (1-based) when due, and always after the last."""
        if self._checkpoints is not None:
            self.loop._save(self._checkpoints, step, self._data,
                            force=step == self.loop.config.steps)
