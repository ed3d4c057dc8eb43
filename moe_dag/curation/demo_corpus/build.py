"""Build the demo corpus: three Dolma-format sources of real text with deterministic injected noise.

Layout written under `out_dir` (the shard locations of configs/demo.yaml):

    <source>/<source>-0000.jsonl.zst, <source>-0001.jsonl.gz, ...   (zstd and gzip alternate)
    manifest.json                                                   (counts: the ground truth)

The same machine and seed give byte-identical files: inputs are listed in sorted order, every random
choice comes from an RNG seeded by (seed, purpose), timestamps are fixed or derived from the document
id, and gzip headers carry no time or file name. Rebuilding overwrites the shards and removes any
left from a build with more shards.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard
from tqdm.auto import tqdm

from moe_dag.curation.demo_corpus import noise
from moe_dag.curation.demo_corpus.documents import DemoDoc
from moe_dag.curation.demo_corpus.gettext_text import intl_documents
from moe_dag.curation.demo_corpus.python_text import code_documents, prose_documents
from moe_dag.storage.atomic import atomic_path

SOURCES = ("code", "prose", "intl")
STYLE: dict[str, noise.Style] = {"code": "code", "prose": "web", "intl": "web"}
DOLMA_SOURCE_PREFIX = "moe-dag-demo"
ADDED = "2025-01-01T00:00:00Z"
CREATED_FROM, CREATED_SPAN_S = dt.datetime(2015, 1, 1, tzinfo=dt.UTC), 10 * 365 * 86_400
MALFORMED_SOURCE = "prose"  # its first shard gets the planted malformed lines
MIN_DOCS_PER_SOURCE = 20
NEAR_DUPLICATE_MIN_WORDS = 100  # below this, the minimum two edits could take 5-gram Jaccard under 0.8
ZSTD_LEVEL = 3


@dataclass(kw_only=True)
class DemoCorpusConfig:
    """Size, seed and noise of the demo corpus (the `demo_corpus` section of the pipeline config)."""

    docs_per_source: int = 1000
    seed: int = 0
    docs_per_shard: int = 250
    noise_rate: float = 0.04  # share of a source's documents per noise kind

    def __post_init__(self) -> None:
        if self.docs_per_source < MIN_DOCS_PER_SOURCE:
            raise ValueError(
                f"docs_per_source must be at least {MIN_DOCS_PER_SOURCE} so clean documents outnumber the "
                f"injected noise, got {self.docs_per_source}"
            )
        if self.docs_per_shard < 1:
            raise ValueError(f"docs_per_shard must be positive, got {self.docs_per_shard}")
        if not 0 <= self.noise_rate <= 0.06:
            raise ValueError(f"noise_rate must be between 0 and 0.06 per kind, got {self.noise_rate}")


def build_demo_corpus(out_dir: Path, config: DemoCorpusConfig) -> dict[str, Any]:
    """Write the demo corpus and its manifest under `out_dir`; return the manifest.

    Manifest keys: `documents`, `lines` (documents plus malformed lines) and `shards` per source,
    `noise` (documents per noise kind), `noise_by_source`, `malformed` (source, shard, line and kind of
    each planted line: "invalid_json" or "missing_text"), `malformed_lines`, and the `config`.
    """
    out_dir = Path(out_dir)
    documents = _documents(config)
    manifest: dict[str, Any] = {
        "config": dataclasses.asdict(config),
        "documents": {},
        "lines": {},
        "shards": {},
        "noise_by_source": {},
        "malformed": [],
    }
    for source in tqdm(SOURCES, desc="write demo corpus", unit="source", disable=None):
        docs = documents[source]
        kinds = [doc.metadata.get("demo_noise") for doc in docs]
        manifest["noise_by_source"][source] = {k: kinds.count(k) for k in noise.NOISE_KINDS if k in kinds}
        malformed_rng = random.Random(f"{config.seed}/{source}/malformed")
        shards, malformed = _shard_lines(source, docs, config, malformed_rng)
        manifest["shards"][source] = _write_shards(out_dir, source, shards)
        manifest["malformed"] += [{"source": source, **m} for m in malformed]
        manifest["documents"][source] = len(docs)
        manifest["lines"][source] = sum(len(lines) for lines in shards)
    manifest["noise"] = {
        kind: total
        for kind in noise.NOISE_KINDS
        if (total := sum(counts.get(kind, 0) for counts in manifest["noise_by_source"].values()))
    }
    manifest["malformed_lines"] = len(manifest["malformed"])
    _write_atomic(out_dir / "manifest.json", (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    return manifest


def _documents(config: DemoCorpusConfig) -> dict[str, list[DemoDoc]]:
    """Each source's documents, clean and noisy, in their shuffled shard order."""

    def rng(purpose: str) -> random.Random:
        return random.Random(f"{config.seed}/{purpose}")

    seen: set[str] = set()  # across sources, so no clean document repeats another by accident
    pools = {
        "code": _unseen(code_documents(rng("code")), seen),
        "prose": _unseen(prose_documents(rng("prose")), seen),
        "intl": _unseen(intl_documents(rng("intl")), seen),
    }
    counts = {s: noise.noise_counts(s, config.docs_per_source, config.noise_rate) for s in SOURCES}
    clean = {s: _take(pools[s], config.docs_per_source - sum(counts[s].values()), s) for s in SOURCES}
    documents = {}
    for source in SOURCES:
        docs = list(clean[source])
        noise_rng = rng(f"{source}/noise")
        for kind, count in counts[source].items():
            for _ in range(count):
                text, metadata, duplicate_of = _noisy(kind, source, clean, pools, noise_rng)
                metadata = {**metadata, "demo_noise": kind}
                if duplicate_of is not None:
                    metadata["duplicate_of"] = duplicate_of
                # An opaque id: a filter has to find the noise from the text, not from the id.
                digest = hashlib.sha1(f"{kind}/{len(docs)}/{text}".encode()).hexdigest()[:16]
                docs.append(DemoDoc(id=f"{source}/doc-{digest}", text=text, metadata=metadata))
        rng(f"{source}/order").shuffle(docs)
        documents[source] = docs
    return documents


