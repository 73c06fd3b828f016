"""Who may do what on the control socket: each op's least role, declared once.

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

ROLES = ("viewer", "operator", "admin")  # each may do everything the ones before it may
VIEWER_OPS = ("status", "ping", "keyframe", "page_metadata", "scope", "prompt_log", "ground_truth", "history")
OPERATOR_OPS = ("submit", "cancel", "audit", "canary", "ack_alert")
ADMIN_OPS = ("start", "stop", "restart", "reconfigure")
OP_ROLES = {**{op: "viewer" for op in VIEWER_OPS}, **{op: "operator" for op in OPERATOR_OPS},
            **{op: "admin" for op in ADMIN_OPS}}
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
