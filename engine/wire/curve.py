"""CurveZMQ for PageWarden: key files, a ZAP allowlist of client public keys, the bind policy.

CURVE alone encrypts but authenticates nobody: without a ZAP handler libzmq accepts every
client key. CurveServer runs pyzmq's ThreadAuthenticator with an allowlist callback and sets
ZAP_ENFORCE_DOMAIN on each secured socket, so a missing or stopped handler refuses everyone.

Key directory layout (files in the ZeroMQ certificate format read by zmq.auth):
    DIR/server.key, DIR/server.key_secret
    DIR/clients/client.key, DIR/clients/client.key_secret, DIR/clients/client-2.key, ...
The allowlist is every DIR/clients/*.key; copy a client's public .key there to admit it.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from engine.wire.roles import ROLES
from engine.wire.sockets import check_bind_policy, is_curve_secured, require_fresh

if TYPE_CHECKING:
    from _typeshed import StrPath

__all__ = ["ZAP_DOMAIN", "generate_keys", "load_server_keys", "load_client_keys", "load_public_key",
           "load_allowlist", "CurveServer", "secure_client", "check_bind_policy", "is_curve_secured"]

log = logging.getLogger(__name__)

ZAP_DOMAIN = "pagewarden"
_SECRET_BANNER = ("#   PageWarden CurveZMQ SECRET key (ZeroMQ certificate format).\n"
                  "#   Keep it private and mode 0600; never copy it to another user.\n")
_PUBLIC_BANNER = ("#   PageWarden CurveZMQ public key (ZeroMQ certificate format).\n"
                  "#   A server admits a client whose public key is in its clients/ directory.\n")


# ---- key files --------------------------------------------------------------------------

def _write_cert(path: Path, public: bytes, secret: bytes | None, overwrite: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_TRUNC if overwrite else os.O_EXCL)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        os.fchmod(f.fileno(), 0o600)  # an overwritten file keeps its old mode otherwise
        f.write(_SECRET_BANNER if secret else _PUBLIC_BANNER)
        f.write(f'metadata\ncurve\n    public-key = "{public.decode()}"\n')
        if secret:
            f.write(f'    secret-key = "{secret.decode()}"\n')


def generate_keys(directory: Path, *, clients: int = 1, overwrite: bool = False) -> dict[str, Any]:
    """Write a server key pair and `clients` client key pairs (client, client-2, ...) under
    `directory` (layout in the module docstring); files 0600, directories 0700. Returns
    {"directory", "server": {"public_key", "key", "key_secret"}, "clients": {name: same}} with
    paths and z85 public keys (never secrets). Raises FileExistsError naming the first existing
    key file unless overwrite, ValueError for clients < 0."""
    if clients < 0:
        raise ValueError(f"clients must be >= 0, got {clients}")
    directory = Path(directory)
    names = [(directory, "server")] + [
        (directory / "clients", "client" if i == 1 else f"client-{i}") for i in range(1, clients + 1)]
    if not overwrite:
        for folder, name in names:
            for path in (folder / f"{name}.key", folder / f"{name}.key_secret"):
                if path.exists() or path.is_symlink():
                    raise FileExistsError(f"refusing to overwrite the existing key file {path} "
                                          "(ask explicitly to overwrite)")
    for folder in (directory, directory / "clients"):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
    result: dict[str, Any] = {"directory": directory, "server": None, "clients": {}}
    for folder, name in names:
        public, secret = zmq.curve_keypair()
        entry: dict[str, Any] = {"public_key": public.decode(), "key": folder / f"{name}.key",
                                 "key_secret": folder / f"{name}.key_secret"}
        _write_cert(entry["key"], public, None, overwrite)
        _write_cert(entry["key_secret"], public, secret, overwrite)
        if name == "server":
            result["server"] = entry
        else:
            result["clients"][name] = entry
    return result


def _z85_key(key: object, what: str) -> bytes:
    """A CURVE key as 40 z85 bytes; accepts z85 text/bytes or 32 raw bytes. Raises ValueError."""
    if isinstance(key, str):
        key = key.encode("ascii", "replace")
    if not isinstance(key, (bytes, bytearray)):
        raise ValueError(f"{what}: expected a CURVE key as bytes, got {type(key).__name__}")
    key = bytes(key)
    if len(key) == 32:
        return z85.encode(key)
    try:
        if len(key) == 40 and len(z85.decode(key)) == 32:
            return key
    except (KeyError, ValueError, IndexError, TypeError):
        pass
    raise ValueError(f"{what}: not a CURVE key (want 40 z85 characters or 32 bytes, got {len(key)})")


def _read_cert(path: StrPath) -> tuple[bytes, bytes | None]:
    """(public, secret or None) from a certificate file, both z85; secret checked to match."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"key file {path} not found")
    try:
        text = path.read_text(encoding="ascii")
    except (UnicodeDecodeError, OSError) as e:
        raise ValueError(f"key file {path} is not a ZeroMQ certificate ({e})") from e
    fields = {}
    for line in text.splitlines():
        name, eq, value = line.strip().partition("=")
        if eq and name.strip() in ("public-key", "secret-key"):
            fields[name.strip()] = value.strip().strip("'\"")
    if "public-key" not in fields:
        raise ValueError(f"key file {path} has no public-key line (not a ZeroMQ certificate)")
    public = _z85_key(fields["public-key"], f"public-key in {path}")
    secret = None
    if "secret-key" in fields:
        secret = _z85_key(fields["secret-key"], f"secret-key in {path}")
        if zmq.curve_public(secret) != public:
            raise ValueError(f"key file {path}: the secret key does not belong to the public key")
    return public, secret


