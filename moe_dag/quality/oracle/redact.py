"""Keep credentials out of every message an oracle produces.

Error messages and stored raw replies quote what a server sent back, and a misconfigured proxy or a
debugging endpoint may echo the request headers. Those strings reach the Dagster event log, the compute
logs and the lake, so each one passes through `redact` first: the key itself is replaced wherever it
appears, and so is every piece of it of `MIN_PIECE` or more characters (a message cut short may end
inside the key, or a server may echo part of it), the value of any Authorization / api-key style
header or parameter, whatever key it carries (a proxy may add its own), and any user:password in a
URL. Callers redact whole texts before cutting them to length.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "[redacted]"
MIN_PIECE = 4  # shorter pieces of a key are common text and say little about it

# A credential-bearing name, then `: `, `=`, `": "` or similar, then its value up to a quote, a comma, a
# brace, `&` or the end of the line. "Bearer xyz" is taken whole because the value may contain a space
# only after a scheme word.
_HEADER_VALUE = re.compile(
    r"(?i)((?:proxy-)?authorization|x-api-key|api[-_]?key|access[-_]token)"
    r"([\"']?\s*[:=]\s*[\"']?)"
    r"((?:bearer|basic|token)\s+)?[^\s\"',}&]+"
)
_URL_USERINFO = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)[^/\s@]+@")


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """`text` with every secret and credential-looking value replaced by REDACTED."""
    for secret in secrets:
        if secret:
            text = _without_pieces(text.replace(secret, REDACTED), secret)
    text = _HEADER_VALUE.sub(lambda m: f"{m[1]}{m[2]}{REDACTED}", text)
    return _URL_USERINFO.sub(lambda m: f"{m[1]}{REDACTED}@", text)


def _without_pieces(text: str, secret: str) -> str:
    """`text` with every run of characters covered by a `MIN_PIECE`-long piece of `secret` replaced."""
    pieces = {secret[i : i + MIN_PIECE] for i in range(len(secret) - MIN_PIECE + 1)}
    covered = [False] * len(text)
    for start in range(len(text) - MIN_PIECE + 1):
        if text[start : start + MIN_PIECE] in pieces:
            covered[start : start + MIN_PIECE] = [True] * MIN_PIECE
    if not any(covered):
        return text
    kept: list[str] = []
    for index, char in enumerate(text):
        if not covered[index]:
            kept.append(char)
        elif index == 0 or not covered[index - 1]:
            kept.append(REDACTED)
    return "".join(kept)
