"""Save and load trained heads with their thresholds and backbone config, under a version hash.

A folder holds `heads.safetensors` (probe.* and judge.* tensors) and `heads.json` (version, backbone
config, judge config, output width per rubric, keep aggregate weights, thresholds, training metrics).
The JSON is written last, each file under a temporary name renamed into place, so a folder with a JSON
is complete.

The version hashes the tensors and every config field that changes what the heads compute (backbone
path, layers, token limit, dtype, judge shape, aggregate weights), not where they run (device, batch
size). Scored rows carry
it, so rescoring can find the rows scored by other heads. Thresholds are stored beside the heads but are
not hashed: changing them changes decisions, not scores.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from moe_dag.quality.heads.backbone import BackboneConfig
from moe_dag.quality.heads.heads import JudgeHead, JudgeHeadConfig, ProbeHead, QualityHeads
from moe_dag.quality.heads.thresholds import Thresholds
from moe_dag.storage.atomic import atomic_path

WEIGHTS_FILE = "heads.safetensors"
META_FILE = "heads.json"
_RUNTIME_FIELDS = ("device", "batch_size")


@dataclass
class StoredHeads:
    heads: QualityHeads
    thresholds: dict[str, Thresholds]
    backbone_config: BackboneConfig
    version: str
    metrics: dict[str, float]


def _tensors(heads: QualityHeads) -> dict[str, torch.Tensor]:
    named = {f"probe.{k}": v for k, v in heads.probe.state_dict().items()}
    named |= {f"judge.{k}": v for k, v in heads.judge.state_dict().items()}
    return {k: v.detach().cpu().contiguous() for k, v in named.items()}


def heads_version(heads: QualityHeads, backbone_config: BackboneConfig) -> str:
    """16 hex digits of SHA-256 over the heads' tensors and the configs that shape their outputs."""
    backbone = {k: v for k, v in asdict(backbone_config).items() if k not in _RUNTIME_FIELDS}
    shape = {
        "backbone": backbone,
        "judge": asdict(heads.judge.config),
        "outputs": heads.outputs,
        "dimension_weights": heads.dimension_weights,
    }
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode())
    for name, tensor in sorted(_tensors(heads).items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def save_heads(
    directory: str | Path,
    heads: QualityHeads,
    thresholds: dict[str, Thresholds],
    backbone_config: BackboneConfig,
    metrics: dict[str, float] | None = None,
) -> str:
    """Write the heads folder and return the version."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    version = heads_version(heads, backbone_config)
    meta = {
        "version": version,
        "hidden_size": heads.probe.feature_mean.shape[0],
        "backbone": asdict(backbone_config),
        "judge": asdict(heads.judge.config),
        "outputs": heads.outputs,
        "dimension_weights": heads.dimension_weights,
        "thresholds": {source: asdict(t) for source, t in sorted(thresholds.items())},
        "metrics": metrics or {},
    }
    with atomic_path(folder / WEIGHTS_FILE) as partial:
        save_file(_tensors(heads), str(partial), metadata={"version": version})
    with atomic_path(folder / META_FILE) as partial:
        partial.write_text(json.dumps(meta, indent=2, sort_keys=True))
    return version


def load_heads(directory: str | Path) -> StoredHeads:
    """Read a heads folder; ValueError when its weights do not hash to the version it records."""
    folder = Path(directory)
    meta_path = folder / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path} not found: no complete heads were saved in {folder}")
    meta = json.loads(meta_path.read_text())
    if "outputs" not in meta:
        raise ValueError(f"{meta_path} was written by heads with one output; materialise quality_heads again")
    tensors = load_file(str(folder / WEIGHTS_FILE))
    hidden_size, outputs = meta["hidden_size"], meta["outputs"]
    probe = ProbeHead(hidden_size, outputs)
    judge = JudgeHead(hidden_size, JudgeHeadConfig(**meta["judge"]), outputs)
    probe.load_state_dict({k.removeprefix("probe."): v for k, v in tensors.items() if k.startswith("probe.")})
    judge.load_state_dict({k.removeprefix("judge."): v for k, v in tensors.items() if k.startswith("judge.")})
    heads = QualityHeads(probe=probe, judge=judge, dimension_weights=meta["dimension_weights"]).eval()
    backbone_config = BackboneConfig(**meta["backbone"])
    version = heads_version(heads, backbone_config)
    if version != meta["version"]:
        raise ValueError(
            f"{folder / WEIGHTS_FILE} hashes to version {version} but {meta_path} records {meta['version']}"
        )
    try:
        thresholds = {source: Thresholds(**t) for source, t in meta["thresholds"].items()}
    except TypeError as error:
        raise ValueError(
            f"{meta_path} records thresholds in an older format ({error}); materialise quality_heads again"
        ) from error
    return StoredHeads(heads, thresholds, backbone_config, version, meta["metrics"])
