"""ROS 2 on the wire without a ROS install: the cyclonedds binding, speaking as rmw_cyclonedds does.

ROS 2 topic `/joint_states` is DDS topic `rt/joint_states`, private names (`~/estop`) resolve under
the node's name, types carry their mangled names (`q2real.deploy_ros.transport.messages`) and QoS is ROS 2's:
the default profile (RELIABLE, VOLATILE, KEEP_LAST 10) for commands, e-stop and diagnostics, the
sensor-data profile (BEST_EFFORT, KEEP_LAST 5) for reading joint states, which matches the
joint_state_broadcaster's RELIABLE writer and any BEST_EFFORT one. Domain: `ROS_DOMAIN_ID`.

Every participant also ignores XTypes type information from Fast DDS (`INTEROP`): Fast DDS 3, the
default middleware of ROS 2 Kilted, announces type objects that Cyclone 11 rejects as invalid
("ddsi_xt_type_init_impl with invalid type object"), after which Cyclone never matches its readers
and a Kilted controller would receive nothing. Without the type information Cyclone matches by type
name, exactly as rmw_cyclonedds does with every peer; Fast DDS 2 (Jazzy) peers are unaffected.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from cyclonedds.core import DDSException, Listener, Policy, Qos
from cyclonedds.domain import Domain, DomainParticipant
from cyclonedds.internal import DDS, InvalidSample
from cyclonedds.pub import DataWriter
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration

from q2real.configs.errors import Q2RealError
from q2real.configs.loader import ConfigError
from q2real.deploy_ros.inputs import STREAMS
from q2real.deploy_ros.node import PolicyNode, Tick
from q2real.deploy_ros.settings import NODE_NAME, resolve_topic
from q2real.deploy_ros.transport import messages as msg
from q2real.deploy_ros.transport.commands import ForwardCommand, command_message, diagnostics_message, stamp_now
from q2real.deploy_ros.transport.diagnostics import DiagnosticsThread, Report

LATCHED_QOS = Qos(
    Policy.Reliability.Reliable(duration(milliseconds=100)),
    Policy.Durability.TransientLocal,
    Policy.History.KeepLast(1),
)
"""ROS 2's latched topics (rclpy's transient local, depth 1): a late subscriber gets the last sample."""
DEFAULT_QOS = Qos(
    Policy.Reliability.Reliable(duration(milliseconds=100)),
    Policy.Durability.Volatile,
    Policy.History.KeepLast(10),
)
SENSOR_QOS = Qos(Policy.Reliability.BestEffort, Policy.Durability.Volatile, Policy.History.KeepLast(5))
TOPIC_QOS = {
    "joint_states": SENSOR_QOS,
    **{topic: SENSOR_QOS for _, topic, _, _ in STREAMS},
    "mode": LATCHED_QOS,
}
"""`topics.*` role -> the DDS-wire node's QoS for it, where it is not DEFAULT_QOS: sensor streams best
effort (they match RELIABLE and BEST_EFFORT publishers), the mode latched for late subscribers."""


def topic_qos(role: str) -> Qos:
    return TOPIC_QOS.get(role, DEFAULT_QOS)


LOOPBACK = (
    "<CycloneDDS><Domain><General><Interfaces><NetworkInterface name='lo'/></Interfaces>"
    "<AllowMulticast>false</AllowMulticast></General><Discovery><Peers><Peer address='127.0.0.1'/></Peers>"
    "<ParticipantIndex>auto</ParticipantIndex><MaxAutoParticipantIndex>64</MaxAutoParticipantIndex>"
    "</Discovery></Domain></CycloneDDS>"
)
"""Cyclone settings for one machine with no network: loopback only, unicast discovery."""

FAST_DDS_VENDOR = "1.15"
"""eProsima's RTPS vendor id."""
INTEROP = (
    "<CycloneDDS><Domain><Compatibility>"
    f"<IgnoreTypeInformation>{FAST_DDS_VENDOR}</IgnoreTypeInformation>"
    "</Compatibility></Domain></CycloneDDS>"
)
"""Added to the user's CYCLONEDDS_URI for every domain q2real joins (see the module docstring)."""
_domains: dict[int, Domain] = {}


