"""Train the probe and judge heads on oracle labels, over a frozen backbone run once.

Both heads learn every dimension of each document's rubric (Huber loss on the scores as fractions of
the scale), not one averaged number: the dimensions disagree in instructive ways (a long, correct but
incoherent page), and the keep aggregate can then be reweighted without retraining.

The backbone is the expensive part and it is frozen, so its outputs are computed once and cached: the
probe layer's hidden states mean-pooled (all the probe ever reads), and the judge layer's hidden states
reached by continuing from the probe layer, exactly as scoring will reach them. Both heads then train on
the cache for many epochs at the cost of the heads alone. The cache holds N x max_tokens x D judge
states: ~120 MB for 600 MiniLM documents; a sample of 10^5 gpt-oss documents would need streaming.

The probe is the judge's student by default (`probe_teacher: judge`): early exit needs the probe to
agree with the judge on the documents it settles, and the judge's scores are a smooth function of the
same text where the oracle's labels are noisy. So once the judge is trained, the probe is fitted to the
judge's dimension scores on the training documents, in closed form: per rubric, a ridge regression of
their logits on the standardised pooled features, which is exactly the probe's linear map before its
sigmoid. On the benchmark's 2,400 demo documents this raised the probe's correlation with the judge on
unseen documents from 0.66 and 0.61 (trained on the oracle's labels; two judges) to 0.81 and 0.79; the
documents leaving at the probe under the same 1% exit bound went from 15.6% to 32% with the first judge
and from 12.7% to 13.7% with the second (docs/scoring.md#what-each-part-costs).
`probe_teacher: oracle` trains it on the labels, with AdamW, as the judge is.

A held-out part of every source (heldout_fraction, at least one document where a source has two) is never
trained on: its predictions measure the heads against the oracle. Training is deterministic for a seed
(initialisation, split, shuffling and dropout all derive from it).

Tensor shape letters: N documents, B batch, T tokens, D backbone hidden size, K dimensions (padded to
the widest rubric in the targets).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from moe_dag.quality.heads.backbone import Backbone
from moe_dag.quality.heads.evaluation import agreement, keep_f1, spearman
from moe_dag.quality.heads.heads import (
    JudgeHead,
    JudgeHeadConfig,
    ProbeHead,
    QualityHeads,
    masked_mean,
    rubric_outputs,
)
from moe_dag.quality.oracle.rubrics import RUBRICS, rubric_by_name

_ALL_DIMENSIONS = {dim for rubric in RUBRICS.values() for dim in rubric.dimensions}


@dataclass(kw_only=True)
class HeadTrainConfig:
    epochs: int = 20
    probe_lr: float = 1e-2
    judge_lr: float = 3e-4
    weight_decay: float = 0.01
    batch_size: int = 32
    heldout_fraction: float = 0.2
    seed: int = 0
    # Targets live in [0, 1] and oracle noise is about one rubric step (0.1-0.25 of the scale): squared
    # error below that, absolute error beyond it, so a few mislabelled documents do not dominate.
    huber_delta: float = 0.1
    # Ridge penalty on the probe's weights: hundreds of labels against hundreds of pooled features
    # overfit without it. (probe_teacher: oracle.)
    probe_l2: float = 0.05
    # What the probe learns: "judge", the judge's scores on the training documents (closed form, see the
    # module docstring), or "oracle", the labels.
    probe_teacher: str = "judge"
    # The judge-taught probe's ridge penalty per training document of a rubric (in standardised feature
    # units): on the demo's 640 general-rubric documents 0.15, 0.5 and 1.5 (100, 300, 1000) moved the
    # documents leaving at the probe by at most 3.5 points, with either of two judges.
    probe_ridge: float = 0.5
    # The keep aggregate: weight per rubric dimension (missing: 1; e.g. {verbosity: 0} ignores it).
    dimension_weights: dict[str, float] = field(default_factory=dict)
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
        if self.probe_teacher not in ("judge", "oracle"):
            raise ValueError(
                f"HeadTrainConfig.probe_teacher must be judge or oracle, got {self.probe_teacher!r}"
            )
        if self.probe_ridge <= 0:
            raise ValueError(f"HeadTrainConfig.probe_ridge must be > 0, got {self.probe_ridge}")
        unknown = sorted(set(self.dimension_weights) - _ALL_DIMENSIONS)
        if unknown:
            raise ValueError(
                f"dimension_weights: unknown dimension {unknown[0]!r}; known: {sorted(_ALL_DIMENSIONS)}"
            )
        for rubric in RUBRICS.values():
            weights = [self.dimension_weights.get(dim, 1.0) for dim in rubric.dimensions]
            if min(weights) < 0 or sum(weights) <= 0:
                raise ValueError(
                    f"dimension_weights for rubric {rubric.name!r} must be >= 0 with a positive sum, got "
                    f"{dict(zip(rubric.dimensions, weights, strict=True))}"
                )


@dataclass
class RubricPredictions:
    """Held-out dimension scores of one rubric's documents, (N_r, K) each; `rows` index into HeldOut."""

    rows: np.ndarray
    oracle: np.ndarray
    probe: np.ndarray
    judge: np.ndarray


