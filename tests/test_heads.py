"""Backbone layer ranges, the two heads, their training, threshold calibration and storage."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import GptOssConfig, GptOssModel, LlamaConfig, LlamaModel

from moe_dag.data.heads import (
    Backbone,
    BackboneConfig,
    HeadTrainConfig,
    JudgeHead,
    JudgeHeadConfig,
    ProbeHead,
    QualityHeads,
    Thresholds,
    calibrate_thresholds,
    heads_version,
    load_backbone,
    load_heads,
    save_heads,
    train_heads,
)
from moe_dag.data.heads.store import WEIGHTS_FILE

TEXTS = [
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The court ruled that the contract was void because one party had been misled.",
    "x",
    "A prime number has exactly two divisors: one and itself, such as 2, 3, 5 and 7.",
]


@pytest.fixture(scope="module")
def minilm() -> Backbone:
    return load_backbone(BackboneConfig(max_tokens=32, batch_size=8))


@pytest.fixture
def one_thread():
    """Tiny tensors gain nothing from intra-op threads, which on a busy CI machine cost up to 10x."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _assert_matches_hidden_states(backbone: Backbone, layers: list[int]):
    ids, mask = backbone.tokenize(TEXTS)
    with torch.no_grad():
        reference = backbone.model(
            input_ids=ids, attention_mask=mask, output_hidden_states=True
        ).hidden_states
    real = mask.bool()  # padded positions hold unspecified values in both paths
    hidden, at = backbone.embed(ids), 0
    torch.testing.assert_close(hidden[real], reference[0][real])
    for layer in layers:
        hidden, at = backbone.run_layers(hidden, mask, at, layer), layer
        torch.testing.assert_close(hidden[real], reference[layer][real], rtol=1e-5, atol=1e-5)


def test_minilm_layer_ranges_match_the_models_own_hidden_states(minilm):
    assert minilm.kind == "encoder" and minilm.num_layers == 6
    _assert_matches_hidden_states(minilm, [1, 3, 6])


def test_decoder_layer_ranges_match_the_models_own_hidden_states(minilm):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=minilm.tokenizer.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    llama = Backbone(LlamaModel(config), minilm.tokenizer, BackboneConfig(probe_layer=2, judge_layer=4))
    assert llama.kind == "decoder"
    _assert_matches_hidden_states(llama, [2, 3, 4])


def test_sliding_window_decoder_layers_match(minilm):
    # gpt-oss alternates sliding-window and full attention; a window of 4 tokens makes the masks differ.
    torch.manual_seed(0)
    config = GptOssConfig(
        vocab_size=minilm.tokenizer.vocab_size,
        hidden_size=32,
        intermediate_size=32,
        head_dim=8,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"] * 2,
    )
    gpt_oss = Backbone(GptOssModel(config), minilm.tokenizer, BackboneConfig(probe_layer=1, judge_layer=4))
    _assert_matches_hidden_states(gpt_oss, [1, 2, 4])


def test_backbone_rejects_bad_layers(minilm):
    with pytest.raises(ValueError, match="probe_layer=6, judge_layer=6"):
        Backbone(minilm.model, minilm.tokenizer, BackboneConfig(probe_layer=6, judge_layer=6))
    with pytest.raises(ValueError, match="judge_layer=7"):
        Backbone(minilm.model, minilm.tokenizer, BackboneConfig(probe_layer=3, judge_layer=7))


def test_heads_ignore_padding_and_stay_in_unit_range():
    torch.manual_seed(0)
    probe, judge = ProbeHead(16), JudgeHead(16, JudgeHeadConfig(d_model=16, n_heads=2)).eval()
    hidden = torch.randn(3, 5, 16) * 10
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    for head in (probe, judge):
        scores = head(hidden, mask)
        assert scores.shape == (3,) and bool(((scores > 0) & (scores < 1)).all())
        garbage = hidden.clone()
        garbage[mask == 0] = 1e3  # whatever sits under padding must not matter
        torch.testing.assert_close(head(garbage, mask), scores)
        torch.testing.assert_close(head(hidden[:1, :3], mask[:1, :3]), scores[:1])


def _labelled_corpus() -> tuple[list[str], list[float], list[str]]:
    """Clean sentences labelled high, symbol soup labelled low: a signal any working head must find."""
    words = ["river", "stone", "light", "garden", "market", "science", "music", "window", "history", "winter"]
    texts, qualities, sources = [], [], []
    for i in range(40):
        source = "web" if i % 2 else "books"
        if i % 4 < 2:
            texts.append(
                f"The {words[i % 10]} near the {words[(i * 3) % 10]} was described in an old report."
            )
            qualities.append(0.9)
        else:
            texts.append(" ".join("#$%&*@!?"[(i + k) % 8] * 3 for k in range(8)))
            qualities.append(0.1)
        sources.append(source)
    return texts, qualities, sources


