"""What every process shares, and all a client or the app needs of the engine: the message
format and its limits (protocol), socket hardening and the one receive loop (sockets), CURVE
keys and the ZAP allowlist (curve), page states and the writer-tag format (page_tags), the
prompt form (prompt_form), the alert kinds (alert_kinds) and the defences and faults
(defences), and one typed message per op on every socket (messages). No torch, no Qt;
numpy, zmq, msgpack and msgspec only."""
