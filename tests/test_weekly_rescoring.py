"""The weekly_rescoring schedule, evaluated through Dagster's schedule test API at a fixed time: what it
would launch on a Sunday at 03:00, exactly as the daemon would ask for it."""

from __future__ import annotations

import datetime as dt

import dagster as dg

from moe_dag.config import load_config
from moe_dag.orchestration.automation import TAG_CONFIG_VERSION, TAG_LAUNCHED_BY, TAG_SOURCE, config_version
from moe_dag.orchestration.definitions import build_definitions

SUNDAY_0300 = dt.datetime(2025, 3, 2, 3, 0, tzinfo=dt.UTC)


def test_weekly_rescoring_asks_for_one_rescoring_run_per_source(make_config):
    config_path = make_config()
    config = load_config(config_path)
    definitions = build_definitions(config_path)
    (schedule,) = (s for s in definitions.schedules if s.name == "weekly_rescoring")
    assert schedule.cron_schedule == "0 3 * * 0"
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert schedule.job_name == "rescore_sources"

    with dg.instance_for_test() as instance:
        context = dg.build_schedule_context(
            instance=instance,
            scheduled_execution_time=SUNDAY_0300,
            repository_def=definitions.get_repository_def(),
        )
        requests = list(schedule.evaluate_tick(context).run_requests)

    assert [r.partition_key for r in requests] == config.source_names
    assert [r.run_key for r in requests] == [f"2025-03-02-{source}" for source in config.source_names]
    for request, source in zip(requests, config.source_names, strict=True):
        assert request.tags == {
            TAG_CONFIG_VERSION: config_version(config_path),
            TAG_LAUNCHED_BY: "weekly_rescoring",
            TAG_SOURCE: source,
            # what Dagster adds when the tick resolves the request against the job's partitions
            "dagster/partition": source,
            "dagster/partition_set": "rescore_sources_partition_set",
            "dagster/schedule_name": "weekly_rescoring",
        }
    # Each request is valid for the job it names: the partition exists for scored_documents.
    job = definitions.get_job_def("rescore_sources")
    partitions = job.partitions_def.get_partition_keys()
    assert all(request.partition_key in partitions for request in requests)
