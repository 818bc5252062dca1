"""Folder tools: `validate`, `stats` and `inspect` an output folder (or a merged one).

Each module returns data (dataclasses, dicts) or a rich renderable; only `agentroll.cli` prints. The functions
are not re-exported here, so that `agentroll.tools.validate` and `agentroll.tools.inspect` stay the modules:

    from agentroll.tools.validate import validate
    from agentroll.tools.report import stats, stats_table
    from agentroll.tools.inspect import inspect

`agentroll.tools.system` reads which agent system made a folder (its manifest's `settings.system`): the tools,
the converters and `agentroll.torch` take stage names and their order from it, and the tools the system's
vocabulary (figures, checks, labels: `agentroll.systems.vocabulary`), so no stage is named here. `validate` is
split by what it checks: `faults`, `records`, `conversations`, `executions`, `sidecars`, `shards`.
"""
