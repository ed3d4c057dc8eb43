"""The Dagster-facing modules that are not assets: the one Definitions, resources, sensors and
automation, staleness, run health, the run order of `moe-dag run`, and the Pipes reporter the trainer
runs under.

Two layers: `resources` and `dagster_internals` import no asset module (the assets take their
resources and the Pipes error from them); every other module here may import the assets. Importing this
package imports nothing, so the trainer's workers import `pipes_training` without Dagster.
"""
