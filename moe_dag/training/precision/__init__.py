"""Precision recipes (config `precision.recipe`): how the model is converted and what the forward
runs under. Master weights and optimizer state stay fp32 in every recipe; the loss is fp32.

| recipe          | matrix products                                   | where                 |
| --------------- | ------------------------------------------------- | --------------------- |
| fp32            | fp32                                              | anywhere              |
| bf16            | bf16 (torch.autocast)                             | anywhere              |
| fp8             | FP8 through Transformer Engine, bf16 elsewhere    | Hopper, Blackwell     |
| fp8-emulated    | FP8 numerics emulated in PyTorch, bf16 elsewhere  | anywhere (CPU tests)  |
| nvfp4           | NVFP4 through Transformer Engine, bf16 elsewhere  | Blackwell             |
| nvfp4-emulated  | NVFP4 numerics emulated in PyTorch, bf16 elsewhere | anywhere             |

The low-precision recipes leave the first and last `high_precision_edge_layers` blocks, the
embedding, the output head and the routers in bf16 (routers compute in fp32).

Use: `recipe = build_recipe(config.precision)`, then `recipe.prepare(model)` before the optimizer is
built, and run each forward and loss inside `with recipe.autocast(device):`.
"""

from __future__ import annotations

import contextlib
import typing
from typing import Any

import torch

from moe_dag.training.config import PrecisionConfig, PrecisionRecipeName
from moe_dag.training.model import Transformer
from moe_dag.training.precision import emulated
from moe_dag.training.precision.formats import FP8, NVFP4


class PrecisionRecipe:
    def __init__(self, config: PrecisionConfig) -> None:
        allowed = typing.get_args(PrecisionRecipeName)
        if config.recipe not in allowed:
            raise ValueError(f"precision.recipe={config.recipe!r} is not one of {allowed}")
        self.config = config
        self._te_recipe: Any = None
        if config.recipe in ("fp8", "nvfp4"):
            from moe_dag.training.precision import transformer_engine

            transformer_engine.import_transformer_engine()  # fail now, with the install hint
            self._te_recipe = transformer_engine.te_recipe(config)

    @property
    def name(self) -> str:
        return self.config.recipe

    def prepare(self, model: Transformer) -> None:
        """Convert `model` in place for this recipe; call before building the optimizer."""
        recipe, edges = self.config.recipe, self.config.high_precision_edge_layers
        if recipe in ("fp8-emulated", "nvfp4-emulated"):
            emulated.convert(model, FP8 if recipe == "fp8-emulated" else NVFP4, edges)
        elif self._te_recipe is not None:
            from moe_dag.training.precision import transformer_engine

            transformer_engine.convert(model, self.config)

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        if self.config.recipe == "fp32":
            return contextlib.nullcontext()
        if self._te_recipe is not None:
            from moe_dag.training.precision import transformer_engine

            return transformer_engine.autocast(self._te_recipe, device)
        return torch.autocast(device.type, dtype=torch.bfloat16)


def build_recipe(config: PrecisionConfig) -> PrecisionRecipe:
    return PrecisionRecipe(config)
