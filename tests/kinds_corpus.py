"""Real text of five kinds, taken from files the project's machines have: Debian's package database and
documentation, and the locked Python packages (issue 34).

Each kind is text written by people for that form, none of it in the demo corpus:
- `web`: the AWS API reference pages (docs.aws.amazon.com), whose text botocore ships as each operation's
  HTML `documentation`; extracted from the HTML as a crawl's text extraction would, paragraphs as lines.
- `reference`: the Debian package catalogue (`/var/lib/dpkg/status`): each package's description is a short
  third-person article about one subject, edited to Debian's policy; reflowed as packages.debian.org shows it
  (the file wraps lines at ~72 columns, which C4 and FineWeb would read as lines without an end).
- `forum`: questions and answers of the FAQs the installed packages ship (`/usr/share/doc/*/*FAQ*`): a user's
  question and a maintainer's answer, as written.
- `social`: Debian maintainers' one-line notes (the `*` items of `/usr/share/doc/*/changelog.Debian.gz`):
  a few words to a line, terse and informal, as posts are.
- `code`: standard-library and installed Python files (moe_dag.curation.demo_corpus.python_text).

Python's help topics and package READMEs (the demo corpus's prose) are documentation full of code and
markup: as a reference and a web source, 29 and 31 of 40 of them dropped at the Gopher alphabetic-word
share (0.8, datatrove's reading: docs/languages.md), which says nothing about encyclopedia articles or web
pages.
"""

from __future__ import annotations

import gzip
import itertools
import json
import random
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import botocore

from moe_dag.curation.demo_corpus.python_text import code_documents

KINDS = ("web", "reference", "forum", "social", "code")
MIN_WORDS = 50  # as the demo corpus: shorter texts are not whole documents (a post is the exception)
POST_WORDS = (8, 40)
FAQ_ANSWER_MIN_WORDS = 20  # a table of contents lists questions with no answer below them

DOC_ROOT = Path("/usr/share/doc")
DPKG_STATUS = Path("/var/lib/dpkg/status")
BOTOCORE_DATA = Path(botocore.__file__).parent / "data"
# Every 10th of the services, spread over the alphabet: ~1,700 pages, in a tenth of the 8 s that reading
# every service's model takes.
AWS_SERVICE_STEP = 10
CHANGELOG_ENTRY = re.compile(r"\n(?=\S+ \([^)]*\) [^;]*; urgency=)")
# A question line of a FAQ: "Q: ...?", "1.2.3 ...?" or a bare "...?", of at most FAQ_QUESTION_WORDS words.
FAQ_QUESTION = re.compile(r"^\s*(?:Q:\s*|[\d.]+\s+)?(\S.*\?)\s*$")
FAQ_QUESTION_WORDS = 25
LIST_ITEM = re.compile(r"\s*(?:[*+\-•]|\d+[.)])\s")
BLOCK_TAGS = frozenset(
    {"p", "li", "ul", "ol", "div", "br", "h1", "h2", "h3", "h4", "pre", "dt", "dd", "note"}
)


def kinds_documents(per_kind: int) -> dict[str, list[str]]:
    """`per_kind` texts of each kind, the same on every run of one machine."""
    pools = {
        "web": sorted({text for text in aws_reference_pages() if len(text.split()) >= MIN_WORDS}),
        "reference": sorted({text for text in package_descriptions() if len(text.split()) >= MIN_WORDS}),
        "forum": sorted(set(faq_answers())),
        "social": sorted(set(changelog_notes())),
        "code": [doc.text for doc in itertools.islice(code_documents(random.Random(0)), per_kind * 4)],
    }
    taken = {}
    for kind, pool in pools.items():
        assert len(pool) >= per_kind, f"{kind}: {len(pool)} texts on this machine"
        taken[kind] = random.Random(kind).sample(pool, per_kind)
    return taken


def aws_reference_pages() -> Iterator[str]:
    """The text of each operation's page in the newest API version of every AWS_SERVICE_STEP-th service."""
    for service in sorted(BOTOCORE_DATA.iterdir())[::AWS_SERVICE_STEP]:
        versions = sorted(service.glob("*/service-2.json*"))
        if not versions:
            continue
        raw = versions[-1].read_bytes()
        model = json.loads(gzip.decompress(raw) if versions[-1].suffix == ".gz" else raw)
        for operation in model.get("operations", {}).values():
            if operation.get("documentation"):
                yield html_text(operation["documentation"])


def package_descriptions() -> Iterator[str]:
    """The long description of every installed package, reflowed: one line per paragraph or list item."""
    for stanza in DPKG_STATUS.read_text(encoding="utf-8", errors="replace").split("\n\n"):
        found = re.search(r"^Description: .*\n((?: .*\n?)*)", stanza, re.MULTILINE)
        if found:
            # Policy 5.6.13: a line of a single " ." is an empty line; every other line starts with a space.
            lines = ["" if line.strip() == "." else line[1:] for line in found.group(1).splitlines()]
            yield reflow("\n".join(lines))


def faq_answers() -> Iterator[str]:
    """Each question of the installed FAQs with its answer, as written."""
    for path in sorted({*DOC_ROOT.glob("*/*FAQ*"), *DOC_ROOT.glob("*/*faq*")}):
        if path.suffix == ".html":
            continue
        question, answer = None, []
        for line in [*read_doc(path).splitlines(), "?"]:  # the last "?" closes the last answer
            found = FAQ_QUESTION.match(line)
            if found and len(line.split()) <= FAQ_QUESTION_WORDS:
                if question and len(" ".join(answer).split()) >= FAQ_ANSWER_MIN_WORDS:
                    yield question + "\n\n" + "\n".join(answer).strip()
                question, answer = found.group(1), []
            elif question is not None:
                answer.append(line.rstrip())


def changelog_notes() -> Iterator[str]:
    """The `*` notes of every installed Debian changelog, each with the lines that continue it, of
    POST_WORDS words."""
    for path in sorted(DOC_ROOT.glob("*/changelog.Debian.gz")):
        for entry in CHANGELOG_ENTRY.split(read_doc(path)):
            notes: list[str] = []
            for line in (line.strip() for line in entry.splitlines()[1:]):
                if line.startswith("*"):
                    notes.append(line.lstrip("* "))
                elif notes and line and not line.startswith("-- "):
                    notes[-1] += " " + line
            yield from (note for note in notes if POST_WORDS[0] <= len(note.split()) <= POST_WORDS[1])


def read_doc(path: Path) -> str:
    raw = path.read_bytes()
    return (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8", "replace")


def reflow(text: str) -> str:
    """Hard-wrapped paragraphs as a browser shows them: a paragraph's lines joined, list items kept apart."""
    paragraphs = []
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        lines: list[str] = []
        for line in paragraph.splitlines():
            if lines and not LIST_ITEM.match(line):
                lines[-1] += " " + line.strip()
            else:
                lines.append(line.strip())
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def html_text(html: str) -> str:
    """The text of an HTML fragment, a line per block element."""
    parser = _TextParser()
    parser.feed(html)
    return re.sub(r"[ \t]*\n\s*", "\n", "".join(parser.parts)).strip()


class _TextParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        self.parts.append(re.sub(r"\s+", " ", data))
