"""Typed experiment configs, presets and the `q2real` command line."""
