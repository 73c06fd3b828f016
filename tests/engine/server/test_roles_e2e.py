"""Issue 14, item 8: roles enforced by the server. Any client (any allowlisted CURVE key too)
could cancel another's request, read its audit, stop workers and reconfigure. Now a key's role
is its allowlist sub-directory, each op needs a role, and requests belong to their submitter."""

from __future__ import annotations

import pytest

from engine.client import RemoteError
from engine.wire.curve import generate_keys, load_client_keys, load_public_key
from engine.wire.roles import OP_ROLES, ROLES

pytestmark = pytest.mark.e2e  # real engine processes

# one call per op whose effect is harmless (it fails for other reasons, or changes nothing)
CALLS = {
    "status": {}, "ping": {}, "keyframe": {}, "page_metadata": {"pool": "decode-0"}, "scope": {},
    "prompt_log": {}, "ground_truth": {}, "history": {}, "submit": {"prompt_ids": [256, 1], "max_new_tokens": 1},
    "cancel": {"request_id": "nobody"}, "audit": {"request_id": "nobody"}, "canary": {}, "ack_alert": {"ids": []},
    "start": {"worker": "nobody"}, "stop": {"worker": "nobody"}, "restart": {"worker": "nobody"},
    "reconfigure": {"changes": {}, "apply": False},
}


@pytest.fixture(scope="module")
def curve_server(tmp_path_factory):
    from engine.client.local_server import LocalServer, write_config
    from engine.config import EngineConfig

    tmp = tmp_path_factory.mktemp("roles")
    keys = tmp / "keys"
    made = generate_keys(keys, clients=5)["clients"]
    placed = {"admin": "client", "viewer": "client-2", "operator": "client-3", "operator-2": "client-4"}
    for role, name in placed.items():
        if role != "admin":
            folder = keys / "clients" / role.split("-")[0]
            folder.mkdir(exist_ok=True)
            made[name]["key"].rename(folder / f"{name}.key")
    config = write_config(tmp / "config.toml", EngineConfig().replace(model={"device": "cpu"},
                                                                       engine={"kernels": "torch"}))
    server = LocalServer(config, "--curve", "--keys", str(keys))
    server_key = load_public_key(keys / "server.key")
    clients = {role: server.client(server_key=server_key, client_keys=load_client_keys(
        keys / "clients" / f"{name}.key_secret")) for role, name in placed.items()}
    server.wait_workers(clients["admin"])
    yield server, clients
    server.stop()


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("op", sorted(OP_ROLES))
def test_each_role_may_send_exactly_its_ops(curve_server, role, op):
    _, clients = curve_server
    allowed = ROLES.index(role) >= ROLES.index(OP_ROLES[op])
    try:
        clients[role].call(op, timeout_s=60, **CALLS[op])
        refused = None
    except RemoteError as exc:  # other refusals (a worker named nobody, ...) are not the role's
        refused = str(exc) if exc.code == "forbidden" and "role; this client is" in str(exc) else None
    assert (refused is None) == allowed, (role, op, refused)
    if refused:
        assert f"op {op!r} needs the {OP_ROLES[op]} role; this client is a {role}" in refused


def test_requests_belong_to_their_submitter(curve_server):
    _, clients = curve_server
    mine, other, admin = clients["operator"], clients["operator-2"], clients["admin"]
    stream = mine.submit([256, 7, 8], max_new_tokens=1500, ignore_eos=True)
    rid = next(mine.events(stream)).get("request_id")
    for op in ("cancel", "audit"):
        with pytest.raises(RemoteError) as err:
            other.call(op, request_id=rid, timeout_s=60)
        assert err.value.code == "forbidden" and "belongs to another client" in str(err.value)
    assert mine.audit(rid)["request"]["request_id"] == rid  # its own
    assert admin.audit(rid)["request"]["request_id"] == rid  # an admin sees any
    assert admin.cancel(rid)["cancelled"] is True  # and may cancel any


def test_without_curve_every_client_has_the_local_role(start_server):
    server = start_server("--local-role", "viewer")
    client = server.client()
    assert client.status()["workers"]  # a viewer watches
    for op, fields in (("submit", CALLS["submit"]), ("stop", {"worker": "decode-0"})):
        with pytest.raises(RemoteError) as err:
            client.call(op, timeout_s=60, **fields)
        assert err.value.code == "forbidden" and "this client is a viewer" in str(err.value)
    assert all(w["state"] == "ready" for w in client.status()["workers"])


def test_without_curve_loopback_clients_own_their_own_requests(start_server):
    """Two loopback clients with the same local role: each owns what it submitted. Before,
    every loopback connection was the one owner "local", so any local client cancelled or
    audited any other's requests (in the mode docs/SECURITY.md recommends for shared hosts)."""
    server = start_server("--local-role", "operator")
    mine, other = server.client(), server.client()
    stream = mine.submit([256, 7, 8], max_new_tokens=1500, ignore_eos=True)
    rid = next(mine.events(stream)).get("request_id")
    for op in ("cancel", "audit"):
        with pytest.raises(RemoteError) as err:
            other.call(op, request_id=rid, timeout_s=60)
        assert err.value.code == "forbidden" and "belongs to another client" in str(err.value)
    assert mine.audit(rid)["request"]["request_id"] == rid
    assert mine.cancel(rid)["cancelled"] is True  # its own
