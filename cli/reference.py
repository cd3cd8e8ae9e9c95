"""Reference pages generated from the code: the command line, the policy bundle's metadata and the ROS 2
interface. Each is Markdown built from what the program itself uses (its argument parser, the bundle
field table the schema is checked against, the node's topic settings and QoS), so the manual cannot
say something the program does not do; `docs/generate.py` writes them and a test keeps them current.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from contextlib import contextmanager

HELP_WIDTH = "100"
"""Columns argparse wraps help at on the generated page, whatever the terminal that wrote it."""


@contextmanager
def _help_width():
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def cli_reference() -> str:
    """Every `q2real` command's `--help`, as the program prints it."""
    from q2real.cli.main import build_parser

    with _help_width():
        parser = build_parser()
        pages = [("q2real", parser)]
        for name, sub in _subcommands(parser).items():
            pages.append((f"q2real {name}", sub))
            pages += [(f"q2real {name} {inner}", p) for inner, p in _subcommands(sub).items()]
        helps = [(title, p.format_help()) for title, p in pages]
    out = [
        "# Command line\n",
        "Every command's `--help`. Commands that take `KEY=VALUE` overrides accept every key of their config "
        "([config reference](config.md)); `--print-config` prints the resolved config without running.\n",
    ]
    for title, text in helps:
        out += [f"## `{title}`\n", "```text", text.rstrip(), "```\n"]
    return "\n".join(out)


def _subcommands(parser: argparse.ArgumentParser) -> dict:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def bundle_reference() -> str:
    """The metadata document a policy bundle carries: every field, the observation source kinds, and the
    robot section of a shipped spec as an example."""
    from q2real.contracts.schema import DIGEST_KEY, FIELDS, METADATA_KEY, SCHEMA_VERSION, robot_metadata
    from q2real.deploy_ros.observation import KINDS, SOURCE_KEYS, STREAMS
    from q2real.hardware import robot_spec

    out = [
        "# Policy bundle\n",
        "A policy bundle is one ONNX file: the graph (observation normalizer, policy, action scaling; input "
        "`obs`, output `actions` in the robot's units) and, under the ONNX metadata key "
        f"`{METADATA_KEY}`, one JSON document that says what the graph needs and what the robot is "
        f"(schema version {SCHEMA_VERSION}). A copy sits beside it as `<bundle>.onnx.json` for reading; the node "
        f"reads the one inside, and refuses a sidecar that differs. The file ends with its digest "
        f"(`{DIGEST_KEY}`, sha256 of everything else), so a changed byte is refused before anything is read. "
        "The deploy node reads nothing else: the bundle is the contract between training and the robot.\n",
        "A field that is missing, of the wrong type, out of range or inconsistent with another is refused "
        "when the bundle loads, naming the bundle and the field (`metadata.robot.kp[3] (joint 'joint4')`).\n",
        "## Fields\n",
        "| Field | Meaning and check |",
        "| --- | --- |",
        *(f"| `{path}` | {_cell(text)} |" for path, text in FIELDS.items()),
        "",
        "## Observation source kinds\n",
        "`observation.terms[].source.kind` says where the node reads each term on the robot:\n",
        "| Kind | Keys besides `kind` | Read from |",
        "| --- | --- | --- |",
    ]
    for kind in KINDS:
        keys = ", ".join(f"`{k}`" for k in sorted(SOURCE_KEYS.get(kind, ()))) or "none"
        stream = STREAMS.get(kind)
        read = "joint states" if stream is None else f"the node's `{stream}` input"
        out.append(f"| `{kind}` | {keys} | {read} |")
    example = robot_metadata(robot_spec("pendulum"))
    out += [
        "",
        "## Example: the pendulum's robot section\n",
        "```json",
        "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in example.items()) + "\n}",
        "```\n",
    ]
    return "\n".join(out)


_MESSAGE_TYPE = re.compile(r"^(\w+_msgs/\w+)")


def ros_reference() -> str:
    """The node's ROS 2 interface: its topics (settable as `topics.*`), their types, direction and QoS, the
    services under rclpy, and the QoS profiles."""
    from q2real.configs.docstrings import field_docs
    from q2real.deploy_ros.settings import NODE_NAME, TRIGGER_SERVICES, TopicConfig, resolve_topic
    from q2real.deploy_ros.transport.dds import DEFAULT_QOS, LATCHED_QOS, SENSOR_QOS, topic_qos

    qos_names = {id(DEFAULT_QOS): "default", id(LATCHED_QOS): "latched", id(SENSOR_QOS): "sensor"}
    published = {"mode", "diagnostics", "command"}
    docs = field_docs(TopicConfig)
    rows = []
    for field in dataclasses.fields(TopicConfig):
        name, doc = field.name, " ".join(docs.get(field.name, "").split())
        default = field.default
        topic = f"`{resolve_topic(default, NODE_NAME)}`" if isinstance(default, str) else "the controller's"
        kind = _MESSAGE_TYPE.match(doc)
        message = kind.group(1) if kind else "as `command_style` says"
        doc = doc[kind.end() :].lstrip(":, ") if kind else doc
        way = "out" if name in published else "in"
        qos = "default" if name == "command" else qos_names[id(topic_qos(name))]
        rows.append(f"| `topics.{name}` | {topic} | {message} | {way} | {qos} | {_cell(doc)} |")
    out = [
        "# ROS 2 interface\n",
        f"The node is `{NODE_NAME}`; `~/` names are private to it. Every topic is a setting (`topics.*`, in "
        "the [config reference](config.md)), so a robot's own names can be used. Both transports (the DDS-wire "
        "node, no ROS install needed, and the rclpy node) use these names and types. Every value that arrives "
        "is range-checked; a refused message is counted in `/diagnostics` (`refused.*`) and shown on the "
        "console with its reason.\n",
        "## Topics\n",
        "| Setting | Default | Type | Direction | QoS | What it carries, what is refused |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "The command topic's type follows `command_style`: `std_msgs/Float64MultiArray` for ros2_control's "
        "forward command controller, `trajectory_msgs/JointTrajectory` for the joint trajectory controller.\n",
        "## Services (rclpy node)\n",
        "| Service | Type | Does |",
        "| --- | --- | --- |",
        *(
            f"| `{resolve_topic(getattr(TopicConfig, kind), NODE_NAME)}` | std_srvs/Trigger | the operator's "
            f"{kind}, as the topic of the same name; the response says the mode the next ticks left |"
            for kind in TRIGGER_SERVICES
        ),
        "",
        "On the DDS-wire node the same requests are the topics above; `q2real operator start|stop|reset|estop"
        "|status` sends them without a ROS install.\n",
        "## QoS profiles\n",
        "| Profile | Policies |",
        "| --- | --- |",
        *(
            f"| {name} | {_cell(', '.join(sorted(str(p).removeprefix('Policy.') for p in qos)))} |"
            for name, qos in (("default", DEFAULT_QOS), ("latched", LATCHED_QOS), ("sensor", SENSOR_QOS))
        ),
        "",
    ]
    return "\n".join(out)
