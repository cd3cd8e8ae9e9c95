"""The deploy node's settings: topics, command style, timing, the shield's settings and this machine's
robot, as a typed config (`q2real deploy B key=value`, a YAML preset, or flat ROS 2 parameters).

Every value is range-checked before anything starts, naming the key, since each one decides what
reaches the robot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from q2real.configs import checks
from q2real.configs.loader import ConfigError, merge, validated
from q2real.hardware.spec import RobotSpec, load_spec, robot_spec
from q2real.safety.shield import ShieldConfig

PolicyRuntime = Literal["auto", "compiled", "onnxruntime"]

NODE_NAME = "q2real_policy"
TRIGGER_SERVICES = ("start", "stop", "reset")
"""The operator's requests the rclpy node also serves as std_srvs/Trigger, on the same names as their topics."""
ROS_OWN_PARAMETERS = ("use_sim_time", "start_type_description_service")
"""Parameters every rclpy node declares itself (the second since Jazzy): not q2real settings."""


def resolve_topic(name: str, node: str = NODE_NAME) -> str:
    """ROS 2 topic name -> its absolute form: '~/estop' -> '/q2real_policy/estop', 'joint_states' ->
    '/joint_states'."""
    checks.ros_name("topic", name)
    if name.startswith("~/"):
        return f"/{node}/{name[2:]}"
    return name if name.startswith("/") else "/" + name


@dataclass
class TopicConfig:
    """ROS 2 topic names; `~/` is private to the node (`/q2real_policy/...`)."""

    joint_states: str = "/joint_states"
    """sensor_msgs/JointState from the robot: the measured positions and velocities every tick reads."""
    command: str | None = None
    """None: ros2_control's default for the command style (forward or trajectory controller)."""
    estop: str = "~/estop"
    """std_msgs/Bool: true latches ESTOP at once; false changes nothing (only a reset leaves ESTOP)."""
    reset: str = "~/reset"
    """std_msgs/Empty: the operator's reset, ESTOP, HOLD or DAMP back to PASSIVE."""
    start: str = "~/start"
    """std_msgs/Empty: the operator's start (the rclpy node also serves it as a std_srvs/Trigger)."""
    stop: str = "~/stop"
    """std_msgs/Empty: the operator's stop, a latched e-stop (a reset, then a start, resumes)."""
    mode: str = "~/mode"
    """std_msgs/String, latched (transient local): the shield's mode, published on every change."""
    task_command: str = "~/command"
    """std_msgs/Float64MultiArray: the task's command (a reach target), for policies that follow one;
    a command of the wrong length or outside the trained range is refused."""
    reward: str = "~/reward"
    """std_msgs/Float64, read while fine-tuning: a reward the node cannot compute (a scale, a vision
    system, an operator's score), for the learner's `reward=topic`; each value is the reward of the
    transition that ends at the next tick."""
    imu: str = "/imu/data"
    """sensor_msgs/Imu of the base, for policies that observe gravity or the base's angular velocity."""
    cmd_vel: str = "/cmd_vel"
    """geometry_msgs/Twist velocity command (linear.x, linear.y, angular.z), for joystick policies."""
    object_pose: str = "/object_pose"
    """geometry_msgs/PoseStamped of the tracked object, for manipulation policies that observe one."""
    diagnostics: str = "/diagnostics"
    """diagnostic_msgs/DiagnosticArray: the node's reports (`q2real monitor` follows them)."""

    def validate(self, command: str) -> None:
        """Every name valid, and no two roles on one topic (an e-stop topic that is also the joint
        states or the command topic would be fed by the wrong writer)."""
        keys = ("joint_states", "estop", "reset", "start", "stop", "mode", "task_command", "reward", "imu", "cmd_vel")
        keys += ("object_pose", "diagnostics")
        roles = {key: getattr(self, key) for key in keys}
        roles["command"] = command
        resolved: dict[str, str] = {}
        for key, name in roles.items():
            checks.ros_name(f"topics.{key}", name)
            topic = resolve_topic(name)
            if topic in resolved:
                raise ValueError(f"topics.{key}: '{topic}' is already the {resolved[topic]} topic")
            resolved[topic] = key


