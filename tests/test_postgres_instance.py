"""The production instance config (configs/dagster/postgres.yaml) against a real PostgreSQL server.

The test starts Debian's `postgres` (package `postgresql`, installed by `make test`) on 127.0.0.1 with
its data in a temporary folder, materialises one source's `raw_documents` through an instance built
from the yaml, and reads the run and its events back from PostgreSQL's own tables. PostgreSQL refuses
to run as root, so under root the server runs as the `postgres` system user the package creates.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import psycopg2
import pytest
from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage

from moe_dag.config import load_config
from moe_dag.curation.demo_corpus import build_demo_corpus
from moe_dag.orchestration.definitions import build_definitions
from tests.local_processes import free_port

REPO = Path(__file__).resolve().parents[1]
POSTGRES_YAML = REPO / "configs" / "dagster" / "postgres.yaml"
SOURCE = "code"


@dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    user: str
    password: str
    database: str

    def environment(self) -> dict[str, str]:
        """The variables configs/dagster/postgres.yaml reads."""
        return {
            "DAGSTER_PG_HOST": self.host,
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_DB": self.database,
            "DAGSTER_PG_USERNAME": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
        }

    def connect(self, database: str | None = None, **options):
        return psycopg2.connect(
            host=self.host, port=self.port, user=self.user, password=self.password,
            dbname=database or self.database, **options,
        )  # fmt: skip


def postgres_bin_dir() -> Path | None:
    """The newest installed server's bin folder (Debian keeps it off PATH), or None."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=_major_version)
    found = candidates[-1] if candidates else shutil.which("postgres")
    return Path(found).parent if found else None


def _major_version(binary: str) -> int:
    return int(Path(binary).parts[-3]) if Path(binary).parts[-3].isdigit() else 0


@pytest.fixture
def postgres_server() -> Iterator[PostgresServer]:
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        pytest.skip(
            "PostgreSQL server binary not found (/usr/lib/postgresql/*/bin/postgres or `postgres` on PATH): "
            "install Debian's `postgresql` package (`make test` does so as root)"
        )
    run_as = _server_user()
    folder = Path(tempfile.mkdtemp(prefix="moe_dag_pg_"))  # not under pytest's tmp: root-only (0700)
    server = PostgresServer("127.0.0.1", free_port(), "moe_dag", "pg-test-password", "dagster")
    log_path = folder / "server.log"
    try:
        (folder / "password").write_text(server.password)
        if run_as is not None:
            shutil.chown(folder, run_as.pw_uid, run_as.pw_gid)
            shutil.chown(folder / "password", run_as.pw_uid, run_as.pw_gid)
        user = run_as.pw_uid if run_as else None
        subprocess.run(
            [bin_dir / "initdb", "-D", folder / "data", "-U", server.user, f"--pwfile={folder / 'password'}",
             "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync"],
            check=True, capture_output=True, user=user, cwd=folder,
        )  # fmt: skip
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [bin_dir / "postgres", "-D", folder / "data", "-h", server.host, "-p", str(server.port),
                 "-k", folder, "-c", "fsync=off", "-c", "full_page_writes=off"],
                stdout=log, stderr=subprocess.STDOUT, user=user, cwd=folder,
            )  # fmt: skip
        try:
            _wait_until_accepting(server, process, log_path)
            admin = server.connect("postgres")
            admin.autocommit = True  # CREATE DATABASE cannot run inside a transaction
            admin.cursor().execute(f"CREATE DATABASE {server.database}")
            admin.close()
            yield server
        finally:
            process.send_signal(signal.SIGINT)  # "fast" shutdown: roll back open sessions, stop
            process.wait(timeout=30)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _server_user() -> pwd.struct_passwd | None:
    """None when not root (the server runs as us); else the `postgres` account."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise RuntimeError(
            "running as root, and PostgreSQL refuses to: no `postgres` user to run it as "
            "(Debian's postgresql-common package creates one)"
        ) from None


def _wait_until_accepting(server: PostgresServer, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"postgres exited with {process.returncode}:\n{log_path.read_text()[-2000:]}")
        try:
            server.connect("postgres", connect_timeout=2).close()
            return
        except psycopg2.OperationalError as error:
            if time.monotonic() > deadline:
                log = log_path.read_text()[-2000:]
                raise RuntimeError(f"postgres did not accept connections in 60 s:\n{log}") from error
            time.sleep(0.2)


@pytest.mark.slow
def test_postgres_instance_records_a_partition_run(postgres_server, tmp_path, monkeypatch):
    from test_end_to_end import tiny_config

    config_path = tiny_config(tmp_path)
    manifest = build_demo_corpus(tmp_path / "corpus", load_config(config_path).demo_corpus)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(POSTGRES_YAML, home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    for name, value in postgres_server.environment().items():
        monkeypatch.setenv(name, value)

    definitions = build_definitions(config_path)
    with dg.DagsterInstance.get() as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        result = dg.materialize(
            list(definitions.assets),
            selection=["raw_documents"],
            partition_key=SOURCE,
            instance=instance,
            resources=definitions.resources,
        )
        assert result.success
        run_id = result.run_id
        # The instance API reads the materialisation back from PostgreSQL too.
        event = instance.get_latest_materialization_event(dg.AssetKey("raw_documents"))
        assert event is not None and event.run_id == run_id
        documents = event.asset_materialization.metadata["documents"].value
        quarantined = event.asset_materialization.metadata["quarantined"].value
        assert documents + quarantined == manifest["lines"][SOURCE]

    # And straight from PostgreSQL's tables, with no Dagster in between.
    with postgres_server.connect() as connection, connection.cursor() as cursor:
        cursor.execute("SELECT run_id, status, partition FROM runs")
        assert cursor.fetchall() == [(run_id, "SUCCESS", SOURCE)]
        cursor.execute(
            "SELECT asset_key, partition FROM event_logs "
            "WHERE run_id = %s AND dagster_event_type = 'ASSET_MATERIALIZATION'",
            (run_id,),
        )
        assert cursor.fetchall() == [('["raw_documents"]', SOURCE)]
        cursor.execute(
            "SELECT count(*) FROM event_logs "
            "WHERE run_id = %s AND dagster_event_type = 'ASSET_CHECK_EVALUATION'",
            (run_id,),
        )
        assert cursor.fetchone()[0] >= 1
        cursor.execute("SELECT asset_key FROM asset_keys")
        assert ('["raw_documents"]',) in cursor.fetchall()
    connection.close()
