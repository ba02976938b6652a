"""Workflows, the part that needs no database: how the specs of one submit name their
parents, and which graphs are refused.

A spec's `depends_on` lists job ids, or `ref`s of specs in the same batch (a whole DAG in
one request). An entry that is some spec's `ref` names that spec; any other entry is a job
id, which must exist (the client core checks that against the store). Refs are unique
within a batch, and the refs may not form a cycle; existing jobs cannot depend on new ones,
so a cycle can only be made of refs.
"""

from __future__ import annotations

from collections.abc import Sequence

from brook.common.domain.errors import ErrorDetail, InvalidInput
from brook.common.domain.models import JobSpec

MAX_PARENTS = 1000
MAX_NAMED = 9  # a longer cycle is named by its first and last few refs


def _loc(index: int, field: str, *, batch: bool) -> list[object]:
    return ["jobs", index, field] if batch else [field]


def ref_index(specs: Sequence[JobSpec]) -> dict[str, int]:
    """Each ref to the index of its spec (refs are unique once `check_graph` passed)."""
    return {spec.ref: i for i, spec in enumerate(specs) if spec.ref is not None}


def check_graph(specs: Sequence[JobSpec], *, batch: bool) -> None:
    """Refuse (`InvalidInput`, the `422` detail naming the spec) a ref used twice, or
    specs whose refs depend on each other in a cycle (a spec depending on itself included)."""
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        if spec.ref is None:
            continue
        if spec.ref in seen:
            raise InvalidInput(
                [
                    {
                        "loc": _loc(i, "ref", batch=batch),
                        "msg": f"ref {spec.ref!r} is already the ref of spec {seen[spec.ref]}",
                        "type": "duplicate_ref",
                    }
                ]
            )
        seen[spec.ref] = i
    cycle = find_cycle(specs)
    if cycle:
        names = [str(specs[i].ref) for i in cycle]
        if len(names) > MAX_NAMED:  # the first and last few, and how many in all
            names = [*names[:4], f"... ({len(cycle) - 1} specs) ...", *names[-3:]]
        raise InvalidInput(
            [
                {
                    "loc": _loc(cycle[0], "depends_on", batch=batch),
                    "msg": f"dependency cycle: {' -> '.join(names)}",
                    "type": "dependency_cycle",
                }
            ]
        )


def find_cycle(specs: Sequence[JobSpec]) -> list[int]:
    """Spec indexes along a cycle of refs, the first repeated at the end; [] if none.
    Iterative depth-first search: a 1,000-spec chain must not hit the recursion limit."""
    refs = ref_index(specs)
    edges = [[refs[d] for d in spec.depends_on if d in refs] for spec in specs]
    state = [0] * len(specs)  # 0 unseen, 1 on the current path, 2 done
    for root in range(len(specs)):
        if state[root]:
            continue
        path, todo = [root], [iter(edges[root])]
        state[root] = 1
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                todo.pop()
            elif state[nxt] == 1:
                return [*path[path.index(nxt) :], nxt]
            elif state[nxt] == 0:
                state[nxt] = 1
                path.append(nxt)
                todo.append(iter(edges[nxt]))
    return []


def parent_ids(specs: Sequence[JobSpec], ids: Sequence[str]) -> list[list[str]]:
    """Each spec's parents as job ids, given the ids the specs' jobs get (`ids[i]`)."""
    refs = ref_index(specs)
    return [[ids[refs[d]] if d in refs else d for d in spec.depends_on] for spec in specs]


def external_parents(specs: Sequence[JobSpec]) -> list[str]:
    """The parents named by job id (not by a ref of this batch), each once, in order."""
    refs = ref_index(specs)
    out = dict.fromkeys(d for spec in specs for d in spec.depends_on if d not in refs)
    return list(out)


def unknown_parents_detail(
    specs: Sequence[JobSpec], missing: set[str], *, batch: bool
) -> ErrorDetail:
    """The `422` for parents that are neither a job nor a ref of this batch."""
    refs = ref_index(specs)
    errors: list[dict[str, object]] = []
    for i, spec in enumerate(specs):
        for k, parent in enumerate(spec.depends_on):
            if parent in missing and parent not in refs:
                hint = ", nor a ref of this batch" if batch else ""
                errors.append(
                    {
                        "loc": [*_loc(i, "depends_on", batch=batch), k],
                        "msg": f"unknown parent {parent!r}: no job has this id{hint}",
                        "type": "unknown_parent",
                    }
                )
    return errors
