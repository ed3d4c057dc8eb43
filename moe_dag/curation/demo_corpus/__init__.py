"""The demo corpus: real text found on any machine with Python, in Dolma format, with injected noise.

Three sources: `code` (the interpreter's own Python sources), `prose` (package READMEs, help topics and
module docstrings) and `intl` (translated messages of the installed gettext catalogues). See `build` for
the layout and determinism, `noise` for the injected noise kinds and their ground truth.
"""

from moe_dag.curation.demo_corpus.build import DemoCorpusConfig, build_demo_corpus

__all__ = ["DemoCorpusConfig", "build_demo_corpus"]
