"""No asset reads a whole source into the Dagster process (issue 19): what needs every row of a slice
(the oracle's sample, the prefilter's fit sample, counts, checksums) runs in Ray tasks that return small
results, and these tests hold those distributed forms equal to the in-memory references."""

from __future__ import annotations

import dataclasses
import random
import sys
import threading

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from test_end_to_end import tiny_config

from moe_dag.assets.dedup import _built_from
from moe_dag.assets.ingest import first_errors
from moe_dag.config import PipelineConfig, load_config
from moe_dag.curation.dedup import CLUSTER_VERSION, combine_versions
from moe_dag.curation.dedup.clusters import EMPTY_VERSION
from moe_dag.curation.demo_corpus import build_demo_corpus
from moe_dag.curation.filters import build_prefilters
from moe_dag.curation.fits import (
    DecisionsBefore,
    change_counts,
    changed_decisions,
    fit_source,
    fit_source_in_tasks,
)
from moe_dag.curation.ingest import ingest_source
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.orchestration.pipeline import stages
from moe_dag.quality.oracle import sample_slice, split_sample
from moe_dag.storage.lake import Lake
from tests.pipeline_configs import edited_config

SCHEMA = pa.schema({"id": pa.string(), "text": pa.string(), "source": pa.string(), "keep": pa.bool_()})


def _slice(lake: Lake, stage: str, source: str, files: int, seed: int = 0) -> pa.Table:
    """Files of random sizes (one empty) whose lengths repeat, so ties cross bucket edges; returns the
    kept rows as one table, without `keep`."""
    rng = random.Random(seed)
    tables = []
    for f in range(files):
        n = 0 if f == 1 else rng.randint(1, 300)
        table = pa.table(
            {
                "id": [f"{source}/{f}-{i}" for i in range(n)],
                "text": ["x" * rng.choice([5, 10, 10, 40, rng.randint(1, 500)]) for _ in range(n)],
                "source": [source] * n,
                "keep": [rng.random() < 0.8 for _ in range(n)],
            },
            schema=SCHEMA,
        )
        lake.write_file(table, lake.shard_path(stage, source, f"shard-{f}"))
        tables.append(table)
    whole = pa.concat_tables(tables)
    return whole.filter(whole["keep"]).drop_columns(["keep"])


@pytest.mark.parametrize(("labelled", "calibration"), [(8, 20), (50, 200), (10, 0), (2000, 5), (30, 10_000)])
def test_the_sample_drawn_per_file_is_the_in_memory_sample(tmp_path, labelled, calibration):
    lake = Lake(tmp_path)
    kept = _slice(lake, "toxicity_filtered", "web", files=5)
    expected = split_sample(kept, labelled, calibration, seed=3)
    drawn = sample_slice(lake, "toxicity_filtered", "web", ["id", "text", "source"], labelled, calibration, 3)
    assert drawn[0].equals(expected[0]) and drawn[1].equals(expected[1])
    assert not set(drawn[0]["id"].to_pylist()) & set(drawn[1]["id"].to_pylist())


def test_the_sample_does_not_depend_on_how_rows_are_split_into_files(tmp_path):
    lake = Lake(tmp_path / "many")
    kept = _slice(lake, "toxicity_filtered", "web", files=6)
    one = Lake(tmp_path / "one")
    one.write_file(
        kept.append_column("keep", pa.array([True] * kept.num_rows)), one.shard_path("t", "web", "all")
    )
    columns = ["id", "text", "source"]
    many_files = sample_slice(lake, "toxicity_filtered", "web", columns, 40, 100, 1)
    one_file = sample_slice(one, "t", "web", columns, 40, 100, 1)
    for a, b in zip(many_files, one_file, strict=True):
        assert sorted(a["id"].to_pylist()) == sorted(b["id"].to_pylist())


