"""Keep credentials out of every message an oracle produces.

Error messages and stored raw replies quote what a server sent back, and a misconfigured proxy or a
debugging endpoint may echo the request headers. Those strings reach the Dagster event log, the compute
logs and the lake, so each one passes through `redact` first: the key itself is replaced wherever it
appears, and so is the value of any Authorization / api-key style header or parameter, whatever key
it carries (a proxy may add its own), and any user:password in a URL.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "[redacted]"

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
            text = text.replace(secret, REDACTED)
    text = _HEADER_VALUE.sub(lambda m: f"{m[1]}{m[2]}{REDACTED}", text)
    return _URL_USERINFO.sub(lambda m: f"{m[1]}{REDACTED}@", text)
