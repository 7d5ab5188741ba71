"""The chat models a run can talk to: a remote OpenAI-compatible endpoint, the embedded llama.cpp model, a script."""
