"""Filesystem confinement of the candidate's process: it may write only where its builds go.

Landlock (Linux 5.13+, unprivileged, irreversible, inherited by every child) is applied in the
runner before candidate code is imported. Only write-like rights are handled, so reading,
executing and device ioctls stay as they were; writes are allowed beneath the runner's own work
directory and the build caches, nowhere else. So neither the candidate's Python nor its C++ or
CUDA code can rewrite the baseline cache, the harness's source files or another run's results.
This is a wall the kernel keeps, not a check the candidate could patch. Where Landlock is missing
(an old kernel, or a container that filters the syscalls) `confine_writes` says so and every
result records that the confinement was unavailable.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Iterable
from pathlib import Path

_SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}
_PR_SET_NO_NEW_PRIVS = 38
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

_WRITE_FILE = 1 << 1
_REMOVE_DIR = 1 << 4
_REMOVE_FILE = 1 << 5
_MAKE_ALL = sum(1 << bit for bit in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
_REFER = 1 << 13  # ABI 2
_TRUNCATE = 1 << 14  # ABI 3


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or 0 where it has none."""
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None or os.uname().sysname != "Linux":
        return 0
    version = _libc().syscall(numbers[0], None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(version))


def confine_writes(writable: Iterable[Path], device_files: Iterable[Path] = (Path("/dev"),)) -> str:
    """Allow writes only beneath `writable` (and plain writes to files under `device_files`).

    Returns "landlock abi N" when in force, or why it is not ("" is never returned)."""
    abi = landlock_abi()
    if abi < 1:
        return "unavailable: this kernel has no Landlock"
    libc = _libc()
    create, add_rule, restrict = _SYSCALLS[platform.machine()]
    handled = _WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE | _MAKE_ALL
    if abi >= 2:
        handled |= _REFER
    if abi >= 3:
        handled |= _TRUNCATE
    attr = _RulesetAttr(handled)
    ruleset = libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"unavailable: landlock_create_ruleset failed ({os.strerror(ctypes.get_errno())})"
    try:
        rules = [(Path(p), handled) for p in writable] + [(Path(p), _WRITE_FILE | (handled & _TRUNCATE)) for p in device_files]
        for path, allowed in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a folder that does not exist yet cannot be written to either
            try:
                rule = _PathBeneath(allowed, fd)
                if libc.syscall(add_rule, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0)):
                    return f"unavailable: landlock_add_rule({path}) failed ({os.strerror(ctypes.get_errno())})"
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
            return f"unavailable: PR_SET_NO_NEW_PRIVS failed ({os.strerror(ctypes.get_errno())})"
        if libc.syscall(restrict, ctypes.c_int(ruleset), ctypes.c_uint32(0)):
            return f"unavailable: landlock_restrict_self failed ({os.strerror(ctypes.get_errno())})"
    finally:
        os.close(ruleset)
    return f"landlock abi {abi}"


_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_CAP_LAST = 40
_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> str:
    """Give up every capability, for good (a root-owned runner then cannot ptrace the judge or
    the parent, nor regain them through exec). Returns what was done, or why not."""
    libc = _libc()
    if os.uname().sysname != "Linux":
        return "unavailable: not Linux"
    for cap in range(_CAP_LAST + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last capability; EPERM when not held
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data):
        return f"unavailable: capset failed ({os.strerror(ctypes.get_errno())})"
    return "dropped"


def not_dumpable() -> None:
    """Processes of the same user cannot attach to this one or read its memory (judge and parent)."""
    if os.uname().sysname == "Linux":
        _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
