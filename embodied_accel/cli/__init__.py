"""The ``embodied-accel`` command: run, benchmark, profile and serve robot policies (pi0 / pi0.5, GR00T N1.6),
fine-tune and evaluate them, reconstruct scenes (VGGT) and generate meshes (Hunyuan3D-2).

Every command runs with no arguments on a built-in default (a tiny preset with seeded random weights, a bundled
sample input; eval names its benchmark: ``eval libero``) and takes --log-level before or after its name. A bad flag, file or observation ends with a
message on stderr naming the problem and exit code 2.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import platform
import re
import sys
from pathlib import Path
from typing import Any

from . import process_env  # noqa: F401  (before anything that loads PyTorch)

# isort: split
from .. import __version__
from ..argtypes import RESULTS_DIR, non_negative_float, non_negative_int, positive_int
from ..families import CLIError, family_options, preset_names  # noqa: F401  (CLIError: tests)
from ..families.policy import (  # noqa: F401  (also the names tools and tests use from here)
    DEFAULT_MODEL,
    SAMPLE_OBSERVATION,
    _json_value,
    fill_camera_slots,
    load_observation,
    load_policy_from_args,
    rtc_option,
    select_instruction,
)
from ..nn.rtc import SCHEDULES
from ..ops import BACKEND_NAMES, CUDA_ATTENTION_KERNELS, BackendUnavailableError
from ..quant import QUANT_MODES
from ..runtime import CAPTURE_MODES, CaptureUnavailableError
from ..serve import onnx_source
from . import eval as eval_commands
from . import export as export_command
from . import reconstruct as vggt_commands
from . import serve as serve_commands
from . import shape as shape_command
from . import texture as texture_command
from . import train as train_commands
from .model import PROG, cmd_bench, cmd_info, cmd_profile, cmd_run, stage_split  # noqa: F401  (stage_split: tools)

logger = logging.getLogger(__name__)

DTYPE_CHOICES = ("float32", "bfloat16", "float16")
POLICY_DTYPES = ("float32", "bfloat16")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_LOG_LEVEL = "WARNING"
#: What ``torch.Generator.manual_seed`` accepts without wrapping: an unsigned 64-bit integer.
SEED_RANGE = (0, 2**64 - 1)


EXAMPLES = """examples:
  embodied-accel run                       # pi0-tiny, seeded random weights, the bundled sample observation
  embodied-accel run --checkpoint DIR --observation obs.npz --output actions.npy
  embodied-accel info --model pi05
  embodied-accel bench --runs 100 --batch 1 --views 2
  embodied-accel profile --model groot-tiny   # where the call's time goes: op types, top kernels, verdict
  embodied-accel bench --model vggt-tiny   # run | info | bench | profile take every family's presets
  embodied-accel serve --model pi0-tiny --port 8000   # openpi-compatible websocket policy server
  embodied-accel loadtest --clients 16 --requests 200  # against an in-process server, or --url ws://host:port
  embodied-accel train                     # a few steps on the built-in sample dataset; then run --checkpoint
  embodied-accel train --dataset DIR --checkpoint BASE --out DIR    # fine-tune on a LeRobot dataset
  embodied-accel eval libero --checkpoint DIR --suite libero_spatial   # closed-loop LIBERO success rates
  embodied-accel reconstruct IMAGES_DIR -o scene.ply   # VGGT: cameras, depth, point cloud (default: results/)
  embodied-accel shape IMAGE -o mesh.glb   # Hunyuan3D-2: image -> mesh
"""


# ---------------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------------


def _seed(text: str) -> int:
    """An argparse type: a seed torch's generator takes, 0 .. 2**64 - 1."""
    low, high = SEED_RANGE
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer in [{low}, 2**64 - 1], got {text!r}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"expected an integer in [{low}, 2**64 - 1] ({high}), got {value}")
    return value


def _torch_version() -> str:
    import torch

    return torch.__version__


