"""A real ROS 2 participant (rclpy on the RMW its install defaults to) for the interop tests.

Run by any Python that has rclpy, q2real or not (a Kilted install lives in its own venv):
`python ros_peer.py SPEC_JSON`. The spec names what to subscribe to and what to publish, with the
QoS ros2_control declares: the joint_state_broadcaster publishes and the forward and trajectory
controllers subscribe with the system-default profile (RELIABLE, VOLATILE); operator topics use
the default profile. The peer prints one JSON line: per subscribed topic the sample count, the
last sample's fields (so the test can check each message type was decoded, not just matched) and
when the first sample came (`first_s`, from the peer's start).

A publication's `at` counts from the peer's start, or, as an operator reacts to what they see,
from an event: `"when": {"topic": T, "data": {...}}` (the first message on subscribed topic T
whose fields include those) or `"after": T` (the peer's first publication on topic T). Fixed
delays from the start would race the node's discovery on a loaded machine.
"""

# pyright: reportMissingImports=false

from __future__ import annotations

import json
import math
import sys
import time

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PoseStamped, Twist
from rclpy.qos import qos_profile_system_default
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Bool, Empty, Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

TYPES = {
    "JointState": JointState,
    "Float64MultiArray": Float64MultiArray,
    "JointTrajectory": JointTrajectory,
    "Bool": Bool,
    "Empty": Empty,
    "DiagnosticArray": DiagnosticArray,
    "Imu": Imu,
    "Twist": Twist,
    "PoseStamped": PoseStamped,
    "String": String,
}


def fill(message, data: dict) -> None:
    """Set fields from JSON: nested objects for nested messages, null in a list for NaN."""
    for name, value in data.items():
        if isinstance(value, dict):
            fill(getattr(message, name), value)
        else:
            setattr(message, name, [math.nan if v is None else v for v in value] if isinstance(value, list) else value)


def fields(message) -> dict:
    """The fields the tests check, as JSON."""
    if isinstance(message, JointState):
        return {"name": list(message.name), "position": list(message.position), "velocity": list(message.velocity)}
    if isinstance(message, Float64MultiArray):
        return {"data": list(message.data), "dim": [d.label for d in message.layout.dim]}
    if isinstance(message, JointTrajectory):
        point = message.points[0]
        return {
            "joint_names": list(message.joint_names),
            "positions": list(point.positions),
            "effort": list(point.effort),
            "time_from_start": point.time_from_start.sec + 1e-9 * point.time_from_start.nanosec,
        }
    if isinstance(message, String):
        return {"data": message.data}
    if isinstance(message, DiagnosticArray):
        status = message.status[0]
        return {"name": status.name, "message": status.message, "keys": [kv.key for kv in status.values]}
    return {}


def main() -> None:
    spec = json.loads(sys.argv[1])
    rclpy.init()
    node = rclpy.create_node("q2real_interop_peer")
    received: dict[str, dict] = {}
    start = time.monotonic()
    for topic, kind in spec.get("subscribe", {}).items():
        received[topic] = {"count": 0, "last": None, "first_s": None}

        def store(message, topic=topic) -> None:
            if received[topic]["first_s"] is None:
                received[topic]["first_s"] = time.monotonic() - start
            received[topic]["count"] += 1
            received[topic]["last"] = fields(message)

        node.create_subscription(TYPES[kind], topic, store, qos_profile_system_default)
    publishers = []
    for item in spec.get("publish", []):
        writer = node.create_publisher(TYPES[item["type"]], item["topic"], qos_profile_system_default)
        publishers.append((item, writer))
    sent: dict[str, int] = {}
    seen: dict[str, float] = {}  # event -> when it first happened
    # With "from_first", the window opens once every subscribed topic has delivered (at most `wait`
    # seconds after the start): what is counted is the traffic, not how long the other end took to
    # start and be discovered.
    end = start + spec["seconds"]
    if spec.get("from_first"):
        end = start + spec.get("wait", 30.0)
    opened = not spec.get("from_first")
    while time.monotonic() < end:
        rclpy.spin_once(node, timeout_sec=0.001)
        now = time.monotonic()
        if not opened and all(r["count"] for r in received.values()):
            for r in received.values():
                r["count"] = 0  # counts are of the window
            opened, end = True, now + spec["seconds"]
        for item, writer in publishers:
            if "when" in item:
                event = json.dumps(item["when"], sort_keys=True)
                last = received[item["when"]["topic"]]["last"]
                if (
                    event not in seen
                    and last is not None
                    and all(last.get(k) == v for k, v in item["when"]["data"].items())
                ):
                    seen[event] = now
                origin = seen.get(event)
            else:
                origin = seen.get("sent " + item["after"]) if "after" in item else start
            if origin is None or now < max(origin + item.get("at", 0.0), item.get("next", 0.0)):
                continue
            if item.get("once") and sent.get(item["topic"]):
                continue
            message = TYPES[item["type"]]()
            fill(message, item.get("data", {}))
            writer.publish(message)
            sent[item["topic"]] = sent.get(item["topic"], 0) + 1
            seen.setdefault("sent " + item["topic"], now)
            item["next"] = now + 1.0 / item.get("rate", 1.0)
    print(json.dumps({"received": received, "sent": sent}), flush=True)
    node.destroy_node()
    rclpy.try_shutdown()


if __name__ == "__main__":
    main()
