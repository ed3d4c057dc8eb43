"""Non-English text from the gettext catalogues (`.mo` files) installed on the machine.

Each translated message (`msgstr`) is a real sentence or phrase written by a translator. The messages of
one locale, in catalogue order, are grouped into documents of about 1,200 to 2,400 characters (a few
hundred words; characters rather than words so Chinese and Japanese get documents of similar size).
Locales are taken in turn in a seeded random order, so the documents spread across many languages;
only well-translated locales are used (see MIN_COVERAGE).

Where the catalogues come from, in order:
1. the system locale folders (`/usr/share/locale`, `/usr/local/share/locale`, `<sys.prefix>/share/locale`),
   which any Linux distribution with translated command-line tools fills;
2. only if those hold no non-English catalogue (a minimal container, a Windows or macOS machine without
   them): `.mo` files shipped inside site-packages (Django and Sphinx, among others, ship them).
With neither, `NoNonEnglishTextError` says what to install.

The `iso_*` catalogues are skipped: they translate lists of country and language names, not sentences.
"""

from __future__ import annotations

import codecs
import random
import struct
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from moe_dag.curation.demo_corpus.documents import DemoDoc, round_robin
from moe_dag.curation.demo_corpus.python_text import site_packages_dirs

SYSTEM_LOCALE_DIRS = (
    Path("/usr/share/locale"),
    Path("/usr/local/share/locale"),
    Path(sys.prefix, "share/locale"),
)
DOC_CHARS = (1200, 2400)
MIN_MESSAGE_CHARS = 20  # shorter messages are menu labels and single words
MIN_LETTER_SHARE = 0.8  # of the non-space characters: leaves out option tables and format strings
# Locales with fewer catalogues than this share of the best-covered one are left out: thinly translated
# locales are mostly rare languages and dialects that language ID cannot tell apart (bs/hr/sr@latin),
# and a clean document that a 0.65 language-ID cut drops would blur the ground truth.
MIN_COVERAGE = 0.5
MO_MAGIC = 0x950412DE


class NoNonEnglishTextError(RuntimeError):
    """The machine has no gettext catalogue in any language but English."""


def intl_documents(rng: random.Random) -> Iterator[DemoDoc]:
    """Documents of translated messages, one locale per document, well-translated locales taken in turn."""
    catalogues = find_catalogues()
    most = max(len(paths) for paths in catalogues.values())
    locales = sorted(locale for locale, paths in catalogues.items() if len(paths) >= most * MIN_COVERAGE)
    rng.shuffle(locales)
    return round_robin(*(_locale_documents(locale, catalogues[locale], rng) for locale in locales))


def find_catalogues() -> dict[str, list[Path]]:
    """Non-English `.mo` files by locale name (e.g. "pt_BR", "sr@latin"), each list sorted."""
    found = _catalogues_under(SYSTEM_LOCALE_DIRS, "LC_MESSAGES/*.mo")
    if not found:
        found = _catalogues_under(site_packages_dirs(), "**/LC_MESSAGES/*.mo")
    if not found:
        raise NoNonEnglishTextError(
            "the demo corpus needs non-English text, but no gettext catalogue (.mo) in a language other "
            f"than English was found under {[str(p) for p in SYSTEM_LOCALE_DIRS]} or in site-packages; "
            "install translated tools (e.g. coreutils, bash, apt on Debian/Ubuntu, in an image whose dpkg "
            "config does not exclude /usr/share/locale) or a Python package that ships catalogues (Django, "
            "Sphinx)"
        )
    return found


