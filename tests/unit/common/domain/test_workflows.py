"""Workflow graphs without a database: refs, cycles, parents by id, and the 422 details."""

from __future__ import annotations

from typing import Any

import pytest

from brook.common.domain.errors import InvalidInput
from brook.common.domain.models import JobSpec
from brook.common.domain.validation import validate_batch, validate_spec
from brook.common.domain.workflows import (
    external_parents,
    find_cycle,
    parent_ids,
    unknown_parents_detail,
)


def batch(*specs: dict[str, Any]) -> list[JobSpec]:
    return validate_batch({"jobs": [{"task": "noop", **s} for s in specs]})


def refused(*specs: dict[str, Any]) -> Any:
    with pytest.raises(InvalidInput) as info:
        batch(*specs)
    return info.value.detail


def test_a_diamond_by_refs_resolves_to_the_ids_of_its_own_jobs() -> None:
    specs = batch(
        {"ref": "a"},
        {"ref": "b", "depends_on": ["a"]},
        {"ref": "c", "depends_on": ["a"]},
        {"ref": "d", "depends_on": ["b", "c"]},
    )
    ids = ["ia", "ib", "ic", "id"]
    assert parent_ids(specs, ids) == [[], ["ia"], ["ia"], ["ib", "ic"]]
    assert external_parents(specs) == []


def test_an_entry_that_is_no_ref_of_the_batch_is_a_job_id() -> None:
    specs = batch({"ref": "a"}, {"depends_on": ["a", "65f0c0ffee", "65f0c0ffee"]}, {"depends_on": ["x"]})
    assert parent_ids(specs, ["i0", "i1", "i2"]) == [[], ["i0", "65f0c0ffee"], ["x"]]
    assert external_parents(specs) == ["65f0c0ffee", "x"]
    assert unknown_parents_detail(specs, {"x"}, batch=True) == [
        {
            "loc": ["jobs", 2, "depends_on", 0],
            "msg": "unknown parent 'x': no job has this id, nor a ref of this batch",
            "type": "unknown_parent",
        }
    ]
    single = [validate_spec({"task": "noop", "depends_on": ["x"]})]
    assert unknown_parents_detail(single, {"x"}, batch=False) == [
        {"loc": ["depends_on", 0], "msg": "unknown parent 'x': no job has this id", "type": "unknown_parent"}
    ]


def test_a_cycle_is_refused_naming_a_spec_on_it() -> None:
    [error] = refused(
        {"ref": "a", "depends_on": ["c"]},
        {"ref": "free"},
        {"ref": "b", "depends_on": ["a", "free"]},
        {"ref": "c", "depends_on": ["b"]},
    )
    assert error["type"] == "dependency_cycle" and error["loc"] == ["jobs", 0, "depends_on"]
    assert error["msg"] == "dependency cycle: a -> c -> b -> a"


def test_a_spec_that_depends_on_itself_is_a_cycle_in_a_batch_and_alone() -> None:
    [error] = refused({"task": "echo"}, {"ref": "me", "depends_on": ["me"]})
    assert error["loc"] == ["jobs", 1, "depends_on"] and error["msg"] == "dependency cycle: me -> me"
    with pytest.raises(InvalidInput) as info:
        validate_spec({"task": "noop", "ref": "me", "depends_on": ["me"]})
    assert info.value.detail == [
        {"loc": ["depends_on"], "msg": "dependency cycle: me -> me", "type": "dependency_cycle"}
    ]


def test_a_ref_may_name_only_one_spec_of_a_batch() -> None:
    [error] = refused({"ref": "a"}, {"ref": "b"}, {"ref": "a"})
    assert error == {
        "loc": ["jobs", 2, "ref"],
        "msg": "ref 'a' is already the ref of spec 0",
        "type": "duplicate_ref",
    }


def test_a_long_chain_and_a_wide_fan_in_have_no_cycle_and_no_recursion_limit() -> None:
    chain = [{"ref": f"r{i}", "depends_on": [f"r{i - 1}"] if i else []} for i in range(1000)]
    specs = batch(*chain)
    assert find_cycle(specs) == []
    fan_in: list[dict[str, Any]] = [{"ref": f"p{i}"} for i in range(999)]
    fan_in.append({"depends_on": [f"p{i}" for i in range(999)]})
    assert len(parent_ids(batch(*fan_in), [str(i) for i in range(1000)])[-1]) == 999
    closed = [*chain[1:], {"ref": "r0", "depends_on": ["r999"]}]
    [error] = refused(*closed)
    assert error["msg"] == (
        "dependency cycle: r1 -> r0 -> r999 -> r998 -> ... (1000 specs) ... -> r3 -> r2 -> r1"
    )


def test_more_than_1000_parents_are_refused() -> None:
    [error] = refused({"depends_on": [str(i) for i in range(1001)]})
    assert error["loc"] == ["jobs", 0, "depends_on"]
