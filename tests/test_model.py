"""The transformer: shapes, causality, initialisation, parameter and FLOP counts, presets, config."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from moe_dag.training.attention.gqa import GroupedQueryAttention, sliding_window_mask
from moe_dag.training.config import Config, ModelConfig, apply_overrides, preset, preset_names, tiny
from moe_dag.training.model import Transformer, build_model
from moe_dag.training.params import count_parameters, flops_per_token, parameter_formula


def tiny_model(**changes: object) -> Transformer:
    torch.manual_seed(0)
    return build_model(dataclasses.replace(tiny().model, **changes)).eval()


def test_forward_shape_and_dtype() -> None:
    model = tiny_model()
    tokens = torch.randint(0, model.config.vocab_size, (3, 17))
    logits = model(tokens)
    assert logits.shape == (3, 17, model.config.vocab_size)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("pattern", [("gqa",), ("mha",), ("swa",), ("swa", "gqa"), ("kda", "mla"), ("nsa",)])
def test_future_tokens_do_not_change_past_logits(pattern: tuple[str, ...]) -> None:
    model = tiny_model(attention_pattern=pattern, sliding_window=4)
    tokens = torch.randint(0, model.config.vocab_size, (2, 24))
    changed = tokens.clone()
    changed[:, 10:] = torch.randint(0, model.config.vocab_size, (2, 14))
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(after[:, :10], before[:, :10], rtol=0, atol=1e-6)
    assert not torch.allclose(after[:, 10:], before[:, 10:])


def test_sliding_window_sees_only_recent_positions() -> None:
    model = tiny_model(attention_pattern=("swa",), sliding_window=3)
    attention, rotary = model.layers[0].attn, model.rotary
    x = torch.randn(1, 12, model.config.d_model)
    changed = x.clone()
    changed[:, 5] += 1.0  # visible from queries 5, 6 and 7 only
    with torch.no_grad():
        delta = (attention(changed, rotary) - attention(x, rotary)).abs().amax(dim=-1)[0]
    assert delta[:5].max() == 0 and delta[8:].max() == 0
    assert (delta[5:8] > 0).all()
    assert sliding_window_mask(4, 2, torch.device("cpu")).int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [0, 1, 1, 0],
        [0, 0, 1, 1],
    ]


def test_grouped_query_attention_equals_repeated_heads() -> None:
    """GQA through SDPA's enable_gqa matches MHA whose key/value heads are repeated per group."""
    model = tiny_model()
    config, rotary = model.config, model.rotary
    torch.manual_seed(0)
    gqa = GroupedQueryAttention(config, n_kv_heads=1, window=None)
    mha = GroupedQueryAttention(config, n_kv_heads=config.n_heads, window=None)
    with torch.no_grad():
        mha.wq.weight.copy_(gqa.wq.weight)
        mha.wo.weight.copy_(gqa.wo.weight)
        mha.wk.weight.copy_(gqa.wk.weight.repeat(config.n_heads, 1))
        mha.wv.weight.copy_(gqa.wv.weight.repeat(config.n_heads, 1))
        x = torch.randn(2, 9, config.d_model)
        torch.testing.assert_close(gqa(x, rotary), mha(x, rotary))


def test_init_weights_follows_its_table() -> None:
    model = tiny_model()
    assert all(p.device.type == "cpu" for p in model.parameters())
    for moe in model.moe_layers():
        assert moe.output_norm_scale.item() == 2.0
        assert moe.router.expert_bias_E.abs().sum() == 0
    assert model.layers[0].attn_norm.weight.eq(1).all()
    std = model.config.init_std
    assert model.tok_embeddings.weight.std().item() == pytest.approx(std, rel=0.05)
    residual_std = std / (2 * model.config.n_layers) ** 0.5
    assert model.layers[0].ffn.w2.weight.std().item() == pytest.approx(residual_std, rel=0.1)
    assert model.layers[1].ffn.experts.w2_EDF.std().item() == pytest.approx(std, rel=0.1)
    again = tiny_model()
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True)
    )


