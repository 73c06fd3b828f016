"""Qt-free state mirrors fed by decoded telemetry; widgets read them, never sockets."""
