"""The MoE proxy model and everything needed to train and evaluate it, in plain PyTorch.

Entry points: `python -m moe_dag.training` (or under torchrun) trains, `trainer.train` is the same in
process; `evaluate.evaluate_checkpoint` and `python -m moe_dag.training.evaluate` measure held-out
bits per byte. Nothing here imports Dagster; this package is usable from a notebook or a script.
"""
