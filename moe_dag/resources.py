"""Dagster resources: the pipeline config and what is derived from it (lake, catalog, oracle)."""

from __future__ import annotations

from functools import cached_property

import dagster as dg

from moe_dag.config import PipelineConfig, load_config
from moe_dag.data.catalog import Catalog
from moe_dag.data.lake import Lake
from moe_dag.data.oracle import OpenAICompatibleOracle, Oracle, RuleBasedOracle, VLLMEngineOracle


class PipelineResource(dg.ConfigurableResource):
    """Everything a stage needs to find its inputs and parameters, from one YAML file."""

    config_path: str

    @cached_property
    def config(self) -> PipelineConfig:
        return load_config(self.config_path)

    @cached_property
    def lake(self) -> Lake:
        return Lake(self.config.lake_root)

    @cached_property
    def catalog(self) -> Catalog:
        return Catalog(self.config.catalog_path, self.lake)

    def oracle(self) -> Oracle:
        settings = self.config.oracle
        if settings.backend == "openai":
            return OpenAICompatibleOracle(settings.openai)
        if settings.backend == "vllm":
            return VLLMEngineOracle(settings.vllm)
        return RuleBasedOracle()