@pytest.mark.parametrize(
    ("name", "pattern"),
    [("tiny", None), ("demo", None), ("tiny", ("mha", "swa", "mla", "nsa", "kda")), ("tiny", ("mla", "mla"))],
)
def test_parameter_counter_matches_formula(name: str, pattern: tuple[str, ...] | None) -> None:
    config = preset(name).model
    if pattern:
        mla = dataclasses.replace(config.mla, q_lora_rank=8)  # the compressed-query variant
        config = dataclasses.replace(config, attention_pattern=pattern, n_layers=len(pattern), mla=mla)
    model = build_model(config)
    counted, formula = count_parameters(model, config), parameter_formula(config)
    assert counted == formula
    assert sum(counted.groups.values()) == counted.total == sum(p.numel() for p in model.parameters())
    routed = counted.groups["routed_experts"]
    assert counted.active == counted.total - routed + routed * config.top_k // config.num_experts


@pytest.mark.parametrize(
    ("name", "total_billions", "active_billions"),
    [("proxy-1b", 1.0, 0.4), ("7b2a", 7.0, 2.0), ("16b4a", 16.0, 4.0)],
)
def test_production_presets_have_their_named_sizes(
    name: str, total_billions: float, active_billions: float
) -> None:
    config = preset(name).model
    with torch.device("meta"):  # shapes only: no memory is allocated
        counted = count_parameters(Transformer(config), config)
    assert counted == parameter_formula(config)
    assert counted.total / 1e9 == pytest.approx(total_billions, rel=0.08)
    assert counted.active / 1e9 == pytest.approx(active_billions, rel=0.08)
    # 6 FLOPs per multiplying active parameter plus attention: a little above 6 x active.
    non_embedding = counted.active - counted.groups["embedding"]
    assert 6 * non_embedding < flops_per_token(config) < 6 * non_embedding * 1.6


def test_presets_load_and_a_variant_changes_only_its_fields(tmp_path) -> None:
    assert preset_names()[:1] and {"tiny", "demo", "proxy-1b", "7b2a", "16b4a"} <= set(preset_names())
    base, variant = preset("7b2a"), preset("16b4a")
    assert variant.model.d_model == 3072 and variant.model.num_experts == base.model.num_experts
    assert variant.precision.recipe == base.precision.recipe == "fp8"
    (tmp_path / "bad.yaml").write_text("model:\n  widht: 3\n")
    with pytest.raises(ValueError, match=r"bad\.yaml: model\.widht: unknown key"):
        preset(str(tmp_path / "bad.yaml"))
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        preset("nope")


def test_overrides_are_typed_and_checked() -> None:
    config = apply_overrides(
        tiny(),
        ["model.top_k=1", "optim.lr=1e-3", "optim.grad_clip=1.0", "model.attention_pattern=swa,gqa"],
    )
    assert config.model.top_k == 1 and config.optim.lr == 1e-3 and config.optim.grad_clip == 1.0
    assert config.model.attention_pattern == ("swa", "gqa")
    assert apply_overrides(config, ["optim.grad_clip=null"]).optim.grad_clip is None
    assert Config.from_dict(config.to_dict()) == config
    nested = apply_overrides(config, ["model.mla.kv_lora_rank=8", "precision.recipe=fp8-emulated"])
    assert nested.model.mla.kv_lora_rank == 8 and nested.precision.recipe == "fp8-emulated"
    assert Config.from_dict(nested.to_dict()) == nested
    with pytest.raises(ValueError, match=r"model\.mla: expected a mapping"):
        apply_overrides(tiny(), ["model.mla=3"])
    with pytest.raises(ValueError, match=r"model\.topk: unknown key"):
        apply_overrides(tiny(), ["model.topk=1"])
    with pytest.raises(ValueError, match="expected one of"):
        apply_overrides(tiny(), ["model.router_score=relu"])
    with pytest.raises(ValueError, match="top_k=9"):
        apply_overrides(tiny(), ["model.top_k=9"])
    with pytest.raises(ValueError, match="section.field=value"):
        apply_overrides(tiny(), ["optim.lr"])


def test_model_config_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="n_kv_heads"):
        ModelConfig(n_heads=4, n_kv_heads=3, d_model=64)
    with pytest.raises(ValueError, match="attention_pattern entry 'flash'"):
        ModelConfig(attention_pattern=("flash",))
