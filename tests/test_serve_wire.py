"""Policy server pieces without a server: the msgpack-numpy codec, key maps, metrics, torch-free client import."""

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest

from embodied_accel.serve import codec, keymap, metrics
from embodied_accel.serve.batching import merge_signatures

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------------------------
# Codec
# ---------------------------------------------------------------------------------------------------------------


def test_roundtrip_keeps_arrays_scalars_and_nesting():
    message = {
        "image": np.arange(24, dtype=np.uint8).reshape(2, 4, 3),
        "state": np.linspace(-1, 1, 7, dtype=np.float32),
        "big_endian": np.arange(3, dtype=">i4"),
        "flags": np.array([True, False]),
        "empty": np.zeros((0, 5), np.float64),
        "text": np.array("pick"),
        "scalar": np.float32(2.5),
        "images": {"cam_high": np.ones((3, 2, 2), np.uint8)},
        "prompt": "do something",
        "list": [1, 2.0, None, b"raw"],
    }
    out = codec.unpackb(codec.packb(message))
    assert set(out) == set(message)
    for key in ("image", "state", "big_endian", "flags", "empty", "text"):
        assert out[key].dtype == message[key].dtype and np.array_equal(out[key], message[key]), key
    assert out["scalar"] == np.float32(2.5) and isinstance(out["scalar"], np.float32)
    assert np.array_equal(out["images"]["cam_high"], message["images"]["cam_high"])
    assert out["prompt"] == "do something" and out["list"] == [1, 2.0, None, b"raw"]
    out["image"][0, 0, 0] = 99  # decoded arrays are writable copies
    noncontiguous = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    assert np.array_equal(codec.unpackb(codec.packb(noncontiguous)), noncontiguous)


def test_bytes_match_openpi_client():
    msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy", reason="pip install --no-deps openpi-client")
    message = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.int64(3), "c": "text", "d": [1, 2]}
    assert codec.packb(message) == msgpack_numpy.packb(message)
    theirs = msgpack_numpy.unpackb(codec.packb(message))
    assert np.array_equal(theirs["a"], message["a"]) and theirs["b"] == 3


def _tagged(data: bytes, dtype: str, shape) -> dict:
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}


@pytest.mark.parametrize(
    "payload, fragment",
    [
        (b"\xc1", "not a valid msgpack message"),  # 0xc1 is never used
        (codec.packb({"a": np.zeros(100, np.float32)})[:-7], "not a valid msgpack message"),  # truncated
        (codec.packb({"a": 1}) + b"\x00", "not a valid msgpack message"),  # trailing bytes
        (msgpack.packb({"x": _tagged(b"\0" * 12, "|u1", [100000, 100000, 3])}), "needs 30000000000 bytes, got 12"),
        (msgpack.packb({"x": _tagged(b"\0" * 12, "|u1", [-4, 3])}), "non-negative ints"),
        (msgpack.packb({"x": _tagged(b"\0" * 8, "nonsense", [8])}), "unknown dtype 'nonsense'"),
        (msgpack.packb({"x": _tagged(b"\0" * 8, "|O", [1])}), "is not allowed"),
        (msgpack.packb({"x": _tagged(b"\0" * 8, "<c8", [1])}), "is not allowed"),
        (msgpack.packb({"x": _tagged(b"\0" * 8, "|V8", [1])}), "is not allowed"),
        (msgpack.packb({"x": _tagged("text", "|u1", [4])}), "data must be raw bytes"),
        (msgpack.packb({"x": _tagged(b"\0" * 4, "|u1", "4")}), "shape must be a list"),
        (msgpack.packb({"x": {"y": [_tagged(b"\0", "<f4", [1])]}}), "['x']['y'][0]: shape [1] of float32 needs 4"),
        (msgpack.packb({1: 2}), "map keys must be strings"),
        (msgpack.packb({"x": msgpack.ExtType(5, b"z")}), "unsupported msgpack value"),
        (msgpack.packb({"x": {b"__npgeneric__": True, b"data": [1], b"dtype": "<f4"}}), "scalar data must be"),
    ],
)
def test_strict_decoding_names_the_field(payload, fragment):
    with pytest.raises(codec.WireError, match="observation") as info:
        codec.unpack_observation(payload)
    assert fragment in str(info.value)


def test_top_level_must_be_a_map_and_nesting_is_bounded():
    with pytest.raises(codec.WireError, match="expected a map"):
        codec.unpack_observation(codec.packb([1, 2, 3]))
    deep: dict = {}
    node = deep
    for _ in range(codec.MAX_DEPTH + 2):
        node["n"] = {}
        node = node["n"]
    with pytest.raises(codec.WireError, match="nested deeper"):
        codec.unpack_observation(codec.packb(deep))
    with pytest.raises(TypeError, match="cannot send"):
        codec.packb({"x": np.array([object()])})


