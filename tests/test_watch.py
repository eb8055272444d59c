"""DirectoryWatcher: inotify and the polling fallback, on real folders and threads."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devplug.host import watch
from devplug.host.watch import DirectoryWatcher
from devplug.kit.retries import CappedBackoff

WAIT = 5.0  # seconds: a generous bound on "soon", never an assertion on timing
POLL = 0.02  # the fallback's interval in these tests

needs_inotify = pytest.mark.skipif(watch._inotify_lib is None, reason="inotify is Linux-only")


class Recorder:
    """A callback that records every call and lets a test wait for the names it expects."""

    def __init__(self) -> None:
        self.calls: list[frozenset[str]] = []
        self._cond = threading.Condition()

    def __call__(self, names: frozenset[str]) -> None:
        with self._cond:
            self.calls.append(names)
            self._cond.notify_all()

    def seen(self) -> set[str]:
        with self._cond:
            return set().union(*self.calls)

    def wait_for(self, predicate: Callable[[list[frozenset[str]]], bool]) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self.calls), timeout=WAIT)

    def wait_names(self, *names: str) -> bool:
        return self.wait_for(lambda calls: set(names) <= set().union(*calls))

    def wait_rescan(self) -> bool:
        return self.wait_for(lambda calls: frozenset() in calls)

    def clear(self) -> None:
        with self._cond:
            self.calls.clear()


@pytest.fixture(params=["inotify", "poll"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every behaviour test runs on both paths: inotify and the polling fallback."""
    if request.param == "inotify":
        if watch._inotify_lib is None:
            pytest.skip("inotify is Linux-only")
        monkeypatch.delenv(watch.POLL_ENV, raising=False)
    else:
        monkeypatch.setenv(watch.POLL_ENV, "1")
    return str(request.param)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def watched(tmp_path: Path, mode: str, recorder: Recorder) -> Iterator[DirectoryWatcher]:
    watcher = DirectoryWatcher(tmp_path, recorder, poll_interval=POLL)
    watcher.start()
    assert watcher.uses_inotify is (mode == "inotify")
    yield watcher
    watcher.close()


def test_create_is_seen(tmp_path: Path, watched: DirectoryWatcher, recorder: Recorder) -> None:
    (tmp_path / "dev0").write_text("")
    assert recorder.wait_names("dev0")


def test_modify_is_seen(tmp_path: Path, mode: str, recorder: Recorder) -> None:
    target = tmp_path / "dev0"
    target.write_text("a")
    with DirectoryWatcher(tmp_path, recorder, poll_interval=POLL):
        with target.open("a") as handle:
            handle.write("more")
        assert recorder.wait_names("dev0")


def test_delete_is_seen(tmp_path: Path, mode: str, recorder: Recorder) -> None:
    target = tmp_path / "dev0"
    target.write_text("")
    with DirectoryWatcher(tmp_path, recorder, poll_interval=POLL):
        target.unlink()
        assert recorder.wait_names("dev0")


def test_rename_reports_both_names(tmp_path: Path, mode: str, recorder: Recorder) -> None:
    (tmp_path / "old").write_text("")
    with DirectoryWatcher(tmp_path, recorder, poll_interval=POLL):
        (tmp_path / "old").rename(tmp_path / "new")
        assert recorder.wait_names("old", "new")


def test_no_call_without_changes_before_one(tmp_path: Path, mode: str, recorder: Recorder) -> None:
    (tmp_path / "quiet").write_text("")
    with DirectoryWatcher(tmp_path, recorder, poll_interval=POLL):
        (tmp_path / "marker").write_text("")
        assert recorder.wait_names("marker")
    assert "quiet" not in recorder.seen()


