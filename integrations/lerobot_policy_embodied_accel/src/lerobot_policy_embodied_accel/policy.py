"""LeRobot's policy contract (``select_action`` / ``predict_action_chunk`` / ``reset``) over embodied_accel's pi0 /
pi0.5 engine.

The batch a policy receives is the output of LeRobot's own pre-processor for the checkpoint (renaming, batching,
the tokenizer, normalization): camera images ``[B, 3, H, W]`` in [0, 1], the normalized ``observation.state`` and
the prompt's token ids and mask. What LeRobot's ``PI0Policy`` / ``PI05Policy`` then do to it before their model
(openpi's resize-with-pad to the model's image size, the map to [-1, 1], a -1 image with mask False for a camera the
batch lacks, the state padded to ``max_state_dim``) is done here too, the engine samples the chunk in normalized
action space and the policy returns its first ``action_dim`` dimensions; LeRobot's post-processor un-normalizes
them. Without ``noise`` a call draws it as LeRobot's policy does (``torch.normal`` on the engine's device, from the
global generator), so both give the same actions under the same seed.
"""

from __future__ import annotations

import builtins
import logging
from collections import deque
from pathlib import Path
from typing import Any, TypeVar

import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.pretrained import PreTrainedPolicy
from lerobot.utils.constants import ACTION, OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS, OBS_STATE

from .configuration_embodied_pi0 import EmbodiedPi0Config
from .configuration_embodied_pi05 import EmbodiedPi05Config

logger = logging.getLogger(__name__)

T = TypeVar("T", bound="EmbodiedPi0Policy")

#: Real-time chunking arguments of LeRobot's pi0 / pi0.5 ``predict_action_chunk``, which this policy does not take.
RTC_ARGUMENTS = ("inference_delay", "prev_chunk_left_over", "execution_horizon")
#: The logger of the engine's tokenizer search.
TOKENIZER_LOGGER = "embodied_accel.models.pi0.tokenizer"


def resolve_checkpoint(config: PreTrainedConfig, policy_dir: str | Path | None) -> Path:
    """The LeRobot checkpoint directory ``config.checkpoint`` names (relative to ``policy_dir`` when relative).

    Raises ``ValueError`` naming the field when it is unset or not a directory.
    """
    if not config.checkpoint:
        raise ValueError(
            f"checkpoint: {config.type} runs a LeRobot {config.type.removeprefix('embodied_')} checkpoint and builds no "
            "random weights; make a policy directory with `python -m lerobot_policy_embodied_accel SRC DST` and pass "
            "--policy.path=DST"
        )
    path = Path(config.checkpoint).expanduser()
    if not path.is_absolute() and policy_dir is not None:
        path = Path(policy_dir) / path
    if not path.is_dir():
        raise ValueError(f"checkpoint: {path} is not a directory (expected a LeRobot checkpoint directory)")
    return path


