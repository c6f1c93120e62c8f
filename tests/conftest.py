import fcntl
import lzma
import os
import shutil
import threading
from pathlib import Path

import pytest



def pytest_collection_modifyitems(config, items):
    """GPU tests run only where CUDA is available (the lent GPU machine)."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def runs_with_exports(tmp_path_factory):
    """A function (data folder, run names) -> a temporary copy of those run directories with
    their nsys exports, stored as report.sqlite.xz to keep the repository small, decompressed
    (the analysis reads plain SQLite; memory snapshots stay compressed, as it reads those)."""
    def copy(data: Path, names: tuple[str, ...]) -> Path:
        root = tmp_path_factory.mktemp(data.name)
        for name in names:
            shutil.copytree(data / name, root / name,
                            ignore=shutil.ignore_patterns("*.sqlite.xz"))
            (root / name / "report.sqlite").write_bytes(
                lzma.decompress((data / name / "report.sqlite.xz").read_bytes()))
        return root

    return copy


def _on_a_thread(command):
    """A thread (not started) that runs ``command``, and a function that waits for it and
    returns what it raised (None, or the exception)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            command()
        except BaseException as exc:  # noqa: BLE001 — returned to the test
            raised.append(exc)

    other = threading.Thread(target=run)

    def finish() -> BaseException | None:
        other.join()
        return raised[0] if raised else None

    return other, finish


def _told_of_flock(monkeypatch, thread: threading.Thread, asks: threading.Event,
                   lock: Path | None = None) -> None:
    """``asks`` set once ``thread`` asks for an exclusive ``flock`` (on the file ``lock`` only,
    where given)."""
    real_flock = fcntl.flock

    def flock(fd, op):
        if threading.current_thread() is thread and op & fcntl.LOCK_EX:
            try:
                if lock is None or os.path.samestat(os.fstat(fd), os.stat(lock)):
                    asks.set()
            except OSError:  # (no such lock file now: another one's flock)
                pass
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)


@pytest.fixture
def meanwhile(monkeypatch):
    """A function (owner, name, command) -> a function that waits for ``command`` and returns
    what it raised (None, or the exception): ``command`` runs on a thread from inside the first
    call of ``owner.name`` (as another process writing the same place would run then) until it
    is done or waits for its turn to put its files in place (an exclusive ``flock``: it then
    goes on once this command's turn ends). Forces an interleaving of two commands with no
    timing deciding it."""
    def start(owner, name: str, command):
        waits = threading.Event()
        other, finish = _on_a_thread(command)
        real = getattr(owner, name)

        def hooked(*args, **kwargs):
            if threading.current_thread() is not other and other.ident is None:
                other.start()
                while other.is_alive() and not waits.wait(0.05):
                    pass
            return real(*args, **kwargs)

        _told_of_flock(monkeypatch, other, waits)
        monkeypatch.setattr(owner, name, hooked)
        return finish

    return start


@pytest.fixture
def waiting_on(monkeypatch):
    """A function (lock, command) -> a function that waits for ``command`` and returns what it
    raised (None, or the exception): ``command`` runs on a thread, and the call returns once
    that thread asks for an exclusive ``flock`` on the file ``lock`` (which the test holds, or
    the command takes at once). For what a command does, or leaves undone, until its turn."""
    def start(lock: Path, command):
        asks = threading.Event()
        other, finish = _on_a_thread(command)
        _told_of_flock(monkeypatch, other, asks, lock)
        other.start()
        while not asks.wait(0.05):
            assert other.is_alive(), finish()
        return finish

    return start
