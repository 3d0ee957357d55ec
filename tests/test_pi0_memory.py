"""The memory a preset needs, said before it is built: parameter counts and the warning when RAM is short."""

import logging

import pytest
import torch

from embodied_accel import load_policy
from embodied_accel.models.pi0 import config as config_mod
from embodied_accel.models.pi0.config import PRESETS, parameter_count, report_memory_need, weight_bytes
from embodied_accel.models.pi0.model import Pi0Model
from embodied_accel.models.pi0.weights import weight_rules
from embodied_accel.ops import get_ops


@pytest.mark.parametrize("name", list(PRESETS))
def test_parameter_count_is_the_built_models(name):
    config = PRESETS[name]
    with torch.device("meta"):  # no memory, even at full size
        model = Pi0Model(config, get_ops("reference"), torch.bfloat16)
    params = dict(model.named_parameters())
    kept = {rule.target for rule in weight_rules(config) if rule.dtype == torch.float32}  # what the loader keeps in fp32
    count = parameter_count(config)
    assert count.total == sum(p.numel() for p in params.values())
    assert count.kept_fp32 == sum(p.numel() for name, p in params.items() if name in kept)
    assert weight_bytes(config, torch.bfloat16) == sum(p.numel() * (4 if n in kept else 2) for n, p in params.items())


def test_full_size_figures():
    assert 12.0 < weight_bytes(PRESETS["pi0"], torch.float32) / 2**30 < 12.1  # 3.24 B parameters
    assert 6.8 < weight_bytes(PRESETS["pi0"], torch.bfloat16) / 2**30 < 6.9


def test_available_memory_is_read_from_proc_meminfo():
    available = config_mod.available_host_memory_bytes()
    with open("/proc/meminfo") as meminfo:
        total_kb = int(next(line for line in meminfo if line.startswith("MemTotal:")).split()[1])
    assert available is not None and 0 < available <= total_kb * 1024


def test_warns_when_the_weights_exceed_available_memory(monkeypatch, caplog):
    monkeypatch.setattr(config_mod, "available_host_memory_bytes", lambda: 9 * 2**30)
    with caplog.at_level(logging.INFO, logger="embodied_accel"):
        need = report_memory_need(PRESETS["pi0"], torch.float32, "cpu")
    assert need == weight_bytes(PRESETS["pi0"], torch.float32)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert (
        "pi0 in float32 needs about 12.1 GiB of memory for its weights alone, more than the 9.0 GiB this machine has "
        "available" in warnings[0].getMessage()
    )
    assert "--dtype bfloat16 needs about 6.8 GiB" in warnings[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="embodied_accel"):
        report_memory_need(PRESETS["pi0"], torch.bfloat16, "cpu")  # 6.8 GiB fit in 9
        report_memory_need(PRESETS["pi0"], torch.float32, "meta")  # not host memory: no comparison
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "pi0: 3238.05 M parameters, about 6.8 GiB of weights in bfloat16 on cpu (9.0 GiB" in caplog.text


def test_load_policy_says_it_before_building(monkeypatch, caplog):
    monkeypatch.setattr(config_mod, "available_host_memory_bytes", lambda: 2**20)  # 1 MiB: even pi0-tiny is too big
    with caplog.at_level(logging.WARNING, logger="embodied_accel"):
        load_policy("pi0-tiny", progress=False)
    assert (
        "pi0-tiny in float32 needs about 1.2 MiB of memory for its weights alone, more than the 1.0 MiB" in caplog.text
    )