ROBOT_STARTUP = 5.0
"""Seconds a robot has to send its first joint state when `startup_timeout` is not set."""


class RobotTimeout(Q2RealError, TimeoutError):
    """The robot sent no joint state within `startup_timeout`: nothing is running or the network is wrong."""


def use_loopback() -> None:
    """Keep DDS traffic on this machine (sim-in-the-loop, tests), unless CYCLONEDDS_URI says otherwise.
    Must run before the process's first participant is created."""
    os.environ.setdefault("CYCLONEDDS_URI", LOOPBACK)


def dds_topic(name: str, node: str = NODE_NAME) -> str:
    """ROS 2 topic name -> DDS topic name: '/joint_states' -> 'rt/joint_states', '~/estop' ->
    'rt/q2real_policy/estop'."""
    return "rt" + resolve_topic(name, node)


def domain_id() -> int:
    raw = os.environ.get("ROS_DOMAIN_ID", "0")
    if not raw.isdigit() or int(raw) > 232:
        raise ConfigError(f"ROS_DOMAIN_ID={raw!r}: expected an integer 0-232")
    return int(raw)


def join(domain: int) -> None:
    """Configure `domain` in this process (CYCLONEDDS_URI plus `INTEROP`) before its first participant.

    A domain is configured once per process, when it is created; a domain someone else created
    keeps its configuration."""
    if domain not in _domains:
        user = os.environ.get("CYCLONEDDS_URI", "").strip()
        try:
            _domains[domain] = Domain(domain, f"{user},{INTEROP}" if user else INTEROP)
        except DDSException as err:
            if err.code != DDSException.DDS_RETCODE_PRECONDITION_NOT_MET:  # not "already exists": a bad configuration
                raise ConfigError(
                    f"CYCLONEDDS_URI: Cyclone DDS refused the configuration (its reason is on stderr): {err}"
                ) from err
            print(
                f"warning: DDS domain {domain} was created before q2real configured it: Fast DDS 3 (ROS 2 Kilted) "
                "peers may not match unless CYCLONEDDS_URI sets Compatibility/IgnoreTypeInformation to 1.15",
                file=sys.stderr,
            )


class _Sample(ctypes.Structure):
    """The binding's sample container (`ddspy_sample_container_t`): serialized CDR and its length."""

    _fields_ = [("usample", ctypes.c_void_p), ("usample_size", ctypes.c_size_t)]


_dds_write = DDS._dll_handle.dds_write
_dds_write.argtypes = [ctypes.c_int32, ctypes.POINTER(_Sample)]
_dds_write.restype = ctypes.c_int32


class Writer(DataWriter):
    """cyclonedds' DataWriter, writing with Python's GIL released.

    The binding's own write holds the GIL inside `dds_write`, and Cyclone delivers to a reader in the
    same process on the writing thread, after waiting for that reader's listener to return from any
    other thread. A listener written in Python needs the GIL to return: two threads writing one topic
    that a listener of this process reads (a node and a test's publisher, or the node's readers fed
    by the robot and by a local operator thread) deadlocked the whole process for good. Through ctypes
    the GIL is free while Cyclone waits; the sertype's serializer hooks are plain C and need no GIL.
    """

    def write(self, sample, timestamp: int | None = None) -> None:
        if timestamp is not None or not isinstance(sample, self.data_type):
            return super().write(sample, timestamp)  # the binding's checks and messages
        data = sample.serialize(use_version_2=self._use_version_2)
        data = data.ljust((len(data) + 3) & ~3, b"\0")  # CDR payloads are padded to 4 bytes, as the binding does
        buffer = ctypes.c_char_p(data)  # borrows the bytes' storage; `data` outlives the call
        ret = _dds_write(self._ref, ctypes.byref(_Sample(ctypes.cast(buffer, ctypes.c_void_p), len(data))))
        if ret < 0:
            raise DDSException(ret, f"Occurred while writing sample in {self!r}")


