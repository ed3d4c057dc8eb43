"""Train the probe and judge heads on oracle labels, over a frozen backbone run once.

The backbone is the expensive part and it is frozen, so its outputs are computed once and cached: the
probe layer's hidden states mean-pooled (all the probe ever reads), and the judge layer's hidden states
reached by continuing from the probe layer, exactly as scoring will reach them. Both heads then train on
the cache for many epochs at the cost of the heads alone. The cache holds N x max_tokens x D judge
states: ~120 MB for 600 MiniLM documents; a sample of 10^5 gpt-oss documents would need streaming.

A held-out part of every source (heldout_fraction, at least one document where a source has two) is never
trained on: its predictions measure the heads against the oracle and calibrate the thresholds.
Training is deterministic for a seed (initialisation, split, shuffling and dropout all derive from it).

Tensor shape letters: N documents, B batch, T tokens, D backbone hidden size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from moe_dag.data.heads.backbone import Backbone
from moe_dag.data.heads.heads import JudgeHead, JudgeHeadConfig, ProbeHead, QualityHeads, masked_mean


@dataclass(kw_only=True)
class HeadTrainConfig:
    epochs: int = 20
    probe_lr: float = 1e-2
    judge_lr: float = 3e-4
    weight_decay: float = 0.01
    batch_size: int = 32
    heldout_fraction: float = 0.2
    seed: int = 0
    # Targets live in [0, 1] and oracle noise is about one rubric step (0.05-0.1 of quality): squared
    # error below that, absolute error beyond it, so a few mislabelled documents do not dominate.
    huber_delta: float = 0.1
    # Ridge penalty on the probe's weights: hundreds of labels against hundreds of pooled features
    # overfit without it.
    probe_l2: float = 0.05
    judge: JudgeHeadConfig = field(default_factory=JudgeHeadConfig)

    def __post_init__(self) -> None:
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(
                f"HeadTrainConfig.heldout_fraction must be in (0, 1), got {self.heldout_fraction}"
            )
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError(
                f"HeadTrainConfig needs epochs and batch_size >= 1, got {self.epochs}, {self.batch_size}"
            )


@dataclass
class HeldOut:
    """Predictions on the held-out documents; `index` points into the training inputs."""

    index: np.ndarray
    sources: list[str]
    oracle: np.ndarray
    probe: np.ndarray
    judge: np.ndarray


@dataclass
class TrainedHeads:
    heads: QualityHeads
    heldout: HeldOut
    metrics: dict[str, float]


@dataclass
class BackboneFeatures:
    pooled_probe_ND: torch.Tensor
    judge_NTD: torch.Tensor
    mask_NT: torch.Tensor


def encode(backbone: Backbone, texts: Sequence[str]) -> BackboneFeatures:
    """Run the frozen backbone once: pooled probe-layer features and judge-layer hidden states."""
    probe_layer, judge_layer = backbone.config.probe_layer, backbone.config.judge_layer
    n, width = len(texts), backbone.config.max_tokens
    pooled_ND = torch.zeros(n, backbone.hidden_size)
    judge_NTD = torch.zeros(n, width, backbone.hidden_size)
    mask_NT = torch.zeros(n, width, dtype=torch.long)
    # Similar lengths share a batch, so little compute goes to padding.
    order = sorted(range(n), key=lambda i: len(texts[i]))
    batch_size = backbone.config.batch_size
    for start in tqdm(range(0, n, batch_size), desc="backbone", disable=None):
        rows = order[start : start + batch_size]
        ids_BT, mask_BT = backbone.tokenize([texts[i] for i in rows])
        probe_BTD = backbone.run_layers(backbone.embed(ids_BT), mask_BT, 0, probe_layer)
        judge_BTD = backbone.run_layers(probe_BTD, mask_BT, probe_layer, judge_layer)
        t = mask_BT.shape[1]
        pooled_ND[rows] = masked_mean(probe_BTD, mask_BT).float().cpu()
        judge_NTD[rows, :t] = judge_BTD.float().cpu()
        mask_NT[rows, :t] = mask_BT.cpu()
    return BackboneFeatures(pooled_ND, judge_NTD, mask_NT)


def split_heldout(sources: Sequence[str], fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, heldout) positions, with `fraction` of every source held out."""
    rng = np.random.default_rng(seed)
    train, heldout = [], []
    labels = np.asarray(sources, dtype=object)
    for source in sorted(set(sources)):
        rows = rng.permutation(np.flatnonzero(labels == source))
        k = math.ceil(fraction * len(rows)) if len(rows) >= 2 else 0
        heldout.extend(rows[:k])
        train.extend(rows[k:])
    return np.sort(np.asarray(train, dtype=np.int64)), np.sort(np.asarray(heldout, dtype=np.int64))


def _fit(
    head: nn.Module,
    predict: Callable[[torch.Tensor], torch.Tensor],
    targets_N: torch.Tensor,
    lr: float,
    config: HeadTrainConfig,
    generator: torch.Generator,
    desc: str,
    penalty: Callable[[], torch.Tensor] | None = None,
) -> None:
    """Minimise the Huber loss of predict(rows) against targets (plus `penalty`), AdamW, cosine rate."""
    n = len(targets_N)
    steps = config.epochs * math.ceil(n / config.batch_size)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    head.train()
    for _ in tqdm(range(config.epochs), desc=desc, disable=None):
        for rows in torch.randperm(n, generator=generator).split(config.batch_size):
            loss = F.huber_loss(predict(rows), targets_N[rows], delta=config.huber_delta)
            if penalty is not None:
                loss = loss + penalty()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
    head.eval()


