"""Every tick to a rosbag2 MCAP bag: observation, raw action, shielded command, shield flags and mode;
every message the node received (joint states, IMU, velocity command, object pose, task command,
e-stop and reset) on its own topic, as it arrived; with fine-tuning, every policy version event
(swapped in, refused, rolled back) as JSON on its own topic. A bag therefore replays what the robot
sent as well as what the node answered.

The bag opens with `ros2 bag info` / `ros2 bag play` and any MCAP viewer, and the bundle's metadata
is its first message, so a bag can be replayed through the same observation builder and shield off
the robot. The tick only puts the tick and its command message on a queue; the messages are built
and serialized (by the wire types themselves: their CDR is ROS 2's) and written on the recorder's
own thread, in the gap after each tick.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path

import numpy as np
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from q2real.configs.loader import ConfigError
from q2real.deploy_ros.node import Tick
from q2real.deploy_ros.settings import NODE_NAME
from q2real.deploy_ros.transport import messages as msg


def _floats(kind: type, values) -> object:
    data = [float(v) for v in np.asarray(values, dtype=np.float64).reshape(-1)]
    dim = msg.MultiArrayDimension(label="values", size=len(data), stride=len(data))
    return kind(layout=msg.MultiArrayLayout(dim=[dim], data_offset=0), data=data)


class Recorder:
    """Writes `<path>/` as a rosbag2 (version 9) directory with one MCAP file."""

    def __init__(
        self,
        path: str | Path,
        command_topic: str,
        command_type: type,
        bundle_metadata: dict,
        inputs: dict[str, type] | None = None,
    ):
        """`inputs`: the topics the node reads (ROS names) and their message types."""
        path = Path(path)
        if path.exists():
            raise ConfigError(f"record: {path}: a bag is already there; rosbag2 never overwrites one")
        self.typestore = get_typestore(Stores.ROS2_JAZZY)
        self.writer = Writer(path, version=9, storage_plugin=StoragePlugin.MCAP)
        self.writer.open()
        prefix = f"/{NODE_NAME}"
        topics = {
            "bundle": (f"{prefix}/bundle", msg.String),
            "observation": (f"{prefix}/observation", msg.Float32MultiArray),
            "action_raw": (f"{prefix}/action_raw", msg.Float32MultiArray),
            "command": (command_topic, command_type),
            "flags": (f"{prefix}/shield_flags", msg.UInt32),
            "mode": (f"{prefix}/shield_mode", msg.UInt32),
            "version": (f"{prefix}/policy_version", msg.String),
        }
        topics |= {name: (name, kind) for name, kind in (inputs or {}).items()}
        self.connections = {
            key: self.writer.add_connection(name, msg.ROS_TYPES[kind], typestore=self.typestore)
            for key, (name, kind) in topics.items()
        }
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.lost = 0  # messages that could not be written; the first one's error says why
        self.first_error = ""
        self._write("bundle", time.time_ns(), msg.String(data=json.dumps(bundle_metadata)))
        self._thread = threading.Thread(target=self._drain, name="q2real-recorder", daemon=True)
        self._thread.start()

    def write(self, tick: Tick, command_message) -> None:
        """Queue one tick (called on the tick path: nothing else happens here)."""
        self._queue.put((time.time_ns(), tick, command_message))

    def write_input(self, topic: str, message) -> None:
        """Queue a message the node received on `topic` (one of `inputs`), in the delivering thread."""
        self._queue.put((time.time_ns(), topic, message))

    def write_event(self, event: dict) -> None:
        """Queue a policy version event (from the fine-tuning watcher, off the tick)."""
        self._queue.put((time.time_ns(), None, json.dumps(event)))

    def _write(self, key: str, stamp: int, message) -> None:
        """`message`: a message object, or its CDR bytes as written to DDS (`ForwardCommand.last`)."""
        self.writer.write(self.connections[key], stamp, message if isinstance(message, bytes) else message.serialize())

    def _record(self, stamp: int, tick: Tick | str | None, command_message) -> None:
        if tick is None:
            self._write("version", stamp, msg.String(data=command_message))
            return
        if isinstance(tick, str):  # an input: its topic and the message as received
            self._write(tick, stamp, command_message)
            return
        if tick.observation is not None:
            self._write("observation", stamp, _floats(msg.Float32MultiArray, tick.observation))
        if tick.raw_action is not None:
            self._write("action_raw", stamp, _floats(msg.Float32MultiArray, tick.raw_action))
        self._write("command", stamp, command_message)
        self._write("flags", stamp, msg.UInt32(data=int(tick.command.flags)))
        self._write("mode", stamp, msg.UInt32(data=int(tick.command.mode)))

    def _drain(self) -> None:
        """One bad message costs that message, never the rest of the bag."""
        while (item := self._queue.get()) is not None:
            try:
                self._record(*item)
            except Exception as error:  # noqa: BLE001 - counted and reported at close
                self.lost += 1
                self.first_error = self.first_error or f"{type(error).__name__}: {error}"

    def close(self) -> None:
        """Flush everything queued and finish the bag (metadata.yaml); safe to call twice."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
            self.writer.close()
