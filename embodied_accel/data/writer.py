"""Write episodes as a LeRobot dataset (v3.0, or v2.1): what the reader reads, for tests, benchmarks and recordings.

Cameras become mp4 videos (AV1 through SVT-AV1, LeRobot's default, or h264; yuv420p, a keyframe every ``gop`` frames)
or PNG bytes inside the parquet rows (``image`` features); numeric features become parquet list columns. v3.0 puts
every episode in one data file and one video file per camera (episodes follow each other in time, located by
``videos/<key>/from_timestamp``); v2.1 writes one file of each per episode. ``meta/stats.json`` holds mean, std, min,
max and the 1/10/50/90/99 % quantiles of every numeric feature.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from .errors import DatasetError, require_module

#: PyAV encoder name and options per codec choice.
CODECS = {
    "av1": ("libsvtav1", {"crf": "30", "preset": "10"}),
    "h264": ("libx264", {"crf": "23", "preset": "ultrafast"}),
}


@dataclass
class EpisodeData:
    """One episode: its task, camera frames ``[T, H, W, 3]`` uint8 per key, numeric columns ``[T, ...]`` per key."""

    task: str
    cameras: dict[str, np.ndarray]
    columns: dict[str, np.ndarray]

    @property
    def length(self) -> int:
        lengths = {len(v) for v in (*self.cameras.values(), *self.columns.values())}
        if len(lengths) != 1:
            raise DatasetError(f"episode {self.task!r}: cameras and columns have different lengths {sorted(lengths)}")
        return lengths.pop()


def encode_video(path: Path, frames: np.ndarray, fps: int, codec: str = "av1", gop: int = 2) -> None:
    """Encode ``frames [T, H, W, 3]`` uint8 RGB as an mp4 at ``fps`` (frame ``i`` at ``i / fps`` seconds)."""
    av = require_module("av", "writing LeRobot videos")
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {', '.join(CODECS)}, got {codec!r}")
    encoder, options = CODECS[codec]
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its whole configuration to stderr by default
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(encoder, rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, fps)
        stream.options = {**options, "g": str(gop)}
        for i, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _png(image: np.ndarray) -> bytes:
    image_module = require_module("PIL.Image", "writing image features")
    buffer = io.BytesIO()
    image_module.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def _stats(values: np.ndarray) -> dict[str, list]:
    data = values.astype(np.float64).reshape(len(values), -1)
    out = {"mean": data.mean(0), "std": data.std(0), "min": data.min(0), "max": data.max(0)}
    out.update({f"q{q:02d}": np.quantile(data, q / 100, axis=0) for q in (1, 10, 50, 90, 99)})
    shape = values.shape[1:] or (1,)
    return {**{k: v.reshape(shape).tolist() for k, v in out.items()}, "count": [len(values)]}


def write_lerobot_dataset(
    root: str | Path,
    episodes: Sequence[EpisodeData],
    fps: int,
    *,
    codec: str = "av1",
    gop: int = 2,
    camera_storage: str = "video",
    version: str = "v3.0",
    robot_type: str | None = None,
) -> Path:
    """Write ``episodes`` under ``root`` (created) as a LeRobot dataset; returns ``root``.

    ``camera_storage``: ``video`` (mp4 per camera) or ``image`` (PNG bytes in the parquet rows).
    """
    pa = require_module("pyarrow", "writing LeRobot datasets")
    parquet = require_module("pyarrow.parquet", "writing LeRobot datasets")
    if version not in ("v3.0", "v2.1"):
        raise ValueError(f"version must be 'v3.0' or 'v2.1', got {version!r}")
    if camera_storage not in ("video", "image"):
        raise ValueError(f"camera_storage must be 'video' or 'image', got {camera_storage!r}")
    if not episodes:
        raise ValueError("write_lerobot_dataset: no episodes")
    root = Path(root)
    (root / "meta").mkdir(parents=True, exist_ok=True)
    first = episodes[0]
    tasks = list(dict.fromkeys(e.task for e in episodes))
    lengths = [e.length for e in episodes]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)

    features: dict[str, dict] = {}
    for key, frames in first.cameras.items():
        features[key] = {"dtype": camera_storage, "shape": list(frames.shape[1:]), "names": ["height", "width", "channel"]}
    for key, values in first.columns.items():
        features[key] = {"dtype": str(values.dtype), "shape": list(values.shape[1:] or (1,)), "names": None}
    for key, dtype in (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                       ("index", "int64"), ("task_index", "int64")):  # fmt: skip
        features[key] = {"dtype": dtype, "shape": [1], "names": None}

    def frame_table(episode_ids: list[int]) -> object:
        columns: dict[str, object] = {}
        for key in first.columns:
            stacked = np.concatenate([episodes[e].columns[key] for e in episode_ids])
            columns[key] = pa.array(list(stacked.reshape(len(stacked), -1))) if stacked.ndim > 1 else pa.array(stacked)
        if camera_storage == "image":
            for key in first.cameras:
                images = [_png(img) for e in episode_ids for img in episodes[e].cameras[key]]
                columns[key] = pa.array([{"bytes": b, "path": None} for b in images])
        columns["timestamp"] = pa.array(
            np.concatenate([np.arange(lengths[e], dtype=np.float32) / np.float32(fps) for e in episode_ids])
        )
        columns["frame_index"] = pa.array(np.concatenate([np.arange(lengths[e]) for e in episode_ids]))
        columns["episode_index"] = pa.array(np.concatenate([np.full(lengths[e], e) for e in episode_ids]))
        columns["index"] = pa.array(np.concatenate([starts[e] + np.arange(lengths[e]) for e in episode_ids]))
        columns["task_index"] = pa.array(
            np.concatenate([np.full(lengths[e], tasks.index(episodes[e].task)) for e in episode_ids])
        )
        return pa.table(columns)

    all_ids = list(range(len(episodes)))
    if version == "v3.0":
        data_path = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
        video_path = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
        (root / "data/chunk-000").mkdir(parents=True, exist_ok=True)
        parquet.write_table(frame_table(all_ids), root / "data/chunk-000/file-000.parquet")
        if camera_storage == "video":
            for key in first.cameras:
                frames = np.concatenate([e.cameras[key] for e in episodes])
                encode_video(root / video_path.format(video_key=key, chunk_index=0, file_index=0), frames, fps, codec, gop)
        rows: dict[str, list] = {
            "episode_index": all_ids, "tasks": [[e.task] for e in episodes], "length": lengths,
            "data/chunk_index": [0] * len(episodes), "data/file_index": [0] * len(episodes),
            "dataset_from_index": starts.tolist(), "dataset_to_index": (starts + np.asarray(lengths)).tolist(),
        }  # fmt: skip
        if camera_storage == "video":
            for key in first.cameras:
                rows[f"videos/{key}/chunk_index"] = [0] * len(episodes)
                rows[f"videos/{key}/file_index"] = [0] * len(episodes)
                rows[f"videos/{key}/from_timestamp"] = (starts / fps).tolist()
                rows[f"videos/{key}/to_timestamp"] = ((starts + np.asarray(lengths)) / fps).tolist()
        (root / "meta/episodes/chunk-000").mkdir(parents=True, exist_ok=True)
        parquet.write_table(pa.table(rows), root / "meta/episodes/chunk-000/file-000.parquet")
        parquet.write_table(
            pa.table({"task_index": list(range(len(tasks))), "task": tasks}), root / "meta/tasks.parquet"
        )
    else:
        data_path = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
        video_path = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
        for e in all_ids:
            path = root / data_path.format(episode_chunk=0, episode_index=e)
            path.parent.mkdir(parents=True, exist_ok=True)
            parquet.write_table(frame_table([e]), path)
            if camera_storage == "video":
                for key, frames in episodes[e].cameras.items():
                    encode_video(root / video_path.format(episode_chunk=0, video_key=key, episode_index=e), frames,
                                 fps, codec, gop)  # fmt: skip
        lines = [json.dumps({"episode_index": e, "tasks": [episodes[e].task], "length": lengths[e]}) for e in all_ids]
        (root / "meta/episodes.jsonl").write_text("\n".join(lines) + "\n")
        lines = [json.dumps({"task_index": i, "task": t}) for i, t in enumerate(tasks)]
        (root / "meta/tasks.jsonl").write_text("\n".join(lines) + "\n")

    if camera_storage == "video":
        for key in first.cameras:
            features[key]["info"] = {"video.fps": fps, "video.codec": CODECS[codec][0], "video.pix_fmt": "yuv420p"}
    info = {
        "codebase_version": version, "robot_type": robot_type, "total_episodes": len(episodes),
        "total_frames": int(sum(lengths)), "total_tasks": len(tasks), "chunks_size": 1000, "fps": fps,
        "splits": {"train": f"0:{len(episodes)}"}, "data_path": data_path,
        "video_path": video_path if camera_storage == "video" else None, "features": features,
    }  # fmt: skip
    (root / "meta/info.json").write_text(json.dumps(info, indent=2) + "\n")
    stats = {key: _stats(np.concatenate([e.columns[key] for e in episodes])) for key in first.columns}
    (root / "meta/stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return root


__all__ = ["CODECS", "EpisodeData", "encode_video", "write_lerobot_dataset"]
