"""Llama-family decoder in plain torch and its HF-checkpoint loader.

Import what you need from the submodules (`engine.model.load.load_model`,
`engine.model.config.read_model_config`); this package stays import-light so that
reading a config.json does not pull in torch.
"""
