"""The Dagster instance folder a command records runs in, made ready before Dagster reads it.

Dagster refuses a `DAGSTER_HOME` that does not exist with a traceback. A new user who points it at a
fresh folder means "keep the instance there": the folder is created with a copy of the repository's
`dagster.yaml` (the instance settings `make` copies the same way). What cannot be meant (a relative
path, a file) or cannot work (a '?' in the path) is refused in one line that says what to do.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

INSTANCE_FILE = "dagster.yaml"
# The repository's instance settings, beside the package in a checkout or an editable install.
REPOSITORY_INSTANCE_FILE = Path(__file__).resolve().parents[2] / INSTANCE_FILE


def check_instance_folder(home: Path, chosen_by: str) -> None:
    """SystemExit, in one line, for a folder the SQLite instance cannot live in: its storage URL
    (`sqlite:///<home>/...`) reads a '?' as the start of its options, so the tables land elsewhere and
    the first run dies with `no such table: event_logs`."""
    if "?" in str(home):
        raise SystemExit(
            f"moe-dag: the Dagster instance folder {home} has '?' in its path, which SQLite's URL reads as "
            f"the start of its options: choose a {chosen_by} without '?'"
        )


def prepare_dagster_home(home: str) -> str | None:
    """Create the folder `home` (the value of DAGSTER_HOME) with the instance file when it does not exist
    and say so; None when it exists. SystemExit, in one line, where it cannot be used."""
    path = Path(home)
    if not path.is_absolute():
        raise SystemExit(
            f"moe-dag: DAGSTER_HOME {home!r} must be an absolute path: export DAGSTER_HOME=$PWD/{home}"
        )
    check_instance_folder(path, "DAGSTER_HOME")
    if path.is_dir():
        return None
    if path.exists():
        raise SystemExit(
            f"moe-dag: DAGSTER_HOME {home} is a file, not a folder: point DAGSTER_HOME at a folder"
        )
    if not REPOSITORY_INSTANCE_FILE.exists():
        raise SystemExit(
            f"moe-dag: DAGSTER_HOME {home} does not exist: mkdir -p {home} and copy the repository's "
            f"{INSTANCE_FILE} into it"
        )
    path.mkdir(parents=True)
    shutil.copyfile(REPOSITORY_INSTANCE_FILE, path / INSTANCE_FILE)
    return f"moe-dag: created DAGSTER_HOME {home} with a copy of {REPOSITORY_INSTANCE_FILE}"


def announce_prepared_home(home: str | None) -> None:
    """`prepare_dagster_home` for a set DAGSTER_HOME, saying on stderr what it created."""
    said = prepare_dagster_home(home) if home else None
    if said:
        print(said, file=sys.stderr)