# ---------------------------------------------------------------------------------------------------------------
# Key maps
# ---------------------------------------------------------------------------------------------------------------

CAMERAS = (
    "observation.images.base_0_rgb",
    "observation.images.left_wrist_0_rgb",
    "observation.images.right_wrist_0_rgb",
)


def mapper(name="auto", has_tokenizer=False, default_prompt=None, cameras=CAMERAS):
    return keymap.ObservationMapper(
        name, cameras, "observation.state", has_tokenizer=has_tokenizer, default_prompt=default_prompt
    )


def image(value=0):
    return np.full((4, 4, 3), value, np.uint8)


def test_libero_aloha_droid_and_identity_keys():
    libero = {
        "observation/image": image(1),
        "observation/wrist_image": image(2),
        "observation/state": np.ones(8),
        "prompt": "p",
    }
    out, origin = mapper(has_tokenizer=True)(libero)
    assert set(out) == {CAMERAS[0], CAMERAS[1], "observation.state", "prompt"}
    assert out[CAMERAS[1]][0, 0, 0] == 2 and origin["observation.state"] == "observation/state"

    aloha = {
        "state": np.ones(14),
        "images": {k: image(i) for i, k in enumerate(("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist"))},
    }
    out, _ = mapper()(aloha)
    assert [out[c][0, 0, 0] for c in CAMERAS] == [0, 2, 3]  # cam_low is dropped, as openpi does
    assert out["observation.state"].shape == (14,)

    droid = {
        "observation/exterior_image_1_left": image(5),
        "observation/wrist_image_left": image(6),
        "observation/joint_position": np.arange(7, dtype=np.float64),
        "observation/gripper_position": np.float32(0.5),
    }
    out, origin = mapper()(droid)
    assert out["observation.state"].tolist() == [0, 1, 2, 3, 4, 5, 6, 0.5] and CAMERAS[2] not in out
    assert origin["observation.state"] == "observation/joint_position + observation/gripper_position"

    native = {CAMERAS[0]: image(), "observation.state": np.ones(8), "observation.language.tokens": np.arange(3)}
    out, origin = mapper()(native)
    assert out.keys() == native.keys() and origin == {}


def test_two_camera_model_drops_extra_cameras_and_fixed_map_is_enforced():
    aloha = {
        "state": np.ones(14),
        "images": {"cam_high": image(1), "cam_left_wrist": image(2), "cam_right_wrist": image(3)},
    }
    out, _ = mapper(cameras=CAMERAS[:2])(aloha)
    assert set(out) == {CAMERAS[0], CAMERAS[1], "observation.state"}
    with pytest.raises(keymap.KeyMapError, match=r"\['observation/joint_position'\]: missing"):
        mapper("droid")({"observation/exterior_image_1_left": image()})
    with pytest.raises(keymap.KeyMapError, match="cannot tell which robot"):
        mapper()({"camera": image(), "joints": np.ones(3)})
    with pytest.raises(keymap.KeyMapError, match="numeric vector"):
        mapper("droid")({"observation/joint_position": np.ones((2, 2)), "observation/gripper_position": 1.0})


def test_instruction_text_or_tokens_and_default_prompt():
    obs = {
        "observation/image": image(),
        "observation/state": np.ones(8),
        "prompt": "p",
        "observation.language.tokens": np.arange(3),
    }
    out, _ = mapper(has_tokenizer=False)(obs)
    assert "prompt" not in out and "observation.language.tokens" in out
    out, _ = mapper(has_tokenizer=True)(obs)
    assert out["prompt"] == "p" and "observation.language.tokens" not in out
    bare = {"observation/image": image(), "observation/state": np.ones(8)}
    out, origin = mapper(default_prompt="fold the towel")(bare)
    assert out["prompt"] == "fold the towel" and origin["prompt"] == "--default-prompt"


def test_custom_keymap_file_and_errors(tmp_path):
    path = tmp_path / "robot.json"
    path.write_text(json.dumps({"name": "arm", "cameras": ["rgb/front"], "state": ["q", "gripper"], "prompt": "task"}))
    out, _ = mapper(str(path))({"rgb": {"front": image(7)}, "q": np.zeros(3), "gripper": 1, "task": "x"})
    assert out[CAMERAS[0]][0, 0, 0] == 7 and out["observation.state"].tolist() == [0, 0, 0, 1] and out["prompt"] == "x"
    (tmp_path / "bad.json").write_text('{"cameras": "x"}')
    for spec, fragment in ((tmp_path / "bad.json", "expected an object"), ("nope", "neither one of")):
        with pytest.raises(ValueError, match=fragment):
            keymap.load_keymap(str(spec))


