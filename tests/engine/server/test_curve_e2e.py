"""`serve --curve`: only allowlisted client keys get in; everyone else is refused and the
server keeps serving."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.config import REPO_ROOT
from engine.wire.curve import generate_keys, load_client_keys, load_public_key, load_server_keys

pytestmark = pytest.mark.e2e  # real engine processes



def test_curve_allowlist(start_server, tmp_path):
    keys = tmp_path / "keys"
    made = subprocess.run([sys.executable, "main.py", "keys", "generate", str(keys)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert all((p.stat().st_mode & 0o777) == 0o600 for p in keys.rglob("*.key*"))
    stranger_dir = tmp_path / "stranger"
    generate_keys(stranger_dir)  # a valid key pair that is not on the server's allowlist

    server = start_server("--curve", "--keys", str(keys), wait=False)
    server_key = load_public_key(keys / "server.key")
    allowed = load_client_keys(keys / "clients" / "client.key")
    good = server.client(server_key=server_key, client_keys=allowed)
    server.wait_workers(good)
    assert good.status()["engine"]["curve"] is True
    expected = good.generate([256, 8, 9], max_new_tokens=4, ignore_eos=True)["token_ids"]

    refused = {
        "unknown client key": dict(server_key=server_key, client_keys=load_client_keys(stranger_dir)),
        "wrong server key": dict(server_key=load_server_keys(stranger_dir)[0], client_keys=allowed),
        "plaintext": {},
    }
    for what, kwargs in refused.items():
        client = server.client(timeout_s=1.5, **kwargs)
        with pytest.raises(TimeoutError):
            client.ping()
        assert what  # named in the failure output above

    # telemetry is guarded the same way
    sub_ok = server.subscriber(("metrics",), server_key=server_key, client_keys=allowed)
    sub_bad = server.subscriber(("metrics",), server_key=server_key, client_keys=load_client_keys(stranger_dir),
                                wait=False)
    assert sub_ok.recv(5.0) is not None
    assert sub_bad.recv(2.5) is None
    # and the allowed client is still served
    assert good.generate([256, 8, 9], max_new_tokens=4, ignore_eos=True)["token_ids"] == expected


def test_remote_bind_without_curve_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, "main.py", "serve", "--bind", "tcp://0.0.0.0:0"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "tcp://0.0.0.0:0" in proc.stderr and "CURVE" in proc.stderr
