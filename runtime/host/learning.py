"""A plan keeps learning while it serves. What a partition's runs take under the load a
network really gets is not what its sub-model took alone, nor what a burst at load time
saw: after each run its thread waits to retake the GIL from whatever Python the callers
and the other stages run, and where the stages are tens of microseconds that wait decides
which stage is slowest (docs/performance.md, "Plans that learn").

So the host's learner looks, every `LOOK_SECONDS`, at each learning network (loaded from
a model on measured costs, unbatched; `LoadedNetwork.replanning`): once every partition
of its first replica has run `MIN_RUNS` times since the last look, it takes the medians of
their newest run times. Estimates within `TRUSTED` of them and stages within `BALANCED`
of each other leave the plan as it is. Stages further apart than that, and by more than
a GIL wait can make (`calibrate.LOAD_WAIT_MAX`; where it is the waits that differ,
moving nodes moves no time), are planned again on those medians (`planning.live_costs`).
A plan that moves nodes and promises a bottleneck `GAIN` shorter is moved to only when
the look before promised one too (one slow second, a collection or a neighbour's burst,
moves nothing; the look between corrects the estimates). It is laid on the devices
beside the one serving (keys `network~N/partition`), requests switch to it at once, and
the old one is unloaded when its last request has ended; if it does not fit beside it,
the old keeps serving. The look after is skipped (the new sessions warm up); the next
checks the promise: a slowest stage `GAIN` slower than before goes back to the plan
before, and that network moves no more; `MOVES` at most per network. Any other plan only
takes the medians as its estimates. Either way `plan.learned` says what happened and why,
and the plan is published (`partition.step`, `partition.planned`) as a load publishes one.
"""

from __future__ import annotations

import itertools
import logging
import statistics
import threading
from dataclasses import replace
from typing import TYPE_CHECKING

from runtime.errors import PrismError
from runtime.host.dispatch import Dispatcher
from runtime.host.serving import ServedNetwork
from runtime.observe.events import EventBus
from runtime.partition.plan import Plan
from runtime.provision.calibrate import LOAD_WAIT_MAX
from runtime.provision.network import LoadedNetwork, publish_plan, unload_network
from runtime.units import human_seconds

if TYPE_CHECKING:
    from runtime.partition.steps import Step

log = logging.getLogger(__name__)

LOOK_SECONDS = 1.0  # between looks
MIN_RUNS = 200  # runs of every partition a look needs
TRUSTED = 0.15  # an estimate this far off its median is corrected
BALANCED = 1.10  # slowest stage over fastest (medians) above which a plan is re-made
GAIN = 0.05  # share of its bottleneck a new plan must save to be loaded
MOVES = 3  # re-plans that move nodes, per network
DRAIN_SECONDS = 300.0  # bound on waiting for the old plan's last request


