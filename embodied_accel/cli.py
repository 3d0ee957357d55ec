"""The ``embodied-accel`` command: run, benchmark, profile and serve robot policies (pi0 / pi0.5, GR00T N1.6),
fine-tune and evaluate them, reconstruct scenes (VGGT) and generate meshes (Hunyuan3D-2).

Every command runs with no arguments on a built-in default (a tiny preset with seeded random weights, a bundled
sample input) and takes --log-level before or after its name. A bad flag, file or observation ends with a
message on stderr naming the problem and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import platform
import sys
import time
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .argtypes import non_negative_float, non_negative_int, positive_int
from .eval import commands as eval_commands
from .export import command as export_command
from .models.vggt import commands as vggt_commands
from .nn.rtc import SCHEDULES
from .ops import BACKEND_NAMES, CUDA_ATTENTION_KERNELS, BackendUnavailableError
from .pipelines import shape_command, texture_command
from .quant import QUANT_MODES
from .runtime import CAPTURE_MODES, CaptureUnavailableError
from .serve import commands as serve_commands
from .serve import onnx_source
from .train import commands as train_commands

logger = logging.getLogger(__name__)

PROG = "embodied-accel"
SAMPLE_OBSERVATION = Path(__file__).resolve().parent / "data" / "sample_observation.npz"
SAMPLE_SOURCE = "the bundled sample"
POLICY_SAMPLE_SOURCE = "the policy's synthetic sample"
DEFAULT_MODEL = "pi0-tiny"
DTYPE_CHOICES = ("float32", "bfloat16")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_LOG_LEVEL = "WARNING"
#: What ``torch.Generator.manual_seed`` accepts without wrapping: an unsigned 64-bit integer.
SEED_RANGE = (0, 2**64 - 1)
OUTPUT_SUFFIXES = (".npy", ".json")

# The instruction is given once, as text or as token ids (see models/pi0/processor.py).
TEXT_KEYS = ("task", "prompt")
TOKENS_KEY = "observation.language.tokens"
TOKEN_MASK_KEY = "observation.language.attention_mask"
IMAGE_KEY_PREFIX = "observation.images."


EXAMPLES = """examples:
  embodied-accel run                       # pi0-tiny, seeded random weights, the bundled sample observation
  embodied-accel run --checkpoint DIR --observation obs.npz --output actions.npy
  embodied-accel info --model pi05
  embodied-accel bench --runs 100 --batch 1 --views 2
  embodied-accel profile --model groot-tiny   # where the call's time goes: op types, top kernels, verdict
  embodied-accel serve --model pi0-tiny --port 8000   # openpi-compatible websocket policy server
  embodied-accel loadtest --clients 16 --requests 200  # against an in-process server, or --url ws://host:port
  embodied-accel train                     # a few steps on the built-in sample dataset; then run --checkpoint
  embodied-accel train --dataset DIR --checkpoint BASE --out DIR    # fine-tune on a LeRobot dataset
  embodied-accel eval libero --checkpoint DIR --suite libero_spatial   # closed-loop LIBERO success rates
  embodied-accel reconstruct IMAGES_DIR -o scene.ply   # VGGT: cameras, depth, point cloud
  embodied-accel shape IMAGE -o mesh.glb   # Hunyuan3D-2: image -> mesh