def read_mo_messages(path: Path) -> list[tuple[str, str]]:
    """(msgid, msgstr) pairs of a GNU .mo file; plural entries give their first form.

    The format (https://www.gnu.org/software/gettext/manual/html_node/MO-Files.html): a magic number
    that also tells the byte order, a revision, the number of strings N, then the offsets of two tables
    of N (length, offset) pairs, for the originals and for the translations.
    """
    data = path.read_bytes()
    if len(data) < 20:
        raise ValueError(f"{path} is too short to be a gettext .mo catalogue")
    order = next((o for o in ("<", ">") if struct.unpack(o + "I", data[:4])[0] == MO_MAGIC), None)
    if order is None:
        raise ValueError(f"{path} is not a gettext .mo catalogue (bad magic number)")
    _, count, originals, translations = struct.unpack(order + "4I", data[4:20])
    raw_pairs = []
    for i in range(count):
        id_len, id_at = struct.unpack_from(order + "2I", data, originals + 8 * i)
        str_len, str_at = struct.unpack_from(order + "2I", data, translations + 8 * i)
        raw_pairs.append((data[id_at : id_at + id_len], data[str_at : str_at + str_len]))
    charset = _charset(dict(raw_pairs).get(b"", b""))
    pairs = []
    for msgid, msgstr in raw_pairs:
        if msgid:  # the empty msgid holds the header
            # "context\x04msgid" for contexts, "singular\x00plural" for plurals: keep the message itself.
            message, translation = msgid.split(b"\x04")[-1].split(b"\x00")[0], msgstr.split(b"\x00")[0]
            pairs.append((message.decode(charset, "replace"), translation.decode(charset, "replace")))
    return pairs


def _catalogues_under(roots: Sequence[Path], pattern: str) -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for root in roots:
        if not root.is_dir():
            continue
        for path in sorted(root.glob(f"*/{pattern}")):
            locale = path.parent.parent.name
            if not _is_english(locale) and not path.name.startswith("iso_"):
                found.setdefault(locale, []).append(path)
    return {locale: sorted(set(paths)) for locale, paths in found.items()}


def _locale_documents(locale: str, catalogues: list[Path], rng: random.Random) -> Iterator[DemoDoc]:
    catalogues = list(catalogues)
    rng.shuffle(catalogues)
    seen: set[str] = set()
    lines: list[str] = []
    used: list[str] = []
    chars, target, number = 0, rng.randint(*DOC_CHARS), 0
    for path in catalogues:
        for msgid, msgstr in _messages(path):
            text = msgstr.strip()
            if text in seen or text == msgid.strip() or not _is_sentence(text):
                continue
            seen.add(text)
            lines.append(text)
            chars += len(text) + 1
            if path.stem not in used:
                used.append(path.stem)
            if chars >= target:
                yield _document(locale, number, lines, used)
                lines, used, chars, target, number = [], [], 0, rng.randint(*DOC_CHARS), number + 1


def _document(locale: str, number: int, lines: list[str], catalogues: list[str]) -> DemoDoc:
    language = locale.split("@")[0].split("_")[0].split(".")[0]
    return DemoDoc(
        id=f"intl/{locale}/{number:04d}",
        text="\n".join(lines),
        metadata={"language": language, "locale": locale, "catalogues": catalogues},
    )


def _messages(path: Path) -> list[tuple[str, str]]:
    try:
        return read_mo_messages(path)
    except (ValueError, struct.error):
        return []  # a damaged system catalogue: the other catalogues suffice


def _is_sentence(message: str) -> bool:
    """A translated sentence rather than a label, a `--help` option table or a format template."""
    if len(message) < MIN_MESSAGE_CHARS or "%" in message or "--" in message or "\t" in message:
        return False
    visible = len(message) - sum(map(str.isspace, message))
    return sum(map(str.isalpha, message)) >= MIN_LETTER_SHARE * visible


def _charset(header: bytes) -> str:
    for line in header.decode("ascii", "replace").splitlines():
        if line.lower().startswith("content-type:") and "charset=" in line:
            name = line.split("charset=")[-1].strip()
            try:
                return codecs.lookup(name).name
            except LookupError:
                return "utf-8"  # templates leave the placeholder "CHARSET"; modern catalogues are UTF-8
    return "utf-8"


def _is_english(locale: str) -> bool:
    return locale == "en" or locale.startswith(("en_", "en@", "en.")) or locale in ("C", "POSIX")
