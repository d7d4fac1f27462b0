"""Ahead-of-time plans: compile the train and decode steps for a TPU topology on any machine and
account per-chip memory and FLOPs (`python -m matpo_jax.plan`)."""
