"""Reports to Dagster through Pipes when Dagster launched this process, and nothing otherwise.

`dagster_pipes` is Dagster's small package for external processes; it does not import `dagster`, so
the training room stays free of Dagster, and a run started by hand never touches it. Progress goes to
Dagster as log messages (every record of the `moe_dag` loggers at INFO and above, as it happens), the
final figures as the asset's materialization.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Set by Dagster's Pipes clients in the environment of the process they launch.
PIPES_CONTEXT_ENV = "DAGSTER_PIPES_CONTEXT"


class Reporter:
    """Sends results to the Dagster asset that launched this process; a no-op outside Dagster."""

    def __init__(self, pipes: Any = None) -> None:
        self._pipes = pipes

    @property
    def active(self) -> bool:
        return self._pipes is not None

    def report_materialization(self, metadata: dict[str, Any]) -> None:
        if self._pipes is not None:
            self._pipes.report_asset_materialization(metadata=metadata)


class _ForwardToPipes(logging.Handler):
    def __init__(self, pipes_logger: logging.Logger) -> None:
        super().__init__(level=logging.INFO)
        self._pipes_logger = pipes_logger

    def emit(self, record: logging.LogRecord) -> None:
        self._pipes_logger.log(record.levelno, self.format(record))


@contextmanager
def pipes_reporter(enabled: bool = True) -> Iterator[Reporter]:
    """A Reporter connected to Dagster when `enabled` and launched through Pipes; forwards `moe_dag`
    log records meanwhile. An exception leaving the block reaches Dagster with its traceback."""
    if not enabled or PIPES_CONTEXT_ENV not in os.environ:
        yield Reporter()
        return
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        handler = _ForwardToPipes(pipes.log)
        logger = logging.getLogger("moe_dag")
        logger.addHandler(handler)
        try:
            yield Reporter(pipes)
        finally:
            logger.removeHandler(handler)
