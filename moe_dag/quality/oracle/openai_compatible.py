"""An oracle that asks an OpenAI-compatible chat-completions server (vLLM serving gpt-oss-120b).

Requests run as asyncio tasks on one event loop in a background thread, at most `max_concurrency` in
flight over one connection pool: enough to keep the server's continuous batching full without queueing
a whole sample behind its admission limit. Results go to the caller as they arrive, so it can commit
labels while the rest are still being generated. Each reply is constrained by the rubric's JSON schema
(`response_format`), then validated again here, because a server without structured-output support
ignores the field silently.

`timeout_s` is a deadline for the whole request, reply body included: a server that drips its answer
a byte at a time cannot hold a request past it (a per-read timeout would let it).

What happens to a request:
- 429, 408, 409, 5xx, deadlines and connection errors: back off exponentially with jitter, honouring a
  Retry-After header (seconds or an HTTP date, clamped to [0, max_backoff_s]; anything else ignored);
- a reply that is not the JSON asked for (a body of any shape or depth, or over `max_reply_bytes`),
  scores out of range, a refusal: retried with a new seed, a
  temperature of at least `retry_temperature` and a reminder of the schema, never as the same request;
- any other 4xx (a document over the context length, say): that document fails at once;
- 401, 403, 404: nothing can succeed (key, URL or model name is wrong), so OracleError stops the run.
A document still without a valid label after `max_retries` retries is reported as a failed LabelResult
with its raw replies; the run goes on. The key is read from the environment at call time (a rotated key
needs no restart) and redacted from every message and stored reply.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import os
import queue
import random
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from moe_dag.quality.oracle.base import (
    LabelRequest,
    LabelResult,
    OracleError,
    make_label,
    sampling_for_attempt,
)
from moe_dag.quality.oracle.redact import redact
from moe_dag.quality.oracle.rubrics import Rubric, rubric_by_name

_RETRY_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))
_FATAL_STATUS = frozenset({401, 403, 404})
# How long the background loop waits before looking again whether the caller has stopped listening.
_POLL_S = 0.2


@dataclass(kw_only=True)
class OpenAICompatibleConfig:
    base_url: str = "http://localhost:8000/v1"
    model: str = "openai/gpt-oss-120b"
    # Name of the variable holding the key. A vLLM server started without --api-key accepts requests
    # with no key, so an unset variable sends none.
    api_key_env: str = "OPENAI_API_KEY"
    max_concurrency: int = 16
    timeout_s: float = 120.0  # per HTTP request, start to last byte
    max_retries: int = 4
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    temperature: float = 0.0
    retry_temperature: float = 0.7
    seed: int = 0
    # gpt-oss reasons before it answers; the budget covers the reasoning and the small JSON reply.
    max_tokens: int = 2048
    # Documents are cut to this many characters before prompting, to bound cost and context length.
    max_document_chars: int = 12_000
    # A reply body past this many bytes is a bad reply, read no further: a 2048-token answer is a few
    # kilobytes, and a server (or something in between) that sends more would otherwise fill memory.
    max_reply_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_reply_bytes < 1:
            raise ValueError(f"max_reply_bytes must be >= 1, got {self.max_reply_bytes}")
        if self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(
                f"backoff_s and max_backoff_s must be >= 0, got {self.backoff_s}, {self.max_backoff_s}"
            )


def retry_after_seconds(value: str | None, cap: float) -> float | None:
    """Seconds to wait from a Retry-After header, clamped to [0, cap]; None when absent or unparsable."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), cap)


def _reply_content(text: str, key: str | None) -> str:
    """The assistant message of a 200 reply's body `text`; ValueError for a reply of any other shape."""
    body = redact(text, [key])
    try:
        choice = json.loads(text)["choices"][0]
        message = choice["message"]
    except RecursionError as err:
        raise ValueError(f"malformed response body (JSON nested too deeply): {body[:200]!r}") from err
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise ValueError(f"malformed response body ({type(err).__name__}): {body[:200]!r}") from err
    if not isinstance(choice, dict) or not isinstance(message, dict):
        raise ValueError(f"malformed response body (no message object): {body[:200]!r}")
    if message.get("refusal"):
        raise ValueError(f"the model refused: {redact(str(message['refusal']), [key])[:200]!r}")
    content = message.get("content")
    if not content:
        raise ValueError(f"empty reply (finish_reason {choice.get('finish_reason')!r})")
    if not isinstance(content, str):
        raise ValueError(f"the message content is a JSON {type(content).__name__}, not text: {body[:200]!r}")
    return content


async def _read_at_most(response: httpx.Response, limit: int) -> bytes:
    """The first `limit` bytes of a streamed body; the rest is never read."""
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk[: limit - len(data)]
        if len(data) >= limit:
            break
    return bytes(data)


