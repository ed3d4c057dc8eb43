"""Issue 35, item 11: a Dagster instance folder with '?' in its path (DAGSTER_HOME, or `dagster/` beside
a catalog in such a folder) died with `sqlite3.OperationalError: no such table: event_logs`: SQLite's
URL reads '?' as the start of its options. It is refused in one line that names the folder."""

import pytest
import yaml

from moe_dag.cli.dagster_home import prepare_dagster_home
from moe_dag.cli.main import _default_home


def test_a_dagster_home_with_a_question_mark_is_refused(tmp_path):
    home = tmp_path / "runs?v2" / "dagster"
    with pytest.raises(SystemExit, match=r"moe-dag: the Dagster instance folder .*runs\?v2/dagster has '\?'"):
        prepare_dagster_home(str(home))
    assert not home.exists()


def test_a_catalog_in_a_folder_with_a_question_mark_is_refused(tmp_path):
    config = tmp_path / "pipeline.yaml"
    catalog = tmp_path / "what?" / "catalog.duckdb"
    sources = [{"name": "web", "kind": "web", "shards": "shards"}]
    config.write_text(yaml.safe_dump({"lake_root": "lake", "catalog_path": str(catalog), "sources": sources}))
    with pytest.raises(
        SystemExit, match=r"the Dagster instance folder .*what\?/dagster has '\?'.*catalog_path"
    ):
        _default_home(str(config))
