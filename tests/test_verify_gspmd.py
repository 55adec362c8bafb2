"""taps' plan against XLA's own partitioner, given taps' layouts as sharding constraints."""

from __future__ import annotations

import json

import taps
from taps.verify import compare_gspmd
from taps.verify.xla.devices import jax_with_devices

jax_with_devices(64)  # one JAX per test session: every module asks for the most any needs


def test_gpt_layer_against_the_partitioner():
    g = taps.models.gpt(hidden=64, heads=4, seq=16, batch=8)
    cluster = taps.Cluster(2, 8)
    # The report prices the paper's model (forward edges, gradients at the operators).
    plan = taps.search(g, cluster, taps.Pricing(step="forward")).plan
    report = compare_gspmd(plan)
    assert report.max_error < 1e-4
    rows = {(r.scope, r.phase): r for r in report.rows}
    # With every operand's layout fixed, the operators' own all_reduces are taps' exactly.
    for j, op in enumerate(g.ops):
        row = rows.get((f"o{j}", "forward"))
        if row is not None:
            assert (row.xla_bytes, row.xla_cross_node_bytes) == (
                row.taps_bytes,
                row.taps_cross_node_bytes,
            ), op.name
    # taps' side is taps' own price of the plan (bytes, at float32 instead of the graph's fp16).
    assert report.taps_bytes == 2 * taps.evaluate(
        plan.with_pricing(
            taps.Pricing(cost_model="volume", step="forward", gradient_dtype_bytes=None)
        )
    )
    # Where XLA reshards worse than taps' plan, it says so in its log; each warning is read.
    assert report.warnings and all("rematerialization" in w for w in report.warnings)
    assert any(r.rematerialized for r in report.rows)
    doc = json.loads(report.to_json())
    assert doc["taps_bytes"] == report.taps_bytes and len(doc["rows"]) == len(report.rows)


def test_a_reshape_edge_against_the_partitioner():
    g = taps.Graph("view")
    a = g.relu("a", g.input("x", (6, 16), requires_grad=True))
    g.relu("b", g.view("flat", a, (96,)))
    strategies = {"a": taps.Strategy([1, 16], [-1, 0]), "b": taps.Strategy([16], [0])}
    report = compare_gspmd(taps.Plan(g, taps.Cluster(2, 8), strategies))
    assert report.max_error == 0.0
    forward = [r for r in report.rows if r.phase == "forward"]
    assert [(r.what, r.taps_bytes, r.xla_bytes) for r in forward] == [("edge a -> b", 360, 360)]
