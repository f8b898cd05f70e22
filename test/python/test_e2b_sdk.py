"""The unmodified `e2b` Python SDK from PyPI against a running Agent Sandbox system.

Configured only by the environment, as a user would configure it: E2B_API_KEY, E2B_API_URL and
E2B_SANDBOX_URL (both the edge's address: envd calls carry E2b-Sandbox-Id / E2b-Sandbox-Port),
E2B_DOMAIN. test/e2b-python.test.ts starts the system and runs this file; it also runs against
`make up` after `set -a; . .asb/env`.

The tests share one sandbox and run in file order: the last ones pause, resume and kill it.
Every wait is bounded by a deadline and a count of tries.
"""

import asyncio
import os
import time
import urllib.parse
import uuid
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterator, List, Optional, Tuple, TypeVar

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FileNotFoundException,
    FileType,
    FilesystemEventType,
    InvalidArgumentException,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxNotFoundException,
    SandboxNotRunningException,
    SandboxQuery,
    SandboxState,
)

T = TypeVar("T")

REQUIRED_ENV = ("E2B_API_KEY", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_DOMAIN")
SUITE = f"e2b-python-{uuid.uuid4().hex[:8]}"


def wait_for(what: str, fn: Callable[[], Optional[T]], timeout_s: float = 15.0, interval_s: float = 0.1) -> T:
    """Polls fn until it returns a value, at most timeout_s and timeout_s / interval_s + 1 tries."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / interval_s) + 1):
        value = fn()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            break
        time.sleep(interval_s)
    raise AssertionError(f"timed out waiting for {what}")


def read_until(events: Iterator[Tuple[Optional[str], Optional[str], Optional[bytes]]], done: Callable[[str], bool], limit: int = 10_000) -> str:
    """Reads a command handle's output (stdout and pty bytes) until done(all so far) holds."""
    seen = ""
    for _ in range(limit):
        stdout, _stderr, pty = next(events)
        if stdout is not None:
            seen += stdout
        if pty is not None:
            seen += pty.decode("utf-8", errors="replace")
        if done(seen):
            return seen
    raise AssertionError(f"output never matched; got {seen!r}")


def edge_headers(sandbox_id: str) -> dict:
    """How a plain HTTP client reaches envd at E2B_SANDBOX_URL: E2B's routing headers."""
    return {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"}


@pytest.fixture(scope="module", autouse=True)
def configured() -> None:
    missing = [name for name in REQUIRED_ENV if not os.environ.get(name)]
    if missing:
        pytest.fail(f"set {', '.join(missing)} (test/e2b-python.test.ts does)")


@pytest.fixture(scope="module")
def sbx(configured: None) -> Iterator[Sandbox]:
    sandbox = Sandbox.create("base", metadata={"suite": SUITE, "role": "main"}, envs={"GREETING": "hello from envs"})
    yield sandbox
    try:
        Sandbox.kill(sandbox.sandbox_id)
    except Exception:
        pass


def test_create_with_metadata_and_envs(sbx: Sandbox) -> None:
    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id
    assert info.metadata == {"suite": SUITE, "role": "main"}
    assert info.state == SandboxState.RUNNING
    assert sbx.is_running() is True
    assert sbx.commands.run('echo "$GREETING"').stdout == "hello from envs\n"


def test_run_in_the_foreground_stdout_stderr_exit_code_envs_cwd(sbx: Sandbox) -> None:
    result = sbx.commands.run('echo "$GREETING"; echo "$ONE" >&2; pwd', envs={"ONE": "one"}, cwd="/tmp")
    assert result.exit_code == 0
    assert result.stdout == "hello from envs\n/tmp\n"
    assert result.stderr == "one\n"
    streamed: List[str] = []
    sbx.commands.run("for i in 1 2 3; do echo line$i; done", on_stdout=streamed.append)
    assert "".join(streamed) == "line1\nline2\nline3\n"


def test_a_non_zero_exit_raises_command_exit_exception(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as caught:
        sbx.commands.run("echo partial; echo oops >&2; exit 7")
    assert caught.value.exit_code == 7
    assert caught.value.stdout == "partial\n"
    assert caught.value.stderr == "oops\n"


def test_background_command_takes_stdin_is_listed_and_killed(sbx: Sandbox) -> None:
    handle = sbx.commands.run('read line; echo "got:$line"; sleep 600', background=True, stdin=True)
    assert handle.pid > 0
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    sbx.commands.send_stdin(handle.pid, "ping\n")
    out = read_until(iter(handle), lambda s: "got:ping" in s)
    assert "got:ping\n" in out
    assert sbx.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException):
        handle.wait()
    assert handle.pid not in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(handle.pid) is False


def test_stream_input_feeds_a_command_and_a_pty(sbx: Sandbox) -> None:
    cat = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.stream_input(cat.pid, iter(["one\n", b"two\n"] + ["x" * 999 + "\n"] * 100))
    sbx.commands.close_stdin(cat.pid)
    assert cat.wait().stdout == "one\ntwo\n" + ("x" * 999 + "\n") * 100
    terminal = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
    sbx.pty.stream_input(terminal.pid, ["echo pty-$((20+22))\n", "exit 3\n"])
    screen: List[bytes] = []
    with pytest.raises(CommandExitException) as caught:
        terminal.wait(on_pty=screen.append)
    assert caught.value.exit_code == 3
    assert "pty-42" in b"".join(screen).decode("utf-8", errors="replace")
    with pytest.raises(NotFoundException):
        sbx.commands.stream_input(cat.pid, ["gone"])


def test_pty_create_input_and_resize(sbx: Sandbox) -> None:
    terminal = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
    events = iter(terminal)
    sbx.pty.send_stdin(terminal.pid, b"stty size; echo mark-$((6*7))\n")
    read_until(events, lambda s: "24 80" in s and "mark-42" in s)
    sbx.pty.resize(terminal.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(terminal.pid, b"stty size\n")
    read_until(events, lambda s: "30 100" in s)
    assert sbx.pty.kill(terminal.pid) is True


def test_files_write_read_list_exists_make_dir_rename_remove(sbx: Sandbox) -> None:
    written = sbx.files.write("/home/user/project/a.txt", "alpha")
    assert written.path == "/home/user/project/a.txt"
    assert sbx.files.read("/home/user/project/a.txt") == "alpha"
    assert bytes(sbx.files.read("/home/user/project/a.txt", format="bytes")) == b"alpha"
    sbx.files.write_files([{"path": "/home/user/project/b.bin", "data": bytes([0, 1, 2, 255])}])
    assert bytes(sbx.files.read("/home/user/project/b.bin", format="bytes")) == bytes([0, 1, 2, 255])
    assert sbx.files.make_dir("/home/user/project/sub") is True
    assert sbx.files.make_dir("/home/user/project/sub") is False
    listed = sorted((e.name, e.type) for e in sbx.files.list("/home/user/project"))
    assert listed == [("a.txt", FileType.FILE), ("b.bin", FileType.FILE), ("sub", FileType.DIR)]
    assert sbx.files.exists("/home/user/project/a.txt") is True
    assert sbx.files.exists("/home/user/project/nope") is False
    moved = sbx.files.rename("/home/user/project/a.txt", "/home/user/project/sub/c.txt")
    assert moved.path == "/home/user/project/sub/c.txt"
    assert sbx.files.get_info("/home/user/project/sub/c.txt").size == 5
    sbx.files.remove("/home/user/project/sub")
    assert sbx.files.exists("/home/user/project/sub/c.txt") is False
    with pytest.raises(FileNotFoundException):
        sbx.files.read("/home/user/project/nope")


def test_relative_and_tilde_paths_are_the_users_home(sbx: Sandbox) -> None:
    # Regression: a relative path was taken from /, so write("notes/a.txt") answered 403
    # "mkdir: cannot create directory '/notes'". envd takes relative paths and ~ from the home of
    # the request's user.
    written = sbx.files.write("notes/a.txt", "x")
    assert written.path == "/home/user/notes/a.txt"
    assert sbx.files.read("/home/user/notes/a.txt") == "x"
    assert sbx.commands.run("cat ~/notes/a.txt").stdout == "x"
    assert sbx.files.read("notes/a.txt") == "x"
    assert sbx.files.read("~/notes/a.txt") == "x"
    assert [e.path for e in sbx.files.list("notes")] == ["/home/user/notes/a.txt"]
    assert [e.name for e in sbx.files.list("~/notes")] == ["a.txt"]
    assert sbx.files.exists("~/notes/a.txt") is True
    assert sbx.files.exists("notes/nope") is False
    assert sbx.files.get_info("notes/a.txt").path == "/home/user/notes/a.txt"
    assert sbx.files.get_info("~").path == "/home/user"
    assert sbx.files.make_dir("~/notes/sub") is True
    assert sbx.files.get_info("/home/user/notes/sub").type == FileType.DIR
    moved = sbx.files.rename("notes/a.txt", "~/notes/sub/b.txt")
    assert moved.path == "/home/user/notes/sub/b.txt"
    assert sbx.commands.run("cat /home/user/notes/sub/b.txt").stdout == "x"
    assert sbx.commands.run("pwd", cwd="notes/sub").stdout == "/home/user/notes/sub\n"
    watcher = sbx.files.watch_dir("notes")
    sbx.commands.run("touch /home/user/notes/seen.txt")
    seen: List[Tuple[FilesystemEventType, str]] = []

    def created() -> Optional[bool]:
        seen.extend((e.type, e.name) for e in watcher.get_new_events())
        return True if (FilesystemEventType.CREATE, "seen.txt") in seen else None

    wait_for(f"a create event for seen.txt (seen {seen})", created)
    watcher.stop()
    sbx.files.remove("notes")
    assert sbx.files.exists("/home/user/notes") is False
    # As root, the same relative path is root's home.
    assert sbx.files.write("notes/r.txt", "r", user="root").path == "/root/notes/r.txt"
    assert sbx.commands.run("cat /root/notes/r.txt", user="root").stdout == "r"
    assert sbx.commands.run('echo "$HOME $USER"; cat ~/notes/r.txt', user="root").stdout == "/root root\nr"
    assert sbx.files.read("~/notes/r.txt", user="root") == "r"
    assert sbx.files.exists("/home/user/notes/r.txt") is False
    # ~name is refused, as envd refuses it.
    with pytest.raises(InvalidArgumentException):
        sbx.files.read("~root/notes/r.txt", user="root")


def test_watch_dir_reports_a_file_a_command_created(sbx: Sandbox) -> None:
    sbx.files.make_dir("/tmp/watched")
    watcher = sbx.files.watch_dir("/tmp/watched")
    sbx.commands.run("echo x > /tmp/watched/new.txt")
    seen: List[Tuple[FilesystemEventType, str]] = []

    def created() -> Optional[bool]:
        seen.extend((e.type, e.name) for e in watcher.get_new_events())
        return True if (FilesystemEventType.CREATE, "new.txt") in seen else None

    wait_for(f"a create event for new.txt (seen {seen})", created)
    watcher.stop()


def test_signed_upload_and_download_urls(sbx: Sandbox) -> None:
    up = sbx.upload_url("/tmp/up.txt")
    assert up.startswith(os.environ["E2B_SANDBOX_URL"]) and "signature=v1_" in up
    headers = edge_headers(sbx.sandbox_id)
    posted = httpx.post(up, files={"file": ("up.txt", b"uploaded by url")}, headers=headers, timeout=30)
    assert posted.status_code == 200, posted.text
    down = sbx.download_url("/tmp/up.txt")
    got = httpx.get(down, headers=headers, timeout=30)
    assert got.status_code == 200 and got.text == "uploaded by url"
    # A URL signed for one path does not open another.
    url = urllib.parse.urlsplit(down)
    query = dict(urllib.parse.parse_qsl(url.query))
    assert query["path"] == "/tmp/up.txt"
    forged = url._replace(query=urllib.parse.urlencode({**query, "path": "/etc/hostname"})).geturl()
    assert httpx.get(forged, headers=headers, timeout=30).status_code == 401


def test_list_filters_by_metadata_and_pages_with_next_token(configured: None) -> None:
    tag = {"suite": SUITE, "user id": "a&b=c d"}
    made = [Sandbox.create("base", metadata=tag) for _ in range(3)]
    try:
        ids = {s.sandbox_id for s in made}
        query = SandboxQuery(metadata=tag)
        pages = Sandbox.list(query=query, limit=2)
        first = pages.next_items()
        token = pages.next_token
        assert len(first) == 2 and pages.has_next and token
        second = pages.next_items()
        assert len(second) == 1 and not pages.has_next
        assert {s.sandbox_id for s in first + second} == ids
        assert all(s.metadata == tag for s in first + second)
        # The token alone resumes the listing, as from another process.
        resumed = Sandbox.list(query=query, limit=2, next_token=token).next_items()
        assert [s.sandbox_id for s in resumed] == [s.sandbox_id for s in second]
        # Another value matches nothing.
        assert Sandbox.list(query=SandboxQuery(metadata={"suite": SUITE, "user id": "a&b=c"})).next_items() == []
    finally:
        for s in made:
            s.kill()


def test_set_timeout_moves_the_end(sbx: Sandbox) -> None:
    before = datetime.now(timezone.utc)
    sbx.set_timeout(3600)
    after = datetime.now(timezone.utc)
    end = sbx.get_info().end_at
    # An hour from the call, to the second (end_at is whole milliseconds).
    assert before + timedelta(seconds=3599) <= end <= after + timedelta(seconds=3601)
    sbx.set_timeout(600)
    assert sbx.get_info().end_at < end


def test_pause_then_connect_keeps_files(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/kept.txt", "survives pause")
    assert sbx.pause() is True
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
    assert Sandbox.pause(sbx.sandbox_id) is False
    again = Sandbox.connect(sbx.sandbox_id)
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING
    assert again.files.read("/home/user/kept.txt") == "survives pause"
    assert again.commands.run("cat /home/user/kept.txt").stdout == "survives pause"


def test_kill_then_the_sandbox_is_not_found(sbx: Sandbox) -> None:
    assert sbx.kill() is True
    assert Sandbox.kill(sbx.sandbox_id) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sbx.sandbox_id)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sbx.sandbox_id)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout(sbx.sandbox_id, 60)
    with pytest.raises(SandboxNotRunningException):
        sbx.commands.run("true")
    assert sbx.is_running() is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect("nosuchsandbox0000000")


def test_async_sandbox_runs_writes_watches_and_kills(configured: None) -> None:
    async def scenario() -> None:
        sandbox = await AsyncSandbox.create("base", metadata={"suite": SUITE, "role": "async"}, envs={"WHO": "async"})
        try:
            assert (await sandbox.commands.run('echo "hi $WHO"')).stdout == "hi async\n"
            await sandbox.files.write("/tmp/async.txt", "written async")
            assert await sandbox.files.read("/tmp/async.txt") == "written async"
            created = asyncio.Event()
            names: List[str] = []

            def on_event(e) -> None:
                names.append(e.name)
                if e.type == FilesystemEventType.CREATE and e.name == "seen.txt":
                    created.set()

            await sandbox.files.make_dir("/tmp/awatch")
            watcher = await sandbox.files.watch_dir("/tmp/awatch", on_event)
            await sandbox.commands.run("touch /tmp/awatch/seen.txt")
            await asyncio.wait_for(created.wait(), 15)
            await watcher.stop()
        finally:
            assert await sandbox.kill() is True
        assert await AsyncSandbox.kill(sandbox.sandbox_id) is False

    asyncio.run(scenario())
