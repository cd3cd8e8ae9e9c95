"""Physics backends behind `PhysicsBackend`: native MuJoCo threads (CPU) and MJX (JAX)."""
