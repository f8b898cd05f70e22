"""Pause with memory through the unmodified `e2b` Python SDK, run by test/e2b-pause.test.ts.

That file starts a worker, the router and Envoy, applies a gVisor template (E2B_GVISOR_TEMPLATE,
which can keep memory) and a runc one (E2B_RUNC_TEMPLATE, which cannot yet), and sets E2B_API_KEY,
E2B_API_URL, E2B_SANDBOX_URL and E2B_DOMAIN. Each test uses sandboxes of its own.

The state that must survive lives only in a process's memory: a counter in a small HTTP server
started with commands.run(..., background=True), which answers each GET with the next number.
"""

import os
import time
from typing import Callable, Iterator, List, Optional, TypeVar

import httpx
import pytest
from e2b import Sandbox, SandboxException

T = TypeVar("T")

GVISOR = os.environ.get("E2B_GVISOR_TEMPLATE", "")
RUNC = os.environ.get("E2B_RUNC_TEMPLATE", "")
EDGE = os.environ.get("E2B_SANDBOX_URL", "")
API = os.environ.get("E2B_API_URL", "")
KEY = os.environ.get("E2B_API_KEY", "")
PORT = 9000

# Counts in memory only: nothing on disk tells a restarted server where it was.
COUNTER = (
    "import http.server\n"
    "n = 0\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        global n\n"
    "        n += 1\n"
    "        body = str(n).encode()\n"
    "        self.send_response(200)\n"
    "        self.send_header('content-length', str(len(body)))\n"
    "        self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "    def log_message(self, *a):\n"
    "        pass\n"
    f"http.server.HTTPServer(('0.0.0.0', {PORT}), H).serve_forever()\n"
)
# What a command inside the sandbox runs to ask the counter for its next number.
ASK = f"python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{PORT}/', timeout=5).read().decode())\""


