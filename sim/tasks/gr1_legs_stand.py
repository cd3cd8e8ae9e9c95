"""GR1 standing on its legs: `gr1_stand` on the `gr1_legs` robot, GR1 with its head and arms welded at
their default pose.

The policy commands the 3 waist and 12 leg joints instead of all 32, so exploring arms no longer
shove the body it is balancing, and its action and joint observations shrink from 32 to 15 entries
each. Reward, termination, resets and observation terms are `gr1_stand`'s. On the robot, something
other than the policy has to hold the arms at that pose (see `hardware/gr1_legs/robot.yaml`).
"""

from __future__ import annotations

from q2real.sim.tasks.gr1_stand import GR1Stand


class GR1LegsStand(GR1Stand):
    robot = "gr1_legs"
