"""Views over gui.model; each gets the state it shows and emits commands as signals."""
