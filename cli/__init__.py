"""The `q2real` command line: the one place that may import every other package."""
