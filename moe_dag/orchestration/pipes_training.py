"""`python -m moe_dag.orchestration.pipes_training`: the trainer's command line, reporting to Dagster
through Pipes.

The `moe_proxy` asset launches this instead of `python -m moe_dag.training`, so that the training room
stays free of Dagster. `dagster_pipes` is Dagster's small package for external processes (it does not
import `dagster`). When Dagster launched the process, rank 0 sends progress as log messages (every
record of the `moe_dag` loggers at INFO and above, as it happens) and the final figures as the asset's
materialization; otherwise it behaves exactly like `python -m moe_dag.training`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from moe_dag.training.__main__ import main as training_main
from moe_dag.training.reporting import Reporter

# Set by Dagster's Pipes clients in the environment of the process they launch.
PIPES_CONTEXT_ENV = "DAGSTER_PIPES_CONTEXT"


class PipesReporter(Reporter):
    """Sends the final figures to the Dagster asset that launched this process."""

    active = True

    def __init__(self, pipes: Any) -> None:
        self._pipes = pipes

    def report_materialization(self, metadata: dict[str, Any]) -> None:
        self._pipes.report_asset_materialization(metadata=metadata)


class _ForwardToPipes(logging.Handler):
    def __init__(self, pipes_logger: logging.Logger) -> None:
        super().__init__(level=logging.INFO)
        self._pipes_logger = pipes_logger

    def emit(self, record: logging.LogRecord) -> None:
        self._pipes_logger.log(record.levelno, self.format(record))


@contextmanager
def pipes_reporter(enabled: bool = True) -> Iterator[Reporter]:
    """A reporter connected to Dagster when `enabled` and launched through Pipes (else one that drops
    everything); forwards `moe_dag` log records meanwhile. An exception leaving the block reaches
    Dagster with its traceback."""
    if not enabled or PIPES_CONTEXT_ENV not in os.environ:
        yield Reporter()
        return
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        handler = _ForwardToPipes(pipes.log)
        logger = logging.getLogger("moe_dag")
        logger.addHandler(handler)
        try:
            yield PipesReporter(pipes)
        finally:
            logger.removeHandler(handler)


def main(argv: list[str] | None = None) -> int:
    return training_main(argv, open_reporter=pipes_reporter, module="moe_dag.orchestration.pipes_training")


if __name__ == "__main__":
    raise SystemExit(main())