def test_train_heads_learns_the_signal_deterministically(minilm, one_thread):
    texts, qualities, sources = _labelled_corpus()
    config = HeadTrainConfig(epochs=8, batch_size=8, seed=3, judge=JudgeHeadConfig(d_model=16, n_heads=2))
    first = train_heads(minilm, texts, qualities, sources, config)
    held = first.heldout
    assert len(held.index) == 8 and sorted(set(held.sources)) == ["books", "web"]
    assert first.metrics["n_train"] == 32
    assert first.metrics["probe_mae"] < 0.2 and first.metrics["judge_mae"] < 0.3
    assert first.metrics["probe_spearman"] > 0.5 and first.metrics["judge_spearman"] > 0.5
    second = train_heads(minilm, texts, qualities, sources, config)
    np.testing.assert_array_equal(second.heldout.index, held.index)
    np.testing.assert_allclose(second.heldout.judge, held.judge, rtol=1e-6)
    assert heads_version(second.heads, minilm.config) == heads_version(first.heads, minilm.config)
    with pytest.raises(ValueError, match="one quality and source per text"):
        train_heads(minilm, texts, qualities[:-1], sources, config)


def test_thresholds_hit_keep_rates_and_exit_only_judge_drops():
    rng = np.random.default_rng(0)
    judge = rng.uniform(size=400)
    probe = judge + rng.normal(scale=0.05, size=400)
    sources = ["web"] * 300 + ["books"] * 90 + ["tiny"] * 10
    found = calibrate_thresholds(probe, judge, sources, {"web": 0.4, "books": 0.7, "tiny": 0.5})
    for source, rate in (("web", 0.4), ("books", 0.7)):
        mine = np.asarray(sources) == source
        t = found[source]
        assert t.basis == "source" and t.n_heldout == mine.sum()
        assert abs(np.mean(judge[mine] >= t.tau_keep) - rate) <= 1 / mine.sum()
        exited = probe[mine] < t.tau_drop
        assert 0 < exited.mean() <= 1 - rate
        assert np.mean(judge[mine][exited] < t.tau_keep) >= 0.95
        assert t.early_exit_rate == pytest.approx(exited.mean())
    assert found["tiny"].basis == "pooled" and found["tiny"].n_heldout == 400
    # A probe unrelated to the judge cannot pick out drops with 95% precision: no early exit.
    shuffled = calibrate_thresholds(rng.permutation(probe), judge, sources, {"web": 0.5})
    assert shuffled["web"].tau_drop == 0.0 and shuffled["web"].early_exit_rate == 0.0
    with pytest.raises(ValueError, match="source 'web' must be in"):
        calibrate_thresholds(probe, judge, sources, {"web": 1.5})


def test_store_round_trip_and_version(tmp_path, minilm):
    torch.manual_seed(0)
    heads = QualityHeads(ProbeHead(384), JudgeHead(384, JudgeHeadConfig(d_model=16, n_heads=2))).eval()
    thresholds = {"web": Thresholds(tau_drop=0.2, tau_keep=0.6, n_heldout=50, early_exit_rate=0.1)}
    version = save_heads(tmp_path, heads, thresholds, minilm.config, metrics={"judge_mae": 0.1})
    stored = load_heads(tmp_path)
    assert stored.version == version and stored.thresholds == thresholds
    assert stored.backbone_config == minilm.config and stored.metrics == {"judge_mae": 0.1}
    hidden, mask = torch.randn(2, 4, 384), torch.ones(2, 4, dtype=torch.long)
    torch.testing.assert_close(stored.heads.judge(hidden, mask), heads.judge(hidden, mask), rtol=0, atol=0)
    moved = BackboneConfig(**{**minilm.config.__dict__, "device": "cuda", "batch_size": 1})
    assert heads_version(heads, moved) == version  # where heads run does not change what they compute
    with torch.no_grad():
        heads.probe.linear.bias += 1e-3
    assert heads_version(heads, minilm.config) != version
    save_heads(tmp_path / "other", heads, thresholds, minilm.config)
    (tmp_path / WEIGHTS_FILE).write_bytes((tmp_path / "other" / WEIGHTS_FILE).read_bytes())
    with pytest.raises(ValueError, match="hashes to version"):
        load_heads(tmp_path)
