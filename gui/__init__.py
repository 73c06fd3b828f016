"""The desktop app. Of the engine it imports only engine.wire, engine.client and engine.adapters
(the import contracts in pyproject.toml; tests/test_import_rules.py)."""
