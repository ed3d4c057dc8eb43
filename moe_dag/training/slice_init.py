"""Rows of a random normal initialisation drawn without the whole tensor: how a rank initialises only
its own experts and still holds exactly the values a whole build would have given them.

`normal_rows_(out, std, first_row=f, total_rows=T)` fills `out` ([R, ...]) with rows [f, f + R) of what
`nn.init.normal_(whole, std=std)` would draw for a [T, ...] tensor, from the same default generator,
and leaves that generator where the whole draw would have left it, so every tensor initialised after
it gets its usual values too.

On CPU, float32: torch fills a contiguous float32 tensor of 16 or more elements with one uniform draw
(32 bits of the Mersenne Twister) per element, then turns each aligned group of 16 into normals by
Box-Muller; when the size is not a multiple of 16 it draws 16 more uniforms for the last 16 elements.
So a tensor drawn in consecutive pieces whose sizes are multiples of 16, the last of at least 16
elements, holds exactly what one draw over the whole gives. The rows to keep are drawn as normals in
place (pieces that straddle their edges in a scratch buffer), and the rest is skipped by drawing as many
uniforms into a bounded scratch buffer (one draw per element, 2.3 times as fast as the normals), so
memory beyond `out` stays at one piece. `tests/test_local_experts.py` checks the equality.

Elsewhere (CUDA's Philox draws depend on the launch's shape, other dtypes): the whole tensor is drawn
in a temporary and the rows copied out, so the transient cost is one whole tensor, not the model.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import nn

# Elements per piece on CPU: a multiple of 16; 4 MiB of float32 scratch.
PIECE = 1 << 20
_GROUP = 16  # torch's Box-Muller group on CPU


def _pieces(total: int, piece: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) ranges covering [0, total): every one `piece` long but the last, which is at least
    16 long (a shorter remainder joins the range before it)."""
    lo = 0
    while lo < total:
        hi = min(lo + piece, total)
        if total - hi < _GROUP:
            hi = total
        yield lo, hi
        lo = hi


@torch.no_grad()
def normal_rows_(
    out: torch.Tensor, std: float, *, first_row: int, total_rows: int, piece: int = PIECE
) -> torch.Tensor:
    """`out` filled with rows [first_row, first_row + len(out)) of `nn.init.normal_(std=std)` drawn over
    `total_rows` rows of out's row shape; the default generator advanced as by that whole draw."""
    rows = out.shape[0]
    if not 0 <= first_row <= total_rows - rows:
        raise ValueError(f"rows [{first_row}, {first_row + rows}) are not within {total_rows} rows")
    if rows == total_rows:
        return nn.init.normal_(out, std=std)
    per_row = math.prod(out.shape[1:])
    total = total_rows * per_row
    if out.device.type == "meta":
        return out
    if out.device.type != "cpu" or out.dtype != torch.float32 or not out.is_contiguous() or total < _GROUP:
        whole = out.new_empty((total_rows, *out.shape[1:]))
        nn.init.normal_(whole, std=std)
        return out.copy_(whole[first_row : first_row + rows])
    assert piece % _GROUP == 0, "pieces must keep torch's groups of 16 aligned"
    start, stop = first_row * per_row, (first_row + rows) * per_row
    flat, scratch = out.view(-1), torch.empty(min(piece + _GROUP, total), dtype=torch.float32)
    for lo, hi in _pieces(total, piece):
        if start <= lo and hi <= stop:
            nn.init.normal_(flat[lo - start : hi - start], std=std)
        elif hi <= start or stop <= lo:
            # Skipped rows: the same number of generator draws as their normals would take. The last
            # piece may end in torch's redrawn group of 16, which only a normal draw reproduces.
            if hi == total:
                nn.init.normal_(scratch[: hi - lo], std=std)
            else:
                scratch[: hi - lo].uniform_()
        else:  # straddles an edge of the kept rows
            buffer = nn.init.normal_(scratch[: hi - lo], std=std)
            keep_lo, keep_hi = max(lo, start), min(hi, stop)
            flat[keep_lo - start : keep_hi - start] = buffer[keep_lo - lo : keep_hi - lo]
    return out
