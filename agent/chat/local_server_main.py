"""`python -m kernel_refinery.agent.chat.local_server_main ARGS`: llama-cpp-python's OpenAI-compatible server (same
arguments as `python -m llama_cpp.server`), whose replies also say how many prompt tokens came from
the KV cache: `usage.prompt_tokens_details.cached_tokens`, OpenAI's field, which langchain-openai
reads into `usage_metadata["input_token_details"]["cache_read"]`.

llama.cpp keeps the previous prompt's KV cache and evaluates only what follows the longest common
prefix; with `--cache true` it also restores the saved state of earlier prompts. The stock server
reports neither, so a run could not show what the reuse saved. Counted here as the prompt tokens
the model did not evaluate: the first `eval` of a completion gets exactly the uncached suffix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NotRequired

import llama_cpp
from llama_cpp import llama_types


class PromptTokensDetails(llama_types.TypedDict):
    cached_tokens: int


def _report_cached_tokens() -> None:
    # The server's response model is this TypedDict: without the key, FastAPI would drop the field.
    usage = llama_types.CompletionUsage
    usage.__annotations__["prompt_tokens_details"] = NotRequired[PromptTokensDetails]
    usage.__optional_keys__ = usage.__optional_keys__ | {"prompt_tokens_details"}

    evaluate = llama_cpp.Llama.eval
    complete = llama_cpp.Llama.create_completion

    def eval_counting(self: llama_cpp.Llama, tokens: Sequence[int]) -> None:
        if getattr(self, "_refinery_prompt_evaluated", 0) is None:
            self._refinery_prompt_evaluated = len(tokens)  # type: ignore[attr-defined]  # our counter on llama_cpp's object
        evaluate(self, tokens)

    def create_completion_counting(self: llama_cpp.Llama, *args: Any, **kwargs: Any) -> Any:
        self._refinery_prompt_evaluated = None  # type: ignore[attr-defined]  # our counter on llama_cpp's object
        result = complete(self, *args, **kwargs)
        if isinstance(result, dict) and "usage" in result:
            prompt = int(result["usage"]["prompt_tokens"])
            evaluated = self._refinery_prompt_evaluated  # type: ignore[attr-defined]  # set by eval_counting
            # None: no eval at all (nothing generated); a fully cached prompt still evaluates one token.
            cached = prompt if evaluated is None else max(0, prompt - evaluated)
            result["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}  # type: ignore[typeddict-unknown-key]  # added to the TypedDict above
        return result

    llama_cpp.Llama.eval = eval_counting  # type: ignore[method-assign]  # counts, then runs llama_cpp's own
    llama_cpp.Llama.create_completion = create_completion_counting  # type: ignore[method-assign]  # adds the count


if __name__ == "__main__":
    _report_cached_tokens()
    from llama_cpp.server.__main__ import main

    main()
