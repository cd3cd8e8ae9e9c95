"""Writers on several threads of one process, and a listener written in Python reading the same topic:
Cyclone delivers in-process samples on the writing thread and serializes a reader's listener calls,
so a write that held the GIL while waiting for another thread's listener call froze the process for
good (no timeout or signal handler can run then). The scenario runs in a child process, so that a
regression fails this test instead of hanging the suite."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from q2real.deploy_ros.transport import messages as msg

SCENARIO = """
import threading, time
from q2real.deploy_ros.transport import messages as msg
from q2real.deploy_ros.transport.dds import Endpoints, use_loopback

use_loopback()
received = []

def on_message(m):
    received.append(sum(range(200)))  # Python work inside the listener: the GIL changes hands meanwhile

listener = Endpoints(node="listener")
listener.reader("/chatter", msg.Float64, on_message)
participants = [Endpoints(node=f"writer{i}") for i in range(2)]
writers = [p.writer("/chatter", msg.Float64) for p in participants]
stop = threading.Event()

def publish(writer):
    while not stop.is_set():
        writer.write(msg.Float64(data=1.0))

threads = [threading.Thread(target=publish, args=(w,)) for w in writers]
for thread in threads:
    thread.start()
time.sleep(3.0)
stop.set()
for thread in threads:
    thread.join()
for endpoints in (*participants, listener):
    endpoints.close()
print(len(received))
"""


@pytest.mark.slow  # a child process writing for 3 s
def test_two_writer_threads_and_a_python_listener_on_one_topic_never_deadlock(dds_domain: int) -> None:
    try:
        done = subprocess.run([sys.executable, "-c", SCENARIO], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the process froze: a write held the GIL while Cyclone waited for a Python listener")
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) > 1000  # both writers kept delivering for the whole run


def test_a_write_without_the_gil_delivers_the_message_field_for_field(participant) -> None:
    endpoints = participant("wire")
    received: list[msg.JointState] = []
    endpoints.reader("/joint_states", msg.JointState, received.append)
    writer = endpoints.writer("/joint_states", msg.JointState)
    sent = msg.JointState(
        header=msg.Header(stamp=msg.Time(sec=12, nanosec=345), frame_id="base"),
        name=["shoulder", "elbow", "wrist"],
        position=[0.1, -2.5, 3.0],
        velocity=[1e-9, 0.0, -7.25],
        effort=[float("inf"), 1e308, -0.0],
    )
    writer.write(sent)  # a reader in this process: delivered on this thread, before write returns
    deadline = time.monotonic() + 5
    while not received and time.monotonic() < deadline:
        time.sleep(0.01)
    assert received == [sent]
    with pytest.raises(TypeError, match="is not of type"):
        writer.write(msg.Float64(data=1.0))  # wrong type: the binding's own refusal
