"""Typed experiment configs (loader, range checks) and presets; the bottom layer every package may import."""
