"""The processes of an evaluation and the machinery between them: the judge, the candidate's runner, the
template they fork from, their channel, limits and confinement, and the pool of workers."""