def _read_pair(path: Path) -> tuple[bytes, bytes]:
    public, secret = _read_cert(path)
    if secret is None:
        raise ValueError(f"key file {path} holds no secret-key (expected a .key_secret file)")
    return public, secret


def load_public_key(file: StrPath) -> bytes:
    """The z85 public key in a certificate file (.key or .key_secret). Raises FileNotFoundError
    or ValueError naming the file."""
    return _read_cert(file)[0]


def load_server_keys(directory: StrPath) -> tuple[bytes, bytes]:
    """(public, secret) z85 from DIR/server.key_secret (or from that file if given one).
    Raises FileNotFoundError or ValueError naming the file."""
    path = Path(directory)
    return _read_pair(path if path.is_file() else path / "server.key_secret")


def load_client_keys(key_file_or_dir: StrPath) -> tuple[bytes, bytes]:
    """(public, secret) z85 of a client: a .key_secret file (a .key file means its .key_secret
    sibling), or a directory holding client.key_secret or clients/client.key_secret.
    Raises FileNotFoundError or ValueError naming the file."""
    path = Path(key_file_or_dir)
    if path.is_dir():
        candidates = [path / "client.key_secret", path / "clients" / "client.key_secret"]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            raise FileNotFoundError(f"no client key: neither {candidates[0]} nor {candidates[1]} exists")
        path = found
    elif path.suffix == ".key":
        path = path.with_name(path.name + "_secret")
    return _read_pair(path)


