"""Where a run's final figures go besides its run folder: nowhere, unless the launcher says otherwise.

`python -m moe_dag.training` reports to no one. A launcher that wants the figures (Dagster, through
`moe_dag/orchestration/pipes_training.py`) runs the same `main` with its own `open_reporter`; this room
never imports Dagster, not even its Pipes package.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any


class Reporter:
    """Takes the run's final figures; this one drops them. `active`: someone is listening, so the run
    log goes there and the console stays quiet."""

    active = False

    def report_materialization(self, metadata: dict[str, Any]) -> None:
        pass


# open_reporter(enabled): the reporter for this process (enabled on rank 0 only), as a context.
OpenReporter = Callable[[bool], AbstractContextManager[Reporter]]


@contextmanager
def no_reporter(enabled: bool) -> Iterator[Reporter]:
    yield Reporter()
