"""A new shard costs only its own work and leaves old decisions where they were (issue 21).

On the demo corpus (configs/demo.yaml, its lake, catalog and corpus moved to a temporary folder, the
comparisons off): a full run through `materialize_all`, then one new shard of 50 documents in one source
(documents the demo generator makes with another seed, none already in the corpus), then the same call
again on the same instance. Baseline: the full run, in the same script.

- `full_run_s`, `new_shard_run_s`, `ratio` (new shard over full run; goal <= 0.1);
- `old_decisions_changed`: documents of the first run whose keep or reason differs after the second, at
  every per-source stage that decides (goal 0);
- `assets_rematerialised`: what the second run materialised, as asset[partition].

    .venv/bin/python -m benchmarks.incremental [--source prose] [--documents 50] [--keep DIR]

Takes the time of two pipeline runs (about 25 minutes on two loaded cores). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
from pathlib import Path

import dagster as dg
import yaml
import zstandard

from benchmarks._smoke import parse_with_smoke
from moe_dag.curation.demo_corpus import DemoCorpusConfig, build_demo_corpus
from moe_dag.curation.fits import changed_decisions, decisions
from moe_dag.orchestration.pipeline import materialize_all
from moe_dag.storage.lake import Lake

REPOSITORY = Path(__file__).resolve().parent.parent
DECIDING_STAGES = ("prefiltered", "deduplicated", "toxicity_filtered", "scored_documents")
# --smoke: the demo's sections shrunk (tests/test_end_to_end.py's sizes), so both runs take seconds.
SMOKE_SECTIONS = {
    "demo_corpus": {"docs_per_source": 60, "docs_per_shard": 25},
    "oracle": {"per_source": 30},
    "heads": {"epochs": 1},
    "tokenizer": {"vocab_size": 512},
    "mixture": {"seq_len": 64, "total_tokens": 20_000, "heldout_fraction": 0.2, "heldout_min_documents": 5},
    "checks": {"min_head_f1": 0.0},
}
SMOKE_TRAINING = {"preset": "tiny", "steps": 4, "seed": 0}


def demo_config(folder: Path, smoke: bool) -> Path:
    """configs/demo.yaml with everything it writes or reads moved under `folder`, shrunk for --smoke."""
    raw = yaml.safe_load((REPOSITORY / "configs" / "demo.yaml").read_text())
    if smoke:
        for section, changes in SMOKE_SECTIONS.items():
            raw[section] = {**raw.get(section, {}), **changes}
        raw["training"] = SMOKE_TRAINING
    raw["lake_root"] = str(folder / "lake")
    raw["catalog_path"] = str(folder / "catalog.duckdb")
    raw["comparisons"] = False
    for source in raw["sources"]:
        source["shards"] = str(folder / "corpus" / source["name"])
    path = folder / "demo.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def shard_lines(folder: Path) -> list[dict]:
    """The JSON documents of every shard file in `folder` (gzip or zstd), malformed lines skipped."""
    documents = []
    for path in sorted(folder.glob("*.jsonl.*")):
        data = path.read_bytes()
        text = (gzip.decompress(data) if path.suffix == ".gz" else zstandard.decompress(data)).decode()
        for line in text.splitlines():
            try:
                document = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(document, dict) and document.get("text"):
                documents.append(document)
    return documents


def add_shard(folder: Path, source: str, documents: int, config: DemoCorpusConfig) -> int:
    """Write `documents` new documents of `source` (from the generator with another seed, none with a
    text or id already in the source) as one new shard; returns how many it wrote."""
    corpus = folder / "corpus" / source
    old = shard_lines(corpus)
    texts, ids = {d["text"] for d in old}, {d["id"] for d in old}
    other = folder / "other-seed"
    build_demo_corpus(other, DemoCorpusConfig(docs_per_source=config.docs_per_source, seed=config.seed + 1))
    new = [d for d in shard_lines(other / source) if d["text"] not in texts and d["id"] not in ids]
    new = [{**d, "id": f"new-{d['id']}"} for d in new[:documents]]
    lines = "".join(json.dumps(d) + "\n" for d in new)
    (corpus / f"{source}-new.jsonl.gz").write_bytes(gzip.compress(lines.encode(), mtime=0))
    return len(new)


def all_decisions(lake: Lake, sources: list[str]) -> dict[tuple[str, str], object]:
    return {
        (stage, source): decisions(lake, stage, source)
        for stage in DECIDING_STAGES
        for source in sources
        if lake.has_table(stage, source)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="prose")
    parser.add_argument("--documents", type=int, default=50)
    parser.add_argument(
        "--keep", type=Path, help="work in this folder and leave it (default: a temporary one)"
    )
    args = parse_with_smoke(parser, {"documents": 10})
    with tempfile.TemporaryDirectory(prefix="moe-dag-incremental-") as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        config_path = demo_config(folder, args.smoke)
        raw = yaml.safe_load(config_path.read_text())
        corpus_config = DemoCorpusConfig(**raw["demo_corpus"])
        build_demo_corpus(folder / "corpus", corpus_config)
        lake, sources = Lake(raw["lake_root"]), [s["name"] for s in raw["sources"]]
        instance = dg.DagsterInstance.ephemeral()

        started = time.perf_counter()
        materialize_all(str(config_path), instance=instance, comparisons=False)
        full_run_s = time.perf_counter() - started
        before = all_decisions(lake, sources)

        added = add_shard(folder, args.source, args.documents, corpus_config)
        started = time.perf_counter()
        run = materialize_all(str(config_path), instance=instance, comparisons=False)
        new_shard_run_s = time.perf_counter() - started
        after = all_decisions(lake, sources)

    changed = {
        f"{stage}[{source}]": changed_decisions(table, after[(stage, source)]).num_rows
        for (stage, source), table in before.items()
        if (stage, source) in after
    }
    print(
        json.dumps(
            {
                "bench": "incremental",
                "source": args.source,
                "documents_added": added,
                "full_run_s": round(full_run_s, 1),
                "new_shard_run_s": round(new_shard_run_s, 1),
                "ratio": round(new_shard_run_s / full_run_s, 3),
                "old_decisions_changed": sum(changed.values()),
                "old_decisions_changed_by_stage": {k: v for k, v in changed.items() if v},
                "assets_rematerialised": [f"{a}[{p}]" if p else a for a, p in run.launched],
            }
        )
    )


if __name__ == "__main__":
    main()