"""


class CLIError(ValueError):
    """A user error the command reports in one line (exit code 2)."""


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


class CommandParser(argparse.ArgumentParser):
    """The parser of a subcommand, and of a subcommand's own subcommands (``eval libero``): each takes the options
    of :func:`_common_options` after its name, whichever module registers it."""

    def __init__(self, *args: Any, parents: list[argparse.ArgumentParser] | tuple = (), **kwargs: Any):
        parents = list(parents)
        if not any(_takes_log_level(parent) for parent in parents):
            parents.insert(0, _common_options())
        super().__init__(*args, parents=parents, **kwargs)


def _policy_options() -> argparse.ArgumentParser:
    """Options shared by every subcommand that builds a policy."""
    from .policies import preset_names

    presets = preset_names()
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("policy")
    source = group.add_mutually_exclusive_group()
    source.add_argument(
        "--model",
        choices=presets,
        metavar="PRESET",
        help=f"a preset with seeded random weights, one of {', '.join(presets)} (default: {DEFAULT_MODEL})",
    )
    source.add_argument(
        "--checkpoint", type=Path, metavar="DIR", help="a LeRobot pi0 / pi0.5 or a GR00T N1.6 checkpoint directory"
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
    group.add_argument("--dtype", choices=DTYPE_CHOICES, default="float32", help="compute dtype (default: float32)")
    group.add_argument("--quant", choices=QUANT_MODES, default="none",
                       help="w8a8: int8 weights and activations for the family's planned linear layers; fp8: float8 E4M3 "
                       "(FP8 tensor cores: NVIDIA compute capability 8.9+) (default: none)")  # fmt: skip
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
    parser = argparse.ArgumentParser(
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

    def add_command(name: str, parents: list[argparse.ArgumentParser], **kwargs) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=parents, **kwargs)

    run = add_command("run", [policy], help="run a policy once and summarize its action chunk")
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

    info = add_command("info", [policy], help="describe a policy: size, backend, IO spec")
    info.add_argument("--views", type=positive_int, metavar="N", help="number of camera slots")
    info.set_defaults(handler=cmd_info)

    bench = add_command("bench", [policy], help="time the model call and write a JSON result")
    _call_shape_options(bench)
    bench.add_argument("--warmup", type=non_negative_int, default=3, help="untimed calls first (default: 3)")
    bench.add_argument("--runs", type=positive_int, default=100, help="timed calls (default: 100)")
    bench.add_argument("--no-stages", action="store_true", help="skip the per-stage (vision/prefix/denoise) split")
    bench.add_argument("--out-dir", type=Path, default=Path("bench/results"), help="default: bench/results")
    bench.add_argument("--note", help="free text stored in the result file")

    prof = add_command(
        "profile", [policy], help="profile the model call: device busy/idle, op types, top kernels, verdict"
    )
    _call_shape_options(prof)
    prof.add_argument("--warmup", type=non_negative_int, default=2, help="unprofiled calls first (default: 2)")
    prof.add_argument("--calls", type=positive_int, default=3, help="profiled calls (default: 3)")
    prof.add_argument("--out-dir", type=Path, default=Path("bench/profiles"), help="default: bench/profiles")
    prof.set_defaults(handler=cmd_profile)
    bench.set_defaults(handler=cmd_bench)

    serve = add_command("serve", [policy], help="serve the policy over websockets (openpi protocol)")
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
# Files
# ---------------------------------------------------------------------------------------------------------------


def load_observation(path: Path) -> dict[str, Any]:
    """An observation dict from a ``.npz`` or ``.json`` file (see ``--observation``)."""
    if not path.is_file():
        raise CLIError(f"--observation {path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {key: data[key] for key in data.files}
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise CLIError(f"--observation {path}: not a readable .npz file ({exc})") from None
        # Strings (the task) are stored as 0-d unicode arrays.
        return {key: str(v) if v.ndim == 0 and v.dtype.kind in "US" else v for key, v in arrays.items()}
    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CLIError(f"--observation {path}: not a readable JSON file ({exc})") from None
        if not isinstance(data, dict):
            raise CLIError(f"--observation {path}: expected a JSON object of observation keys")
        return {key: _json_value(path, key, value) for key, value in data.items()}
    raise CLIError(f"--observation {path}: expected a .npz or .json file")


def _json_value(path: Path, key: str, value: Any) -> Any:
    if isinstance(value, str):
        return value
    try:
        arr = np.asarray(value)
    except ValueError as exc:  # ragged lists
        raise CLIError(f"--observation {path}: {key!r} is not a rectangular array ({exc})") from None
    if arr.dtype.kind not in "biuf":
        raise CLIError(f"--observation {path}: {key!r} must be a string or a numeric array")
    if arr.dtype.kind == "f":
        return arr.astype(np.float32)
    if key.startswith(IMAGE_KEY_PREFIX) and arr.dtype.kind in "iu":  # JSON has no uint8: 0..255 images
        if arr.size and (arr.min() < 0 or arr.max() > 255):
            raise CLIError(f"--observation {path}: {key!r} integer pixels must be in 0..255")
        return arr.astype(np.uint8)
    return arr


def load_noise(path: Path) -> np.ndarray:
    if path.suffix.lower() != ".npy":
        raise CLIError(f"--noise {path}: expected a .npy file")
    if not path.is_file():
        raise CLIError(f"--noise {path}: no such file")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise CLIError(f"--noise {path}: not a readable .npy file ({exc})") from None


def save_actions(path: Path, actions: np.ndarray, meta: dict[str, Any]) -> None:
    try:
        if path.suffix.lower() == ".npy":
            np.save(path, actions)
        else:
            path.write_text(json.dumps({**meta, "shape": list(actions.shape), "actions": actions.tolist()}) + "\n")
    except OSError as exc:
        raise CLIError(f"--output {path}: cannot write ({exc})") from None


# ---------------------------------------------------------------------------------------------------------------
# Policy
# ---------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _without_random_weights_warning() -> Iterator[None]:
    """For a command that prints :func:`_random_weights_notice` itself: the notice once, not also the library's
    warning of the same fact (logged on its own logger, :data:`~embodied_accel.policies.RANDOM_WEIGHTS_LOGGER`)."""
    from .policies import RANDOM_WEIGHTS_LOGGER

    notice_logger = logging.getLogger(RANDOM_WEIGHTS_LOGGER)
    level = notice_logger.level
    notice_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        notice_logger.setLevel(level)


def rtc_option(args: argparse.Namespace) -> dict[str, Any]:
    """``{"rtc": RtcSettings}`` when an --rtc-* flag is given (the policy's defaults otherwise)."""
    given = {
        name: value
        for name, value in (
            ("schedule", getattr(args, "rtc_schedule", None)),
            ("max_guidance_weight", getattr(args, "rtc_max_guidance", None)),
            ("execution_horizon", getattr(args, "rtc_execution_horizon", None)),
        )
        if value is not None
    }
    if not given:
        return {}
    from .nn.rtc import RtcSettings

    return {"rtc": RtcSettings(**given)}


def _load_policy(args: argparse.Namespace, num_views: int | None = None):
    """The policy the arguments name and its load time."""
    from . import load_policy

    source = str(args.checkpoint) if args.checkpoint is not None else (args.model or DEFAULT_MODEL)
    if args.preset is not None and args.checkpoint is None:
        raise CLIError(
            f"--preset names the architecture of a --checkpoint; to run the preset itself: --model {args.preset}"
        )
    extra = {}
    if args.embodiment is not None:
        from .policies import family_of

        if family_of(source).name != "groot":
            raise CLIError(f"--embodiment applies to GR00T policies; {source} is not one")
        extra["embodiment"] = args.embodiment
    if args.backbone_config is not None:
        from .policies import family_of

        if args.checkpoint is None or family_of(source).name != "groot":
            raise CLIError("--backbone-config applies to a GR00T --checkpoint")
        extra["backbone_config"] = args.backbone_config
    start = time.perf_counter()
    policy = load_policy(
        source,
        backend=args.backend,
        dtype=args.dtype,
        preset=args.preset,
        tokenizer=str(args.tokenizer) if args.tokenizer is not None else None,
        num_views=num_views,
        capture=args.capture,
        progress=_progress(args),
        cuda_attention=args.cuda_attention,
        quant=args.quant,
        **extra,
        **rtc_option(args),
    )
    logger.info("loaded %s in %.2f s", source, time.perf_counter() - start)
    return policy, time.perf_counter() - start


def _progress(args: argparse.Namespace) -> bool:
    """Progress bars only on an interactive terminal, unless --no-progress."""
    return not args.no_progress and sys.stderr.isatty()


def select_instruction(
    policy, observation: Mapping[str, Any], source: str = "the observation"
) -> tuple[dict[str, Any], str]:
    """Keep one form of the instruction when an observation carries both the text and token ids.

    The policy takes the instruction once: the text when it has a tokenizer, else the token ids. When both are
    given, a warning says which one is used and which is ignored (for the bundled sample, which carries both so
    that every preset can run it, an INFO line). Text with no token ids and no tokenizer is an error that names the
    places searched for one. Returns the observation to pass and a line saying which form is used.
    """
    obs = dict(observation)
    text_keys = [key for key in TEXT_KEYS if key in obs]
    tokenizer = policy.processor.tokenizer
    if text_keys and TOKENS_KEY in obs:
        text = f"text {obs[text_keys[0]]!r} ({text_keys[0]!r})"
        ids = f"token ids ({TOKENS_KEY!r})"
        if tokenizer is not None:
            obs.pop(TOKENS_KEY)
            obs.pop(TOKEN_MASK_KEY, None)
            used, ignored, why = text, ids, f"tokenized by {tokenizer.source}"
        else:
            for key in text_keys:
                obs.pop(key)
            used, ignored, why = ids, text, "the policy has no tokenizer"
        level = logging.INFO if source == SAMPLE_SOURCE else logging.WARNING
        logger.log(
            level, "%s gives the instruction twice: using the %s (%s), ignoring the %s", source, used, why, ignored
        )
    if TOKENS_KEY in obs:
        unused = f"; text {observation[text_keys[0]]!r} unused (no tokenizer)" if text_keys else ""  # dropped above
        return obs, f"{len(np.asarray(obs[TOKENS_KEY]))} token ids from {TOKENS_KEY!r}{unused}"
    if text_keys:
        if tokenizer is None:
            raise CLIError(
                f"{source}: the instruction is text ({text_keys[0]!r}) but {policy.config.name} has no tokenizer; "
                f"searched: {_tokenizer_search_places(policy)}. Pass --tokenizer FILE (PaliGemma's tokenizer.model) "
                f"or give token ids in {TOKENS_KEY!r}"
            )
        unused = "; its token ids unused" if TOKENS_KEY in observation else ""
        return obs, f"text {obs[text_keys[0]]!r}{unused}"
    return obs, "none given"


def _tokenizer_search_places(policy) -> str:
    """Where a tokenizer was looked for (the search is repeated: it only reads directories)."""
    if hasattr(policy, "tokenizer_search_places"):  # a family with its own tokenizer lookup (GR00T)
        return policy.tokenizer_search_places()
    from .models.pi0.tokenizer import search_tokenizer

    checkpoint_dir = None if policy.random_weights else policy.source
    return search_tokenizer(policy.config, checkpoint_dir=checkpoint_dir).describe_searched() or "nowhere"


def _backend_label(policy) -> str:
    """``cuda (attention triton)``: the backend and the options it was built with."""
    settings = policy.ops.settings
    if "cuda_attention" in settings:
        return f"{policy.backend} (attention {settings['cuda_attention']})"
    return policy.backend


def _dtype_name(policy) -> str:
    return str(policy.dtype).removeprefix("torch.")


def _human_count(n: int) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


#: What the first call of a captured mode does before it runs (it is silent otherwise, for up to a minute).
FIRST_CALL_WORK = {
    "compile": "compiling the call for this shape with torch.compile (first call only; this can take a minute)",
    "cudagraph": "capturing the call for this shape as a CUDA graph (first call only)",
    "compile+cudagraph": "compiling the call for this shape and capturing it as a CUDA graph (first call only; this "
    "can take a minute)",
    "torchair": "compiling the call for this shape with torchair (first call only; this can take minutes)",
}


def _say(args: argparse.Namespace, message: str) -> None:
    """A progress line of the command on stderr (stdout keeps the results)."""
    print(f"{PROG} {args.command}: {message}", file=sys.stderr, flush=True)


def _announce_first_call(args: argparse.Namespace, policy) -> None:
    work = FIRST_CALL_WORK.get(policy.capture)
    if work is not None:
        _say(args, work + " ...")


def _random_weights_notice(policy) -> str:
    return (
        f"NOTE: RANDOM WEIGHTS. {policy.config.name} was built with seeded random weights; "
        "its actions come from an untrained network, not a trained policy."
    )


def _source_line(policy) -> str:
    kind = "preset" if policy.random_weights else "checkpoint"
    return f"{policy.config.name} (family {policy.config.family}), {kind} {policy.source}"


# ---------------------------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------------------------


def _observation_source(args: argparse.Namespace, policy=None) -> str:
    if args.observation is not None:
        return str(args.observation)
    return POLICY_SAMPLE_SOURCE if hasattr(policy, "sample_observation") else SAMPLE_SOURCE


def default_observation(policy) -> dict[str, Any]:
    """The observation used without ``--observation``: the policy's own synthetic one if it has one (GR00T: its
    embodiment's cameras and state keys), else the bundled sample."""
    if hasattr(policy, "sample_observation"):
        return policy.sample_observation()
    return load_observation(SAMPLE_OBSERVATION)


def cmd_run(args: argparse.Namespace) -> int:
    observation = load_observation(args.observation) if args.observation is not None else None
    noise = load_noise(args.noise) if args.noise is not None else None
    if args.output is not None and args.output.suffix.lower() not in OUTPUT_SUFFIXES:
        raise CLIError(f"--output {args.output}: expected a .npy or .json file name")
    with _without_random_weights_warning():  # this command prints its own notice
        policy, _ = _load_policy(args)
    if observation is None:
        observation = default_observation(policy)
    observation, instruction = select_instruction(policy, observation, _observation_source(args, policy))
    seed = None if noise is not None else args.seed
    _announce_first_call(args, policy)
    result = policy.infer(observation, noise=noise, seed=seed, num_steps=args.num_steps)
    actions = np.asarray(result["actions"])
    steps = args.num_steps or policy.config.num_steps
    # the first call pays one-time work (allocations, lazy initialization, a compile or capture); the second is warm
    warm_ms = None if args.no_warm_call else policy.infer(observation, noise=noise, seed=seed, num_steps=steps)["infer_ms"]

    if policy.random_weights:
        print(_random_weights_notice(policy))
    print(f"policy:      {_source_line(policy)}")
    print(f"runtime:     backend {_backend_label(policy)}, capture {policy.capture}, dtype {_dtype_name(policy)}, "
          f"device {policy.device}")  # fmt: skip
    print(f"observation: {_observation_source(args, policy).removeprefix('the ')} (instruction: {instruction})")
    print(f"noise:       {f'file {args.noise}' if noise is not None else f'seed {seed}'}, {steps} denoising steps")
    print(f"actions:     shape {tuple(actions.shape)} {actions.dtype}")
    print(_action_summary(actions))
    print(_latency_line(result["infer_ms"], warm_ms))
    if args.output is not None:
        meta = {
            "source": policy.source,
            "model": policy.config.name,
            "random_weights": policy.random_weights,
            "seed": seed,
            "num_steps": steps,
            "infer_ms": result["infer_ms"],
            "warm_infer_ms": warm_ms,
        }
        save_actions(args.output, actions, meta)
        print(f"wrote:       {args.output}")
    return 0


def _latency_line(first_ms: float, warm_ms: float | None) -> str:
    """Both latencies of ``run`` (each incl. pre- and post-processing): the cold first call and the warm second."""
    first = f"first call {first_ms:.1f} ms (cold: one-time allocations and initialization)"
    if warm_ms is None:
        return f"latency:     {first}; no warm call (--no-warm-call)"
    return f"latency:     warm {warm_ms:.1f} ms (second call, incl. pre/post-processing); {first}"


def _action_summary(actions: np.ndarray) -> str:
    """Overall and per-dimension statistics of a ``[horizon, action_dim]`` chunk, and its first row."""
    flat = actions.reshape(-1, actions.shape[-1])  # [rows, action_dim]
    lines = [
        f"  overall  min {flat.min():+.4f}  max {flat.max():+.4f}  mean {flat.mean():+.4f}  std {flat.std():.4f}",
        "  dim        min        max       mean       std",
    ]
    for d in range(flat.shape[1]):
        col = flat[:, d]
        lines.append(f"  {d:>3} {col.min():+10.4f} {col.max():+10.4f} {col.mean():+10.4f} {col.std():9.4f}")
    lines.append("  first action: [" + ", ".join(f"{v:+.4f}" for v in flat[0]) + "]")
    return "\n".join(lines)


def cmd_info(args: argparse.Namespace) -> int:
    with _without_random_weights_warning():  # this command prints its own notice
        policy, load_s = _load_policy(args, num_views=args.views)
    cfg, io, ops = policy.config, policy.io, policy.ops
    n = policy.num_parameters()
    if policy.random_weights:
        print(_random_weights_notice(policy))
    print(f"model:       {_source_line(policy)}")
    print(f"weights:     {'RANDOM (seeded), not trained' if policy.random_weights else 'loaded from the checkpoint'}")
    print(f"parameters:  {_human_count(n)} ({n:,})")
    print(f"runtime:     backend {_backend_label(policy)}, capture {policy.capture}, dtype {_dtype_name(policy)}, "
          f"device {policy.device}")  # fmt: skip
    if ops.fused or ops.fallback:
        print(f"fused ops:   {', '.join(ops.fused) or 'none'}")
        print(f"fallback:    {', '.join(ops.fallback) or 'none'} (pure-PyTorch reference)")
        for op, note in ops.notes.items():
            print(f"  {op + ':':<24}{note}")
    else:
        print("fused ops:   none (every op is the pure-PyTorch reference)")
    print(f"cameras:     {len(io.image_keys)}: {', '.join(io.image_keys)}")
    print(f"state:       {io.state_dim} dims ({io.state_key}, normalization {io.state_norm})")
    horizon = getattr(io, "action_horizon", cfg.action_horizon)  # GR00T: the embodiment's steps of the chunk
    print(f"actions:     {io.action_dim} dims x horizon {horizon} (normalization {io.action_norm})")
    if getattr(policy, "embodiment", None) is not None:
        print(f"embodiment:  {policy.embodiment}")
    print(f"sampler:     {cfg.num_steps} denoising steps, up to {cfg.max_token_len} language tokens")
    tokenizer = policy.processor.tokenizer
    if tokenizer is not None:
        print(f"tokenizer:   {tokenizer.source} ({tokenizer.vocab_size} pieces)")
    else:
        print(f"tokenizer:   none, pass token ids or --tokenizer (searched: {_tokenizer_search_places(policy)})")
    print(f"load time:   {load_s:.2f} s")
    return 0


def fill_camera_slots(policy, observation: Mapping[str, Any]) -> dict[str, Any]:
    """Give every camera slot of the policy an image (reusing the observation's own), so that a
    benchmark at ``--views N`` really processes N views (a missing camera would be skipped)."""
    present = [key for key in policy.io.image_keys if key in observation]
    if not present:
        raise CLIError(f"observation: none of the policy's cameras ({', '.join(policy.io.image_keys)}) is present")
    filled = dict(observation)
    for i, key in enumerate(policy.io.image_keys):
        filled.setdefault(key, observation[present[i % len(present)]])
    return filled


def _measured_call_inputs(args: argparse.Namespace):
    """The policy, its load time, and the observations (every camera slot filled, ``--batch`` of them)."""
    observation = load_observation(args.observation) if args.observation is not None else None
    policy, load_s = _load_policy(args, num_views=args.views)
    if observation is None:
        observation = default_observation(policy)
    source = _observation_source(args, policy)
    observation = fill_camera_slots(policy, select_instruction(policy, observation, source)[0])
    return policy, load_s, [observation] * args.batch


def aten_op_counts(policy, call) -> tuple[int, str, int]:
    """The aten ops of one call of ``call`` as ``bench`` records them and ``profile`` reports them: ``(count, method,
    profiler's top-level count)``. An eager call counts every op it dispatches (a dispatch mode); a captured one, what
    the profiler sees (a dispatch mode makes torch.compile skip its frames)."""
    from .bench import harness

    profiled = harness.count_profiled_aten_ops(call)
    if policy.capture == "eager":
        return harness.count_aten_ops(call)[1], "dispatch_mode", profiled
    return profiled, "profiler_top_level", profiled


def cmd_profile(args: argparse.Namespace) -> int:
    from .bench import profiler

    no_chart = profiler.chart_support()
    if no_chart is not None:  # said before the work, and again with the files
        _say(args, f"no chart: {no_chart}; the summary and the trace are written")
    policy, _, observations = _measured_call_inputs(args)
    call, views = policy.measured_call(observations, args.num_steps)
    backend = policy.backend + ("-triton-attention" if policy.ops.settings.get("cuda_attention") == "triton" else "")
    name = f"{policy.config.name}_{backend}_{policy.capture}_{_dtype_name(policy)}_b{args.batch}_v{views}"
    out_dir = args.out_dir / name
    _announce_first_call(args, policy)
    _say(args, f"{args.warmup} unprofiled call(s), then {args.calls} under the profiler ...")
    summary = profiler.profile_calls(
        call,
        calls=args.calls,
        warmup=args.warmup,
        trace_path=out_dir / "trace.json",
    )
    _say(args, "counting the aten ops of one call (as bench does) ...")
    summary.aten_ops_per_call, summary.aten_ops_method, _ = aten_op_counts(policy, call)
    print(summary.format())
    (out_dir / "summary.json").write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
    chart = profiler.plot_summary(summary, out_dir / "breakdown.png", name) if no_chart is None else None
    print(
        f"wrote {out_dir / 'trace.json'} (chrome://tracing), {out_dir / 'summary.json'}"
        + (f", {chart}" if chart else f"; no chart: {no_chart}")
    )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from . import platform as platform_mod
    from .bench import harness

    policy, load_s, observations = _measured_call_inputs(args)
    plat = platform_mod.detect()
    steps = args.num_steps or policy.config.num_steps
    progress = _progress(args)
    call, views = policy.measured_call(observations, args.num_steps)

    plat.reset_peak_memory()
    first_call_ms = None
    _announce_first_call(args, policy)  # with --warmup 0 the first timed run compiles
    if args.warmup:  # the first call apart: compile / capture / allocator warm-up show here, not in the mean
        _say(args, "first call (warm-up, timed apart) ...")
        first_call = harness.time_calls(call, warmup=0, runs=1, synchronize=plat.synchronize, progress=False)
        first_call_ms = first_call[0] * 1e3
    warmup_left = max(args.warmup - 1, 0)
    _say(args, f"{warmup_left} more warm-up call(s), then {args.runs} timed runs ...")
    times = harness.time_calls(
        call, warmup=warmup_left, runs=args.runs, synchronize=plat.synchronize, progress=progress
    )
    peak_mem_mb = plat.peak_memory_mb()
    _say(args, "counting the aten ops of one call ...")
    aten_ops, aten_ops_method, profiled_aten_ops = aten_op_counts(policy, call)
    if plat.device_type == "cuda":  # kernel launches and busy time exist only on the GPU
        _say(args, "device activity of one call (profiler) ...")
    kernel_launches, busy = harness.device_activity(call, plat)
    end_to_end_runs = max(args.runs // 4, 1)
    _say(args, f"end to end: {end_to_end_runs} run(s) from observation dicts (+ host validation, tokenization) ...")
    end_to_end = harness.time_calls(  # + validation, tokenization and packing on the host
        lambda: policy.infer_batch(observations, num_steps=args.num_steps),
        warmup=1, runs=end_to_end_runs, synchronize=plat.synchronize, progress=False,
    )  # fmt: skip

    stages: dict[str, Any] = {}
    if policy.capture != "eager" and not args.no_stages:
        logger.warning("bench: the per-stage split runs eager stages; skipped for capture %s", policy.capture)
    elif not args.no_stages:
        _say(args, f"per-stage split (vision, prefix, denoise), {args.runs} timed runs each ...")
        stages = stage_split(policy, observations, args.num_steps, args.warmup, args.runs, plat, progress)

    record = harness.result_record(
        model=policy.config.family,
        preset=policy.config.name,
        backend=policy.backend,
        capture=policy.capture,
        dtype=_dtype_name(policy),
        batch=args.batch,
        views=views,
        steps=steps,
        times=times,
        aten_ops_per_call=aten_ops,
        peak_mem_mb=peak_mem_mb,
        peak_mem_kind=plat.peak_memory_kind,
        kernel_launches_per_call=kernel_launches,
        device_busy_fraction=busy,
        plat=plat,
        source=policy.source,
        random_weights=policy.random_weights,
        num_parameters=policy.num_parameters(),
        warmup=args.warmup,
        first_call_ms=first_call_ms,
        capture_s=policy.capture_seconds,
        end_to_end_p50_ms=harness.summarize(end_to_end)["p50_ms"],
        measured_call="observation bytes uploaded -> device pre-processing + model + un-normalization -> actions on host",
        aten_ops_method=aten_ops_method,
        profiled_aten_ops_per_call=profiled_aten_ops,
        load_s=load_s,
        note=args.note,
        fused_ops=list(policy.ops.fused),
        fallback_ops=list(policy.ops.fallback),
        cuda_attention=policy.ops.settings.get("cuda_attention"),
        **stages,
    )
    path = harness.write_result(record, args.out_dir)
    print(_bench_line(record))
    if first_call_ms is not None:
        capture = f", incl. {record['capture_s']:.1f} s of graph capture" if record.get("capture_s") else ""
        print(f"first call: {first_call_ms:.1f} ms (warm-up{capture}; not in the mean)")
    print(
        f"end to end: p50 {record['end_to_end_p50_ms']:.2f} ms over {end_to_end_runs} runs (observation dicts in: "
        "+ host validation, tokenization and packing)"
    )
    if policy.ops.fused:
        print(f"ops: fused {', '.join(policy.ops.fused)}; reference {', '.join(policy.ops.fallback) or 'none'}")
    if stages:
        print("stages: " + ", ".join(f"{k[6:-3]} {v:.2f} ms" for k, v in stages.items() if k.endswith("_ms")))
    print(f"wrote {path}")
    return 0


def stage_split(policy, observations, num_steps, warmup: int, runs: int, plat, progress: bool) -> dict[str, Any]:
    """Mean time and aten ops of each stage (vision, prefix, denoising loop), run eagerly apart."""
    from .bench import harness

    stages: dict[str, Any] = {}
    for name, fn in policy.stage_fns(policy.prepare(observations), num_steps=num_steps).items():
        stage_times = harness.time_calls(
            fn, warmup=warmup, runs=runs, synchronize=plat.synchronize, progress=progress, desc=name
        )
        stages[f"stage_{name}_ms"] = harness.summarize(stage_times)["mean_ms"]
        stages[f"stage_{name}_aten_ops"] = harness.count_aten_ops(fn)[1]
    return stages


def _bench_line(r: dict[str, Any]) -> str:
    line = (
        f"{r['model']}/{r['preset']} {r['backend']}{_attention_suffix(r)} {r['capture']} {r['dtype']} b{r['batch']} "
        f"v{r['views']} "
        f"{r['steps']} steps on {r['device']}: mean {r['mean_ms']:.2f} ms, p50 {r['p50_ms']:.2f}, "
        f"p90 {r['p90_ms']:.2f} over {r['runs']} runs; {r['aten_ops_per_call']} aten ops/call"
    )
    if r["kernel_launches_per_call"] is not None:
        line += f", {r['kernel_launches_per_call']} kernels/call, device busy {r['device_busy_fraction']:.0%}"
    return line + f"; peak {r['peak_mem_mb']:.0f} MB"


def _attention_suffix(record: dict[str, Any]) -> str:
    attention = record.get("cuda_attention")
    return f" (attention {attention})" if attention else ""


def cmd_serve(args: argparse.Namespace) -> int:
    serve_commands.require_serve_extra("serve")
    # the port is bound before the model loads: "address in use" comes at once, not after a full load
    return serve_commands.run_serve(
        lambda: onnx_source.onnx_policy(args) or _load_policy(args, num_views=args.views)[0],
        args,
        announce=lambda line: print(line, flush=True),
    )


def cmd_loadtest(args: argparse.Namespace) -> int:
    """Exit code 0 when every request succeeded, 1 otherwise."""
    serve_commands.require_serve_extra("loadtest")
    observation = load_observation(args.observation) if args.observation is not None else None
    stats, record = serve_commands.run_loadtest_command(
        args, lambda: _load_policy(args, num_views=args.views)[0], observation
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


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")  # no-op if already configured
    logging.getLogger("embodied_accel").setLevel(level)


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit code (0 ok, 2 bad arguments, files or observations)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage error (or --help)
        return exc.code if isinstance(exc.code, int) else 0
    _configure_logging(args.log_level)
    try:
        return args.handler(args)
    except (ValueError, BackendUnavailableError, CaptureUnavailableError, ImportError) as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
