"""The policy node as a ROS 2 (rclpy) node, for robots with ROS 2 installed.

The same `PolicyNode` core as the DDS transport: only the plumbing differs. Parameters mirror
`NodeConfig` field by field (`command_style`, `autostart`, `topics.joint_states`,
`shield.fallback`, ...; `policy.path` is the bundle) and are checked as strictly as a q2real config
file: an unknown parameter name stops the node with its name. Ticks follow the core's loop
(`PolicyNode.spin`, in a thread of its own): a fresh joint state is ticked on in the executor thread
that delivers it, with the core's timer as the fallback, exactly as on the DDS-wire node;
diagnostics and the shield's reasons are published and logged from the diagnostics thread.

Run: `ros2 run q2real_deploy policy_node --ros-args -p policy.path:=/path/policy.onnx`, or the launch
file in `deploy_ros/ros2/launch`.
"""

# rclpy and the ROS message packages come from a ROS 2 install, not from q2real's dependencies.
# pyright: reportMissingImports=false

from __future__ import annotations

import signal
import sys
import threading
from types import SimpleNamespace

import rclpy
from builtin_interfaces.msg import Duration, Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import PoseStamped, Twist
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rclpy.signals import SignalHandlerOptions
from rclpy.utilities import try_shutdown
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Bool, Empty, Float64MultiArray, Header, MultiArrayDimension, MultiArrayLayout, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from q2real.deploy_ros import realtime
from q2real.deploy_ros.inputs import STREAMS
from q2real.deploy_ros.node import PolicyNode, Tick
from q2real.deploy_ros.settings import NODE_NAME, TRIGGER_SERVICES, config_from_parameters
from q2real.deploy_ros.signals import on_signal
from q2real.deploy_ros.transport.commands import command_message, diagnostics_message, stamp_now
from q2real.deploy_ros.transport.diagnostics import DiagnosticsThread, Report

MESSAGES = SimpleNamespace(
    Imu=Imu,
    Twist=Twist,
    PoseStamped=PoseStamped,
    Time=Time,
    Duration=Duration,
    Header=Header,
    MultiArrayDimension=MultiArrayDimension,
    MultiArrayLayout=MultiArrayLayout,
    Float64MultiArray=Float64MultiArray,
    JointTrajectoryPoint=JointTrajectoryPoint,
    JointTrajectory=JointTrajectory,
    KeyValue=KeyValue,
    DiagnosticStatus=DiagnosticStatus,
    DiagnosticArray=DiagnosticArray,
)
"""rclpy's generated classes under the names `q2real.deploy_ros.transport.commands` builds messages from."""

COMMAND_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
LATCHED_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
"""The mode topic: a panel that subscribes later still gets the current mode."""


