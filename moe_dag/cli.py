"""The `moe-dag` command: build the demo corpus, run the whole graph, print what it did."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from moe_dag.config import CONFIG_ENV_VAR, DEFAULT_CONFIG, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moe-dag", description=__doc__)
    parser.add_argument(
        "--config", default=os.environ.get(CONFIG_ENV_VAR, DEFAULT_CONFIG), help="pipeline config YAML"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo-corpus", help="write the embedded demo corpus where the config's sources point")
    commands.add_parser("run", help="materialise every asset for every source, in process")
    commands.add_parser("summary", help="print documents kept per stage, dedup, heads, mixture and loss")
    commands.add_parser("demo", help="demo-corpus, then run, then summary")
    query = commands.add_parser("query", help="run SQL on the DuckDB catalog, read-only")
    query.add_argument("sql", help='e.g. "SELECT * FROM stage_funnel"')
    args = parser.parse_args(argv)

    if args.command in ("demo-corpus", "demo"):
        write_demo_corpus(args.config)
    if args.command in ("run", "demo"):
        run_all(args.config)
    if args.command == "query":
        print_query(args.config, args.sql)
    if args.command in ("summary", "demo"):
        from moe_dag.summary import format_summary

        print(format_summary(load_config(args.config)))
    return 0


def write_demo_corpus(config_path: str) -> None:
    from moe_dag.data.demo_corpus import build_demo_corpus

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


def print_query(config_path: str, sql: str) -> None:
    import duckdb

    config = load_config(config_path)
    with duckdb.connect(config.catalog_path, read_only=True) as con:
        con.sql(sql).show(max_width=160)


def run_all(config_path: str) -> None:
    import dagster as dg

    from moe_dag.pipeline import materialize_all

    instance = dg.DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else None
    seconds = materialize_all(config_path, instance=instance)
    print(f"whole graph materialised in {seconds:.0f}s")


if __name__ == "__main__":
    sys.exit(main())
