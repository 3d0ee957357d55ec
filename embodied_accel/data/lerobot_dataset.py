"""LeRobot datasets read from a local directory with pyarrow and PyAV; ``lerobot`` itself is not needed.

Format v3.0 (LeRobot ≥ 0.4): ``meta/info.json`` (fps, features, path templates), ``meta/stats.json``,
``meta/tasks.parquet``, ``meta/episodes/chunk-*/file-*.parquet`` (each episode's rows and video spans),
``data/chunk-*/file-*.parquet`` (one row per frame) and ``videos/<key>/chunk-*/file-*.mp4`` (several episodes per
file). v2.1 / v2.0: ``meta/episodes.jsonl``, ``meta/tasks.jsonl``, one parquet and one mp4 per episode.

Numeric columns are read into memory once; camera frames are decoded on demand (:mod:`.video`) or read from the
parquet bytes of ``image`` features. Missing statistics are computed from the data (exact quantiles), with a log line.
A file, key or shape off the format raises :class:`~.errors.DatasetError` naming the file and the key.
"""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DatasetError, require_module
from .video import VideoFrameReader

logger = logging.getLogger(__name__)

INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_V3 = "meta/tasks.parquet"
EPISODES_V3 = "meta/episodes"
EPISODES_V2 = "meta/episodes.jsonl"
TASKS_V2 = "meta/tasks.jsonl"
#: Columns every frame row has besides the features (LeRobot's ``DEFAULT_FEATURES``).
BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")
#: Statistics computed from the data when the dataset's files lack them.
COMPUTED_STATS = ("mean", "std", "min", "max", "q01", "q10", "q50", "q90", "q99")
#: A frame's video timestamp may differ from the episode's own by this much (LeRobot's default ``tolerance_s``).
DEFAULT_TOLERANCE_S = 1e-4


@dataclass(frozen=True)
class Feature:
    """One feature of ``meta/info.json``: ``dtype`` ``video`` / ``image`` (cameras) or a numeric type."""

    key: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def is_camera(self) -> bool:
        return self.dtype in ("video", "image")


@dataclass(frozen=True)
class Episode:
    """Where one episode's frames are: global frame indices ``[start, stop)`` and, per camera, its video file and the
    time at which the episode starts in it."""

    index: int
    start: int
    stop: int
    tasks: tuple[str, ...]
    videos: dict[str, tuple[Path, float]] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return self.stop - self.start


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise DatasetError(f"{path}: missing (a LeRobot dataset has {path.parent.name}/{path.name})")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc})") from None


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise DatasetError(f"{path}: missing (a LeRobot v2 dataset has {path.parent.name}/{path.name})")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}: line {number} is not valid JSON ({exc})") from None
    return rows


