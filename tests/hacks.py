"""Hostile candidates for the guard tests, one source per hack, built for either test extension
(the C++ one on CPU, the CUDA one on GPU): both export relu_fwd, relu_slow, copy_fwd and touch."""

from __future__ import annotations

from collections.abc import Callable

Build = Callable[..., str]
"""candidates.candidate or candidates.cuda_candidate: (forward, init=..., prelude=...) -> source."""

SLOW_REPS = 40
"""Passes of the slow honest kernel: enough that skipped work shows beside the memo's own cost."""


def slow(build: Build, reps: int = SLOW_REPS) -> str:
    """A correct ReLU that makes `reps` passes over the data."""
    return build(f"return ext.relu_slow(x, {reps})")


def content_memo(build: Build, reps: int = SLOW_REPS) -> str:
    """Keeps outputs keyed by a few input values; on a hit returns a clone without the work."""
    return build(
        f"""
        flat = x.reshape(-1)
        key = (tuple(x.shape), float(flat[0]), float(flat[1]), float(flat[-1]))
        hit = _MEMO.get(key)
        if hit is not None:
            ext.touch(x)
            return hit.clone()
        y = ext.relu_slow(x, {reps})
        _MEMO[key] = y.clone()
        return y
        """,
        prelude="_MEMO = {}\n",
    )


def pointer_memo(build: Build, reps: int = SLOW_REPS) -> str:
    """Keeps outputs keyed by the input's address."""
    return build(
        f"""
        key = x.data_ptr()
        if key in self.memo:
            ext.touch(x)
            return self.memo[key]
        y = ext.relu_slow(x, {reps})
        self.memo[key] = y
        return y
        """,
        init="self.memo = {}",
    )


def stale_after_two_calls(build: Build) -> str:
    """Right on an instance's first two calls (all that a correctness trial makes), then the same output."""
    return build(
        """
        self.calls += 1
        if self.calls > 2:
            ext.touch(x)
            return self.last
        self.last = ext.relu_fwd(x)
        return self.last
        """,
        init="self.calls = 0\nself.last = None",
    )


def identity(build: Build) -> str:
    """A "ReLU" that copies its input: right wherever the inputs are never negative."""
    return build("return ext.copy_fwd(x)")


def returned_input(build: Build) -> str:
    return build("ext.touch(x)\nreturn x")


def returned_view(build: Build) -> str:
    return build("ext.touch(x)\nreturn x.view(-1).view(x.shape)")


def decoy_beside_clamp(build: Build) -> str:
    """A kernel that does nothing useful, beside a torch op that is not the reference's own."""
    return build("ext.touch(x)\nreturn torch.clamp(x, min=0)")


def lazy(build: Build) -> str:
    """A tensor subclass that computes the ReLU the first time anything looks at it."""
    return build(
        "return Lazy(x)",
        prelude="""
class Lazy(torch.Tensor):
    @staticmethod
    def __new__(cls, x):
        out = torch.Tensor._make_subclass(cls, torch.empty_like(x))
        out._source = x
        return out

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        for arg in args:
            if isinstance(arg, Lazy) and getattr(arg, "_source", None) is not None:
                source, arg._source = arg._source, None
                with torch._C.DisableTorchFunctionSubclass():
                    arg.copy_(ext.relu_fwd(source))
        return super().__torch_function__(func, types, args, kwargs or {})
""",
    )
