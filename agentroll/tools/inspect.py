"""`agentroll inspect DIR [--problem ID]`: one rollout drawn as a tree, to see what the stages did and why each
sample got its reward, without reading JSON by eye.

Each execution is drawn stage by stage in its system's order (the manifest's `settings.system`), then any
stage it does not declare: each sample with its status (truncations marked), raw reward / shaped reward, its
size, its turn and the call it continues, "frozen" when marked `trainable: false`, the shape of its routed
experts, an excerpt of its answer content, its boxed answer and `reward_info`. The words are the system's
(its vocabulary's `heading` and `label`): three-stage names its solvers, the rewrite each was listed as, the
selector's judgment and the rewrite it picked, and says why a stage did not run; a system without words of
its own names each call by its stage, worker and position. It is a rich renderable: the CLI prints it, a test
exports it as text.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rich.text import Text
from rich.tree import Tree

from ..errors import OutputError, UsageError
from ..folder import routes
from ..record.group import Group, outcome, pass_at_all, policy_groups, spread
from ..record.parsing import last_boxed
from ..record.schema import Sample
from ..systems.vocabulary import Label, Vocabulary
from .system import LEGACY, SystemInfo, coerce, words

EXCERPT = 160  # characters of content shown: the head and, where the answer usually is, the tail


def excerpt(text: str, limit: int = EXCERPT) -> str:
    """One line of at most about `limit` characters: the start and the end, which holds the boxed answer."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    head = limit * 2 // 5
    return f"{flat[:head]} … {flat[-(limit - head - 3) :]}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{round(value, 3):g}"


def _sample_label(sample: Sample, label: Label) -> Text:
    label_text = Text.assemble((label.text, "bold"))
    truncated = sample.status == "truncated"
    label_text.append(" · ")
    label_text.append(sample.status, style="bold red" if truncated else "green")
    if truncated:
        label_text.append(" (cut at max tokens)", style="red")
    label_text.append(
        f" · raw {_num(sample.raw_reward)} / reward {_num(sample.reward)}",
        style="bold green" if sample.raw_reward == 1.0 else None,
    )
    label_text.append(f" · {len(sample.response_token_ids)} tokens")
    if sample.turn or sample.continues is not None:
        label_text.append(f" · turn {sample.turn}, continues record {sample.continues}", style="cyan")
    if not sample.trainable:
        label_text.append(" · frozen (trainable: false)", style="yellow")
    shape = routes_shape(sample.routed_experts)
    if shape is not None:
        label_text.append(f" · routes {shape}", style="dim")
    kept = mask_summary(sample.sampling_mask)
    if kept is not None:
        label_text.append(f" · sampling mask {kept}", style="dim")
    if label.mark:
        label_text.append(f"  {label.mark}", style="bold magenta")
    return label_text


def mask_summary(value: Any) -> str | None:
    """A sample's sampling mask as the tokens kept per step (mean, min-max); None: it has none."""
    if value is None:
        return None
    if isinstance(value, dict):
        return "in the sidecar (not read)"
    sizes = [len(step) for step in value] if isinstance(value, list) else []
    if not sizes:
        return "empty"
    return f"{sum(sizes) / len(sizes):.1f} kept per step ({min(sizes)}-{max(sizes)})"


def routes_shape(value: Any) -> str | None:
    """A sample's routed experts as `rows×layers×k dtype` (None: it has none): an array, `.npy` bytes, or a
    reference not read from its sidecar."""
    if value is None:
        return None
    if isinstance(value, dict):
        return "in the sidecar (not read)"
    try:
        array = routes.decode(value) if isinstance(value, bytes | bytearray | memoryview) else routes.checked(value)
    except ValueError as exc:
        return f"unreadable ({exc})"
    return "×".join(str(n) for n in array.shape) + f" {array.dtype}"


