"""Every measured figure in README.md and docs/ comes from benchmarks/results/ (issue 30).

A page quotes a measured figure only inside a block that benchmarks/run_all.py generates from the
records (`<!-- figures: NAME:KEYS (generated ...) -->` ... `<!-- end figures -->`). This checks both
halves: each block is what run_all would render from the committed records now, and no text outside
the blocks looks like a measurement (a speed ratio, a timing, a rate, a load average, a measured
percentage or quality score, a commit hash, a /tmp path of some run). The patterns are tight enough
that configuration values, documented constants and goals (`min_words: 50`, `keep_rate 0.7`, `>= 0.98`)
pass. There is no allow-list: every page passes with its settings, constants and estimates worded as
such (an estimate as a formula in a recorded key). Should a page ever need a measured-looking string that
is no measurement, add a list of (page, text, why) here rather than loosen a pattern.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import run_all

ROOT = Path(__file__).resolve().parents[1]

# What a measurement looks like in prose. Each pattern is named so that a failure says what it saw.
MEASURED = {
    "speed ratio": r"\b\d+\.\d+ ?[x×](?![\w.])(?! 10\^)|\b\d+ ?[x×] (?:faster|slower)\b",
    "timing": (
        r"\b\d+\.\d+ ?(?:ms|s|min|h)\b|\b\d[\d,]* ?ms\b|\b\d+ ?min \d+ ?s\b"
        r"|\b(?:took|takes|take|taking|passed in|ran in|runs in|finished in|about|~) ?\d[\d,.]*"
        r" ?(?:s|sec|seconds?|min|minutes?|h|hours?)\b"
        r"|\b\d[\d,.]* (?:of \d[\d,.]* )?(?:CPU|wall) (?:s|seconds?)\b"
    ),
    "rate": (
        r"\b\d[\d,.]* ?(?:it/s|steps/s|tokens/s|tokens per second|docs/s|GB/s|TB/s|TFLOP/s"
        r"|(?:docs|documents|signatures) per (?:CPU |core-)?s(?:ec(?:ond)?)?)\b"
    ),
    "MFU": r"\d%? (?:\w+ ){0,2}MFU\b|\bMFU (?:of |at |was |is )?\d",
    "load average": r"\bload(?: averages?)?(?: of| at| about| around)? ?~?\d",
    "measured percentage": (
        r"\b\d+\.\d+%|\b\d+% (?:\w+ ){0,4}?(?:saved|changed|faster|slower|of HBM|of (?:the )?(?:CPU )?time)\b"
    ),
    "quality score": (
        r"\b(?:F1|precision|recall|accuracy|agreement|Spearman|spearman_loo|efficiency_vs_dense)\b"
        r"[^.\n|;]{0,24}?\b0\.\d{2,}|\b\d+\.\d+ (?:bits per byte|bpb|nats)\b|\bloss(?:es)? \d+\.\d{2,}"
        # a table cell holding only a score or a rate, as hand-copied result tables do
        r"|\| ~?\d[\d,]*\.\d{3,} \|"
    ),
    "measured memory": r"\bpeak (?:RSS|memory|GPU memory)\b[^.\n|]{0,24}?\d|\b\d+\.\d+ ?(?:GiB|MiB)\b",
    "commit hash": r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b",
    "/tmp path of a run": r"(?<![\w./])/tmp/",
}
PATTERN = re.compile("|".join(f"(?P<g{i}>{regex})" for i, regex in enumerate(MEASURED.values())))
NAMES = list(MEASURED)
# Words just before a figure (or inside its match: `precision >= 0.98`) that make it a goal, a limit or a
# timeout setting (`within the timeouts (connect 5.0 s, read 10.0 s` quotes an error message's settings).
GOAL = re.compile(r"\b(?:goal|target|at most|at least|no more than|within|limit|timeouts?)\b|>=|<=|≥|≤")
GOAL_WINDOW = 40  # characters before a figure searched for those words


def outside_blocks(text: str) -> str:
    """The page with each generated block blanked, line breaks kept so that line numbers still hold."""
    return run_all.BLOCK.sub(lambda block: re.sub(r"[^\n]", " ", block[0]), text)


def hand_written_figures(page: str, text: str) -> list[str]:
    found = []
    for number, line in enumerate(outside_blocks(text).replace("**", "").splitlines(), start=1):
        for match in PATTERN.finditer(line):
            if GOAL.search(line[max(0, match.start() - GOAL_WINDOW) : match.end()]):
                continue
            kind = NAMES[int(match.lastgroup[1:])]
            found.append(f"{page}:{number}: {kind} {match[0]!r} in: {line.strip()[:160]}")
    return found


PAGES = [str(page.relative_to(ROOT)) for page in run_all.pages()]


@pytest.mark.parametrize("page", PAGES)
def test_every_block_is_rendered_from_the_committed_records(page: str) -> None:
    text = (ROOT / page).read_text()
    for block in run_all.blocks(text):
        expected = run_all.render_block(block["spec"])
        assert block[0] == expected, (
            f"{page}: the block `{block['spec']}` differs from the records; "
            "`make figures` (python -m benchmarks.run_all --render) rewrites it"
        )


@pytest.mark.parametrize("page", PAGES)
def test_no_measured_figure_outside_a_generated_block(page: str) -> None:
    found = hand_written_figures(page, (ROOT / page).read_text())
    assert not found, (
        "measured figures written by hand (put them in a `<!-- figures: NAME:KEYS ... -->` block rendered "
        "by benchmarks/run_all.py from a record, or remove them):\n" + "\n".join(found)
    )


def test_the_patterns_catch_hand_copied_figures_and_pass_settings() -> None:
    measured = [
        "commit f080db4, 4,647 docs / CPU s against 119, 39x faster",
        "two gloo processes took 531 ms per step",
        "1,641 GB/s (**34%** of HBM)",
        "bf16 80,902 tokens/s, MFU 16.3%",
        "at load ~25 the rates fell",
        "**21.1% of backbone layer compute saved**",
        "keep F1 judge **0.833**, probe 0.821",
        "`make test` 13 min 18 s on a fresh clone",
        "the search wrote to /tmp/lead/ms_official2",
        "a ratio of 1.44x rensa",
        "most of the set-up's time (48 of 57 CPU seconds)",
        "| lid.176 | 176 | 0.802 | 0.761 |",
        "against 856 s at commit 563846e under load 10-15",
    ]
    settings = [
        "`min_words: 50`, `keep_rate 0.7`, muP multipliers 10.66 and 0.125",
        "goal: ratio >= 1.2 and precision >= 0.98",
        "dedup.num_bands: must be in [1, 1024], got 1000000000",
        "a 16 x 128 batch, 14 x 8 bands, at 4x and 16x the corpus",
        "the reaper runs every 60 s; the test holds it to 30 s and 400 MB",
        "a 95% bootstrap interval; at most 1% of its exits",
        "names such as ../../../tmp/x are refused",
        "no reply within the timeouts (connect 5.0 s, read 10.0 s, 2 attempts)",
        "~1.6 x 10^9 documents",
    ]
    for line in measured:
        assert hand_written_figures("page", line), line
    for line in settings:
        assert not hand_written_figures("page", line), (line, hand_written_figures("page", line))


def test_a_block_is_rendered_from_the_newest_record_with_seeds_as_a_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(run_all, "RESULTS", results)
    monkeypatch.setattr(run_all, "pages", lambda: [tmp_path / "README.md", tmp_path / "page.md"])
    run_all.history("mixture_search").append(
        {
            "recorded_at": "2026-12-05T10:00:00+00:00",
            "commit": "0" * 40,
            "dirty": [],
            "machine": {"cores": 2, "load_average_before": [1.5, 1, 1]},
            "command": ["python", "-m", "benchmarks.mixture_search"],
            "wall_s": 12.0,
            "result": {
                "bench": "mixture_search",
                "spearman_loo": [0.7, 0.9, 0.8],
                "fit": {"model": "linear"},
            },
        }
    )
    stale = (
        "intro\n\n<!-- figures: mixture_search:spearman_loo,fit.model,gone (generated by "
        "benchmarks/run_all.py from benchmarks/results/) -->\nold figures\n<!-- end figures -->\n\ntail\n"
    )
    (tmp_path / "README.md").write_text(stale)
    (tmp_path / "page.md").write_text("no blocks\n")

    assert run_all.render_pages() == [tmp_path / "README.md"]

    page = (tmp_path / "README.md").read_text()
    assert page.startswith("intro\n\n") and page.endswith("<!-- end figures -->\n\ntail\n")
    assert "old figures" not in page and "benchmarks/results/mixture_search.jsonl) -->" in page
    assert (
        "`spearman_loo` median 0.8, spread 0.7 to 0.9 (3 values: 0.7, 0.8, 0.9)" not in page
    )  # recorded order
    assert "`spearman_loo` median 0.8, spread 0.7 to 0.9 (3 values: 0.7, 0.9, 0.8)" in page
    assert "`fit.model` linear; `gone` not in this record" in page
    assert "2026-12-05, commit 0000000, 2 cores at load 1.5, 12 s" in page
    assert run_all.render_pages() == []  # rendering is idempotent


def test_a_malformed_block_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_all, "pages", lambda: [tmp_path / "README.md"])
    (tmp_path / "README.md").write_text("<!-- figures: nosuch (generated by benchmarks/run_all.py) -->\n")
    with pytest.raises(ValueError, match="README.md"):
        run_all.render_pages()
