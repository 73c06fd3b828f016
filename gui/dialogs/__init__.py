"""Dialogs: attach, reconfigure, about."""
