"""The default: the least predicted time to first token, sticky for a context's home.

Each candidate arrives annotated with its predicted TTFT (signals/ttft.py): the prefill
queued on it plus this request's uncached tokens, over its learned prefill rate. Taking
the minimum alone (Dynamo's cost, Mooncake's Conductor) scatters cold contexts to
whichever worker is idle that instant, and their later requests find them nowhere. So a
context has a *home*: its live replicas (replicas.py), or its ring owner when it has
none. The request stays home unless some worker is predicted faster by more than the
slack (``slack_ratio`` of that worker's TTFT plus ``slack_s``):
- a worker that holds more of the prompt than home and is predicted faster, or slower by
  less than ``slack_s``, wins (``warm``): it consolidates the context rather than
  scattering it. A prefix several workers hold and that is a minority of the prompt is
  shared (a system prompt, a tool prompt), not this context's, and does not count; nor
  does a short one (under ``slack_s`` of prefill) that more than one worker's share of
  the recent new contexts started from, though one worker holds it so far (a chat's
  system prompt, early on);
- a context with no live replica and nothing of its own held anywhere is cold: it starts
  on its ring owner unless another worker starts it sooner by ``cold_slack_s`` plus
  ``cold_slack_ratio`` of that worker's start, both priced on the fleet's prefill line
  (a 12.7 s prediction is not known to 10 ms: live, predictions err by a few per cent,
  and a move for less is a coin toss on which two router replicas disagree);
- a new branch of a busy context's trunk (replicas.py) founds a replica on the worker
  placed least lately, of those within ``slack_s`` of the soonest, while the context has
  fewer replicas than its share, or is hot and at its share while some worker took
  under half the requests of its least placed replica (``spread``); a trunk past one
  prefill step (``chunk_tokens``) is one conversation's history and founds none;
- a new branch of a hot context whose branches bring later requests (an agent session's
  steps) leaves a home that took more than ``epsilon`` over the fleet's mean of recent
  requests for another live replica under that, or goes to a replica more than
  ``epsilon`` under the mean from a home that is not, predicted within the cold slack of
  home (``spread``): both hold the trunk, and where the branch starts its steps follow;
- otherwise, when home is slower by more than the slack, the faster worker takes it; if
  home held more of the prompt, that makes a copy (``replicate``). A *hot* context
  (replicas.py), or one whose copy is small next to the other worker's KV cache (at most
  ``copy_share`` of it), may always gain one. A larger copy of a context that is not hot
  also pays for what it evicts there: ``evict_cost`` x its own prefill, since the
  evicted contexts are recomputed when they return. So a conversation's long history
  stays home unless home's queue is longer than computing it twice (copying them freely
  cut Mooncake's hit rate from 21 to 15 % offline), while a turn waiting 10 s behind a
  120 k-token prompt moves for a 4 k-token copy (a hard gate at ``copy_share`` kept it
  there: seen offline once predictions counted whole histories). Unused replicas decay.
  The slack is ``slack_s`` plus ``slack_ratio`` of the faster worker's TTFT (less when
  the move gives up a prefix under half the prompt) plus the prefill the move adds (the
  context's tokens home holds warm and the other must compute, at the other's rate)
  priced at ``replicate_cost`` x (1 + the requests waiting on that worker): the added
  work delays those queued behind it there, not the fleet's average queue (an idle
  worker's copy delays nobody yet).
Every comparison above is on a candidate's *cost*: its predicted TTFT plus the delay this
request's prefill causes the requests already queued there. An engine prefills in steps
of at most ``chunk_tokens`` tokens, first come first served, so a new request's first
tokens fill the rest of the step that finishes the queue's last prompt, and that prompt's
first token comes as much later (offline, cold 9-15 k-token prompts predicted at ~350 ms
took ~600: a follower filled their last step).
The bounded-load guard stays hard: no candidate over ceil((1+eps)(L+1)/n) + margin is
chosen while another is under it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter

from router.routing.candidate import Candidate
from router.routing.policies.base import Decision
from router.routing.policies.bound import under_bound
from router.routing.policies.ring import RingCache
from router.routing.replicas import ReplicaSets
from router.routing.request import RoutingRequest

_by_ttft = attrgetter("ttft_s")


def _cold(deepest: int, shared: int) -> bool:
    """No worker holds the prompt, or what is held of it is held by several: a single
    holder's prefix is this context's, and the ring keeps replicas agreeing."""
    return deepest == 0 or shared >= deepest


def _held(request: RoutingRequest, candidates: Sequence[Candidate]) -> tuple[int, int]:
    """The deepest match any worker of the fleet has, and the deepest that says nothing
    about where this context lives: one held by over half the fleet, or by two or more
    workers when it is under half of this prompt (a system prompt, an agent's tool prompt,
    a trace's shared opener: other contexts' too). Most of the prompt on two workers is
    this context on two replicas, and its requests consolidate there (router replicas
    that never placed it would scatter it otherwise). A shortlist
    (router/routing/shortlist.py) holds every worker that matches anything; the fleet's
    others match nothing."""
    fleet = request.fleet
    if fleet is None:
        held = sorted(c.matched_blocks for c in candidates)
        n = len(held)
    else:
        held = sorted(request.matches.values()) if request.matches else []
        n = len(fleet)
    if not held:
        return 0, 0
    middle = (n - 1) // 2 - (n - len(held))  # its index among the holders
    common = held[middle] if middle >= 0 else 0
    second = held[-2] if len(held) >= 2 else 0
    if 2 * request.cached_tokens(second) >= request.prompt_tokens:
        second = 0
    return held[-1], max(common, second)


def _fleet_size(request: RoutingRequest, candidates: Sequence[Candidate]) -> int:
    """The fleet's workers: a shortlist's request carries its fleet; else every candidate."""
    return len(request.fleet) if request.fleet is not None else len(candidates)


def _start_s(c: Candidate, cost: float) -> float:
    """Its cost as if nothing were cached, on the fleet's prefill line: for a cold context,
    the common prefix some workers hold must not decide, or a worker that has served
    nothing never starts one; nor may the workers' own lines, which differ by their noise
    (live Mooncake: new contexts went where a line ~10 % optimistic said they would start
    sooner, 21-83 requests per worker). So only queues and decodes tell workers apart."""
    line = c.worker.cost.prefill
    fleet = line.parent or line
    queued = c.queued_tokens + c.prefill_work
    return cost + fleet.seconds(queued + c.cached_tokens) - line.seconds(queued)


def _delay_caused_s(c: Candidate, chunk_tokens: float) -> float:
    """How much later the last prompt queued on ``c`` gets its first token if this request
    joins (``WorkerCost.step_delay_s``). Priced also where the prefill gate holds the
    request and spares that prompt (router/fleet/prefill_gate.py): offline, not pricing
    it there gathered more of a document's questions on its holder (RAG seeds 0-2: 95.5-
    95.7 -> 96.8-97.6 % of the bound) to queue behind each other, p99 522 / 536 / 514 ->
    534 / 565 / 518 ms."""
    return c.worker.cost.step_delay_s(c.uncached_tokens, c.cached_tokens, c.prefill_work,
                                      chunk_tokens)


def _extra_prefill_s(moved: Candidate, kept: Candidate) -> float:
    """Prefill the fleet does on top by serving on ``moved`` instead of ``kept``."""
    extra = moved.prefill_work - kept.prefill_work
    return extra / moved.worker.cost.prefill.rate if extra > 0 else 0.0


def _ratio_weight(request: RoutingRequest, kept: Candidate, moved: Candidate) -> float:
    """How much of the ratio slack guards a move off a warmer worker: twice the share of
    the prompt the move gives up, at most all of the slack. The slack covers the predictions'
    error for the sake of the context's place, and a move gives up only the prefix the
    warmer worker holds: the rest is computed on either worker and leaves the prompt's
    newer blocks wherever it runs. A prefix that is most of the prompt (a conversation's
    history) keeps the whole slack; a retrieved document leading a long RAG prompt (2.5-8 k
    of 11-18 k tokens warm) does not hold a request ~100 ms slower than a cold worker
    (offline RAG seed 0: such prompts set the p99, 573 ms against llm-d's 549)."""
    given_up = kept.cached_tokens - moved.cached_tokens
    return min(1.0, 2.0 * given_up / request.prompt_tokens) if request.prompt_tokens > 0 \
        else 1.0


class PredictedTTFT:
    name = "predicted_ttft"
    needs: tuple[str, ...] = ("residency", "load", "ttft")
    shortlists = True  # the guard, the ring and the shared prefix are read fleet-wide

    def __init__(self, epsilon: float = 0.25, margin: int = 4, slack_s: float = 0.05,
                 slack_ratio: float = 0.25, cold_slack_s: float = 0.01,
                 cold_slack_ratio: float = 0.05, replicate_cost: float = 1.0,
                 copy_share: float = 0.005, chunk_tokens: float = 8192.0,
                 replicas: ReplicaSets | None = None, depth: int = 4,
                 evict_cost: float = 1.0) -> None:
        self.epsilon = epsilon
        self.margin = margin
        self.slack_s = slack_s
        self.slack_ratio = slack_ratio
        self.cold_slack_s = cold_slack_s
        self.cold_slack_ratio = cold_slack_ratio
        self.replicate_cost = replicate_cost
        self.copy_share = copy_share
        self.evict_cost = evict_cost
        self.chunk_tokens = chunk_tokens
        self.replicas = replicas if replicas is not None else ReplicaSets()
        self.depth = depth
        self.rings = RingCache()  # the fleet's; the shortlist walks it too

    def rank(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> Decision:
        chunk = self.chunk_tokens
        costs = {c: c.ttft_s + _delay_caused_s(c, chunk) for c in candidates}
        cost = costs.__getitem__  # a candidate hashes as itself: no Python frame per key

        def start(c: Candidate) -> float:
            return _start_s(c, costs[c])

        eligible = under_bound(candidates, self.epsilon, self.margin, request.fleet)
        context = request.key.key
        live = self.replicas.live(context)
        home = [c for c in eligible if c.id in live]
        reason = "warm"
        if not home:
            owner, reason = self._ring_owner(request, candidates, eligible)
            home = [owner]
        stay = min(home, key=cost)
        choice = stay
        # a worker holding more of the prompt consolidates the context, unless slower than
        # home by the slack. A
        # prefix several workers hold (a system prompt, a trace's shared opener) says
        # nothing about where this context lives: counted, a worker that has served
        # nothing never wins against those holding it (seen: 0 of 359 requests on one
        # worker; a 288-token system prompt on 4 of 8 drew every new conversation there)
        deepest, shared = _held(request, candidates)
        if not live and self._opener(request, candidates, deepest, shared):
            shared = deepest
        warmer = [c for c in eligible if c.matched_blocks > max(stay.matched_blocks, shared)]
        # within ``slack_s``: a warm worker that a stale shared queue made look a few ms
        # slower lost to a cold ring owner, and two router replicas put one document on
        # two workers (tests/redis/test_agreement.py: 96-98 % agreement, not 99-100)
        if warmer and cost(closest := min(warmer, key=cost)) < cost(stay) + self.slack_s:
            choice, reason = closest, "warm"
        elif not warmer and not live and _cold(deepest, shared):
            if reason in ("ring", "spill"):
                stay, reason = self._balanced_owner(request, candidates, eligible, stay, reason)
                choice = stay
            soonest = min(eligible, key=start)
            if start(soonest) * (1 + self.cold_slack_ratio) + self.cold_slack_s < start(stay):
                choice, reason = soonest, "cold"
        elif not warmer and (fresh := self._founds(request, live, stay, eligible, deepest, cost)):
            recent = self.replicas.recent  # a new branch of a context short of its share
            within = min(map(cost, fresh)) + self.slack_s  # a long queue balances nothing
            choice = min((c for c in fresh if cost(c) <= within),
                         key=lambda c: (recent(c.id), cost(c)))
            return self._decided(request, candidates, eligible, choice, "spread")
        # a merely less busy one must beat the slack, or contexts would scatter
        best = min(eligible, key=cost)
        copies = best.matched_blocks < choice.matched_blocks  # leaving a warmer worker
        price = self._work_price(best)
        if copies and not self.replicas.is_hot(context) and not self._small_copy(choice, best):
            price += self.evict_cost  # what the copy evicts there is recomputed when its
            # contexts return: a long history moves only off a queue longer than that
        ratio = self.slack_ratio * _ratio_weight(request, choice, best) if copies \
            else self.slack_ratio
        if cost(best) * (1 + ratio) + self.slack_s \
                + price * _extra_prefill_s(best, choice) < cost(choice):
            reason = "warm" if best.matched_blocks > stay.matched_blocks else "replicate"
            choice = best
        if choice is stay and reason == "warm" and stay.matched_blocks == 0:
            reason = "home"  # a live replica whose residency this router has not seen
        return self._decided(request, candidates, eligible, choice, reason)

    def _decided(self, request: RoutingRequest, candidates: Sequence[Candidate],
                 eligible: Sequence[Candidate], choice: Candidate, reason: str) -> Decision:
        replicas = self.replicas.use(request.key.key, choice.id, request.key.chain,
                                     choice.prefill_work)
        rest = [c for c in candidates if c is not choice]
        if len(eligible) == len(candidates):
            rest.sort(key=_by_ttft)
        else:  # the failover order tries those under the bound first
            allowed = set(eligible)
            rest.sort(key=lambda c: (c not in allowed, c.ttft_s))
        return Decision([choice, *rest[:self.depth - 1]], reason, replicas)

    def _founds(self, request: RoutingRequest, live: dict[str, float], stay: Candidate,
                eligible: Sequence[Candidate], deepest: int,
                cost: Callable[[Candidate], float]) -> list[Candidate]:
        """The workers this request may found a replica on: it adds a new branch to its
        context's trunk (no worker holds any of it past the trunk), home (``stay``) is busy
        (on an idle fleet a branch starts soonest at home, and balance buys nothing
        yet), and either the context has fewer live replicas than its share of the
        fleet's recent requests fills, or the context is hot and a worker outside them took
        under half the recent requests of the least placed one (shares fill the fleet only
        on average: three personas' replicas overlap, and offline agentic seed 1 left two
        workers with 6 sessions each against 12-18 elsewhere, max/mean busy 1.24), and the
        trunk fits one prefill step. A branch starts where it balances the fleet and pays
        the trunk's prefill once; later steps follow it there (agent sessions, a hot
        document's questions). A hot context's new branch, idle home or busy, may also
        take another of its live replicas when home took more than ``epsilon`` over the
        fleet's mean of recent requests and that replica did not, or that replica took
        more than ``epsilon`` under the mean and home did not, this request counted
        (bounded loads both ways, on placements rather than requests in flight; over the
        cap alone, a replica at half the mean took no session for 30 s while one at the
        mean took six: live agentic s24q-2, max/mean busy 1.27), and is predicted
        within the cold slack of home; only where a branch brings later requests (two or
        more per branch lately: an agent session's steps, not a document's one-off
        questions, whose move costs their TTFT and balances nothing later). A replica
        founded late stayed light while the soonest-predicted one took every new session
        (live agentic s23q-1: w5 held two personas' prompts from 32 s on and started 2
        sessions, w6 and w7 16 each; max/mean busy 1.35)."""
        if not live:
            return []
        chain, context = request.key.chain, request.key.key
        trunk = self.replicas.trunk_depth(context, chain)
        if not trunk or deepest > trunk or trunk >= len(chain):
            return []  # no trunk in common (another prompt under the same header), or not
            # a new branch of it
        if request.cached_tokens(trunk) > self.chunk_tokens:
            return []  # a trunk longer than one prefill step is a conversation's history,
            # not a prompt many sessions share (live Mooncake: a 16 k-token turn founded a
            # replica behind a 111 k-token prompt, 4.35 s against 99 ms at home)
        hot = self.replicas.is_hot(context)
        followed = self.replicas.branched(context) >= 2.0  # later steps follow this one
        recent = self.replicas.recent
        n = _fleet_size(request, eligible)
        lighter = self._lighter(live, stay, eligible, n, cost) if hot and followed else []
        if stay.load <= 0:
            return lighter
        fresh = [c for c in eligible if c.id not in live]
        if len(live) < self.replicas.wanted(context, n):
            return fresh
        if not hot:
            return []  # at its share and not hot: a conversation's turns, a document's
            # few questions; a copy costs this request its trunk and balances little
            # (live Mooncake: three such turns took 180-230 ms more than llm-d's)
        least = min(recent(worker_id) for worker_id in live)
        return lighter + [c for c in fresh if 2 * recent(c.id) < least]

    def _lighter(self, live: dict[str, float], stay: Candidate, eligible: Sequence[Candidate],
                 n: int, cost: Callable[[Candidate], float]) -> list[Candidate]:
        """Live replicas other than home that balance the fleet's recent placements (this
        request counted): under the cap while home is over it, or under the floor while
        home is not; predicted within the cold slack of home."""
        recent = self.replicas.recent
        mean = (self.replicas.fleet_recent() + 1.0) / n
        cap, floor = (1 + self.epsilon) * mean, (1 - self.epsilon) * mean
        near = cost(stay) * (1 + self.cold_slack_ratio) + self.cold_slack_s
        home = recent(stay.id) + 1.0
        return [c for c in eligible if c.id in live and c is not stay and cost(c) <= near
                and ((home > cap and recent(c.id) + 1.0 <= cap)
                     or recent(c.id) + 1.0 <= floor < home)]

    def _opener(self, request: RoutingRequest, candidates: Sequence[Candidate],
                deepest: int, shared: int) -> bool:
        """A new context's deepest match is an opener many contexts start from: more than
        one worker's fair share of the fleet's recent new contexts (a chat's system
        prompt), and short, under ``slack_s`` of prefill, so placing the context where it
        balances the fleet costs less than the slack. Held by one worker early on, a
        system prompt drew every new conversation there as warm (offline multiturn seed
        4: 13 of the first 30 on one of 8 workers, which ended 1.4x the mean busy).
        A retrieved document starts the few contexts that ask about it, and they still
        consolidate on its holder."""
        line = candidates[0].worker.cost.prefill
        short = deepest > shared \
            and request.cached_tokens(deepest) < self.slack_s * (line.parent or line).rate
        # every new context counts towards the share; only a short tip is kept (a long
        # document's would churn the table on each new question and never qualify)
        share = self.replicas.opened(request.key.chain[deepest - 1] if short else None)
        return short and share * _fleet_size(request, candidates) > 1.0

    def _work_price(self, target: Candidate) -> float:
        """Seconds of waiting per second of prefill added to ``target``: the work delays
        the requests that queue behind it there, about 1 + those waiting now (a busy M/M/1
        queue); ``replicate_cost`` scales it."""
        return self.replicate_cost * (1.0 + target.worker.cost.pending)

    def _small_copy(self, warm: Candidate, target: Candidate) -> bool:
        """The tokens ``target`` would copy from ``warm`` fit in ``copy_share`` of its KV
        cache; unknown capacity (not scraped yet) counts as large."""
        capacity = target.worker.capacity_blocks * target.worker.block_size
        return capacity > 0 and warm.cached_tokens - target.cached_tokens \
            <= self.copy_share * capacity

    def _balanced_owner(self, request: RoutingRequest, candidates: Sequence[Candidate],
                        eligible: Sequence[Candidate], owner: Candidate,
                        reason: str) -> tuple[Candidate, str]:
        """A new context's home: the first worker clockwise from its key whose recent
        prefill work is within ``epsilon`` of the fleet's mean, this request's counted
        (consistent hashing with bounded loads, as the in-flight guard, on work decayed
        over the replicas' ``idle_s`` rather than on requests in flight). At low load
        every worker is under the in-flight bound, so new contexts followed the ring alone
        and its arcs set the balance: offline multiturn, max/mean busy 1.25-1.46."""
        n = _fleet_size(request, candidates)
        work = self.replicas.recent_work
        cap = (1 + self.epsilon) * (self.replicas.fleet_work() + owner.prefill_work) / n
        if work(owner.id) <= cap:
            return owner, reason
        light = [c for c in eligible if work(c.id) <= cap]
        return self._ring_owner(request, candidates, light) if light else (owner, reason)

    def _ring_owner(self, request: RoutingRequest, candidates: Sequence[Candidate],
                    eligible: Sequence[Candidate]) -> tuple[Candidate, str]:
        """The first eligible worker clockwise from the key, on the ring of the whole fleet:
        a shortlist holds the ring's nodes up to it."""
        allowed = {c.id: c for c in eligible}
        fleet = request.fleet
        ids = frozenset(c.id for c in candidates) if fleet is None else fleet.ids
        for position, worker_id in enumerate(self.rings.walk_ids(request.key.key, ids)):
            if worker_id in allowed:
                return allowed[worker_id], "ring" if position == 0 else "spill"
        return eligible[0], "spill"  # unreachable: eligible is a non-empty subset
