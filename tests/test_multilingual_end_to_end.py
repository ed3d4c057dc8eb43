"""Every language of a multilingual source survives the whole graph at default curation settings (issue 20).

The fixture (tests/fixtures/multilingual/, provenance in its build.py) holds the same documents in 22
languages and 9 scripts, every sentence an English original or a translator's translation from the
GNOME gettext catalogues. The source declares only its kind and that it accepts any language; every
curation rule and threshold (prefilter, dedup, toxicity, oracle, calibration) is the default. The heads
and the training run are shrunk to test size as in test_end_to_end.py (the demo's narrow judge, three
epochs), which changes how well the heads learn, not what the rules keep.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pytest
import yaml

from moe_dag.config import load_config
from moe_dag.orchestration.pipeline import materialize_all
from moe_dag.storage.catalog import Catalog
from moe_dag.storage.lake import Lake

FIXTURE = Path(__file__).parent / "fixtures" / "multilingual" / "gettext_parallel.jsonl.gz"
KEEP_RATE = 0.7
MAX_SHARE_GAP = 0.15


def multilingual_config(tmp_path: Path) -> Path:
    shards = tmp_path / "corpus" / "gettext"
    shards.mkdir(parents=True)
    shutil.copy(FIXTURE, shards / FIXTURE.name)
    raw = {
        "lake_root": str(tmp_path / "lake"),
        "catalog_path": str(tmp_path / "catalog.duckdb"),
        "sources": [
            {
                "name": "gettext",
                "kind": "web",
                "shards": str(shards),
                "languages": [],
                "keep_rate": KEEP_RATE,
                "mixture_weight": 1.0,
            }
        ],
        "oracle": {"backend": "rules", "per_source": 150},
        "heads": {"epochs": 3, "judge": {"d_model": 128, "n_layers": 1, "n_heads": 4}},
        "tokenizer": {"vocab_size": 512},
        "mixture": {"seq_len": 64, "total_tokens": 20_000},
        "training": {"preset": "tiny", "steps": 12, "seed": 0},
        "comparisons": False,
    }
    path = tmp_path / "multilingual.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    return path


PER_LANGUAGE_SQL = """
SELECT json_extract_string(r.metadata, '$.language') AS language, count(*) AS documents,
       count(s.id) FILTER (WHERE s.keep) AS kept
FROM raw_documents r LEFT JOIN scored_documents s USING (id)
GROUP BY 1 ORDER BY 1
"""


@pytest.fixture(scope="module")
def kept_shares(tmp_path_factory, local_ray) -> tuple[dict[str, float], float]:
    """The whole graph on the fixture, once: each language's kept share and the source's."""
    config_path = multilingual_config(tmp_path_factory.mktemp("multilingual"))
    config = load_config(config_path)
    materialize_all(str(config_path), instance=dg.DagsterInstance.ephemeral(), log=lambda _: None)
    rows = Catalog(config.catalog_path, Lake(config.lake_root)).query(PER_LANGUAGE_SQL)
    shares = {language: kept / documents for language, documents, kept in rows}
    return shares, sum(kept for *_, kept in rows) / sum(documents for _, documents, _ in rows)


@pytest.mark.slow
def test_every_language_survives_the_whole_graph(kept_shares):
    shares, _ = kept_shares
    assert len(shares) == 22
    lost = sorted(language for language, share in shares.items() if share == 0)
    assert not lost, f"languages that lost every document: {lost} ({shares})"


@pytest.mark.slow
def test_every_language_keeps_close_to_the_source_keep_rate(kept_shares):
    shares, source_rate = kept_shares
    far = {
        lang: round(share, 2) for lang, share in shares.items() if abs(share - source_rate) > MAX_SHARE_GAP
    }
    assert not far, f"kept shares more than {MAX_SHARE_GAP} from the source's {source_rate:.2f}: {far}"
