"""A model of the Hopper loop's ring protocol (kernels/engine/hopper_loop.py), run on random schedules.

The Gluon kernel does not run on the CPU, so its synchronisation is checked here on a model
that follows its rules: a ring of STAGES slots; the producer waits for slot s's ``empty``
barrier (count 2) at the parity before the lap's, then fills it and completes ``ready``; each
consumer walks every ring step and, on a step of its item, waits for ``ready`` at the lap's
parity, reads the slot and arrives on ``empty``; on a step of the other item (``_pass``) it
waits for ``ready`` and arrives without reading. An mbarrier wait on a parity succeeds once
the barrier's current phase has the other parity, so a wait a whole lap ahead passes at once:
the model shows what goes wrong when a consumer skips steps or passes without waiting.
"""
import random

import pytest


class Barrier:
    def __init__(self, count):
        self.count, self.pending, self.completed = count, count, 0

    def arrive(self):
        self.pending -= 1
        if self.pending == 0:
            self.completed, self.pending = self.completed + 1, self.count

    def passed(self, parity):  # mbarrier.wait(bar, parity) returns
        return (self.completed & 1) != parity


def run(stream, n_pool, item1_live, stages, seed, *, wait_to_pass=True, item1_walks_pool=True):
    """One program: ``n_pool`` pooled chunks (for both items), then the stream's entries
    (users bits). Returns (wrong reads, finished)."""
    rnd = random.Random(seed)
    empty = [Barrier(2) for _ in range(stages)]
    ready = [Barrier(1) for _ in range(stages)]
    held = [None] * stages
    wrong = []
    steps = [3 if item1_live else 1] * n_pool + list(stream)

    def producer():
        for i in range(len(steps)):
            slot, phase = i % stages, (i // stages) & 1
            while not empty[slot].passed(phase ^ 1):
                yield
            held[slot] = i
            ready[slot].arrive()
            yield

    def consumer(c):
        for i, users in enumerate(steps):
            skipping = i < n_pool and not item1_live and not item1_walks_pool
            if c == 1 and skipping:
                continue
            slot, phase = i % stages, (i // stages) & 1
            mine = (users >> c) & 1
            if mine or wait_to_pass:
                while not ready[slot].passed(phase):
                    yield
            if mine and held[slot] != i:
                wrong.append((c, i, held[slot]))
            yield
            empty[slot].arrive()
            if c == 0 and skipping:
                empty[slot].arrive()  # item 0 releasing for both, as a skipping design would
            yield

    actors = [producer(), consumer(0), consumer(1)]
    for _ in range(20000):
        if not actors:
            break
        actor = rnd.choice(actors)
        try:
            next(actor)
        except StopIteration:
            actors.remove(actor)
    return wrong, not actors


def schedules(n=600):
    for seed in range(n):
        r = random.Random(seed)
        live = r.random() < 0.7
        stream = [r.choice((1, 2, 3)) if live else 1 for _ in range(r.randint(0, 10))]
        yield stream, r.randint(0, 3), live, r.choice((2, 3, 6)), seed


def test_the_loops_rules_never_read_a_wrong_slot_nor_hang():
    for stream, n_pool, live, stages, seed in schedules():
        wrong, finished = run(stream, n_pool, live, stages, seed)
        assert finished and not wrong, (stream, n_pool, live, stages, seed, wrong)


@pytest.mark.parametrize("broken", [dict(wait_to_pass=False), dict(item1_walks_pool=False)])
def test_the_model_catches_a_consumer_that_runs_ahead(broken):
    """Passing without waiting, or an item 1 that is not live skipping the pooled chunks (item 0
    releasing them twice), lets an arrival count for the wrong lap: some schedule reads a
    refilled slot or hangs."""
    failures = 0
    for stream, n_pool, live, stages, seed in schedules():
        wrong, finished = run(stream, n_pool, live, stages, seed, **broken)
        failures += bool(wrong) or not finished
    assert failures > 0