class Endpoints:
    """One participant with typed readers and writers on ROS 2 topic names."""

    def __init__(self, domain: int | None = None, node: str = NODE_NAME):
        domain = domain_id() if domain is None else domain
        join(domain)
        self.participant = DomainParticipant(domain)
        self.node = node
        self._topics: dict[str, Topic] = {}
        self._endpoints: list[DataReader | DataWriter] = []

    def _topic(self, name: str, kind: type) -> Topic:
        dds_name = dds_topic(name, self.node)
        if dds_name not in self._topics:
            self._topics[dds_name] = Topic(self.participant, dds_name, kind)
        return self._topics[dds_name]

    def writer(self, name: str, kind: type, qos: Qos = DEFAULT_QOS) -> Writer:
        writer = Writer(self.participant, self._topic(name, kind), qos=qos)
        self._endpoints.append(writer)
        return writer

    def reader(self, name: str, kind: type, on_message: Callable | None = None, qos: Qos = DEFAULT_QOS) -> DataReader:
        listener = None
        if on_message is not None:

            def on_data_available(reader: DataReader | None) -> None:
                if reader is None:  # the reader is being deleted (participant shutting down)
                    return
                for sample in reader.take(N=64):
                    if not isinstance(sample, InvalidSample):  # a writer went away: no data in it
                        on_message(sample)

            listener = Listener(on_data_available=on_data_available)
        reader = DataReader(self.participant, self._topic(name, kind), qos=qos, listener=listener)
        self._endpoints.append(reader)
        return reader

    def close(self) -> None:
        """Delete the DDS entities now, readers first. cyclonedds deletes an entity in its finalizer,
        which is skipped when a garbage-collected reference cycle (callback -> owner -> reader) is
        freed; the C reader would then call a freed listener. Safe to call twice."""
        for entity in (*self._endpoints, *self._topics.values(), self.participant):
            entity.__del__()  # removes it from cyclonedds' registry, so the finalizer later does nothing
        self._endpoints.clear()
        self._topics.clear()


