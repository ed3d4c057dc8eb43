"""A decoder-only mixture-of-experts transformer, free of any parallelism or training machinery.

tokens -> embedding x embedding_multiplier -> n_layers pre-norm blocks (attention, then a dense SwiGLU
in the first `first_dense_layers` blocks and an MoE layer in the rest) -> RMSNorm -> untied output head
-> logits x output_multiplier. The two multipliers are the muP ones (arXiv:2203.03466; values from
Cerebras-GPT, arXiv:2304.03208).

Build with `build_model`: modules are created on the meta device (no memory, no wasted init), then
materialised on the target device and initialised once by `Transformer.init_weights`; every RMSNorm
with a weight then runs through the kernels room's `rms_norm` (Triton on a GPU, its reference on CPU).
Expert parallelism goes between the two halves, `meta_model` and `materialise`: it narrows each MoE
layer's experts to the rank's slice while they are still meta, so a rank allocates and draws only its
own experts, with the values a whole build gives them (`RoutedExperts.keep`, `slice_init.py`).

Shape legend: B batch, S sequence, D model width, V vocabulary.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from moe_dag.kernels import use_triton_rms_norm
from moe_dag.training.attention import Rotary, spec_for
from moe_dag.training.config import ModelConfig
from moe_dag.training.moe import MoE, SwiGLU


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.attn = spec_for(config, layer).build(config)
        self.ffn_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.ffn = MoE(config) if config.is_moe_layer(layer) else SwiGLU(config.d_model, config.dense_hidden)

    def forward(self, x_BSD: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        x_BSD = x_BSD + self.attn(self.attn_norm(x_BSD), rotary)
        return x_BSD + self.ffn(self.ffn_norm(x_BSD))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config, layer) for layer in range(config.n_layers))
        self.norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.output = nn.Linear(config.d_model, config.vocab_size, bias=False)
        rotary_dims = [spec_for(config, layer).rotary_dim(config) for layer in range(config.n_layers)]
        self.rotary = Rotary(config.seq_len, [dim for dim in rotary_dims if dim], config.rope_theta)

    def forward(self, tokens_BS: torch.Tensor) -> torch.Tensor:
        """Next-token logits [B, S, V] in float32 for token ids [B, S]."""
        return self.output(self.head_input(tokens_BS)).float()

    def head_input(self, tokens_BS: torch.Tensor) -> torch.Tensor:
        """The output head's input [B, S, D]: `forward` is `output(head_input(tokens)).float()`, so a
        caller that needs only a reduction of the [B, S, V] logits can make them a few positions at a
        time (evaluate.py)."""
        assert tokens_BS.shape[1] <= self.config.seq_len, "sequence longer than the rotary tables"
        x_BSD = self.tok_embeddings(tokens_BS) * self.config.embedding_multiplier
        for block in self.layers:
            x_BSD = block(x_BSD, self.rotary)
        # Scaling the head's [B, S, D] input equals scaling its [B, S, V] output, V/D times cheaper.
        return self.norm(x_BSD) * self.config.output_multiplier

    def moe_layers(self) -> list[MoE]:
        return [block.ffn for block in self.layers if isinstance(block.ffn, MoE)]

    def moe_layer_indices(self) -> list[int]:
        return [i for i, block in enumerate(self.layers) if isinstance(block.ffn, MoE)]

    def router_loss(self) -> torch.Tensor | None:
        """The MoE layers' auxiliary router losses from the last training forward (None if all off)."""
        losses = [moe.router_loss for moe in self.moe_layers() if moe.router_loss is not None]
        return sum(losses) if losses else None

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise every parameter and buffer (std = config.init_std, L = n_layers):

        | tensor                                         | init                                   |
        | ---------------------------------------------- | -------------------------------------- |
        | tok_embeddings.weight                          | normal(0, std); x10.66 in forward      |
        | attention projections into heads               | normal(0, std); each kind's own extras |
        |                                                | in its `init_weights`                  |
        | ffn w1, w3 (dense, shared, routed experts)     | normal(0, std)                         |
        | attn.wo, dense ffn w2                          | normal(0, std / sqrt(2 L)): residual   |
        |                                                | branches sum over 2 L writes (GPT-2)   |
        | MoE w2 (shared, routed experts)                | normal(0, std): the pre-output norm    |
        |                                                | sets the branch size, not this std     |
        | ffn.router.gate.weight                         | normal(0, std)                         |
        | ffn.router.expert_bias_E (buffer)              | 0                                      |
        | RMSNorm weights                                | 1                                      |
        | ffn.output_norm_scale (MoE pre-output norm)    | output_norm_scale_init (2.0)           |
        | output.weight                                  | normal(0, std); x0.125 in forward      |
        | rotary.cos_*, rotary.sin_* (buffers)           | RoPE tables, one per rotary width      |
        | ffn.tokens_per_expert_E, ffn.router_stats      | 0                                      |
        """
        config = self.config
        std, residual_std = config.init_std, config.init_std / math.sqrt(2 * config.n_layers)
        nn.init.normal_(self.tok_embeddings.weight, std=std)
        nn.init.normal_(self.output.weight, std=std)
        for module in self.modules():
            if isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)
        for block in self.layers:
            block.attn.init_weights(std, residual_std)
            ffn = block.ffn
            if isinstance(ffn, SwiGLU):
                self._init_swiglu(ffn, std, w2_std=residual_std)
            else:
                if ffn.shared is not None:
                    self._init_swiglu(ffn.shared, std, w2_std=std)
                nn.init.normal_(ffn.router.gate.weight, std=std)
                ffn.router.expert_bias_E.zero_()
                ffn.experts.init_weights(std)  # this rank's slice only, under expert parallelism
                ffn.output_norm_scale.fill_(config.output_norm_scale_init)
                ffn.tokens_per_expert_E.zero_()
                ffn.router_stats.zero_()
        self.rotary.init_tables()

    @staticmethod
    def _init_swiglu(ffn: SwiGLU, std: float, w2_std: float) -> None:
        nn.init.normal_(ffn.w1.weight, std=std)
        nn.init.normal_(ffn.w3.weight, std=std)
        nn.init.normal_(ffn.w2.weight, std=w2_std)


def meta_model(config: ModelConfig) -> Transformer:
    """The model on the meta device: shapes only, no memory, nothing drawn."""
    with torch.device("meta"):
        return Transformer(config)


def materialise(model: Transformer, device: torch.device | str) -> Transformer:
    """Allocate a meta model's parameters and buffers on `device` and initialise them (in place)."""
    model.to_empty(device=device)
    model.init_weights()
    use_triton_rms_norm(model)
    return model


def build_model(config: ModelConfig, device: torch.device | str = "cpu") -> Transformer:
    """Create the model on the meta device, then materialise it on `device` and initialise it."""
    return materialise(meta_model(config), device)
