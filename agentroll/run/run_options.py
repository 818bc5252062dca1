"""What `agentroll generate` adds around the `Generator`, declared once: where rows come from and where groups go
(the input or a mix, the folder, shards, limits, partitions, consumers, Ray). The runner reads them; the CLI and
the Ray driver build them; `RUN_OPTION_NAMES` tells the CLI which of its flags are these."""

from __future__ import annotations

from dataclasses import dataclass, fields

from agentroll.errors import UsageError
from agentroll.folder import COMPRESSIONS
from agentroll.inputs import parse_partition
from agentroll.inputs.mix import Source, parse_mix
from agentroll.settings.declare import at_least, option


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """What `agentroll generate` adds around the `Generator`: where rows come from and where groups go."""

    input: str = option("-", "Prompts: JSONL, .jsonl.gz, .jsonl.zst or Parquet, or - for stdin.")
    mix: list[str] = option(
        [],
        "[NAME:]PATH=WEIGHT: several inputs interleaved by weight, in place of INPUT "
        "(repeatable; each record's metadata names its source).",
    )
    output: str = option("", "Output folder, or - to stream JSONL to stdout.", short="-o")
    shard_size: int = option(1000, "Records per shard (whole groups).")
    compression: str = option("none", "none | zstd: shards as rollouts-NNNNN.jsonl.zst, one frame per group.")
    overwrite: bool = option(False, "Delete earlier rollouts in the output folder.")
    skip_invalid: bool = option(False, "Log and count bad input rows instead of stopping.")
    limit: int | None = option(None, "Only the first N problems.")
    target_groups: int | None = option(
        None,
        "Stop once N groups are on disk (with --filter-uniform-groups: N "
        "informative ones), reading only as many prompts as that takes; a "
        "rerun goes on to N.",
    )
    partition: str | None = option(None, "I/N: only problems whose id hashes to slice I of N.")
    max_failures: int | None = option(None, "Stop (exit 7) past this many calls failed for good.")
    ordered: bool = option(False, "Commit groups in input order (a bounded reorder buffer).")
    consumer: str | None = option(None, "Name of a reader (read_groups(consumer=NAME)) that the run waits for.")
    max_ahead: int | None = option(None, "With --consumer: most committed groups it may leave unconsumed.")
    ray: str | None = option(
        None,
        "Run on a Ray cluster: auto, local, or its address (HOST:PORT, ray://HOST:PORT). "
        "One --partition per task into OUT/part-I, merged into OUT (docs/ray.md).",
    )
    partitions: int | None = option(None, "With --ray: partitions (Ray tasks) [default: the cluster's nodes].")
    endpoints_per_task: int | None = option(
        None, "With --ray: each task gets E of the --base-url endpoints, round-robin, instead of all."
    )
    ray_retries: int | None = option(
        None, "With --ray: times Ray reruns a partition whose task was lost (it resumes) [default: 3]."
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "mix", [self.mix] if isinstance(self.mix, str) else list(self.mix or []))
        if self.mix and self.input not in ("", "-"):
            raise UsageError("give INPUT or --mix, not both")
        self.sources()  # checked now
        if not self.output:
            raise UsageError("--output is required (a folder, or - for stdout)")
        at_least(self, 1, "shard_size")
        for name in ("limit", "max_failures", "target_groups"):
            if getattr(self, name) is not None:
                at_least(self, 0, name)
        if self.compression not in COMPRESSIONS:
            raise UsageError(f"--compression must be one of {', '.join(COMPRESSIONS)}")
        if (self.consumer is None) != (self.max_ahead is None):
            raise UsageError("--consumer and --max-ahead go together")
        if self.max_ahead is not None:
            at_least(self, 0, "max_ahead")
        if self.consumer is not None and self.output == "-":
            raise UsageError("--consumer needs an output folder, not -o -")
        if self.partition is not None:
            try:
                parse_partition(self.partition)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        for name, least in (("partitions", 1), ("endpoints_per_task", 1), ("ray_retries", 0)):
            if getattr(self, name) is not None:
                if self.ray is None:
                    raise UsageError(f"--{name.replace('_', '-')} goes with --ray")
                at_least(self, least, name)

    def sources(self) -> list[Source]:
        return parse_mix(self.mix)

    @property
    def slice(self) -> tuple[int, int] | None:
        return parse_partition(self.partition) if self.partition else None


RUN_OPTION_NAMES = [f.name for f in fields(RunOptions)]
