"""Robot specs and models: the single source of joint names, limits, gains and control rates."""

from q2real.hardware.spec import ImuSpec, JointSpec, RobotSpec, SpecError, load_spec, robot_spec

__all__ = ["ImuSpec", "JointSpec", "RobotSpec", "SpecError", "load_spec", "robot_spec"]
