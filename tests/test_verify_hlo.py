"""The HLO reader: collectives, their groups in the three printed forms, async pairs, combined
operands and bytes, against groups worked out by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taps._core import Cluster, Layout, plan_redistribution
from taps.verify import VerifyError, collectives, replica_groups
from taps.verify.prediction import predicted_steps


def _sorted(groups):
    return sorted(sorted(g) for g in groups)


def test_explicit_groups():
    assert replica_groups("{{0,2},{1,3}}, dimensions={0}", 4) == [[0, 2], [1, 3]]
    assert replica_groups("{}, to_apply=%add", 4) == [[0, 1, 2, 3]]


def test_iota_groups():
    assert replica_groups("[2,4]<=[8]", 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # arange(8) as [4,2], transposed: the groups hold ranks 2 apart.
    assert replica_groups("[2,4]<=[4,2]T(1,0), use_global_device_ids=true", 8) == [
        [0, 2, 4, 6],
        [1, 3, 5, 7],
    ]
    assert _sorted(replica_groups("[4,2]<=[2,2,2]T(0,2,1)", 8)) == [
        [0, 2], [1, 3], [4, 6], [5, 7]
    ]  # fmt: skip


def test_mesh_groups_with_sub_axes():
    # Ranks 0..7 as mesh a=2 (major), b=4: varying b fixes a.
    assert replica_groups("mesh[a=2,b=4] {b}", 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert replica_groups("mesh[a=2,b=4] {a}", 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # b:(1)2 is b's major half (b = 2 x 2): ranks 2 apart within a row of 4.
    assert replica_groups("mesh[a=2,b=4] {b:(1)2}", 8) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    # b:(2)2 is b's minor half, with a: ranks that differ in a and the low bit.
    assert _sorted(replica_groups('mesh["a"=2,"b"=4] {a,b:(2)2}', 8)) == [
        [0, 1, 4, 5], [2, 3, 6, 7]
    ]  # fmt: skip
    # An explicit device order: position i of the mesh is device ids[i].
    assert replica_groups("mesh[a=2,b=2], device_ids=(3,2,1,0) {b}", 4) == [[3, 2], [1, 0]]
    # As XLA prints it: quoted names, the device order in the short iota form.
    ids = "device_ids=([2,2,4]T(2,1,0))"
    assert _sorted(replica_groups(f"mesh['a'=4,'b'=2,'c'=2], {ids} {{'a'}}", 16)) == [
        [0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]
    ]  # fmt: skip
    assert _sorted(replica_groups(f"mesh['a'=4,'b'=2,'c'=2], {ids} {{'c'}}", 16)) == [
        [0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], [7, 15]
    ]  # fmt: skip
    with pytest.raises(VerifyError, match="mesh axis"):
        replica_groups("mesh[a=2,b=4] {c}", 8)


def test_bad_groups():
    with pytest.raises(VerifyError, match="replica groups"):
        replica_groups("<<nonsense>>", 4)


HLO = """
HloModule jit_step, entry_computation_layout={()->f32[4,8]{1,0}}

ENTRY %main {
  %p = f32[2,8]{1,0} parameter(0)
  %ag = f32[4,8]{1,0} all-gather(%p), channel_id=1, replica_groups=[4,2]<=[8], dimensions={0}, use_global_device_ids=true, metadata={op_name="jit(f)/taps_e0/all_gather_invariant"}
  %ar-start = f32[2,8]{1,0} all-reduce-start(%p), channel_id=2, replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add, metadata={op_name="jit(f)/transpose(jvp())/taps_o1/psum"}
  %ar-done = f32[2,8]{1,0} all-reduce-done(%ar-start)
  %a2a = (bf16[1,8]{1,0}, bf16[1,8]{1,0}) all-to-all(%x, %y), channel_id=3, replica_groups={{0,1},{2,3},{4,5},{6,7}}
  %ags = (f32[2,8]{1,0}, f32[4,8]{1,0}) all-gather-start(%p), channel_id=4, replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}
  %agd = f32[4,8]{1,0} all-gather-done(%ags)
  %both = (f32[8]{0}, f32[2,2]{1,0}) all-reduce(%u, %v), channel_id=5, replica_groups=[1,8]<=[8], to_apply=%add
  %cp = f32[16]{0} collective-permute(%p), channel_id=6, source_target_pairs={{0,1},{1,0}}
  %rs = f32[1,8]{1,0} reduce-scatter(%p), channel_id=7, replica_groups=[4,2]<=[8], dimensions={0}, to_apply=%add
  ROOT %t = f32[4,8]{1,0} copy(%ag)
}
"""  # noqa: E501


def test_collectives_of_a_module():
    got = collectives(HLO, 8)
    assert [(c.kind, c.name, c.group_size, c.in_bytes, c.bytes, c.is_async) for c in got] == [
        ("all_gather", "ag", 2, 64, 64, False),  # receives (g-1) x its 64 bytes
        ("all_reduce", "ar-start", 4, 64, 96, True),  # 2 (g-1)/g x 64
        ("all_to_all", "a2a", 2, 32, 16, False),  # two bf16 blocks of 8: (g-1)/g x 32
        ("all_gather", "ags", 2, 64, 64, True),
        ("all_reduce", "both[0]", 8, 32, 56, False),  # a combined all-reduce: one per operand
        ("all_reduce", "both[1]", 8, 16, 28, False),
        ("collective_permute", "cp", 2, 64, 64, False),
        ("reduce_scatter", "rs", 2, 64, 32, False),
    ]
    assert got[0].groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert got[3].groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert got[6].groups == ((0, 1), (1, 0))
    assert got[1].op_name == "jit(f)/transpose(jvp())/taps_o1/psum"
    assert got[2].dtype == "bf16"


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), max_size=2),
    log_g=st.integers(1, 3),
    dtype=st.sampled_from([("f32", 4), ("bf16", 2), ("f64", 8)]),
)
def test_all_reduce_bytes_are_taps_price(shape, log_g, dtype):
    """A compiled all-reduce of any shape (a scalar's too: 1.5 elements over 4 devices) reads
    as the bytes taps predicts for the all_reduce of its partial sums, whole elements."""
    g = 2**log_g
    name, itemsize = dtype
    dims = ",".join(map(str, shape))
    text = (
        "ENTRY %main {\n"
        f"  %ar = {name}[{dims}]{{0}} all-reduce(%p), channel_id=1, "
        f"replica_groups=[1,{g}]<=[{g}], to_apply=%add\n}}"
    )
    (got,) = collectives(text, g)
    partial = Layout(shape, [g], [-1] * len(shape), partial=[0])
    whole = Layout(shape, [g], [-1] * len(shape))
    plan = plan_redistribution(partial, whole)
    (predicted,) = predicted_steps(plan, Cluster(1, g), itemsize, "e0", "edge")
    assert predicted.kind == got.kind == "all_reduce"
    assert got.bytes == predicted.bytes
    assert got.bytes % itemsize == 0
