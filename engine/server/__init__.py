"""The supervisor side of PageWarden: sockets, authentication, supervision, telemetry."""
