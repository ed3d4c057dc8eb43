"""Toxicity reads a long document as a whole (issue 20, item 3).

Before the fix one line above the 0.5 cut dropped any document: a neutral 40-line text under the heading
"Rear naked choke" (line probability 0.76), "Petals on a wet, black bough." (0.77) or "Prelude canyon
battle" (0.54) was dropped whole.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from moe_dag.curation.filters import ToxicityConfig, build_toxicity_filters, run_filters

NEUTRAL_LINES = (
    "The river runs through the old town and past the mill where bread was baked for centuries.",
    "Every morning the baker opened the shutters, lit the oven and greeted the first customers by name.",
    "Children walked along the water on their way to school, counting the boats tied to the posts.",
    "In winter the surface sometimes froze, and the whole village came out to skate under the lanterns.",
    "Visitors still come to see the old wheel turn, and the bakery sells bread from the same recipe.",
)
NEUTRAL_DOCUMENT = "\n".join(f"{NEUTRAL_LINES[i % 5]} (note {i + 1})" for i in range(40))
# Classifier probabilities: 0.94 (under the high bar), 0.987 (above it).
MODERATE_INSULT = "You are such a loser, nobody wants you here."
BLUNT_LINE = "This is a dumb and useless answer."


def decide(text: str, config: ToxicityConfig | None = None, kind: str = "web") -> dict:
    filters = build_toxicity_filters(config or ToxicityConfig(), kind)
    return run_filters(pa.table({"text": [text]}), filters)[0].to_pylist()[0]


@pytest.mark.parametrize(
    "heading", ["Rear naked choke", "Petals on a wet, black bough.", "Prelude canyon battle"]
)
def test_one_odd_heading_does_not_drop_a_long_neutral_document(heading):
    row = decide(f"{heading}\n{NEUTRAL_DOCUMENT}")
    assert row["keep"], row
    assert row["toxic_lines"] == 1 and 0.5 < row["toxicity_max"] < 0.9  # scored, and above the line cut


def test_a_long_document_drops_when_toxic_content_is_more_than_the_share():
    lines = NEUTRAL_DOCUMENT.split("\n")[:8]
    ranting = "\n".join(f"{line}\n{MODERATE_INSULT}" for line in lines)
    row = decide(ranting)
    assert row["reason"] == "toxic_lines" and row["toxic_share"] > ToxicityConfig().max_toxic_share
    assert row["toxicity_max"] < ToxicityConfig().single_line_probability  # the share alone drops it
    assert decide(ranting, ToxicityConfig(max_toxic_share=0.6))["keep"]


def test_a_single_line_above_the_high_bar_drops_a_long_document():
    text = NEUTRAL_DOCUMENT + "\n" + BLUNT_LINE
    row = decide(text)
    assert row["reason"] == "toxic_lines" and row["toxic_share"] < ToxicityConfig().max_toxic_share
    assert row["toxicity_max"] > ToxicityConfig().single_line_probability
    assert decide(text, ToxicityConfig(single_line_probability=0.99))["keep"]


def test_a_short_text_is_still_read_whole():
    row = decide("you moron\nshut up\npathetic loser")
    assert row["reason"] == "toxic_lines"


def test_code_keeps_its_two_line_rule():
    code = "def stop(pid: int) -> None:\n    os.kill(pid, 9)\n" * 10
    assert decide(code + "# you are a stupid worthless idiot\n", kind="code")["keep"]
    two = code + "# you are a stupid worthless idiot\n# shut up you moron, this is crap\n"
    assert decide(two, kind="code")["reason"] == "toxic_lines"


def test_config_refuses_shares_and_bars_out_of_range():
    with pytest.raises(ValueError, match="max_toxic_share"):
        ToxicityConfig(max_toxic_share=1.0)
    with pytest.raises(ValueError, match="single_line_probability"):
        ToxicityConfig(single_line_probability=1.0)
