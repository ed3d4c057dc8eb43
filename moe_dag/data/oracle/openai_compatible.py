"""An oracle that asks an OpenAI-compatible chat-completions server (vLLM serving gpt-oss-120b).

Requests run on a thread pool of `max_concurrency` workers sharing one HTTP connection pool, so at most
that many are in flight: enough to keep the server's continuous batching full without queueing a whole
sample behind its admission limit. Each reply is constrained by the rubric's JSON schema
(`response_format`), then validated again here, because a server without structured-output support
ignores the field silently.

Retries: 429, 5xx, timeouts and connection errors back off exponentially (honouring Retry-After); a
reply that does not validate is asked again, since sampling may give a valid one. A document that never
gets a valid reply within `max_retries` retries raises OracleError naming it: a silently missing label
would bias the sample the heads are trained on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from tqdm import tqdm

from moe_dag.data.oracle.base import LabelRequest, OracleError, OracleLabel, make_label
from moe_dag.data.oracle.rubrics import rubric_by_name

_RETRY_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))


@dataclass(kw_only=True)
class OpenAICompatibleConfig:
    base_url: str = "http://localhost:8000/v1"
    model: str = "openai/gpt-oss-120b"
    # Name of the variable holding the key, read at call time so a rotated key needs no restart. A vLLM
    # server started without --api-key accepts requests with no key, so an unset variable sends none.
    api_key_env: str = "OPENAI_API_KEY"
    max_concurrency: int = 16
    timeout_s: float = 120.0
    max_retries: int = 4
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    temperature: float = 0.0
    # gpt-oss reasons before it answers; the budget covers the reasoning and the small JSON reply.
    max_tokens: int = 2048
    # Documents are cut to this many characters before prompting, to bound cost and context length.
    max_document_chars: int = 12_000

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")


class OpenAICompatibleOracle:
    def __init__(self, config: OpenAICompatibleConfig, transport: httpx.BaseTransport | None = None):
        """`transport` replaces the network (httpx.MockTransport in tests)."""
        self.config = config
        self.model_name = config.model
        self._transport = transport

    def label(self, requests: Sequence[LabelRequest]) -> list[OracleLabel]:
        limits = httpx.Limits(max_connections=self.config.max_concurrency)
        with (
            httpx.Client(
                base_url=self.config.base_url,
                timeout=self.config.timeout_s,
                limits=limits,
                transport=self._transport,
            ) as client,
            ThreadPoolExecutor(max_workers=self.config.max_concurrency) as pool,
        ):
            futures = [pool.submit(self._label_one, client, request) for request in requests]
            try:
                return [f.result() for f in tqdm(futures, desc="oracle", disable=None)]
            except BaseException:
                # One document failed for good: do not wait for (and pay for) the rest of the sample.
                for future in futures:
                    future.cancel()
                raise

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.config.api_key_env)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _payload(self, request: LabelRequest) -> dict:
        rubric = rubric_by_name(request.rubric)
        return {
            "model": self.config.model,
            "messages": rubric.prompt(request.text[: self.config.max_document_chars]),
            "temperature": self.config.temperature,
            "max_tokens": self.config.max_tokens,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": f"{rubric.name}_scores",
                    "schema": rubric.json_schema(),
                    "strict": True,
                },
            },
        }

    def _label_one(self, client: httpx.Client, request: LabelRequest) -> OracleLabel:
        payload = self._payload(request)
        last_error = "no attempt made"
        retry_after: str | None = None
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                time.sleep(self._backoff(attempt, retry_after))
                retry_after = None
            try:
                response = client.post("/chat/completions", json=payload, headers=self._headers())
            except httpx.TransportError as err:  # timeouts included
                last_error = f"{type(err).__name__}: {err}"
                continue
            if response.status_code in _RETRY_STATUS:
                last_error = f"HTTP {response.status_code}: {response.text[:200]}"
                retry_after = response.headers.get("retry-after")
                continue
            if response.is_error:
                raise OracleError(
                    f"document {request.id!r}: HTTP {response.status_code} from {self.config.base_url}: "
                    f"{response.text[:500]}"
                )
            try:
                content = response.json()["choices"][0]["message"]["content"] or ""
                return make_label(
                    request, rubric_by_name(request.rubric).parse_reply(content), self.model_name
                )
            except (ValueError, KeyError, IndexError, TypeError) as err:
                last_error = f"invalid reply: {err}"
        raise OracleError(
            f"document {request.id!r}: no valid label after {self.config.max_retries + 1} attempts; "
            f"last error: {last_error}"
        )

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        if retry_after is not None:
            try:
                return min(float(retry_after), self.config.max_backoff_s)
            except ValueError:
                pass  # an HTTP-date Retry-After: fall back to our own schedule
        return min(self.config.backoff_s * 2 ** (attempt - 1), self.config.max_backoff_s)
