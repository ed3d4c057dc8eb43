"""Token mixing, chosen per layer by `ModelConfig.attention_pattern` from a registry of kinds:

| kind | module                                | reference it is tested against                  |
| ---- | ------------------------------------- | ----------------------------------------------- |
| mha  | gqa.GroupedQueryAttention (H kv heads) | explicit masked softmax                         |
| gqa  | gqa.GroupedQueryAttention              | explicit masked softmax, heads repeated          |
| swa  | gqa.GroupedQueryAttention (window)     | explicit masked softmax, window mask             |
| mla  | mla.MultiHeadLatentAttention           | attention in the latent space (weight absorption) |
| nsa  | nsa.NativeSparseAttention              | query-by-query loops over the three branches      |
| kda  | kda.KimiDeltaAttention (chunked)       | the token-by-token recurrence                     |

A new kind is one module that calls `registry.register` and one import line here.
"""

from moe_dag.training.attention import gqa, kda, mla, nsa  # noqa: F401  (each registers its kinds)
from moe_dag.training.attention.registry import ATTENTION, spec_for
from moe_dag.training.attention.rotary import Rotary

__all__ = ["ATTENTION", "Rotary", "spec_for"]