class OpenAICompatibleOracle:
    def __init__(self, config: OpenAICompatibleConfig):
        self.config = config
        self.model_name = config.model

    def label(self, requests: Sequence[LabelRequest]) -> Iterator[LabelResult]:
        results: queue.Queue[LabelResult | BaseException] = queue.Queue()
        stop = threading.Event()

        def produce() -> None:
            try:
                asyncio.run(self._produce(requests, results, stop))
            except BaseException as err:  # handed to the caller's thread, which raises it
                results.put(err)

        worker = threading.Thread(target=produce, name="oracle-http", daemon=True)
        worker.start()
        try:
            for _ in range(len(requests)):
                item = results.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()  # the caller stopped listening (or an error): cancel what is in flight
            worker.join()

    async def _produce(
        self, requests: Sequence[LabelRequest], results: queue.Queue, stop: threading.Event
    ) -> None:
        key = os.environ.get(self.config.api_key_env)
        limits = httpx.Limits(max_connections=self.config.max_concurrency)
        async with httpx.AsyncClient(
            base_url=self.config.base_url,
            headers={"Authorization": f"Bearer {key}"} if key else {},
            timeout=self.config.timeout_s,  # per read; the deadline in _label_one bounds the whole
            limits=limits,
        ) as client:
            waiting = iter(requests)
            pending: set[asyncio.Task[LabelResult]] = set()
            try:
                while not stop.is_set():
                    while len(pending) < self.config.max_concurrency:
                        request = next(waiting, None)
                        if request is None:
                            break
                        pending.add(asyncio.create_task(self._label_one(client, request, key)))
                    if not pending:
                        return
                    done, pending = await asyncio.wait(
                        pending, timeout=_POLL_S, return_when=asyncio.FIRST_COMPLETED
                    )
                    for task in done:
                        results.put(task.result())
            finally:
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)

    def _payload(self, rubric: Rubric, text: str, attempt: int, rejected: str | None) -> dict:
        config = self.config
        return {
            "model": config.model,
            "messages": rubric.prompt(text, rejected),
            "max_tokens": config.max_tokens,
            **sampling_for_attempt(config.temperature, config.retry_temperature, config.seed, attempt),
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": f"{rubric.name}_scores",
                    "schema": rubric.json_schema(),
                    "strict": True,
                },
            },
        }

    async def _label_one(
        self, client: httpx.AsyncClient, request: LabelRequest, key: str | None
    ) -> LabelResult:
        config = self.config
        rubric = rubric_by_name(request.rubric)
        text = request.text[: config.max_document_chars]
        replies: list[str] = []
        rejected: str | None = None  # why the last reply was refused, told to the next attempt
        error, wait = "no attempt made", None

        def failed(message: str, attempts: int) -> LabelResult:
            return LabelResult(
                request,
                error=redact(message, [key]),
                replies=tuple(redact(reply, [key]) for reply in replies),
                attempts=attempts,
            )

        for attempt in range(config.max_retries + 1):
            if attempt:
                await asyncio.sleep(wait if wait is not None else self._backoff(attempt))
            wait = None
            try:
                async with asyncio.timeout(config.timeout_s):
                    payload = self._payload(rubric, text, attempt, rejected)
                    async with client.stream("POST", "/chat/completions", json=payload) as response:
                        data = await _read_at_most(response, config.max_reply_bytes + 1)
            except TimeoutError:
                error = f"no complete answer within the {config.timeout_s:g}s deadline"
                continue
            except httpx.TransportError as err:
                error = f"{type(err).__name__}: {err}"
                continue
            reply = data[: config.max_reply_bytes].decode(response.encoding or "utf-8", errors="replace")
            # Redacted whole, then cut: a cut first may end inside the key, leaving a piece of it.
            status, body = response.status_code, redact(reply, [key])[:2000]
            if status in _FATAL_STATUS:
                raise OracleError(
                    redact(
                        f"HTTP {status} from {config.base_url} for document {request.id!r}: {body[:500]} "
                        f"(check oracle.openai.base_url, model and the key in ${config.api_key_env})",
                        [key],
                    )
                )
            if status in _RETRY_STATUS:
                error = f"HTTP {status}: {body[:200]}"
                wait = retry_after_seconds(response.headers.get("retry-after"), config.max_backoff_s)
                continue
            if response.is_error:  # this document's request is refused as it stands: retrying won't help
                replies.append(body)
                return failed(f"HTTP {status}: {body[:500]}", attempt + 1)
            if len(data) > config.max_reply_bytes:
                replies.append(body)
                error = (
                    f"reply body over the {config.max_reply_bytes}-byte limit (oracle.openai.max_reply_bytes)"
                )
                continue
            try:
                scores = rubric.parse_reply(_reply_content(reply, key))
                return LabelResult(
                    request, make_label(request, scores, self.model_name), attempts=attempt + 1
                )
            except ValueError as err:
                replies.append(body)
                error = rejected = redact(str(err), [key])
        return failed(
            f"no valid label after {config.max_retries + 1} attempts; last error: {error}",
            config.max_retries + 1,
        )

    def _backoff(self, attempt: int) -> float:
        """Exponential backoff with jitter, so documents that failed together do not retry together."""
        delay = min(self.config.backoff_s * 2 ** (attempt - 1), self.config.max_backoff_s)
        return delay * random.uniform(0.5, 1.0)
