"""docs/lambda.md's costs table is the one the template and the cost model make (``benchmarks.stack_costs``), and
says what matters: the socket-only stack's fixed cost, with no key, and what each example leaves after deletion."""

from __future__ import annotations

from benchmarks import stack_costs
from benchmarks.stack import EXAMPLES, Stack


def test_the_costs_table_in_the_docs_is_the_one_the_template_makes() -> None:
    assert stack_costs.main(["stack_costs", "--check"]) == 0


def test_the_socket_only_stack_costs_least_and_holds_no_key() -> None:
    found = {costs.example: costs for costs in map(stack_costs.costs, EXAMPLES)}
    sockets = found.pop("socket-only")

    assert sockets.keys == 0 and sockets.retained == () and not sockets.idle_polls
    assert all(sockets.fixed < other.fixed and sockets.per_million < other.per_million for other in found.values())
    assert f"| `socket-only` | connection | 0 | 10 (11) | ${sockets.fixed:.2f} |" in stack_costs.written()


def test_each_example_lists_every_resource_it_retains() -> None:
    for example in EXAMPLES:
        resources = Stack.of(example).resources()
        kept = {name for name, resource in resources.items() if resource.get("DeletionPolicy") == "Retain"}
        assert set(stack_costs.costs(example).retained) == kept
        for name in kept:
            assert f"`{name}`" in stack_costs.written()
