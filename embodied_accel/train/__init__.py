"""Fine-tuning pi0 / pi0.5 on LeRobot datasets: the flow-matching loss, the optimizer and its schedule, the training
loop (single process, DDP or FSDP2 through ``torchrun``), checkpoints in LeRobot's format with exact resume.

Layering: sits above :mod:`embodied_accel.policies` (the model it trains is the one inference serves, loaded the same
way) and :mod:`embodied_accel.data` (the datasets it reads).
"""
