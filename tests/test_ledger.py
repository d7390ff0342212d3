"""The epoch ledger's arithmetic (``zeus_callbacks.session.ledger.close_ledger``), over random epochs."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from zeus_callbacks.session.ledger import close_ledger
from zeus_callbacks.session.rank_records import LedgerColumns

energy = st.floats(min_value=0.0, max_value=1e5, allow_nan=False)
count = st.integers(min_value=0, max_value=500)


@given(warmup_J=energy, steps_J=energy, eval_J=energy, gap_J=energy, steps_n=count, extra=count, warmup_n=count)
def test_the_ledger_closes_and_is_never_negative(warmup_J, steps_J, eval_J, gap_J, steps_n, extra, warmup_n):
    """Windows that lie inside the epoch (the epoch holds them plus a gap): both splits close, no part < 0."""
    epoch_J = warmup_J + steps_J + eval_J + gap_J
    epoch_s = epoch_J / 250.0  # a constant 250 W, so times follow energies
    row = LedgerColumns(warmup_J, warmup_J / 250, warmup_n, steps_J, steps_J / 250, steps_n, eval_J, eval_J / 250, 1.0)
    ledger = close_ledger(epoch_J, epoch_s, row, steps_taken=warmup_n + steps_n + extra)
    exact = [ledger[k] for k in ("warmup_J", "steps_windowed_J", "eval_J", "unwindowed_J")]
    assert all(v is not None and v >= 0 for v in exact)
    assert math.isclose(math.fsum(exact), epoch_J, rel_tol=1e-9, abs_tol=1e-9)
    assert ledger["steps_estimated"] == extra
    if ledger["other_J"] is None:
        assert ledger["other_reason"]  # never null without saying why
        if steps_n == 0 and extra:
            assert "no" in ledger["other_reason"] and ledger["steps_J"] is None
    else:
        parts = [ledger[k] for k in ("warmup_J", "steps_J", "eval_J", "other_J")]
        assert min(parts) >= 0
        assert math.isclose(math.fsum(parts), epoch_J, rel_tol=1e-9, abs_tol=1e-9)
    if not extra:  # every step has a window: other is exactly the gap, never unknown
        assert ledger["other_J"] is not None
        assert math.isclose(ledger["other_J"], gap_J, rel_tol=1e-9, abs_tol=1e-6)


def test_an_unknown_epoch_gives_no_rest():
    ledger = close_ledger(math.nan, 1.0, LedgerColumns(1.0, 0.1, 1, 2.0, 0.2, 2, 0.0, 0.0, 0), steps_taken=3)
    assert ledger["other_J"] is None and ledger["unwindowed_J"] is None
    assert ledger["other_reason"] == "no power sample covers the epoch"


def test_windows_that_hold_more_than_the_epoch_are_a_reported_defect():
    ledger = close_ledger(10.0, 1.0, LedgerColumns(0.0, 0.0, 0, 12.0, 1.2, 3, 0.0, 0.0, 0), steps_taken=3)
    assert ledger["other_J"] is None and "overlap" in ledger["other_reason"]