@dataclass
class InputsConfig:
    """Age limits of the inputs beside joint states (seconds, on the node's clock at arrival)."""

    imu_max_age: float = 0.05
    """Older than this (or a non-finite, non-unit reading), the policy stops: RUN drops to DAMP."""
    velocity_command_timeout: float = 0.5
    """A velocity command older than this is replaced by zero (stand still) until a new one arrives."""
    object_max_age: float = 0.5
    """Older than this, the policy stops: RUN falls back as for a joint-state fault."""
    imu_frame_id: str | None = None
    """The IMU driver's frame (`header.frame_id`); set, a reading in another frame (a second IMU on
    the topic) is refused; None: any frame."""
    max_angular_velocity: float = 35.0
    """rad/s; a gyro reading beyond it is a sensor fault (about 2000 deg/s, the full scale of common
    MEMS gyros), refused like a NaN."""
    max_object_distance: float = 5.0
    """m from the frame's origin; a tracked object farther away is a tracker fault, refused."""
    max_stamp_skew: float | None = None
    """s; set, a joint state whose header stamp is further than this from this machine's wall clock (a
    1970 or 2038 stamp, a clock that drifted) is refused: freshness is judged on arrival, and such a
    stamp says the message cannot be trusted to be the robot's present. An unset stamp (0, as some
    drivers send) is refused too: with this set, the robot must stamp its joint states. None (the
    default): stamps are not compared, for robots whose clock is not synchronized with this machine's."""

    def validate(self) -> None:
        checks.number("inputs.imu_max_age", self.imu_max_age, above=0.0, at_most=0.5)
        checks.number("inputs.velocity_command_timeout", self.velocity_command_timeout, above=0.0, at_most=10.0)
        checks.number("inputs.object_max_age", self.object_max_age, above=0.0, at_most=5.0)
        if self.max_stamp_skew is not None:
            checks.number("inputs.max_stamp_skew", self.max_stamp_skew, above=0.0, at_most=3600.0)
        if self.imu_frame_id is not None and not self.imu_frame_id.strip():
            raise ValueError("inputs.imu_frame_id: expected a frame name, got an empty string")
        checks.number("inputs.max_angular_velocity", self.max_angular_velocity, above=0.0, at_most=200.0)
        checks.number("inputs.max_object_distance", self.max_object_distance, above=0.0, at_most=100.0)


@dataclass
class RealtimeConfig:
    """Scheduling of the node's process on a robot computer (see the README's real-time section).

    Applied before the node's threads start, so each of them inherits it; a setting the OS denies
    stops the node with the reason instead of running with less than was asked for.
    """

    cpus: tuple[int, ...] = ()
    """CPU affinity (e.g. cores isolated with isolcpus); empty: any CPU."""
    priority: int = 0
    """SCHED_FIFO priority 1-99 (ros2_control's guide uses 50); 0: the normal scheduler."""
    lock_memory: bool = False
    """mlockall: no page of the process may be swapped out or faulted in lazily during a tick."""
    gc: Literal["between_ticks", "automatic"] = "between_ticks"
    """`between_ticks`: the start-up heap is frozen and Python's cyclic collector runs only right
    after a tick, never inside one; `automatic`: Python's default (a collection may land mid-tick)."""
    switch_interval: float = 0.0005
    """Seconds a Python thread may hold the GIL while the ticking thread waits for it (Python's
    default, 0.005, is 2.5 periods at 500 Hz)."""

    def validate(self) -> None:
        checks.numbers("realtime.cpus", self.cpus, at_least=0, at_most=4095)
        if len(set(self.cpus)) != len(self.cpus):
            raise ValueError(f"realtime.cpus: a CPU is listed twice in {list(self.cpus)}")
        checks.number("realtime.priority", self.priority, at_least=0, at_most=99)
        checks.number("realtime.switch_interval", self.switch_interval, above=0.0, at_most=0.1)