@dataclass
class HeldOut:
    """Predictions on the held-out documents; `index` points into the training inputs.

    `oracle`, `probe` and `judge` are the keep aggregate of each side's dimension scores.
    """

    index: np.ndarray
    sources: list[str]
    rubrics: list[str]
    oracle: np.ndarray
    probe: np.ndarray
    judge: np.ndarray
    dimensions: dict[str, RubricPredictions]


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


@dataclass
class Targets:
    """Each document's rubric (index into `names`) and its normalised scores, padded to K columns."""

    names: list[str]
    rubric_N: torch.Tensor
    scores_NK: torch.Tensor

    @classmethod
    def build(cls, rubrics: Sequence[str], scores: Sequence[Mapping[str, int]]) -> Targets:
        names = sorted(set(rubrics))
        width = max((len(rubric_by_name(name).dimensions) for name in names), default=0)
        scores_NK = torch.zeros(len(rubrics), width)
        for i, (name, row) in enumerate(zip(rubrics, scores, strict=True)):
            normalised = rubric_by_name(name).normalise(row)
            scores_NK[i, : len(normalised)] = torch.tensor(normalised)
        rubric_N = torch.tensor([names.index(name) for name in rubrics], dtype=torch.long)
        return cls(names, rubric_N, scores_NK)

    def loss(self, rows: torch.Tensor, predict: Callable[[str, torch.Tensor], torch.Tensor], delta: float):
        """Mean over `rows` of each document's mean Huber loss across its rubric's dimensions."""
        total = torch.zeros(())
        for index, name in enumerate(self.names):
            mine = rows[self.rubric_N[rows] == index]
            if len(mine):
                predicted_BK = predict(name, mine)
                target_BK = self.scores_NK[mine, : predicted_BK.shape[1]]
                total = (
                    total + F.huber_loss(predicted_BK, target_BK, reduction="none", delta=delta).mean(1).sum()
                )
        return total / len(rows)


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
    loss_of: Callable[[torch.Tensor], torch.Tensor],
    n: int,
    lr: float,
    config: HeadTrainConfig,
    generator: torch.Generator,
    desc: str,
) -> None:
    """Minimise loss_of(rows) over shuffled batches of range(n): AdamW, cosine learning rate."""
    steps = config.epochs * math.ceil(n / config.batch_size)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    head.train()
    for _ in tqdm(range(config.epochs), desc=desc, disable=None):
        for rows in torch.randperm(n, generator=generator).split(config.batch_size):
            loss = loss_of(rows)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
    head.eval()


def _train_probe(
    pooled_ND: torch.Tensor, targets: Targets, config: HeadTrainConfig, generator: torch.Generator
) -> ProbeHead:
    probe = ProbeHead(pooled_ND.shape[1], rubric_outputs(targets.names))
    probe.set_feature_stats(pooled_ND)

    def loss_of(rows: torch.Tensor) -> torch.Tensor:
        fit = targets.loss(
            rows, lambda name, mine: probe.score_pooled(pooled_ND[mine], name), config.huber_delta
        )
        ridge = sum(layer.weight.square().sum() for layer in probe.out.values())
        return fit + config.probe_l2 * ridge

    _fit(probe, loss_of, len(pooled_ND), config.probe_lr, config, generator, "probe")
    return probe


