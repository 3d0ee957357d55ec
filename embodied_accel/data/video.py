"""Frames of LeRobot's mp4 videos (AV1 or h264) by timestamp, through PyAV (FFmpeg bundled in its wheel).

A :class:`VideoFrameReader` keeps the containers it opened (a few per process: a DataLoader worker has its own) and
decodes forward from the keyframe at or before the requested time, or, when the request lies just ahead of the last
frame it decoded, onward without seeking (consecutive frames of one episode cost one decode each). LeRobot encodes with
a keyframe every 2 frames by default, so a random access decodes at most a few frames.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DatasetError, require_module

logger = logging.getLogger(__name__)

#: A request more than this many frame periods ahead of the last decoded frame seeks instead of decoding onward.
_DECODE_AHEAD_FRAMES = 8


@dataclass
class _OpenVideo:
    container: object
    stream: object
    frames: object | None = None  # the decode iterator, positioned after ``last_time``
    last_time: float = -1.0
    last_frame: np.ndarray | None = None


class VideoFrameReader:
    """Decodes single frames ``[H, W, 3]`` uint8 RGB from mp4 files; at most ``max_open`` files open at a time.

    ``threads``: FFmpeg decoding threads per file (1 in DataLoader workers, where processes give the parallelism).
    """

    def __init__(self, max_open: int = 8, threads: int = 1):
        self.av = require_module("av", "decoding LeRobot videos")
        self.max_open, self.threads = max_open, threads
        self._open: OrderedDict[Path, _OpenVideo] = OrderedDict()
        self.frames_decoded = 0

    def close(self) -> None:
        for video in self._open.values():
            video.container.close()
        self._open.clear()

    def __getstate__(self):  # a reader crosses into a worker process without its open files
        return {"max_open": self.max_open, "threads": self.threads}

    def __setstate__(self, state) -> None:
        self.__init__(**state)

    def _video(self, path: Path) -> _OpenVideo:
        video = self._open.get(path)
        if video is not None:
            self._open.move_to_end(path)
            return video
        if not path.is_file():
            raise DatasetError(f"{path}: video file missing")
        try:
            container = self.av.open(str(path))
        except Exception as exc:  # PyAV raises its own error types (FFmpeg's)
            raise DatasetError(f"{path}: cannot open the video ({exc})") from None
        if not container.streams.video:
            container.close()
            raise DatasetError(f"{path}: has no video stream")
        stream = container.streams.video[0]
        stream.thread_count = self.threads
        video = _OpenVideo(container, stream)
        self._open[path] = video
        while len(self._open) > self.max_open:
            _, old = self._open.popitem(last=False)
            old.container.close()
        return video

    def frame(self, path: Path, timestamp: float, tolerance: float) -> np.ndarray:
        """The frame of ``path`` nearest to ``timestamp`` seconds; it must lie within ``tolerance`` of it."""
        video = self._video(path)
        stream = video.stream
        rate = float(stream.average_rate or stream.guessed_rate or 30)
        period = 1.0 / rate
        ahead = timestamp - video.last_time
        if video.frames is None or not (0 <= ahead <= _DECODE_AHEAD_FRAMES * period):
            if video.last_frame is not None and abs(ahead) <= tolerance:
                return video.last_frame
            # seek to the keyframe at or before the target (one frame of margin), then decode forward
            target = max(0, int((timestamp - period) / stream.time_base))
            video.container.seek(target, backward=True, any_frame=False, stream=stream)
            video.frames = video.container.decode(stream)
            video.last_time, video.last_frame = -1.0, None
        best_time, best_frame = video.last_time, video.last_frame
        try:
            for frame in video.frames:
                if frame.pts is None:
                    continue
                time = float(frame.pts * stream.time_base)
                image = frame.to_ndarray(format="rgb24")
                self.frames_decoded += 1
                video.last_time, video.last_frame = time, image
                if best_frame is None or abs(time - timestamp) < abs(best_time - timestamp):
                    best_time, best_frame = time, image
                if time >= timestamp - tolerance:  # frames come in time order: this one or an earlier is nearest
                    break
        except self.av.error.FFmpegError as exc:
            raise DatasetError(f"{path}: decoding failed near {timestamp:.4f} s ({exc})") from None
        if best_frame is None or abs(best_time - timestamp) > tolerance:
            video.frames = None
            found = "no frame" if best_frame is None else f"the nearest frame at {best_time:.4f} s"
            raise DatasetError(
                f"{path}: no frame within {tolerance * 1e3:.1f} ms of {timestamp:.4f} s ({found}); the episode's "
                "timestamps and the video disagree"
            )
        return best_frame


__all__ = ["VideoFrameReader"]
