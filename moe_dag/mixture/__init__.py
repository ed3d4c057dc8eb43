"""The tokenised training mixture: held-out split, token shards, the deficit-rule sampler, and the build
that packs them."""

from moe_dag.mixture.build import MixtureConfig, build_mixture, pack_mixture
from moe_dag.mixture.heldout import split_heldout, training_documents
from moe_dag.mixture.sampler import MixtureSampler
from moe_dag.mixture.token_shards import SourceTokens, TokenShard, write_token_shard

__all__ = [
    "MixtureConfig",
    "MixtureSampler",
    "SourceTokens",
    "TokenShard",
    "build_mixture",
    "pack_mixture",
    "split_heldout",
    "training_documents",
    "write_token_shard",
]