def test_annotate_adds_the_wire_key():
    message = "observation['observation.state']: expected a 1-D numeric vector of length 8"
    assert keymap.annotate(message, {"observation.state": "observation/state"}) == (
        "observation['observation.state'] (sent as 'observation/state'): expected a 1-D numeric vector of length 8"
    )


def test_signatures_merge_when_only_missing_cameras_differ():
    a, b = (((4, 4, 3), "uint8"), None), (None, ((8, 8, 3), "uint8"))
    assert merge_signatures(a, b) == (((4, 4, 3), "uint8"), ((8, 8, 3), "uint8"))
    assert merge_signatures(a, (((5, 4, 3), "uint8"), None)) is None
    assert merge_signatures(("x",), ("x", "y")) is None and merge_signatures("k", "k") == "k"


# ---------------------------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------------------------


def test_prometheus_text_histograms_are_cumulative():
    m = metrics.Metrics()
    for size in (1, 3, 3, 8):
        m.model_call(size, 0.02)
    m.request_done(0.004)
    m.request_failed("decode")
    m.queued(0.0001)
    text = m.render()
    assert (
        "# TYPE embodied_accel_batch_size histogram" in text and "# TYPE embodied_accel_requests_total counter" in text
    )
    samples = metrics.parse_metrics(text)
    p = metrics.PREFIX
    assert samples[f'{p}batch_size_bucket{{le="1"}}'] == 1
    assert samples[f'{p}batch_size_bucket{{le="4"}}'] == 3
    assert samples[f'{p}batch_size_bucket{{le="8"}}'] == 4 == samples[f'{p}batch_size_bucket{{le="+Inf"}}']
    assert samples[f"{p}batch_size_sum"] == 15 and samples[f"{p}model_calls_total"] == 4
    assert samples[f'{p}requests_total{{outcome="ok"}}'] == 1 and samples[f'{p}errors_total{{kind="decode"}}'] == 1
    assert samples[f'{p}inference_seconds_bucket{{le="0.025"}}'] == 4
    assert samples["process_resident_memory_bytes"] > 1e6


def test_json_log_lines_carry_the_fields(caplog):
    import logging

    logger = logging.getLogger("embodied_accel.test_serve")
    with caplog.at_level(logging.INFO, logger="embodied_accel.test_serve"):
        metrics.log_event(logger, logging.INFO, "request_failed", conn=3, kind="decode")
    record = caplog.records[-1]
    assert record.getMessage() == "request_failed conn=3 kind=decode"
    line = json.loads(metrics.JsonFormatter().format(record))
    assert line["event"] == "request_failed" and line["conn"] == 3 and line["level"] == "INFO"


# ---------------------------------------------------------------------------------------------------------------
# The client side imports without torch
# ---------------------------------------------------------------------------------------------------------------

TORCH_BLOCKER = textwrap.dedent(
    """
    import sys

    class BlockTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is blocked in this test")
            return None

    sys.meta_path.insert(0, BlockTorch())
    """
)