def test_raw_documents_reads_only_the_quarantine_errors_it_shows(tmp_path, monkeypatch):
    lake = Lake(tmp_path)
    for shard in range(2):
        errors = [f"error {shard}-{line}" for line in range(50)]
        lake.write_file(pa.table({"error": errors}), lake.shard_path("quarantine", "web", f"shard-{shard}"))
    reads = DriverReads()
    reads.install(monkeypatch)
    assert first_errors(lake, "web") == [f"error 0-{line}" for line in range(20)]
    assert sum(reads.rows.values()) == 20


def test_what_a_refit_changed_is_counted_shard_by_shard(tmp_path):
    lake = Lake(tmp_path)

    def write(decisions: dict[str, list]) -> pa.Table:
        for shard, (keep, reason) in enumerate(
            [
                (decisions["keep"][:3], decisions["reason"][:3]),
                (decisions["keep"][3:], decisions["reason"][3:]),
            ]
        ):
            ids = ["a", "b", "c"] if shard == 0 else ["d", "e"]
            table = pa.table({"id": ids, "keep": keep, "reason": pa.array(reason, pa.string())})
            lake.write_file(table, lake.shard_path("prefiltered", "web", f"shard-{shard}"))
        return lake.read_table("prefiltered", "web", ["id", "keep", "reason"])

    old = write({"keep": [True, False, True, True, False], "reason": [None, "x", None, None, "y"]})
    before = DecisionsBefore(lake, "prefiltered", "web")
    new = write({"keep": [False, False, True, False, True], "reason": ["p", "x", None, "p", None]})
    expected = change_counts(changed_decisions(old, new))
    assert before.changes() == expected == {"kept -> p": 2, "y -> kept": 1}
    assert DecisionsBefore(Lake(tmp_path / "empty"), "prefiltered", "web").changes() == {}


def test_the_cluster_version_a_partition_was_built_from_is_read_per_file(tmp_path):
    """Each shard's rows carry their own cluster file's version; the partition's combines them."""
    lake = Lake(tmp_path)
    assert _built_from(lake, "web") == EMPTY_VERSION
    shard_versions = ["2-" + "0" * 31 + "3", "1-" + "0" * 31 + "5"]
    for shard, version in enumerate(shard_versions):
        table = pa.table({"id": [f"{shard}"], CLUSTER_VERSION: [version]})
        lake.write_file(table, lake.shard_path("deduplicated", "web", f"shard-{shard}"))
    assert _built_from(lake, "web") == "3-" + "0" * 31 + "6" == combine_versions(shard_versions)


@pytest.fixture(scope="module")
def demo_lake(tmp_path_factory) -> tuple[Lake, PipelineConfig]:
    """raw_documents of the tiny demo corpus (three sources, shards of 25 documents), ingested here."""
    tmp_path = tmp_path_factory.mktemp("demo")
    config = load_config(tiny_config(tmp_path))
    build_demo_corpus(tmp_path / "corpus", config.demo_corpus)
    lake = Lake(config.lake_root)
    for source in config.sources:
        ingest_source(lake, source.name, source.shards, workers=0)
    return lake, config


@pytest.mark.parametrize(
    ("source_name", "max_documents"), [("intl", 45), ("intl", 100_000), ("prose", 100_000)]
)
def test_the_fit_made_in_tasks_is_the_fit_made_here(demo_lake, source_name, max_documents):
    """Same model, cuts and version, whether the fit sample ends inside a shard or takes the source."""
    lake, config = demo_lake
    source = config.source(source_name)
    settings = dataclasses.replace(
        config.prefilter_for(source),
        perplexity=dataclasses.replace(config.prefilter_for(source).perplexity, min_documents=10),
    )

    def filters() -> list:
        return build_prefilters(settings, source.kind, source.languages)

    here = fit_source(filters(), lake.iter_batches("raw_documents", source.name), max_documents, "s")
    in_tasks = fit_source_in_tasks(filters(), lake, "raw_documents", source.name, max_documents, "s")
    assert in_tasks.documents == here.documents == min(max_documents, 60)
    assert in_tasks.describe() == here.describe()
    assert in_tasks.filters["perplexity"].model is not None
    assert in_tasks.version == here.version


