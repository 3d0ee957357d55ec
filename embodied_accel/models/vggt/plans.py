"""What VGGT declares to the model-agnostic layers: which linear layers run in W8A8 (``quant/``) and where the
sequence-parallel attention goes (``parallel/``)."""

from __future__ import annotations

from ...plans import QuantPlan

#: The MLPs of the aggregator's frame / global blocks and of the DINOv2 patch embedding (the bulk of the FLOPs
#: after attention). Attention projections and every head stay in the model's dtype, as the Ascend recipe does.
VGGT_W8A8_PLAN = QuantPlan(
    name="vggt-w8a8",
    include=(r"aggregator\.(frame_blocks|global_blocks|patch_embed\.blocks)\.\d+\.fc[12]",),
    keep="attention (qkv, proj, softmax) and the camera, depth, point and track heads",
)

#: Also the attention projections of the aggregator (for comparing the error against VGGT_W8A8_PLAN).
VGGT_W8A8_ALL_BLOCKS_PLAN = QuantPlan(
    name="vggt-w8a8-all-blocks",
    include=(r"aggregator\.(frame_blocks|global_blocks|patch_embed\.blocks)\.\d+\.(fc[12]|attn\.(qkv|proj))",),
    keep="the camera, depth, point and track heads",
)

#: Sequence parallelism: only the global blocks attend across frames (``VggtModel.forward(parallel=...)`` routes
#: their attention through parallel/); frame blocks and the dense heads run on each process's frames; the camera
#: head (attention across frames) and the tracker (attention over time) gather the frames first.
SEQUENCE_PARALLEL_SITES = ("aggregator.global_blocks.*.attn",)
FRAME_GATHER_SITES = ("camera_head", "track_head.tracker")