def _noisy(
    kind: str,
    source: str,
    clean: dict[str, list[DemoDoc]],
    pools: dict[str, Iterator[DemoDoc]],
    rng: random.Random,
) -> tuple[str, dict[str, Any], str | None]:
    """One noisy document of `kind`: its text, the metadata it inherits, the id it duplicates (if any)."""
    own, style = clean[source], STYLE[source]
    if kind == "exact_duplicate":
        original = rng.choice(own)
        return original.text, original.metadata, original.id
    if kind == "near_duplicate":
        original = rng.choice([d for d in own if d.num_words >= NEAR_DUPLICATE_MIN_WORDS] or own)
        return noise.near_duplicate_text(rng, original.text), original.metadata, original.id
    if kind == "cross_source_duplicate":
        original = rng.choice(clean["prose"])
        return original.text, original.metadata, original.id
    if kind == "non_english":
        fresh = _take(pools["intl"], 1, "intl")[0]
        return fresh.text, fresh.metadata, None
    if kind == "too_long":
        return noise.too_long_text([d.text for d in own]), {}, None
    # The remaining kinds damage a document that is not in the corpus, so they duplicate nothing.
    fresh = _take(pools[source], 1, source)[0]
    if kind == "too_short":
        return noise.too_short_text(rng, fresh.text), fresh.metadata, None
    if kind == "boilerplate":
        return noise.boilerplate_text(rng, fresh.text, style), fresh.metadata, None
    if kind == "toxic":
        return noise.toxic_text(rng, fresh.text, style), fresh.metadata, None
    raise AssertionError(f"unknown noise kind {kind!r}")


def _shard_lines(
    source: str, docs: list[DemoDoc], config: DemoCorpusConfig, rng: random.Random
) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """The JSON lines of each shard, and where the malformed lines went (in MALFORMED_SOURCE only)."""
    records = [_dolma_record(source, doc) for doc in docs]
    lines = [json.dumps(r, ensure_ascii=False, sort_keys=True, separators=(",", ":")) for r in records]
    shards = [lines[i : i + config.docs_per_shard] for i in range(0, len(lines), config.docs_per_shard)]
    if source != MALFORMED_SOURCE:
        return shards, []
    no_text = {k: v for k, v in records[-1].items() if k != "text"} | {"id": f"{source}/doc-no-text"}
    planted = {
        "invalid_json": lines[0][: len(lines[0]) // 2],  # a write that stopped half way
        "missing_text": json.dumps(no_text, sort_keys=True, separators=(",", ":")),
    }
    for line in planted.values():
        shards[0].insert(rng.randint(0, len(shards[0])), line)
    where = [
        {"shard": f"{source}/{_shard_name(source, 0)}", "line": shards[0].index(line) + 1, "kind": kind}
        for kind, line in planted.items()
    ]
    return shards, sorted(where, key=lambda m: m["line"])


def _dolma_record(source: str, doc: DemoDoc) -> dict[str, Any]:
    # Derived from the id, not drawn: a document keeps its timestamp whatever else the corpus holds.
    offset_s = int(hashlib.sha1(doc.id.encode()).hexdigest()[:12], 16) % CREATED_SPAN_S
    created = CREATED_FROM + dt.timedelta(seconds=offset_s)
    return {
        "id": doc.id,
        "text": doc.text,
        "source": f"{DOLMA_SOURCE_PREFIX}/{source}",
        "added": ADDED,
        "created": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "metadata": doc.metadata,
    }


def _write_shards(out_dir: Path, source: str, shards: list[list[str]]) -> list[str]:
    """Write a source's shards, remove those a larger earlier build left, return the relative paths."""
    folder = out_dir / source
    folder.mkdir(parents=True, exist_ok=True)
    names = [_shard_name(source, i) for i in range(len(shards))]
    for name, lines in zip(names, shards, strict=True):
        data = ("\n".join(lines) + "\n").encode("utf-8")
        if name.endswith(".zst"):
            data = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data)
        else:
            data = gzip.compress(data, mtime=0)  # no timestamp in the header: same bytes on every build
        _write_atomic(folder / name, data)
    for stale in folder.glob(f"{source}-*.jsonl.*"):
        if stale.name not in names:
            stale.unlink()
    return [f"{source}/{name}" for name in names]


def _shard_name(source: str, index: int) -> str:
    # Both compressions alternate so every demo run exercises both readers.
    return f"{source}-{index:04d}.jsonl.zst" if index % 2 == 0 else f"{source}-{index:04d}.jsonl.gz"


def _write_atomic(path: Path, data: bytes) -> None:
    with atomic_path(path) as partial:
        partial.write_bytes(data)


def _unseen(docs: Iterator[DemoDoc], seen: set[str]) -> Iterator[DemoDoc]:
    for doc in docs:
        key = hashlib.sha1(" ".join(doc.text.split()).encode()).hexdigest()
        if key not in seen:
            seen.add(key)
            yield doc


def _take(pool: Iterator[DemoDoc], n: int, source: str) -> list[DemoDoc]:
    docs = [doc for _, doc in zip(range(n), pool, strict=False)]
    if len(docs) < n:
        raise ValueError(
            f"this machine has too little {source} text for the demo corpus: needed {n} more documents, "
            f"found {len(docs)}; lower docs_per_source"
        )
    return docs
