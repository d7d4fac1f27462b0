"""Training machinery shared by every phase: packing token segments into fixed rows, the losses,
the jitted train step, Orbax checkpoints."""
