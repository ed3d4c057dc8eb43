"""Each stage's settings: one typed object per stage, built once from the pipeline config.

A stage reads the config only through its settings object; the object's digests are the only input to
the asset's code version (`shared_digest`), its per-source version (`source_digest`), its stored fits
and its per-shard completion digests (`work_digest`). See `moe_dag/settings/stage.py`.
"""