class RclpyPolicyNode(Node):
    def __init__(self):
        super().__init__(
            NODE_NAME, allow_undeclared_parameters=True, automatically_declare_parameters_from_overrides=True
        )
        # rclpy annotates the values but returns Parameter objects (Jazzy); accept either.
        values = {
            name: p.value if isinstance(p, Parameter) else p for name, p in self.get_parameters_by_prefix("").items()
        }
        bundle, config = config_from_parameters(values)
        self.core = core = PolicyNode(bundle, config)
        topics = config.topics
        style = config.command_style
        command_type = JointTrajectory if style == "trajectory" else Float64MultiArray
        self.command_pub = self.create_publisher(command_type, config.command_topic(), COMMAND_QOS)
        core.subscribers = self.command_pub.get_subscription_count
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, topics.diagnostics, 10)
        self.create_subscription(JointState, topics.joint_states, self._on_joint_state, qos_profile_sensor_data)
        self.create_subscription(Bool, topics.estop, self._on_estop, 10)
        self.create_subscription(Empty, topics.reset, self._on_reset, 10)
        self.create_subscription(Empty, topics.start, lambda _m: core.start(), 10)
        self.create_subscription(Empty, topics.stop, lambda _m: core.on_stop(), 10)
        # The same requests as services, answered with the mode the next ticks left (std_srvs/Trigger).
        for kind in TRIGGER_SERVICES:
            self.create_service(Trigger, getattr(topics, kind), self._service(kind))
        self.mode_pub = self.create_publisher(String, topics.mode, LATCHED_QOS)
        self._mode = ""
        self.create_subscription(Float64MultiArray, topics.task_command, self._on_task_command, 10)
        for stream, topic, kind, handler in STREAMS:  # only the streams the bundle reads
            if stream in core.inputs.streams:
                callback = self._input(stream, getattr(core, handler))
                self.create_subscription(
                    getattr(MESSAGES, kind), getattr(topics, topic), callback, qos_profile_sensor_data
                )
        self._checked = False
        self.diagnostics = DiagnosticsThread(core, self._write_diagnostics).start()
        applied = realtime.apply(config.realtime)  # inherited by the loop and diagnostics threads
        self._stop = threading.Event()
        self.failure: BaseException | None = None
        """Why the control loop stopped by itself (main then stops the node)."""
        self._loop = threading.Thread(target=self._run_loop, name="q2real-loop", daemon=True)
        self._loop.start()
        if applied:
            self.get_logger().info(f"real-time settings: {', '.join(applied)}")
        self.get_logger().info(
            f"{bundle}: {core.spec.name} joints {core.names}, {1 / core.period:g} Hz, commands on "
            f"{config.command_topic()} ({style}), shield fallback {core.shield.fallback}"
        )

    def _on_joint_state(self, m: JointState) -> None:
        if not self._checked:
            self.core.check_robot(list(m.name))  # raises: the bundle is for another robot
            self._checked = True
        stamp = m.header.stamp.sec + 1e-9 * m.header.stamp.nanosec
        reason = self.core.on_joint_state(m.name, m.position, m.velocity, m.effort, stamp=stamp)
        if reason is not None:
            self.get_logger().warn(f"joint state refused: {reason}", throttle_duration_sec=1.0)

    def _input(self, stream: str, handler):
        """A subscription callback that feeds `handler` and logs its refusals (at most once a second)."""

        def callback(message) -> None:
            reason = handler(message)
            if reason is not None:
                self.get_logger().warn(f"{stream} refused: {reason}", throttle_duration_sec=1.0)

        return callback

    def publish(self, tick: Tick) -> None:
        core = self.core
        style = core.config.command_style
        stamp = stamp_now(MESSAGES)
        self.command_pub.publish(
            command_message(MESSAGES, style, core.interface, core.names, tick.values, core.period, stamp)
        )

    def _run_loop(self) -> None:
        try:
            self.core.spin(self._stop, self.publish)
        except Exception as err:  # a publish failing (the context shut down) or a bug: stop, loudly
            self.failure = err
            self._stop.set()
            self.get_logger().fatal(f"control loop stopped: {type(err).__name__}: {err}")

    def _on_estop(self, m: Bool) -> None:
        self.core.on_estop(m.data)

    def _on_reset(self, _m: Empty) -> None:
        self.core.on_reset()

    def _service(self, kind: str):
        def serve(_request, response):
            response.success, response.message = self.core.operate(kind)
            return response

        return serve

    def _on_task_command(self, m: Float64MultiArray) -> None:
        reason = self.core.on_task_command(m.data)
        if reason is not None:
            self.get_logger().warn(f"task command refused: {reason}", throttle_duration_sec=1.0)

    def stop(self) -> None:
        """End the loop; no tick publishes after this returns."""
        self._stop.set()
        self._loop.join(5.0)

    def destroy_node(self) -> None:
        self.stop()
        self.diagnostics.stop()  # before the publishers go
        super().destroy_node()

    def _write_diagnostics(self, report: Report) -> None:
        if ":" in report["message"]:  # a mode change or a shield intervention, with its reason
            self.get_logger().warn(f"shield: {report['message']}")
        self.diagnostics_pub.publish(diagnostics_message(MESSAGES, report, self.core.spec.name, stamp_now(MESSAGES)))
        mode = report["values"]["mode"]
        if mode != self._mode:
            self._mode = mode
            self.mode_pub.publish(String(data=mode))


def _starts_on_enter(core: PolicyNode) -> None:
    while sys.stdin.readline():
        core.start()


def main(args=None) -> None:
    # Our own SIGINT/SIGTERM handling: rclpy's would shut the context down before the last command.
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        on_signal(sig, stop.set)
    node = RclpyPolicyNode()
    executor = MultiThreadedExecutor()
    executor.add_node(node)
    if node.core.config.autostart is False:
        print("Enter starts the ramp (every time: after an e-stop and a reset too)", flush=True)
        threading.Thread(target=_starts_on_enter, args=(node.core,), daemon=True).start()
    try:
        while not stop.is_set() and node.failure is None:
            executor.spin_once(timeout_sec=0.1)
    finally:
        executor.shutdown()
        node.stop()  # no tick may publish after the last command
        node.core.final_command(node.publish)
        node.diagnostics.stop()
        node._write_diagnostics(node.diagnostics.report())  # the final mode
        node.destroy_node()
        try_shutdown()
