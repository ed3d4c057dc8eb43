"""Dagster resources: the pipeline config and what is derived from it (lake, catalog, oracle), and Ray."""

from __future__ import annotations

import dataclasses
from functools import cached_property

import dagster as dg

from moe_dag.assets.run_identity import record_run_host
from moe_dag.config import PipelineConfig, config_version, load_config
from moe_dag.engine import RayConfig, ShardInput, StageRun, StageSpec, connect, run_stage
from moe_dag.engine.cluster import DEFAULT_MIN_BLOCK_ROWS
from moe_dag.quality.oracle import OpenAICompatibleOracle, Oracle, RuleBasedOracle, VLLMEngineOracle
from moe_dag.settings.quality import OracleLabelSettings
from moe_dag.storage.catalog import Catalog
from moe_dag.storage.lake import Lake


class PipelineResource(dg.ConfigurableResource):
    """Everything a stage needs to find its inputs and parameters, from one YAML file."""

    config_path: str

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # Where this run's processes live, so the stuck-run reaper judges it only from there.
        if context.instance is not None and context.run is not None:
            record_run_host(context.instance, context.run.run_id)

    @cached_property
    def config(self) -> PipelineConfig:
        return load_config(self.config_path)

    @cached_property
    def config_digest(self) -> str:
        """The digest of the config file's bytes: which config a run used (a run tag, a tracking label)."""
        return config_version(self.config.path)

    @cached_property
    def lake(self) -> Lake:
        return Lake(self.config.lake_root)

    @cached_property
    def catalog(self) -> Catalog:
        return Catalog(self.config.catalog_path, self.lake)

    def oracle(self, settings: OracleLabelSettings) -> Oracle:
        """The oracle client `settings` (oracle_labels' settings object) choose."""
        if settings.backend == "openai":
            return OpenAICompatibleOracle(settings.openai)
        if settings.backend == "vllm":
            return VLLMEngineOracle(settings.vllm)
        return RuleBasedOracle()


class RayResource(dg.ConfigurableResource):
    """Where the data stages run: the Ray cluster at `address` (else `RAY_ADDRESS`), else a local Ray
    sized to this machine, started on first use and kept for the life of the process.

    Not dagster-ray's `LocalRay`: that one disconnects after every run, so each materialisation would
    pay a Ray start (seconds), and it leaves the object store at Ray's default of 30% of memory. Its
    `KubeRayCluster` can still create a cluster on Kubernetes: pass that cluster's address here."""

    address: str | None = None
    num_cpus: int | None = None
    object_store_gb: float | None = None
    workers: int | None = None
    min_block_rows: int | None = DEFAULT_MIN_BLOCK_ROWS
    scoring_gpus: float = 0.0

    @classmethod
    def from_config(cls, config: RayConfig) -> RayResource:
        return cls(**dataclasses.asdict(config))

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        where = connect(RayConfig(**self.model_dump()))
        if context.log is not None:
            context.log.info(where)

    def run_stage(
        self,
        context: dg.AssetExecutionContext,
        spec: StageSpec,
        lake: Lake,
        source: str,
        inputs: list[ShardInput],
    ) -> StageRun:
        """Bring one source's slice of a stage up to date, logging progress to the run."""
        log, blocks = context.log.info, self.min_block_rows
        return run_stage(spec, lake, source, inputs, workers=self.workers, log=log, min_block_rows=blocks)
