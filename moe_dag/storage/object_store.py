"""Object stores behind fsspec URLs (`s3://...`): how long a call may wait, and what its failures say.

Timeouts. A stalled store (a hung server, a dropped route) used to give no message for minutes: s3fs
waits 15 s for each reply, botocore tries a request 5 times, and s3fs tries a call that timed out 5
times over that. `configure_object_stores` (applied when a pipeline config loads, from its
`object_store` section) sets how long a request may wait to connect and for each reply, and how many
times botocore tries it (its "standard" mode retries throttling, 5xx replies, timeouts and dropped
connections). s3fs's own 5 tries of a call that timed out stay (they are a class attribute of s3fs,
not a setting), so a store that stops replying fails a call after about 5 x attempts x read timeout.
The settings go into this process's fsspec configuration and into `FSSPEC_S3_CONFIG_KWARGS`, which
fsspec reads when it is imported, so the processes started from this one (a local Ray's workers,
torchrun) use them too.

Errors. `object_store_errors` turns the failures that are about the store rather than the data into
one `ObjectStoreError` naming the URL, the endpoint and what to fix: credentials the store refuses,
an endpoint that cannot be reached, a call that timed out. Only S3 (s3fs over botocore) is told apart;
other stores' errors, and every error of local paths, pass as they are.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

import fsspec

S3_CONFIG_ENV = "FSSPEC_S3_CONFIG_KWARGS"
S3_PROTOCOLS = ("s3", "s3a")


class ObjectStoreError(RuntimeError):
    """A call to an object store failed for a reason outside the data: credentials, endpoint, time."""


def configure_object_stores(*, connect_timeout_s: float, read_timeout_s: float, attempts: int) -> None:
    """Bound every S3 call of this process and of the processes it starts (see the module docstring);
    other keys of fsspec's S3 settings (from `FSSPEC_S3*` variables or files) are kept."""
    s3 = dict(fsspec.config.conf.get("s3", {}))
    s3["config_kwargs"] = {
        **s3.get("config_kwargs", {}),
        "connect_timeout": connect_timeout_s,
        "read_timeout": read_timeout_s,
        "retries": {"total_max_attempts": attempts, "mode": "standard"},
    }
    fsspec.config.conf["s3"] = s3
    os.environ[S3_CONFIG_ENV] = json.dumps(s3["config_kwargs"])


@contextlib.contextmanager
def object_store_errors(url: str, operation: str) -> Iterator[None]:
    """Run the block, turning a refused, unreachable or timed-out S3 call into an `ObjectStoreError`
    that reads `could not <operation> <url>: <what happened and what to fix>`."""
    try:
        yield
    except Exception as error:
        problem = _store_problem(url, error)
        if problem is None:
            raise
        # The message says all there is to say; botocore's chained traceback would bury it.
        raise ObjectStoreError(f"could not {operation} {url}: {problem}") from None


def _store_problem(url: str, error: Exception) -> str | None:
    if "://" not in url or url.split("://", 1)[0] not in S3_PROTOCOLS:
        return None
    try:
        from botocore import exceptions as boto
    except ImportError:  # s3fs is not installed: nothing of S3 could have raised
        return None
    if isinstance(error, TimeoutError | boto.ReadTimeoutError | boto.ConnectTimeoutError):
        timeouts = _s3_config(url)
        attempts = timeouts.get("retries", {}).get("total_max_attempts", "botocore's default number of")
        return (
            f"no reply from the endpoint {_endpoint(url)} within the timeouts (connect "
            f"{timeouts['connect_timeout']} s, read {timeouts['read_timeout']} s, {attempts} attempts, "
            "each tried again by s3fs); "
            "if the store is up but slow, raise object_store.read_timeout_s (or connect_timeout_s, "
            "attempts) in the pipeline config"
        )
    if isinstance(error, PermissionError | boto.NoCredentialsError | boto.PartialCredentialsError):
        return (
            f"the endpoint {_endpoint(url)} refused the credentials ({type(error).__name__}: {error}); "
            "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and that they may list "
            "and read this location"
        )
    if isinstance(error, boto.EndpointConnectionError):
        return (
            f"cannot connect to the endpoint {_endpoint(url)} ({error}); check AWS_ENDPOINT_URL (or "
            "AWS_DEFAULT_REGION) and that the store is running and reachable from this machine"
        )
    return None


def _s3_config(url: str) -> dict:
    """The botocore settings the filesystem of `url` was made with."""
    fs = fsspec.core.url_to_fs(url)[0]
    return {
        "connect_timeout": fs.connect_timeout,
        "read_timeout": fs.read_timeout,
        **fs.config_kwargs,
    }


def _endpoint(url: str) -> str:
    """Where the filesystem of `url` sends its requests (the client it built: an explicit endpoint,
    `AWS_ENDPOINT_URL`, or AWS's own for the region)."""
    try:
        return fsspec.core.url_to_fs(url)[0].s3.meta.endpoint_url
    except Exception:  # no client could be built (no region, no credentials): name what would be used
        return os.environ.get("AWS_ENDPOINT_URL") or "AWS's endpoint for the region"