def load_allowlist(directory: StrPath) -> dict[bytes, str]:
    """z85 public key -> role, for every *.key file in `directory` (role admin) and in its
    viewer/, operator/ and admin/ sub-directories (engine/wire/roles.py). A key in two places
    gets the narrower role. Raises FileNotFoundError for a missing directory, ValueError naming
    a malformed file."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"allowlist directory {directory} not found")
    roles: dict[bytes, str] = {}
    for role, folder in (("admin", directory), *((r, directory / r) for r in ROLES)):
        for path in sorted(folder.glob("*.key")) if folder.is_dir() else ():
            key = load_public_key(path)
            roles[key] = min(roles.get(key, role), role, key=ROLES.index)
    return roles


# ---- server and client ------------------------------------------------------------------

_HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
# keyed by int: recv_monitor_message gives the event as a plain int
_COUNTED: dict[int, str] = {zmq.EVENT_HANDSHAKE_SUCCEEDED: "accepted",
                            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "bad_handshake",
                            zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "other"}


class CurveServer:
    """CurveZMQ server side for one zmq.Context: the server key pair from `key_dir`, a ZAP
    handler (ThreadAuthenticator) admitting only client keys in `allowlist_dir` (default
    key_dir/clients), and refusal counters for a status page. One per context (libzmq allows
    one ZAP handler per context). Call stop() before terminating the context.

    Refusals by the allowlist are counted in the ZAP handler. A client with a wrong server key
    or no CURVE at all fails before ZAP; count those with watch()/count_events()/unwatch() in
    the thread that owns the secured socket."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], key_dir: StrPath, *,
                 allowlist_dir: StrPath | None = None, domain: str = ZAP_DOMAIN) -> None:
        """Raises FileNotFoundError/ValueError for bad key files, RuntimeError when the context
        already has a ZAP handler."""
        self.context = context
        self.domain = domain
        self.public_key, self._secret_key = load_server_keys(key_dir)
        self.allowlist_dir = Path(allowlist_dir) if allowlist_dir else Path(key_dir) / "clients"
        self._allowed = load_allowlist(self.allowlist_dir)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("accepted", "unknown_key", "bad_handshake", "other"), 0)
        self._recent_keys: collections.deque[str] = collections.deque(maxlen=8)
        self._serial = itertools.count()
        self._stopped = False
        self._auth = ThreadAuthenticator(context)
        try:
            self._auth.start()
        except zmq.ZMQError as e:
            self._auth.stop()
            raise RuntimeError(f"this context already has a ZAP handler ({e})") from e
        self._auth.configure_curve_callback(domain, self)

    # the credentials provider of zmq.auth: runs in the authenticator thread
    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP decision for a CURVE client key (z85): True when allowlisted; counts refusals."""
        if domain == self.domain and key in self._allowed:
            return True
        with self._lock:
            self._counts["unknown_key"] += 1
            self._recent_keys.append(key.decode("ascii", "replace"))
        log.info("refused a CURVE client whose key is not in %s: %s", self.allowlist_dir, key)
        return False

    def secure(self, sock: zmq.Socket[bytes]) -> zmq.Socket[bytes]:
        """Make `sock` a CURVE server checked by this ZAP handler (curve_server, keys, ZAP
        domain, ZAP_ENFORCE_DOMAIN: no handler means no entry). Call before bind. Raises
        ValueError for a socket already bound or connected, RuntimeError after stop()."""
        if self._stopped:
            raise RuntimeError("CurveServer is stopped")
        require_fresh(sock, "secure()")
        sock.curve_server = True
        sock.curve_publickey = self.public_key
        sock.curve_secretkey = self._secret_key
        sock.zap_domain = self.domain.encode()
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        return sock

    def watch(self, sock: zmq.Socket[bytes]) -> zmq.Socket[bytes]:
        """Monitor the handshakes of `sock`: returns a PAIR socket for the poller of the thread
        owning `sock`; call count_events() when it is readable and unwatch() before closing it.
        Closing the PAIR while `sock` is still monitored blocks the context's I/O thread at the
        next event (libzmq sends monitor events blocking), freezing every socket in it."""
        address = f"inproc://pagewarden-curve-watch-{id(self)}-{next(self._serial)}"
        sock.monitor(address, _HANDSHAKE_EVENTS)
        monitor = self.context.socket(zmq.PAIR)
        monitor.linger = 0
        monitor.connect(address)
        return monitor

    def count_events(self, monitor: zmq.Socket[bytes]) -> int:
        """Read every waiting event of a watch() socket without blocking and add it to the
        counters; returns how many were read."""
        read = 0
        while monitor.poll(0):
            event = recv_monitor_message(monitor)["event"]
            read += 1
            if event in _COUNTED:
                with self._lock:
                    self._counts[_COUNTED[event]] += 1
        return read

    def unwatch(self, sock: zmq.Socket[bytes], monitor: zmq.Socket[bytes]) -> None:
        """Stop monitoring `sock` (unless already closed), count what is left, close `monitor`."""
        if not sock.closed:
            sock.disable_monitor()
        self.count_events(monitor)
        monitor.close()

    def role_of(self, user_id: str | None) -> str | None:
        """The role of an authenticated client (its ZAP User-Id is its z85 public key); None
        for a key no longer in the allowlist (it was removed after the client connected)."""
        return self._allowed.get(user_id.encode()) if user_id else None

    def allowed_keys(self) -> frozenset[bytes]:
        """The z85 client public keys admitted now."""
        return frozenset(self._allowed)

    def reload(self) -> int:
        """Re-read the allowlist directory; returns the number of keys. New connections see it;
        connections already authenticated stay. Raises like load_allowlist, keeping the old list."""
        self._allowed = load_allowlist(self.allowlist_dir)
        return len(self._allowed)

    def refusals(self) -> dict[str, Any]:
        """Counters: total refused; unknown_key (the allowlist said no); bad_handshake (wrong
        server key, plaintext or garbage client) and other (e.g. no ZAP handler), both from
        watched sockets only; accepted (watched sockets); recent_keys (z85 of the last refused
        keys). A refused client that keeps reconnecting counts once per try."""
        with self._lock:
            counts: dict[str, Any] = dict(self._counts, recent_keys=list(self._recent_keys))
        counts["total"] = counts["unknown_key"] + counts["bad_handshake"] + counts["other"]
        return counts

    def stop(self) -> None:
        """Stop the ZAP handler; secured sockets then refuse every new connection
        (ZAP_ENFORCE_DOMAIN). Safe to call twice."""
        if not self._stopped:
            self._stopped = True
            self._auth.stop()

    def __enter__(self) -> CurveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def secure_client(sock: zmq.Socket[bytes], server_public: bytes, client_public: bytes,
                  client_secret: bytes) -> zmq.Socket[bytes]:
    """Make `sock` a CURVE client of the server with public key `server_public`. Call before
    connect. Raises ValueError for a malformed key, a secret that does not match
    `client_public`, or a socket already connected."""
    server_public = _z85_key(server_public, "server public key")
    client_public = _z85_key(client_public, "client public key")
    client_secret = _z85_key(client_secret, "client secret key")
    if zmq.curve_public(client_secret) != client_public:
        raise ValueError("the client secret key does not belong to the client public key")
    require_fresh(sock, "secure_client()")
    sock.curve_serverkey = server_public
    sock.curve_publickey = client_public
    sock.curve_secretkey = client_secret
    return sock
