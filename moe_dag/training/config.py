"""Training configuration, split by concern, and the model presets of `configs/models/`.

`ModelConfig` says what the network is (with one small dataclass per attention family that needs
its own sizes), `OptimConfig` how it learns, `PrecisionConfig` in which number formats, `HealthConfig`
what counts as a broken run, `ParallelConfig` how it is spread over processes, `TrainConfig` how the
run is driven (batch, steps, checkpoints, logging).

Presets are YAML files in `configs/models/<name>.yaml`, the test preset (`tiny`) first. A preset may
name a `base:` preset and change only some fields, as a variant calls its base and changes a field.
`apply_overrides` applies `--set section.field=value` strings (nested: `model.mla.kv_lora_rank=64`),
`override_settings` typed settings by dotted key (the pipeline config's `training.overrides`). All of
them are read and checked by the one strict loader (`strict_config.py`): unknown keys, wrong types and
duplicate keys are refused with the file (or `--set`) and the key path.

`vocab_size` and `seq_len` in a preset are placeholders for the production tokenizer: the trainer
replaces them with the values the mixture was tokenized with (`mixture.json`), which is the source of
truth for both.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from moe_dag.training.strict_config import (
    ConfigError,
    Range,
    build,
    check_ranges,
    nested,
    read_yaml,
    update,
    yaml_value,
)

AttentionKind = Literal["mha", "gqa", "swa", "mla", "nsa", "kda"]
RouterScore = Literal["sigmoid", "softmax"]
DeviceChoice = Literal["auto", "cpu", "cuda"]
WandbMode = Literal["disabled", "offline", "online"]
TrackingBackend = Literal["wandb", "mlflow"]
OptimizerName = Literal["adamw", "muon"]
ScheduleName = Literal["cosine", "wsd"]
PrecisionRecipeName = Literal["fp32", "bf16", "fp8", "fp8-emulated", "nvfp4", "nvfp4-emulated"]
FP8Scaling = Literal["delayed", "current", "block"]
DataParallelKind = Literal["ddp", "fsdp", "hsdp"]
StopOn = Literal["never", "nan", "nan_or_spike"]

# Upper bounds of sizes a config may ask for (docs/configuration.md, "Ranges"): 10^7 optimizer steps is
# ten times a frontier pretraining run's; 2^20 token ids is four times the largest vocabulary in use
# (Gemma's 262,144), and the token shards' ids must fit uint32.
MAX_STEPS = 10_000_000
MAX_VOCAB_SIZE = 1 << 20

# The repository's preset folder; `preset()` also takes a path to a YAML file anywhere.
PRESET_DIR = Path(__file__).resolve().parents[2] / "configs" / "models"


@dataclass(kw_only=True, slots=True)
class MLAConfig:
    """Multi-head latent attention sizes (DeepSeek-V2, arXiv:2405.04434 sec. 2.1). None: head_dim."""

    q_lora_rank: int = 0  # 0: queries are projected directly, without a compressed latent
    kv_lora_rank: int = 64
    qk_rope_head_dim: int = 16  # the decoupled rotary part of each query/key head
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None


@dataclass(kw_only=True, slots=True)
class NSAConfig:
    """Native sparse attention (arXiv:2502.11089). Compression and selection share one block size
    with stride = block size, the paper's simplest setting, so selection scores are the compressed
    attention probabilities themselves (its eq. 9)."""

    block_size: int = 16
    num_selected: int = 4  # blocks each query attends to, its own block and the first block included
    window: int = 64


@dataclass(kw_only=True, slots=True)
class KDAConfig:
    """Kimi delta attention (Kimi Linear, arXiv:2510.26692)."""

    chunk_size: int = 16  # positions per chunk in the chunked training form
    conv_size: int = 4  # causal depthwise short convolution on q, k, v
    gate_rank: int | None = None  # low-rank forget and output gates; None: head_dim


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    vocab_size: Annotated[int, Range(1, MAX_VOCAB_SIZE)] = 50304
    seq_len: int = 2048
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    # Key/value heads for "gqa", "swa" and "nsa" layers; "mha" layers always use n_heads.
    n_kv_heads: int = 4
    # Repeated over the layers: ("kda", "kda", "kda", "mla") gives three KDA layers per MLA layer.
    attention_pattern: tuple[AttentionKind, ...] = ("gqa",)
    sliding_window: int = 512
    mla: MLAConfig = field(default_factory=MLAConfig)
    nsa: NSAConfig = field(default_factory=NSAConfig)
    kda: KDAConfig = field(default_factory=KDAConfig)
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
    # Sequence-wise balance loss (DeepSeek-V3 eq. 17-20); DeepSeek-V3 uses 1e-4. 0 turns it off.
    router_aux_loss_alpha: float = 0.0
    # Router z-loss (ST-MoE, arXiv:2202.08906 eq. 5); ST-MoE uses 1e-3. 0 turns it off.
    router_z_loss_coef: float = 0.0
    # Tokens each expert takes per forward = ceil(factor * N * k / E); the rest are dropped and
    # counted. None: dropless.
    capacity_factor: float | None = None
    # Initial value of the learnable gain applied after the RMSNorm on each MoE layer's output.
    output_norm_scale_init: float = 2.0
    # muP multipliers (Cerebras-GPT muP values): scale the embedding output up and the logits down.
    embedding_multiplier: float = 10.66
    output_multiplier: float = 0.125
    init_std: float = 0.02

    def __post_init__(self) -> None:
        check_ranges(self)
        for name in ("seq_len", "d_model", "n_layers", "n_heads", "n_kv_heads", "num_experts"):
            if getattr(self, name) < 1:
                raise ConfigError(f"must be at least 1, got {getattr(self, name)}", name)
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
        if self.mla.qk_rope_head_dim % 2:
            raise ValueError(f"model.mla.qk_rope_head_dim={self.mla.qk_rope_head_dim} must be even")
        if self.capacity_factor is not None and self.capacity_factor <= 0:
            raise ValueError(f"model.capacity_factor={self.capacity_factor} must be positive or none")
        if self.nsa.num_selected < 2:
            raise ValueError("model.nsa.num_selected must be at least 2 (the first and the current block)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def attention_kind(self, layer: int) -> AttentionKind:
        return self.attention_pattern[layer % len(self.attention_pattern)]

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_dense_layers


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    # AdamW for every parameter, or Muon for the hidden matrices (stacked experts included) and
    # AdamW for embeddings, head, norms, scalars and router (Moonlight, arXiv:2502.16982).
    name: OptimizerName = "adamw"
    lr: float = 3e-3  # the hidden matrices', and every group's left at None below
    embedding_lr: float | None = None
    head_lr: float | None = None
    router_lr: float | None = None
    scalar_lr: float | None = None  # norms and learnable scalars
    schedule: ScheduleName = "cosine"
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    decay_fraction: float = 0.2  # "wsd": the share of the steps spent decaying, at the end
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    muon_momentum: float = 0.95
    muon_ns_steps: int = 5
    grad_clip: float | None = None  # max global gradient norm; None (the default) never clips
    # Aux-loss-free balancing (DeepSeek-V3, arXiv:2412.19437 sec. 2.1.2): bias += rate * sign(mean - load).
    expert_bias_update_rate: float = 1e-3

    def __post_init__(self) -> None:
        if not 0 < self.decay_fraction <= 1:
            raise ValueError(f"optim.decay_fraction={self.decay_fraction} must be in (0, 1]")


@dataclass(kw_only=True, slots=True)
class PrecisionConfig:
    recipe: PrecisionRecipeName = "fp32"
    # Transformer Engine scaling for recipe "fp8": per-tensor delayed (amax history) or current
    # scaling, or block scaling (1x128 activation tiles, 128x128 weight blocks, as DeepSeek-V3).
    fp8_scaling: FP8Scaling = "block"
    # The first and last blocks stay in bf16 under the fp8 and nvfp4 recipes (Nemotron-H and
    # DeepSeek-V3 keep their most sensitive layers in higher precision).
    high_precision_edge_layers: int = 1


@dataclass(kw_only=True, slots=True)
class ParallelConfig:
    """Every process is a data-parallel rank (its own batch); groups of `ep` consecutive ranks also
    split the routed experts among them (expert parallelism: num_experts / ep experts per rank, tokens
    exchanged all-to-all). The world size must be a multiple of `ep`, and num_experts of `ep`."""

    ep: int = 1
    # The dense parts (attention, dense FFN, shared experts, router, embedding, head) on every rank:
    # replicated with DistributedDataParallel, sharded over all ranks with FSDP2 (`fully_shard`), or
    # hybrid: FSDP2 over a (nodes, processes per node) mesh, sharded within a node and replicated across
    # nodes, so parameter gathers stay on the node's links and only gradients cross nodes.
    data_parallel: DataParallelKind = "ddp"
    # Tokens cross the all-to-all as e4m3 with a float32 scale per 1x128 tile (half the bytes of bf16),
    # dequantised before the experts' first product; gradients return in the compute dtype.
    fp8_dispatch: bool = False

    def __post_init__(self) -> None:
        if self.ep < 1:
            raise ValueError(f"parallel.ep={self.ep} must be at least 1")
        kinds = typing.get_args(DataParallelKind)
        if self.data_parallel not in kinds:
            raise ValueError(f"parallel.data_parallel={self.data_parallel!r} is not one of {kinds}")


@dataclass(kw_only=True, slots=True)
class HealthConfig:
    dead_expert_window: int = 50  # steps without a token before an expert counts as dead
    spike_factor: float = 3.0  # a loss above factor x the running mean is a spike
    spike_window: int = 50  # steps in the running mean of the loss
    spike_min_steps: int = 10  # steps observed before spikes are looked for
    stop_on: StopOn = "nan"


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    steps: Annotated[int, Range(0, MAX_STEPS)] = 1000
    batch_size: int = 16  # sequences per rank per micro-step
    grad_accum_steps: int = 1
    seed: int = 0
    device: DeviceChoice = "auto"
    num_threads: int | None = None  # None: the CPU cores this process may use, split over local ranks
    log_every: int = 10
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    # Peak FLOP/s for MFU; None: the accelerator's datasheet figure, or the measured matmul rate on CPU.
    peak_tflops: float | None = None
    # Where the run is tracked (tracking.py): wandb, in `wandb_mode`, or an MLflow server at
    # `tracking_uri` (None: $MLFLOW_TRACKING_URI), which is on whenever chosen.
    tracking: TrackingBackend = "wandb"
    wandb_mode: WandbMode | None = None  # None: $WANDB_MODE if set, else "disabled"
    wandb_project: str = "moe-dag"  # also MLflow's experiment name
    tracking_uri: str | None = None

    # Where a run is tracked, not what it trains: a run moved to another backend resumes in its folder.
    TRACKING_FIELDS = ("tracking", "wandb_mode", "wandb_project", "tracking_uri")

    def __post_init__(self) -> None:
        check_ranges(self)
        for name in ("batch_size", "grad_accum_steps", "log_every", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name}={getattr(self, name)} must be at least 1")


@dataclass(kw_only=True, slots=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], origin: str = "config") -> Config:
        """The inverse of `to_dict` (checked as a preset is); sections or fields left out keep their
        defaults. `origin` names where `raw` came from in errors."""
        return build(cls, raw, origin)


def preset_names() -> list[str]:
    return sorted(path.stem for path in PRESET_DIR.glob("*.yaml"))


def preset(name: str) -> Config:
    """The preset `configs/models/<name>.yaml`, or the YAML file at path `name`."""
    return _preset(_preset_path(name), seen=())


def _preset_path(name: str) -> Path:
    path = Path(name) if name.endswith((".yaml", ".yml")) else PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown preset {name!r}; choose one of {preset_names()} or give a YAML path")
    return path


def _preset(path: Path, seen: tuple[Path, ...]) -> Config:
    """A preset's own settings applied to its `base:` preset (a sibling file), or to the defaults: an
    error names the file that holds the bad setting."""
    if path in seen:
        raise ConfigError("preset bases form a cycle", origin=str(path))
    raw = read_yaml(path)
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"expected a mapping, got {type(raw).__name__}", origin=str(path))
    base_name = raw.pop("base", None)
    if base_name is None:
        return build(Config, raw, str(path))
    if not isinstance(base_name, str):
        raise ConfigError(f"expected a preset name, got {base_name!r}", "base", str(path))
    # A sibling file first (variants kept together), else the repository's preset of that name.
    base_path = next(
        (p for p in (path.parent / f"{base_name}.yaml", PRESET_DIR / f"{base_name}.yaml") if p.is_file()),
        None,
    )
    if base_path is None:
        raise ConfigError(f"no preset {base_name!r} beside this file or in {PRESET_DIR}", "base", str(path))
    return update(_preset(base_path, (*seen, path)), raw, str(path))


def tiny() -> Config:
    """The test preset: a model that trains in milliseconds per step."""
    return preset("tiny")


def override_settings(config: Config, settings: dict[str, Any], origin: str, key: str = "") -> Config:
    """`config` with typed settings by dotted key (`{"model.mla.kv_lora_rank": 64}`) applied together
    and checked; an error names `origin` and the key path below `key`."""
    try:
        changes = nested(settings)
    except ConfigError as error:
        raise error.within(key, origin) from None
    return update(config, changes, origin, key)


def apply_overrides(config: Config, overrides: list[str]) -> Config:
    """`config` with each command-line `section.field=value` applied; each value is read once as YAML
    (`optim.lr=1e-3`, `optim.grad_clip=null`, `model.attention_pattern=kda,mla`), then checked as a
    preset's values are. A later override of the same field wins."""
    settings = {}
    for item in overrides:
        dotted, sep, text = item.partition("=")
        if not sep or not dotted.strip():
            raise ConfigError("must look like section.field=value", origin=f"--set {item}")
        settings[dotted.strip()] = yaml_value(text, origin=f"--set {item}")
    return override_settings(config, settings, origin="--set")
