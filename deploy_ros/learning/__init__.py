"""On-robot learning, the robot's side: the node's transitions to a learner and its versions back,
validated, tried and rolled back (`robot_side`); the learner's process (`learner_process`); and the
gRPC link to a learner on a workstation (`link`). The learner itself is the trainer's."""
