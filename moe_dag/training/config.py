"""Training configuration, split by concern, and the presets.

`ModelConfig` says what the network is, `OptimConfig` how it learns, `TrainConfig` how the run is
driven (batch, steps, checkpoints, logging). Presets are plain functions, the test preset first; a
variant calls its base and changes fields. `apply_overrides` turns `--set section.field=value` strings
into a new config, checking each value against the field's type.

`vocab_size` and `seq_len` in a preset are placeholders for the production tokenizer: the trainer
replaces them with the values the mixture was tokenized with (`mixture.json`), which is the source of
truth for both.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

AttentionKind = Literal["mha", "gqa", "swa"]
RouterScore = Literal["sigmoid", "softmax"]
DeviceChoice = Literal["auto", "cpu", "cuda"]
WandbMode = Literal["disabled", "offline", "online"]


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    vocab_size: int = 50304
    seq_len: int = 2048
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    # Key/value heads for "gqa" and "swa" layers; "mha" layers always use n_heads.
    n_kv_heads: int = 4
    # Repeated over the layers: ("swa", "swa", "gqa") gives two local layers per global one.
    attention_pattern: tuple[AttentionKind, ...] = ("gqa",)
    sliding_window: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    # The first layers keep a dense SwiGLU FFN: DeepSeekMoE (arXiv:2401.06066) saw the first layer's
    # load balance converge especially slowly; DeepSeek-V3 keeps 3 dense layers.
    first_dense_layers: int = 1
    dense_hidden: int = 2048
    num_experts: int = 8
    top_k: int = 2
    expert_hidden: int = 512
    num_shared_experts: int = 1
    router_score: RouterScore = "sigmoid"
    # Initial value of the learnable gain applied after the RMSNorm on each MoE layer's output.
    output_norm_scale_init: float = 2.0
    # muP multipliers (Cerebras-GPT muP values): scale the embedding output up and the logits down.
    embedding_multiplier: float = 10.66
    output_multiplier: float = 0.125
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"model head_dim={self.d_model // self.n_heads} must be even for RoPE")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"model.n_heads={self.n_heads} is not divisible by model.n_kv_heads={self.n_kv_heads}"
            )
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"model.top_k={self.top_k} must be in 1..model.num_experts={self.num_experts}")
        if not 0 <= self.first_dense_layers <= self.n_layers:
            raise ValueError(f"model.first_dense_layers={self.first_dense_layers} must be in 0..n_layers")
        if not self.attention_pattern:
            raise ValueError("model.attention_pattern must name at least one attention kind")
        allowed = typing.get_args(AttentionKind)
        for kind in self.attention_pattern:
            if kind not in allowed:
                raise ValueError(f"model.attention_pattern entry {kind!r} is not one of {allowed}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def attention_kind(self, layer: int) -> AttentionKind:
        return self.attention_pattern[layer % len(self.attention_pattern)]

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_dense_layers


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float | None = None  # max global gradient norm; None (the default) never clips
    # Aux-loss-free balancing (DeepSeek-V3, arXiv:2412.19437 sec. 2.1.2): bias += rate * sign(mean - load).
    expert_bias_update_rate: float = 1e-3


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    steps: int = 1000
    batch_size: int = 16  # sequences per rank per micro-step
    grad_accum_steps: int = 1
    seed: int = 0
    device: DeviceChoice = "auto"
    num_threads: int | None = None  # None: the CPU cores this process may use, split over local ranks
    log_every: int = 10
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    wandb_mode: WandbMode | None = None  # None: $WANDB_MODE if set, else "disabled"
    wandb_project: str = "moe-dag"

    def __post_init__(self) -> None:
        for name in ("batch_size", "grad_accum_steps", "log_every", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name}={getattr(self, name)} must be at least 1")
        if self.steps < 0:
            raise ValueError(f"train.steps={self.steps} must not be negative")


@dataclass(kw_only=True, slots=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Config:
        model = dict(raw["model"])
        model["attention_pattern"] = tuple(model["attention_pattern"])
        return cls(
            model=ModelConfig(**model), optim=OptimConfig(**raw["optim"]), train=TrainConfig(**raw["train"])
        )


def tiny() -> Config:
    """A model that trains in milliseconds per step: for tests."""
    return Config(
        model=ModelConfig(
            vocab_size=256,
            seq_len=32,
            d_model=32,
            n_layers=2,
            n_heads=2,
            n_kv_heads=1,
            first_dense_layers=1,
            dense_hidden=64,
            num_experts=4,
            top_k=2,
            expert_hidden=32,
            num_shared_experts=1,
        ),
        optim=OptimConfig(lr=3e-2, warmup_steps=2, expert_bias_update_rate=1e-2),
        train=TrainConfig(steps=20, batch_size=4, log_every=5, checkpoint_every=10),
    )


def demo() -> Config:
    """The CPU demo: a few million parameters, 300 steps of 16 x 128 tokens in about a minute."""
    return Config(
        model=ModelConfig(
            vocab_size=4096,
            seq_len=128,
            d_model=128,
            n_layers=4,
            n_heads=4,
            n_kv_heads=2,
            first_dense_layers=1,
            dense_hidden=384,
            num_experts=8,
            top_k=2,
            expert_hidden=96,
            num_shared_experts=1,
        ),
        # A 300-step run needs a faster bias than DeepSeek's 1e-3 to undo early routing collapse: in the
        # first steps the residual stream is dominated by one direction shared by all tokens (the unigram
        # logits), so the last layers route nearly every token alike (measured: max/mean load 4.0 of a
        # possible 4.0 at 1e-3, 1.5-2.0 at 1e-2, oscillation at 3e-2).
        optim=OptimConfig(lr=3e-3, warmup_steps=30, expert_bias_update_rate=1e-2),
        train=TrainConfig(steps=300, batch_size=16, log_every=25, checkpoint_every=100),
    )


def moe_7b2a() -> Config:
    """About 7B total and 2B active parameters per token: 64 fine-grained experts, 8 chosen, 4 shared."""
    return Config(
        model=ModelConfig(
            vocab_size=100352,
            seq_len=4096,
            d_model=2048,
            n_layers=32,
            n_heads=16,
            n_kv_heads=4,
            first_dense_layers=1,
            dense_hidden=8192,
            num_experts=64,
            top_k=8,
            expert_hidden=512,
            num_shared_experts=4,
        ),
        optim=OptimConfig(lr=4e-4, warmup_steps=2000),
        train=TrainConfig(steps=100_000, batch_size=8, log_every=10, checkpoint_every=1000),
    )


def moe_16b4a() -> Config:
    """About 16B total and 4B active parameters per token: 7b2a made wider, with wider experts."""
    base = moe_7b2a()
    model = dataclasses.replace(
        base.model, d_model=3072, n_layers=28, n_heads=24, dense_hidden=12288, expert_hidden=896
    )
    return Config(model=model, optim=dataclasses.replace(base.optim, lr=3e-4), train=base.train)


PRESETS = {"tiny": tiny, "demo": demo, "moe_7b2a": moe_7b2a, "moe_16b4a": moe_16b4a}


def preset(name: str) -> Config:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]()


def apply_overrides(config: Config, overrides: list[str]) -> Config:
    """Return a copy of `config` with each `section.field=value` override applied and validated."""
    sections = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    for item in overrides:
        key, sep, raw = item.partition("=")
        section_name, _, field_name = key.strip().partition(".")
        if not sep or section_name not in sections:
            raise ValueError(
                f"override {item!r} must look like section.field=value, section in {list(sections)}"
            )
        section = sections[section_name]
        hints = typing.get_type_hints(type(section))
        if field_name not in hints:
            raise ValueError(f"override {item!r}: {type(section).__name__} has no field {field_name!r}")
        value = _parse(raw.strip(), hints[field_name], item)
        sections[section_name] = dataclasses.replace(section, **{field_name: value})
    return Config(**sections)


def _parse(raw: str, hint: Any, item: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if raw.lower() in ("none", "null"):
            return None
        return _parse(raw, next(a for a in args if a is not type(None)), item)
    if origin is Literal:
        if raw not in args:
            raise ValueError(f"override {item!r}: {raw!r} is not one of {args}")
        return raw
    if origin is tuple:
        return tuple(_parse(part.strip(), args[0], item) for part in raw.split(",") if part.strip())
    if hint is bool:
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"override {item!r}: expected true or false")
        return raw.lower() in ("true", "1")
    try:
        return hint(raw)
    except ValueError as error:
        raise ValueError(f"override {item!r}: expected {hint.__name__}") from error
