"""``embodied-accel export``: a model to ONNX graphs and a manifest (and TensorRT engines, with ``--tensorrt``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..argtypes import RESULTS_DIR, positive_float, positive_int
from ..export.engine import DEFAULT_OPSET

DEFAULT_MODEL = "pi0-tiny"


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, e.g. 1,2,4; got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def add_export_parser(commands, parents=()) -> argparse.ArgumentParser:
    """Register ``export`` on ``commands`` (argparse sub-parsers); returns its parser."""
    p = commands.add_parser("export", parents=list(parents), help="export a model to ONNX (and TensorRT engines)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--model", metavar="PRESET",
                        help=f"a preset (seeded random weights), e.g. vggt-tiny (default: {DEFAULT_MODEL})")  # fmt: skip
    source.add_argument("--checkpoint", type=Path, metavar="DIR", help="a checkpoint of any family")
    p.add_argument("-o", "--output", type=Path, metavar="OUT_DIR",
                   help=f"the export directory (default: {RESULTS_DIR}/export/<model>)")  # fmt: skip
    p.add_argument("--parts", type=_names, metavar="A,B", help="a subset of the family's graphs (default: all)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="the graphs' compute dtype (default: float32; TensorRT picks lower precisions itself)")
    p.add_argument("--opset", type=positive_int, default=DEFAULT_OPSET, help=f"ONNX opset (default: {DEFAULT_OPSET})")
    p.add_argument("--batch", type=positive_int, default=1, help="rows per call (policies, VGGT; default: 1)")
    p.add_argument("--num-steps", type=positive_int, metavar="N", help="denoising steps (default: the model's)")
    p.add_argument("--frames", type=_int_list, default=(2,), metavar="N,M",
                   help="VGGT: one graph per frame count (default: 2)")
    p.add_argument("--guidance", type=positive_float, default=5.0, help="Hunyuan3D-2: CFG scale (default: 5)")
    p.add_argument("--chunk", type=positive_int, default=8000, help="Hunyuan3D-2: query points per decoder call")
    p.add_argument("--preset", help="with --checkpoint: the architecture preset")
    p.add_argument("--tokenizer", type=Path, help="pi0 / GR00T: the tokenizer (copied into the export for pi0)")
    p.add_argument("--embodiment", help="GR00T: the embodiment tag")
    p.add_argument("--no-verify", action="store_true", help="skip the ONNX Runtime check against the eager model")
    p.add_argument("--tensorrt", choices=("fp32", "fp16", "bf16", "fp8"), metavar="PRECISION",
                   help="also build TensorRT engines: fp32, fp16, bf16 or fp8 (needs TensorRT and a GPU)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bars (export prints one line per graph)")
    p.set_defaults(handler=run_export)
    return p


def _options(args: argparse.Namespace, family: str) -> dict:
    if family in ("pi0", "groot"):
        options = {"batch": args.batch, "num_steps": args.num_steps}
        for name in ("preset", "tokenizer", "embodiment"):
            if getattr(args, name) is not None:
                options[name] = str(getattr(args, name)) if name == "tokenizer" else getattr(args, name)
        return options
    if family == "vggt":
        return {"batch": args.batch, "frames": args.frames, **({"preset": args.preset} if args.preset else {})}
    return {"num_steps": args.num_steps, "guidance": args.guidance, "chunk": args.chunk}


def run_export(args: argparse.Namespace) -> int:
    from ..export import export_model, family_of

    source = str(args.checkpoint) if args.checkpoint is not None else (args.model or DEFAULT_MODEL)
    family = family_of(source)
    if args.output is None:
        args.output = Path(RESULTS_DIR) / "export" / Path(source).name
    say = lambda line: print(line, flush=True)  # noqa: E731
    manifest = export_model(source, args.output, parts=args.parts, dtype=args.dtype, opset=args.opset,
                            verify=not args.no_verify, progress=say, **_options(args, family.name))  # fmt: skip
    for graph in manifest.graphs:
        error = "not verified" if graph.max_abs_error is None else f"max |ONNX Runtime - eager| {graph.max_abs_error:.2e}"
        say(f"  {graph.file}: {len(graph.inputs)} inputs, {len(graph.outputs)} outputs; {error}")
    say(f"wrote {len(manifest.graphs)} graphs of {manifest.model} ({manifest.family}, opset {manifest.opset}) "
        f"and manifest.json to {args.output}")  # fmt: skip
    if manifest.random_weights:
        say(f"note: {source} has seeded random weights, not a trained model's: the export computes noise (the "
            "manifest records random_weights); export a --checkpoint for real ones")  # fmt: skip
    if args.tensorrt:
        from ..export.tensorrt import build_engines

        engines = build_engines(args.output, args.tensorrt)
        say(f"built {len(engines)} TensorRT {args.tensorrt} engines")
    return 0
