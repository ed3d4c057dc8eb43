"""The `moe-dag` command: build the demo corpus, run the whole graph, print what it did."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from moe_dag.cli.dagster_home import announce_prepared_home, check_instance_folder
from moe_dag.config import CONFIG_ENV_VAR, DEFAULT_CONFIG, load_config
from moe_dag.training.strict_config import ConfigError

INSTANCE_COMMANDS = ("run", "demo", "search-mixture", "free-stuck-runs")  # those that open the instance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moe-dag", description=__doc__)
    parser.add_argument(
        "--config", default=os.environ.get(CONFIG_ENV_VAR, DEFAULT_CONFIG), help="pipeline config YAML"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo-corpus", help="write the embedded demo corpus where the config's sources point")
    run = commands.add_parser("run", help="materialise what is missing or stale, in process")
    run.add_argument("--force", action="store_true", help="materialise everything, stale or not")
    run.add_argument(
        "--source",
        action="append",
        metavar="NAME",
        help="backfill this source (repeatable): its per-source stages, then the global ones that are stale",
    )
    run.add_argument(
        "--comparisons",
        action="store_true",
        default=None,
        help="also train the baselines of curation_gain and moe_gain, whatever the config's `comparisons`",
    )
    run.add_argument(
        "--refresh",
        action="store_true",
        help="relabel, retrain the heads (which rescores every source and may change old decisions) and "
        "rebuild the mixture on any new data, not only past the config's refresh shares; without it, a "
        "relabelling those shares call for waits (the run says what it would redo)",
    )
    refit = commands.add_parser(
        "refit",
        help="say which stored prefilter decisions of a source a refit of its perplexity cuts would change "
        "(writes only a table of their ids; raise prefilter.refit to make it)",
    )
    refit.add_argument("--source", required=True, metavar="NAME")
    commands.add_parser("summary", help="print documents kept per stage, dedup, heads, mixture and loss")
    commands.add_parser("demo", help="demo-corpus, then run, then summary")
    query = commands.add_parser("query", help="run one SQL query on the DuckDB catalog, read-only")
    query.add_argument("sql", help='e.g. "SELECT * FROM stage_funnel"')
    query.add_argument("--limit", type=int, help="show at most this many rows (default: every row)")
    query.add_argument(
        "--format",
        choices=["table", "csv", "json"],
        default="table",
        help="table for people, csv or json for scripts",
    )
    explain = commands.add_parser(
        "explain",
        help="one document's way through the pipeline: its line, each stage's decision and reason, its "
        "dedup cluster, label and scores, the sequences and training steps that carried it, its loss",
    )
    explain.add_argument("document_id", metavar="DOC_ID", help="the document's id, as the catalog holds it")
    explain.add_argument("--format", choices=["text", "json"], default="text", help="json for scripts")
    commands.add_parser(
        "search-mixture",
        help="search the mixture weights with a swarm of small proxies, after `run` (docs/mixture_search.md)",
    )
    commands.add_parser(
        "free-stuck-runs", help="mark runs whose process is gone as failed and free the pool slots they hold"
    )
    args = parser.parse_args(argv)
    if args.command in INSTANCE_COMMANDS:
        announce_prepared_home(os.environ.get("DAGSTER_HOME"))
    try:
        return run_command(args)
    except ConfigError as error:  # the file, the key and what is wrong: no traceback needed
        print(f"moe-dag: {error}", file=sys.stderr)
        return 2


def run_command(args: argparse.Namespace) -> int:
    if args.command in ("demo-corpus", "demo"):
        write_demo_corpus(args.config)
    if args.command in ("run", "demo"):
        run_all(
            args.config,
            force=getattr(args, "force", False),
            sources=getattr(args, "source", None),
            comparisons=getattr(args, "comparisons", None),
            refresh=getattr(args, "refresh", False),
        )
    if args.command == "search-mixture":
        return search_mixture(args.config)
    if args.command == "refit":
        return print_refit_changes(args.config, args.source)
    if args.command == "free-stuck-runs":
        return free_stuck_runs()
    if args.command == "explain":
        from moe_dag.cli.explain import explain

        return explain(args.config, args.document_id, args.format)
    if args.command == "query":
        return print_query(args.config, args.sql, args.limit, args.format)
    if args.command in ("summary", "demo"):
        from moe_dag.cli.summary import format_summary

        print(format_summary(load_config(args.config)))
    return 0


def write_demo_corpus(config_path: str) -> None:
    from moe_dag.curation.demo_corpus import build_demo_corpus

    config = load_config(config_path)
    if config.demo_corpus is None:
        raise SystemExit(f"{config_path} has no demo_corpus section: it reads real shards, nothing to build")
    roots = {Path(source.shards).parent for source in config.sources}
    if len(roots) != 1:
        raise SystemExit(f"{config_path}: demo sources must share one corpus folder, got {sorted(roots)}")
    root = roots.pop()
    manifest = build_demo_corpus(root, config.demo_corpus)
    documents = sum(manifest["documents"].values())
    print(f"demo corpus: {documents} documents in {root} (noise: {manifest['noise']})")


def print_query(config_path: str, sql: str, limit: int | None = None, output: str = "table") -> int:
    """Print the query's rows; a query that cannot run prints one line on stderr and returns 2."""
    from moe_dag.cli.query_output import write_rows
    from moe_dag.storage.catalog import Catalog, CatalogError
    from moe_dag.storage.lake import Lake

    config = load_config(config_path)
    try:
        table = Catalog(config.catalog_path, Lake(config.lake_root)).query_arrow(sql)
    except CatalogError as error:
        print(f"moe-dag query: {error}", file=sys.stderr)
        return 2
    write_rows(table if limit is None else table.slice(0, limit), output, sys.stdout)
    if limit is not None and table.num_rows > limit:
        print(f"({table.num_rows - limit} more rows; raise --limit to see them)", file=sys.stderr)
    return 0


