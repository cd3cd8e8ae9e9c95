"""What every learner shares: network blocks, normalizers, value heads, replay storage and samplers,
exploration rules, checkpoints, the non-finite guard, run directories, metric logging and progress."""
