"""The evidence journal: the incident record on disk (SQLite), written off the serving path.

No Qt and no torch here: the supervisor writes it, `evidence` and `snapshot --journal` read it
with the engine dead.
"""
