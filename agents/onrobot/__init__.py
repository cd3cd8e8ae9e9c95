"""Learning on the robot's own transitions: the handoff of a trained run to one robot (`finetune`), in
simulation or beside the deploy node (`robot_learner`, the `q2real-learner` program)."""
