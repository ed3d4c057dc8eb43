"""A DAGSTER_HOME that does not exist yet (issue 34, item 2): `moe-dag` creates it with the instance file,
or refuses in one line that names the fix, instead of Dagster's traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from moe_dag.cli.dagster_home import INSTANCE_FILE, prepare_dagster_home
from moe_dag.cli.main import main

REPOSITORY_INSTANCE_FILE = Path(__file__).parents[1] / "dagster.yaml"


def test_a_missing_home_is_created_with_the_repository_s_instance_file(tmp_path):
    home = tmp_path / "new" / "dagster"
    said = prepare_dagster_home(str(home))
    assert (home / INSTANCE_FILE).read_bytes() == REPOSITORY_INSTANCE_FILE.read_bytes()
    assert said == f"moe-dag: created DAGSTER_HOME {home} with a copy of {REPOSITORY_INSTANCE_FILE}"


def test_an_existing_home_is_left_as_it_is(tmp_path):
    (tmp_path / INSTANCE_FILE).write_text("# the user's own\n")
    assert prepare_dagster_home(str(tmp_path)) is None
    assert (tmp_path / INSTANCE_FILE).read_text() == "# the user's own\n"


def test_a_relative_home_or_a_file_is_refused_in_one_line(tmp_path):
    with pytest.raises(SystemExit) as relative:
        prepare_dagster_home("state/dagster")
    assert str(relative.value) == (
        "moe-dag: DAGSTER_HOME 'state/dagster' must be an absolute path: "
        "export DAGSTER_HOME=$PWD/state/dagster"
    )
    a_file = tmp_path / "home"
    a_file.write_text("")
    with pytest.raises(SystemExit) as not_a_folder:
        prepare_dagster_home(str(a_file))
    assert str(not_a_folder.value) == (
        f"moe-dag: DAGSTER_HOME {a_file} is a file, not a folder: point DAGSTER_HOME at a folder"
    )


def test_the_command_runs_on_a_home_that_did_not_exist(tmp_path, monkeypatch, capsys):
    home = tmp_path / "fresh"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    assert main(["free-stuck-runs"]) == 0
    assert (home / INSTANCE_FILE).exists()
    assert f"created DAGSTER_HOME {home}" in capsys.readouterr().err
