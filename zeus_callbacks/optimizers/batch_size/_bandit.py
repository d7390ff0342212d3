"""Batch-size optimisation across recurrences of a job (Zeus, NSDI '23, §4.2–4.4).

A recurring job (same ``job_id``) asks :meth:`BatchSizeBandit.suggest` for a batch size before it
builds its data loaders, trains, and reports the outcome with :meth:`BatchSizeBandit.report`. An
arm's reward is the negated ZeusCost to reach the target (:mod:`~zeus_callbacks.optimizers.cost`).
The rules and why each departs from Zeus are in docs/batch_size.md ("How it chooses"):

**Pruning (§4.4).** Round ``r`` starts at ``b_r`` (round 0: the default; later: the previous
round's cheapest arm), tries the surviving sizes below it in decreasing order, then those above it
in increasing order; a direction ends at the first size that does not converge or, beyond Zeus,
costs more than a pruning factor × the round's cheapest converged size. The
sizes that converged survive; after ``pruning_rounds`` rounds Thompson sampling runs on them. While
no run of a job with a target has reached it, a run that does not converge holds the round's start.

**Gaussian Thompson sampling (§4.2)**, on cost ``x`` (lower is better). For arm ``a``
with observations ``x_i`` and weights ``w_i`` (1; ``γ^age`` with a discount; 0 outside a
window)::

    n_a = Σ w_i                     x̄_a = Σ w_i x_i / n_a
    r   = Σ_a Σ_i w_i (x_i / x̄_a − 1)² / Σ_a (n_a − 1)    relative noise variance, pooled over
                                                          the arms with n_a > 1 (0 if none)
    σ²_a = max(r, ρ²) · x̄_a²                  noise variance with a floor (ρ = noise_floor_rel)
    μ0  = mean of every observed cost of the job  τ0 = 1 / (κ · μ0)²   (κ = prior_std_rel)
    τn  = τ0 + n_a / σ²_a                         μn = (τ0 μ0 + (n_a / σ²_a) x̄_a) / τn

and each round draws ``θ_a ~ N(μn, 1/τn)`` for the arms not eliminated by their lower
confidence bound (:func:`eliminate_arms`) and plays the lowest draw, or, among the draws
within ``satisficing_rel`` of it, the arm with the lowest ``μn`` (:func:`satisficing_choice`).
``r`` uses completed runs only (an early-stopped cost is censored, not a draw of the noise); in the
arm's own mean an early-stopped cost ``c`` counts at its tail mean ``E[X | X > c]``
(:func:`gaussian_tail_mean`). The generator's state is persisted in the store after every draw.

**Early stopping (§4.4).** A run whose cost exceeds ``beta_knob × min_cost`` (the lowest cost of
a *converged* trial) stops; its cost is still an observation of its arm. In the Thompson phase a
run of an arm other than the best also stops past :meth:`BatchSizeBandit.explore_stop_threshold`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

import numpy as np

from zeus_callbacks.optimizers.batch_size._bandit_settings import BanditSettings
from zeus_callbacks.optimizers.batch_size._bandit_state import StoredState, read_state
from zeus_callbacks.optimizers.batch_size._maths import (
    ArmPosterior,
    eliminate_arms,
    gaussian_posterior,
    gaussian_tail_means,
    observation_weights,
    pooled_relative_variance,
    prior_from_costs,
    satisficing_choice,
)
from zeus_callbacks.optimizers.batch_size._observations import (
    arm_failures,
    best_target_value,
    failure_reason,
    is_observable_cost,
    measurable_or_none,
    observation_problem,
)
from zeus_callbacks.store._base import BanditState, OutcomeUpdate, Store, TrialRecord

logger = logging.getLogger(__name__)

_bandit_update_hook: Callable[[], None] | None = None
"""Test hook, called inside the report's store transaction before it commits: a fault test SIGKILLs there."""


class BanditPhase(str, Enum):
    """Phase of the bandit: ``pruning`` (deterministic exploration) → ``thompson`` (sampling)."""

    PRUNING = "pruning"
    THOMPSON = "thompson"


