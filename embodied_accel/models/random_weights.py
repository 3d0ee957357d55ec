"""Seeded random weights drawn where they will live: on the target device, in the target dtype.

Every family's preset (a model without a checkpoint: demos, tests, benchmarks) gets its weights from
:class:`SeededDraws`. Each tensor is allocated once on the target device in its final dtype and layout and filled
in place with zero-mean (or ``mean``-centred) **uniform** values of the requested standard deviation (the range
``mean ± sqrt(3)·std``; PyTorch's own default initialization is uniform too), seeded from ``(seed, tensor number,
chunk number)``:

* on an accelerator, ``uniform_`` with one generator of that device per tensor (Philox on CUDA): a 3 B-parameter
  model takes well under a second and nothing crosses the bus;
* on the CPU, where every ``torch`` sampler is a single-threaded Mersenne Twister (``randn`` of a full-size pi0 took
  ~9 ns per weight here), large tensors are split into chunks of :data:`CPU_CHUNK` elements, each filled from 16
  random bits per weight of its own NumPy SFC64 generator (mapped affinely onto the range in the tensor's dtype,
  ~3 ns per weight), on ``torch.get_num_threads()`` threads (the generator releases the GIL).

The values depend on the seed, the order of the draws and the device type, never on the number of threads. They are
random, NOT a trained model.
"""

from __future__ import annotations

import concurrent.futures
import math
from collections.abc import Sequence

import numpy as np
import torch

from .. import platform as platform_mod

#: Elements per generator on the CPU: large enough that seeding (a few microseconds) is negligible, small enough
#: that every thread gets work on a 2-core machine for any matrix of a full-size model.
CPU_CHUNK = 1 << 22

_MASK64 = (1 << 64) - 1


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def sub_seed(*parts: int) -> int:
    """A 63-bit seed mixed from integers (SplitMix64 over each part in turn): nearby inputs give unrelated seeds."""
    value = 0
    for part in parts:
        value = _splitmix64(value ^ (part & _MASK64))
    return value >> 1


class SeededDraws:
    """Seeded random tensors on ``device``; the ``n``-th call of :meth:`uniform` always draws the same values there."""

    def __init__(self, seed: int, device: str | torch.device | None) -> None:
        self.seed = int(seed)
        self.device = platform_mod.normalize_device(device)
        self._drawn = 0
        self._threads = max(1, torch.get_num_threads()) if self.device.type == "cpu" else 1

    def uniform(
        self,
        shape: Sequence[int],
        *,
        std: float = 1.0,
        mean: float = 0.0,
        dtype: torch.dtype = torch.float32,
        transposed: bool = False,
    ) -> torch.Tensor:
        """A new tensor of ``shape`` with mean ``mean`` and standard deviation ``std`` (uniform on
        ``mean ± sqrt(3)·std``), drawn in ``dtype`` on the device.

        ``transposed`` (2-D only): ``shape`` is ``[in, out]`` and the memory is ``[out, in]`` (the layout of a
        checkpoint's linear weight seen through ``.t()``).
        """
        shape = tuple(int(s) for s in shape)
        if transposed and len(shape) != 2:
            raise ValueError(f"transposed draws are 2-D; got shape {list(shape)}")
        stored = torch.empty(shape[::-1] if transposed else shape, dtype=dtype, device=self.device)
        half_range = math.sqrt(3.0) * float(std)
        self._fill(stored.view(-1), float(mean) - half_range, float(mean) + half_range, self._drawn)
        self._drawn += 1
        return stored.t() if transposed else stored

    def _fill(self, flat: torch.Tensor, low: float, high: float, number: int) -> None:
        if self.device.type != "cpu":
            generator = torch.Generator(device=self.device).manual_seed(sub_seed(self.seed, number))
            flat.uniform_(low, high, generator=generator)
            return
        step = (high - low) / 65536.0  # 16 random bits per value: the centres of 65536 equal bins of the range
        centre = (low + high) / 2 + step / 2
        chunks = [(start, min(start + CPU_CHUNK, flat.numel())) for start in range(0, flat.numel(), CPU_CHUNK)]

        def draw(chunk: int) -> None:
            start, end = chunks[chunk]
            words = np.random.SFC64(sub_seed(self.seed, number, chunk)).random_raw((end - start + 3) // 4)
            bits = torch.from_numpy(words.view(np.int16)[: end - start])  # uniform on [-32768, 32767]
            flat[start:end].copy_(bits).mul_(step).add_(centre)

        if len(chunks) <= 1 or self._threads == 1:
            for chunk in range(len(chunks)):
                draw(chunk)
            return
        workers = min(self._threads, len(chunks))
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(draw, range(len(chunks))))


__all__ = ["CPU_CHUNK", "SeededDraws", "sub_seed"]
