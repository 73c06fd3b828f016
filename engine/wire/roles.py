"""Who may do what on the control socket: each op's least role, declared once, with the op's
struct (`least_role` in engine/wire/messages/control.py); the lists below follow from it.

    viewer    status, telemetry, page maps, alerts, scope and history: watching
    operator  + submit, cancel and audit its own requests, canaries, acknowledging alerts
    admin     + start/stop/restart workers, reconfigure (defences and faults too),
              cancel or audit any request

With CURVE a client's role is the allowlist sub-directory its public key is in
(clients/viewer/, clients/operator/, clients/admin/; a key directly in clients/ is admin, as
before roles existed). Without CURVE (loopback only) every client has `serve --local-role`
(default admin: whoever can reach a loopback socket is a user of this machine). The server
enforces it; the GUI's --readonly only stops asking.
"""

from __future__ import annotations

from engine.wire.messages.registry import CONTROL

ROLES = ("viewer", "operator", "admin")  # each may do everything the ones before it may
# The ops the supervisor answers, each with its least role: declared with each op's struct
# (`least_role`, engine/wire/messages/control.py).
OP_ROLES: dict[str, str] = {op: cls.least_role for op, cls in CONTROL.ops.items() if "supervisor" in cls.answered_by}
VIEWER_OPS = tuple(op for op, role in OP_ROLES.items() if role == "viewer")
OPERATOR_OPS = tuple(op for op, role in OP_ROLES.items() if role == "operator")
ADMIN_OPS = tuple(op for op, role in OP_ROLES.items() if role == "admin")
CLIENT_OPS = tuple(OP_ROLES)
READ_ONLY_OPS = VIEWER_OPS  # what a viewer (and the GUI's --readonly window) sends
DEFAULT_LOCAL_ROLE = "admin"


def check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; one of {', '.join(ROLES)}")
    return role


def allows(role: str, op: str) -> bool:
    """True when `role` may send `op` (an op not declared here is allowed to nobody)."""
    need = OP_ROLES.get(op)
    return need is not None and ROLES.index(check_role(role)) >= ROLES.index(need)