@dataclass(frozen=True)
class Suggestion:
    """A batch size handed to one recurrence.

    Attributes:
        batch_size: The batch size to train with.
        trial_id: The store's trial of this recurrence (report it with this id).
        phase: ``"pruning"`` or ``"thompson"``.
        round: Pruning round (or the number of rounds, in the Thompson phase).
    """

    batch_size: int
    trial_id: int
    phase: str
    round: int


# -- the stateful bandit -------------------------------------------------------------------
class BatchSizeBandit:
    """Pruning + Gaussian Thompson sampling over batch sizes, persisted in a :class:`Store`.

    Several processes may share the store: the state changes in one atomic store update. During
    pruning, concurrent recurrences get the same candidate; only the report of the candidate the
    pruning waits for moves it on (the others still count as observations).

    Args:
        store: Where trials and the bandit state live.
        job_id: The recurring job.
        settings: :class:`BanditSettings`.

    Example:
        >>> bandit = BatchSizeBandit(store, "nightly", BanditSettings((32, 64, 128), 64))  # doctest: +SKIP
        >>> s = bandit.suggest()                                               # doctest: +SKIP
        >>> bandit.report(s.trial_id, energy_J=..., time_s=..., cost=..., converged=True)  # doctest: +SKIP
    """

    def __init__(self, store: Store, job_id: str, settings: BanditSettings) -> None:
        self.store = store
        self.job_id = job_id
        self.settings = settings

    # -- state -------------------------------------------------------------------------
    def _initial_state(self) -> StoredState:
        s = self.settings
        return StoredState(
            phase=BanditPhase.PRUNING.value,
            round=0,
            direction="start",
            start=s.default_batch_size,
            candidate=s.default_batch_size,
            survivors=list(s.batch_sizes),
            round_results={},
            descending=False,
            min_cost=None,
            rng=np.random.Generator(np.random.PCG64(s.seed)).bit_generator.state,
            batch_sizes=list(s.batch_sizes),
        )

    def _state(self, current: BanditState) -> StoredState:
        if not current.state:
            return self._initial_state()
        state = read_state(current.state, self.store.location, self.job_id)
        if state.min_cost is not None and not is_observable_cost(state.min_cost):
            state = state.replace(min_cost=None)  # written by an older version from a bad run: not a cost
        if state.batch_sizes != list(self.settings.batch_sizes):
            logger.warning(
                "zeus-callbacks: job %s's stored batch sizes %s differ from the configured %s; keeping the stored ones",
                self.job_id,
                state.batch_sizes,
                list(self.settings.batch_sizes),
            )
        return state

    def _current(self) -> StoredState:
        return self._state(self.store.get_bandit(self.job_id) or BanditState(self.job_id))

    def state(self) -> dict[str, Any]:
        """The job's bandit state as stored (initial state if none yet); typed: :class:`StoredState`."""
        return self._current().to_stored()

    @property
    def min_cost(self) -> float | None:
        """Lowest cost of a converged trial of the job, or None."""
        return self._current().min_cost

    def early_stop_threshold(self) -> float | None:
        """The factor of :meth:`early_stop_factor` × ``min_cost``: a run costing more stops; None: no threshold yet.

        While pruning, the factor is ``min(beta_knob, prune ratio)``: a candidate that dear ends its
        direction whether or not it would converge, so finishing it buys nothing.
        """
        factor = self.early_stop_factor()
        return None if factor is None else factor[1] * factor[2]

    def early_stop_factor(self) -> tuple[str, float, float] | None:
        """The factor that sets :meth:`early_stop_threshold`: ``(setting name, factor, min_cost)``.

        The name (``beta_knob``, or the pruning factor's setting when that is lower while pruning)
        lets a stop say why.

        Returns:
            The setting's name, its value and the best converged cost (J-equivalent); None
            while there is no threshold (no converged run yet, or ``beta_knob`` None).
        """
        state = self._current()
        min_cost = state.min_cost
        beta = self.settings.beta_knob
        if min_cost is None or beta is None:
            return None
        prune = self._prune_factor(state)
        if state.phase == BanditPhase.PRUNING.value and prune is not None and prune[1] < beta:
            return prune[0], prune[1], float(min_cost)
        return "beta_knob", beta, float(min_cost)

    def _prune_factor(self, state: StoredState) -> tuple[str, float] | None:
        """The candidate's pruning factor and the setting it comes from; None without ``prune_cost_ratio``.

        A *descending* direction (its last size lowered the round's cheapest converged cost) gets
        ``prune_cost_ratio``: the optimum may lie further on, and one run that took more epochs than
        usual (up to 7/4 of the usual count on the traces) must not end it. Any other candidate gets
        ``prune_cost_ratio_no_descent`` when set: nothing points past it (docs/batch_size.md).
        """
        s = self.settings
        if s.prune_cost_ratio is None:
            return None
        if state.descending or s.prune_cost_ratio_no_descent is None:
            return "prune_cost_ratio", s.prune_cost_ratio
        return "prune_cost_ratio_no_descent", s.prune_cost_ratio_no_descent

    def explore_stop_threshold(self, batch_size: int) -> float | None:
        """Cost past which a Thompson-phase run of ``batch_size`` stops as exploration; None: no such stop.

        For an arm other than the *best* (lowest posterior mean among those not eliminated):
        ``μn_best + z·σ_best`` (``explore_stop_z``, σ the best arm's pooled, floored noise sd). Past
        it the run costs more than nearly every run of the best arm (probability ≈ Φ(z)). Its cost
        counts at its tail mean, so cutting an arm's dear runs does not make it look cheaper.

        Args:
            batch_size: The arm the run trains with.
        """
        z = self.settings.explore_stop_z
        state = self._current()
        if z is None or state.phase != BanditPhase.THOMPSON.value or batch_size not in state.survivors:
            return None
        trials = self.store.list_trials(self.job_id)
        obs = self.observations(trials)
        if not any(obs.get(b) for b in state.survivors):
            return None
        posts = self.posteriors(state.survivors, obs, self.observations(trials, completed_only=True))
        eligible = eliminate_arms(posts, self.settings.elimination_z)
        best = min(eligible, key=lambda b: (posts[b].mean, b))
        if best == batch_size or not math.isfinite(posts[best].noise_var):
            return None
        return posts[best].mean + z * math.sqrt(posts[best].noise_var)

    # -- observations ------------------------------------------------------------------
    def observations(
        self, trials: Sequence[TrialRecord] | None = None, *, completed_only: bool = False
    ) -> dict[int, list[tuple[float, int]]]:
        """Observed costs per arm: batch size → [(cost, age)], age 0 = the job's latest observation.

        Completed and early-stopped trials with an observable cost count; ages count both. With
        ``completed_only``, early-stopped trials that did not converge are left out: a censored cost
        is not a draw of the noise, so it stays out of the pooled noise variance.
        """
        if trials is None:
            trials = self.store.list_trials(self.job_id)
        done = [t for t in trials if t.status in ("completed", "early_stopped") and is_observable_cost(t.cost)]
        result: dict[int, list[tuple[float, int]]] = {}
        for age, trial in enumerate(reversed(done)):
            if completed_only and trial.status != "completed" and not trial.converged:
                continue
            result.setdefault(trial.batch_size, []).append((float(trial.cost), age))  # type: ignore[arg-type]
        return result

    def posteriors(
        self,
        arms: Sequence[int] | None = None,
        observations: dict[int, list[tuple[float, int]]] | None = None,
        noise_observations: dict[int, list[tuple[float, int]]] | None = None,
    ) -> dict[int, ArmPosterior]:
        """Posterior of each arm (default: the surviving arms); see the module docstring.

        Args:
            arms: Arms to compute; default the survivors.
            observations: Per-arm ``[(cost, age)]`` of every observation (default: the store's).
            noise_observations: The observations the pooled noise variance is estimated from
                (default: the store's completed trials when ``observations`` is not given,
                else ``observations``); early-stopped costs are censored and stay out.

        Raises:
            ValueError: No observation at all yet (no prior can be formed).
        """
        s = self.settings
        if observations is None:
            trials = self.store.list_trials(self.job_id)
            obs = self.observations(trials)
            if noise_observations is None:
                noise_observations = self.observations(trials, completed_only=True)
        else:
            obs = observations
        pool = obs if noise_observations is None else noise_observations
        if arms is None:
            arms = self._current().survivors
        all_costs = [c for arm in obs.values() for c, _ in arm]
        prior_mean, prior_precision = prior_from_costs(all_costs, s.prior_std_rel)

        def weigh(pairs: list[tuple[float, int]]) -> np.ndarray:
            return observation_weights([a for _, a in pairs], s.window, s.discount)

        relative_var = pooled_relative_variance(
            [[c for c, _ in p] for p in pool.values()], list(map(weigh, pool.values()))
        )
        result = {}
        for b in arms:
            x, w = [c for c, _ in obs.get(b, [])], weigh(obs.get(b, []))
            if pool is not obs:
                x = self._impute_censored(
                    obs.get(b, []), pool.get(b, []), x, w, prior_mean, prior_precision, relative_var
                )
            mean, precision, var = gaussian_posterior(
                x, w, prior_mean, prior_precision, s.noise_floor_rel, relative_var=relative_var
            )
            result[b] = ArmPosterior(b, float(np.sum(w)), mean, precision, var)
        return result

    def _impute_censored(
        self,
        pairs: Sequence[tuple[float, int]],
        completed: Sequence[tuple[float, int]],
        costs: list[float],
        weights: np.ndarray,
        prior_mean: float,
        prior_precision: float,
        relative_var: float,
    ) -> list[float]:
        """One arm's costs with each early-stopped (censored) cost ``c`` replaced by ``E[X | X > c]``.

        Counted at ``c`` it would bias the arm low (only arms other than the best are stopped while
        exploring). ``X`` follows the arm's predictive ``N(μn, σ² + 1/τn)`` from its completed runs;
        an arm with none keeps its lower bounds.
        """
        done_ages = {age for _, age in completed}
        censored = [i for i, (_, age) in enumerate(pairs) if age not in done_ages]
        done = [i for i, (_, age) in enumerate(pairs) if age in done_ages]
        if not censored or not done or float(np.sum(weights[done])) <= 0:
            return costs
        mean, precision, var = gaussian_posterior(
            [costs[i] for i in done],
            weights[done],
            prior_mean,
            prior_precision,
            self.settings.noise_floor_rel,
            relative_var=relative_var,
        )
        std = math.sqrt(var + 1.0 / precision)
        out = list(costs)
        for i, tail in zip(censored, gaussian_tail_means(mean, std, [costs[i] for i in censored]), strict=True):
            out[i] = float(tail)
        return out

    # -- the two calls of a recurrence -----------------------------------------------------
    def suggest(self, *, power_limit_W: float | None = None, info: dict[str, Any] | None = None) -> Suggestion:
        """Choose the batch size of the next recurrence and record its ``running`` trial.

        Args:
            power_limit_W: Power limit the trial will run at, if known (W).
            info: Extras stored with the trial.

        Returns:
            The :class:`Suggestion` (batch size and trial id).
        """
        trials = self.store.list_trials(self.job_id)
        obs = self.observations(trials)
        noise_obs = self.observations(trials, completed_only=True)
        failures = arm_failures(trials)

        def choose(current: BanditState) -> tuple[BanditState, tuple[int, str, int, bool]]:
            state = self._prune_failed(self._state(current), failures)
            holding = False
            if state.phase == BanditPhase.PRUNING.value:
                choice = int(state.candidate)  # type: ignore[arg-type]  # a pruning state has one
                holding = self._target_never_reached(state, trials)
            else:
                rng = np.random.Generator(np.random.PCG64())
                rng.bit_generator.state = state.rng
                choice = self._thompson(rng, state.survivors, obs, noise_obs)
                state = state.replace(rng=rng.bit_generator.state)
            snapshot = BanditState(current.job_id, state.to_stored(), self._arm_snapshot(state, obs))
            return snapshot, (choice, state.phase, state.round, holding)

        batch_size, phase, round_, holding = self.store.update_bandit(self.job_id, choose)
        if holding and any(t.status not in ("running", "withdrawn") for t in trials):
            self._warn_target_never_reached(trials, batch_size)
        trial = self.store.create_trial(
            self.job_id, batch_size, power_limit_W, info={**(info or {}), "phase": phase, "round": round_}
        )
        logger.info(
            "zeus-callbacks: job %s trial %d: batch size %d (%s)", self.job_id, trial.trial_id, batch_size, phase
        )
        return Suggestion(batch_size, trial.trial_id, phase, round_)

    def _target_never_reached(self, state: StoredState, trials: Sequence[TrialRecord]) -> bool:
        """Whether the job has a target and no run of it has ever reached it: the pruning then holds its candidate.

        A run that does not converge then says nothing about its batch size (a misnamed metric, a value no
        run attains); moving on would end every direction at once.
        """
        return self.settings.has_target and state.min_cost is None and not any(t.converged for t in trials)

    def _warn_target_never_reached(self, trials: Sequence[TrialRecord], batch_size: int) -> None:
        """Say, at each suggestion while it lasts, that no run reached the target and what came closest.

        With no value of the metric seen: the last failure when every finished run failed (it crashed
        before any evaluation), else a hint to check the metric's name (a run finished without it).
        """
        s = self.settings
        best = best_target_value(trials, s.target_direction)
        finished = [t for t in trials if t.status not in ("running", "withdrawn")]
        if best is not None:
            seen = f"the best value seen is {best:g} (info.best_target_value)"
        elif finished and all(t.status == "failed" for t in finished):  # crashed before any evaluation did
            seen = f"the runs failed before any evaluation reported it (last: {failure_reason(finished[-1])})"
        else:  # a run finished and never reported it
            seen = "no run reported the metric at all: check its name"
        logger.warning(
            "zeus-callbacks: job %s: no run has reached the target %s %s %g yet; %s. The bandit holds batch "
            "size %d (pruning) until one does",
            self.job_id,
            s.target_metric,
            ">=" if s.target_direction == "max" else "<=",
            s.target_value,
            seen,
            batch_size,
        )

    def _prune_failed(self, state: StoredState, failures: dict[int, tuple[int, str]]) -> StoredState:
        """``state`` with the arms pruned that failed ``max_failures`` times in a row (:func:`arm_failures`).

        Such an arm leaves the survivors (never the last one), its reason kept in ``failed_arms``; a
        failing pruning candidate counts as not converged.
        """
        limit = self.settings.max_failures
        if limit is None:
            return state
        failed = dict(state.failed_arms)
        for _ in range(len(state.batch_sizes) + 1):  # each pass prunes one arm or ends
            due = sorted(
                b for b, (n, _) in failures.items() if n >= limit and str(b) not in failed and b in state.survivors
            )
            if not due:
                break
            b = due[0]
            count, last = failures[b]
            if len(state.survivors) <= 1:
                logger.warning(
                    "zeus-callbacks: job %s: batch size %d failed %d times in a row (%s) but is the "
                    "last surviving arm; kept",
                    self.job_id,
                    b,
                    count,
                    last,
                )
                break
            failed[str(b)] = f"failed {count} times in a row (last: {last})"
            state = state.replace(survivors=[x for x in state.survivors if x != b])
            logger.warning("zeus-callbacks: job %s: batch size %d pruned: %s", self.job_id, b, failed[str(b)])
            if state.phase == BanditPhase.PRUNING.value and state.candidate == b:
                state = self._advance(state, b, False, None)
        return state.replace(failed_arms=failed) if failed else state

    def _thompson(
        self,
        rng: np.random.Generator,
        arms: Sequence[int],
        obs: dict[int, list[tuple[float, int]]],
        noise_obs: dict[int, list[tuple[float, int]]] | None = None,
    ) -> int:
        if not any(obs.get(b) for b in arms):
            return self.settings.default_batch_size if self.settings.default_batch_size in arms else int(arms[0])
        posts = self.posteriors(arms, obs, noise_obs)
        eligible = eliminate_arms(posts, self.settings.elimination_z)
        draws = {b: rng.normal(posts[b].mean, posts[b].std) for b in eligible}
        return satisficing_choice(draws, {b: posts[b].mean for b in eligible}, self.settings.satisficing_rel)

    def report(
        self,
        trial_id: int,
        *,
        energy_J: float | None,
        time_s: float | None,
        cost: float | None,
        converged: bool,
        status: Literal["completed", "failed", "early_stopped"] = "completed",
        batch_size: int | None = None,
        power_limit_W: float | None = None,
        info: dict[str, Any] | None = None,
        degraded: bool = False,
        pending_id: str | None = None,
    ) -> TrialRecord:
        """Record a recurrence's outcome and update the bandit, in one store transaction (both or neither).

        Only a finite, positive cost from a complete measurement is an observation
        (:func:`observation_problem`): otherwise the trial is recorded with the figures that
        are not finite as None, the cost as None and the reason in ``info["not_observed"]``,
        and the bandit does not move.

        Args:
            trial_id: From :meth:`suggest`.
            energy_J: GPU energy of the run (J).
            time_s: Wall time of the run (s).
            cost: Its ZeusCost (J-equivalent).
            converged: Whether it reached the target; an ``early_stopped`` run whose evaluation after
                the stop reached it converged too (its cost is then its cost to the target, not censored).
            status: ``completed`` (ran to its end), ``early_stopped`` or ``failed`` (crashed:
                not an observation, never converged; it moves nothing unless it is its arm's
                ``max_failures``-th failure in a row, which prunes the arm in the same transaction).
            batch_size: The batch size really used, if it differs from the suggestion.
            power_limit_W: Power limit it ran at (W).
            info: Extras stored with the trial.
            degraded: The energy measurement is incomplete (sensor faults).
            pending_id: The pending-trial file the outcome is merged from, recorded with it
                (:meth:`~zeus_callbacks.store.Store.finish_trial`).

        Returns:
            The finished trial.
        """
        converged = bool(converged) and status != "failed"  # an early-stopped run may reach the target after its stop
        problem = None if status == "failed" else observation_problem(energy_J, time_s, cost, degraded=degraded)
        if problem is not None:
            info = {**(info or {}), "not_observed": problem}
            cost = None
            energy_J = None if degraded else measurable_or_none(energy_J)
            time_s = measurable_or_none(time_s)
        elif status == "failed":  # not an observation whatever its figures; keep only the sane ones
            cost = cost if is_observable_cost(cost) else None
            energy_J = measurable_or_none(energy_J)
            time_s = measurable_or_none(time_s)
        if status == "failed":  # no observation, but it may be the arm's last allowed failure
            absorb: OutcomeUpdate | None = self._absorb_failure
        else:
            absorb = None if cost is None else self._absorb(float(cost), converged)
        trial = self.store.finish_trial(
            trial_id,
            status=status,
            energy_J=energy_J,
            time_s=time_s,
            cost=cost,
            converged=converged,
            batch_size=batch_size,
            power_limit_W=power_limit_W,
            info=info,
            pending_id=pending_id,
            bandit_update=absorb,  # one transaction: the outcome and the bandit's update, both or neither
        )
        if problem is not None:  # named by the trial's batch size (the suggestion's, unless another was used)
            logger.warning(
                "zeus-callbacks: job %s trial %d is not an observation of batch size %d: %s",
                self.job_id, trial_id, trial.batch_size, problem,
            )  # fmt: skip
        return trial

    def _absorb(self, cost: float, converged: bool) -> OutcomeUpdate:
        """The bandit transform of an observed outcome, run by the store inside the outcome's transaction.

        It reads the trials of that transaction (the finished one included), never the store itself.
        """

        def update(trial: TrialRecord, trials: list[TrialRecord], current: BanditState) -> BanditState:
            if _bandit_update_hook is not None:
                _bandit_update_hook()
            obs = self.observations(trials)
            state = self._state(current)
            if converged and (state.min_cost is None or cost < state.min_cost):
                state = state.replace(min_cost=cost)
            if (
                state.phase == BanditPhase.PRUNING.value
                and trial.batch_size == state.candidate
                and trial.info.get("round", state.round) == state.round
                and (converged or not self._target_never_reached(state, trials))  # else it holds the candidate
            ):
                state = self._advance(state, trial.batch_size, converged, cost)
            return BanditState(current.job_id, state.to_stored(), self._arm_snapshot(state, obs))

        return update

    def _absorb_failure(self, trial: TrialRecord, trials: list[TrialRecord], current: BanditState) -> BanditState:
        """The bandit transform of a failed run, run by the store inside the failure's transaction.

        It prunes an arm whose failure this is the ``max_failures``-th in a row (:meth:`_prune_failed`, the rule
        :meth:`suggest` applies too), so the stored state (what ``zeus-callbacks show`` prints) says so at once.
        """
        if _bandit_update_hook is not None:
            _bandit_update_hook()
        state = self._prune_failed(self._state(current), arm_failures(trials))
        return BanditState(current.job_id, state.to_stored(), self._arm_snapshot(state, self.observations(trials)))

    def _advance(self, state: StoredState, batch_size: int, converged: bool, cost: float | None) -> StoredState:
        """Pruning transition after the candidate's outcome: ``start`` → ``down`` → ``up`` → next round or Thompson.

        ``descending``: the candidate just moved past lowered the round's cheapest converged cost.
        """
        factor = self._prune_factor(state)
        ratio = None if factor is None else factor[1]
        before = min((c for c, ok in state.round_results.values() if ok), default=math.inf)
        results = {**state.round_results, str(batch_size): [cost, converged]}
        survivors = sorted(state.survivors)
        direction = state.direction
        best = min((c for c, ok in results.values() if ok), default=math.inf)
        descending = False
        if direction == "start":
            direction, pivot = "down", state.start
        elif converged and cost is not None and (ratio is None or cost <= ratio * best):
            pivot = batch_size
            descending = cost < before
        elif direction == "down":
            direction, pivot = "up", state.start
        else:
            direction = "done"
        if direction == "down":
            smaller = [b for b in survivors if b < pivot][::-1]
            if smaller:
                return state.replace(
                    round_results=results, descending=descending, direction="down", candidate=smaller[0]
                )
            direction, pivot = "up", state.start
            descending = False  # the first size above the start
        if direction == "up":
            larger = [b for b in survivors if b > pivot]
            if larger:
                return state.replace(round_results=results, descending=descending, direction="up", candidate=larger[0])
        return self._end_round(state.replace(round_results=results))

    def _end_round(self, state: StoredState) -> StoredState:
        results = {int(b): (c, ok) for b, (c, ok) in state.round_results.items()}
        converged = sorted(b for b, (_, ok) in results.items() if ok)
        if not converged:
            logger.warning(
                "zeus-callbacks: job %s: no batch size reached the target in pruning round %d; keeping %s",
                self.job_id,
                state.round,
                state.survivors,
            )
        state = state.replace(
            survivors=converged or state.survivors, round=state.round + 1, round_results={}, descending=False
        )
        if state.round >= self.settings.pruning_rounds:
            logger.info("zeus-callbacks: job %s: pruning done; Thompson sampling over %s", self.job_id, state.survivors)
            return state.replace(phase=BanditPhase.THOMPSON.value, direction="done", candidate=None)
        best = min(converged, key=lambda b: (results[b][0], b)) if converged else state.start
        return state.replace(direction="start", start=best, candidate=best)

    def _arm_snapshot(self, state: StoredState, obs: dict[int, list[tuple[float, int]]]) -> dict[int, dict[str, Any]]:
        """Per-arm view stored in the ``arms`` table (for people and dashboards; the trials are the truth)."""
        survivors = set(state.survivors)
        failed = state.failed_arms
        arms: dict[int, dict[str, Any]] = {}
        posts = self.posteriors(list(state.batch_sizes), obs) if obs else {}
        for b in state.batch_sizes:
            entry: dict[str, Any] = {"pruned": b not in survivors, "observations": len(obs.get(b, []))}
            if str(b) in failed:
                entry["pruned_reason"] = failed[str(b)]
            if b in posts:
                p = posts[b]
                entry.update(mean_cost=p.mean, std_cost=p.std)
            arms[int(b)] = entry
        return arms
