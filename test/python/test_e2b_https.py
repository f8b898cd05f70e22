"""The unmodified e2b Python SDK with only E2B_DOMAIN and E2B_API_KEY: Recipe B of research e2b.md.

No API or sandbox URL is set, so the SDK does what it does against E2B's cloud: the API at
https://api.<E2B_DOMAIN>, each sandbox's envd at https://49983-<id>.<E2B_DOMAIN>. The edge's HTTPS
listener answers with a certificate from a test CA, trusted through SSL_CERT_FILE (httpx reads it).
Names under the domain resolve to 127.0.0.1 here by wrapping socket.getaddrinfo, which
socket.create_connection looks up at call time; glibc does not resolve *.localhost by itself.
test/e2b-python.test.ts runs this file and checks Envoy's access log for the host-routed calls.
"""

import os
import socket

import pytest
from e2b import Sandbox, SandboxNotFoundException

REQUIRED_ENV = ("E2B_API_KEY", "E2B_DOMAIN", "SSL_CERT_FILE")
_real_getaddrinfo = socket.getaddrinfo


def _loopback_for_domain(host, *args, **kwargs):
    domain = os.environ["E2B_DOMAIN"].split(":")[0]
    if isinstance(host, str) and (host == domain or host.endswith("." + domain)):
        host = "127.0.0.1"
    return _real_getaddrinfo(host, *args, **kwargs)


@pytest.fixture(scope="module", autouse=True)
def configured():
    missing = [name for name in REQUIRED_ENV if not os.environ.get(name)]
    if missing:
        pytest.fail(f"set {', '.join(missing)} (test/e2b-python.test.ts does)")
    for name in ("E2B_API_URL", "E2B_SANDBOX_URL"):
        if os.environ.get(name):
            pytest.fail(f"{name} must be unset: this file tests host routing")
    socket.getaddrinfo = _loopback_for_domain
    yield
    socket.getaddrinfo = _real_getaddrinfo


def test_create_run_and_files_by_host_over_tls():
    sbx = Sandbox.create("base", envs={"VIA": "https"})
    try:
        assert sbx.get_host(49983) == f"49983-{sbx.sandbox_id}.{os.environ['E2B_DOMAIN']}"
        out = sbx.commands.run('echo "$VIA $(hostname)"')
        assert out.stdout == f"https {sbx.sandbox_id}\n"
        sbx.files.write("/tmp/over-tls.txt", "host routing from python")
        assert sbx.files.read("/tmp/over-tls.txt") == "host routing from python"
        print(f"SANDBOX_ID={sbx.sandbox_id}")
    finally:
        assert Sandbox.kill(sbx.sandbox_id) is True
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sbx.sandbox_id)
