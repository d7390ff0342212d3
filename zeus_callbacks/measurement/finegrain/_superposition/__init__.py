"""Superposition (FinGraV, arXiv 2412.12426, challenge C1): many executions' samples → one power profile.

Modules by job: :mod:`.settings` (what to fit), :mod:`.timeline` (executions, sample
intervals and pauses on the sample clock), :mod:`.intervals` (interval arithmetic),
:mod:`.design` (the linear model), :mod:`.solve` (penalised least squares),
:mod:`.bootstrap` (intervals over executions), :mod:`.summary` (energies per execution),
:mod:`.results` (what is reported), :mod:`.fit` (:func:`superpose`, the pipeline).
"""

from zeus_callbacks.measurement.finegrain._superposition.bootstrap import interval_reason, min_executions_for_interval
from zeus_callbacks.measurement.finegrain._superposition.fit import superpose
from zeus_callbacks.measurement.finegrain._superposition.results import ProfileEstimate, Superposition
from zeus_callbacks.measurement.finegrain._superposition.settings import DROPPED, Mode, SuperposeSettings

__all__ = [
    "DROPPED",
    "Mode",
    "ProfileEstimate",
    "SuperposeSettings",
    "Superposition",
    "interval_reason",
    "min_executions_for_interval",
    "superpose",
]
