"""The programs the deploy side starts by name: the sim robot and the learner beside the node.

Each is a console script of this install (`[project.scripts]` in pyproject.toml) that talks to the
node only over the wire or the transition ring (`q2real.contracts.transitions`), so the robot side
starts them without importing the simulator or the learners behind them.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from q2real.configs.loader import ConfigError

SIM_ROBOT = "q2real-sim-robot"
LEARNER = "q2real-learner"


def program(name: str) -> str:
    """The path of `name`: beside this interpreter first (a virtual environment that is not
    activated), then on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise ConfigError(f"{name}: not found beside {sys.executable} or on PATH (reinstall q2real: pip install -e .)")
    return found
