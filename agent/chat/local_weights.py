"""The embedded model's GGUF: find the installed parts, check each against its pin, join them once into a cache.

Parts are found through their wheels' metadata (the RECORD file list), never by importing them: the
packages are published anonymously, and importing one would run its code before any hash is checked.
Each chunk's size and sha256 must match the table in `kernel_refinery.agent.chat.local_catalog` before anything is joined,
and the joined file must match the official release's size and sha256 before it replaces the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import structlog

from kernel_refinery.agent.chat.local_catalog import (
    EmbeddedModel,
    LocalModelError,
    ModelCorrupt,
    ModelNotInstalled,
    ModelPart,
    get_model,
    reinstall_parts,
)

log = structlog.get_logger()

CACHE_ENV = "REFINERY_MODEL_CACHE"
_CHUNK = 8 * 1024 * 1024


def default_cache_dir() -> Path:
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "kernel-refinery" / "models"


def locate_parts(model: EmbeddedModel) -> list[Path]:
    """The installed chunks in join order, after checking each wheel is the pinned version. Imports nothing."""
    missing: list[str] = []
    wrong: list[str] = []
    found: list[tuple[ModelPart, importlib.metadata.Distribution]] = []
    for part in model.parts:
        try:
            dist = importlib.metadata.distribution(part.distribution)
        except importlib.metadata.PackageNotFoundError:
            missing.append(part.distribution)
            continue
        if dist.version != part.version:
            wrong.append(f"{part.distribution}=={dist.version} (pinned {part.version})")
        found.append((part, dist))
    if missing or wrong:
        what = []
        if missing:
            what.append(f"{len(missing)} of {len(model.parts)} parts are not installed: {', '.join(missing)}")
        if wrong:
            what.append(f"parts at the wrong version: {', '.join(wrong)}")
        raise ModelNotInstalled(
            f"embedded model {model.name!r} ({model.title}): {'; '.join(what)}. Install them with: {model.install_hint}"
        )
    paths = []
    for part, dist in found:
        # Only the pinned path is accepted, so a RECORD cannot point the join at another file.
        listed = next((f for f in dist.files or () if str(f) == part.file), None)
        if listed is None:
            raise ModelNotInstalled(
                f"{part.pin} is installed but its file list (RECORD) does not name its chunk {part.file}; "
                f"reinstall it with: {reinstall_parts([part])}"
            )
        path = Path(str(dist.locate_file(listed)))
        if not path.is_file():
            raise ModelNotInstalled(
                f"{part.pin} is installed but its chunk {path} is missing; reinstall it with: {reinstall_parts([part])}"
            )
        paths.append(path)
    return paths


def verify_parts(model: EmbeddedModel, paths: list[Path]) -> None:
    """Checks each chunk's size and sha256 against its pin; one message names every part that fails."""
    bad: list[ModelPart] = []
    problems: list[str] = []
    for part, path in zip(model.parts, paths, strict=True):
        size = path.stat().st_size
        if size != part.size:
            got = f"{size:,} bytes, expected {part.size:,}"
        elif (digest := _sha256_file(path)) != part.sha256:
            got = f"sha256 {digest}, expected {part.sha256}"
        else:
            continue
        bad.append(part)
        problems.append(f"{part.pin}: {path} has {got}")
    if bad:
        raise ModelCorrupt(
            f"embedded model {model.name!r} ({model.title}): {len(bad)} of {len(model.parts)} parts are damaged or "
            f"not the pinned release, so nothing was joined: {'; '.join(problems)}. "
            f"Reinstall {'it' if len(bad) == 1 else 'them'} with: {reinstall_parts(bad)}"
        )


def _marker_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".verified.json")


def _marker_matches(dest: Path, model: EmbeddedModel) -> bool:
    """True when a previous run verified this very file (same size and mtime) against the expected hash."""
    try:
        marker = json.loads(_marker_path(dest).read_text())
        st = dest.stat()
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("sha256") == model.sha256
        and marker.get("size") == st.st_size == model.size
        and marker.get("mtime_ns") == st.st_mtime_ns
    )


def _write_marker(dest: Path, sha256: str) -> None:
    st = dest.stat()
    marker = _marker_path(dest)
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}))
    os.replace(tmp, marker)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _mismatch(model: EmbeddedModel, what: str, expected: object, got: object) -> ModelCorrupt:
    return ModelCorrupt(
        f"embedded model {model.name!r} ({model.title}): the joined file's {what} is {got}, expected {expected}. "
        f"The installed parts are damaged or not the pinned release, so the file was removed and will not be "
        f"used. Reinstall them with: {model.reinstall_hint}"
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Two runs starting at once (a test and a demo) must not both write 1 GB into the cache.
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _join(model: EmbeddedModel, parts: list[Path], dest: Path) -> str:
    """Streams the parts into a temporary file beside dest, checks it, then renames it into place.

    The parts were verified one by one already; the joined file is checked again, since a part can
    change between that check and this read.
    """
    total = sum(p.stat().st_size for p in parts)
    if total != model.size:
        raise _mismatch(model, "size", f"{model.size:,} bytes", f"{total:,} bytes (sum of the installed parts)")
    free = shutil.disk_usage(dest.parent).free
    if free < model.size:
        raise LocalModelError(
            f"not enough disk space in {dest.parent} to join {model.name!r}: need {model.size:,} bytes, "
            f"{free:,} free. Free some space or point {CACHE_ENV} at another directory."
        )
    digest = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    while n := src.readinto(buf):
                        digest.update(view[:n])
                        out.write(view[:n])
            out.flush()
            os.fsync(out.fileno())
            written = out.tell()
        got = digest.hexdigest()
        if written != model.size:
            raise _mismatch(model, "size", f"{model.size:,} bytes", f"{written:,} bytes")
        if got != model.sha256:
            raise _mismatch(model, "sha256", model.sha256, got)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return got


def ensure_model_file(name: str, cache_dir: Path | None = None) -> Path:
    """The verified GGUF of an embedded model, joined from its installed parts on first use."""
    model = get_model(name)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / model.file_name
    if _marker_matches(dest, model):
        return dest
    with _locked(cache / f".{model.file_name}.lock"):
        if _marker_matches(dest, model):  # another process finished the join while we waited
            return dest
        for stale in cache.glob(f".{model.file_name}.*.partial"):
            stale.unlink(missing_ok=True)  # left by a killed run; we hold the lock, so nobody writes it
        _marker_path(dest).unlink(missing_ok=True)
        if dest.exists():
            # No trusted marker (copied in, or touched since): check it once rather than rejoin 1 GB.
            got = _sha256_file(dest)
            if dest.stat().st_size == model.size and got == model.sha256:
                _write_marker(dest, got)
                log.info("model_verified", model=name, path=str(dest))
                return dest
            log.warning("model_cache_invalid", model=name, path=str(dest), sha256=got)
            dest.unlink()
        parts = locate_parts(model)
        started = time.monotonic()
        verify_parts(model, parts)
        log.info("model_parts_verified", model=name, parts=len(parts), seconds=round(time.monotonic() - started, 1))
        started = time.monotonic()
        log.info("model_join_start", model=name, parts=len(parts), size=model.size, dest=str(dest))
        got = _join(model, parts, dest)
        _write_marker(dest, got)
        log.info("model_joined", model=name, path=str(dest), seconds=round(time.monotonic() - started, 1))
    return dest
