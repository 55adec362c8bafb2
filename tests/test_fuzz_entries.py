"""Fuzz targets for the entry points tests/test_fuzz.py does not cover: saved plans (JSON), cluster
TOML files, the Python API given values of the wrong type or range, and the torch front end given
random small modules. Each either works or raises the one error its entry point documents, with
a message of one line: never another exception, a traceback or a Rust panic."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import taps
from test_fuzz import JSON, NASTY, _paths, _replaced

SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _one_line(error: BaseException) -> None:
    assert str(error).strip()
    assert "\n" not in str(error).strip()


def _plan_document() -> dict:
    graph = taps.models.mlp(8, (8, 16, 8))
    result = taps.search(graph, taps.Cluster(1, 4))
    return json.loads(result.plan.to_json())


PLAN = _plan_document()
PLAN_PATHS = list(_paths(PLAN))


def _load_plan(text: str | bytes) -> None:
    try:
        plan = taps.Plan.from_json(text)
    except taps.TapsError as e:  # PlanFileError, or the graph's or cluster's own error
        _one_line(e)
    else:
        assert isinstance(taps.evaluate(plan), float)


@SETTINGS
@given(st.binary(max_size=300) | JSON.map(json.dumps))
def test_arbitrary_text_is_a_plan_or_one_line(text):
    _load_plan(text)


@SETTINGS
@given(st.data())
def test_one_field_of_a_saved_plan_replaced(data):
    path = data.draw(st.sampled_from(PLAN_PATHS))
    _load_plan(json.dumps(_replaced(PLAN, path, data.draw(NASTY | JSON))))


TOML_VALUES = st.sampled_from(
    [
        "8",
        "0",
        "-1",
        "3",
        "1e400",
        '"h100"',
        '"nope"',
        "nan",
        "inf",
        "[]",
        "{}",
        '"flat"',
        '"shared"',
        "1.5",
        "9223372036854775807",
        "true",
        "[[8, 1e9, 0.0]]",
        '"\\u0000"',
    ]
)
TOML_KEYS = st.sampled_from(
    ["devices", "bandwidth", "latency", "device", "device_memory", "replicas", "name", "levels"]
)


@SETTINGS
@given(st.data())
def test_cluster_files_are_a_cluster_or_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("toml") / "c.toml"
    lines = ["[[level]]"]
    for _ in range(data.draw(st.integers(0, 6))):
        if data.draw(st.booleans()):
            lines.append("[[level]]")
        lines.append(f"{data.draw(TOML_KEYS)} = {data.draw(TOML_VALUES)}")
    raw = data.draw(st.booleans())
    content = data.draw(st.binary(max_size=120)) if raw else "\n".join(lines).encode()
    path.write_bytes(content)
    try:
        cluster = taps.Cluster.preset(str(path), data.draw(st.sampled_from([1, 2, 3, 0])))
    except taps.TapsError as e:
        _one_line(e)
    else:
        assert cluster.num_devices >= 1


WRONG = st.sampled_from(
    [
        None,
        "mlp",
        3,
        -1,
        0,
        2.5,
        math.nan,
        math.inf,
        [],
        {},
        (1, 2),
        object(),
        b"x",
        True,
        2**2000,  # beyond a float and a 64-bit int
        -(2**2000),
        np.float64("nan"),
        np.int64(2),
        np.True_,
        ["adam"],
    ]
)


def _api_calls(graph: taps.Graph, cluster: taps.Cluster, plan: taps.Plan, v: object):
    """One call per public entry point, with ``v`` in one argument."""
    return [
        lambda: taps.search(v, cluster),
        lambda: taps.search(graph, v),
        lambda: taps.search(graph, cluster, v),
        lambda: taps.search(graph, cluster, memory_limit=v),
        lambda: taps.search(graph, cluster, time_limit=v),
        lambda: taps.evaluate(v),
        lambda: taps.breakdown(v),
        lambda: taps.Pricing(cost_model=v),
        lambda: taps.Pricing(zero=v),
        lambda: taps.Cluster(v, 8),
        lambda: taps.Cluster(2, v),
        lambda: taps.Cluster(2, 8, v),
        lambda: taps.Cluster(2, 8, device=v),
        lambda: taps.Plan(graph, cluster, v),
        lambda: taps.Plan(v, cluster, plan.strategies),
        lambda: plan.with_pricing(v),
        lambda: taps.Graph(v),
        lambda: graph.tie(v),
        lambda: taps.Layout(v, [0]),
        lambda: taps.Layout([4], v),
        lambda: taps.enumerate_strategies(v, 8),
        lambda: taps.export.to_jax(v),
        lambda: taps.export.to_dtensor(v),
        lambda: taps.export.to_dtensor(plan, v),
        lambda: taps.export.export(v, "jax"),
        lambda: taps.export.export(plan, v),
        lambda: taps.search(graph, cluster, pipeline=v),
        lambda: taps.search(graph, cluster, tie=v),
        lambda: taps.search(graph, cluster, replicate=v),
        lambda: taps.strategies_for(v, "fc1", cluster),
        lambda: taps.strategies_for(graph, "fc1", v),
        lambda: taps.Pricing(compute=v),
        lambda: taps.Pricing(optimizer=v),
        lambda: taps.Pricing(checkpoint=v),
        lambda: taps.Pricing(fsdp=v),
        lambda: taps.Pricing(parameter_bytes=v),
        lambda: taps.Pipeline(stages=v),
        lambda: taps.Pipeline(microbatches=v),
        lambda: taps.Plan(graph, cluster, plan.strategies, stages=v),
        lambda: taps.Plan(graph, cluster, plan.strategies, pipeline=v),
        lambda: taps.Plan.from_json(plan.to_json(), graph=v),
        lambda: taps.models.mlp(8, v),
        lambda: taps.models.megatron(v),
        lambda: taps.Cluster.hierarchy(v),
        lambda: taps.Cluster.hierarchy([(4, v, 1e-6)]),
        lambda: graph.input(v, [4]),
        lambda: taps.Graph().input("x", [v]),
    ]


GRAPH = taps.models.mlp(8, (8, 16, 8))
CLUSTER = taps.Cluster(1, 4)
SAVED = taps.search(GRAPH, CLUSTER).plan


CALLS = len(_api_calls(GRAPH, CLUSTER, SAVED, None))


@settings(max_examples=300, deadline=None)
@given(WRONG, st.integers(0, CALLS - 1))
def test_the_python_api_refuses_wrong_values_in_one_line(value, which):
    """Only a TapsError (a ValueError) or a TypeError: a plain ValueError is Python's or
    numpy's from inside taps (an int too long to print, a negative seed)."""
    call = _api_calls(GRAPH, CLUSTER, SAVED, value)[which]
    try:
        call()
    except (taps.TapsError, TypeError) as e:
        _one_line(e)


