"""What pi0 / pi0.5 declare to the model-agnostic layers, as plain data (interpreted by ``quant/``)."""

from __future__ import annotations

#: W8A8: the linear layers of the VLM and the action expert (fused Q/K/V, attention output, fused gate/up, down:
#: nearly all of the FLOPs). Everything LeRobot keeps in fp32 when the policy runs in bf16 keeps the model's dtype.
W8A8_PLAN = {
    "name": "pi0-w8a8",
    "include": (r"(vlm|expert)\.layers\.\d+\.(qkv|o|gate_up|down)",),
    "keep": "the SigLIP tower, projector, token embedding, norms (adaRMS dense layers included) and the action / "
    "time projections",
}
