"""PageWarden's agent inside vLLM: vLLM's real block pool, by owner request, with isolation checks.

`connector.py` is the only module that imports vLLM (a v1 KV connector, loaded by vLLM with
`--kv-transfer-config`); `snapshot.py`, `checks.py`, `page_book.py` and `agent_server.py` are
plain Python, tested without vLLM. docs/vllm-agent.md says how to turn it on.
"""