def test_changes_queued_during_a_callback_come_in_one_call(tmp_path: Path, mode: str) -> None:
    """While the callback is busy, changes pile up; the next call carries all of them."""
    entered = threading.Event()
    release = threading.Event()
    calls: list[frozenset[str]] = []
    got_batch = threading.Event()

    def callback(names: frozenset[str]) -> None:
        calls.append(names)
        if len(calls) == 1:
            entered.set()
            release.wait(WAIT)
        elif {"a", "b", "c"} <= set().union(*calls[1:]):
            got_batch.set()

    with DirectoryWatcher(tmp_path, callback, poll_interval=POLL):
        (tmp_path / "first").write_text("")
        assert entered.wait(WAIT)
        for name in ("a", "b", "c"):
            (tmp_path / name).write_text("x")
        release.set()
        assert got_batch.wait(WAIT)
    assert calls[1] >= {"a", "b", "c"}


def test_close_is_prompt_and_idempotent(tmp_path: Path, mode: str, recorder: Recorder) -> None:
    # A poll interval far longer than the test's timeout: close() must wake the thread, not wait it out.
    watcher = DirectoryWatcher(tmp_path, recorder, poll_interval=3600)
    watcher.start()
    thread = watcher._thread
    assert thread is not None
    assert thread.is_alive()
    assert thread.daemon
    watcher.close()
    assert not thread.is_alive()
    watcher.close()  # again: nothing happens
    assert not thread.is_alive()