def test_client_modules_import_without_torch():
    script = TORCH_BLOCKER + textwrap.dedent(
        """
        import numpy as np
        import embodied_accel
        from embodied_accel.serve import ActionChunkExecutor, PolicyClient, codec, keymap, loadtest, metrics
        from embodied_accel.serve.client import ServerError, http_get
        assert "torch" not in sys.modules, "torch was imported"
        try:
            import torch  # noqa: F401
        except ImportError:
            pass
        else:
            raise AssertionError("the blocker did not work")
        executor = ActionChunkExecutor(lambda obs: {"actions": np.zeros((4, 2))}, prefetch_steps=1)
        assert executor.step({}).shape == (2,)
        executor.close()
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# ---------------------------------------------------------------------------------------------------------------
# Hostile messages: every problem is a WireError / KeyMapError naming the field, within bounded work
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tagged, fragment",
    [
        (_tagged(b"", "<f4", [0, 2**63]), "declares 9223372036854775808 elements"),  # np.zeros: ValueError
        (_tagged(b"", "<f4", [0, 2**40, 2**40]), "declares 1208925819614629174706176 elements"),
        (_tagged(b"", "|S0", [2**62]), "zero-byte elements"),  # np.zeros: MemoryError
        (_tagged(b"", "<U0", [2**20]), "zero-byte elements"),  # 8 GiB of virtual memory before
    ],
)
def test_arrays_that_would_not_allocate_are_refused(tagged, fragment):
    payload = msgpack.packb({"x": tagged})
    assert len(payload) < 80
    with pytest.raises(codec.WireError, match=r"observation\['x'\]") as info:
        codec.unpack_observation(payload)
    assert fragment in str(info.value)


def test_empty_arrays_with_ordinary_shapes_still_decode():
    out = codec.unpackb(msgpack.packb({"x": _tagged(b"", "<f4", [0, 7]), "s": _tagged(b"", "|S3", [0])}))
    assert out["x"].shape == (0, 7) and out["s"].dtype == np.dtype("S3")


def _list_header(n: int) -> bytes:
    return b"\xdd" + n.to_bytes(4, "big")  # msgpack array32


def test_message_expansion_is_bounded_by_entry_counts():
    limits = codec.DEFAULT_LIMITS
    # One list longer than a list may be: refused from its header, before any entry is built.
    long_list = b"\x81\xa1x" + _list_header(limits.max_collection_len + 1) + b"\x80" * 8
    with pytest.raises(codec.WireError, match=f"at most {limits.max_collection_len} entries"):
        codec.unpack_observation(long_list)
    # Many lists of allowed length: 1 byte per empty map, 48 x 16384 of them in 800 kB.
    per_list, lists = limits.max_collection_len, 48
    nested = b"\x81\xa1x" + _list_header(lists) + (_list_header(per_list) + b"\x80" * per_list) * lists
    assert per_list * lists > limits.max_items and len(nested) < 1_000_000
    start = time.perf_counter()
    with pytest.raises(codec.WireError, match=f"more than {limits.max_items} lists, maps and entries"):
        codec.unpack_observation(nested)
    assert time.perf_counter() - start < 1.0  # stops at the limit, does not build all 800k maps
    # Within the limits, ordinary nesting decodes.
    fine = {"a": [{"b": i} for i in range(1000)], "c": {str(i): [i] * 10 for i in range(100)}}
    assert codec.unpackb(codec.packb(fine)) == fine
    tight = codec.DecodeLimits(max_collection_len=4, max_items=100)
    with pytest.raises(codec.WireError, match="at most 4 entries"):
        codec.unpackb(codec.packb({"a": [1, 2, 3, 4, 5]}), limits=tight)


def test_ragged_droid_state_is_an_observation_error():
    ragged = {
        "observation/exterior_image_1_left": image(),
        "observation/joint_position": [[0.0, 1.0], [2.0]],
        "observation/gripper_position": 0.5,
    }
    with pytest.raises(keymap.KeyMapError, match=r"observation\['observation/joint_position'\]: expected a numeric"):
        mapper("droid")(ragged)


def test_error_texts_are_capped_and_keys_escaped(caplog):
    import logging

    from embodied_accel.serve import text as text_mod

    keys = {f"key_{i:06d}": 0 for i in range(100_000)}
    with pytest.raises(keymap.KeyMapError) as info:
        mapper()(keys)
    text = str(info.value)
    assert len(text) < 2000 and "(99990 more)" in text and "'key_000000'" in text
    assert text_mod.clip("x" * 1000, 100) == "x" * 100 + "... (900 more characters)"
    assert text_mod.clip("short", 100) == "short"

    logger = logging.getLogger("embodied_accel.test_serve")
    with caplog.at_level(logging.INFO, logger="embodied_accel.test_serve"):
        metrics.log_event(logger, logging.WARNING, "request_failed", error="bad key 'a\nINFO forged line'", kind="x")
    message = caplog.records[-1].getMessage()
    assert "\n" not in message and "\\n" in message and message.endswith("kind=x")
    with pytest.raises(keymap.KeyMapError) as info:
        mapper()({"a\nb": 1})
    assert "\n" not in str(info.value) and "'a\\nb'" in str(info.value)


def test_an_instruction_sent_both_as_text_and_as_token_ids_is_reported_once(caplog):
    mapper = keymap.ObservationMapper(
        "identity", ["observation.images.base_0_rgb"], "observation.state", has_tokenizer=True
    )
    message = {"prompt": "pick", "observation.language.tokens": np.array([2, 7]), "observation.state": np.zeros(2)}
    with caplog.at_level("WARNING", logger="embodied_accel.serve.keymap"):
        for _ in range(3):
            out, _ = mapper(message)
            assert "prompt" in out and "observation.language.tokens" not in out
    (record,) = [r for r in caplog.records if "both as text" in r.getMessage()]
    assert "using the text, ignoring the token ids" in record.getMessage()
