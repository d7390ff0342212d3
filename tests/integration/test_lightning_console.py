"""The Lightning callback's end-of-run summary comes after the progress bar has finished drawing (issue 31, B)."""

from __future__ import annotations

import io
import logging
import sys

import lightning.pytorch as L
import pytest
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

from tests.integration.helpers import virtual_config
from tests.integration.test_lightning import TinyRegressor, loaders
from zeus_callbacks import ZeusCallback

SUMMARY_START = "zeus-callbacks run "


def _fit_with_bar(tmp_path, monkeypatch, bar_kind: str) -> tuple[str, str]:
    """Fit with a progress bar and Lightning's log lines drawn into one stream; return it and the bar's last text."""
    stream = io.StringIO()
    if bar_kind == "rich":
        bar = RichProgressBar(refresh_rate=1, console_kwargs={"file": stream, "force_terminal": True, "width": 120})
        last_bar_text = "Epoch 1/1"
    else:
        monkeypatch.setattr(sys, "stdout", stream)  # Lightning's tqdm bars draw on sys.stdout
        bar = TQDMProgressBar(refresh_rate=1)
        last_bar_text = "Epoch 1: 100%"
    handler = logging.StreamHandler(stream)  # the summary and "Trainer.fit stopped" come through logging
    lightning_log = logging.getLogger("lightning.pytorch")
    lightning_log.addHandler(handler)
    try:
        trainer = L.Trainer(
            accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
            enable_model_summary=False, callbacks=[ZeusCallback(virtual_config(tmp_path)), bar],
        )  # fmt: skip
        train, val = loaders()
        trainer.fit(TinyRegressor(), train, val)
    finally:
        lightning_log.removeHandler(handler)
    return stream.getvalue(), last_bar_text


@pytest.mark.parametrize("bar_kind", ["rich", "tqdm"])
def test_the_summary_is_printed_after_the_progress_bar_has_finished(tmp_path, monkeypatch, bar_kind):
    """Printed while the bar was live, the summary had the bar drawn again under it (the tester's terminal)."""
    text, last_bar_text = _fit_with_bar(tmp_path, monkeypatch, bar_kind)
    assert text.count(SUMMARY_START) == 1
    summary_at = text.index(SUMMARY_START)
    assert last_bar_text in text  # the bar drew into the stream
    assert text.rindex(last_bar_text) < summary_at  # nothing of the bar after the summary: it had finished
    assert "`Trainer.fit` stopped" in text[:summary_at]