class DdsNode:
    """`PolicyNode` on DDS: subscriptions feed its inputs, its ticks go out as commands.

    Cyclone delivers each joint state on its receive thread, which then runs the tick and writes the
    command (`PolicyNode.spin`); the tick path only serializes the command and queues the tick for
    the recorder. Diagnostics are published from their own thread from construction to `close`.
    """

    def __init__(
        self,
        node: PolicyNode,
        domain: int | None = None,
        recorder=None,
        on_report: Callable[[Report], None] | None = None,
    ):
        """`on_report`: called with each report once it is published, on the diagnostics thread (the
        console's mode-change lines), so that what it does never delays a tick."""
        self.node = node
        self.recorder = recorder
        self.on_report = on_report
        config = node.config
        topics = config.topics
        self.dds = Endpoints(domain)
        self.command_type = msg.JointTrajectory if config.command_style == "trajectory" else msg.Float64MultiArray
        self.command_topic = config.command_topic()
        self.command_writer = self.dds.writer(self.command_topic, self.command_type)
        self._forward = ForwardCommand(msg, len(node.names)) if config.command_style == "forward" else None
        node.subscribers = lambda: len(self.command_writer.get_matched_subscriptions())
        self.diagnostics_writer = self.dds.writer(topics.diagnostics, msg.DiagnosticArray)
        self.mode_writer = self.dds.writer(topics.mode, msg.String, topic_qos("mode"))
        self._mode = ""
        self._first_names: list[str] | None = None
        self._robot_seen = threading.Event()
        subscribed = [
            ("joint_states", msg.JointState, self._on_joint_state),
            ("estop", msg.Bool, lambda m: node.on_estop(m.data)),
            ("reset", msg.Empty, lambda m: node.on_reset()),
            ("start", msg.Empty, lambda m: node.start()),
            ("stop", msg.Empty, lambda m: node.on_stop()),
            ("task_command", msg.Float64MultiArray, lambda m: node.on_task_command(m.data)),
        ]
        if node.learning is not None:
            subscribed.append(("reward", msg.Float64, lambda m: node.on_reward(m.data)))
        for stream, topic, kind, handler in STREAMS:  # only the streams the bundle reads
            if stream in node.inputs.streams:
                subscribed.append((topic, getattr(msg, kind), getattr(node, handler)))
        names = {role: getattr(topics, role) for role, _, _ in subscribed}
        self.input_topics = {resolve_topic(names[role], NODE_NAME): kind for role, kind, _ in subscribed}
        """Every topic the node reads, with its type: what a recorder stores beside the node's outputs."""
        self.readers = [
            self.dds.reader(
                names[role], kind, self._recorded(resolve_topic(names[role], NODE_NAME), handler), topic_qos(role)
            )
            for role, kind, handler in subscribed
        ]
        self._closed = False
        self.diagnostics = DiagnosticsThread(node, self._write_diagnostics).start()

    def _recorded(self, topic: str, handler: Callable[[Any], Any]) -> Callable[[Any], None]:
        """`handler`, with the message first queued to the recorder as received (when recording)."""

        def on_message(message) -> None:
            recorder = self.recorder
            if recorder is not None:
                recorder.write_input(topic, message)
            handler(message)

        return on_message

    def _on_joint_state(self, m: msg.JointState) -> None:
        if self._first_names is None:
            self._first_names = list(m.name)
            self._robot_seen.set()
        stamp = m.header.stamp
        self.node.on_joint_state(m.name, m.position, m.velocity, m.effort, stamp=stamp.sec + 1e-9 * stamp.nanosec)

    def wait_for_robot(self, default_timeout: float = ROBOT_STARTUP) -> None:
        """Block until the robot's first joint state (`startup_timeout`, or `default_timeout` if that is
        None); refuse a robot whose joints differ from the bundle's."""
        timeout = self.node.config.startup_timeout or default_timeout
        if not self._robot_seen.wait(timeout):
            raise RobotTimeout(
                f"no joint state on {dds_topic(self.node.config.topics.joint_states)} within {timeout} s "
                f"(domain {domain_id()}): is the robot running?"
            )
        self.node.check_robot(self._first_names or [])

    def publish(self, tick: Tick) -> None:
        node = self.node
        if self._forward is not None:
            self._forward.set(tick.values)
            self.command_writer.write(self._forward.message)
            message = self._forward.last
        else:
            message = command_message(
                msg, node.config.command_style, node.interface, node.names, tick.values, node.period, stamp_now(msg)
            )
            self.command_writer.write(message)
        if self.recorder is not None:
            self.recorder.write(tick, message)

    def _write_diagnostics(self, report: Report) -> None:
        self.diagnostics_writer.write(diagnostics_message(msg, report, self.node.spec.name, stamp_now(msg)))
        mode = report["values"]["mode"]
        if mode != self._mode:  # latched: a panel that starts later still reads the current mode
            self._mode = mode
            self.mode_writer.write(msg.String(data=mode))
        if self.on_report is not None:
            self.on_report(report)

    def run(self, stop: threading.Event) -> None:
        self.wait_for_robot()
        self.node.spin(stop, self.publish)

    def close(self) -> None:
        """Stop the diagnostics thread, publish a last report (the final mode), delete the entities."""
        if not self._closed:
            self._closed = True
            self.diagnostics.stop()
            self._write_diagnostics(self.diagnostics.report())
            self.node.subscribers = lambda: 0  # no controller can be reached through a closed writer
            self.dds.close()


def wait_for_match(writer: DataWriter, readers: int = 1, timeout: float = 5.0) -> None:
    """Block until `writer` has matched `readers` readers (DDS discovery is asynchronous)."""
    deadline = time.monotonic() + timeout
    while len(writer.get_matched_subscriptions()) < readers:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{writer.topic.name}: no matching reader within {timeout} s")
        time.sleep(0.01)
