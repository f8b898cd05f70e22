# kubernetes-sigs' own Python SDK, `k8s-agent-sandbox` 1.0.8 from PyPI, unmodified, in Direct
# mode against our edge: claims through a Kubernetes API (KUBECONFIG), and the python-runtime data
# plane (X-Sandbox-ID with the API key in extra_headers) answered by the owning worker. Run for
# each tier by test/support/k8s-sigs-sdk.ts: the embedded system with the kubeconfig `make up`
# writes (test/k8s-sigs-python.test.ts, with a team's key) and our operator on a real
# kube-apiserver with that apiserver's kubeconfig (test/k8s/k8s-sigs-python.test.ts). It sets:
#   KUBECONFIG    the Kubernetes API the claims go through
#   ASB_API_KEY   the key the data plane carries
#   ASB_EDGE_URL  the edge's plain HTTP address (Direct mode's api_url)
#   POOL          a warm pool in namespace default
import io
import os
import time

import pytest
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.exceptions import SandboxRequestError, SandboxWarmPoolNotFoundError
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig


@pytest.fixture(scope="module")
def client():
    cfg = SandboxDirectConnectionConfig(
        api_url=os.environ["ASB_EDGE_URL"],
        extra_headers={"X-API-Key": os.environ["ASB_API_KEY"]},
    )
    with SandboxClient(connection_config=cfg) as c:
        yield c


@pytest.fixture(scope="module")
def sandbox(client):
    sb = client.create_sandbox(warmpool=os.environ["POOL"], namespace="default", sandbox_ready_timeout=60)
    yield sb
    sb.terminate()


def test_create_from_warm_pool(client, sandbox):
    assert sandbox.status()[0] == "SandboxReady"
    assert sandbox.claim_name in client.list_all_sandboxes("default")


def test_commands_run_output_and_exit_code(sandbox):
    r = sandbox.commands.run("echo 'hello from asb'")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (0, "hello from asb\n", "", False), r
    r = sandbox.commands.run("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n"), r
    assert sandbox.commands.run("sh -c 'exit 3'").exit_code == 3


def test_commands_run_timeout(sandbox):
    r = sandbox.commands.run("sleep 30", command_timeout=1)
    assert r.timed_out and r.exit_code == 124, r


def test_files_write_read_list_exists(sandbox):
    sandbox.files.write("dir/test.txt", "kept")
    big = os.urandom(1 << 20)
    sandbox.files.write("big.bin", io.BytesIO(big))  # streamed: chunked multipart
    assert sandbox.files.read("dir/test.txt") == b"kept"
    assert sandbox.files.read("big.bin") == big
    assert sandbox.files.exists("dir/test.txt")
    assert not sandbox.files.exists("nope.txt")
    entries = {e.name: e for e in sandbox.files.list("dir")}
    assert entries["test.txt"].size == 4 and entries["test.txt"].type == "file"
    top = {e.name: e.type for e in sandbox.files.list(".")}
    assert top.get("dir") == "directory" and top.get("big.bin") == "file", top
    # exec and files share one base directory
    assert sandbox.commands.run("cat dir/test.txt").stdout == "kept"


def test_files_read_missing_is_404(sandbox):
    with pytest.raises(SandboxRequestError) as err:
        sandbox.files.read("missing.txt")
    assert err.value.status_code == 404


def test_terminate(client):
    sb = client.create_sandbox(warmpool=os.environ["POOL"], namespace="default", sandbox_ready_timeout=60)
    claim = sb.claim_name
    assert sb.commands.run("true").exit_code == 0
    sb.terminate()
    assert claim not in client.list_all_sandboxes("default")


def test_missing_pool_fails_at_once(client):
    started = time.monotonic()
    with pytest.raises(SandboxWarmPoolNotFoundError):
        client.create_sandbox(warmpool="no-such-pool", namespace="default", sandbox_ready_timeout=30)
    assert time.monotonic() - started < 15, "the claim said WarmPoolNotFound, not a wait for the timeout"