def _common_options() -> argparse.ArgumentParser:
    """Options every subcommand takes, also after its name (``embodied-accel run --log-level INFO``)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        type=str.upper,
        default=argparse.SUPPRESS,  # unset here: the value before the subcommand (or its default) stays
        help=f"default: {DEFAULT_LOG_LEVEL}",
    )
    return parent


def _takes_log_level(parser: argparse.ArgumentParser) -> bool:
    return any("--log-level" in action.option_strings for action in parser._actions)


_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


def _did_you_mean(word: str, candidates: list[str]) -> str | None:
    close = difflib.get_close_matches(word, candidates, n=3, cutoff=0.6)
    return f"did you mean {' or '.join(close)}?" if close else None


class OneLineErrors(argparse.ArgumentParser):
    """A usage error as one line, ``embodied-accel CMD: error: ... (try embodied-accel CMD --help)``, with a "did you
    mean" for a misspelled choice or option instead of argparse's usage block."""

    def error(self, message: str):  # type: ignore[override]
        match = _INVALID_CHOICE.search(message)
        if match:
            choices = re.findall(r"'([^']*)'", match.group(2))
            hint = _did_you_mean(match.group(1), choices)
            if hint is not None:
                message = message[: match.start()] + f"invalid choice: {match.group(1)!r} ({hint})"
        self.exit(2, f"{self.prog}: error: {message} (try {self.prog} --help)\n")

    def unrecognized(self, extras: list[str]):
        """The error for arguments no option took, each misspelled flag with its nearest options."""
        options = {flag[2:]: flag for action in self._actions for flag in action.option_strings if flag.startswith("--")}
        hints = []
        for word in extras:  # compared without the dashes every option shares
            close = difflib.get_close_matches(word.split("=", 1)[0].lstrip("-"), list(options), n=3, cutoff=0.6)
            if word.startswith("-") and close:
                hints.append(f"did you mean {' or '.join(options[c] for c in close)}?")
        self.error(f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else ""))


class CommandParser(OneLineErrors):
    """The parser of a subcommand, and of a subcommand's own subcommands (``eval libero``): each takes the options
    of :func:`_common_options` after its name, whichever module registers it."""

    def __init__(self, *args: Any, parents: list[argparse.ArgumentParser] | tuple = (), **kwargs: Any):
        parents = list(parents)
        if not any(_takes_log_level(parent) for parent in parents):
            parents.insert(0, _common_options())
        super().__init__(*args, parents=parents, **kwargs)


def _policy_options(every_family: bool = False) -> argparse.ArgumentParser:
    """Options shared by every subcommand that builds a policy; ``every_family``: of ``run``, ``info``, ``bench`` and
    ``profile``, which take a model of any family (its presets, dtypes and the families' own options)."""
    presets = preset_names(policies_only=not every_family)
    dtypes = DTYPE_CHOICES if every_family else POLICY_DTYPES
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("model" if every_family else "policy")
    source = group.add_mutually_exclusive_group()
    source.add_argument(
        "--model",
        choices=presets,
        metavar="PRESET",
        help=f"a preset with seeded random weights, one of {', '.join(presets)} (default: {DEFAULT_MODEL})",
    )
    source.add_argument(
        "--checkpoint", type=Path, metavar="DIR",
        help="a LeRobot pi0 / pi0.5 or a GR00T N1.6 checkpoint directory"
        + (" (run / info / bench / profile: also a VGGT, Hunyuan3D-2 or Hunyuan3D-Paint one)" if every_family else ""),
    )
    group.add_argument(
        "--preset",
        choices=presets,
        metavar="PRESET",
        help="with --checkpoint: the architecture of a small custom checkpoint (e.g. pi0-tiny, groot-tiny)",
    )
    group.add_argument(
        "--embodiment", metavar="TAG", help="GR00T: the embodiment tag (e.g. gr1); needed when a checkpoint has several"
    )
    group.add_argument("--backbone-config", type=Path, metavar="FILE",
                       help="GR00T: with --checkpoint, the Eagle backbone config.json it was trained with (any "
                            "backbone; default: the released N1.6 one)")  # fmt: skip
    group.add_argument("--vl-padding", choices=("official", "masked"), metavar="MODE",
                       help="GR00T N1.7: a batch's padding in the vl self-attention, 'official' (each row as in the "
                            "official padded batch; the default) or 'masked' (each row as run alone); the server "
                            "always runs 'masked'")  # fmt: skip
    group.add_argument("--backend", choices=BACKEND_NAMES, default="auto", help="op backend (default: auto)")
    group.add_argument(
        "--cuda-attention",
        choices=CUDA_ATTENTION_KERNELS,
        default="sdpa",
        help="the cuda backend's attention kernel: sdpa (packed multi-query SDPA) or triton (default: sdpa)",
    )
    group.add_argument(
        "--capture", choices=CAPTURE_MODES, default="eager", help="how the call is executed (default: eager)"
    )
    group.add_argument("--dtype", choices=dtypes, default="float32",
                       help="compute dtype (default: float32; float16: not the policies)")  # fmt: skip
    group.add_argument("--quant", choices=QUANT_MODES, default="none",
                       help="w8a8: int8 weights and activations for the family's planned linear layers; fp8: float8 "
                            "E4M3 (FP8 tensor cores: NVIDIA compute capability 8.9+) (pi0 / pi0.5, GR00T, VGGT; "
                            "default: none)")  # fmt: skip
    group.add_argument(
        "--tokenizer",
        type=Path,
        metavar="PATH",
        help="pi0: the PaliGemma SentencePiece tokenizer.model; GR00T: an Isaac-GR00T checkout or its Eagle tokenizer dir",
    )
    rtc = parent.add_argument_group("real-time chunking (requests that carry previous_actions)")
    rtc.add_argument("--rtc-schedule", choices=SCHEDULES, help="soft mask over the overlap (default: linear)")
    rtc.add_argument(
        "--rtc-max-guidance",
        type=non_negative_float,
        metavar="W",
        help="clip of the guidance weight (default: 10)",
    )
    rtc.add_argument(
        "--rtc-execution-horizon", type=positive_int, metavar="N", help="where the soft mask ends (default: 10)"
    )
    group.add_argument("--no-progress", action="store_true", help="no progress bars")
    group.add_argument("--threads", type=positive_int, metavar="N", help="CPU: intra-op threads (default: 1 for a "
                       "model under 100 M parameters, else torch's; OMP_NUM_THREADS is kept)")  # fmt: skip
    if every_family:
        family = parent.add_argument_group("family options (an error for a model of another family)")
        for option in family_options():
            family.add_argument(*option.flags, **option.kwargs)
    return parent