class PlanLearner:
    """The host's learner: a thread, running while a network learns."""

    def __init__(self, slots: Dispatcher, bus: EventBus):
        self._slots, self._bus = slots, bus
        self._lock = threading.Lock()
        self._moves: dict[str, int] = {}  # learning network -> re-plans that moved it
        self._seen: dict[str, dict[str, int]] = {}  # network -> key -> runs at the last look
        self._tried: dict[str, Plan] = {}  # network -> the plan before its last re-plan
        self._settling: dict[str, bool] = {}  # network -> a plan was just laid for it
        self._leaning: set[str] = set()  # networks whose last look found a better plan
        self._tags = itertools.count(1)  # a laid plan's keys: network~N/partition
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def watch(self, net: LoadedNetwork) -> None:
        """Learn `net` while it serves, if it may (see the module)."""
        if net.replanning is None or self._stop.is_set():
            return
        counted = [(lp.key, lp.device.recent_runs(lp.key)) for lp in net.loaded[0]]
        with self._lock:  # runs before it serves (its calibration's) are not its load's
            self._seen[net.name] = {key: runs[0] for key, runs in counted if runs}
            self._moves.setdefault(net.name, 0)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="prism-plan-learner",
                                                daemon=True)
                self._thread.start()

    def close(self, timeout: float) -> None:
        self._stop.set()
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.wait(LOOK_SECONDS):
            with self._lock:
                names = list(self._moves)
                if not names:  # nothing learns: the thread ends, `watch` starts another
                    self._thread = None
                    return
            for name in names:
                try:
                    self._look(name)
                except Exception:  # learning must never stop serving
                    log.exception("learning the plan of %s failed", name)

    def _look(self, name: str) -> None:
        net = self._serving(name)
        if net is None:
            with self._lock:
                self._moves.pop(name, None)
                self._seen.pop(name, None)
                self._tried.pop(name, None)
                self._settling.pop(name, None)
                self._leaning.discard(name)
            return
        loaded = net.loaded
        medians = _medians(loaded, self._seen.setdefault(name, {}))
        if medians is None or self._settling.pop(name, False):
            return  # the first runs of a plan just laid are its sessions warming up
        plan, slowest, fastest = loaded.plan, max(medians.values()), min(medians.values())
        tried = self._tried.pop(name, None)
        before = max((p.est_seconds for p in tried.partitions), default=0.0) if tried else 0.0
        if tried is not None and slowest > (1 + GAIN) * before:
            self._moves[name] = MOVES  # moving does not pay here: no more of it
            self._move(net, loaded, tried, [], medians, f"the re-made plan's slowest stage "
                       f"took {human_seconds(slowest)}, the plan before it "
                       f"{human_seconds(before)}: back to that plan")
            return
        off = max(abs(p.est_seconds / medians[p.name] - 1) for p in plan.partitions)
        spread = slowest / fastest
        if off <= TRUSTED and spread <= BALANCED:
            return
        now = plan.with_estimates(medians)
        detail = (f"estimates up to {off:.0%} off the medians of the last runs, slowest stage "
                  f"{spread:.2f}x the fastest")
        # A gap a GIL wait could make is not moved: where it is the waits that differ,
        # moving nodes moves no time (docs/performance.md, "Plans that learn")
        leaning, self._leaning = name in self._leaning, self._leaning - {name}
        if spread > BALANCED and slowest - fastest > LOAD_WAIT_MAX and \
                self._moves[name] < MOVES:
            # here, not at the top: a host serving bundles never imports the partitioner
            from runtime.partition.planning import live_costs, same_assignment

            assert loaded.replanning is not None
            steps, new = loaded.replanning.replan(live_costs(loaded.graph, plan, medians))
            if not same_assignment(new, plan) and \
                    new.bottleneck_seconds <= (1 - GAIN) * now.bottleneck_seconds:
                if not leaning:  # the next look moves, if it finds a better plan too
                    self._leaning.add(name)
                    detail += "; a better plan found, to be confirmed by the next look"
                else:
                    self._moves[name] += 1
                    if self._move(net, loaded, new, steps, medians,
                                  f"{detail}: re-planned on them"):
                        self._tried[name] = now
                        return
                    detail += "; a better plan did not fit beside it"
        if self._swap(net, replace(loaded, plan=now)):
            self._learned(name, now, medians, False, f"{detail}: estimates corrected")

    def _serving(self, name: str) -> ServedNetwork | None:
        with self._slots.lock:
            net = self._slots.networks.get(name)
            return None if net is None or net.removing or self._stop.is_set() else net

    def _move(self, net: ServedNetwork, old: LoadedNetwork, plan: Plan, steps: list[Step],
              medians: dict[str, float], reason: str) -> bool:
        """Lay `plan` beside `old` and serve it from now on, unloading `old` once its last
        request has ended; False if it cannot be laid beside it (it does not fit, or the
        model's file was written since: the old keeps serving)."""
        assert old.replanning is not None
        try:
            new = old.replanning.lay(plan, f"~{next(self._tags)}")
        except PrismError as exc:
            log.info("a new plan of %s could not be laid beside the one serving: %s",
                     net.name, exc)
            return False
        if not self._swap(net, new):  # being removed, or the host closes
            unload_network(new, self._bus)
            return True
        self._settling[net.name] = True
        publish_plan(self._bus, net.name, steps, new.plan)
        self._learned(net.name, new.plan, medians, True, reason)
        retired = set(old.replicas)
        with self._slots.lock:
            self._slots.wait_for(lambda: self._stop.is_set() or all(
                r.outstanding == 0 for r in retired), DRAIN_SECONDS)
        unload_network(old, self._bus)
        return True

    def _swap(self, net: ServedNetwork, loaded: LoadedNetwork) -> bool:
        """Serve `loaded` in place of what `net` serves, unless it is being removed (or the
        host closes): requests choose a replica under the same lock."""
        with self._slots.lock:  # an RLock: `_serving` takes it again
            if self._serving(net.name) is not net:
                return False
            net.loaded, net.replicas = loaded, loaded.replicas
            return True

    def _learned(self, name: str, plan: Plan, medians: dict[str, float], moved: bool,
                 reason: str) -> None:
        if not self._bus.active:
            return
        if not moved:  # a moved plan was published with its steps
            publish_plan(self._bus, name, [], plan)
        self._bus.publish("plan.learned", network=name, moved=moved, reason=reason,
                          medians=medians, bottleneck_seconds=plan.bottleneck_seconds)


def _medians(loaded: LoadedNetwork, seen: dict[str, int]) -> dict[str, float] | None:
    """Partition -> the median of its runs on the first replica since the last look (the
    newest few hundred), once each has run MIN_RUNS times since; None before that, or
    where a device keeps no times. `seen`: key -> runs counted at the last look."""
    runs = {lp.key: lp.device.recent_runs(lp.key) for lp in loaded.loaded[0]}
    fresh = {key: r[0] - seen.get(key, 0) for key, r in runs.items() if r is not None}
    if len(fresh) < len(runs) or min(fresh.values()) < MIN_RUNS:
        return None
    medians = {}
    for lp in loaded.loaded[0]:
        count, times = runs[lp.key]  # type: ignore[misc]
        seen[lp.key] = count
        medians[lp.partition.name] = statistics.median(times[-fresh[lp.key]:])
    return medians
