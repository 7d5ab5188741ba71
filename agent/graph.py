"""The refinement loop: generate → extract → compile → execute → profile → decide, as a graph.

    extract  --code-->  compile  --compiled-->  execute  --correct-->  profile --> decide
       |no_code            |compile_fail           |wrong                          |
       +-------------------+-----------------------+----------> decide --continue--> generate
                                                                       --done------> END
"""

from __future__ import annotations

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from agent.nodes import AgentContext, compile_candidate, decide, execute, extract, generate, profile
from agent.state import Outcome, RefineInput, RefineState

NODES = {
    "generate": generate,
    "extract": extract,
    "compile": compile_candidate,
    "execute": execute,
    "profile": profile,
    "decide": decide,
}

# Where each node's outcome leads: the whole routing of the loop.
ROUTES: dict[str, dict[Outcome, str]] = {
    "extract": {Outcome.CODE: "compile", Outcome.NO_CODE: "decide"},
    "compile": {Outcome.COMPILED: "execute", Outcome.COMPILE_FAIL: "decide"},
    "execute": {Outcome.CORRECT: "profile", Outcome.WRONG: "decide"},
    "decide": {Outcome.CONTINUE: "generate", Outcome.DONE: END},
}


def route(state: RefineState) -> Outcome:
    return state["outcome"]


def build_graph(checkpointer: BaseCheckpointSaver | None = None) -> CompiledStateGraph:
    graph = StateGraph(RefineState, context_schema=AgentContext, input_schema=RefineInput)
    for name, node in NODES.items():
        graph.add_node(name, node)
    graph.add_edge(START, "generate")
    graph.add_edge("generate", "extract")
    graph.add_edge("profile", "decide")
    for source, table in ROUTES.items():
        graph.add_conditional_edges(source, route, table)  # type: ignore[arg-type]
    return graph.compile(checkpointer=checkpointer)
