"""Helpers for payloads run by dflash-launch (stdlib only; torch is imported lazily)."""

__version__ = "0.1.0"