def print_refit_changes(config_path: str, source_name: str) -> int:
    """Fit the source's cuts afresh on its shards now and print the stored decisions that would change,
    per reason and in a parquet file of ids beside the fits; nothing the pipeline reads is written."""
    from moe_dag.curation.filters import build_prefilters
    from moe_dag.curation.fits import change_counts, fit_source, load_fit, refit_changes, with_fit
    from moe_dag.storage.lake import Lake

    config = load_config(config_path)
    if source_name not in config.source_names:
        print(f"moe-dag refit: no source {source_name!r}; sources: {config.source_names}", file=sys.stderr)
        return 2
    source, lake = config.source(source_name), Lake(config.lake_root)
    settings = config.prefilter_for(source)
    filters = build_prefilters(settings, source.kind, source.languages)
    stored = load_fit(lake, "prefiltered", source_name)
    batches = lake.iter_batches("raw_documents", source_name)
    fit = fit_source(filters, batches, settings.perplexity.sample_documents, "")
    changed = refit_changes(lake, "prefiltered", source_name, with_fit(filters, fit))
    print(f"stored fit: {stored.describe() if stored else 'none'}")
    print(f"refit:      {fit.describe()}")
    print(f"{changed.num_rows} stored decisions would change")
    for change, count in change_counts(changed).items():
        print(f"  {change}: {count}")
    if changed.num_rows:
        path = lake.shard_path("fits/prefiltered", source_name, f"changes-{fit.version}")
        lake.write_file(changed, path)
        print(f"ids: {path}")
    print(f"to refit: raise prefilter.refit (now {settings.refit}) in sources[{source_name}].prefilter, run")
    return 0


def search_mixture(config_path: str) -> int:
    """The mixture search job; prints the proposal's snippet and how it validated."""
    from moe_dag.orchestration.mixture_search import search_mixture as run_search

    home = None if os.environ.get("DAGSTER_HOME") else str(_default_home(config_path))
    figures = run_search(config_path, home)
    low, high = figures["gain_vs_configured_ci"]
    inside = "inside" if figures["inside_predicted_interval"] else "outside"
    print(
        f"proposal: {figures['achieved']:.4f} neutral bits per byte, {inside} its predicted interval "
        f"(error {figures['validation_error']:+.4f}); against the configured mixture "
        f"{figures['gain_vs_configured']:+.4f} ({low:+.4f} to {high:+.4f})"
    )
    return 0


def _default_home(config_path: str) -> Path:
    """`dagster/` beside the catalog: where runs are recorded when DAGSTER_HOME is not set."""
    home = Path(load_config(config_path).catalog_path).parent / "dagster"
    check_instance_folder(home, "catalog_path (or set DAGSTER_HOME)")
    home.mkdir(parents=True, exist_ok=True)
    return home


def free_stuck_runs() -> int:
    import dagster as dg

    from moe_dag.orchestration.instance_health import free_dead_runs, runs_seen_elsewhere

    if not os.environ.get("DAGSTER_HOME"):
        print(
            "moe-dag free-stuck-runs: set DAGSTER_HOME to the instance's folder (make sets it)",
            file=sys.stderr,
        )
        return 2
    instance = dg.DagsterInstance.get()
    freed = free_dead_runs(instance)
    print("\n".join(freed) if freed else "no stuck run: every active run started here has a live process")
    for line in runs_seen_elsewhere(instance):
        print(line)
    return 0


def run_all(
    config_path: str,
    force: bool = False,
    sources: list[str] | None = None,
    comparisons: bool | None = None,
    refresh: bool = False,
) -> None:
    """Materialise what is missing or stale. Runs are recorded in the instance at $DAGSTER_HOME, or
    else in `dagster/` beside the catalog, so that the next run knows what is up to date."""
    import dagster as dg

    from moe_dag.orchestration.check_holds import HeldByCheck
    from moe_dag.orchestration.pipeline import UnknownSourceError, materialize_all

    if os.environ.get("DAGSTER_HOME"):
        instance = dg.DagsterInstance.get()
    else:
        home = _default_home(config_path)
        print(f"DAGSTER_HOME is not set: recording runs in {home}")
        instance = dg.DagsterInstance.local_temp(str(home))
    with instance:
        try:
            run = materialize_all(
                config_path,
                instance=instance,
                force=force,
                sources=sources,
                comparisons=comparisons,
                refresh=refresh,
            )
        except UnknownSourceError as error:
            raise SystemExit(f"moe-dag run: {error}") from error
        except HeldByCheck as error:
            raise SystemExit(f"moe-dag run: stopped by blocking checks:\n{error}") from None
    if run.launched:
        print(f"{len(run.launched)} asset partitions materialised in {run.seconds:.0f}s")


if __name__ == "__main__":
    sys.exit(main())
