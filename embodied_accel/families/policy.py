"""The policy families (pi0 / pi0.5, GR00T N1.6) as the commands see them: observation and noise files, the
instruction in one form, the policy loaded from the command's options, and what ``run``, ``info``, ``bench`` and
``profile`` print and measure (:class:`PolicyModel`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from . import CLIError, LoadedModel, MeasuredCall, family_of, load_policy

logger = logging.getLogger(__name__)

SAMPLE_OBSERVATION = Path(__file__).resolve().parents[1] / "data" / "sample_observation.npz"
SAMPLE_SOURCE = "the bundled sample"
POLICY_SAMPLE_SOURCE = "the policy's synthetic sample"
DEFAULT_MODEL = "pi0-tiny"
OUTPUT_SUFFIXES = (".npy", ".json")

# The instruction is given once, as text or as token ids (see models/pi0/processor.py).
TEXT_KEYS = ("task", "prompt")
TOKENS_KEY = "observation.language.tokens"
TOKEN_MASK_KEY = "observation.language.attention_mask"
IMAGE_KEY_PREFIX = "observation.images."


def load_observation(path: Path) -> dict[str, Any]:
    """An observation dict from a ``.npz`` or ``.json`` file (see ``--observation``)."""
    if not path.is_file():
        raise CLIError(f"--observation {path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        if not zipfile.is_zipfile(path):  # numpy would read it as a pickle and say so
            raise CLIError(f"--observation {path}: not a .npz archive (expected arrays saved with numpy.savez; the "
                           f"file starts with {_head(path)})")  # fmt: skip
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
    if _head(path, 6, raw=True) != b"\x93NUMPY":
        raise CLIError(f"--noise {path}: not a .npy array (expected one saved with numpy.save; the file starts with "
                       f"{_head(path)})")  # fmt: skip
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise CLIError(f"--noise {path}: not a readable .npy file ({exc})") from None


def _head(path: Path, size: int = 16, raw: bool = False):
    """The first ``size`` bytes of a file (``raw``), or them as a short repr for a message."""
    try:
        with open(path, "rb") as f:
            head = f.read(size)
    except OSError:
        head = b""
    return head if raw else repr(head)


def save_actions(path: Path, actions: np.ndarray, meta: dict[str, Any]) -> None:
    try:
        if path.suffix.lower() == ".npy":
            np.save(path, actions)
        else:
            path.write_text(json.dumps({**meta, "shape": list(actions.shape), "actions": actions.tolist()}) + "\n")
    except OSError as exc:
        raise CLIError(f"--output {path}: cannot write ({exc})") from None



@contextlib.contextmanager
def _without_random_weights_warning() -> Iterator[None]:
    """For a command that prints :func:`_random_weights_notice` itself: the notice once, not also the library's
    warning of the same fact (logged on its own logger, :data:`~embodied_accel.policies.RANDOM_WEIGHTS_LOGGER`)."""
    from ..policies import RANDOM_WEIGHTS_LOGGER

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
    from ..nn.rtc import RtcSettings

    return {"rtc": RtcSettings(**given)}


def load_policy_from_args(args: argparse.Namespace, num_views: int | None = None):
    """The policy the arguments name and its load time."""
    source = str(args.checkpoint) if args.checkpoint is not None else (args.model or DEFAULT_MODEL)
    if args.preset is not None and args.checkpoint is None:
        raise CLIError(
            f"--preset names the architecture of a --checkpoint; to run the preset itself: --model {args.preset}"
        )
    extra = {}
    if args.embodiment is not None:
        if family_of(source).name != "groot":
            raise CLIError(f"--embodiment applies to GR00T policies; {source} is not one")
        extra["embodiment"] = args.embodiment
    if args.backbone_config is not None:
        if args.checkpoint is None or family_of(source).name != "groot":
            raise CLIError("--backbone-config applies to a GR00T --checkpoint")
        extra["backbone_config"] = args.backbone_config
    if getattr(args, "vl_padding", None) is not None:
        if family_of(source).name != "groot":
            raise CLIError(f"--vl-padding applies to GR00T N1.7 policies; {source} is not one")
        extra["vl_padding"] = args.vl_padding
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
    seconds = time.perf_counter() - start
    logger.info("loaded %s in %.2f s", source, seconds)
    from ..runtime.threads import choose_cpu_threads

    threads = choose_cpu_threads(policy.device, policy.num_parameters(), getattr(args, "threads", None))
    if threads is not None:
        logger.info("%s", " ".join(threads.split()))
    return policy, seconds



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
    from ..models.pi0.tokenizer import search_tokenizer

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


class PolicyModel(LoadedModel):
    """A loaded policy (pi0 / pi0.5, GR00T N1.6) for ``run``, ``info``, ``bench`` and ``profile``."""

    def __init__(self, policy, load_seconds: float, observation: dict[str, Any] | None,
                 noise: np.ndarray | None, quant: str = "none"):  # fmt: skip
        self.policy = self.runtime = policy
        self.family, self.preset = policy.config.family, policy.config.name
        self.source, self.random_weights = policy.source, policy.random_weights
        self.load_seconds = load_seconds
        self.observation, self.noise = observation, noise
        self.quant = None if quant == "none" else quant

    ops = property(lambda self: self.policy.ops)
    dtype_name: str = property(lambda self: _dtype_name(self.policy))  # type: ignore[assignment]
    backend_label: str = property(  # type: ignore[assignment]
        lambda self: _backend_label(self.policy) + (f" ({self.quant})" if self.quant else "")
    )
    capture_seconds = property(lambda self: self.policy.capture_seconds)

    def num_parameters(self) -> int:
        return self.policy.num_parameters()

    def random_weights_notice(self) -> str:
        return (f"NOTE: RANDOM WEIGHTS. {self.preset} was built with seeded random weights; its actions come from an "
                "untrained network, not a trained policy.")  # fmt: skip

    def info_lines(self) -> list[str]:
        policy = self.policy
        cfg, io = policy.config, policy.io
        lines = [f"cameras:     {len(io.image_keys)}: {', '.join(io.image_keys)}",
                 f"state:       {io.state_dim} dims ({io.state_key}, normalization {io.state_norm})"]  # fmt: skip
        horizon = getattr(io, "action_horizon", cfg.action_horizon)  # GR00T: the embodiment's steps of the chunk
        lines.append(f"actions:     {io.action_dim} dims x horizon {horizon} (normalization {io.action_norm})")
        if getattr(policy, "embodiment", None) is not None:
            lines.append(f"embodiment:  {policy.embodiment}")
        lines.append(f"sampler:     {cfg.num_steps} denoising steps, up to {cfg.max_token_len} language tokens")
        tokenizer = policy.processor.tokenizer
        if tokenizer is not None:
            size = getattr(tokenizer, "vocab_size", None)  # GR00T N1.7's tokenizer does not count its pieces
            lines.append(f"tokenizer:   {tokenizer.source}" + (f" ({size} pieces)" if size is not None else ""))
        else:
            lines.append(f"tokenizer:   none, pass token ids or --tokenizer (searched: "
                         f"{_tokenizer_search_places(policy)})")  # fmt: skip
        return lines

    def run(self, args: argparse.Namespace) -> list[str]:
        policy, noise = self.policy, self.noise
        observation = self.observation if self.observation is not None else default_observation(policy)
        observation, instruction = select_instruction(policy, observation, _observation_source(args, policy))
        seed = None if noise is not None else args.seed
        result = policy.infer(observation, noise=noise, seed=seed, num_steps=args.num_steps)
        actions = np.asarray(result["actions"])
        steps = args.num_steps or policy.config.num_steps
        # the first call pays one-time work (allocations, lazy initialization, a compile or capture); the second is
        # warm
        warm_ms = (None if args.no_warm_call
                   else policy.infer(observation, noise=noise, seed=seed, num_steps=steps)["infer_ms"])  # fmt: skip
        lines = [
            f"policy:      {self.source_line()}",
            f"runtime:     backend {self.backend_label}, capture {policy.capture}, dtype {self.dtype_name}, "
            f"device {policy.device}",
            f"observation: {_observation_source(args, policy).removeprefix('the ')} (instruction: {instruction})",
            f"noise:       {f'file {args.noise}' if noise is not None else f'seed {seed}'}, {steps} denoising steps",
            f"actions:     shape {tuple(actions.shape)} {actions.dtype}",
            _action_summary(actions),
            _latency_line(result["infer_ms"], warm_ms),
        ]
        if args.output is not None:
            meta = {"source": policy.source, "model": policy.config.name, "random_weights": policy.random_weights,
                    "seed": seed, "num_steps": steps, "infer_ms": result["infer_ms"], "warm_infer_ms": warm_ms}  # fmt: skip
            save_actions(args.output, actions, meta)
            lines.append(f"wrote:       {args.output}")
        return lines

    def measured_call(self, args: argparse.Namespace) -> MeasuredCall:
        policy = self.policy
        observation = self.observation if self.observation is not None else default_observation(policy)
        source = _observation_source(args, policy)
        observation = fill_camera_slots(policy, select_instruction(policy, observation, source)[0])
        observations = [observation] * args.batch
        call, views = policy.measured_call(observations, args.num_steps)
        return MeasuredCall(
            call, args.batch, views, args.num_steps or policy.config.num_steps,
            "observation bytes uploaded -> device pre-processing + model + un-normalization -> actions on host",
            end_to_end=lambda: policy.infer_batch(observations, num_steps=args.num_steps),
            stage_fns=lambda: policy.stage_fns(policy.prepare(observations), num_steps=args.num_steps),
            fields={"cuda_attention": policy.ops.settings.get("cuda_attention"), "quant": self.quant},
        )  # fmt: skip


def load(source: str, args: argparse.Namespace) -> PolicyModel:
    """The policy the arguments name (the observation and noise files read first: a bad one fails before a load)."""
    observation = load_observation(args.observation) if getattr(args, "observation", None) is not None else None
    noise = load_noise(args.noise) if getattr(args, "noise", None) is not None else None
    if getattr(args, "output", None) is not None and args.output.suffix.lower() not in OUTPUT_SUFFIXES:
        raise CLIError(f"--output {args.output}: expected a .npy or .json file name")
    with _without_random_weights_warning():  # the command prints its own notice
        policy, load_seconds = load_policy_from_args(args, num_views=getattr(args, "views", None))
    return PolicyModel(policy, load_seconds, observation, noise, getattr(args, "quant", "none"))
