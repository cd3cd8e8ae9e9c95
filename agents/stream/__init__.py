"""Streaming learners (stream-x): one transition at a time, as it happens, with no replay and no batch."""
