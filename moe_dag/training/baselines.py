"""Baseline models the MoE proxy is compared with: a dense model with the same active parameters.

The MoE's gain over dense is only meaningful at equal compute per token, which for these models is
equal active parameters (Shazeer et al. 2017, arXiv:1701.06538; DeepSeekMoE, arXiv:2401.06066, compares
the same way). The dense twin keeps everything but the feed-forward layers: every layer becomes a dense
SwiGLU, with one width chosen so that the dense feed-forward parameters equal the MoE model's active ones
(the first dense layers at `dense_hidden`, each MoE layer's `top_k` routed plus its shared experts, its
router and its output-norm scalar). Width is rounded to an integer, so the counts differ by under
3 x d_model x n_layers parameters.
"""

from __future__ import annotations

import dataclasses

from moe_dag.training.config import ModelConfig


def dense_equivalent(model: ModelConfig) -> ModelConfig:
    """The dense model with (nearly) the active parameters of `model`; `model` itself if already dense."""
    moe_layers = sum(model.is_moe_layer(layer) for layer in range(model.n_layers))
    if moe_layers == 0:
        return model
    D = model.d_model
    dense_ffn = (model.n_layers - moe_layers) * 3 * D * model.dense_hidden
    active_expert_hidden = (model.top_k + model.num_shared_experts) * model.expert_hidden
    # Per MoE layer: the active experts' SwiGLUs, the router (D x experts), the output-norm scalar.
    moe_ffn = moe_layers * (3 * D * active_expert_hidden + D * model.num_experts + 1)
    hidden = round((dense_ffn + moe_ffn) / (3 * D * model.n_layers))
    return dataclasses.replace(model, first_dense_layers=model.n_layers, dense_hidden=hidden)


def dense_overrides(model: ModelConfig) -> dict[str, int]:
    """`--set` overrides that turn `model` into its dense equivalent."""
    dense = dense_equivalent(model)
    return {"model.first_dense_layers": dense.first_dense_layers, "model.dense_hidden": dense.dense_hidden}
