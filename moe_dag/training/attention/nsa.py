"""Native sparse attention (NSA, arXiv:2502.11089): three branches mixed by a learned gate.

For query t (head h of key/value group g), with blocks of `block_size` tokens:
1. compressed: attend to one key/value per complete past block, each made by a learned linear map of
   the block's keys (values) plus an intra-block position embedding (the paper's phi);
2. selected: attend to every token (up to t) of the `num_selected` blocks with the highest compressed
   attention probability summed over the heads of group g, the first block and t's own block always
   among them (the paper's eq. 9-12 with equal compression and selection blocks);
3. sliding window: attend to the last `window` tokens;
    o_t = sigmoid(gate_cmp) o_cmp + sigmoid(gate_slc) o_slc + sigmoid(gate_win) o_win, gates per head.

Training here computes each branch as dense masked attention (the selection as a boolean mask), the
same function a sparse kernel computes with fewer FLOPs; `reference` loops over queries.

Shape legend: B batch, S sequence, D model width, H query heads, G key/value heads, C channels,
N complete blocks, P blocks including a partial last one, L block size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from moe_dag.training.attention.gqa import sliding_window_mask
from moe_dag.training.attention.registry import AttentionSpec, causal_context, register
from moe_dag.training.attention.rotary import Rotary
from moe_dag.training.config import ModelConfig


class NativeSparseAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        D, H, G, C, L = (
            config.d_model,
            config.n_heads,
            config.n_kv_heads,
            config.head_dim,
            config.nsa.block_size,
        )
        self.n_heads, self.n_kv_heads, self.head_dim = H, G, C
        self.block_size, self.num_selected, self.window = L, config.nsa.num_selected, config.nsa.window
        self.wq = nn.Linear(D, H * C, bias=False)
        self.wk = nn.Linear(D, G * C, bias=False)
        self.wv = nn.Linear(D, G * C, bias=False)
        self.wo = nn.Linear(H * C, D, bias=False)
        self.gate = nn.Linear(D, 3 * H, bias=False)
        self.k_compress = nn.Linear(L * C, C, bias=False)
        self.v_compress = nn.Linear(L * C, C, bias=False)
        self.k_block_position_LC = nn.Parameter(torch.empty(L, C))
        self.v_block_position_LC = nn.Parameter(torch.empty(L, C))

    def init_weights(self, std: float, residual_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv, self.gate):
            nn.init.normal_(linear.weight, std=std)
        nn.init.normal_(self.wo.weight, std=residual_std)
        # A compression map that starts as the block mean, so compressed keys begin as averages.
        for linear in (self.k_compress, self.v_compress):
            eye_CC = torch.eye(self.head_dim, device=linear.weight.device)
            linear.weight.copy_(eye_CC.repeat(1, self.block_size) / self.block_size)
        nn.init.normal_(self.k_block_position_LC, std=std)
        nn.init.normal_(self.v_block_position_LC, std=std)

    def _project(self, x_BSD: torch.Tensor, rotary: Rotary) -> tuple[torch.Tensor, ...]:
        B, S, _ = x_BSD.shape
        q_BHSC = self.wq(x_BSD).view(B, S, self.n_heads, -1).transpose(1, 2)
        k_BGSC = self.wk(x_BSD).view(B, S, self.n_kv_heads, -1).transpose(1, 2)
        v_BGSC = self.wv(x_BSD).view(B, S, self.n_kv_heads, -1).transpose(1, 2)
        gates_BSH3 = torch.sigmoid(self.gate(x_BSD)).view(B, S, self.n_heads, 3)
        return rotary(q_BHSC), rotary(k_BGSC), v_BGSC, gates_BSH3

    def _compress(self, x_BGSC: torch.Tensor, linear: nn.Linear, position_LC: torch.Tensor) -> torch.Tensor:
        B, G, S, C = x_BGSC.shape
        N, L = S // self.block_size, self.block_size
        blocks_BGNLC = x_BGSC[:, :, : N * L].reshape(B, G, N, L, C) + position_LC
        return linear(blocks_BGNLC.flatten(-2))  # [B, G, N, C]

    def _output(self, y_BHSC: torch.Tensor) -> torch.Tensor:
        B, _, S, _ = y_BHSC.shape
        return self.wo(y_BHSC.transpose(1, 2).reshape(B, S, -1))

    def forward(self, x_BSD: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        B, S, _ = x_BSD.shape
        H, G, L = self.n_heads, self.n_kv_heads, self.block_size
        group = H // G
        q_BHSC, k_BGSC, v_BGSC, gates_BSH3 = self._project(x_BSD, rotary)
        k_cmp_BGNC = self._compress(k_BGSC, self.k_compress, self.k_block_position_LC)
        v_cmp_BGNC = self._compress(v_BGSC, self.v_compress, self.v_block_position_LC)
        N, P = k_cmp_BGNC.shape[2], math.ceil(S / L)
        t_S = torch.arange(S, device=x_BSD.device)

        # 1. compressed branch: block n is visible from query t once complete, (n + 1) L - 1 <= t.
        visible_SN = (torch.arange(N, device=x_BSD.device) + 1) * L - 1 <= t_S[:, None]
        scores_BHSN = q_BHSC @ k_cmp_BGNC.repeat_interleave(group, dim=1).transpose(-2, -1)
        scores_BHSN = (scores_BHSN / math.sqrt(self.head_dim)).masked_fill(~visible_SN, float("-inf"))
        p_cmp_BHSN = scores_BHSN.softmax(dim=-1).nan_to_num(0.0)  # rows with no complete block: 0
        o_cmp_BHSC = p_cmp_BHSN @ v_cmp_BGNC.repeat_interleave(group, dim=1)

        # 2. selected branch: top blocks by the group's summed compressed probability.
        with torch.no_grad():
            importance_BGSP = F.pad(p_cmp_BHSN.view(B, G, group, S, N).sum(dim=2), (0, P - N))
            block_S = t_S // L
            forced_SP = (torch.arange(P, device=x_BSD.device) == 0) | (
                torch.arange(P, device=x_BSD.device) == block_S[:, None]
            )
            importance_BGSP = importance_BGSP.masked_fill(forced_SP, float("inf"))
            chosen_BGSK = importance_BGSP.topk(min(self.num_selected, P), dim=-1).indices
            selected_BGSP = torch.zeros_like(importance_BGSP, dtype=torch.bool).scatter_(
                -1, chosen_BGSK, True
            )
            causal_SS = t_S[None, :] <= t_S[:, None]
            allowed_BGSS = selected_BGSP[..., block_S] & causal_SS
        o_slc_BHSC = F.scaled_dot_product_attention(
            q_BHSC,
            k_BGSC,
            v_BGSC,
            attn_mask=allowed_BGSS.repeat_interleave(group, dim=1),
            enable_gqa=group > 1,
        )

        # 3. sliding-window branch.
        window_SS = sliding_window_mask(S, self.window, x_BSD.device)
        o_win_BHSC = F.scaled_dot_product_attention(
            q_BHSC, k_BGSC, v_BGSC, attn_mask=window_SS, enable_gqa=group > 1
        )
        gates_3BHS1 = gates_BSH3.permute(3, 0, 2, 1).unsqueeze(-1)
        mixed_BHSC = gates_3BHS1[0] * o_cmp_BHSC + gates_3BHS1[1] * o_slc_BHSC + gates_3BHS1[2] * o_win_BHSC
        return self._output(mixed_BHSC)

    def reference(self, x_BSD: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        """Query by query: the three branches as the paper writes them."""
        B, S, _ = x_BSD.shape
        H, L = self.n_heads, self.block_size
        group = H // self.n_kv_heads
        q_BHSC, k_BGSC, v_BGSC, gates_BSH3 = self._project(x_BSD, rotary)
        k_cmp_BGNC = self._compress(k_BGSC, self.k_compress, self.k_block_position_LC)
        v_cmp_BGNC = self._compress(v_BGSC, self.v_compress, self.v_block_position_LC)
        scale = 1 / math.sqrt(self.head_dim)

        def attend(q_C: torch.Tensor, k_TC: torch.Tensor, v_TC: torch.Tensor) -> torch.Tensor:
            if k_TC.shape[0] == 0:
                return torch.zeros_like(q_C)
            return ((k_TC @ q_C) * scale).softmax(dim=0) @ v_TC

        out_BHSC = torch.zeros_like(q_BHSC)
        for b in range(B):
            for t in range(S):
                complete = (t + 1) // L
                probs = {}
                for h in range(H):
                    g = h // group
                    k_cmp_TC = k_cmp_BGNC[b, g, :complete]
                    probs[h] = ((k_cmp_TC @ q_BHSC[b, h, t]) * scale).softmax(dim=0)
                for h in range(H):
                    g = h // group
                    q_C = q_BHSC[b, h, t]
                    o_cmp = attend(q_C, k_cmp_BGNC[b, g, :complete], v_cmp_BGNC[b, g, :complete])
                    importance = sum(probs[i] for i in range(g * group, (g + 1) * group))
                    ranked = [int(n) for n in torch.argsort(importance, descending=True, stable=True)]
                    chosen = _first_selected(
                        blocks_forced=(0, t // L), ranked=ranked, count=self.num_selected
                    )
                    keys = [s for n in chosen for s in range(n * L, min((n + 1) * L, t + 1))]
                    o_slc = attend(q_C, k_BGSC[b, g, keys], v_BGSC[b, g, keys])
                    start = max(0, t - self.window + 1)
                    o_win = attend(q_C, k_BGSC[b, g, start : t + 1], v_BGSC[b, g, start : t + 1])
                    gate = gates_BSH3[b, t, h]
                    out_BHSC[b, h, t] = gate[0] * o_cmp + gate[1] * o_slc + gate[2] * o_win
        return self._output(out_BHSC)


def _first_selected(blocks_forced: tuple[int, int], ranked: list[int], count: int) -> list[int]:
    """The forced blocks, then the best-ranked others, `count` blocks at most."""
    chosen = list(dict.fromkeys(blocks_forced))
    chosen += [n for n in ranked if n not in chosen]
    return chosen[:count]


def _parameters(config: ModelConfig) -> int:
    D, H, G, C, L = config.d_model, config.n_heads, config.n_kv_heads, config.head_dim, config.nsa.block_size
    return 2 * D * H * C + 2 * D * G * C + D * 3 * H + 2 * (L * C * C + L * C)


def _mixing_flops(config: ModelConfig, seq_len: int) -> float:
    nsa = config.nsa
    keys = causal_context(seq_len) / nsa.block_size + nsa.num_selected * nsa.block_size
    keys += causal_context(seq_len, nsa.window)
    return 4 * config.n_heads * config.head_dim * keys


register(
    "nsa",
    AttentionSpec(
        build=NativeSparseAttention,
        num_parameters=_parameters,
        mixing_flops=_mixing_flops,
        rotary_dim=lambda c: c.head_dim,
    ),
)
