"""The app's files: uploads deleted once read, folders of this process (Gradio's cache, live-run
traces) marked with their owner, removed on SIGTERM / SIGINT and, after a crash, at the next start.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specviz.app.serve import FILE_MAX_AGE_S


def gradio_temp_root(root: str | os.PathLike[str] | None = None) -> Path:
    """Gradio's folder for uploads and downloads: `root` if given, else where Gradio puts them."""
    return Path(root or os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")


def delete_upload(path: str | os.PathLike[str], uploads_root: str | os.PathLike[str] | None = None) -> None:
    """Delete an uploaded file once read, but only inside Gradio's upload folder (never a user path)."""
    root = gradio_temp_root(uploads_root)
    file = Path(path)
    try:
        resolved, base = file.resolve(), root.resolve()
    except OSError:
        return
    if base in resolved.parents:
        resolved.unlink(missing_ok=True)
        if resolved.parent != base:
            try:
                resolved.parent.rmdir()  # Gradio puts each upload in a folder of its own
            except OSError:
                pass


ABANDONED_UPLOAD_AGE_S = 5 * 60  # a temp file Gradio never moved into an upload folder


def sweep_abandoned_uploads(
    root: str | os.PathLike[str] | None = None, min_age_s: float = ABANDONED_UPLOAD_AGE_S
) -> int:
    """Delete the temp files an upload Gradio refused (over the size cap) leaves in its root.

    Gradio streams an upload into a `tmp*` file at the top of its temp folder and moves it into
    a folder of its own once accepted; a refused one stays there, empty, and Gradio's own cache
    cleanup does not know it. Only such top-level `tmp*` files older than `min_age_s` go.
    """
    folder = gradio_temp_root(root)
    now, removed = time.time(), 0
    for child in list(folder.iterdir()) if folder.is_dir() else []:
        try:
            if child.name.startswith("tmp") and child.is_file() and now - child.stat().st_mtime > min_age_s:
                child.unlink()
                removed += 1
        except OSError:
            continue
    return removed


def start_sweeper(every_s: float = 60.0) -> threading.Thread:
    """Sweep abandoned uploads every `every_s` seconds, for as long as the server runs."""

    def loop() -> None:
        while True:
            time.sleep(every_s)
            sweep_abandoned_uploads()

    thread = threading.Thread(target=loop, name="specviz-upload-sweeper", daemon=True)
    thread.start()
    return thread


OWNER_MARKER = ".specviz-owner"  # in every temp folder the app makes: "<pid> <process start time>"
LIVE_PREFIX = "specviz-live-"
GRADIO_PREFIX = "specviz-gradio-"


def _process_start(pid: int) -> str:
    """The process's start time (clock ticks since boot): a reused PID has another one."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def owned_folder(prefix: str, parent: str | os.PathLike[str] | None = None) -> Path:
    """A new temp folder marked as this process's, so a later start can tell it was left by a crash."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    (folder / OWNER_MARKER).write_text(f"{os.getpid()} {_process_start(os.getpid())}")
    return folder


def _owner_alive(folder: Path) -> bool:
    try:
        pid_text, _, start = (folder / OWNER_MARKER).read_text().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return True  # no readable marker: not provably ours, leave it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _process_start(pid) == start.strip() or not start.strip()


def sweep_dead_folders(parents: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Remove the folders an earlier app process left (crashed, killed): ours by prefix and marker,
    and that process no longer runs. Nothing else is touched."""
    removed = []
    for parent in parents:
        base = Path(parent)
        for child in list(base.iterdir()) if base.is_dir() else []:
            if not child.name.startswith((LIVE_PREFIX, GRADIO_PREFIX)) or not child.is_dir() or child.is_symlink():
                continue
            if (child / OWNER_MARKER).is_file() and not _owner_alive(child):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child.name)
    return removed


def own_gradio_temp(environ: dict[str, str] | None = None) -> Path:
    """Point Gradio's cache (uploads, downloads) at a folder of this process, inside the one it
    would use: shutdown removes it whole, and a later start removes it if this process crashed.
    Call before the app is built (Gradio reads the variable when it makes its blocks and routes)."""
    environ = os.environ if environ is None else environ
    base = Path(environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")
    base.mkdir(parents=True, exist_ok=True)
    sweep_dead_folders([base, tempfile.gettempdir()])
    folder = owned_folder(GRADIO_PREFIX, base)
    environ["GRADIO_TEMP_DIR"] = str(folder)
    return folder


class LiveFolder:
    """One folder for every live run's trace, pruned by age: nothing accumulates in /tmp."""

    def __init__(self, max_age_s: float = FILE_MAX_AGE_S) -> None:
        self.max_age_s = max_age_s
        self.path = owned_folder(LIVE_PREFIX)
        atexit.register(self.remove)  # a stopped server leaves nothing in /tmp (SIGTERM: see on_shutdown)

    def new_file(self, name: str) -> Path:
        self.prune()
        folder = Path(tempfile.mkdtemp(dir=self.path))
        return folder / name

    def prune(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        removed = 0
        for child in list(self.path.iterdir()) if self.path.exists() else []:
            try:
                if child.name != OWNER_MARKER and now - child.stat().st_mtime > self.max_age_s:
                    shutil.rmtree(child, ignore_errors=True)
                    removed += 1
            except OSError:
                continue
        return removed

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def remove_app_files(folders: Sequence[str | os.PathLike[str]], demo: Any = None) -> None:
    """The app's temp folders, and every file Gradio cached for it (uploads, downloads)."""
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    for files in getattr(demo, "temp_file_sets", []) or []:
        for name in list(files):
            path = Path(name)
            try:
                path.unlink(missing_ok=True)
                path.parent.rmdir()  # Gradio gives each cached file a folder of its own
            except OSError:
                continue


# The reaper: a small process started with the app that waits for the app to end, however it ends
# (SIGTERM, SIGINT, a crash, SIGKILL), then removes its folders. Removing them from inside the
# dying app races with its own threads: a live run saving its trace, Gradio caching a download or
# an upload can write a file after the removal walked past, and leave it. Once the app is gone
# nothing writes any more. It reads a pipe whose other end only the app holds: end of file = gone.
_REAPER = """
import os, shutil, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal reaches the whole group
signal.signal(signal.SIGTERM, signal.SIG_IGN)
fd = int(sys.argv[1])
os.write(1, b"ready\\n")
while os.read(fd, 4096):
    pass
for folder in sys.argv[2:]:
    for _ in range(3):
        shutil.rmtree(folder, ignore_errors=True)
"""


def start_reaper(folders: Sequence[str | os.PathLike[str]]) -> Any:
    """Start the process that removes `folders` once this process has ended (see `_REAPER`); it
    answers once it is listening. The app's end is the end of a pipe only this process writes."""
    import subprocess
    import sys

    read_end, write_end = os.pipe()  # both close on exec: only the reaper gets the read end
    try:
        reaper = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _REAPER, str(read_end), *map(str, folders)],
            pass_fds=(read_end,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,  # not in the app's process group: a signal to the group spares it
        )
    finally:
        os.close(read_end)
    reaper.stdout.readline()  # "ready": it holds its end of the pipe
    reaper.write_end = write_end  # kept open until this process ends
    return reaper


def on_shutdown(folders: Sequence[str | os.PathLike[str]], demo: Any = None) -> None:
    """On SIGTERM (how a Space is stopped at every restart) and SIGINT, remove the app's files, then
    exit: atexit handlers do not run on a signal's default action. The reaper removes whatever a
    thread still wrote meanwhile, after the exit."""
    import signal

    def stop(signum: int, _frame: Any) -> None:
        remove_app_files(folders, demo)
        os._exit(128 + signum if signum == signal.SIGINT else 0)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
