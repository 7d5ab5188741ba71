"""Guards against reward hacks: the static check, the runtime audit in the candidate's process, output rules,
and kernelguard's optional second opinion."""
