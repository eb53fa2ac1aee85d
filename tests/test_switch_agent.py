"""The kill switch reading a local agent that misbehaves: whatever it answers that is not a flag, and however slowly,
the switch "cannot tell" (the last known mode holds; before any reading, nothing is cleaned), never an exception,
and never a read past its one time bound."""

from __future__ import annotations

import pytest

from cleanup.killswitch import AGENT_TIMEOUT_SECONDS, Mode
from cleanup.runtime import Runtime
from tests.agents import ENFORCE, GARBLES, PAUSE, ScriptedAgent
from tests.stack import SessionStack


def switched(stack: SessionStack, agent: ScriptedAgent) -> Runtime:
    return stack.runtime(**agent.settings())


@pytest.mark.parametrize("garble", list(GARBLES))
def test_a_garbled_answer_after_a_pause_leaves_the_pause(stack: SessionStack, garble: str) -> None:
    with ScriptedAgent([PAUSE, GARBLES[garble], ENFORCE]) as agent:
        runtime = switched(stack, agent)
        assert runtime.refresh_mode() is Mode.PAUSED

        held = runtime.switch.state()
        recovered = runtime.refresh_mode()  # the third answer: a flag again

    assert (held.mode, held.source, held.flag) == (Mode.PAUSED, "last-known", Mode.PAUSED)
    assert recovered is Mode.ENFORCE


@pytest.mark.parametrize("garble", list(GARBLES))
def test_a_garbled_first_answer_holds_as_unknown(stack: SessionStack, garble: str) -> None:
    with ScriptedAgent([GARBLES[garble]]) as agent:
        runtime = switched(stack, agent)

        mode = runtime.refresh_mode()

    state = runtime.switch.state()
    assert (mode, state.source, state.flag) == (Mode.PAUSED, "unknown", None)
    assert state.error


def test_an_answer_trickled_a_byte_at_a_time_is_cut_at_the_bound_and_the_pause_holds(stack: SessionStack) -> None:
    with ScriptedAgent([PAUSE, ENFORCE], trickle=True) as agent:
        agent.trickle_seconds = 0.0
        runtime = switched(stack, agent)
        assert runtime.refresh_mode() is Mode.PAUSED
        # Every byte well within a socket timeout, the whole answer well past the read's bound.
        agent.trickle_seconds = 4 * AGENT_TIMEOUT_SECONDS / len(ENFORCE)

        mode = runtime.refresh_mode()

    assert mode is Mode.PAUSED and runtime.switch.state().source == "last-known"
    first, second = agent.answered
    assert first.complete and not second.complete  # the switch hung up before the agent had answered


def test_an_agent_that_never_answers_holds_as_unknown(stack: SessionStack) -> None:
    with ScriptedAgent([ENFORCE], trickle=True, trickle_seconds=60) as agent:
        runtime = switched(stack, agent)

        mode = runtime.refresh_mode()

    assert mode is Mode.PAUSED and runtime.switch.state().source == "unknown"
    assert agent.answered[0].sent == 0
