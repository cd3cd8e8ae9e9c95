"""Residual RL: per-step corrections learned on top of a behaviour-cloned base policy."""
