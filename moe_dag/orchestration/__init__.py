"""The Dagster-facing modules that are not assets: the one Definitions, resources, automation,
staleness, run health and the Pipes reporter the trainer runs under. Importing this package imports
nothing (the trainer's workers import `pipes_training` without Dagster)."""
