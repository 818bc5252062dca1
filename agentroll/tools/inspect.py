"""`agentroll inspect DIR [--problem ID]`: one rollout drawn as a tree, to see what the stages did and why each
sample got its reward, without reading JSON by eye.

For the three-stage system the tree is solvers -> rewriters -> selector per execution: each sample with its
status (truncations marked), raw reward / shaped reward, an excerpt of its answer content, its boxed answer and
`reward_info`; each rewrite with the number it was listed as; the selector with its judgment and the rewrite it
picked; the shape of a sample's routed experts when it has them. A stage that did not run says why. Any other
system (the manifest's `settings.system`) is drawn stage by stage in the system's order, each call with its
turn and the call it continues; a stage without a call says so. A sample marked `trainable: false` says
"frozen". It is a rich renderable: the CLI prints it, a test exports it as text.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rich.text import Text
from rich.tree import Tree

from ..errors import OutputError, UsageError
from ..folder import routes
from ..group import Group
from ..parsing import last_boxed
from ..schema import Sample
from .system import LEGACY, SystemInfo, coerce

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


def _sample_label(sample: Sample, name: str, picked: bool = False) -> Text:
    label = Text.assemble((name, "bold"))
    if sample.stage == "rewriter":
        label.append(f" · listed as {sample.listed_as}" if sample.listed_as is not None else " · not listed")
    truncated = sample.status == "truncated"
    label.append(" · ")
    label.append(sample.status, style="bold red" if truncated else "green")
    if truncated:
        label.append(" (cut at max tokens)", style="red")
    label.append(
        f" · raw {_num(sample.raw_reward)} / reward {_num(sample.reward)}",
        style="bold green" if sample.raw_reward == 1.0 else None,
    )
    label.append(f" · {len(sample.response_token_ids)} tokens")
    if sample.turn or sample.continues is not None:
        label.append(f" · turn {sample.turn}, continues record {sample.continues}", style="cyan")
    if not sample.trainable:
        label.append(" · frozen (trainable: false)", style="yellow")
    shape = routes_shape(sample.routed_experts)
    if shape is not None:
        label.append(f" · routes {shape}", style="dim")
    if picked:
        label.append("  ◀ picked by the selector", style="bold magenta")
    return label


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


def _add_sample(parent: Tree, sample: Sample, name: str, picked: bool = False) -> None:
    node = parent.add(_sample_label(sample, name, picked))
    if sample.content is None:
        node.add(Text("content: none", style="dim"))
    else:
        node.add(Text.assemble(("content: ", "dim"), excerpt(sample.content)))
        answer = last_boxed(sample.content)
        if answer is not None:
            node.add(Text.assemble(("answer: ", "dim"), answer))
    if sample.reward_info:
        node.add(Text.assemble(("reward_info: ", "dim"), sample.reward_info))


def _execution_node(parent: Tree, samples: list[Sample]) -> Tree:
    head = samples[0]
    return parent.add(
        Text.assemble(
            (f"execution {head.sample_index}", "bold cyan"),
            f" · rollout {head.rollout_id} · final reward {_num(head.final_reward)} · {len(samples)} records",
        )
    )


def _system_tree(parent: Tree, samples: list[Sample], stages: tuple[str, ...]) -> None:
    """Any system's execution: its stages in order (then any stage it does not declare), each call as written,
    numbered by its position in the execution (what `continues` refers to)."""
    node = _execution_node(parent, samples)
    position = {id(s): i for i, s in enumerate(samples)}
    for stage in (*stages, *dict.fromkeys(s.stage for s in samples if s.stage not in stages)):
        members = [s for s in samples if s.stage == stage]
        if not members:
            node.add(Text(f"{stage}: none (no call made)", style="dim"))
            continue
        branch = node.add(Text(f"{stage} ({len(members)})", style="bold"))
        for s in members:
            _add_sample(branch, s, f"{stage} {s.worker} · record {position[id(s)]}")


def _execution_tree(parent: Tree, samples: list[Sample]) -> None:
    node = _execution_node(parent, samples)
    solvers = [s for s in samples if s.stage == "solver"]
    rewriters = [s for s in samples if s.stage == "rewriter"]
    selector = next((s for s in samples if s.stage == "selector"), None)
    answered = sum(s.content is not None for s in solvers)
    listed = [r for r in rewriters if r.listed_as is not None]
    picked_as = (
        selector.judgment
        if selector is not None and selector.judgment is not None and 1 <= selector.judgment <= len(listed)
        else None
    )

    branch = node.add(Text(f"solvers ({len(solvers)}, {answered} with an answer)", style="bold"))
    for s in solvers:
        _add_sample(branch, s, f"solver {s.worker}")

    if rewriters:
        branch = node.add(
            Text(
                f"rewriters ({len(rewriters)}, each shown {answered} solver answer{'s' * (answered != 1)})",
                style="bold",
            )
        )
        for r in rewriters:
            _add_sample(branch, r, f"rewriter {r.worker}", picked=picked_as is not None and r.listed_as == picked_as)
    else:
        why = "no solver gave an answer" if not answered else "no call made (no room left in the context window)"
        node.add(Text(f"rewriters: none ({why})", style="dim"))

    if selector is not None:
        branch = node.add(Text(f"selector (shown {len(listed)} rewrite{'s' * (len(listed) != 1)})", style="bold"))
        if picked_as is not None:
            chosen = next(r for r in listed if r.listed_as == picked_as)
            verdict = f"judgment {selector.judgment} → rewrite {picked_as} (rewriter {chosen.worker})"
        elif selector.judgment is not None:
            verdict = f"judgment {selector.judgment} → out of range 1..{len(listed)}: nothing picked"
        else:
            verdict = "no judgment: nothing picked"
        _add_sample(branch, selector, "selector · " + verdict)
    else:
        why = "no rewriter gave an answer" if not listed else "no call made (no room left in the context window)"
        node.add(Text(f"selector: none ({why})", style="dim"))


def rollout_tree(
    group: Group, executions: list[list[Sample]] | None = None, system: SystemInfo | dict[str, Any] | None = None
) -> Tree:
    """A group's executions (all, or those given) as a tree rooted at the problem. `system` (a manifest's
    `settings.system`, or a `SystemInfo`): which system drew them; three-stage when not given."""
    info = LEGACY if system is None else coerce(system)
    executions = group.executions if executions is None else executions
    first = group.executions[0][0]
    figures = (
        f" · group reward mean {_num(first.group_reward_mean)} (std {_num(first.group_reward_std)})"
        f" · solver pass@all {_num(first.group_pass_at_k)}"
    )
    root = Tree(
        Text.assemble(
            (f"problem {first.problem_id}", "bold"),
            f" · label {_label(first.label)} · group of {len(group.executions)} executions" + figures,
        )
    )
    for samples in executions:
        if info.three_stage:
            _execution_tree(root, samples)
        else:
            _system_tree(root, samples, info.stages or ())
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
