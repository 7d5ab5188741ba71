"""The refinement loop as an RL environment, and its OpenEnv server."""
