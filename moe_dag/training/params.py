"""Parameter counts (total, active per token, by group) and training FLOPs per token.

Active parameters per token are all parameters except the routed experts a token does not visit:
each MoE layer applies top_k of its num_experts routed experts, plus its shared experts.

FLOPs per token follow the PaLM convention (arXiv:2204.02311 appendix B): 6 per active parameter
that multiplies (the embedding table is a lookup and does not count), plus 3x the forward FLOPs of
the token mixing itself (attention scores and weighted values, or a linear-attention state), averaged
over causal positions. MFU is tokens/s x FLOPs per token / peak FLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from moe_dag.training.attention import spec_for
from moe_dag.training.config import ModelConfig

# Checked in order; the first pattern found in a parameter's name decides its group.
_GROUP_PATTERNS = (
    ("embedding", ".tok_embeddings."),
    ("head", ".output."),
    ("attention", ".attn."),
    ("router", ".ffn.router."),
    ("routed_experts", ".ffn.experts."),
    ("shared_experts", ".ffn.shared."),
    ("norms", "norm."),
    ("norms", ".ffn.output_norm_scale"),
    ("dense_ffn", ".ffn.w"),
)


@dataclass(kw_only=True, slots=True, frozen=True)
class ParamCounts:
    groups: dict[str, int]
    total: int
    active: int

    def as_dict(self) -> dict[str, int | dict[str, int]]:
        return {"total": self.total, "active": self.active, "groups": dict(self.groups)}


def _active(groups: dict[str, int], total: int, config: ModelConfig) -> int:
    routed = groups.get("routed_experts", 0)
    assert routed % config.num_experts == 0
    return total - routed + routed // config.num_experts * config.top_k


def count_parameters(model: nn.Module, config: ModelConfig) -> ParamCounts:
    """Count the parameters of a built model (any device, meta included) by group."""
    groups: dict[str, int] = {}
    for name, parameter in model.named_parameters():
        group = next((g for g, pattern in _GROUP_PATTERNS if pattern in f".{name}"), None)
        assert group is not None, f"parameter {name} matches no group"
        groups[group] = groups.get(group, 0) + parameter.numel()
    total = sum(p.numel() for p in model.parameters())
    assert sum(groups.values()) == total, "parameter groups do not sum to the total"
    return ParamCounts(groups=groups, total=total, active=_active(groups, total, config))


def parameter_formula(config: ModelConfig) -> ParamCounts:
    """The same counts from the config alone, without building anything."""
    c = config
    D = c.d_model
    n_moe = sum(c.is_moe_layer(layer) for layer in range(c.n_layers))
    n_dense = c.n_layers - n_moe
    attention = sum(spec_for(c, layer).num_parameters(c) for layer in range(c.n_layers))
    groups = {
        "embedding": c.vocab_size * D,
        "head": c.vocab_size * D,
        "attention": attention,
        "norms": (2 * c.n_layers + 1) * D + n_moe,
        "dense_ffn": n_dense * 3 * D * c.dense_hidden,
        "router": n_moe * D * c.num_experts,
        "routed_experts": n_moe * c.num_experts * 3 * D * c.expert_hidden,
        "shared_experts": n_moe * 3 * D * c.expert_hidden * c.num_shared_experts,
    }
    groups = {name: count for name, count in groups.items() if count}
    total = sum(groups.values())
    return ParamCounts(groups=groups, total=total, active=_active(groups, total, config))


def flops_per_token(config: ModelConfig, seq_len: int | None = None) -> float:
    """Training FLOPs (forward and backward) per token at `seq_len` (default: the config's)."""
    seq_len = seq_len or config.seq_len
    counts = parameter_formula(config)
    multiplying = counts.active - counts.groups["embedding"]
    mixing = sum(spec_for(config, layer).mixing_flops(config, seq_len) for layer in range(config.n_layers))
    return 6.0 * multiplying + 3.0 * mixing
