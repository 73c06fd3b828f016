"""engine.wire.curve: key files, and CurveZMQ with a ZAP allowlist on real sockets over
tcp://127.0.0.1. A refused client is one that gets no reply within REPLY_MS."""

from __future__ import annotations

import os
import shutil
import stat
import time

import pytest
import zmq
import zmq.auth

from engine.wire.curve import (
    CurveServer,
    check_bind_policy,
    generate_keys,
    is_curve_secured,
    load_client_keys,
    load_public_key,
    load_server_keys,
    secure_client,
)
from engine.wire.sockets import bind_endpoint, harden
from tests.engine.wire.test_sockets import ctx, echo  # noqa: F401  (ctx is a fixture)

REPLY_MS = 1000


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def wait_for(condition, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def keys(tmp_path):
    return generate_keys(tmp_path / "keys", clients=2)


@pytest.fixture
def server(ctx, keys):  # noqa: F811
    curve = CurveServer(ctx, keys["directory"])
    yield curve
    curve.stop()


@pytest.fixture
def router(ctx, server):  # noqa: F811
    """A secured, watched control ROUTER: (socket, endpoint, monitor)."""
    sock = server.secure(harden(ctx.socket(zmq.ROUTER), "control"))
    endpoint = bind_endpoint(sock, "tcp://127.0.0.1:0")
    monitor = server.watch(sock)
    yield sock, endpoint, monitor
    server.unwatch(sock, monitor)


def curve_client(ctx, endpoint, server_public, client_pair, kind=zmq.DEALER):  # noqa: F811
    sock = ctx.socket(kind)
    sock.linger = 0
    if client_pair is not None:
        secure_client(sock, server_public, *client_pair)
    sock.connect(endpoint)
    return sock


def allowed_pair(keys, name="client"):
    return load_client_keys(keys["clients"][name]["key_secret"])


# ---- key files ---------------------------------------------------------------------------

def test_generated_key_files_are_private(tmp_path):
    directory = tmp_path / "keys"
    directory.mkdir(mode=0o755)
    old_umask = os.umask(0o022)
    try:
        made = generate_keys(directory, clients=3)
    finally:
        os.umask(old_umask)
    assert sorted(made["clients"]) == ["client", "client-2", "client-3"]
    assert mode(directory) == mode(directory / "clients") == 0o700
    files = sorted(p.name for p in directory.rglob("*") if p.is_file())
    assert files == sorted(["server.key", "server.key_secret"] + [
        f"{n}{ext}" for n in ("client", "client-2", "client-3") for ext in (".key", ".key_secret")])
    for path in directory.rglob("*"):
        if path.is_file():
            assert mode(path) == 0o600, path
    public = made["server"]["public_key"].encode()
    assert zmq.auth.load_certificate(made["server"]["key"]) == (public, None)  # the zmq.auth format
    assert zmq.auth.load_certificate(made["server"]["key_secret"])[0] == public
    assert load_server_keys(directory)[1].decode() not in repr(made)  # secrets stay in the files


def test_existing_keys_are_not_overwritten_unless_asked(tmp_path):
    directory = tmp_path / "keys"
    first = generate_keys(directory)

    def contents(folder):
        return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    before = contents(directory)
    with pytest.raises(FileExistsError, match="server.key"):
        generate_keys(directory)
    assert contents(directory) == before
    partial = tmp_path / "partial"  # one existing file refuses it all, before writing anything
    (partial / "clients").mkdir(parents=True)
    (partial / "clients" / "client-2.key").write_text("mine")
    with pytest.raises(FileExistsError, match="client-2.key"):
        generate_keys(partial, clients=2)
    assert list(contents(partial)) == [partial / "clients" / "client-2.key"]
    (directory / "clients" / "client.key_secret").chmod(0o644)
    second = generate_keys(directory, overwrite=True)
    assert second["server"]["public_key"] != first["server"]["public_key"]
    assert mode(directory / "clients" / "client.key_secret") == 0o600
    assert load_client_keys(directory)[0] == second["clients"]["client"]["public_key"].encode()


def test_key_files_load_back(keys):
    directory = keys["directory"]
    public, secret = load_server_keys(directory)
    assert public == keys["server"]["public_key"].encode() and zmq.curve_public(secret) == public
    assert load_server_keys(directory / "server.key_secret") == (public, secret)
    assert load_public_key(directory / "server.key") == public
    client = load_client_keys(directory)
    assert client[0] == keys["clients"]["client"]["public_key"].encode()
    assert (load_client_keys(directory / "clients") == load_client_keys(directory / "clients" / "client.key")
            == load_client_keys(directory / "clients" / "client.key_secret") == client)
    assert load_client_keys(keys["clients"]["client-2"]["key"])[0] != client[0]


GOOD_PUBLIC, GOOD_SECRET = zmq.curve_keypair()


@pytest.mark.parametrize("content, error", [
    (b"", "no public-key"),
    (b"\xff\xfe\x00garbage", "not a ZeroMQ certificate"),
    (b'curve\n    public-key = "tooshort"\n', "not a CURVE key"),
    (b'curve\n    public-key = "' + b"~" * 40 + b'"\n', "not a CURVE key"),
    (b'curve\n    public-key = "' + GOOD_PUBLIC + b'"\n    secret-key = "' + zmq.curve_keypair()[1] + b'"\n',
     "does not belong"),
])
def test_malformed_key_files_are_named(tmp_path, content, error):
    path = tmp_path / "bad.key_secret"
    path.write_bytes(content)
    for load in (load_public_key, load_server_keys, load_client_keys):
        with pytest.raises(ValueError, match=error) as err:
            load(path)
        assert str(path) in str(err.value)


def test_missing_or_public_only_key_files_are_named(tmp_path, keys):
    with pytest.raises(FileNotFoundError, match="server.key_secret"):
        load_server_keys(tmp_path)
    with pytest.raises(FileNotFoundError, match="client.key_secret"):
        load_client_keys(tmp_path)
    with pytest.raises(FileNotFoundError, match="nothing.key"):
        load_public_key(tmp_path / "nothing.key")
    public_only = tmp_path / "server-copy.key_secret"
    shutil.copy(keys["server"]["key"], public_only)
    with pytest.raises(ValueError, match="no secret-key") as err:
        load_server_keys(public_only)
    assert str(public_only) in str(err.value)


def test_a_malformed_allowlist_file_stops_the_server_with_its_name(ctx, keys):  # noqa: F811
    bad = keys["directory"] / "clients" / "broken.key"
    bad.write_text("not a key\n")
    with pytest.raises(ValueError, match="broken.key"):
        CurveServer(ctx, keys["directory"])


# ---- CURVE with the ZAP allowlist --------------------------------------------------------

@pytest.mark.parametrize("kind", [zmq.DEALER, zmq.REQ])
def test_an_allowlisted_client_gets_replies(ctx, keys, server, router, kind):  # noqa: F811
    sock, endpoint, monitor = router
    pair = allowed_pair(keys)
    client = curve_client(ctx, endpoint, server.public_key, pair, kind)
    client.send(b"hello")
    assert sock.poll(5000)
    frames = sock.recv_multipart(copy=False)
    assert frames[-1].get("User-Id") == pair[0].decode()  # who it is, for the supervisor
    sock.send_multipart(frames)
    assert client.poll(REPLY_MS) and client.recv() == b"hello"
    assert echo(sock, client, b"again") == b"again"
    assert is_curve_secured(sock)
    assert wait_for(lambda: server.count_events(monitor) >= 0 and server.refusals()["accepted"] >= 1)
    assert server.refusals()["total"] == 0


@pytest.mark.parametrize("intruder", ["unknown_key", "wrong_server_key", "plaintext"])
def test_refused_clients_get_nothing_and_the_server_keeps_serving(ctx, keys, server, router, intruder):  # noqa: F811
    sock, endpoint, monitor = router
    friend = curve_client(ctx, endpoint, server.public_key, allowed_pair(keys))
    assert echo(sock, friend, b"before", timeout_ms=5000) == b"before"
    stranger_pair = zmq.curve_keypair()
    bad = {"unknown_key": lambda: curve_client(ctx, endpoint, server.public_key, stranger_pair),
           "wrong_server_key": lambda: curve_client(ctx, endpoint, zmq.curve_keypair()[0], allowed_pair(keys)),
           "plaintext": lambda: curve_client(ctx, endpoint, None, None)}[intruder]()
    assert echo(sock, bad, b"let me in") is None
    assert echo(sock, friend, b"after") == b"after"
    late_friend = curve_client(ctx, endpoint, server.public_key, allowed_pair(keys, "client-2"))
    assert echo(sock, late_friend, b"late", timeout_ms=5000) == b"late"
    counter = "unknown_key" if intruder == "unknown_key" else "bad_handshake"
    assert wait_for(lambda: server.count_events(monitor) >= 0 and server.refusals()[counter] >= 1), \
        server.refusals()
    counts = server.refusals()
    assert counts["total"] == counts[counter]
    if intruder == "unknown_key":
        assert counts["recent_keys"][-1] == stranger_pair[0].decode()


def test_a_secured_pub_reaches_only_allowlisted_subscribers(ctx, keys, server):  # noqa: F811
    pub = server.secure(harden(ctx.socket(zmq.PUB), "telemetry"))
    endpoint = bind_endpoint(pub, "tcp://127.0.0.1:0")
    subs = {}
    for name, pair in (("friend", allowed_pair(keys)), ("stranger", zmq.curve_keypair())):
        subs[name] = curve_client(ctx, endpoint, server.public_key, pair, zmq.SUB)
        subs[name].subscribe(b"")
    deadline = time.monotonic() + 5
    while not subs["friend"].poll(20):  # a subscription takes a moment to reach the PUB
        pub.send(b"metrics")
        assert time.monotonic() < deadline, "the allowlisted subscriber never received"
    assert subs["friend"].recv() == b"metrics"
    deadline = time.monotonic() + REPLY_MS / 1000
    while time.monotonic() < deadline:
        pub.send(b"metrics")
        assert not subs["stranger"].poll(20)
    assert subs["friend"].poll(REPLY_MS)
    assert wait_for(lambda: server.refusals()["unknown_key"] >= 1)


def test_reload_admits_added_keys_and_refuses_removed_ones(ctx, tmp_path, keys, server, router):  # noqa: F811
    sock, endpoint, monitor = router
    newcomer = generate_keys(tmp_path / "elsewhere")["clients"]["client"]
    pair = load_client_keys(newcomer["key_secret"])
    shutil.copy(newcomer["key"], keys["directory"] / "clients" / "newcomer.key")
    assert pair[0] not in server.allowed_keys()
    assert echo(sock, curve_client(ctx, endpoint, server.public_key, pair), b"early") is None
    assert server.reload() == 3 and pair[0] in server.allowed_keys()
    admitted = curve_client(ctx, endpoint, server.public_key, pair)
    assert echo(sock, admitted, b"now", timeout_ms=5000) == b"now"
    (keys["directory"] / "clients" / "newcomer.key").unlink()
    assert server.reload() == 2
    assert echo(sock, curve_client(ctx, endpoint, server.public_key, pair), b"again") is None
    # reload() checks new connections only: the one authenticated earlier stays.
    assert echo(sock, admitted, b"still") == b"still"


def test_a_stopped_server_refuses_everyone(ctx, keys, server, router):  # noqa: F811
    sock, endpoint, monitor = router
    server.stop()  # no ZAP handler any more: ZAP_ENFORCE_DOMAIN fails closed
    time.sleep(0.3)  # let libzmq forget the ZAP endpoint (a request sent just before hangs)
    assert echo(sock, curve_client(ctx, endpoint, server.public_key, allowed_pair(keys)), b"hi") is None
    with pytest.raises(RuntimeError, match="stopped"):
        server.secure(ctx.socket(zmq.ROUTER))
    server.stop()  # twice is fine


def test_unwatch_leaves_the_context_working(ctx, keys, server):  # noqa: F811
    sock = server.secure(harden(ctx.socket(zmq.ROUTER), "control"))
    endpoint = bind_endpoint(sock, "tcp://127.0.0.1:0")
    server.unwatch(sock, server.watch(sock))
    client = curve_client(ctx, endpoint, server.public_key, allowed_pair(keys))
    assert echo(sock, client, b"events have nowhere to go", timeout_ms=5000) == b"events have nowhere to go"


def test_one_zap_handler_per_context(ctx, keys, server):  # noqa: F811
    with pytest.raises(RuntimeError, match="already has a ZAP handler"):
        CurveServer(ctx, keys["directory"])


def test_options_must_precede_bind_and_connect(ctx, keys, server):  # noqa: F811
    bound = ctx.socket(zmq.ROUTER)
    bound.bind("tcp://127.0.0.1:0")
    with pytest.raises(ValueError, match="already bound"):
        server.secure(bound)
    connected = ctx.socket(zmq.DEALER)
    connected.connect("tcp://127.0.0.1:1")
    with pytest.raises(ValueError, match="already bound or connected"):
        secure_client(connected, server.public_key, *allowed_pair(keys))


def test_secure_client_checks_its_keys(ctx, keys, server):  # noqa: F811
    public, secret = allowed_pair(keys)
    sock = ctx.socket(zmq.DEALER)
    with pytest.raises(ValueError, match="does not belong"):
        secure_client(sock, server.public_key, public, zmq.curve_keypair()[1])
    with pytest.raises(ValueError, match="server public key"):
        secure_client(sock, b"short", public, secret)
    assert secure_client(sock, server.public_key, public, secret) is sock  # keys are write-only


def test_non_loopback_binds_need_curve():
    with pytest.raises(ValueError, match=r"tcp://\*:7000"):
        check_bind_policy("tcp://*:7000", curve_enabled=False)
    check_bind_policy("tcp://*:7000", curve_enabled=True)
    check_bind_policy("tcp://127.0.0.1:7000", curve_enabled=False)