def test_close_releases_file_descriptors(tmp_path: Path, mode: str, recorder: Recorder) -> None:
    before = set(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    if before is None:
        pytest.skip("needs /proc/self/fd")
    watcher = DirectoryWatcher(tmp_path, recorder, poll_interval=POLL)
    watcher.start()
    assert len(set(os.listdir("/proc/self/fd")) - before) >= 2  # at least the wake-up pipe
    watcher.close()
    assert set(os.listdir("/proc/self/fd")) <= before


def test_close_before_start_and_no_restart(tmp_path: Path, recorder: Recorder) -> None:
    watcher = DirectoryWatcher(tmp_path, recorder)
    watcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        watcher.start()


def test_start_twice_is_an_error(tmp_path: Path, recorder: Recorder) -> None:
    with DirectoryWatcher(tmp_path, recorder) as watcher, pytest.raises(RuntimeError, match="already"):
        watcher.start()


def test_close_from_the_callback(tmp_path: Path, mode: str) -> None:
    closed = threading.Event()
    holder: list[DirectoryWatcher] = []

    def callback(names: frozenset[str]) -> None:
        holder[0].close()
        closed.set()

    watcher = DirectoryWatcher(tmp_path, callback, poll_interval=POLL)
    holder.append(watcher)
    watcher.start()
    thread = watcher._thread
    assert thread is not None
    (tmp_path / "x").write_text("")
    assert closed.wait(WAIT)
    thread.join(WAIT)
    assert not thread.is_alive()


def test_poll_env_forces_the_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(watch.POLL_ENV, "1")
    recorder = Recorder()
    with DirectoryWatcher(tmp_path, recorder, poll_interval=POLL) as watcher:
        assert not watcher.uses_inotify
        (tmp_path / "polled").write_text("")
        assert recorder.wait_names("polled")


@needs_inotify
def test_inotify_is_the_default_on_linux(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(watch.POLL_ENV, raising=False)
    recorder = Recorder()
    # With an hour-long poll interval, only inotify can report the change in time.
    with DirectoryWatcher(tmp_path, recorder, poll_interval=3600) as watcher:
        assert watcher.uses_inotify
        (tmp_path / "notified").write_text("")
        assert recorder.wait_names("notified")


def test_directory_deleted_and_recreated(tmp_path: Path, mode: str, recorder: Recorder) -> None:
    folder = tmp_path / "devices"
    folder.mkdir()
    with DirectoryWatcher(folder, recorder, poll_interval=POLL):
        (folder / "a").write_text("")
        assert recorder.wait_names("a")
        shutil.rmtree(folder)
        assert recorder.wait_rescan()
        recorder.clear()
        folder.mkdir()
        (folder / "b").write_text("")
        # The reappearance is announced with a rescan; later changes are seen again, by name.
        assert recorder.wait_rescan()
        (folder / "c").write_text("")
        assert recorder.wait_names("c")


def test_directory_moved_away_then_replaced(tmp_path: Path, mode: str, recorder: Recorder) -> None:
    folder = tmp_path / "devices"
    folder.mkdir()
    with DirectoryWatcher(folder, recorder, poll_interval=POLL):
        folder.rename(tmp_path / "elsewhere")
        assert recorder.wait_rescan()
        recorder.clear()
        # Changes in the moved folder no longer concern the watcher; the path's new folder does.
        (tmp_path / "elsewhere" / "ghost").write_text("")
        folder.mkdir()
        assert recorder.wait_rescan()
        (folder / "fresh").write_text("")
        assert recorder.wait_names("fresh")
    assert "ghost" not in recorder.seen()


def test_missing_directory_at_start_is_watched_once_it_appears(tmp_path: Path, mode: str, recorder: Recorder) -> None:
    folder = tmp_path / "later"
    with DirectoryWatcher(folder, recorder, poll_interval=POLL):
        folder.mkdir()
        assert recorder.wait_rescan()
        (folder / "x").write_text("")
        assert recorder.wait_names("x")


def test_a_file_at_start_is_a_problem_until_a_folder_replaces_it(tmp_path: Path, mode: str, recorder: Recorder) -> None:
    """Issue 36, item 8: a file where the folder should be is looked past, as a missing folder, and said."""
    path = tmp_path / "file"
    path.write_text("")
    problems: list[str | None] = []
    with DirectoryWatcher(path, recorder, poll_interval=POLL, on_problem=problems.append) as watcher:
        assert watcher.problem is not None and "is not a folder" in watcher.problem
        path.unlink()
        path.mkdir()
        assert recorder.wait_rescan()
        assert watcher.problem is None
        (path / "x").write_text("")
        assert recorder.wait_names("x")
    assert problems[0] is not None and problems[-1] is None


def test_a_folder_replaced_by_a_file_then_restored(tmp_path: Path, mode: str, recorder: Recorder) -> None:
    """Issue 36, item 8: the watcher stopped (NotADirectoryError) and never saw the folder come back."""
    folder = tmp_path / "devices"
    folder.mkdir()
    problems: list[str | None] = []
    with DirectoryWatcher(folder, recorder, poll_interval=POLL, on_problem=problems.append) as watcher:
        shutil.rmtree(folder)
        folder.write_text("not a folder")
        assert recorder.wait_rescan()
        assert recorder.wait_for(lambda _calls: watcher.problem is not None)
        assert "is not a folder" in str(watcher.problem)
        recorder.clear()
        folder.unlink()
        folder.mkdir()
        (folder / "back").write_text("")
        assert recorder.wait_rescan() or recorder.wait_names("back")
        assert watcher.problem is None
        (folder / "later").write_text("")
        assert recorder.wait_names("later")
        assert watcher._thread is not None and watcher._thread.is_alive()
    assert any(p is not None and "is not a folder" in p for p in problems)
    assert problems[-1] is None


def test_an_unexpected_error_restarts_the_watch_with_a_rescan(
    tmp_path: Path, mode: str, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36, item 8: the thread never dies silently; it restarts after a backoff, saying so meanwhile."""
    monkeypatch.setattr(watch, "RESTART_BACKOFF", CappedBackoff(retry_min=0.2, retry_max=0.2))
    problems: list[str | None] = []
    failing = threading.Event()
    with DirectoryWatcher(tmp_path, recorder, poll_interval=POLL, on_problem=problems.append) as watcher:
        real = watcher._deliver_queued if mode == "inotify" else watcher._deliver_poll
        attr = "_deliver_queued" if mode == "inotify" else "_deliver_poll"

        def broken() -> None:
            if not failing.is_set():
                failing.set()
                raise RuntimeError("a bug in the watcher")
            real()

        monkeypatch.setattr(watcher, attr, broken)
        (tmp_path / "trigger").write_text("")
        assert failing.wait(WAIT)
        assert recorder.wait_for(lambda _calls: any(p and "a bug in the watcher" in p for p in problems))
        assert recorder.wait_rescan()  # armed again: whatever happened meanwhile was missed
        assert recorder.wait_for(lambda _calls: watcher.problem is None)
        (tmp_path / "after").write_text("")
        assert recorder.wait_names("after")


def test_a_raising_callback_is_logged_and_the_watcher_goes_on(
    tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()

    def callback(names: frozenset[str]) -> None:
        recorder(names)
        if "boom" in names:
            raise RuntimeError("callback exploded")

    caplog.set_level(logging.ERROR, logger="devplug.host.watch")
    with DirectoryWatcher(tmp_path, callback, poll_interval=POLL) as watcher:
        (tmp_path / "boom").write_text("")
        assert recorder.wait_names("boom")
        (tmp_path / "after").write_text("")
        assert recorder.wait_names("after")
        assert watcher._thread is not None
        assert watcher._thread.is_alive()
    failures = [r for r in caplog.records if r.name == "devplug.host.watch" and r.exc_info]
    assert failures
    assert "callback exploded" in str(failures[0].exc_info[1])  # type: ignore[index]


@needs_inotify
def test_queue_overflow_asks_for_a_rescan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorder: Recorder) -> None:
    """More events than the kernel queues (fs.inotify.max_queued_events) while the callback is busy."""
    try:
        limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    except OSError:
        pytest.skip("cannot read fs.inotify.max_queued_events")
    if limit > 100_000:
        pytest.skip(f"max_queued_events is {limit}: too many files to overflow it in a test")
    monkeypatch.delenv(watch.POLL_ENV, raising=False)
    entered = threading.Event()
    release = threading.Event()

    def callback(names: frozenset[str]) -> None:
        recorder(names)
        if not entered.is_set():
            entered.set()
            release.wait(WAIT)

    with DirectoryWatcher(tmp_path, callback):
        (tmp_path / "first").write_text("")
        assert entered.wait(WAIT)
        target = tmp_path / "churn"
        target.touch()
        for _ in range(limit + 10):  # each touch queues an IN_ATTRIB; the kernel merges only equal neighbours
            os.utime(target)
            (tmp_path / "other").touch()
        release.set()
        assert recorder.wait_rescan()


def test_sync_delivers_what_changed_before_it(tmp_path: Path, mode: str, recorder: Recorder) -> None:
    # An hour between polling rounds: only sync() can report the change in time.
    with DirectoryWatcher(tmp_path, recorder, poll_interval=3600) as watcher:
        (tmp_path / "dev0").write_text("x")
        watcher.sync()
        assert "dev0" in recorder.seen()  # at once: no waiting for the thread
        (tmp_path / "dev0").unlink()
        watcher.sync()
        assert "dev0" in recorder.calls[-1]
        calls = len(recorder.calls)
        watcher.sync()  # nothing changed since: no call
        assert len(recorder.calls) == calls


def test_sync_before_start_and_after_close_does_nothing(tmp_path: Path, recorder: Recorder) -> None:
    watcher = DirectoryWatcher(tmp_path, recorder)
    (tmp_path / "dev0").write_text("x")
    watcher.sync()
    watcher.start()
    watcher.close()
    (tmp_path / "dev1").write_text("x")
    watcher.sync()
    assert "dev1" not in recorder.seen()


@needs_inotify
def test_each_write_false_reports_a_file_when_its_writer_closes_it(tmp_path: Path, recorder: Recorder) -> None:
    target = tmp_path / ".log"
    with DirectoryWatcher(tmp_path, recorder, each_write=False) as watcher:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            watcher.sync()
            recorder.clear()  # the creation
            os.write(fd, b"one\n")
            os.write(fd, b"two\n")
            watcher.sync()
            assert recorder.calls == []  # appends to a file kept open wake no one
        finally:
            os.close(fd)
        watcher.sync()
        assert ".log" in recorder.seen()
