"""The mixture's sequence map (sequences.parquet): each packed row's pieces of documents, recomputed here
from the token shards and the plan alone, and checked token for token against train.npy."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from moe_dag.mixture import TokenShard, build_mixture
from moe_dag.mixture import build as mixture_build
from moe_dag.mixture.build import PLAN_FILE, SEQUENCES_FILE, SHARDS_DIR, TRAIN_FILE
from tests.test_mixture import CONFIG, corpus  # noqa: F401 - the module's corpus fixture


def pieces_from_shards(out_dir, sources: list[str]) -> list[tuple]:
    """(sequence, position, source, document id, token start, token end) walked draw by draw through the
    plan, one row boundary at a time: the map as the packing must have made it."""
    shards = {source: TokenShard.open(out_dir / SHARDS_DIR, source) for source in sources}
    rows, row = np.load(out_dir / TRAIN_FILE, mmap_mode="r").shape
    stream_end = rows * row
    pieces, at = [], 0
    for column, document in np.load(out_dir / PLAN_FILE):
        shard = shards[sources[column]]
        length, done = int(shard.lengths[document]), 0
        while done < length and at < stream_end:
            sequence, position = divmod(at, row)
            taken = min(length - done, row - position, stream_end - at)
            identifier = shard.ids[int(document)].as_py()
            pieces.append((sequence, position, sources[column], identifier, done, done + taken))
            done, at = done + taken, at + taken
    return pieces


def test_sequence_map_matches_the_shards_and_train_rows(corpus, tmp_path, monkeypatch):  # noqa: F811
    documents, tokenizer = corpus
    # Chunks of a few rows, so pieces are cut at chunk edges too.
    monkeypatch.setattr(mixture_build, "PACK_CHUNK_TOKENS", 5 * (CONFIG.seq_len + 1))
    report = build_mixture(documents, tokenizer, CONFIG, tmp_path)
    table = pq.read_table(tmp_path / SEQUENCES_FILE)
    assert table.schema == mixture_build.SEQUENCES_SCHEMA
    mapped = list(zip(*(table[name].to_pylist() for name in table.column_names), strict=True))
    assert mapped == pieces_from_shards(tmp_path, report["source_columns"])

    train = np.load(tmp_path / TRAIN_FILE, mmap_mode="r")
    shards = {source: TokenShard.open(tmp_path / SHARDS_DIR, source) for source in report["source_columns"]}
    index = {source: {i: n for n, i in enumerate(shard.ids.to_pylist())} for source, shard in shards.items()}
    rebuilt = np.zeros_like(train)
    for sequence, position, source, identifier, start, end in mapped:
        tokens = shards[source].document(index[source][identifier])[start:end]
        rebuilt[sequence, position : position + len(tokens)] = tokens
    assert np.array_equal(rebuilt, train)
    assert sorted(set(table["sequence"].to_pylist())) == list(range(report["num_sequences"]))


def test_the_map_does_not_depend_on_the_chunking(corpus, tmp_path, monkeypatch):  # noqa: F811
    documents, tokenizer = corpus
    built = []
    for chunk_rows in (1, 1000):
        monkeypatch.setattr(mixture_build, "PACK_CHUNK_TOKENS", chunk_rows * (CONFIG.seq_len + 1))
        out_dir = tmp_path / str(chunk_rows)
        build_mixture(documents, tokenizer, CONFIG, out_dir)
        built.append((out_dir / SEQUENCES_FILE).read_bytes())
    assert built[0] == built[1]