@dataclass
class RobotLearningSettings:
    """Fine-tuning on the robot beside the node (`q2real deploy BUNDLE --finetune RUN_DIR`), the robot's
    side (the `finetune` section): a learner process trains on the node's transitions and publishes new
    versions of the bundle, which the node validates, swaps in at a tick boundary and rolls back when
    they do worse. The learner's own settings (`FinetuneConfig`) go through `learner`. Off while `run` is
    None."""

    run: str | None = None
    """The trained run the bundle was exported from: the learner continues its checkpoint (critic too)."""
    directory: str | None = None
    """Where the transition ring, every version, the learner's run and its log go; None: a new
    `finetune-<time>-<suffix>` folder in the trained run's directory (`run`), or in `runs/` for a remote
    learner."""
    publish_every: float = 5.0
    """Seconds between the learner's published versions once its actor moves."""
    noise_std: float = 0.1
    """Exploration: Gaussian noise (action units) on the policy's action before the shield..."""
    noise_bound: float = 0.3
    """...clipped to +-this, and the sum to [-1, 1]; the shield then treats it like any action."""
    segment: int = 25
    """Ticks a new version and the last good one each run before the other takes over: on trial they
    take turns, paired in alternating order (new, good), (good, new), ..., and each pair compares the
    two (`q2real.deploy_ros.learning.trial`). Where the robot's work has a cycle (a reach or a pick every
    few seconds), a whole number of cycles: shorter, one version's turn falls on one part of the cycle
    and the other's on another, and the pairs compare the parts rather than the versions."""
    settle: int = 5
    """First ticks of each segment left out of its figures: right after a handover the robot still moves
    as the other version left it."""
    min_pairs: int = 6
    """Pairs of segments before a version may be accepted (and as many segments of the last good version
    in RUN before a trial starts: the level the trial's first pairs are also held to)..."""
    max_pairs: int = 40
    """...and after which one that is neither accepted nor thrown out is rolled back."""
    confidence: float = 0.95
    """One-sided confidence of the bounds that abort and accept a version."""
    return_drop: float = 0.1
    """Tolerated drop in reward per tick, as a fraction of the last good version's: worse by more at
    `confidence` and the version is rolled back at once; no worse by more, and it is accepted..."""
    intervention_rise: float = 0.05
    """...and the same for the share of ticks on which the shield changed the action (a rise in points)."""
    parity_tolerance: float = 1e-3
    """Largest difference (action units) between a candidate's ONNX outputs and the learner's own on
    the probe observations; more and the candidate is refused."""
    learner: tuple[str, ...] = ()
    """`q2real finetune` settings for the learner (`actor_start=2000`, `warmup_steps=500`, ...)."""
    learner_startup: float = 120.0
    """Seconds to wait for the learner to load the run before giving up (the robot waits too)."""
    learner_nice: int = 10
    """How much nicer (1-19) than the node the learner runs, or the link to a remote one: on a CPU they
    share, the node's ticks come first. It always runs under the normal scheduler, even beside a
    SCHED_FIFO node."""
    learner_cpus: tuple[int, ...] | None = None
    """CPUs the learner (or the link) may run on; None: those the node is not pinned to (`realtime.cpus`),
    or, for a node that is not pinned, every CPU but the first, which is left to the node (on a
    one-CPU machine, that CPU)."""
    learner_address: str | None = None
    """HOST:PORT of a remote learner (`q2real learn --serve` on a workstation) instead of one on the
    robot: the run and the learner's settings are then the workstation's (`q2real.deploy_ros.learning.link`)."""
    tls_root: str | None = None
    """PEM file of the CA that signed the learner's certificate: the link uses TLS (else plain TCP,
    for a trusted network only)..."""
    tls_cert: str | None = None
    """...and with this PEM certificate and `tls_key` the robot proves itself to the learner (mutual TLS)."""
    tls_key: str | None = None
    """PEM file of the private key of `tls_cert`."""

    @property
    def enabled(self) -> bool:
        return self.run is not None or self.learner_address is not None

    def validate(self) -> None:
        if self.run is not None and not self.run.strip():
            raise ValueError("finetune.run: expected the trained run directory, got an empty string")
        if self.directory is not None and not self.directory.strip():
            raise ValueError("finetune.directory: expected a folder, got an empty string")
        checks.number("finetune.publish_every", self.publish_every, at_least=0.5, at_most=3600.0)
        checks.number("finetune.noise_std", self.noise_std, at_least=0.0, at_most=0.5)
        checks.number("finetune.noise_bound", self.noise_bound, at_least=0.0, at_most=0.5)
        checks.number("finetune.segment", self.segment, at_least=5, at_most=10_000)
        checks.number("finetune.settle", self.settle, at_least=0, at_most=self.segment // 2)
        checks.number("finetune.max_pairs", self.max_pairs, at_least=2, at_most=1000)
        checks.number("finetune.min_pairs", self.min_pairs, at_least=2, at_most=self.max_pairs)
        checks.number("finetune.confidence", self.confidence, at_least=0.8, at_most=0.99)
        if self.segment * self.max_pairs > 200_000:
            raise ValueError(
                f"finetune.segment x finetune.max_pairs: a trial of at most 400,000 ticks, got "
                f"{2 * self.segment * self.max_pairs:,}"
            )
        checks.number("finetune.return_drop", self.return_drop, above=0.0, at_most=1.0)
        checks.number("finetune.intervention_rise", self.intervention_rise, above=0.0, at_most=1.0)
        checks.number("finetune.parity_tolerance", self.parity_tolerance, above=0.0, at_most=0.1)
        checks.number("finetune.learner_startup", self.learner_startup, above=0.0, at_most=3600.0)
        checks.number("finetune.learner_nice", self.learner_nice, at_least=1, at_most=19)
        if self.learner_cpus is not None:
            checks.numbers("finetune.learner_cpus", self.learner_cpus, at_least=0, at_most=4095)
            if not self.learner_cpus or len(set(self.learner_cpus)) != len(self.learner_cpus):
                raise ValueError(f"finetune.learner_cpus: expected distinct CPU numbers, got {list(self.learner_cpus)}")
        if self.learner_address is not None:
            checks.address("finetune.learner_address", self.learner_address)
            if self.run is not None or self.learner:
                raise ValueError(
                    "finetune.learner_address: a remote learner takes its run and settings on the workstation "
                    "(q2real learn --serve ... RUN_DIR KEY=VALUE); finetune.run and finetune.learner must be unset"
                )
        tls = {"tls_root": self.tls_root, "tls_cert": self.tls_cert, "tls_key": self.tls_key}
        if any(tls.values()) and self.learner_address is None:
            raise ValueError("finetune.tls_*: TLS secures the link to a remote learner; set finetune.learner_address")
        if (self.tls_cert is None) != (self.tls_key is None) or (self.tls_cert and not self.tls_root):
            raise ValueError("finetune.tls_cert and finetune.tls_key go together, with finetune.tls_root")
        for item in self.learner:
            key, sep, _ = item.partition("=")
            if not sep or not key or key.split(".")[0] in ("run", "total_steps", "eval_every", "eval_envs"):
                raise ValueError(
                    f"finetune.learner: expected KEY=VALUE settings of q2real finetune other than run, "
                    f"total_steps and eval_*, got {item!r:.80}"
                )


@dataclass
class NodeConfig:
    command_style: Literal["forward", "trajectory"] = "forward"
    """`forward`: std_msgs/Float64MultiArray for a forward-command controller (joint order = the
    bundle's); `trajectory`: a one-point trajectory_msgs/JointTrajectory (joints named)."""
    controller: str | None = None
    """Controller name for the default command topic; None: forward_command_controller or
    joint_trajectory_controller."""
    control_period: float | None = None
    """Seconds per tick; None: the bundle's. Changing it changes the shield's rate windows too."""
    trigger: Literal["state", "timer"] = "state"
    """`state`: tick when a fresh joint state arrives, so no thread handoff stands between a state and its
    command (the timer ticks for a late state, and for a robot much faster than the policy); `timer`:
    tick on the period's timer alone."""
    autostart: bool = False
    """Start the ramp on the first valid joint state and hand over to the policy when it ends; without
    it the operator starts through `start()` (the CLI's Enter key)."""
    extra_joints: tuple[str, ...] = ()
    """Joints the robot publishes that the policy does not use (e.g. gripper fingers); any other
    unknown joint name makes a joint state message malformed."""
    startup_timeout: float | None = None
    """Seconds to wait for the robot's first joint state before giving up; None: 5 s for a robot, 30 s
    for the sim robot of `deploy --sim` (its process first imports and compiles its world)."""
    require_subscriber: bool = True
    """Stay in PASSIVE until the command topic has a matched subscriber (the controller): a wrong
    controller name, domain or middleware is then a node that says why, not a policy running into a
    void. Off only for setups without a controller (benches)."""
    diagnostics_period: float = 0.5
    """Seconds between /diagnostics reports; a mode change or a shield reason is reported at once."""
    topics: TopicConfig = field(default_factory=TopicConfig)
    """The ROS 2 topic of every input and output."""
    shield: ShieldConfig = field(default_factory=ShieldConfig)
    """The safety shield every command passes through: limits, faults, fallback and ramp."""
    record: str | None = None
    """Write every tick (observation, raw action, shielded command, flags) to this MCAP bag."""
    robot: str | None = None
    """This machine's spec of the robot, a shipped robot name or a robot.yaml path; None: the shipped
    spec the bundle names. The bundle's robot must match it field by field and by hash."""
    allow_robot_mismatch: bool = False
    """Run although the bundle's robot differs from this machine's spec; every difference is logged."""
    inputs: InputsConfig = field(default_factory=InputsConfig)
    """Age and sanity limits of the IMU, velocity command and tracked object inputs."""
    realtime: RealtimeConfig = field(default_factory=RealtimeConfig)
    """CPU pinning, SCHED_FIFO priority, memory locking and garbage collection of the node's process."""
    policy_runtime: PolicyRuntime = "auto"
    """What runs the policy each tick: `compiled` (the graph lowered to one compiled function for a
    batch of one, about 3x faster than ONNX Runtime on a node that sleeps between ticks; refuses a
    bundle whose graph does not lower), `onnxruntime`, or `auto`: compiled where the graph lowers
    and reproduces ONNX Runtime's outputs, else ONNX Runtime. ONNX Runtime is the reference either way."""
    cost_veto: float | None = None
    """Hold instead of any action whose cost critic value Q_c(obs, action) exceeds this (the bundle's
    `cost_critic.value_limit` is the per-state level matching the limit it was trained for); needs a
    bundle with a cost critic. A non-finite Q_c is vetoed too. None: no veto."""
    finetune: RobotLearningSettings = field(default_factory=RobotLearningSettings)
    """Fine-tuning on the robot beside the node; off unless `finetune.run` or `finetune.learner_address`."""

    def validate(self) -> None:
        if self.cost_veto is not None:
            checks.number("cost_veto", self.cost_veto, at_least=0.0)
        if self.control_period is not None:
            checks.number("control_period", self.control_period, above=0.0, at_most=1.0)
        if self.startup_timeout is not None:
            checks.number("startup_timeout", self.startup_timeout, above=0.0, at_most=3600.0)
        checks.number("diagnostics_period", self.diagnostics_period, above=0.0, at_most=60.0)
        checks.names("extra_joints", self.extra_joints)
        if self.controller is not None:
            checks.ros_name("controller", self.controller)
            if "/" in self.controller:
                raise ValueError(f"controller: expected a controller name without '/', got {self.controller!r:.80}")
        if self.record is not None and not self.record.strip():
            raise ValueError("record: expected a bag path, got an empty string")
        if self.robot is not None and not self.robot.strip():
            raise ValueError("robot: expected a robot name or a robot.yaml path, got an empty string")
        self.topics.validate(self.command_topic())
        self.inputs.validate()
        self.realtime.validate()
        self.finetune.validate()
        try:
            self.shield.validate()
            # On a robot the ramp is real motion: it takes time and starts only near the default pose.
            checks.number("ramp_time", self.shield.ramp_time, above=0.0)
            checks.number("ramp_max_distance", self.shield.ramp_max_distance, above=0.0)
        except ValueError as err:
            raise ValueError(f"shield.{err}") from None

    def command_topic(self) -> str:
        if self.topics.command:
            return self.topics.command
        if self.command_style == "trajectory":
            return f"/{self.controller or 'joint_trajectory_controller'}/joint_trajectory"
        return f"/{self.controller or 'forward_command_controller'}/commands"


def config_from_parameters(parameters: dict) -> tuple[str, NodeConfig]:
    """(bundle path, NodeConfig) from flat ROS 2 parameters such as {'policy.path': ..., 'shield.ramp_time':
    1.0}; unknown names and wrong types are errors, as in a q2real config file."""
    parameters = dict(parameters)
    for name in ROS_OWN_PARAMETERS:
        parameters.pop(name, None)
    bundle = parameters.pop("policy.path", None)
    if not bundle:
        raise ConfigError(f"{NODE_NAME}: parameter policy.path: required (the policy bundle, .onnx)")
    nested: dict = {}
    for key, value in parameters.items():
        *parents, leaf = key.split(".")
        node = nested
        for parent in parents:
            node = node.setdefault(parent, {})
            if not isinstance(node, dict):
                raise ConfigError(f"ROS parameters: {key}: '{parent}' is set both as a value and as a section")
        if isinstance(node.get(leaf), dict):
            raise ConfigError(f"ROS parameters: {key}: '{leaf}' is set both as a value and as a section")
        node[leaf] = value
    return bundle, validated(merge(NodeConfig(), nested, "ROS parameters"), "ROS parameters")


def local_robot(config: NodeConfig, bundle_robot: RobotSpec) -> RobotSpec:
    """This machine's description of the robot the bundle will drive."""
    wanted = config.robot or bundle_robot.name
    if wanted.endswith((".yaml", ".yml")) or "/" in wanted:
        return load_spec(wanted)
    return robot_spec(wanted)
