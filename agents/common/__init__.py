"""What every learner shares: run directories, metric logging and progress reporting."""
