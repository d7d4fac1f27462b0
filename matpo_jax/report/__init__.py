"""What a run shows a person: metrics (JSONL + TensorBoard), progress lines, log setup, plots."""
