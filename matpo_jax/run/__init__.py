"""Experiment phases built from the library packages: the run context, SFT, RL, evaluation and the
whole experiment. Nothing in the library packages imports from here."""
