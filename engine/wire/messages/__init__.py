"""Every operation on the wire as a typed message (msgspec Structs), one module per direction:
to_worker and to_supervisor (the bus), control (client -> engine) and to_client (answers and
stream events). registry holds them by op; codec reads and writes headers; dispatch finds
each op's handler."""
