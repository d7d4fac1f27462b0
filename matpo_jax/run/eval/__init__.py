"""Evaluation: one protocol (protocol.py), evaluators chosen by name from eval.datasets
(registry.py), one rollout-and-grade path (collect.py), metrics and files in one place
(report.py)."""
