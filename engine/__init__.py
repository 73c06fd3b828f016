"""PageWarden's engine: no Qt here, ever."""

__version__ = "0.1.0"
