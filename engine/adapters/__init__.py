"""Adapters that read other inference engines' telemetry (vLLM, SGLang) into PageWarden's terms."""
