"""Where autotune keeps what it computes once and reuses: converted weights, references, gate figures, compiled
kernels, measured peaks. One root, so that `AUTOTUNE_CACHE=$(mktemp -d)` gives a cold start.

Some of what is kept is native code that a server loads into its own process (O2's AOTInductor packages, inductor's
kernels): whoever can write there can run code in the server. So those folders are made private (0700), and
native code is loaded only from a folder that `untrusted` finds nothing wrong with: owned by this user, writable
by no one else, and likewise every folder above it (one writable by others could swap the path under it)."""
from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["cache_root", "write_atomic", "private_dir", "untrusted", "file_sha256"]

def cache_root() -> Path:
    return Path(os.environ.get("AUTOTUNE_CACHE", Path.home() / ".cache" / "autotune"))


def private_dir(path: Path) -> Path:
    """`path` made (with its missing parents) readable and writable by this user alone, whatever the umask."""
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:  # made by a concurrent process meanwhile
            continue
        os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask
    return path


def untrusted(path: Path) -> str | None:
    """Why native code must not be loaded from `path` (one line, with the fix), or None: `path` and every folder
    above it must be owned by this user (or root) and writable by neither group nor others (a root-owned folder
    with the sticky bit, such as /tmp, may be world-writable)."""
    uid = os.getuid()
    for folder in (path, *path.parents):
        info = folder.lstat()
        if stat.S_ISLNK(info.st_mode):
            info = folder.stat()
        if info.st_uid not in (uid, 0):
            return (f"refusing to load native code from {path}: {folder} is owned by uid {info.st_uid}, not by "
                    f"this user ({uid}); point AUTOTUNE_CACHE at a folder of your own")
        writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and not (info.st_uid == 0 and info.st_mode & stat.S_ISVTX):
            who = "group" if info.st_mode & stat.S_IWGRP else "others"
            return (f"refusing to load native code from {path}: {folder} is writable by {who} (mode "
                    f"{stat.S_IMODE(info.st_mode):o}); chmod go-w {folder}, or point AUTOTUNE_CACHE at a private "
                    "folder")
    return None


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file, read in pieces (GGUF files are hundreds of megabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` whole: a concurrent reader sees the old content or the new, never half of one."""
    fd, tmp = tempfile.mkstemp(prefix=path.name, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
