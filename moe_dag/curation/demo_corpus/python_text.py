"""Code and English prose found in the running Python installation.

`code`: the `.py` files of the standard library and of site-packages, one file per document, or one
200-line chunk of a long file. `prose`: the package descriptions in `*.dist-info/METADATA` (mostly
READMEs), the reference topics behind `help()` (`pydoc_data.topics`), and module docstrings, long texts
split at paragraphs into documents of a few hundred words.

Files are listed in sorted order and drawn by the caller's seeded RNG, so a machine gives the same
documents for the same seed; ids use paths relative to the library root, never absolute paths.
Vendored copies (`_vendor/` folders) are skipped: they repeat installed packages, and a duplicate that
is not labelled as one would corrupt the ground truth of the injected noise. moe-dag's own installation
is skipped too: its package description is this repository's README and an editable install's
generated `__editable__*` files hold the checkout's absolute path, so reading them made the corpus, and
every figure measured on it, move with each README edit and with where the repository was cloned.
"""

from __future__ import annotations

import ast
import math
import os
import random
import sysconfig
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import Parser
from inspect import cleandoc
from pathlib import Path

from moe_dag.curation.demo_corpus.documents import DemoDoc, paragraph_chunks, round_robin

CODE_CHUNK_LINES = 200
MIN_WORDS = 50  # shorter texts are not clean documents: "too_short" is one of the injected noise kinds
PROSE_MAX_WORDS = 300
MIN_ASCII_SHARE = 0.97  # prose must be English; a README written in another language is skipped
SKIPPED_DIRS = frozenset({"__pycache__", "site-packages", "dist-packages", "_vendor", "vendor", "_vendored"})
OWN_DISTRIBUTION = "moe_dag"  # its dist-info folder's name before the version: moe_dag-0.1.0.dist-info
EDITABLE_INSTALL_PREFIX = "__editable__"


@dataclass(frozen=True)
class PythonFile:
    origin: str  # "stdlib" or "site-packages"
    relative: str  # POSIX path below the origin's root
    path: str


def code_documents(rng: random.Random) -> Iterator[DemoDoc]:
    """Python source files in random order (for `rng`), a random chunk of each long one."""
    files = python_files()
    rng.shuffle(files)
    for file in files:
        text = _read_utf8(file.path)
        if text is None:
            continue
        lines = text.splitlines(keepends=True)
        chunks = math.ceil(len(lines) / CODE_CHUNK_LINES)
        if chunks == 0:
            continue
        chunk = rng.randrange(chunks)
        body = "".join(lines[chunk * CODE_CHUNK_LINES : (chunk + 1) * CODE_CHUNK_LINES])
        if len(body.split()) < MIN_WORDS:
            continue
        yield DemoDoc(
            id=f"code/{file.origin}/{file.relative}#{chunk}",
            text=body,
            metadata={
                "origin": file.origin,
                "path": file.relative,
                "chunk": chunk,
                "chunks": chunks,
                "programming_language": "python",
            },
        )


def prose_documents(rng: random.Random) -> Iterator[DemoDoc]:
    """READMEs, help topics and module docstrings, taken in turn so each kind is represented."""
    return round_robin(_readme_documents(rng), _help_topic_documents(rng), _docstring_documents(rng))


def python_files() -> list[PythonFile]:
    """Every `.py` file of the standard library and site-packages, sorted."""
    roots = [("stdlib", sysconfig.get_paths()["stdlib"])]
    roots += [("site-packages", str(root)) for root in site_packages_dirs()]
    files = []
    for origin, root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS]
            relative_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
            for name in filenames:
                if name.endswith(".py") and not name.startswith(EDITABLE_INSTALL_PREFIX):
                    relative = name if relative_dir == "." else f"{relative_dir}/{name}"
                    files.append(PythonFile(origin, relative, os.path.join(dirpath, name)))
    return sorted(files, key=lambda f: (f.origin, f.relative))


def site_packages_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    return sorted({Path(paths[key]) for key in ("purelib", "platlib") if Path(paths[key]).is_dir()})


def _readme_documents(rng: random.Random) -> Iterator[DemoDoc]:
    metadata_files = sorted(
        path
        for root in site_packages_dirs()
        for path in root.glob("*.dist-info/METADATA")
        if path.parent.name.partition("-")[0] != OWN_DISTRIBUTION
    )
    rng.shuffle(metadata_files)
    for path in metadata_files:
        message = Parser().parsestr(path.read_text(encoding="utf-8", errors="replace"))
        body, package = message.get_payload(), str(message["Name"] or path.parent.name).lower()
        if not isinstance(body, str) or not _is_english(body):
            continue
        for i, chunk in enumerate(paragraph_chunks(body, max_words=PROSE_MAX_WORDS, min_words=MIN_WORDS)):
            if len(chunk.split()) >= MIN_WORDS:
                yield DemoDoc(f"prose/readme/{package}#{i}", chunk, {"kind": "readme", "package": package})


def _help_topic_documents(rng: random.Random) -> Iterator[DemoDoc]:
    from pydoc_data.topics import topics

    names = sorted(topics)
    rng.shuffle(names)
    for name in names:
        chunks = paragraph_chunks(topics[name], max_words=PROSE_MAX_WORDS, min_words=MIN_WORDS)
        for i, chunk in enumerate(chunks):
            if len(chunk.split()) >= MIN_WORDS:
                yield DemoDoc(f"prose/pydoc/{name}#{i}", chunk, {"kind": "help_topic", "topic": name})


def _docstring_documents(rng: random.Random) -> Iterator[DemoDoc]:
    files = python_files()
    rng.shuffle(files)
    for file in files:
        docstring = _module_docstring(file.path)
        if docstring and len(docstring.split()) >= MIN_WORDS and _is_english(docstring):
            module = file.relative.removesuffix(".py").replace("/", ".")
            yield DemoDoc(
                id=f"prose/docstring/{file.origin}/{file.relative}",
                text=docstring,
                metadata={"kind": "docstring", "origin": file.origin, "module": module},
            )


def _module_docstring(path: str) -> str | None:
    """The module docstring, read from the first tokens only (parsing whole files would be slow)."""
    with open(path, "rb") as f:
        try:
            for token in tokenize.tokenize(f.readline):
                if token.type in (tokenize.ENCODING, tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE):
                    continue
                if token.type != tokenize.STRING:
                    return None
                value = ast.literal_eval(token.string)
                return cleandoc(value) if isinstance(value, str) else None
        except (tokenize.TokenError, SyntaxError, UnicodeDecodeError, ValueError):
            return None  # test fixtures in the stdlib hold deliberately broken files
    return None


def _read_utf8(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        return None  # a few stdlib test files are deliberately in legacy encodings


def _is_english(text: str) -> bool:
    return bool(text) and sum(c.isascii() for c in text) / len(text) >= MIN_ASCII_SHARE
