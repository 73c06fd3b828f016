"""The engine's command-line commands; main.py composes them (the GUI command lives there)."""
