"""The framework-free core every adapter talks to: :class:`EnergySession` and :class:`Decision`.

Every module here is private; import from this package. The data path reads top-down: the adapters'
hooks → :class:`EnergySession` (``_core``) → the started run (``_run``: backend, sampler, meter, timer,
event log) and the four parts the session owns and calls at each event, each with its own state: the
step path (``_scheduler``: which steps are measured, at what training-thread cost), the power-limit
steps (``_power_limit_steps``), the batch-size steps (``_batch_size_steps``) and the step reports
(``_step_reports``). Beside them: the rank exchanges (``_aggregate``, ``_agreement``) of the named
records that cross ranks (``_rank_records``), the JSONL records and logger metrics (``_log_records``),
the epoch ledger (``_ledger``), the node's CPU and DRAM figures (``_node``, ``_node_spans``) and the
running totals and checkpoint state (``_state``).
"""

from zeus_callbacks.session._core import Decision, EnergySession, default_gpu_indices
from zeus_callbacks.session._state import check_state

__all__ = ["Decision", "EnergySession", "check_state", "default_gpu_indices"]
