"""Pairing predicted with issued collectives (``taps.verify.result.match``) against a plain scan
of the issued list, on random predictions and issues."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from taps.verify.result import Measured, Predicted, match

_KINDS = ("all_gather", "all_reduce", "all_to_all")
_GROUPS = (((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0, 1, 2, 3),))


def _scan(predicted, measured):
    """The pairing by the definition: each prediction takes the first free issued collective of
    its scope, phase, kind, groups and bytes; those left take the first of their scope, phase
    and kind; a leftover whose ``same`` twin was paired is shared, else missing; the rest of
    the issued list is left over, in order."""
    left = list(measured)
    out, unmatched, done = [], [], {}
    for p in predicted:
        key = (p.scope, p.phase, p.kind, p.groups, p.bytes)
        hit = next(
            (i for i, (s, ph, m) in enumerate(left) if (s, ph, m.kind, m.groups, m.bytes) == key),
            None,
        )
        if hit is None:
            unmatched.append(p)
        else:
            out.append(("ok", p.what, left.pop(hit)[2].name))
            if p.same is not None:
                done.setdefault(p.same, p.scope)
    for p in unmatched:
        key = (p.scope, p.phase, p.kind)
        hit = next((i for i, (s, ph, m) in enumerate(left) if (s, ph, m.kind) == key), None)
        if hit is None:
            out.append(("shared" if p.same in done else "missing", p.what, ""))
        else:
            out.append(("differs", p.what, left.pop(hit)[2].name))
    return out, [m.name for _, _, m in left]


_collective = st.tuples(
    st.sampled_from(("e1", "e2", "o1")),
    st.sampled_from(("forward", "backward")),
    st.sampled_from(_KINDS),
    st.sampled_from(_GROUPS),
    st.sampled_from((64, 128)),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(_collective, st.sampled_from((None, "a", "b"))), max_size=12),
    st.lists(_collective, max_size=12),
)
def test_pairing_equals_a_plain_scan(predicted, issued):
    preds = [
        Predicted(kind, groups, size, scope, phase, f"p{i}", same)
        for i, ((scope, phase, kind, groups, size), same) in enumerate(predicted)
    ]
    measured = [
        (scope, phase, Measured(kind, f"m{i}", groups, len(groups[0]), "f32", size, size))
        for i, (scope, phase, kind, groups, size) in enumerate(issued)
    ]
    rows = match(preds, measured, {"e1": "e1", "e2": "e2", "o1": "o1"})
    paired, left = _scan(preds, measured)
    got = [(r.status, r.what.split(" (")[0], r.hlo_name) for r in rows[: len(paired)]]
    assert got == paired
    assert [r.hlo_name for r in rows[len(paired) :]] == left
