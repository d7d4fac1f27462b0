"""Datasets and their loading. Importing the package registers the TFDS builders: the synthetic
world (`synthetic_multihop`) and the published benchmarks read from a manual dir (`musique`,
`frames`, `webwalkerqa`, `gaia`)."""
from matpo_jax.data import frames, gaia, musique, synthetic_multihop, webwalkerqa  # noqa: F401
