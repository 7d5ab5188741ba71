"""`refinery serve`: the evaluator as an HTTP service, its bounded queue, protocol and client."""
