"""The functions a reader follows from ``load_policy(MODEL)`` to the first matrix multiplication of ``infer``.

Two stacks are recorded, keeping only the package's own frames (torch's ``Module.__call__`` and the like are
skipped): the one that constructs the returned policy (``load_policy`` down to the family's loader) and the one
under the first GEMM-like torch call of a warm ``policy.infer(observation)`` (linear, convolution, matmul and
friends; the first call also builds the static buffers, a one-time side branch).
Their union, in order, is the path; its length is what ``tests/test_call_path.py`` bounds.

    python tools/call_path.py [--model pi0-tiny]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

#: The torch calls that count as a matrix multiplication (a strided convolution is a GEMM over patches).
GEMMS = frozenset({F.linear, F.conv2d, F.conv3d, torch.conv2d, torch.conv3d, torch.matmul, torch.mm, torch.bmm,
                   torch.addmm, torch.baddbmm, torch.einsum, torch.Tensor.matmul, torch.Tensor.__matmul__})  # fmt: skip


@dataclass(frozen=True)
class Step:
    """One function on the path: its qualified name and where it is defined (relative to the repository)."""

    name: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.name}  ({self.file}:{self.line})"


def _package_frames(frame, package: Path) -> list[Step]:
    """The package's frames from the outermost to ``frame`` (the innermost)."""
    steps = []
    while frame is not None:
        path = Path(frame.f_code.co_filename).resolve()
        if package in path.parents:
            code = frame.f_code
            steps.append(Step(code.co_qualname, str(path.relative_to(package.parent)), code.co_firstlineno))
        frame = frame.f_back
    return steps[::-1]


class _FirstGemm(TorchFunctionMode):
    """Records the package's stack at the first GEMM-like call."""

    def __init__(self, package: Path):
        super().__init__()
        self.package, self.steps = package, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.steps is None and func in GEMMS:
            self.steps = _package_frames(sys._getframe(1), self.package)
        return func(*args, **(kwargs or {}))


def call_path(model: str = "pi0-tiny") -> list[Step]:
    """The path from ``embodied_accel.load_policy(model)`` to the first GEMM of one ``infer`` call."""
    import embodied_accel
    from embodied_accel.policies.base import Policy

    package = Path(embodied_accel.__file__).resolve().parent
    load_steps: list[Step] = []
    original_init = Policy.__init__

    def recording_init(self, *args, **kwargs):
        if not load_steps:  # the stack that builds the returned policy, above its constructor
            load_steps.extend(_package_frames(sys._getframe(1), package))
        original_init(self, *args, **kwargs)

    Policy.__init__ = recording_init
    try:
        policy = embodied_accel.load_policy(model)
    finally:
        Policy.__init__ = original_init
    # The constructors of the policy class hierarchy are how the object is built, not where ``infer`` leads.
    load_steps = [step for step in load_steps if not step.name.endswith(".__init__")]
    from embodied_accel.families.policy import default_observation

    observation = default_observation(policy)  # what `embodied-accel run` uses: the bundled sample or the policy's own
    if "task" in observation and policy.processor.tokenizer is not None:  # the instruction once, as text
        observation = {k: v for k, v in observation.items() if not k.startswith("observation.language.")}
    policy.infer(observation, seed=0)  # the first call builds the static buffers; the path is a warm call's
    mode = _FirstGemm(package)
    with mode:
        policy.infer(observation, seed=0)
    if mode.steps is None:
        raise RuntimeError(f"{model}: infer ran no GEMM-like torch call")
    path: list[Step] = []
    for step in [*load_steps, *mode.steps]:
        if step not in path:
            path.append(step)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="pi0-tiny", help="a policy preset (default: pi0-tiny)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = call_path(args.model)
    for number, step in enumerate(path, 1):
        print(f"{number:2d}. {step}")
    print(f"{len(path)} functions in {len({step.file for step in path})} files")


if __name__ == "__main__":
    main()