def wait_for(what: str, fn: Callable[[], Optional[T]], timeout_s: float = 30.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = fn()
        except Exception:  # the thing is not up yet
            value = None
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def start_counter(sbx: Sandbox) -> None:
    sbx.files.write("/tmp/counter.py", COUNTER)
    sbx.commands.run("python3 /tmp/counter.py", background=True)
    wait_for("the counter to listen", lambda: sbx.commands.run(ASK).stdout.strip() or None)


def ask(sbx: Sandbox) -> int:
    return int(sbx.commands.run(ASK).stdout.strip())


def detail(sandbox_id: str) -> dict:
    """GET /sandboxes/{id} as the SDK calls it, for fields SandboxInfo does not carry (pauseMode)."""
    res = httpx.get(f"{API}/sandboxes/{sandbox_id}", headers={"X-API-KEY": KEY}, timeout=10)
    assert res.status_code == 200, res.text
    return res.json()


def our_view(sandbox_id: str) -> dict:
    """Our own REST view of the sandbox: the Suspended condition says what a pause kept."""
    res = httpx.get(f"{API}/v1/sandboxes/{sandbox_id}", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert res.status_code == 200, res.text
    return res.json()


@pytest.fixture(scope="module", autouse=True)
def configured() -> None:
    missing = [n for n in ("E2B_API_KEY", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_GVISOR_TEMPLATE", "E2B_RUNC_TEMPLATE") if not os.environ.get(n)]
    if missing:
        pytest.fail(f"set {', '.join(missing)} (test/e2b-pause.test.ts does)")


@pytest.fixture()
def made() -> Iterator[List[Sandbox]]:
    sandboxes: List[Sandbox] = []
    yield sandboxes
    for s in sandboxes:
        try:
            Sandbox.kill(s.sandbox_id)
        except Exception:
            pass


def test_default_pause_on_gvisor_keeps_a_background_servers_memory(made: List[Sandbox]) -> None:
    sbx = Sandbox.create(GVISOR, timeout=600)
    made.append(sbx)
    start_counter(sbx)
    assert [ask(sbx), ask(sbx)] == [2, 3]
    sbx.files.write("/home/user/note.txt", "kept")

    assert sbx.pause() is True  # the SDK's default: mode "full"
    assert Sandbox.get_info(sbx.sandbox_id).state.value == "paused"
    assert detail(sbx.sandbox_id)["pauseMode"] == "full"
    assert Sandbox.pause(sbx.sandbox_id) is False  # already paused

    again = Sandbox.connect(sbx.sandbox_id)
    assert ask(again) == 4, "the counter went on from its memory"
    assert again.files.read("/home/user/note.txt") == "kept"
    assert our_view(sbx.sandbox_id)["memoryRestored"]["restored"] is True


def test_connect_with_reboot_discards_the_memory_and_keeps_the_files(made: List[Sandbox]) -> None:
    sbx = Sandbox.create(GVISOR, timeout=600)
    made.append(sbx)
    start_counter(sbx)
    sbx.files.write("/home/user/note.txt", "kept")
    assert sbx.pause() is True
    again = Sandbox.connect(sbx.sandbox_id, on_resume="reboot")
    assert again.files.read("/home/user/note.txt") == "kept"
    gone = again.commands.run(ASK + " || echo refused")
    assert "refused" in gone.stdout, "a reboot starts from the files: the counter's process is gone"


def test_filesystem_pause_keeps_files_and_drops_processes(made: List[Sandbox]) -> None:
    sbx = Sandbox.create(GVISOR, timeout=600)
    made.append(sbx)
    start_counter(sbx)
    sbx.files.write("/home/user/kept.txt", "files survive")

    assert sbx.pause(mode="filesystem") is True
    assert detail(sbx.sandbox_id)["pauseMode"] == "filesystem"
    again = Sandbox.connect(sbx.sandbox_id)
    assert again.files.read("/home/user/kept.txt") == "files survive"
    gone = again.commands.run(ASK + " || echo refused")
    assert "refused" in gone.stdout, "the server's process did not survive a filesystem pause"


def test_on_timeout_pause_with_auto_resume_wakes_on_a_request_to_its_port(made: List[Sandbox]) -> None:
    sbx = Sandbox.create(GVISOR, timeout=120, lifecycle={"on_timeout": "pause", "auto_resume": True})
    made.append(sbx)
    info = Sandbox.get_info(sbx.sandbox_id)
    assert (info.lifecycle or {}).get("on_timeout") == "pause"
    assert (info.lifecycle or {}).get("auto_resume") is True
    start_counter(sbx)
    assert ask(sbx) == 2
    # The timeout is made short only now: under load, a 4-second one from the create could pause
    # the sandbox in the middle of start_counter's requests.
    sbx.set_timeout(4)

    wait_for("the pause at the timeout", lambda: Sandbox.get_info(sbx.sandbox_id).state.value == "paused" or None, 30)
    # pauseMode is there once the pause has finished (E2B omits it while a sandbox is still pausing).
    assert wait_for("the pause to finish", lambda: detail(sbx.sandbox_id).get("pauseMode"), 30) == "full"
    # A plain request to the server's port through the edge wakes it, memory and all.
    res = httpx.get(
        EDGE,
        headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(PORT), "X-Access-Token": sbx.traffic_access_token or ""},
        timeout=30,
    )
    assert res.status_code == 200, res.text
    assert res.text == "3"
    assert Sandbox.get_info(sbx.sandbox_id).state.value == "running"
    assert our_view(sbx.sandbox_id)["memoryRestored"]["restored"] is True


def test_full_pause_on_runc_is_a_clear_error_and_the_sandbox_keeps_running(made: List[Sandbox]) -> None:
    sbx = Sandbox.create(RUNC, timeout=600)
    made.append(sbx)
    start_counter(sbx)
    with pytest.raises(SandboxException) as refused:
        sbx.pause(mode="full")
    message = str(refused.value)
    assert 'mode="filesystem"' in message and "gvisor" in message, message
    assert Sandbox.get_info(sbx.sandbox_id).state.value == "running"
    assert ask(sbx) == 2, "still running, memory and all"


def test_default_pause_on_runc_keeps_files_and_says_memory_was_not_kept(made: List[Sandbox]) -> None:
    sbx = Sandbox.create(RUNC, timeout=600)
    made.append(sbx)
    start_counter(sbx)
    sbx.files.write("/home/user/kept.txt", "runc files")
    assert sbx.pause() is True
    assert detail(sbx.sandbox_id)["pauseMode"] == "filesystem"
    view = our_view(sbx.sandbox_id)
    assert view["memory"] == "not kept"
    assert view["suspension"]["reason"] == "MemoryNotKept"
    assert "CRIU" in view["suspension"]["message"], view["suspension"]
    again = Sandbox.connect(sbx.sandbox_id)
    assert again.files.read("/home/user/kept.txt") == "runc files"