def _train_judge(
    features: BackboneFeatures, targets: Targets, config: HeadTrainConfig, generator: torch.Generator
) -> JudgeHead:
    judge = JudgeHead(features.judge_NTD.shape[2], config.judge, rubric_outputs(targets.names))

    def predict(name: str, rows: torch.Tensor) -> torch.Tensor:
        width = int(features.mask_NT[rows].sum(1).max())  # drop the columns that are padding in every row
        return judge(features.judge_NTD[rows, :width], features.mask_NT[rows, :width], name)

    def loss_of(rows: torch.Tensor) -> torch.Tensor:
        return targets.loss(rows, predict, config.huber_delta)

    _fit(judge, loss_of, len(features.mask_NT), config.judge_lr, config, generator, "judge")
    return judge


@torch.no_grad()
def _judge_targets(judge: JudgeHead, features: BackboneFeatures, targets: Targets) -> Targets:
    """The judge's dimension scores on the documents of `features`, as targets on their rubrics."""
    scores_NK = torch.zeros_like(targets.scores_NK)
    for index, name in enumerate(targets.names):
        for rows in torch.nonzero(targets.rubric_N == index).flatten().split(64):
            width = int(features.mask_NT[rows].sum(1).max())
            scored_BK = judge(features.judge_NTD[rows, :width], features.mask_NT[rows, :width], name)
            scores_NK[rows, : scored_BK.shape[1]] = scored_BK
    return Targets(targets.names, targets.rubric_N, scores_NK)


@torch.no_grad()
def _distil_probe(features: BackboneFeatures, judge_scores: Targets, config: HeadTrainConfig) -> ProbeHead:
    """The probe fitted to the judge's scores: per rubric, ridge regression of their logits on the
    standardised pooled features (with an intercept), the probe's linear map before its sigmoid."""
    pooled_ND = features.pooled_probe_ND.double()
    probe = ProbeHead(pooled_ND.shape[1], rubric_outputs(judge_scores.names))
    probe.set_feature_stats(features.pooled_probe_ND)
    standardised_ND = probe.standardise(pooled_ND)
    for index, name in enumerate(judge_scores.names):
        rows = judge_scores.rubric_N == index
        x_ND = standardised_ND[rows]
        k = probe.out[name].out_features
        y_NK = torch.logit(judge_scores.scores_NK[rows, :k].double(), eps=1e-3)
        x_mean_D, y_mean_K = x_ND.mean(0), y_NK.mean(0)
        x_ND, y_NK = x_ND - x_mean_D, y_NK - y_mean_K
        penalty_DD = config.probe_ridge * len(x_ND) * torch.eye(x_ND.shape[1], dtype=x_ND.dtype)
        weight_DK = torch.linalg.solve(x_ND.T @ x_ND + penalty_DD, x_ND.T @ y_NK)
        probe.out[name].weight.copy_(weight_DK.T)
        probe.out[name].bias.copy_(y_mean_K - x_mean_D @ weight_DK)
    return probe.eval()


def _subset(features: BackboneFeatures, rows: np.ndarray) -> BackboneFeatures:
    index = torch.from_numpy(rows)
    return BackboneFeatures(
        features.pooled_probe_ND[index], features.judge_NTD[index], features.mask_NT[index]
    )


def _subset_targets(targets: Targets, rows: np.ndarray) -> Targets:
    index = torch.from_numpy(rows)
    return Targets(targets.names, targets.rubric_N[index], targets.scores_NK[index])


