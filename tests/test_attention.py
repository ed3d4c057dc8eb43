"""Every attention kind against its plain reference (values and gradients) and causal; KDA's chunked
form against its recurrence; the registry's errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from moe_dag.training.attention import ATTENTION
from moe_dag.training.attention.kda import kda_chunked, kda_recurrent
from moe_dag.training.config import ModelConfig, tiny
from moe_dag.training.model import Transformer, build_model

KINDS = sorted(ATTENTION)


def layer_model(kind: str, **changes: object) -> Transformer:
    torch.manual_seed(0)
    config = dataclasses.replace(tiny().model, attention_pattern=(kind,), sliding_window=6, **changes)
    return build_model(config).double()


def test_every_design_kind_is_registered() -> None:
    assert KINDS == ["gqa", "kda", "mha", "mla", "nsa", "swa"]


@pytest.mark.parametrize("kind", KINDS)
def test_attention_matches_its_reference_values_and_gradients(kind: str) -> None:
    model = layer_model(kind)
    attention, rotary = model.layers[0].attn, model.rotary
    # 23 positions: several NSA blocks and KDA chunks plus a partial one of each.
    x = torch.randn(2, 23, model.config.d_model, dtype=torch.float64, requires_grad=True)
    fast = attention(x, rotary)
    (fast_grad,) = torch.autograd.grad(fast.square().sum(), x)
    slow = attention.reference(x, rotary)
    (slow_grad,) = torch.autograd.grad(slow.square().sum(), x)
    torch.testing.assert_close(fast, slow, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(fast_grad, slow_grad, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("kind", KINDS)
def test_attention_is_causal(kind: str) -> None:
    model = layer_model(kind)
    attention, rotary = model.layers[0].attn, model.rotary
    x = torch.randn(2, 20, model.config.d_model, dtype=torch.float64)
    changed = x.clone()
    changed[:, 11:] = torch.randn(2, 9, model.config.d_model, dtype=torch.float64)
    with torch.no_grad():
        before, after = attention(x, rotary), attention(changed, rotary)
    torch.testing.assert_close(after[:, :11], before[:, :11], rtol=0, atol=1e-12)
    assert not torch.allclose(after[:, 11:], before[:, 11:])


@pytest.mark.parametrize(("length", "chunk"), [(37, 8), (16, 16), (5, 8)])
def test_kda_chunked_form_equals_the_recurrence(length: int, chunk: int) -> None:
    torch.manual_seed(1)
    B, H, C, V = 2, 3, 8, 5
    q = F.normalize(torch.randn(B, H, length, C, dtype=torch.float64), dim=-1)
    k = F.normalize(torch.randn(B, H, length, C, dtype=torch.float64), dim=-1)
    v = torch.randn(B, H, length, V, dtype=torch.float64)
    g = -5 * torch.rand(B, H, length, C, dtype=torch.float64)  # strong decays: exp(-5) per step
    beta = torch.rand(B, H, length, dtype=torch.float64)
    torch.testing.assert_close(kda_chunked(q, k, v, g, beta, chunk), kda_recurrent(q, k, v, g, beta))


def test_kda_forgets_per_channel() -> None:
    """A channel whose gate is closed (g = -inf) wipes its row of the state: the delta rule with a
    per-channel forget gate, not one scalar per head."""
    q = torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]]])  # [B=1, H=1, S=2, C=2]
    k = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])
    v = torch.tensor([[[[3.0], [5.0]]]])
    beta = torch.ones(1, 1, 2)
    keep = torch.zeros(1, 1, 2, 2)
    forget_first = keep.clone()
    forget_first[..., 1, 0] = -torch.inf
    assert kda_recurrent(q, k, v, keep, beta)[0, 0, 1, 0] == 3.0  # channel 0 still holds v_0
    assert kda_recurrent(q, k, v, forget_first, beta)[0, 0, 1, 0] == 0.0


def test_mla_compressed_queries_match_the_reference_too() -> None:
    model = layer_model("mla", mla=dataclasses.replace(tiny().model.mla, q_lora_rank=8))
    attention = model.layers[0].attn
    x = torch.randn(1, 9, model.config.d_model, dtype=torch.float64)
    assert hasattr(attention, "wq_a")
    torch.testing.assert_close(attention(x, model.rotary), attention.reference(x, model.rotary))


def test_nsa_selection_reaches_beyond_the_window() -> None:
    """With a tiny window, a distant token still changes the output through the compressed and
    selected branches (what a plain sliding window cannot do)."""
    model = layer_model("nsa", nsa=dataclasses.replace(tiny().model.nsa, window=1))
    attention = model.layers[0].attn
    x = torch.randn(1, 20, model.config.d_model, dtype=torch.float64)
    changed = x.clone()
    changed[:, 1] += 1.0
    with torch.no_grad():
        delta = (attention(changed, model.rotary) - attention(x, model.rotary)).abs().amax()
    assert delta > 1e-6


def test_unknown_attention_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="attention_pattern entry 'lightning'"):
        ModelConfig(attention_pattern=("lightning",))