def _train_probe(
    pooled_ND: torch.Tensor, targets_N: torch.Tensor, config: HeadTrainConfig, generator: torch.Generator
) -> ProbeHead:
    probe = ProbeHead(pooled_ND.shape[1])
    probe.set_feature_stats(pooled_ND)
    _fit(
        probe,
        lambda rows: probe.score_pooled(pooled_ND[rows]),
        targets_N,
        config.probe_lr,
        config,
        generator,
        "probe",
        penalty=lambda: config.probe_l2 * probe.linear.weight.square().sum(),
    )
    return probe


def _train_judge(
    judge_NTD: torch.Tensor,
    mask_NT: torch.Tensor,
    targets_N: torch.Tensor,
    config: HeadTrainConfig,
    generator: torch.Generator,
) -> JudgeHead:
    judge = JudgeHead(judge_NTD.shape[2], config.judge)

    def predict(rows: torch.Tensor) -> torch.Tensor:
        width = int(mask_NT[rows].sum(1).max())  # drop the columns that are padding in every row
        return judge(judge_NTD[rows, :width], mask_NT[rows, :width])

    _fit(judge, predict, targets_N, config.judge_lr, config, generator, "judge")
    return judge


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks with ties given their average rank (as Spearman's coefficient needs)."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    _, first, counts = np.unique(values[order], return_index=True, return_counts=True)
    for start, count in zip(first, counts, strict=True):
        ranks[order[start : start + count]] = start + (count - 1) / 2
    return ranks


def agreement(predicted: np.ndarray, oracle: np.ndarray) -> dict[str, float]:
    """Pearson, Spearman and mean absolute error of predictions against oracle qualities."""
    if len(predicted) < 2 or np.std(predicted) == 0 or np.std(oracle) == 0:
        pearson = spearman = float("nan")  # undefined for constant inputs
    else:
        pearson = float(np.corrcoef(predicted, oracle)[0, 1])
        spearman = float(np.corrcoef(_ranks(predicted), _ranks(oracle))[0, 1])
    mae = float(np.mean(np.abs(predicted - oracle))) if len(predicted) else float("nan")
    return {"pearson": pearson, "spearman": spearman, "mae": mae}


def train_heads(
    backbone: Backbone,
    texts: Sequence[str],
    qualities: Sequence[float],
    sources: Sequence[str],
    config: HeadTrainConfig,
) -> TrainedHeads:
    if not len(texts) == len(qualities) == len(sources):
        raise ValueError(
            f"train_heads needs one quality and source per text, got {len(texts)} texts, "
            f"{len(qualities)} qualities, {len(sources)} sources"
        )
    targets_N = torch.tensor(qualities, dtype=torch.float32)
    if targets_N.numel() and not bool(((targets_N >= 0) & (targets_N <= 1)).all()):
        raise ValueError("train_heads: qualities must lie in [0, 1]")
    train_rows, heldout_rows = split_heldout(sources, config.heldout_fraction, config.seed)
    if len(train_rows) < 2:
        raise ValueError(f"train_heads needs at least 2 training documents, got {len(train_rows)}")

    features = encode(backbone, texts)
    train_index = torch.from_numpy(train_rows)
    with torch.random.fork_rng():  # seeds init and dropout without disturbing the caller's RNG
        torch.manual_seed(config.seed)
        generator = torch.Generator().manual_seed(config.seed)
        probe = _train_probe(features.pooled_probe_ND[train_index], targets_N[train_index], config, generator)
        judge = _train_judge(
            features.judge_NTD[train_index],
            features.mask_NT[train_index],
            targets_N[train_index],
            config,
            generator,
        )

    heads = QualityHeads(probe=probe, judge=judge)
    heldout = _predict_heldout(heads, features, heldout_rows, targets_N, sources)
    metrics = {f"probe_{k}": v for k, v in agreement(heldout.probe, heldout.oracle).items()}
    metrics |= {f"judge_{k}": v for k, v in agreement(heldout.judge, heldout.oracle).items()}
    metrics |= {"n_train": float(len(train_rows)), "n_heldout": float(len(heldout_rows))}
    return TrainedHeads(heads=heads, heldout=heldout, metrics=metrics)


@torch.no_grad()
def _predict_heldout(
    heads: QualityHeads,
    features: BackboneFeatures,
    rows: np.ndarray,
    targets_N: torch.Tensor,
    sources: Sequence[str],
) -> HeldOut:
    index = torch.from_numpy(rows)
    if len(rows):
        probe = heads.probe.score_pooled(features.pooled_probe_ND[index])
        judge = heads.judge(features.judge_NTD[index], features.mask_NT[index])
    else:  # a sample too small to hold anything out
        probe = judge = torch.zeros(0)
    return HeldOut(
        index=rows,
        sources=[sources[i] for i in rows],
        oracle=targets_N[index].numpy().astype(np.float64),
        probe=probe.numpy().astype(np.float64),
        judge=judge.numpy().astype(np.float64),
    )