def train_heads(
    backbone: Backbone,
    texts: Sequence[str],
    rubrics: Sequence[str],
    scores: Sequence[Mapping[str, int]],
    sources: Sequence[str],
    config: HeadTrainConfig,
) -> TrainedHeads:
    """Heads for every rubric in `rubrics`, trained on each text's oracle `scores` on its rubric."""
    if not len(texts) == len(rubrics) == len(scores) == len(sources):
        raise ValueError(
            f"train_heads needs one rubric, score set and source per text, got {len(texts)} texts, "
            f"{len(rubrics)} rubrics, {len(scores)} score sets, {len(sources)} sources"
        )
    targets = Targets.build(rubrics, scores)  # validates every score against its rubric
    train_rows, heldout_rows = split_heldout(sources, config.heldout_fraction, config.seed)
    if len(train_rows) < 2:
        raise ValueError(f"train_heads needs at least 2 training documents, got {len(train_rows)}")

    features = encode(backbone, texts)
    train_features, train_targets = _subset(features, train_rows), _subset_targets(targets, train_rows)
    with torch.random.fork_rng():  # seeds init and dropout without disturbing the caller's RNG
        torch.manual_seed(config.seed)
        generator = torch.Generator().manual_seed(config.seed)
        if config.probe_teacher == "oracle":
            probe = _train_probe(train_features.pooled_probe_ND, train_targets, config, generator)
        judge = _train_judge(train_features, train_targets, config, generator)
    if config.probe_teacher == "judge":
        probe = _distil_probe(train_features, _judge_targets(judge, train_features, train_targets), config)

    heads = QualityHeads(probe=probe, judge=judge, dimension_weights=dict(config.dimension_weights))
    heldout = _predict_heldout(heads, _subset(features, heldout_rows), heldout_rows, targets, sources)
    metrics = heldout_agreement(heldout)
    metrics |= {"n_train": float(len(train_rows)), "n_heldout": float(len(heldout_rows))}
    return TrainedHeads(heads=heads, heldout=heldout, metrics=metrics)


def heldout_agreement(heldout: HeldOut) -> dict[str, float]:
    """Agreement of each head's aggregate with the oracle's, and Spearman per rubric dimension."""
    metrics = {f"probe_{k}": v for k, v in agreement(heldout.probe, heldout.oracle).items()}
    metrics |= {f"judge_{k}": v for k, v in agreement(heldout.judge, heldout.oracle).items()}
    for name, predictions in heldout.dimensions.items():
        for k, dim in enumerate(rubric_by_name(name).dimensions):
            for head in ("probe", "judge"):
                predicted = getattr(predictions, head)[:, k]
                metrics[f"{head}_spearman_{dim}"] = spearman(predicted, predictions.oracle[:, k])
    return metrics


@torch.no_grad()
def _predict_heldout(
    heads: QualityHeads,
    features: BackboneFeatures,
    rows: np.ndarray,
    targets: Targets,
    sources: Sequence[str],
) -> HeldOut:
    n = len(rows)
    rubric_of = [targets.names[int(i)] for i in targets.rubric_N[torch.from_numpy(rows)]] if n else []
    aggregates = {side: np.full(n, np.nan) for side in ("oracle", "probe", "judge")}
    dimensions = {}
    for name in sorted(set(rubric_of)):
        mine = np.flatnonzero(np.asarray(rubric_of) == name)
        index = torch.from_numpy(mine)
        k = len(rubric_by_name(name).dimensions)
        sides = {
            "oracle": targets.scores_NK[torch.from_numpy(rows[mine]), :k],
            "probe": heads.probe.score_pooled(features.pooled_probe_ND[index], name),
            "judge": heads.judge(features.judge_NTD[index], features.mask_NT[index], name),
        }
        arrays = {side: values.numpy().astype(np.float64) for side, values in sides.items()}
        for side, values in arrays.items():
            aggregates[side][mine] = heads.aggregate(name, values)
        dimensions[name] = RubricPredictions(rows=mine, **arrays)
    return HeldOut(
        index=rows,
        sources=[sources[i] for i in rows],
        rubrics=rubric_of,
        dimensions=dimensions,
        **aggregates,
    )


def heldout_keep_f1(heldout: HeldOut, keep_rates: Mapping[str, float]) -> dict[str, float]:
    """F1 of each head's keep decision against the oracle's at each source's keep rate.

    `{head}_f1` pools all sources, `{head}_f1_{source}` is one source's.
    """
    metrics = {}
    for head in ("probe", "judge"):
        for where, f1 in keep_f1(getattr(heldout, head), heldout.oracle, heldout.sources, keep_rates).items():
            metrics[f"{head}_f1" if where == "all" else f"{head}_f1_{where}"] = f1
    return metrics
