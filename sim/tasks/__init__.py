"""Tasks shipped with q2real; each registers itself in `q2real.sim.registry`."""
