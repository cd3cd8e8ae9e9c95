"""The robot-to-learner link: the deploy node on the robot, its learner on a workstation, over gRPC.

Fine-tuning on the robot (`q2real.deploy_ros.learning.robot_side`) has the node and its learner share one
directory: the transition ring, each version's files, `candidate.json`, `rollback.json`. The link
mirrors that directory across the network (`link.proto`), so both ends run unchanged:

- On the robot, `RobotLearning` starts the client (`python -m q2real.deploy_ros.learning.link connect DIR`) where
  it would start the learner. The client reads the ring in batches and sends them. The ring is the
  link's bounded queue: the node appends and never waits; when the network is slower than the robot
  for longer than the ring holds, the rows the node overwrote before they were sent are the ones
  lost (oldest first), and they are counted. Back come the rewards (written into the ring, where the
  node judges a version), each version's files (in chunks, size-capped, renamed into place when
  whole) and then its announcement, which the node validates, swaps and rolls back exactly as for a
  local learner. The node's rollbacks and the versions it judged good go up. When the session ends
  (the learner died, the network went), the client exits, so the node sees a dead learner and keeps
  its last good version.
- On the workstation, `q2real learn --serve HOST:PORT RUN_DIR` serves one robot at a time: per session
  a directory with a ring of the robot's layout, filled at the robot's row indices, and the learner
  process that would run on the robot (`q2real.agents.onrobot.robot_learner`), whose rewards, versions and
  exit it relays.

TLS is optional: the robot verifies the learner against `tls_root` and may present its own
certificate; the server may require one (`--tls-client-ca`). Without it the link is plain TCP, for a
trusted network only: whoever reaches the port can feed the robot candidates (which the node still
validates and the shield still guards).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np

from q2real.configs import checks
from q2real.configs.errors import Q2RealError
from q2real.configs.loader import ConfigError
from q2real.contracts.transitions import (
    CANDIDATE,
    GOOD,
    READY,
    RING,
    ROLLBACK,
    TransitionRing,
    version_name,
    write_atomic,
)
from q2real.deploy_ros.learning import link_pb2 as pb
from q2real.deploy_ros.learning.learner_process import LOG, launch, learner_command
from q2real.deploy_ros.signals import on_signal

PROTOCOL = 1
METHOD = "/q2real.link.Learner/Session"
SEND_PERIOD = 0.01
"""Seconds between two looks of either end at its ring and files when there was nothing to send."""
MESSAGE_BYTES = 1 << 20
"""Rows, rewards and file chunks per message: at most this many bytes (gRPC's default cap is 4 MiB)."""
FILE_MAX = 256 << 20
"""Largest version file the robot accepts (a bundle of a large policy is tens of MiB)."""
RING_MAX = 1 << 24
"""Largest ring a session may announce (its observation, action and joint counts: at most 4096 each)."""
VERSION_FILE = re.compile(r"v(\d{4})\.(onnx|probe\.npz)")
OPTIONS = [("grpc.max_send_message_length", 2 * MESSAGE_BYTES), ("grpc.max_receive_message_length", 2 * MESSAGE_BYTES)]


def _session_stub(channel: grpc.Channel):
    return channel.stream_stream(
        METHOD, request_serializer=pb.FromRobot.SerializeToString, response_deserializer=pb.FromLearner.FromString
    )


@dataclass(frozen=True)
class Tls:
    """PEM files. The robot: `root` (the CA of the learner's certificate), optionally `cert`+`key` (its
    own). The learner: `cert`+`key` (its own), optionally `root` (the CA robots must be signed by)."""

    root: str | None = None
    cert: str | None = None
    key: str | None = None

    def _read(self, name: str) -> bytes | None:
        path = getattr(self, name)
        if path is None:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as err:
            raise ConfigError(f"tls {name}: cannot read {path}: {err.strerror}") from None

    def channel(self, address: str) -> grpc.Channel:
        if self.root is None:
            return grpc.insecure_channel(address, options=OPTIONS)
        credentials = grpc.ssl_channel_credentials(self._read("root"), self._read("key"), self._read("cert"))
        return grpc.secure_channel(address, credentials, options=OPTIONS)

    def bind(self, server: grpc.Server, address: str) -> int:
        if self.cert is None:
            return server.add_insecure_port(address)
        key, cert = self._read("key"), self._read("cert")
        assert key is not None and cert is not None
        root = self._read("root")
        credentials = grpc.ssl_server_credentials([(key, cert)], root, require_client_auth=root is not None)
        return server.add_secure_port(address, credentials)


# --- the robot's end --------------------------------------------------------------------------------
class Receiver:
    """What the learner sends, checked before it touches the node's directory: rewards only for rows
    the node wrote, files only as `vNNNN.onnx` / `vNNNN.probe.npz` (NNNN >= 1, never one already
    there), in order, each under FILE_MAX, announced only when both are whole."""

    def __init__(self, directory: Path, ring: TransitionRing):
        self.directory, self.ring = directory, ring
        self.partial: dict[str, int] = {}
        self.done: set[str] = set()
        self.refused = 0

    def rewards(self, message: pb.Rewards) -> None:
        n = len(message.values) // 4
        if len(message.values) % 4 or message.start < 0 or n > self.ring.capacity or message.start + n > self.ring.head:
            self._refuse(f"rewards for rows [{message.start}, +{len(message.values) / 4:g}) the node did not write")
            return
        self.ring.write_rewards(message.start, np.frombuffer(message.values, dtype="<f4"))

    def chunk(self, message: pb.FileChunk) -> None:
        name = message.name
        match = VERSION_FILE.fullmatch(name)
        if match is None or int(match.group(1)) < 1:
            self._refuse(f"a file named {name!r:.80}: expected vNNNN.onnx or vNNNN.probe.npz, NNNN >= 1")
            return
        part = self.directory / f".{name}.part"
        received = self.partial.get(name, 0)
        if name in self.done or (self.directory / name).exists():
            self._refuse(f"{name}: that version is already here")
            return
        if message.offset != received or received + len(message.data) > FILE_MAX:
            self.partial.pop(name, None)
            part.unlink(missing_ok=True)
            self._refuse(f"{name}: a chunk at {message.offset} (expected {received}), or over {FILE_MAX} bytes")
            return
        with open(part, "ab" if received else "wb") as handle:
            handle.write(message.data)
        self.partial[name] = received + len(message.data)
        if message.last:
            del self.partial[name]
            os.replace(part, self.directory / name)
            self.done.add(name)

    def candidate(self, message: pb.Candidate) -> None:
        stem = version_name(message.version) if 1 <= message.version <= 9999 else ""
        bundle, probe = f"{stem}.onnx", f"{stem}.probe.npz"
        if not (stem and bundle in self.done and probe in self.done):
            self._refuse(f"version {message.version} announced before its bundle and probe arrived")
            return
        announcement = {"version": message.version, "bundle": bundle, "probe": probe, "step": message.step}
        write_atomic(self.directory / CANDIDATE, json.dumps(announcement))

    def _refuse(self, reason: str) -> None:
        self.refused += 1
        print(f"link: refused from the learner: {reason}", flush=True)


class Client:
    """The robot's end of one session; `run()` returns the exit status (0 when the node stopped it)."""

    def __init__(self, directory: Path, address: str, tls: Tls, parent: int | None = None):
        checks.address("--learner", address)
        self.directory, self.address, self.tls, self.parent = directory, address, tls, parent
        self.ring = TransitionRing(directory / RING)
        self.receiver = Receiver(directory, self.ring)
        self.sent = 0
        self.batch = max(1, min(self.ring.capacity // 2, MESSAGE_BYTES // self.ring.dtype.itemsize))
        self._sent_notes = {ROLLBACK: "", GOOD: ""}
        self._stop = threading.Event()

    def requests(self) -> Iterator[pb.FromRobot]:
        ring = self.ring
        yield pb.FromRobot(
            hello=pb.Hello(
                protocol=PROTOCOL, capacity=ring.capacity, obs_dim=ring.obs_dim, action_dim=ring.action_dim,
                joints=ring.joints,
            )
        )  # fmt: skip
        while not self._stop.is_set():
            rows, after = ring.read(self.sent, self.batch)
            if len(rows):
                yield pb.FromRobot(rows=pb.Rows(first=after - len(rows), data=rows.tobytes(), dropped=ring.dropped))
            self.sent = after
            for name in (ROLLBACK, GOOD):
                path = self.directory / name
                if path.is_file() and (text := path.read_text()) != self._sent_notes[name]:
                    self._sent_notes[name] = text
                    note = json.loads(text)
                    if name == GOOD:
                        yield pb.FromRobot(good=pb.Good(version=note["version"]))
                    else:
                        rollback = pb.Rollback(version=note["version"], refused=note["refused"], reason=note["reason"])
                        yield pb.FromRobot(rollback=rollback)
            if self.parent is not None and os.getppid() != self.parent:
                self._stop.set()  # the node's process is gone
            elif len(rows) < self.batch:
                time.sleep(SEND_PERIOD)

    def run(self) -> int:
        with self.tls.channel(self.address) as channel:
            responses = _session_stub(channel)(self.requests())

            def stop() -> None:  # the node stopping (SIGTERM): end the session cleanly
                self._stop.set()
                responses.cancel()

            previous = on_signal(signal.SIGTERM, stop)
            try:
                for message in responses:
                    kind = message.WhichOneof("kind")
                    if kind == "rewards":
                        self.receiver.rewards(message.rewards)
                    elif kind == "chunk":
                        self.receiver.chunk(message.chunk)
                    elif kind == "candidate":
                        self.receiver.candidate(message.candidate)
                    elif kind == "ready":
                        print(f"link: the learner at {self.address} fine-tunes {message.ready.run}", flush=True)
                        write_atomic(self.directory / READY, json.dumps({"pid": os.getpid(), "run": message.ready.run}))
                    elif kind == "failure":
                        print(f"link: the learner at {self.address}: {message.failure.reason}", flush=True)
                        return 2
            except grpc.RpcError as err:
                if self._stop.is_set():
                    return 0
                print(f"link: the learner at {self.address}: {err.code().name}: {err.details()}", flush=True)  # pyright: ignore[reportAttributeAccessIssue]
                return 3
            finally:
                self._stop.set()
                signal.signal(signal.SIGTERM, previous)
                lost = self.ring.dropped
                print(
                    f"link: {self.sent - lost} rows sent, {lost} lost (overwritten before they were sent)", flush=True
                )
        print(f"link: the learner at {self.address} ended the session", flush=True)
        return 0


# --- the workstation's end ---------------------------------------------------------------------------
class Relay:
    """The gRPC service: one robot session at a time, each in its own directory under `root`, with its
    own learner process on `run` (settings `overrides`)."""

    def __init__(self, root: Path, run: str, overrides: tuple[str, ...], publish_every: float, startup: float):
        self.root, self.run, self.overrides = root, run, overrides
        self.publish_every, self.startup = publish_every, startup
        self._busy = threading.Lock()
        self.sessions = 0
        self.received = self.dropped = 0

    def session(self, requests: Iterator[pb.FromRobot], context: grpc.ServicerContext) -> Iterator[pb.FromLearner]:
        if not self._busy.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "this learner already serves a robot")
        try:
            yield from self._session(requests, context)
        finally:
            self._busy.release()

    def _session(self, requests: Iterator[pb.FromRobot], context: grpc.ServicerContext) -> Iterator[pb.FromLearner]:
        hello = next(requests, pb.FromRobot()).hello
        sizes = (hello.capacity, hello.obs_dim, hello.action_dim, hello.joints)
        if hello.protocol != PROTOCOL or not (
            2 <= hello.capacity <= RING_MAX and all(1 <= v <= 4096 for v in sizes[1:])
        ):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"expected a protocol {PROTOCOL} hello, got {hello}")
        self.sessions += 1
        directory = self.root / f"robot-{time.strftime('%Y%m%d-%H%M%S')}-{self.sessions}"
        directory.mkdir(parents=True)
        ring = TransitionRing(directory / RING, *sizes, create=True)
        ring.rewards[:] = np.nan  # no reward until the learner wrote one
        self.received = self.dropped = 0
        print(f"learn: robot {context.peer()} connected: session in {directory}", flush=True)
        gone = threading.Event()
        reader = threading.Thread(target=self._read, args=(requests, ring, directory, gone), daemon=True)
        reader.start()
        learner = None
        try:
            try:
                command = learner_command(directory, self.run, self.publish_every, self.overrides)
                learner = launch(command, directory, self.startup)
            except ConfigError as err:
                yield pb.FromLearner(failure=pb.Failure(reason=str(err)))
                return
            ready = json.loads((directory / READY).read_text())
            yield pb.FromLearner(ready=pb.Ready(run=str(ready["run"])))
            yield from self._relay(ring, directory, learner, gone, context)
        finally:
            gone.set()
            if learner is not None and learner.poll() is None:
                learner.terminate()  # it checkpoints, then exits
                try:
                    learner.wait(30)
                except subprocess.TimeoutExpired:
                    learner.kill()
                    learner.wait()
            print(
                f"learn: session in {directory} ended: {self.received} rows received, {self.dropped} dropped "
                f"on the robot before they could be sent",
                flush=True,
            )

    def _relay(self, ring, directory, learner, gone, context) -> Iterator[pb.FromLearner]:
        sent_rewards, announced = 0, ""
        per_message = MESSAGE_BYTES // 4
        while not gone.is_set() and context.is_active():
            if learner.poll() is not None:
                tail = (directory / LOG).read_text()[-1500:]
                yield pb.FromLearner(failure=pb.Failure(reason=f"the learner exited ({learner.returncode}):\n{tail}"))
                return
            busy = False
            rewarded = ring.rewarded
            if rewarded > sent_rewards:
                start = max(sent_rewards, rewarded - ring.capacity)
                end = min(rewarded, start + per_message)
                values = ring.rewards[np.arange(start, end) % ring.capacity].astype("<f4")
                yield pb.FromLearner(rewards=pb.Rewards(start=start, values=values.tobytes()))
                sent_rewards, busy = end, end < rewarded
            path = directory / CANDIDATE
            if path.is_file() and (text := path.read_text()) != announced:
                announced = text
                announcement = json.loads(text)
                for name in (announcement["bundle"], announcement["probe"]):
                    yield from _file_chunks(directory / name)
                yield pb.FromLearner(candidate=pb.Candidate(version=announcement["version"], step=announcement["step"]))
            if not busy:
                time.sleep(SEND_PERIOD)

    def _read(self, requests: Iterator[pb.FromRobot], ring: TransitionRing, directory: Path, gone) -> None:
        """The robot's messages into the session directory, until the robot goes."""
        try:
            for message in requests:
                kind = message.WhichOneof("kind")
                if kind == "rows":
                    rows = np.frombuffer(message.rows.data, dtype=ring.dtype)  # a ValueError if not whole rows
                    ring.put(message.rows.first, rows)
                    self.received += len(rows)
                    self.dropped = message.rows.dropped
                elif kind in ("rollback", "good"):
                    version = message.rollback.version if kind == "rollback" else message.good.version
                    if not (directory / f"{version_name(version)}.pt").is_file():
                        print(f"learn: a {kind} note on version {version}, never made here", flush=True)
                    elif kind == "good":
                        write_atomic(directory / GOOD, json.dumps({"version": version}))
                    else:
                        note = message.rollback
                        rollback = {"version": version, "refused": note.refused, "reason": note.reason}
                        write_atomic(directory / ROLLBACK, json.dumps(rollback))
        except ValueError as err:
            print(f"learn: the robot's stream is malformed: {err}", flush=True)
        except grpc.RpcError:
            pass  # the robot went: the session ends
        finally:
            gone.set()


def _file_chunks(path: Path) -> Iterator[pb.FromLearner]:
    data = path.read_bytes()
    for offset in range(0, max(len(data), 1), MESSAGE_BYTES):
        piece = data[offset : offset + MESSAGE_BYTES]
        last = offset + MESSAGE_BYTES >= len(data)
        yield pb.FromLearner(chunk=pb.FileChunk(name=path.name, offset=offset, data=piece, last=last))


def serve(address: str, relay: Relay, tls: Tls = Tls()) -> tuple[grpc.Server, int]:
    """Start serving `relay` on `address` (port 0: any free port); returns the server and its port."""
    try:
        checks.address("--serve", address, lowest_port=0)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    # No SO_REUSEPORT (gRPC's default): a second learner on the port must fail, not share its robots.
    options = [*OPTIONS, ("grpc.so_reuseport", 0)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=options)
    handler = grpc.stream_stream_rpc_method_handler(
        relay.session,
        request_deserializer=pb.FromRobot.FromString,
        response_serializer=pb.FromLearner.SerializeToString,
    )
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("q2real.link.Learner", {"Session": handler})])
    try:
        port = tls.bind(server, address)
    except RuntimeError:  # grpc's "failed to bind"
        port = 0
    if port == 0:
        raise ConfigError(f"--serve: cannot listen on {address} (in use, or not an address of this machine)")
    server.start()
    return server, port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m q2real.deploy_ros.learning.link", description="the robot's end of the link"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    connect = sub.add_parser("connect", help="stream a fine-tuning directory's ring to a remote learner")
    connect.add_argument("directory", type=Path)
    connect.add_argument("--learner", required=True, metavar="HOST:PORT")
    connect.add_argument("--parent-pid", type=int, default=None, help="exit when this process (the node) is gone")
    connect.add_argument("--tls-root", help="PEM: the CA of the learner's certificate (TLS on)")
    connect.add_argument("--tls-cert", help="PEM: this robot's certificate, for a learner that requires one")
    connect.add_argument("--tls-key", help="PEM: its private key")
    args = parser.parse_args(argv)
    try:
        client = Client(args.directory, args.learner, Tls(args.tls_root, args.tls_cert, args.tls_key), args.parent_pid)
        return client.run()
    except (Q2RealError, ValueError, OSError) as err:
        print(f"link: error: {err}", flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