torch = pytest.importorskip("torch")
LAYERS = st.sampled_from(["linear", "relu", "gelu", "layernorm", "dropout", "softmax", "residual"])


class _Residual(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(width, width)

    def forward(self, x):
        return x + self.inner(x)


def _module(kinds: list[str], width: int) -> torch.nn.Module:
    make = {
        "linear": lambda: torch.nn.Linear(width, width),
        "relu": torch.nn.ReLU,
        "gelu": torch.nn.GELU,
        "layernorm": lambda: torch.nn.LayerNorm(width),
        "dropout": lambda: torch.nn.Dropout(0.1),
        "softmax": lambda: torch.nn.Softmax(-1),
        "residual": lambda: _Residual(width),
    }
    return torch.nn.Sequential(*(make[k]() for k in kinds))


@settings(max_examples=25, deadline=None)
@given(st.lists(LAYERS, min_size=1, max_size=5), st.sampled_from([4, 6, 8]), st.integers(1, 3))
def test_random_small_modules_convert_and_search_or_fail_in_one_line(kinds, width, batch):
    with torch.device("meta"):
        module = _module(kinds, width)
        x = torch.randn(batch, 3, width)
    try:
        graph = taps.from_torch(module, x)
    except taps.TapsError as e:
        _one_line(e)
        return
    params = sum(p.numel() for p in module.parameters())
    assert graph.num_parameters() == params
    result = taps.search(graph, taps.Cluster(1, 2))
    assert math.isfinite(result.cost)
