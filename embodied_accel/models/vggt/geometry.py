"""Cameras and points from VGGT's outputs: pose encoding → OpenCV extrinsics / intrinsics, depth → world points,
and the relative-pose errors used to compare two sets of cameras (pose AUC)."""

from __future__ import annotations

import math

import torch


def quaternion_to_matrix(quaternions: torch.Tensor) -> torch.Tensor:
    """Quaternions ``[..., 4]`` (x, y, z, w; real part last) → rotation matrices ``[..., 3, 3]``."""
    i, j, k, r = torch.unbind(quaternions, -1)
    two_s = 2.0 / (quaternions * quaternions).sum(-1)
    o = torch.stack(
        (
            1 - two_s * (j * j + k * k), two_s * (i * j - k * r), two_s * (i * k + j * r),
            two_s * (i * j + k * r), 1 - two_s * (i * i + k * k), two_s * (j * k - i * r),
            two_s * (i * k - j * r), two_s * (j * k + i * r), 1 - two_s * (i * i + j * j),
        ),
        -1,
    )  # fmt: skip
    return o.reshape(quaternions.shape[:-1] + (3, 3))


def pose_encoding_to_cameras(pose_enc: torch.Tensor, image_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., 9]`` (translation, quaternion xyzw, FoV h, FoV w) → extrinsics ``[..., 3, 4]`` (camera from world,
    OpenCV axes: x right, y down, z forward) and intrinsics ``[..., 3, 3]`` in pixels, principal point centred."""
    height, width = image_hw
    rotation = quaternion_to_matrix(pose_enc[..., 3:7])
    extrinsics = torch.cat([rotation, pose_enc[..., :3, None]], dim=-1)
    fy = (height / 2.0) / torch.tan(pose_enc[..., 7] / 2.0)
    fx = (width / 2.0) / torch.tan(pose_enc[..., 8] / 2.0)
    intrinsics = torch.zeros(pose_enc.shape[:-1] + (3, 3), dtype=pose_enc.dtype, device=pose_enc.device)
    intrinsics[..., 0, 0], intrinsics[..., 1, 1] = fx, fy
    intrinsics[..., 0, 2], intrinsics[..., 1, 2], intrinsics[..., 2, 2] = width / 2, height / 2, 1.0
    return extrinsics, intrinsics


def depth_to_world_points(depth: torch.Tensor, extrinsics: torch.Tensor, intrinsics: torch.Tensor) -> torch.Tensor:
    """Depth maps ``[S, H, W]`` + cameras ``[S, 3, 4]`` / ``[S, 3, 3]`` → world points ``[S, H, W, 3]``."""
    frames, height, width = depth.shape
    v, u = torch.meshgrid(
        torch.arange(height, dtype=depth.dtype), torch.arange(width, dtype=depth.dtype), indexing="ij"
    )
    fx, fy = intrinsics[:, 0, 0, None, None], intrinsics[:, 1, 1, None, None]
    cx, cy = intrinsics[:, 0, 2, None, None], intrinsics[:, 1, 2, None, None]
    cam = torch.stack([(u - cx) * depth / fx, (v - cy) * depth / fy, depth], dim=-1)  # [S, H, W, 3]
    rotation, translation = extrinsics[:, :, :3], extrinsics[:, :, 3]
    # world = R^T (cam - t)
    return torch.einsum("sij,shwi->shwj", rotation, cam - translation[:, None, None, :])


def relative_pose_errors(ext_a: torch.Tensor, ext_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotation and translation-direction angle errors (degrees) of every frame pair's relative pose, cameras ``a``
    vs ``b`` (``[S, 3, 4]`` each): what camera pose AUC is computed from."""
    frames = ext_a.shape[0]
    i, j = torch.triu_indices(frames, frames, offset=1)

    def relative(ext):
        r, t = ext[:, :, :3].double(), ext[:, :, 3].double()
        r_rel = r[j] @ r[i].transpose(-1, -2)
        t_rel = t[j] - (r_rel @ t[i, :, None])[..., 0]
        return r_rel, t_rel

    ra, ta = relative(ext_a)
    rb, tb = relative(ext_b)
    # atan2 forms: well conditioned near 0 (arccos of a cosine near 1 is not).
    delta = ra.transpose(-1, -2) @ rb
    cos_r = (delta.diagonal(dim1=-2, dim2=-1).sum(-1) - 1) / 2
    skew = delta - delta.transpose(-1, -2)
    sin_r = torch.stack([skew[..., 2, 1], skew[..., 0, 2], skew[..., 1, 0]], -1).norm(dim=-1) / 2
    rot_err = torch.rad2deg(torch.atan2(sin_r, cos_r))
    trans_err = torch.rad2deg(torch.atan2(torch.linalg.cross(ta, tb).norm(dim=-1), (ta * tb).sum(-1)))
    return rot_err.float(), trans_err.float()


def pose_auc(rot_err: torch.Tensor, trans_err: torch.Tensor, threshold_deg: float = 30.0) -> float:
    """Area under the accuracy curve of ``max(rotation, translation)`` error up to ``threshold_deg`` (0..1)."""
    errors = torch.maximum(rot_err, trans_err).double()
    thresholds = torch.arange(1, int(threshold_deg) + 1, dtype=torch.float64)
    accuracy = (errors[None, :] <= thresholds[:, None]).double().mean(dim=1)
    return float(accuracy.mean()) if errors.numel() else math.nan