def _observation_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--observation",
        type=Path,
        metavar="FILE",
        help="observation as .npz (arrays keyed by observation key; the task as a 0-d string array) or .json "
        "(default: the bundled sample, two cameras, state [8], 'pick up the red block')",
    )


def _call_shape_options(parser: argparse.ArgumentParser) -> None:
    """The options of a measured call (bench, profile): observation, batch, views, steps."""
    _observation_option(parser)
    parser.add_argument("--batch", type=positive_int, default=1, help="batch size (default: 1)")
    parser.add_argument(
        "--views", type=positive_int, metavar="N", help="number of camera slots (default: the model's)"
    )
    parser.add_argument("--num-steps", type=positive_int, metavar="N", help="denoising steps (default: the model's)")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(
        prog=PROG,
        description=__doc__.replace("``", ""),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=DEFAULT_LOG_LEVEL,
        type=str.upper,
        help=f"default: {DEFAULT_LOG_LEVEL}",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {__version__} (torch {_torch_version()}, Python {platform.python_version()})",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CommandParser)
    policy = _policy_options()
    any_model = _policy_options(every_family=True)

    def add_command(name: str, parents: list[argparse.ArgumentParser], **kwargs) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=parents, **kwargs)

    run = add_command("run", [any_model], help="run a model once on its sample (or given) inputs and summarize the outputs")
    _observation_option(run)
    noise = run.add_mutually_exclusive_group()
    noise.add_argument("--noise", type=Path, metavar="FILE", help="initial noise .npy [horizon, max_action_dim]")
    noise.add_argument("--seed", type=_seed, default=0, help="seed of the initial noise, 0 .. 2**64-1 (default: 0)")
    run.add_argument("--num-steps", type=positive_int, metavar="N", help="denoising steps (default: the model's)")
    run.add_argument("--output", type=Path, metavar="FILE", help="write the actions to a .npy or .json file")
    run.add_argument(
        "--no-warm-call", action="store_true", help="skip the second, warm call (its latency is shown beside the first's)"
    )
    run.set_defaults(handler=cmd_run)

    info = add_command("info", [any_model], help="describe a model: size, backend, inputs and outputs")
    info.add_argument("--views", type=positive_int, metavar="N", help="number of camera slots")
    info.set_defaults(handler=cmd_info)

    bench = add_command("bench", [any_model], help="time the model call and write a JSON result")
    _call_shape_options(bench)
    bench.add_argument("--warmup", type=non_negative_int, default=3, help="untimed calls first (default: 3)")
    bench.add_argument("--runs", type=positive_int, default=100, help="timed calls (default: 100)")
    bench.add_argument("--no-stages", action="store_true", help="skip the per-stage (vision/prefix/denoise) split")
    bench.add_argument("--out-dir", type=Path, default=Path(RESULTS_DIR), help=f"default: {RESULTS_DIR}/ (here)")
    bench.add_argument("--note", help="free text stored in the result file")

    prof = add_command(
        "profile", [any_model], help="profile the model call: device busy/idle, op types, top kernels, verdict"
    )
    _call_shape_options(prof)
    prof.add_argument("--warmup", type=non_negative_int, default=2, help="unprofiled calls first (default: 2)")
    prof.add_argument("--calls", type=positive_int, default=3, help="profiled calls (default: 3)")
    prof.add_argument("--out-dir", type=Path, default=Path(RESULTS_DIR) / "profiles",
                      help=f"default: {RESULTS_DIR}/profiles/ (here)")  # fmt: skip
    prof.set_defaults(handler=cmd_profile)
    bench.set_defaults(handler=cmd_bench)

    serve = add_command(
        "serve", [policy], help="serve the policy to robots: openpi's websocket protocol, GR00T's ZeroMQ protocol"
    )
    serve_commands.add_server_options(serve, network=True)
    onnx_source.add_onnx_options(serve)
    serve.set_defaults(handler=cmd_serve)

    load = add_command("loadtest", [policy], help="N clients x M requests against a policy server")
    serve_commands.add_loadtest_options(load, positive_int, non_negative_int)
    serve_commands.add_server_options(load, network=False)
    _observation_option(load)
    load.set_defaults(handler=cmd_loadtest)

    train_commands.add_train_command(add_command)
    eval_commands.add_eval_command(add_command, policy)
    reconstruct = vggt_commands.add_reconstruct_parser(commands, BACKEND_NAMES, ("float32", "bfloat16", "float16"))
    reconstruct.set_defaults(handler=cmd_reconstruct)

    shape = shape_command.add_shape_parser(commands, BACKEND_NAMES, CAPTURE_MODES)
    shape.set_defaults(handler=cmd_shape)
    export_command.add_export_parser(commands)
    texture = texture_command.add_texture_parser(commands, BACKEND_NAMES)
    texture.set_defaults(handler=lambda args: texture_command.run_texture(args, lambda line: print(line, flush=True)))
    return parser


