"""The optimisers' agreements across ranks: a decision that changes hardware or stops training is taken together.

Each agreement is one collective exchange of a named record (:mod:`~zeus_callbacks.session._rank_records`)
followed by a pure decision from the gathered records (:func:`decide_power_limit`, :func:`decide_stop`),
so every rank, seeing the same records, decides alike.

Power limits (Zeus, NSDI '23 §4.3): the main rank's profiler decides from its own GPU;
every rank runs the same limit from the same step; observe mode anywhere is observe
mode everywhere. Early stopping (§4.4): every ``batch_size.stop_agreement_steps`` steps
and at each evaluation the ranks share their energy and time so far; the main rank's
rule is applied to the run's energy (summed over GPUs) and time (the slowest rank's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zeus_callbacks.optimizers.batch_size import EarlyStopRule
from zeus_callbacks.session._aggregate import Collectives
from zeus_callbacks.session._rank_records import MaxPower, PowerLimitVote, Ready, StopVote, gathered

TARGET_BY_MAIN = "target reached (decided by the main process)"
"""The stop reason on a rank that did not see the target itself."""


# ----------------------------------------------------------------------- power limits
def every_rank_ready(ranks: Collectives, ready: bool) -> bool:
    """Whether every rank can profile power limits (``ready``: this one has a controller; collective)."""
    return bool(Ready.reduce(gathered(ranks, Ready(1.0 if ready else 0.0))).ready)


@dataclass(frozen=True)
class PowerLimitVerdict:
    """What every rank does after one power-limit exchange.

    Attributes:
        observe_everywhere: Some rank cannot change its limit: every rank enters observe mode.
        target_W: The main rank's limit, which the other ranks apply (W).
        settled: The main rank's profiling is over: no more exchanges.
    """

    observe_everywhere: bool
    target_W: float
    settled: bool


def decide_power_limit(votes: Sequence[PowerLimitVote]) -> PowerLimitVerdict:
    """The agreed power limit from the ranks' votes (rank order; pure): the main rank's limit, observe anywhere wins."""
    agreed = PowerLimitVote.reduce(votes)
    return PowerLimitVerdict(bool(agreed.observe), agreed.limit_W, bool(agreed.done))


def exchange_power_limit(ranks: Collectives, limit_W: float, *, done: bool, observe: bool) -> PowerLimitVerdict:
    """Share this rank's limit in force (W) and state; decide the limit every rank runs from this step (collective).

    ``done``: this rank's profiling is over (or it observes only); ``observe``: it is in observe mode
    (no permission, read-only).
    """
    return decide_power_limit(gathered(ranks, PowerLimitVote(limit_W, 1.0 if done else 0.0, 1.0 if observe else 0.0)))


# ------------------------------------------------------------------- early stopping
def agree_max_power_W(ranks: Collectives, max_power_W: float) -> float:
    """The sum of every rank's GPUs' maximum power (the cost's ``MaxPower``; collective)."""
    return MaxPower.reduce(gathered(ranks, MaxPower(max_power_W))).max_power_W


def share_stop_rule(
    ranks: Collectives, rule: EarlyStopRule | None, failure: BaseException | None
) -> EarlyStopRule | None:
    """The main rank's early-stop rule on every rank, or its failure to start raised on every rank (collective).

    Raises:
        BaseException: ``failure`` on this rank, or a RuntimeError naming the main rank's failure.
    """
    return ranks.broadcast_outcome(rule, failure, "start the batch-size bandit")


@dataclass
class StopAgreement:
    """Several processes with the bandit on: the state of the early-stop agreement.

    Attributes:
        active: Stop decisions are exchanged (at evaluations and every ``every_steps`` steps).
        cost: The cost is compared too (there is a best cost to compare with).
        converged: The target was reached on the main rank (agreed): no stop on cost (Zeus §4.4).
        rule: The main rank's rule, on every rank.
    """

    active: bool = False
    cost: bool = False
    converged: bool = False
    rule: EarlyStopRule | None = None

    def start(self, rule: EarlyStopRule | None, *, target_set: bool, stop_at_target: bool) -> None:
        """Start the agreement with the main rank's rule (pure).

        Nothing can stop the run (no best cost yet, no target to stop at): no exchanges at all.
        """
        self.rule = rule
        self.cost = rule is not None
        self.active = self.cost or (target_set and stop_at_target)


@dataclass(frozen=True)
class StopVerdict:
    """The outcome of one stop exchange.

    Attributes:
        reason: Why training stops now, or None.
        on_cost: The reason came from the cost rule (the main rank records it as early-stopped).
    """

    reason: str | None
    on_cost: bool = False


def decide_stop(
    votes: Sequence[StopVote], target_reason: str | None, agreement: StopAgreement, *, stop_at_target: bool
) -> StopVerdict:
    """Decide early stopping from the ranks' votes; update ``agreement``.

    Pure but for ``agreement``'s fields (converged, cost, active), which every rank
    updates alike from the same rows. ``target_reason``: this rank's reason to stop at the
    target (the main rank's), or None.
    """
    verdict = StopVerdict(None)
    agreed = StopVote.reduce(votes)  # energy summed, the slowest time, a target or convergence anywhere
    if agreed.target:
        verdict = StopVerdict(target_reason or TARGET_BY_MAIN)
    elif agreed.converged:
        agreement.converged = True  # a converged run is not stopped on cost (Zeus §4.4)
        agreement.cost = False
    elif agreement.cost and agreement.rule is not None:
        verdict = StopVerdict(agreement.rule.reason(agreed.energy_J, agreed.time_s), on_cost=True)
    if verdict.reason is not None or (agreement.converged and not stop_at_target):
        agreement.active = agreement.cost = False  # nothing left to agree on
    return verdict


def exchange_stop(
    ranks: Collectives,
    agreement: StopAgreement,
    *,
    energy_J: float,
    time_s: float,
    target_reason: str | None,
    converged: bool,
    stop_at_target: bool,
) -> StopVerdict:
    """Share this rank's energy, time and verdicts; decide early stopping together (collective).

    Called at the same points on every rank (every ``batch_size.stop_agreement_steps``
    steps and at each evaluation end), never elsewhere. ``energy_J`` (J) and ``time_s`` (s):
    this rank's run so far; ``converged``: its bandit converged (the main rank's only).
    """
    vote = StopVote(energy_J, time_s, 1.0 if target_reason else 0.0, 1.0 if converged else 0.0)
    return decide_stop(gathered(ranks, vote), target_reason, agreement, stop_at_target=stop_at_target)
