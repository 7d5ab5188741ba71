"""Errors a user can act on: the `refinery` command prints their message on one line and exits 2.

Anything else that escapes a command is a bug in the project and keeps its traceback. The message
of a `UserError` says what failed, where, and what to do about it; the CLI adds nothing but
`error: ` in front.

The hierarchy lives here, in traces/, because it is the lowest package that agent/, traces/ and
bench/ all import (tools/ imports none of them), so each can raise its own kind.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix: a bad input, flag, endpoint, key or run directory."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else self.__class__.__name__


class ConfigError(UserError, ValueError):
    """A flag or configuration value that is not allowed (names the flag or key and what is)."""


class InputFileError(UserError):
    """A task, candidate, script or config file that cannot be read or is not what it should be."""


class EndpointError(UserError):
    """The model endpoint cannot be used: missing key, refused request, or unreachable after retries."""


class RunDirError(UserError):
    """A run directory that cannot be used as asked: written by another version, or with other settings."""
