"""The LeRobot dataset reader: v3.0 and v2.1 layouts, AV1 / h264 videos and parquet images, action chunks with
padding at episode ends, feature mapping, statistics, the global batch order, and errors that name file and key."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from tolerances import UNIT_ROUNDOFF

pytest.importorskip("pyarrow", reason="the [train] extra (pyarrow) is not installed")
pytest.importorskip("av", reason="the [train] extra (PyAV) is not installed")

from lerobot_data import ACTION_DIM, CAMERAS, frame_level, make_dataset

from embodied_accel.data.errors import DatasetError
from embodied_accel.data.lerobot_dataset import LeRobotDataset
from embodied_accel.data.samples import ActionChunkSamples, FeatureMap, GlobalBatchSampler


@pytest.mark.parametrize(
    "version,codec,storage",
    [("v3.0", "av1", "video"), ("v3.0", "h264", "video"), ("v2.1", "h264", "video"), ("v3.0", "av1", "image")],
)
def test_random_access_returns_the_right_frame(tmp_path, version, codec, storage):
    root, episodes = make_dataset(tmp_path / "ds", version=version, codec=codec, camera_storage=storage)
    ds = LeRobotDataset(root)
    assert (ds.num_frames, ds.num_episodes, ds.fps, ds.camera_keys) == (21, 2, 10, CAMERAS)
    for index in (20, 0, 13, 12, 11, 5, 6, 19):  # out of order, across the episode boundary
        for key in CAMERAS:
            frame = ds.camera_frame(key, index)
            assert frame.shape == (32, 32, 3) and frame.dtype == np.uint8
            assert abs(float(frame.mean()) - frame_level(index)) < 3, (key, index)
    np.testing.assert_array_equal(ds.column("action")[12:], episodes[1].columns["action"])
    assert ds.task(3) == "pick up the bowl" and ds.task(15) == "open the drawer"
    stats = ds.stats["action"]
    assert set(stats) >= {"mean", "std", "min", "max", "q01", "q99"} and stats["q99"].shape == (ACTION_DIM,)


def test_action_chunks_pad_past_the_episode_end(tmp_path):
    root, episodes = make_dataset(tmp_path / "ds", codec="h264")
    ds = LeRobotDataset(root)
    samples = ActionChunkSamples(ds, FeatureMap.resolve(ds), horizon=5)
    sample = samples[9]  # episode 0 has frames 0..11: steps 9, 10, 11, then two padded steps
    np.testing.assert_array_equal(sample["action_is_pad"], [False, False, False, True, True])
    actions = episodes[0].columns["action"]
    np.testing.assert_array_equal(sample["actions"], actions[[9, 10, 11, 11, 11]])
    assert set(sample["frames"]) == set(CAMERAS) and sample["task"] == "pick up the bowl"
    assert not samples[12]["action_is_pad"].any()  # first frame of episode 1


def test_feature_map_by_name_by_map_and_errors(tmp_path):
    root, _ = make_dataset(tmp_path / "ds", codec="h264")
    ds = LeRobotDataset(root)
    policy = ("observation.images.base_0_rgb", "observation.images.wrist_image")
    by_name = FeatureMap.resolve(ds, policy_cameras=policy)
    assert by_name.cameras == ((policy[0], None), (policy[1], policy[1]))
    mapped = FeatureMap.resolve(ds, policy_cameras=policy, camera_map={policy[0]: CAMERAS[0]})
    assert mapped.cameras == ((policy[0], CAMERAS[0]), (policy[1], None))
    with pytest.raises(DatasetError, match=r"no camera 'observation.images.nope'"):
        FeatureMap.resolve(ds, camera_map={policy[0]: "observation.images.nope"})
    with pytest.raises(DatasetError, match=r"none of the policy's cameras.*--camera-map"):
        FeatureMap.resolve(ds, policy_cameras=("observation.images.other",))
    with pytest.raises(DatasetError, match=r"info.json: no state feature 'observation.joints'"):
        FeatureMap.resolve(ds, state="observation.joints")


def test_bad_datasets_name_the_file_and_key(tmp_path):
    root, _ = make_dataset(tmp_path / "ds", codec="h264")
    broken = tmp_path / "missing_video"
    shutil.copytree(root, broken)
    video = next((broken / "videos").rglob("*.mp4"))
    video.unlink()
    ds = LeRobotDataset(broken)
    with pytest.raises(DatasetError, match=rf"{video.name}: video file missing"):
        ds.camera_frame(CAMERAS[0] if CAMERAS[0] in str(video) else CAMERAS[1], 0)

    shapes = tmp_path / "bad_shape"
    shutil.copytree(root, shapes)
    info = json.loads((shapes / "meta/info.json").read_text())
    info["features"]["action"]["shape"] = [9]
    (shapes / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=r"file-000.parquet: column 'action' has rows of shape \(7,\), .* says \(9,\)"):
        LeRobotDataset(shapes)

    no_meta = tmp_path / "no_meta"
    shutil.copytree(root, no_meta)
    (no_meta / "meta/info.json").unlink()
    with pytest.raises(DatasetError, match=r"meta/info.json: missing"):
        LeRobotDataset(no_meta)

    no_column = tmp_path / "no_column"
    shutil.copytree(root, no_column)
    info = json.loads((no_column / "meta/info.json").read_text())
    info["features"]["observation.velocity"] = {"dtype": "float32", "shape": [3]}
    (no_column / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=r"file-000.parquet: missing column\(s\) observation.velocity"):
        LeRobotDataset(no_column)


def test_global_batches_split_across_ranks_and_resume():
    single = GlobalBatchSampler(10, 4, seed=3, num_steps=6)
    ranks = [GlobalBatchSampler(10, 2, world_size=2, rank=r, seed=3, num_steps=6) for r in range(2)]
    for step, (whole, first, second) in enumerate(zip(single, *ranks, strict=True)):
        assert whole == first + second, step
    resumed = GlobalBatchSampler(10, 4, seed=3, start_step=4, num_steps=2)
    assert list(resumed) == list(single)[4:]
    epoch0 = [i for batch in list(single)[:2] for i in batch] + list(single)[2][:2]
    assert sorted(epoch0) == list(range(10))  # every sample once per epoch


def test_worker_processes_give_the_same_batches(tmp_path):
    import torch

    from embodied_accel.data.samples import make_loader

    root, _ = make_dataset(tmp_path / "ds", codec="av1")
    ds = LeRobotDataset(root)
    ds.camera_frame(CAMERAS[0], 4)  # the parent has an open decoder before the workers fork
    samples = ActionChunkSamples(ds, FeatureMap.resolve(ds), horizon=4)

    def batches(workers):
        sampler = GlobalBatchSampler(len(samples), 3, seed=5, num_steps=4)
        return list(make_loader(samples, _wrist_frames_and_indices, sampler, workers=workers))

    for (frames_a, index_a), (frames_b, index_b) in zip(batches(0), batches(2), strict=True):
        assert index_a == index_b and torch.equal(frames_a, frames_b)


def _wrist_frames_and_indices(rows):
    import torch

    return torch.stack([torch.from_numpy(r["frames"][CAMERAS[1]]) for r in rows]), [r["index"] for r in rows]


def test_statistics_missing_from_the_files_come_from_the_data(tmp_path):
    root, episodes = make_dataset(tmp_path / "ds", codec="h264")
    (root / "meta/stats.json").unlink()
    stats = LeRobotDataset(root).stats["action"]
    actions = np.concatenate([e.columns["action"] for e in episodes]).astype(np.float64)
    # the reader computes them as this does, in float64 from the same float32 values, then keeps them as float32:
    # one rounding to nearest, within u of the float64 value
    u = UNIT_ROUNDOFF[torch.float32]
    np.testing.assert_allclose(stats["q01"], np.quantile(actions, 0.01, axis=0), rtol=u, atol=0)
    np.testing.assert_allclose(stats["std"], actions.std(0), rtol=u, atol=0)
