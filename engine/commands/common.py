"""What every command shares: exit codes, error printing, config loading, key flags."""

from __future__ import annotations

from engine.client.command_line import EXIT_FINDING, EXIT_OK, EXIT_USAGE, add_engine_args, connect, fail

__all__ = ["EXIT_FINDING", "EXIT_OK", "EXIT_USAGE", "add_engine_args", "add_model_args", "connect", "fail",
           "load_config"]


def load_config(args):
    """The --config file (default config when absent) with --model/--dtype/--device/--kernels applied."""
    from engine.config import load_config as load

    config = load(getattr(args, "config", None))
    overrides = {}
    if getattr(args, "model", None):
        overrides["path"] = args.model
    for key in ("dtype", "device"):
        if getattr(args, key, None):
            overrides[key] = getattr(args, key)
    engine_overrides = {"kernels": args.kernels} if getattr(args, "kernels", None) else {}
    return config.replace(model=overrides, engine=engine_overrides)


def add_model_args(parser, *, dtype: bool = True) -> None:
    """--config, --model, --device, --kernels (and --dtype) of a command that runs the engine."""
    parser.add_argument("--config", help="engine TOML config (default: resources/configs/default.toml)")
    parser.add_argument("--model", help="local HF checkpoint directory (default: the embedded model)")
    if dtype:
        parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--device", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--kernels", choices=["auto", "triton", "torch"])
