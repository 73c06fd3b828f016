"""PageWarden's verifying KV connector for vLLM: I3 (a transfer is used only once it matches
its manifest) inside vLLM's own prefill/decode transfer.

`connector.py` is the only module here that imports vLLM; `manifest.py` is plain Python and
`digest.py` needs torch only, so both are tested without vLLM. docs/vllm-verify.md says how to
turn it on and what it does not catch.
"""
