"""`refinery suite check`: every task's reference run eager and compiled, each in a fresh process."""