# ---------------------------------------------------------------------------------------------------------------
# Commands of other modules: serve, loadtest, reconstruct, shape (run | info | bench | profile: commands/model.py)
# ---------------------------------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    if "lerobot-async" not in args.protocol:  # that one needs grpcio only (checked when it starts)
        serve_commands.require_serve_extra("serve")
    # the port is bound before the model loads: "address in use" comes at once, not after a full load
    return serve_commands.run_serve(
        lambda: onnx_source.onnx_policy(args) or load_policy_from_args(args, num_views=args.views)[0],
        args,
        announce=lambda line: print(line, flush=True),
    )


def cmd_loadtest(args: argparse.Namespace) -> int:
    """Exit code 0 when every request succeeded, 1 otherwise."""
    serve_commands.require_serve_extra("loadtest")
    observation = load_observation(args.observation) if args.observation is not None else None
    print(f"{PROG} loadtest: {args.clients} client(s) x {args.requests} request(s), {args.warmup} warm-up each, "
          f"against {args.url or 'an in-process server'} ...", file=sys.stderr, flush=True)  # fmt: skip
    stats, record = serve_commands.run_loadtest_command(
        args, lambda: load_policy_from_args(args, num_views=args.views)[0], observation
    )
    path = None if args.no_write else serve_commands.write_loadtest_record(record, args.out_dir)
    print(serve_commands.loadtest_summary(stats, path))
    return 0 if stats["errors"] == 0 else 1


def cmd_reconstruct(args: argparse.Namespace) -> int:
    return vggt_commands.run_reconstruct(args, print_fn=lambda line: print(line, flush=True))


def cmd_shape(args: argparse.Namespace) -> int:
    return shape_command.run_shape(args, print_fn=lambda line: print(line, flush=True))


# ---------------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------------


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> OneLineErrors:
    """The parser of the (sub)command ``args`` came from (``eval libero``'s own), else ``parser``."""
    for name in ("command", "benchmark"):
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or getattr(args, name, None) is None:
            break
        parser = actions[0].choices[getattr(args, name)]
    return parser


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")  # no-op if already configured
    logging.getLogger("embodied_accel").setLevel(level)


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit code (0 ok, 2 bad arguments, files or observations)."""
    parser = build_parser()
    try:
        args, extras = parser.parse_known_args(argv)
        if extras:  # named by the command's own parser: its prog and its options
            _command_parser(parser, args).unrecognized(extras)
    except SystemExit as exc:  # argparse has printed the usage error (or --help)
        return exc.code if isinstance(exc.code, int) else 0
    _configure_logging(args.log_level)
    try:
        return args.handler(args)
    except (ValueError, BackendUnavailableError, CaptureUnavailableError, ImportError, ConnectionError) as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