class EmbodiedPi0Policy(PreTrainedPolicy):
    """A LeRobot ``pi0`` checkpoint run by embodied_accel inside LeRobot's policy contract.

    Build it with :meth:`from_pretrained` (what ``--policy.path`` does) or ``EmbodiedPi0Policy(config)`` with
    ``config.checkpoint`` set. The engine is loaded on ``config.device`` in ``config.dtype``; the policy holds no
    ``nn.Module`` parameters of its own (``.to()`` does not move the engine). Inference only: ``forward`` (training)
    raises.
    """

    config_class = EmbodiedPi0Config
    name = "embodied_pi0"
    family = "pi0"

    def __init__(self, config: EmbodiedPi0Config, *, policy_dir: str | Path | None = None, **kwargs: Any):
        super().__init__(config)
        if not isinstance(config, self.config_class):
            raise ValueError(f"config: expected a {self.config_class.__name__}, got {type(config).__name__}")
        config.validate_features()
        from embodied_accel.policies.pi0 import load_pi0_policy

        checkpoint = resolve_checkpoint(config, policy_dir)
        # LeRobot's pre-processor tokenizes the task; the engine's own search for a tokenizer (and its warning when
        # the checkpoint has none) has nothing to do here.
        tokenizer_logger = logging.getLogger(TOKENIZER_LOGGER)
        level = tokenizer_logger.level
        tokenizer_logger.setLevel(logging.ERROR)
        try:
            engine = load_pi0_policy(
                str(checkpoint),
                backend=config.backend,
                dtype=config.dtype,
                device=config.device,
                capture=config.capture,
                progress=False,
            )
        finally:
            tokenizer_logger.setLevel(level)
        if engine.family != self.family:
            raise ValueError(
                f"checkpoint: {checkpoint} holds a {engine.family} policy; use --policy.type=embodied_{engine.family}"
            )
        # The engine is not an nn.Module (so not a submodule): LeRobot's ``policy.to(device)`` does not move its
        # weights away from the buffers and captured graphs it owns on ``config.device``.
        self.engine = engine
        self.checkpoint = checkpoint
        action_dim = config.output_features[ACTION].shape[0]
        if action_dim > engine.config.max_action_dim:
            raise ValueError(
                f"output_features: action has {action_dim} dims, more than the checkpoint's max_action_dim "
                f"{engine.config.max_action_dim}"
            )
        self.action_dim = action_dim
        self.reset()

    @classmethod
    def from_pretrained(
        cls: builtins.type[T],
        pretrained_name_or_path: str | Path,
        *,
        config: PreTrainedConfig | None = None,
        force_download: bool = False,
        resume_download: bool | None = None,
        proxies: dict | None = None,
        token: str | bool | None = None,
        cache_dir: str | Path | None = None,
        local_files_only: bool = False,
        revision: str | None = None,
        strict: bool = True,
        **kwargs: Any,
    ) -> T:
        """The policy of a policy directory (``config.json`` of this type, naming the checkpoint) or a Hugging Face
        repository holding one. ``config`` replaces the directory's (LeRobot passes the parsed CLI config)."""
        directory = Path(pretrained_name_or_path)
        if not directory.is_dir():
            from huggingface_hub import snapshot_download

            directory = Path(
                snapshot_download(
                    repo_id=str(pretrained_name_or_path),
                    revision=revision,
                    cache_dir=cache_dir,
                    force_download=force_download,
                    proxies=proxies,
                    token=token,
                    local_files_only=local_files_only,
                )
            )
        if config is None:
            config = PreTrainedConfig.from_pretrained(directory)
        if not isinstance(config, cls.config_class):
            reader = "that policy type" if config.type.startswith("embodied_") else f"LeRobot's own {config.type}"
            raise ValueError(
                f"{directory / 'config.json'}: 'type' is {config.type!r}, expected {cls.name!r} ({reader} reads "
                "this directory)"
            )
        policy = cls(config, policy_dir=directory)
        policy.eval()
        return policy

    def _save_pretrained(self, save_directory: Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Write ``config.json`` with the absolute checkpoint path: the weights stay the checkpoint's own."""
        self.config.checkpoint = str(self.checkpoint.resolve())
        self.config._save_pretrained(save_directory)

    def get_optim_params(self) -> dict:
        raise NotImplementedError(f"{self.name} is an inference policy; fine-tune with `embodied-accel train`")

    def forward(self, batch: dict[str, torch.Tensor], reduction: str = "mean") -> tuple[torch.Tensor, dict]:
        raise NotImplementedError(f"{self.name} is an inference policy; fine-tune with `embodied-accel train`")

    def reset(self) -> None:
        """Forget the queued actions (LeRobot calls it when an episode starts)."""
        self._action_queue: deque[torch.Tensor] = deque(maxlen=self.config.n_action_steps)

    @torch.no_grad()
    def select_action(self, batch: dict[str, torch.Tensor], **kwargs: Any) -> torch.Tensor:
        """One action ``[B, action_dim]``: the next of the queued chunk, a new chunk's first ``n_action_steps``
        when the queue is empty."""
        if not self._action_queue:
            actions = self.predict_action_chunk(batch, **kwargs)[:, : self.config.n_action_steps]
            self._action_queue.extend(actions.transpose(0, 1))  # [n_action_steps, B, action_dim]
        return self._action_queue.popleft()

    @torch.no_grad()
    def predict_action_chunk(
        self, batch: dict[str, torch.Tensor], noise: torch.Tensor | None = None, **kwargs: Any
    ) -> torch.Tensor:
        """An action chunk ``[B, chunk_size, action_dim]`` in normalized action space (LeRobot's post-processor
        un-normalizes it). ``noise``: the flow's sample at t = 1, ``[B, chunk_size, max_action_dim]``."""
        given = [name for name in RTC_ARGUMENTS if kwargs.get(name) is not None]
        unknown = sorted(set(kwargs) - set(RTC_ARGUMENTS))
        if given or unknown:
            raise ValueError(
                f"predict_action_chunk: {', '.join(given + unknown)} not supported by {self.name} "
                "(real-time chunking is served by `embodied-accel serve`)"
            )
        from embodied_accel.models.pi0.processor import ModelInputs, compact_inputs

        engine = self.engine
        device = engine.device
        images, image_masks = self._images(batch, device)
        tokens = self._batch_tensor(batch, OBS_LANGUAGE_TOKENS, device)
        token_masks = self._batch_tensor(batch, OBS_LANGUAGE_ATTENTION_MASK, device).bool()
        batch_size = images.shape[0]
        inputs = ModelInputs(images, image_masks, tokens.long(), token_masks, self._state(batch, batch_size, device))
        cfg = engine.config
        if noise is None:
            noise = torch.normal(
                mean=0.0, std=1.0, size=(batch_size, cfg.action_horizon, cfg.max_action_dim),
                dtype=torch.float32, device=device,
            )  # fmt: skip
        chunk = engine.sample(
            compact_inputs(inputs, engine.token_bucket), noise.to(device), self.config.num_inference_steps
        )
        return chunk[:, :, : self.action_dim]

    # ---- what LeRobot's pi0 / pi0.5 policies do to the pre-processed batch before their model

    @staticmethod
    def _batch_tensor(batch: dict[str, Any], key: str, device: torch.device) -> torch.Tensor:
        value = batch.get(key)
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"batch: {key!r} missing or not a tensor (got {type(value).__name__}); pass the observation through "
                "the checkpoint's LeRobot pre-processor first"
            )
        return value.to(device)

    def _images(self, batch: dict[str, Any], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, N, 3, S, S]`` in [-1, 1] and ``[B, N]`` masks over the engine's camera slots (the checkpoint's
        ``image_features`` in order); a camera the batch lacks is -1 with mask False."""
        from embodied_accel.models.pi0.images import resize_with_pad

        keys = self.engine.io.image_keys
        present = [key for key in keys if key in batch]
        if not present:
            raise ValueError(f"batch: no camera image; expected at least one of {', '.join(keys)}")
        size = self.engine.config.vision.image_size
        images, masks = [], []
        for key in present:
            image = self._batch_tensor(batch, key, device).to(torch.float32)
            if image.ndim != 4 or 3 not in (image.shape[1], image.shape[-1]):
                raise ValueError(f"batch: {key!r} expected [B, 3, H, W] or [B, H, W, 3], got {tuple(image.shape)}")
            if image.shape[1] != 3:
                image = image.permute(0, 3, 1, 2)
            if tuple(image.shape[2:]) != (size, size):
                image = resize_with_pad(image, size, size)
            images.append(image * 2.0 - 1.0)
        batch_size = images[0].shape[0]
        by_key = dict(zip(present, images, strict=True))
        filler = torch.full_like(images[0], -1.0)
        stacked = torch.stack([by_key.get(key, filler) for key in keys], dim=1)
        masks = torch.tensor([key in by_key for key in keys], device=device).expand(batch_size, -1)
        return stacked, masks.contiguous()

    def _state(self, batch: dict[str, Any], batch_size: int, device: torch.device) -> torch.Tensor:
        """The normalized state zero-padded to ``max_state_dim`` (pi0's state token)."""
        width = self.engine.config.max_state_dim
        state = self._batch_tensor(batch, OBS_STATE, device).to(torch.float32)
        if state.ndim != 2 or state.shape[0] != batch_size or state.shape[1] > width:
            raise ValueError(f"batch: {OBS_STATE!r} expected [{batch_size}, <= {width}], got {tuple(state.shape)}")
        return torch.nn.functional.pad(state, (0, width - state.shape[1]))


class EmbodiedPi05Policy(EmbodiedPi0Policy):
    """A LeRobot ``pi05`` checkpoint run by embodied_accel (see :class:`EmbodiedPi0Policy`). pi0.5 reads the state
    from the prompt LeRobot's pre-processor wrote; the model takes no state tensor."""

    config_class = EmbodiedPi05Config
    name = "embodied_pi05"
    family = "pi05"

    def _state(self, batch: dict[str, Any], batch_size: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(batch_size, self.engine.config.max_state_dim, device=device)
