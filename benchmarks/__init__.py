"""moe-dag's benchmarks, one module each, run from the repository root as `python -m benchmarks.NAME`.

A package run as modules rather than a folder of scripts: `python benchmarks/NAME.py` would put this
folder first on sys.path, where a script named like an installed package (Hugging Face's `kernels`,
which transformers imports) hides that package from every import in the run.
"""