class LeRobotDataset:
    """A LeRobot dataset directory (v3.0 or v2.x) with random access by global frame index.

    >>> ds = LeRobotDataset("/data/libero_spatial")
    >>> ds.num_frames, ds.fps, ds.camera_keys
    >>> ds.column("action")[i]             # [action_dim] float32
    >>> ds.camera_frame("observation.images.image", i)   # [H, W, 3] uint8
    >>> ds.task(i), ds.episode_of(i)
    """

    def __init__(self, root: str | Path, *, tolerance_s: float = DEFAULT_TOLERANCE_S, video_threads: int = 1):
        require_module("pyarrow.parquet", "reading LeRobot datasets")
        self.root = Path(root)
        if not self.root.is_dir():
            raise DatasetError(f"{self.root}: not a directory (expected a LeRobot dataset root with meta/info.json)")
        self.tolerance_s = tolerance_s
        info_path = self.root / INFO_PATH
        self.info = _read_json(info_path)
        if not isinstance(self.info, dict):
            raise DatasetError(f"{info_path}: expected a JSON object")
        self.version = str(self.info.get("codebase_version", ""))
        if not self.version.startswith(("v3", "v2")):
            raise DatasetError(
                f"{info_path}: codebase_version is {self.version!r}; this reader knows LeRobot v3.0 and v2.x datasets"
            )
        self.fps = self._info_field("fps", (int, float))
        self.features = self._parse_features(info_path)
        self.camera_keys = tuple(k for k, f in self.features.items() if f.is_camera)
        self.video_keys = tuple(k for k, f in self.features.items() if f.dtype == "video")
        self.tasks = self._read_tasks()
        self.episodes = self._read_episodes()
        self._columns, self._image_rows = self._read_data()
        self.num_frames = len(self._columns["index"])
        self._episode_of = np.repeat(np.arange(len(self.episodes)), [e.length for e in self.episodes])
        if len(self._episode_of) != self.num_frames:
            raise DatasetError(
                f"{self.root}: the episodes hold {len(self._episode_of)} frames but the data files {self.num_frames}"
            )
        self._stats: dict[str, dict[str, np.ndarray]] | None = None
        self._videos = VideoFrameReader(threads=video_threads)
        self._image_tables: dict[tuple[Path, str], object] = {}  # image columns, read once per file

    # ---- metadata

    def _info_field(self, name: str, types: tuple[type, ...]):
        value = self.info.get(name)
        if not isinstance(value, types) or isinstance(value, bool):
            raise DatasetError(f"{self.root / INFO_PATH}: {name!r} missing or not a {types[0].__name__} (got {value!r})")
        return value

    def _parse_features(self, info_path: Path) -> dict[str, Feature]:
        features = self.info.get("features")
        if not isinstance(features, dict) or not features:
            raise DatasetError(f"{info_path}: 'features' missing or empty")
        parsed = {}
        for key, spec in features.items():
            shape = spec.get("shape") if isinstance(spec, dict) else None
            if not isinstance(spec, dict) or "dtype" not in spec or not isinstance(shape, list):
                raise DatasetError(f"{info_path}: features[{key!r}] needs 'dtype' and a 'shape' list, got {spec!r}")
            parsed[key] = Feature(key, str(spec["dtype"]), tuple(int(d) for d in shape))
        return parsed

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    def feature(self, key: str) -> Feature:
        if key not in self.features:
            raise DatasetError(
                f"{self.root / INFO_PATH}: no feature {key!r}; the dataset has {', '.join(self.features)}"
            )
        return self.features[key]

    def _read_tasks(self) -> list[str]:
        if self.version.startswith("v2"):
            rows = _read_jsonl(self.root / TASKS_V2)
            tasks = {int(r["task_index"]): str(r["task"]) for r in rows if "task_index" in r and "task" in r}
        else:
            path = self.root / TASKS_V3
            table = self._read_parquet(path)
            names = table.column_names
            text_column = next((c for c in ("task", "__index_level_0__") if c in names), None)
            if text_column is None or "task_index" not in names:
                raise DatasetError(f"{path}: expected columns 'task' (or the pandas index) and 'task_index', got {names}")
            tasks = dict(zip(table["task_index"].to_pylist(), table[text_column].to_pylist(), strict=True))
        if sorted(tasks) != list(range(len(tasks))):
            raise DatasetError(f"{self.root}: task indices must be 0..{len(tasks) - 1}, got {sorted(tasks)[:10]}")
        return [tasks[i] for i in range(len(tasks))]

    def _read_parquet(self, path: Path, columns: list[str] | None = None):
        if not path.is_file():
            raise DatasetError(f"{path}: missing")
        parquet = require_module("pyarrow.parquet", "reading LeRobot datasets")
        try:
            return parquet.read_table(path, columns=columns)
        except Exception as exc:  # pyarrow raises ArrowInvalid and friends
            raise DatasetError(f"{path}: cannot read as parquet ({exc})") from None

    def _read_episodes(self) -> list[Episode]:
        if self.version.startswith("v2"):
            return self._read_episodes_v2()
        directory = self.root / EPISODES_V3
        files = sorted(directory.glob("chunk-*/file-*.parquet"))
        if not files:
            raise DatasetError(f"{directory}: no episode files (expected chunk-*/file-*.parquet)")
        video_template = self.info.get("video_path")
        episodes: list[Episode] = []
        for path in files:
            table = self._read_parquet(path).to_pydict()
            needed = ["episode_index", "dataset_from_index", "dataset_to_index"]
            for key in self.video_keys:
                needed += [f"videos/{key}/chunk_index", f"videos/{key}/file_index", f"videos/{key}/from_timestamp"]
            missing = [c for c in needed if c not in table]
            if missing:
                raise DatasetError(f"{path}: missing column(s) {', '.join(missing)}")
            for row in range(len(table["episode_index"])):
                videos = {}
                for key in self.video_keys:
                    relative = str(video_template).format(
                        video_key=key,
                        chunk_index=int(table[f"videos/{key}/chunk_index"][row]),
                        file_index=int(table[f"videos/{key}/file_index"][row]),
                    )
                    videos[key] = (self.root / relative, float(table[f"videos/{key}/from_timestamp"][row]))
                tasks = table.get("tasks", [[]] * len(table["episode_index"]))[row] or []
                episodes.append(
                    Episode(
                        index=int(table["episode_index"][row]),
                        start=int(table["dataset_from_index"][row]),
                        stop=int(table["dataset_to_index"][row]),
                        tasks=tuple(tasks),
                        videos=videos,
                    )
                )
        return self._checked_episodes(episodes, directory)

    def _read_episodes_v2(self) -> list[Episode]:
        rows = _read_jsonl(self.root / EPISODES_V2)
        chunks_size = int(self.info.get("chunks_size", 1000))
        video_template = self.info.get("video_path")
        episodes, start = [], 0
        for row in sorted(rows, key=lambda r: int(r.get("episode_index", -1))):
            if "episode_index" not in row or "length" not in row:
                raise DatasetError(f"{self.root / EPISODES_V2}: each line needs 'episode_index' and 'length': {row}")
            index, length = int(row["episode_index"]), int(row["length"])
            videos = {
                key: (
                    self.root
                    / str(video_template).format(
                        video_key=key, episode_chunk=index // chunks_size, episode_index=index
                    ),
                    0.0,
                )
                for key in self.video_keys
            }
            episodes.append(Episode(index, start, start + length, tuple(row.get("tasks") or ()), videos))
            start += length
        return self._checked_episodes(episodes, self.root / EPISODES_V2)

    def _checked_episodes(self, episodes: list[Episode], where: Path) -> list[Episode]:
        episodes.sort(key=lambda e: e.start)
        expected = 0
        for episode in episodes:
            if episode.start != expected or episode.stop <= episode.start:
                raise DatasetError(
                    f"{where}: episode {episode.index} covers frames [{episode.start}, {episode.stop}); expected it "
                    f"to start at {expected} with at least one frame"
                )
            expected = episode.stop
        return episodes

    # ---- frame data

    def _data_files(self) -> list[Path]:
        if self.version.startswith("v2"):
            template = str(self.info.get("data_path"))
            chunks_size = int(self.info.get("chunks_size", 1000))
            return [
                self.root / template.format(episode_chunk=e.index // chunks_size, episode_index=e.index)
                for e in self.episodes
            ]
        files = sorted((self.root / "data").glob("chunk-*/file-*.parquet"))
        if not files:
            raise DatasetError(f"{self.root / 'data'}: no data files (expected chunk-*/file-*.parquet)")
        return files

    def _read_data(self) -> tuple[dict[str, np.ndarray], dict[str, list[tuple[Path, int]]]]:
        numeric = [k for k, f in self.features.items() if not f.is_camera and f.dtype != "string"]
        images = [k for k, f in self.features.items() if f.dtype == "image"]
        parts: dict[str, list[np.ndarray]] = {k: [] for k in numeric}
        image_rows: dict[str, list[tuple[Path, int]]] = {k: [] for k in images}
        for path in self._data_files():
            table = self._read_parquet(path)
            missing = [k for k in (*numeric, *images) if k not in table.column_names]
            if missing:
                raise DatasetError(f"{path}: missing column(s) {', '.join(missing)} (features of {INFO_PATH})")
            for key in numeric:
                parts[key].append(self._numeric_column(path, key, table[key]))
            for key in images:
                image_rows[key] += [(path, row) for row in range(table.num_rows)]
        columns = {k: np.concatenate(v) if v else np.zeros((0,)) for k, v in parts.items()}
        if "index" not in columns:
            raise DatasetError(f"{self.root / INFO_PATH}: features must include 'index' (the global frame index)")
        order = np.argsort(columns["index"], kind="stable")
        if not np.array_equal(columns["index"][order], np.arange(len(order))):
            raise DatasetError(f"{self.root / 'data'}: the 'index' column is not 0..{len(order) - 1} (frames missing?)")
        if not np.array_equal(order, np.arange(len(order))):
            columns = {k: v[order] for k, v in columns.items()}
            image_rows = {k: [rows[i] for i in order] for k, rows in image_rows.items()}
        return columns, image_rows

    def _numeric_column(self, path: Path, key: str, column) -> np.ndarray:
        shape = self.features[key].shape
        values = column.to_numpy(zero_copy_only=False)
        if values.dtype == object:  # list<float> columns come out as an array of arrays
            try:
                values = np.stack([np.asarray(v) for v in values]) if len(values) else np.zeros((0, *shape))
            except ValueError:
                raise DatasetError(f"{path}: column {key!r} has rows of different lengths (expected {shape})") from None
        per_row = tuple(values.shape[1:]) or (1,)
        if per_row != shape and not (shape == (1,) and values.ndim == 1):
            raise DatasetError(f"{path}: column {key!r} has rows of shape {per_row}, {INFO_PATH} says {shape}")
        return values

    def column(self, key: str) -> np.ndarray:
        """A numeric feature for every frame ``[num_frames, *shape]`` (global frame order)."""
        if key not in self._columns:
            kind = "a camera" if key in self.camera_keys else "not a feature"
            raise DatasetError(f"{self.root}: {key!r} is {kind} of this dataset (numeric: {', '.join(self._columns)})")
        return self._columns[key]

    def episode_of(self, index: int) -> Episode:
        return self.episodes[int(self._episode_of[index])]

    def task(self, index: int) -> str:
        task_index = int(self._columns["task_index"][index]) if "task_index" in self._columns else 0
        if not 0 <= task_index < len(self.tasks):
            raise DatasetError(f"{self.root}: frame {index} has task_index {task_index}; {len(self.tasks)} tasks known")
        return self.tasks[task_index]

    def camera_frame(self, key: str, index: int) -> np.ndarray:
        """Camera ``key`` at global frame ``index`` as ``[H, W, 3]`` uint8 RGB."""
        feature = self.feature(key)
        if feature.dtype == "video":
            episode = self.episode_of(index)
            path, start_time = episode.videos[key]
            timestamp = start_time + float(self._columns["timestamp"][index])
            image = self._videos.frame(path, timestamp, self.tolerance_s)
        elif feature.dtype == "image":
            image = self._image_from_parquet(key, index)
        else:
            raise DatasetError(f"{self.root / INFO_PATH}: feature {key!r} is {feature.dtype}, not a camera")
        return image

    def _image_from_parquet(self, key: str, index: int) -> np.ndarray:
        path, row = self._image_rows[key][index]
        column = self._image_tables.get((path, key))
        if column is None:
            column = self._image_tables[(path, key)] = self._read_parquet(path, columns=[key])[key]
        cell = column[row].as_py()
        data = cell.get("bytes") if isinstance(cell, dict) else cell
        if not data:
            raise DatasetError(f"{path}: row {row} of image column {key!r} holds no bytes")
        image_module = require_module("PIL.Image", "decoding image features")
        return np.asarray(image_module.open(io.BytesIO(data)).convert("RGB"))

    def reset_readers(self) -> None:
        """Forget open video files and cached image columns (a DataLoader worker calls this once: a forked process
        must not share its parent's decoder state)."""
        self._videos = VideoFrameReader(max_open=self._videos.max_open, threads=self._videos.threads)
        self._image_tables = {}

    @property
    def frames_decoded(self) -> int:
        """Video frames this process has decoded so far (seeks decode a few frames more than they return)."""
        return self._videos.frames_decoded

    # ---- statistics

    @property
    def stats(self) -> dict[str, dict[str, np.ndarray]]:
        """Per numeric feature, ``mean``/``std``/``min``/``max``/``q01``/.../``q99`` as float32 arrays of its shape:
        ``meta/stats.json``'s, completed from the data where a statistic is missing."""
        if self._stats is None:
            self._stats = self._load_stats()
        return self._stats

    def _load_stats(self) -> dict[str, dict[str, np.ndarray]]:
        path = self.root / STATS_PATH
        given = _read_json(path) if path.is_file() else {}
        stats: dict[str, dict[str, np.ndarray]] = {}
        for key, feature in self.features.items():
            if feature.is_camera or key in BOOKKEEPING or feature.dtype == "string":
                continue
            entry = {}
            for name, value in (given.get(key) or {}).items():
                if name == "count":
                    continue
                array = np.asarray(value, dtype=np.float32)
                if array.shape != feature.shape:
                    raise DatasetError(f"{path}: {key}.{name} has shape {array.shape}, {INFO_PATH} says {feature.shape}")
                entry[name] = array
            missing = [name for name in COMPUTED_STATS if name not in entry]
            if missing:
                data = self.column(key).astype(np.float64).reshape(self.num_frames, *feature.shape)
                computed = {
                    "mean": data.mean(0), "std": data.std(0), "min": data.min(0), "max": data.max(0),
                    **{f"q{q:02d}": np.quantile(data, q / 100, axis=0) for q in (1, 10, 50, 90, 99)},
                }  # fmt: skip
                for name in missing:
                    entry[name] = computed[name].astype(np.float32)
                logger.info("%s: computed %s of %r from the data (%s lacks them)", self.root, ", ".join(missing), key,
                            STATS_PATH)  # fmt: skip
            stats[key] = entry
        return stats

    def __repr__(self) -> str:
        return (
            f"LeRobotDataset({str(self.root)!r}, {self.version}, {self.num_episodes} episodes, {self.num_frames} "
            f"frames at {self.fps} fps, cameras {list(self.camera_keys)})"
        )


__all__ = ["DEFAULT_TOLERANCE_S", "Episode", "Feature", "LeRobotDataset"]
