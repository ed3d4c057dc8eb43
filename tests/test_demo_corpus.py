"""The demo corpus: deterministic bytes, every noise kind with its ground truth, a clean reader round trip."""

import collections
import gzip
import json
import struct
from pathlib import Path

import pytest
import zstandard

from moe_dag.curation.demo_corpus import DemoCorpusConfig, build_demo_corpus, gettext_text
from moe_dag.curation.demo_corpus.noise import NOISE_BY_SOURCE, TOO_LONG_WORDS, TOXIC_SENTENCES
from moe_dag.storage.readers import list_shards, read_shards

CONFIG = DemoCorpusConfig(docs_per_source=40, docs_per_shard=15)
SOURCES = ("code", "prose", "intl")
DOLMA_KEYS = {"id", "text", "source", "added", "created", "metadata"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("demo")
    return out, build_demo_corpus(out, CONFIG)


@pytest.fixture(scope="module")
def documents(corpus) -> dict[str, list[dict]]:
    out, _ = corpus
    docs = {}
    for source in SOURCES:
        rows = read_shards(list_shards(str(out / source)), source).documents.to_pylist()
        docs[source] = [{**row, "metadata": json.loads(row["metadata"])} for row in rows]
    return docs


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_byte_identical_files_and_a_rebuild_overwrites(corpus, tmp_path):
    out, manifest = corpus
    assert build_demo_corpus(tmp_path, CONFIG) == manifest
    assert _files(tmp_path) == _files(out)

    other = build_demo_corpus(tmp_path, DemoCorpusConfig(docs_per_source=40, docs_per_shard=40, seed=1))
    written = sorted(p for paths in other["shards"].values() for p in paths)
    assert sorted(name for name in _files(tmp_path) if name != "manifest.json") == written  # none stale
    assert _files(tmp_path)["code/code-0000.jsonl.zst"] != _files(out)["code/code-0000.jsonl.zst"]


def test_shards_alternate_zstd_and_gzip_and_hold_exact_dolma_records(corpus):
    out, manifest = corpus
    assert manifest["shards"]["code"] == [
        f"code/code-000{i}.jsonl.{'gz' if i % 2 else 'zst'}" for i in range(3)
    ]
    malformed = {(m["shard"], m["line"]) for m in manifest["malformed"]}
    for source in SOURCES:
        for shard in manifest["shards"][source]:
            data = (out / shard).read_bytes()
            if shard.endswith(".zst"):
                data = zstandard.ZstdDecompressor().stream_reader(data).read()
            else:
                data = gzip.decompress(data)
            lines = data.decode().splitlines()
            records = [json.loads(x) for i, x in enumerate(lines, 1) if (shard, i) not in malformed]
            assert all(set(r) == DOLMA_KEYS and r["source"] == f"moe-dag-demo/{source}" for r in records)


def test_reader_round_trip_accounts_for_every_line(corpus):
    out, manifest = corpus
    for source in SOURCES:
        result = read_shards(list_shards(str(out / source)), source)
        assert result.documents.num_rows == manifest["documents"][source] == CONFIG.docs_per_source
        assert result.documents.num_rows + result.quarantine.num_rows == manifest["lines"][source]
        planted = [(str(out / m["shard"]), m["line"]) for m in manifest["malformed"] if m["source"] == source]
        assert result.quarantine.select(["shard", "line"]).to_pylist() == [
            {"shard": shard, "line": line} for shard, line in planted
        ]
    errors = read_shards(list_shards(str(out / "prose")), "prose").quarantine["error"].to_pylist()
    assert errors[0].startswith("invalid JSON") or errors[1].startswith("invalid JSON")
    assert "missing field 'text'" in errors and manifest["malformed_lines"] == 2


def test_every_noise_kind_is_planted_and_recorded(corpus, documents):
    _, manifest = corpus
    for source in SOURCES:
        counted = collections.Counter(d["metadata"].get("demo_noise") for d in documents[source])
        del counted[None]
        assert set(counted) == set(NOISE_BY_SOURCE[source])
        assert counted == manifest["noise_by_source"][source]
        assert all(n == (1 if kind == "too_long" else 2) for kind, n in counted.items())  # 4% of 40
    assert sum(manifest["noise"].values()) == sum(
        sum(c.values()) for c in manifest["noise_by_source"].values()
    )


def test_noise_matches_its_ground_truth(documents):
    # `duplicate_of` holds the id as written in the shard; ingest prefixes it with the source.
    by_id = {d["id"].removeprefix(f"{d['source']}/"): d for docs in documents.values() for d in docs}
    for source, docs in documents.items():
        for doc in docs:
            kind, text = doc["metadata"].get("demo_noise"), doc["text"]
            original = by_id.get(doc["metadata"].get("duplicate_of", ""))
            if kind == "exact_duplicate":
                assert text == original["text"] and original["source"] == source
            elif kind == "cross_source_duplicate":
                assert text == original["text"] and original["source"] == "prose" != source
            elif kind == "near_duplicate":
                words, original_words = text.split(), original["text"].split()
                assert text != original["text"] and len(set(words) & set(original_words)) > 0.9 * len(
                    set(words)
                )
            elif kind == "non_english":
                assert doc["metadata"]["language"] != "en"
            elif kind == "too_short":
                assert 3 <= len(text.split()) <= 8
            elif kind == "too_long":
                assert len(text.split()) >= TOO_LONG_WORDS
            elif kind == "toxic":
                assert any(sentence in text.lower() for sentence in TOXIC_SENTENCES)
            elif kind == "boilerplate":
                lines = [line for line in text.splitlines() if line.strip()]
                assert 1 - len(set(lines)) / len(lines) > 0.3
            else:
                assert kind is None and "duplicate_of" not in doc["metadata"]


def test_ids_are_unique_and_machine_independent(documents):
    ids = [d["id"] for docs in documents.values() for d in docs]
    assert len(ids) == len(set(ids))
    for source, docs in documents.items():
        for doc in docs:
            assert doc["id"].startswith(f"{source}/") and "//" not in doc["id"]
            assert not any(part in doc["id"] for part in ("/usr/", "/home/", "/root/", "/tmp/", ".venv"))
    languages = {d["metadata"]["language"] for d in documents["intl"] if "demo_noise" not in d["metadata"]}
    assert len(languages) > 5 and "en" not in languages


def test_the_corpus_reads_nothing_of_moe_dags_own_installation():
    """Its README (the package description) and an editable install's files (the checkout's path)
    change with every edit and clone: the corpus, and every figure measured on it, must not."""
    import random

    from moe_dag.curation.demo_corpus.python_text import _readme_documents, python_files

    assert not [f.relative for f in python_files() if f.relative.startswith("__editable__")]
    packages = {doc.metadata["package"] for doc in _readme_documents(random.Random(0))}
    assert packages and not packages & {"moe_dag", "moe-dag"}


def test_toxic_sentences_are_flagged_by_the_profanity_classifier():
    from profanity_check import predict_prob

    assert min(predict_prob(list(TOXIC_SENTENCES))) > 0.9


def test_config_rejects_too_few_documents():
    with pytest.raises(ValueError, match="docs_per_source"):
        DemoCorpusConfig(docs_per_source=5)


def _mo_file(messages: dict[bytes, bytes]) -> bytes:
    """A little-endian GNU .mo file holding `messages` (msgid -> msgstr), the header included."""
    keys = sorted(messages)
    strings = b"".join(k + b"\0" for k in keys) + b"".join(messages[k] + b"\0" for k in keys)
    header_size, n = 28, len(keys)
    data_at = header_size + 16 * n
    originals, translations, offset = [], [], data_at
    for k in keys:
        originals.append((len(k), offset))
        offset += len(k) + 1
    for k in keys:
        translations.append((len(messages[k]), offset))
        offset += len(messages[k]) + 1
    tables = b"".join(struct.pack("<2I", *entry) for entry in originals + translations)
    return struct.pack("<7I", 0x950412DE, 0, n, header_size, header_size + 8 * n, 0, 0) + tables + strings


def test_mo_parser_reads_contexts_plurals_and_the_charset(tmp_path):
    path = tmp_path / "demo.mo"
    path.write_bytes(
        _mo_file(
            {
                b"": b"Content-Type: text/plain; charset=ISO-8859-1\n",
                b"menu\x04Open": "Öffnen".encode("latin-1"),
                b"%d file\x00%d files": b"%d Datei\x00%d Dateien",
            }
        )
    )
    assert sorted(gettext_text.read_mo_messages(path)) == [("%d file", "%d Datei"), ("Open", "Öffnen")]


def test_catalogues_fall_back_to_site_packages_then_fail_clearly(tmp_path, monkeypatch):
    system, packages = tmp_path / "system", tmp_path / "site-packages"
    (system / "en_GB/LC_MESSAGES").mkdir(parents=True)
    (system / "en_GB/LC_MESSAGES/app.mo").write_bytes(_mo_file({b"Colour": b"Colour"}))
    monkeypatch.setattr(gettext_text, "SYSTEM_LOCALE_DIRS", (system,))
    monkeypatch.setattr(gettext_text, "site_packages_dirs", lambda: [packages])
    with pytest.raises(gettext_text.NoNonEnglishTextError, match="non-English"):
        gettext_text.find_catalogues()

    shipped = packages / "somepkg/locale/fr/LC_MESSAGES/somepkg.mo"
    shipped.parent.mkdir(parents=True)
    shipped.write_bytes(_mo_file({b"The file could not be opened": b"Le fichier n'a pas pu etre ouvert"}))
    assert gettext_text.find_catalogues() == {"fr": [shipped]}