def _add_sample(parent: Tree, sample: Sample, label: Label) -> None:
    node = parent.add(_sample_label(sample, label))
    if sample.content is None:
        node.add(Text("content: none", style="dim"))
    else:
        node.add(Text.assemble(("content: ", "dim"), excerpt(sample.content)))
        answer = last_boxed(sample.content)
        if answer is not None:
            node.add(Text.assemble(("answer: ", "dim"), answer))
    if sample.reward_info:
        node.add(Text.assemble(("reward_info: ", "dim"), sample.reward_info))
    judge = getattr(sample, "judge", None)
    if isinstance(judge, dict):  # --reward judge: its verdict (or why there is none), its model and tokens
        if judge.get("failed"):
            said = f"{judge.get('model')}: no verdict ({judge['failed']})"
        else:
            tokens = f"{judge.get('prompt_tokens')}/{judge.get('completion_tokens')} tokens"
            said = (
                f"{judge.get('model')}, score {judge.get('score')}, {tokens}: {excerpt(str(judge.get('verdict', '')))}"
            )
        node.add(Text.assemble(("judge: ", "dim"), said))


def _execution_node(parent: Tree, samples: list[Sample]) -> Tree:
    head = samples[0]
    return parent.add(
        Text.assemble(
            (f"execution {head.sample_index}", "bold cyan"),
            *([(f" · policy {head.policy} ({head.model})", "bold magenta")] if head.policy is not None else []),
            f" · rollout {head.rollout_id} · final reward {_num(head.final_reward)} · {len(samples)} records",
        )
    )


def _system_tree(parent: Tree, samples: list[Sample], stages: tuple[str, ...], vocabulary: Vocabulary) -> None:
    """One execution: its stages in order (then any stage it does not declare), each with the system's heading,
    each call with its label."""
    node = _execution_node(parent, samples)
    for stage in (*stages, *dict.fromkeys(s.stage for s in samples if s.stage not in stages)):
        members = [s for s in samples if s.stage == stage]
        heading = vocabulary.heading(stage, members, samples)
        if not members:
            node.add(Text(heading, style="dim"))
            continue
        branch = node.add(Text(heading, style="bold"))
        for s in members:
            _add_sample(branch, s, vocabulary.label(s, samples))


def rollout_tree(
    group: Group, executions: list[list[Sample]] | None = None, system: SystemInfo | dict[str, Any] | None = None
) -> Tree:
    """A group's executions (all, or those given) as a tree rooted at the problem. `system` (a manifest's
    `settings.system`, or a `SystemInfo`): which system drew them, and whose words label them; three-stage when
    not given. A system that cannot be loaded here is drawn with the generic words."""
    info = LEGACY if system is None else coerce(system)
    vocabulary, _ = words(info)
    executions = group.executions if executions is None else executions
    first = group.executions[0][0]
    said = []
    for name, members in policy_groups(group.executions).items():  # a head-to-head group: each policy's own
        outcomes = [outcome(e) for e in members]
        mean, std = spread(outcomes)
        whose = "" if name is None else f"{name}: "
        said.append(
            f"{whose}group reward mean {_num(mean)} (std {_num(std)}) · "
            f"pass@all {_num(pass_at_all(outcomes, vocabulary.pass_fail))}"
        )
    figures = " · " + ", ".join(said)
    root = Tree(
        Text.assemble(
            (f"problem {first.problem_id}", "bold"),
            f" · label {_label(first.label)} · group of {len(group.executions)} executions" + figures,
        )
    )
    for samples in executions:
        _system_tree(root, samples, info.stages or (), vocabulary)
    return root


def _label(label: Any) -> str:
    return label if isinstance(label, str) else repr(label)


def inspect(folder: str | os.PathLike[str], problem_id: str | None = None) -> Tree:
    """The first group's first execution, or every execution of `problem_id`, as a rich tree.

    Raises `UsageError` (exit 2) when the problem is not in the folder, `OutputError` (exit 6) when the folder
    holds no rollouts or cannot be read."""
    from ..folder import as_group, load_manifest, stored_groups
    from .system import system_of

    system = system_of(load_manifest(Path(folder)))
    for records, sidecar in stored_groups(folder):  # only the group shown has its routes read
        if problem_id is None or str(records[0]["problem_id"]) == problem_id:
            try:
                group = as_group(sidecar.resolve(records))
            except OSError as exc:
                raise OutputError(str(exc)) from exc
            return rollout_tree(group, group.executions[:1] if problem_id is None else None, system)
    if problem_id is None:
        raise OutputError(f"{folder} holds no rollouts")
    raise UsageError(f"problem {problem_id!r} is not in {folder}")