# --- rows read into the Dagster process, per asset materialisation ------------------------------------

# A demo source: each slice of it, from raw to toxicity_filtered, holds over 300 rows (over BOUND, which
# the fixture asserts), in shards of 100 documents (several a source, without a Ray task per 25 of them).
DOCUMENTS, DOCUMENTS_PER_SHARD = 500, 100
# The assets materialised: curation to scoring, the catalog, the tokenizer and both mixtures (not the
# training runs, whose readers live in the trainer's own processes).
SELECTION = [
    "raw_documents",
    "prefiltered",
    "minhash_signatures",
    "dedup_clusters",
    "neutral_documents",
    "deduplicated",
    "toxicity_filtered",
    "oracle_sample",
    "oracle_labels",
    "quality_heads",
    "scored_documents",
    "document_catalog",
    "tokenizer",
    "tokenized_mixture",
    "unfiltered_mixture",
]
# Rows one materialisation may read into the driver, under any slice's size (so reading a whole slice
# fails): the heads' labels and samples are sized by the config (10 labels and 21 calibration documents
# a source here, 123 rows), the catalog's results by stages and languages (about 160 rows).
BOUND = 250


class DriverReads:
    """Rows that pyarrow and DuckDB hand to Python in this process, by the asset (or check) function on
    the stack: the outermost frame of a `moe_dag.assets` module. Ray workers are other processes, so what
    they read is not counted; a DuckDB aggregate counts the rows of its result, not those it scanned."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str | None], int] = {}  # by (asset or check, partition)
        self.partition: str | None = None  # of the run going on

    def add(self, rows: int) -> None:
        # A read in a thread an asset started counts for the asset, which waits on it in the main thread.
        main = sys._current_frames().get(threading.main_thread().ident)
        asset = _asset_on(sys._getframe(1)) or _asset_on(main) or "(outside assets)"
        key = (asset, self.partition)
        self.rows[key] = self.rows.get(key, 0) + rows

    def counted(self, fn, rows_of=lambda result: result.num_rows):
        def wrapper(*args, **kwargs):
            result = fn(*args, **kwargs)
            self.add(rows_of(result))
            return result

        return wrapper

    def counted_batches(self, fn):
        def wrapper(*args, **kwargs):
            for batch in fn(*args, **kwargs):
                self.add(batch.num_rows)
                yield batch

        return wrapper

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(pq, "read_table", self.counted(pq.read_table))
        for name in ("read", "read_row_group", "read_row_groups"):
            monkeypatch.setattr(pq.ParquetFile, name, self.counted(getattr(pq.ParquetFile, name)))
        monkeypatch.setattr(pq.ParquetFile, "iter_batches", self.counted_batches(pq.ParquetFile.iter_batches))
        monkeypatch.setattr(ds, "dataset", lambda *a, **k: _Counting(ds_dataset(*a, **k), self))
        monkeypatch.setattr(duckdb, "connect", lambda *a, **k: _Counting(duckdb_connect(*a, **k), self))


def _asset_on(frame) -> str | None:
    """The outermost function of a `moe_dag.assets` module on the stack: the asset or check running."""
    asset = None
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith("moe_dag.assets."):
            asset = frame.f_code.co_name
        frame = frame.f_back
    return asset


ds_dataset, duckdb_connect = ds.dataset, duckdb.connect
_FETCHES = {
    "fetchall": len,
    "fetchmany": len,
    "fetchone": lambda row: int(row is not None),
    "fetch_arrow_table": lambda t: t.num_rows,
    "arrow": lambda t: t.num_rows,
    "to_arrow_table": lambda t: t.num_rows,
    "to_table": lambda t: t.num_rows,
    "fetchdf": len,
    "df": len,
    "fetchnumpy": lambda columns: len(next(iter(columns.values()), [])),
}


class _Counting:
    """A DuckDB connection or relation, or a pyarrow dataset, whose results count as driver reads."""

    def __init__(self, inner, reads: DriverReads) -> None:
        self._inner, self._reads = inner, reads

    def __enter__(self):
        self._inner.__enter__()
        return self

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc)

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if name in _FETCHES:
            return self._reads.counted(value, _FETCHES[name])
        if name == "to_batches":
            return self._reads.counted_batches(value)
        if not callable(value):
            return value

        def call(*args, **kwargs):
            result = value(*args, **kwargs)
            wrapped = isinstance(result, (duckdb.DuckDBPyConnection, duckdb.DuckDBPyRelation, ds.Dataset))
            return _Counting(result, self._reads) if wrapped else result

        return call


@pytest.fixture(scope="module")
def driver_reads(tmp_path_factory, local_ray) -> dict[tuple[str, str | None], int]:
    """Rows read into this process per (asset or check, partition), materialising SELECTION once."""
    tmp_path = tmp_path_factory.mktemp("bounded")
    path = edited_config(
        tiny_config(tmp_path),
        {
            "demo_corpus": {"docs_per_source": DOCUMENTS, "docs_per_shard": DOCUMENTS_PER_SHARD},
            "oracle": {"per_source": 10},
            "calibration": {"keep_rate_tolerance": 0.2},
        },
    )
    config = load_config(path)
    build_demo_corpus(tmp_path / "corpus", config.demo_corpus)
    definitions = build_definitions(str(path))
    instance = dg.DagsterInstance.ephemeral()
    reads, monkeypatch = DriverReads(), pytest.MonkeyPatch()
    reads.install(monkeypatch)
    try:
        for stage in stages(definitions):
            keys = [key for key in stage.assets if key in SELECTION]
            for partition in (config.source_names if stage.per_source else [None]) if keys else []:
                reads.partition = partition
                # A blocking check may fail on so small a corpus; the next stage still runs (its own run).
                dg.materialize(
                    [*definitions.assets, *definitions.asset_checks],
                    selection=keys,
                    partition_key=partition,
                    instance=instance,
                    resources=definitions.resources,
                    raise_on_error=False,
                )
    finally:
        monkeypatch.undo()
    for key in SELECTION:
        assert instance.get_latest_materialization_event(dg.AssetKey(key)) is not None, key
    smallest = min(_rows(config, source) for source in config.source_names)
    assert smallest > BOUND, f"a toxicity_filtered slice of {smallest} rows: too small to tell"
    # A standalone check's reads count for the asset it checks.
    checked = {
        checks.node_def.compute_fn.decorated_fn.__name__: key.asset_key.to_user_string()
        for checks in definitions.asset_checks
        for key in checks.check_keys
    }
    rows: dict[tuple[str, str | None], int] = {}
    for (name, partition), count in reads.rows.items():
        key = (checked.get(name, name), partition)
        rows[key] = rows.get(key, 0) + count
    print("rows read into the driver:", dict(sorted(rows.items(), key=str)))
    return rows


def _rows(config: PipelineConfig, source: str) -> int:
    lake = Lake(config.lake_root)
    return sum(
        pq.ParquetFile(path).metadata.num_rows for path in lake.parquet_files("toxicity_filtered", source)
    )


@pytest.mark.slow
@pytest.mark.parametrize("asset", SELECTION)
def test_an_asset_reads_a_bounded_number_of_rows_into_the_driver(driver_reads, asset):
    """Each materialisation of the asset (each partition), its checks included, reads at most BOUND rows
    into the Dagster process, fewer than any slice it could read whole."""
    mine = {
        key: rows for key, rows in driver_reads.items() if key[0] == asset or key[0].startswith(f"{asset}_")
    }
    over = {f"{name}[{partition}]": rows for (name, partition), rows in mine.items() if rows > BOUND}
    assert not over, f"rows read into the driver by partition: {over} (bound {BOUND})"
