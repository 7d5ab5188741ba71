"""The refinement loop as two graphs: one turn, and the loop that runs turns until decide says done.

    turn:  generate -> extract --code--> compile --compiled--> execute --correct--> profile -> record -> END
                          |no_code          |compile_fail        |wrong                      ^
                          +-----------------+--------------------+---------------------------+
    loop:  START -> turn -> decide --continue--> turn
                                   --done------> END

The turn subgraph is the one engine of a turn: the loop runs it as a node (checkpointed with the
loop, so a killed run resumes inside the turn in flight), and beam search invokes it per child.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from kernel_refinery.agent.nodes import AgentContext, compile_candidate, decide, execute, extract, generate, profile, record
from kernel_refinery.agent.state import Outcome, RefineInput, RefineState, TurnInput, TurnOutput, TurnState

TURN_NODES: dict[str, Callable[..., dict[str, Any]]] = {
    "generate": generate,
    "extract": extract,
    "compile": compile_candidate,
    "execute": execute,
    "profile": profile,
    "record": record,
}

# Where each node's outcome leads: the whole routing of both graphs.
ROUTES: dict[str, dict[Outcome, str]] = {
    "extract": {Outcome.CODE: "compile", Outcome.NO_CODE: "record"},
    "compile": {Outcome.COMPILED: "execute", Outcome.COMPILE_FAIL: "record"},
    "execute": {Outcome.CORRECT: "profile", Outcome.WRONG: "record"},
    "decide": {Outcome.CONTINUE: "turn", Outcome.DONE: END},
}


def route(state: TurnState | RefineState) -> Outcome:
    return state["outcome"]


def build_turn_graph() -> CompiledStateGraph[TurnState, AgentContext, TurnInput, TurnOutput]:
    """One turn. Without a checkpointer of its own: inside the loop it is checkpointed with it."""
    turn = StateGraph(TurnState, context_schema=AgentContext, input_schema=TurnInput, output_schema=TurnOutput)
    for name, node in TURN_NODES.items():
        turn.add_node(name, node)
    turn.add_edge(START, "generate")
    turn.add_edge("generate", "extract")
    turn.add_edge("profile", "record")
    turn.add_edge("record", END)
    for source in ("extract", "compile", "execute"):
        turn.add_conditional_edges(source, route, ROUTES[source])  # type: ignore[arg-type]  # langgraph wants dict[Hashable, str]; dict keys are invariant
    return turn.compile()


TURN = build_turn_graph()


def build_graph(checkpointer: BaseCheckpointSaver | None = None) -> CompiledStateGraph[RefineState, AgentContext, RefineInput, RefineState]:
    loop = StateGraph(RefineState, context_schema=AgentContext, input_schema=RefineInput)
    loop.add_node("turn", TURN)
    loop.add_node("decide", decide)
    loop.add_edge(START, "turn")
    loop.add_edge("turn", "decide")
    loop.add_conditional_edges("decide", route, ROUTES["decide"])  # type: ignore[arg-type]  # dict[Outcome, str] for dict[Hashable, str]
    return loop.compile(checkpointer=checkpointer)
