"""Read and rewrite Slurm job dependencies, so a job that ran in the cloud counts as done for its dependents. Pure.

Why: a burst job's Slurm twin is held while the cloud runs it; afterwards it must end without running again. Slurm
22.05 has no way to end a pending job as COMPLETED (a held job cannot be requeued, its script cannot be swapped
for a no-op), so the broker cancels it, and before that rewrites every pending dependent's dependency as if the
twin had completed successfully (`scontrol update JobId=D Dependency=...`, which operators may do):

- `afterok:X`, `afterany:X`, `after:X[+min]` on the twin are satisfied: the element is dropped;
- `afternotok:X` can then never be satisfied: it becomes `afterok:X`, which Slurm marks DependencyNeverSatisfied
  once X is cancelled (what a real success gives); a cancellation alone would have satisfied it;
- a whole-array reference (`afterok:A_*`, or `afterok:A` naming the array job) when the twin is task `A_T`
  becomes the same dependency on each other task of the array (`afterok:A_0:A_1:...`), so the remaining tasks are
  still waited for;
- with OR (`?`), a dropped element satisfies the whole dependency: it is cleared.
`aftercorr`, `singleton` and `expand` are left alone (a known limit: an `aftercorr` dependent task of the twin's
task never becomes eligible).

Input is squeue's rendering (`afterok:12(unfulfilled),afterany:13_*(unfulfilled)`; `?` between elements for OR);
output is what `scontrol update Dependency=` accepts ("" clears it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_ELEMENT = re.compile(r"^(?P<kind>[a-z_]+)(?::(?P<ref>[^()]+))?(?:\((?P<state>[a-z_]+)\))?$")
_SATISFIED_BY_SUCCESS = frozenset({"after", "afterany", "afterok"})
_PER_TASK = frozenset({"after", "afterany", "afterok", "afternotok"})


class DependencyParseError(ValueError):
    """A dependency string this module cannot read (it is then left alone)."""


@dataclass(frozen=True, slots=True)
class Element:
    """One dependency element: `kind` (afterok...), the job it names (`123`, `123_4`, `123_*`) and any `+minutes`."""

    kind: str
    job: str = ""
    delay: str = ""

    def render(self) -> str:
        return f"{self.kind}:{self.job}{self.delay}" if self.job else self.kind


def parse(dependency: str) -> tuple[list[Element], str]:
    """The elements of a dependency string and the separator between them ("," AND, "?" OR)."""
    text = dependency.strip()
    if not text or text == "(null)":
        return [], ","
    sep = "?" if "?" in text else ","
    out: list[Element] = []
    for raw in text.split(sep):
        m = _ELEMENT.match(raw.strip())
        if m is None:
            raise DependencyParseError(f"cannot read dependency element {raw!r}")
        refs = (m.group("ref") or "").split(":") if m.group("ref") else [""]
        for ref in refs:
            job, plus, delay = ref.partition("+")
            out.append(Element(m.group("kind"), job, plus + delay))
    return out, sep


def mentions(dependency: str, target: str) -> bool:
    """Whether a dependency names the job `target` (or, for an array task, its whole array)."""
    try:
        elements, _ = parse(dependency)
    except DependencyParseError:
        return False
    return any(e.job == target or e.job in _array_refs(target) for e in elements)


def rewrite_as_succeeded(
    dependency: str, target: str, other_tasks: Sequence[str] = (), *, convert_notok: bool = True
) -> str | None:
    """The dependency with `target` counted as COMPLETED (see the module docstring), or None when unchanged.

    `other_tasks` are the other tasks of `target`'s array (`A_0`, `A_1`...), substituted for a whole-array
    reference. `convert_notok=False` leaves `afternotok:target` alone (once the target is cancelled, an
    `afterok:target` made from it cannot be told from a real one, so it is converted only once, before the cancel).
    Raises `DependencyParseError` for a string it cannot read.
    """
    elements, sep = parse(dependency)
    arrays = _array_refs(target)
    out: list[Element] = []
    changed = satisfied = False
    for e in elements:
        if e.job == target and e.kind in _SATISFIED_BY_SUCCESS:
            changed = satisfied = True
        elif e.job == target and e.kind == "afternotok" and convert_notok:
            out.append(Element("afterok", target))
            changed = True
        elif e.job in arrays and e.kind in _PER_TASK and (convert_notok or e.kind != "afternotok"):
            out.extend(Element(e.kind, task, e.delay) for task in other_tasks)
            if not other_tasks and e.kind == "afternotok":
                out.append(Element("afterok", target))  # no task failed: never satisfied
            changed = True
            satisfied = satisfied or (not other_tasks and e.kind != "afternotok")
        else:
            out.append(e)
    if not changed:
        return None
    if sep == "?" and satisfied:
        return ""
    return sep.join(e.render() for e in out)


def _array_refs(target: str) -> frozenset[str]:
    """How a dependency names the whole array of task `A_T`: `A_*` or `A`."""
    array, sep, _task = target.partition("_")
    return frozenset({f"{array}_*", array}) if sep else frozenset()
